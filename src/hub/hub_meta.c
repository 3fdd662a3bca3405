/* hub_meta.c — parsing the hub's headers and revision JSON. Both come from the network, so
 * every field is length-checked and validated before it names a file or sizes anything. */
#include "hub/hub_meta.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/status.h"
#include "hub/hub_ref.h"

void lm_hub_head_reset(lm_hub_head *h) {
  memset(h, 0, sizeof *h);
  h->size = h->linked_size = h->content_length = h->range_start = -1;
}

int lm_hub_etag_normalize(const char *in, size_t n, char *out, size_t cap) {
  out[0] = '\0';
  while (n && (*in == ' ' || *in == '\t'))
    in++, n--;
  while (n && (in[n - 1] == ' ' || in[n - 1] == '\t'))
    n--;
  if (n >= 2 && in[0] == 'W' && in[1] == '/') in += 2, n -= 2;
  while (n && *in == '"')
    in++, n--;
  while (n && in[n - 1] == '"')
    n--;
  if (n == 0 || n > LM_HUB_ETAG_MAX || n >= cap) return 0;
  for (size_t i = 0; i < n; i++) {
    char c = in[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
          c == '-'))
      return 0;
  }
  memcpy(out, in, n);
  out[n] = '\0';
  return 1;
}

/* A non-negative decimal that fits int64_t, else -1. */
static int64_t parse_size(const char *s, size_t n) {
  while (n && (*s == ' ' || *s == '\t'))
    s++, n--;
  if (!n || n > 18) return -1; /* 18 digits cannot overflow */
  int64_t v = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] < '0' || s[i] > '9') return -1;
    v = v * 10 + (s[i] - '0');
  }
  return v;
}

static void copy_value(char *dst, size_t cap, const char *v, size_t n) {
  if (n >= cap) n = cap - 1;
  memcpy(dst, v, n);
  dst[n] = '\0';
  for (size_t i = 0; i < n; i++) /* messages go to a terminal: no control characters */
    if ((unsigned char)dst[i] < ' ' || dst[i] == 0x7f) dst[i] = '?';
}

static void status_line(lm_hub_head *h, const char *line, size_t n) {
  lm_hub_head_reset(h);
  const char *sp = memchr(line, ' ', n);
  if (!sp || (size_t)(sp - line) + 4 > n) return;
  long code = 0;
  for (int i = 1; i <= 3; i++) {
    if (sp[i] < '0' || sp[i] > '9') return;
    code = code * 10 + (sp[i] - '0');
  }
  h->status = code;
}

/* "bytes START-END/TOTAL": START, or -1. */
static int64_t range_start(const char *v, size_t n) {
  if (n < 6 || strncasecmp(v, "bytes ", 6)) return -1;
  const char *dash = memchr(v + 6, '-', n - 6);
  return dash ? parse_size(v + 6, (size_t)(dash - (v + 6))) : -1;
}

void lm_hub_head_line(lm_hub_head *h, const char *line, size_t n) {
  while (n && (line[n - 1] == '\r' || line[n - 1] == '\n'))
    n--;
  if (n >= 5 && !strncmp(line, "HTTP/", 5)) {
    status_line(h, line, n);
    return;
  }
  const char *colon = memchr(line, ':', n);
  if (!colon) return;
  size_t kn = (size_t)(colon - line);
  const char *v = colon + 1;
  size_t vn = n - kn - 1;
  while (vn && (*v == ' ' || *v == '\t'))
    v++, vn--;
#define KEY(s) (kn == sizeof(s) - 1 && !strncasecmp(line, s, kn))
  if (KEY("X-Repo-Commit")) {
    char c[64];
    copy_value(c, sizeof c, v, vn);
    if (lm_hub_is_commit(c)) memcpy(h->commit, c, 41);
  } else if (KEY("X-Linked-Etag"))
    lm_hub_etag_normalize(v, vn, h->linked_etag, sizeof h->linked_etag);
  else if (KEY("ETag"))
    lm_hub_etag_normalize(v, vn, h->plain_etag, sizeof h->plain_etag);
  else if (KEY("X-Linked-Size"))
    h->linked_size = parse_size(v, vn);
  else if (KEY("Content-Length"))
    h->content_length = parse_size(v, vn);
  else if (KEY("Content-Range"))
    h->range_start = range_start(v, vn);
  else if (KEY("Location"))
    copy_value(h->location, sizeof h->location, v, vn);
  else if (KEY("X-Error-Code"))
    copy_value(h->error_code, sizeof h->error_code, v, vn);
  else if (KEY("X-Error-Message"))
    copy_value(h->error_message, sizeof h->error_message, v, vn);
#undef KEY
}

void lm_hub_head_finish(lm_hub_head *h) {
  h->lfs = h->linked_etag[0] != '\0';
  snprintf(h->etag, sizeof h->etag, "%s", h->lfs ? h->linked_etag : h->plain_etag);
  h->size = h->linked_size >= 0 ? h->linked_size : h->content_length;
}

static lm_status parse_files(const json_t *sib, lm_hub_revision *out) {
  if (!json_is_array(sib))
    return LM_ERRF(LM_ERR_CORRUPT, "the revision's \"siblings\" is not a list");
  size_t n = json_array_size(sib);
  if (n > 1000000) return LM_ERRF(LM_ERR_CORRUPT, "the revision lists %zu files", n);
  out->files = calloc(n + 1, sizeof *out->files);
  if (!out->files) return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  for (size_t i = 0; i < n; i++) {
    const json_t *f = json_object_get(json_array_get(sib, i), "rfilename");
    const char *s = json_string_value(f);
    if (!s || strlen(s) != json_string_length(f))
      return LM_ERRF(LM_ERR_CORRUPT, "siblings[%zu] has no \"rfilename\" string", i);
    if (!lm_hub_file_valid(s))
      return LM_ERRF(LM_ERR_CORRUPT, "siblings[%zu]: '%.200s' is not a safe relative file path", i,
                     s);
    if (!(out->files[out->n_files] = strdup(s))) return LM_ERRF(LM_ERR_NOMEM, "out of memory");
    out->n_files++;
  }
  return LM_OK;
}

lm_status lm_hub_revision_parse(const char *json, size_t n, lm_hub_revision *out) {
  memset(out, 0, sizeof *out);
  json_error_t err;
  json_t *root = json_loadb(json, n, 0, &err);
  if (!root)
    return LM_ERRF(LM_ERR_CORRUPT, "the revision's JSON does not parse (line %d: %s)", err.line,
                   err.text);
  const char *sha = json_string_value(json_object_get(root, "sha"));
  lm_status s = LM_OK;
  if (!json_is_object(root))
    s = LM_ERRF(LM_ERR_CORRUPT, "the revision's JSON is not an object");
  else if (!sha || !lm_hub_is_commit(sha))
    s = LM_ERRF(LM_ERR_CORRUPT, "the revision's \"sha\" is not a 40-digit commit hash");
  else {
    memcpy(out->sha, sha, 41);
    s = parse_files(json_object_get(root, "siblings"), out);
  }
  json_decref(root);
  if (s) lm_hub_revision_free(out);
  return s;
}

void lm_hub_revision_free(lm_hub_revision *r) {
  for (size_t i = 0; i < r->n_files; i++)
    free(r->files[i]);
  free(r->files);
  r->files = NULL;
  r->n_files = 0;
}
