/* hub_env.c — reading the hub's environment variables (see hub_env.h for which and why). */
#include "hub/hub_env.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"

static const char *env(const char *name) {
  const char *v = getenv(name);
  return v && *v ? v : NULL;
}

/* $HF_HOME, else $XDG_CACHE_HOME/huggingface, else ~/.cache/huggingface. */
static lm_status hf_home(char *buf, size_t n) {
  const char *h = env("HF_HOME"), *x = env("XDG_CACHE_HOME"), *home = env("HOME");
  int k;
  if (h)
    k = snprintf(buf, n, "%s", h);
  else if (x)
    k = snprintf(buf, n, "%s/huggingface", x);
  else if (home)
    k = snprintf(buf, n, "%s/.cache/huggingface", home);
  else
    return LM_ERRF(LM_ERR_NOT_FOUND,
                   "no Hugging Face cache: set HF_HOME or HF_HUB_CACHE (HOME is not set)");
  if (k < 0 || (size_t)k >= n) return LM_ERRF(LM_ERR_INVALID, "HF_HOME is too long");
  return LM_OK;
}

lm_status lm_hub_cache_root(char *buf, size_t n) {
  const char *c = env("HF_HUB_CACHE");
  if (!c) c = env("HUGGINGFACE_HUB_CACHE"); /* the older name huggingface_hub still reads */
  if (c) {
    int k = snprintf(buf, n, "%s", c);
    if (k < 0 || (size_t)k >= n) return LM_ERRF(LM_ERR_INVALID, "HF_HUB_CACHE is too long");
    return LM_OK;
  }
  char home[LM_HUB_PATH_MAX];
  LM_TRY(hf_home(home, sizeof home));
  int k = snprintf(buf, n, "%s/hub", home);
  if (k < 0 || (size_t)k >= n) return LM_ERRF(LM_ERR_INVALID, "HF_HOME is too long");
  return LM_OK;
}

static long seconds(const char *name, long def) {
  const char *v = env(name);
  if (!v) return def;
  char *end;
  double d = strtod(v, &end);
  if (end == v || *end || !(d > 0) || d > 86400) return def;
  return d < 1 ? 1 : (long)d;
}

/* The first line of a token file, whitespace trimmed; "" when the file is absent. */
static void read_token_file(const char *path, char *tok, size_t n) {
  tok[0] = '\0';
  FILE *f = fopen(path, "r");
  if (!f) return;
  if (!fgets(tok, (int)n, f)) tok[0] = '\0';
  fclose(f);
  size_t k = strcspn(tok, "\r\n");
  while (k > 0 && (tok[k - 1] == ' ' || tok[k - 1] == '\t'))
    k--;
  tok[k] = '\0';
  size_t lead = strspn(tok, " \t");
  memmove(tok, tok + lead, strlen(tok + lead) + 1);
}

static void load_token(lm_hub_env *e) {
  const char *t = env("HF_TOKEN");
  if (!t) t = env("HUGGING_FACE_HUB_TOKEN");
  if (t) {
    snprintf(e->token, sizeof e->token, "%s", t);
    snprintf(e->token_from, sizeof e->token_from, "HF_TOKEN");
    return;
  }
  char path[LM_HUB_PATH_MAX + 8], home[LM_HUB_PATH_MAX];
  const char *p = env("HF_TOKEN_PATH");
  if (p)
    snprintf(path, sizeof path, "%s", p);
  else if (hf_home(home, sizeof home) == LM_OK)
    snprintf(path, sizeof path, "%s/token", home);
  else {
    lm_err_clear();
    return;
  }
  read_token_file(path, e->token, sizeof e->token);
  if (e->token[0]) snprintf(e->token_from, sizeof e->token_from, "%s", path);
}

lm_status lm_hub_env_load(lm_hub_env *e) {
  memset(e, 0, sizeof *e);
  LM_TRY(lm_hub_cache_root(e->cache, sizeof e->cache));
  const char *ep = env("HF_ENDPOINT");
  snprintf(e->endpoint, sizeof e->endpoint, "%s", ep ? ep : "https://huggingface.co");
  size_t n = strlen(e->endpoint);
  while (n > 0 && e->endpoint[n - 1] == '/')
    e->endpoint[--n] = '\0';
  if (strncmp(e->endpoint, "https://", 8) && strncmp(e->endpoint, "http://", 7))
    return LM_ERRF(LM_ERR_INVALID, "HF_ENDPOINT '%s' is not an http:// or https:// URL",
                   e->endpoint);
  load_token(e);
  for (const char *c = e->token; *c; c++) /* it goes into a header line */
    if ((unsigned char)*c <= ' ' || *c == 0x7f)
      return LM_ERRF(LM_ERR_INVALID, "the token in %s contains spaces or control characters",
                     e->token_from);
  e->etag_timeout = seconds("HF_HUB_ETAG_TIMEOUT", 10);
  e->download_timeout = seconds("HF_HUB_DOWNLOAD_TIMEOUT", 10);
  const char *off = env("HF_HUB_OFFLINE");
  e->offline = off && (!strcmp(off, "1") || !strcmp(off, "ON") || !strcmp(off, "YES") ||
                       !strcmp(off, "TRUE") || !strcmp(off, "true") || !strcmp(off, "yes"));
  return LM_OK;
}
