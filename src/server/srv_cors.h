/* srv_cors.h — Cross-Origin Resource Sharing for `--cors ORIGINS`, so that a page served from
 * elsewhere can call the API from a browser: which origins are allowed ("*", or a list matched
 * exactly against the request's Origin header), and the headers a preflight (OPTIONS) answer
 * carries. The HTTP layer adds them to every response, errors and streams included. */
#ifndef LM_SERVER_SRV_CORS_H
#define LM_SERVER_SRV_CORS_H

#include <stddef.h>

#include "lumen.h"

struct lm_server;

/* Parses "*" or "https://a.example, http://localhost:3000" into *origins (malloc'ed strings);
 * *any is set when "*" is among them. Errors: LM_ERR_INVALID (an empty list or origin, spaces or
 * control characters inside one, more than 64 or longer than 256 bytes), LM_ERR_NOMEM. */
lm_status lm_srv_cors_parse(const char *spec, char ***origins, int *n, int *any);

/* The Access-Control-Allow-Origin value for a request from origin (NULL: none, as when the
 * server has no --cors or the origin is not allowed). Points into the server or at origin. */
const char *lm_srv_cors_origin(const struct lm_server *s, const char *origin);

/* The Access-Control-Allow-Headers of a preflight: the headers the APIs use (Authorization,
 * Content-Type, x-api-key, anthropic-version, ...) and those the browser asks for in
 * Access-Control-Request-Headers (when that is a plain list of header names). */
void lm_srv_cors_allow_headers(const char *requested, char *buf, size_t n);

#define LM_SRV_CORS_METHODS "GET, POST, DELETE, OPTIONS"
#define LM_SRV_CORS_MAX_AGE "86400"

#endif
