/* hub_http.h — the three requests of the hub protocol over libcurl (HTTPS needs a real TLS
 * stack; none is written here): a GET whose body is kept (the revision API), a HEAD that does
 * not follow the redirect to the CDN (its headers carry the etag and size), and a GET that
 * follows it and streams the body, optionally from a byte offset. Every request carries the
 * token as "Authorization: Bearer" (libcurl drops it on a redirect to another host) and
 * "Accept-Encoding: identity", and gives up on a server that stops sending. */
#ifndef LM_HUB_HTTP_H
#define LM_HUB_HTTP_H

#include <stddef.h>
#include <stdint.h>

#include "hub/hub_env.h"
#include "hub/hub_meta.h"
#include "lumen.h"

typedef struct lm_hub_http {
  void *curl;    /* CURL *, kept for connection reuse */
  void *headers; /* struct curl_slist * */
  const lm_hub_env *env;
} lm_hub_http;

lm_status lm_hub_http_init(lm_hub_http *h, const lm_hub_env *env);
void lm_hub_http_free(lm_hub_http *h);

/* Receives the body of a 200 or 206 answer; head holds its headers (finished). Returns 0 to
 * go on, -1 to abort the transfer (the sink sets the message). */
typedef int (*lm_hub_sink)(void *ctx, const lm_hub_head *head, const void *data, size_t n);

/* A failed transfer: LM_ERR_IO with the reason; *retry set when trying again may help (the
 * connection broke or stalled, or the server answered 5xx). An HTTP error status is not a
 * failure here: head->status says it and the caller words it. */
lm_status lm_hub_http_get_body(lm_hub_http *h, const char *url, size_t cap, char **body, size_t *n,
                               lm_hub_head *head, int *retry);
lm_status lm_hub_http_head(lm_hub_http *h, const char *url, lm_hub_head *head, int *retry);
lm_status lm_hub_http_download(lm_hub_http *h, const char *url, int64_t offset, lm_hub_sink sink,
                               void *ctx, lm_hub_head *head, int *retry);

/* Appends s to buf percent-encoded (RFC 3986 unreserved characters kept; '/' kept when
 * keep_slash). LM_ERR_INVALID when it does not fit. */
lm_status lm_hub_url_append(char *buf, size_t cap, const char *s, int keep_slash);

#endif
