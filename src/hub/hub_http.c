/* hub_http.c — libcurl transfers for the hub protocol (see hub_http.h). */
#include "hub/hub_http.h"

#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"

lm_status lm_hub_http_init(lm_hub_http *h, const lm_hub_env *env) {
  memset(h, 0, sizeof *h);
  h->env = env;
  if (curl_global_init(CURL_GLOBAL_DEFAULT) || !(h->curl = curl_easy_init()))
    return LM_ERRF(LM_ERR_IO, "cannot start the HTTP client (libcurl)");
  struct curl_slist *l = curl_slist_append(NULL, "Accept-Encoding: identity");
  if (l && env->token[0]) {
    char auth[sizeof env->token + 32];
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", env->token);
    struct curl_slist *l2 = curl_slist_append(l, auth);
    if (!l2) curl_slist_free_all(l);
    l = l2;
  }
  if (!l) {
    lm_hub_http_free(h);
    return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  }
  h->headers = l;
  return LM_OK;
}

void lm_hub_http_free(lm_hub_http *h) {
  if (h->headers) curl_slist_free_all(h->headers);
  if (h->curl) {
    curl_easy_cleanup(h->curl);
    curl_global_cleanup();
  }
  h->headers = h->curl = NULL;
}

static size_t on_header(char *line, size_t size, size_t n, void *ud) {
  lm_hub_head_line(ud, line, size * n);
  return size * n;
}

/* The settings every request shares: protocols, timeouts, headers. */
static void setup(lm_hub_http *h, const char *url, lm_hub_head *head) {
  CURL *c = h->curl;
  curl_easy_reset(c);
  lm_hub_head_reset(head);
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_USERAGENT, "lumen/" LUMEN_VERSION);
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, (struct curl_slist *)h->headers);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, h->env->etag_timeout);
  /* a server that sends nothing for download_timeout seconds is given up on, not waited for */
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, h->env->download_timeout);
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, head);
}

static int retryable(CURLcode rc) {
  switch (rc) {
  case CURLE_PARTIAL_FILE:
  case CURLE_RECV_ERROR:
  case CURLE_SEND_ERROR:
  case CURLE_OPERATION_TIMEDOUT:
  case CURLE_GOT_NOTHING:
  case CURLE_HTTP2:
  case CURLE_HTTP2_STREAM: return 1;
  default: return 0;
  }
}

/* Runs the transfer; turns a libcurl failure into LM_ERR_IO with the reason. */
static lm_status perform(lm_hub_http *h, lm_hub_head *head, int *retry) {
  char err[CURL_ERROR_SIZE] = "";
  curl_easy_setopt(h->curl, CURLOPT_ERRORBUFFER, err);
  CURLcode rc = curl_easy_perform(h->curl);
  curl_easy_setopt(h->curl, CURLOPT_ERRORBUFFER, NULL);
  lm_hub_head_finish(head);
  long code = 0;
  if (curl_easy_getinfo(h->curl, CURLINFO_RESPONSE_CODE, &code) == CURLE_OK && code)
    head->status = code;
  *retry = head->status >= 500 && head->status <= 599;
  if (rc == CURLE_OK) return LM_OK;
  *retry = retryable(rc);
  if (rc == CURLE_WRITE_ERROR) return LM_ERR_IO; /* the receiver stopped it and said why */
  return LM_ERRF(LM_ERR_IO, "%s", err[0] ? err : curl_easy_strerror(rc));
}

typedef struct body_buf {
  char *p;
  size_t n, cap;
} body_buf;

static size_t on_body(char *data, size_t size, size_t n, void *ud) {
  body_buf *b = ud;
  size_t k = size * n;
  if (b->n + k > b->cap) {
    LM_ERRF(LM_ERR_CORRUPT, "the answer is larger than %zu bytes", b->cap);
    return 0;
  }
  char *np = realloc(b->p, b->n + k + 1);
  if (!np) return LM_ERRF(LM_ERR_NOMEM, "out of memory"), 0;
  b->p = np;
  memcpy(b->p + b->n, data, k);
  b->n += k;
  b->p[b->n] = '\0';
  return k;
}

lm_status lm_hub_http_get_body(lm_hub_http *h, const char *url, size_t cap, char **body, size_t *n,
                               lm_hub_head *head, int *retry) {
  body_buf b = {NULL, 0, cap};
  setup(h, url, head);
  curl_easy_setopt(h->curl, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(h->curl, CURLOPT_MAXREDIRS, 10L);
  curl_easy_setopt(h->curl, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(h->curl, CURLOPT_WRITEDATA, &b);
  lm_status s = perform(h, head, retry);
  if (!s && !b.p && !(b.p = calloc(1, 1))) s = LM_ERRF(LM_ERR_NOMEM, "out of memory");
  if (s) {
    free(b.p);
    return s;
  }
  *body = b.p;
  *n = b.n;
  return LM_OK;
}

/* Scheme and host of url ("https://host:port"), for a relative Location. */
static size_t origin_len(const char *url) {
  const char *p = strstr(url, "://");
  if (!p) return 0;
  p += 3;
  return (size_t)(p - url) + strcspn(p, "/?#");
}

lm_status lm_hub_http_head(lm_hub_http *h, const char *url, lm_hub_head *head, int *retry) {
  char cur[4096];
  snprintf(cur, sizeof cur, "%s", url);
  /* huggingface_hub follows relative redirects (a renamed repository) but stops at an absolute
   * one: that is the CDN, and the headers that matter are on the redirect itself */
  for (int hop = 0; hop < 5; hop++) {
    setup(h, cur, head);
    curl_easy_setopt(h->curl, CURLOPT_NOBODY, 1L);
    curl_easy_setopt(h->curl, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(h->curl, CURLOPT_TIMEOUT, h->env->etag_timeout);
    LM_TRY(perform(h, head, retry));
    if (head->status < 300 || head->status > 399 || head->location[0] != '/' ||
        head->location[1] == '/')
      return LM_OK;
    char next[4096];
    size_t o = origin_len(cur);
    if (snprintf(next, sizeof next, "%.*s%s", (int)o, cur, head->location) >= (int)sizeof next)
      return LM_OK;
    memcpy(cur, next, sizeof cur);
  }
  return LM_OK;
}

typedef struct dl_ctx {
  lm_hub_sink sink;
  void *ctx;
  lm_hub_head *head;
  int finished;
} dl_ctx;

static size_t on_data(char *data, size_t size, size_t n, void *ud) {
  dl_ctx *d = ud;
  if (!d->finished) {
    lm_hub_head_finish(d->head);
    d->finished = 1;
  }
  if (d->head->status != 200 && d->head->status != 206) return size * n; /* an error page */
  return d->sink(d->ctx, d->head, data, size * n) ? 0 : size * n;
}

lm_status lm_hub_http_download(lm_hub_http *h, const char *url, int64_t offset, lm_hub_sink sink,
                               void *ctx, lm_hub_head *head, int *retry) {
  dl_ctx d = {sink, ctx, head, 0};
  char range[48];
  setup(h, url, head);
  curl_easy_setopt(h->curl, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(h->curl, CURLOPT_MAXREDIRS, 10L);
  curl_easy_setopt(h->curl, CURLOPT_WRITEFUNCTION, on_data);
  curl_easy_setopt(h->curl, CURLOPT_WRITEDATA, &d);
  if (offset > 0) {
    snprintf(range, sizeof range, "%lld-", (long long)offset);
    curl_easy_setopt(h->curl, CURLOPT_RANGE, range);
  }
  return perform(h, head, retry);
}

lm_status lm_hub_url_append(char *buf, size_t cap, const char *s, int keep_slash) {
  static const char xd[] = "0123456789ABCDEF";
  size_t k = strlen(buf);
  for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
    int plain = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
                *c == '-' || *c == '.' || *c == '_' || *c == '~' || (keep_slash && *c == '/');
    if (k + 4 > cap) return LM_ERRF(LM_ERR_INVALID, "URL too long: %.200s...", buf);
    if (plain)
      buf[k++] = (char)*c;
    else {
      buf[k++] = '%';
      buf[k++] = xd[*c >> 4];
      buf[k++] = xd[*c & 15];
    }
  }
  buf[k] = '\0';
  return LM_OK;
}
