/* srv_cors.c — allowed origins and preflight headers (srv_cors.h). */
#include "server/srv_cors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "server/srv_ctx.h"

#define LM_SRV_CORS_MAX 64
#define LM_SRV_CORS_LEN 256

static void free_list(char **v, int n) {
  for (int i = 0; i < n; i++)
    free(v[i]);
  free(v);
}

/* One origin of the list, s[0..n) without the spaces around it. */
static lm_status add_origin(const char *s, size_t n, char ***v, int *k, int *any) {
  while (n && (*s == ' ' || *s == '\t'))
    s++, n--;
  while (n && (s[n - 1] == ' ' || s[n - 1] == '\t'))
    n--;
  if (!n) return LM_ERRF(LM_ERR_INVALID, "--cors: an empty origin in the list");
  if (n > LM_SRV_CORS_LEN)
    return LM_ERRF(LM_ERR_INVALID, "--cors: an origin is longer than %d bytes", LM_SRV_CORS_LEN);
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)s[i] <= 0x20 || s[i] == 0x7f)
      return LM_ERRF(LM_ERR_INVALID, "--cors: '%.*s' has a space or a control character", (int)n,
                     s);
  if (*k == LM_SRV_CORS_MAX)
    return LM_ERRF(LM_ERR_INVALID, "--cors: more than %d origins", LM_SRV_CORS_MAX);
  if (n == 1 && *s == '*') *any = 1;
  if (n > 1 && s[n - 1] == '/') /* browsers send an origin without the path's slash */
    return LM_ERRF(LM_ERR_INVALID, "--cors: '%.*s': an origin has no path (drop the final /)",
                   (int)n, s);
  if (!((*v)[*k] = strndup(s, n))) return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  (*k)++;
  return LM_OK;
}

lm_status lm_srv_cors_parse(const char *spec, char ***origins, int *n, int *any) {
  *origins = NULL;
  *n = 0;
  *any = 0;
  char **v = calloc(LM_SRV_CORS_MAX, sizeof *v);
  if (!v) return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  int k = 0;
  lm_status st = LM_OK;
  for (const char *p = spec;; p++) {
    const char *end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    if ((st = add_origin(p, len, &v, &k, any))) break;
    if (!end) break;
    p = end;
  }
  if (st) {
    free_list(v, k);
    *any = 0;
    return st;
  }
  *origins = v;
  *n = k;
  return LM_OK;
}

const char *lm_srv_cors_origin(const lm_server *s, const char *origin) {
  if (!s->cors) return NULL;
  if (s->cors_any) return "*";
  for (int i = 0; origin && i < s->n_cors; i++)
    if (!strcmp(s->cors[i], origin)) return s->cors[i];
  return NULL;
}

/* A plain list of header names: letters, digits, '-', '_', ',' and spaces. */
static int header_list(const char *s) {
  for (; *s; s++)
    if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
          strchr("-_, ", *s)))
      return 0;
  return 1;
}

void lm_srv_cors_allow_headers(const char *requested, char *buf, size_t n) {
  static const char *const base =
      "Authorization, Content-Type, x-api-key, anthropic-version, anthropic-beta";
  if (requested && *requested && strlen(requested) < 2048 && header_list(requested))
    snprintf(buf, n, "%s, %s", base, requested);
  else
    snprintf(buf, n, "%s", base);
}
