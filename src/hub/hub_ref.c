/* hub_ref.c — parsing and checking ORG/REPO[@REV]. A name that passes here is safe to use as a
 * path component of the cache and of a URL (no "..", no separators but the one '/'). */
#include "hub/hub_ref.h"

#include <stdio.h>
#include <string.h>

#include "base/status.h"

static int word_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

static int part_valid(const char *p, size_t n) {
  if (n == 0 || !word_char(p[0]) || !word_char(p[n - 1])) return 0;
  for (size_t i = 0; i < n; i++) {
    if (!word_char(p[i]) && p[i] != '-' && p[i] != '.') return 0;
    if (i && (p[i] == '-' || p[i] == '.') && p[i - 1] == p[i]) return 0; /* "--" or ".." */
  }
  return 1;
}

int lm_hub_id_valid(const char *s) {
  const char *slash = s ? strchr(s, '/') : NULL;
  if (!slash || strlen(s) > LM_HUB_ID_MAX) return 0;
  size_t n = strlen(s);
  if (n >= 4 && !strcmp(s + n - 4, ".git")) return 0;
  return part_valid(s, (size_t)(slash - s)) && part_valid(slash + 1, strlen(slash + 1));
}

int lm_hub_rev_valid(const char *s) {
  size_t n = s ? strlen(s) : 0;
  if (n == 0 || n > LM_HUB_REV_MAX || s[0] == '/' || s[n - 1] == '/' || strstr(s, "..") ||
      strstr(s, "//"))
    return 0;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c <= ' ' || c == 0x7f || c == '\\' || c == '?' || c == '#' || c == '%' || c == '"')
      return 0;
  }
  return 1;
}

int lm_hub_is_commit(const char *s) {
  if (!s || strlen(s) != 40) return 0;
  for (int i = 0; i < 40; i++)
    if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
  return 1;
}

int lm_hub_file_valid(const char *s) {
  size_t n = s ? strlen(s) : 0;
  if (n == 0 || n > 1024 || s[0] == '/') return 0;
  for (const char *c = s;; c++) {
    const char *end = strchr(c, '/');
    size_t k = end ? (size_t)(end - c) : strlen(c);
    if (k == 0 || (k == 1 && c[0] == '.') || (k == 2 && c[0] == '.' && c[1] == '.')) return 0;
    for (size_t i = 0; i < k; i++)
      if ((unsigned char)c[i] < ' ' || c[i] == 0x7f || c[i] == '\\') return 0;
    if (!end) return 1;
    c = end;
  }
}

int lm_hub_looks_like_ref(const char *s) {
  lm_hub_ref r;
  lm_status st = lm_hub_ref_parse(s, &r);
  lm_err_clear();
  return st == LM_OK;
}

lm_status lm_hub_ref_parse(const char *s, lm_hub_ref *out) {
  memset(out, 0, sizeof *out);
  if (!s) return LM_ERRF(LM_ERR_INVALID, "no model name");
  const char *at = strchr(s, '@');
  size_t idn = at ? (size_t)(at - s) : strlen(s);
  if (idn > LM_HUB_ID_MAX)
    return LM_ERRF(LM_ERR_INVALID, "'%s': a repository name has at most %d characters", s,
                   LM_HUB_ID_MAX);
  memcpy(out->id, s, idn);
  out->id[idn] = '\0';
  if (!lm_hub_id_valid(out->id))
    return LM_ERRF(LM_ERR_INVALID,
                   "'%s' is not a repository name of the form ORG/REPO (letters, digits, '_', "
                   "'-', '.')",
                   out->id);
  const char *rev = at ? at + 1 : "main";
  if (!lm_hub_rev_valid(rev))
    return LM_ERRF(LM_ERR_INVALID, "'%s': '%s' is not a revision (a branch, tag or commit)", s,
                   rev);
  snprintf(out->rev, sizeof out->rev, "%s", rev);
  return LM_OK;
}

void lm_hub_repo_folder(const char *id, char *buf, size_t n) {
  const char *slash = strchr(id, '/');
  if (!slash) {
    snprintf(buf, n, "models--%s", id);
    return;
  }
  snprintf(buf, n, "models--%.*s--%s", (int)(slash - id), id, slash + 1);
}
