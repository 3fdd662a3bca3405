/* srv_http.c — the HTTP layer on libmicrohttpd: a thread per connection (the polling thread
 * accepts), request bodies gathered up to the size cap, one route call per request, and
 * responses as a buffer or, for SSE, a chunked body read from the route's stream.
 *
 * Blocking is by design: a connection's thread waits on its own request's token channel (a
 * non-streamed response in the route, a streamed one in the reader callback), never on anyone
 * else's. While it waits it polls its socket for a hang-up, so a client that disconnects has its
 * sequence cancelled within ~100 ms instead of when the next write fails. A stream quiet for 10 s
 * (a long prefill, a full queue) gets an SSE comment as a keep-alive. */
#include <arpa/inet.h>
#include <malloc.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "base/status.h"
#include "server/srv_route.h"
#include "server/srv_size.h"

#define LM_SRV_PING_S 10.0
#define LM_SRV_TRIM_BYTES ((size_t)1 << 20)

typedef struct conn_state {
  lm_server *srv;
  struct MHD_Connection *c;
  char *body;
  size_t n, cap;
  int too_big;
  int status;
  char method[16];
  double t0;
} conn_state;

typedef struct stream_ctx {
  lm_srv_stream *st;
  int fd;
  double last; /* when bytes were last handed to MHD */
} stream_ctx;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int conn_fd(struct MHD_Connection *c) {
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
  return ci ? (int)ci->connect_fd : -1;
}

/* The peer closed its end (or the socket failed). */
static int fd_gone(int fd) {
  if (fd < 0) return 0;
  struct pollfd p = {.fd = fd, .events = POLLRDHUP};
  if (poll(&p, 1, 0) <= 0) return 0;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

static int gone_cb(void *ctx) { return fd_gone(conn_fd(ctx)); }

/* ---- streamed bodies ------------------------------------------------------------------------- */

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
  (void)pos;
  stream_ctx *sc = cls;
  lm_srv_stream *st = sc->st;
  for (;;) {
    lm_srv_buf *b = &st->out;
    if (b->off < b->n) {
      size_t k = b->n - b->off < max ? b->n - b->off : max;
      memcpy(buf, b->p + b->off, k);
      b->off += k;
      sc->last = now_s();
      return (ssize_t)k;
    }
    if (st->ended) return MHD_CONTENT_READER_END_OF_STREAM;
    if (fd_gone(sc->fd)) return MHD_CONTENT_READER_END_WITH_ERROR; /* destroy cancels the job */
    int r = st->produce(st, 100);
    if (r < 0) return MHD_CONTENT_READER_END_WITH_ERROR;
    if (r == 1) st->ended = 1;
    if (b->off == b->n && !st->ended && now_s() - sc->last > LM_SRV_PING_S &&
        lm_srv_sse_raw(b, ": ping\n\n"))
      return MHD_CONTENT_READER_END_WITH_ERROR;
  }
}

static void stream_free(void *cls) {
  stream_ctx *sc = cls;
  sc->st->destroy(sc->st);
  free(sc);
}

/* ---- responses ------------------------------------------------------------------------------- */

static struct MHD_Response *make_response(conn_state *cs, lm_srv_reply *rp) {
  struct MHD_Response *r;
  if (rp->stream) {
    stream_ctx *sc = calloc(1, sizeof *sc);
    if (!sc) {
      rp->stream->destroy(rp->stream);
      return NULL;
    }
    *sc = (stream_ctx){.st = rp->stream, .fd = conn_fd(cs->c), .last = now_s()};
    r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, sc, stream_free);
    if (!r) {
      stream_free(sc);
      return NULL;
    }
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");
  } else {
    r = MHD_create_response_from_buffer(rp->len, rp->body, MHD_RESPMEM_MUST_FREE);
    if (!r) return NULL;
    rp->body = NULL;
  }
  MHD_add_response_header(r, "Content-Type", rp->ctype ? rp->ctype : "application/json");
  if (rp->allow) MHD_add_response_header(r, "Allow", rp->allow);
  if (rp->auth_challenge) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
  return r;
}

static enum MHD_Result send_reply(conn_state *cs, lm_srv_reply *rp) {
  cs->status = rp->status;
  struct MHD_Response *r = make_response(cs, rp);
  free(rp->body);
  if (!r) return MHD_NO;
  enum MHD_Result ok = MHD_queue_response(cs->c, (unsigned)rp->status, r);
  MHD_destroy_response(r);
  return ok;
}

/* Answers from this layer (the body cap) are counted here; the routes' answers in on_request. */
static enum MHD_Result send_error(conn_state *cs, const char *url, int status, const char *code,
                                  const char *fmt, long long x) {
  lm_srv_metrics_request(&cs->srv->metrics, lm_srv_metrics_endpoint(url), status);
  lm_srv_err e;
  lm_srv_err_set(&e, status, "invalid_request_error", code, NULL, fmt, x);
  lm_srv_reply rp = {0};
  lm_srv_reply_error(&rp, &e, 0);
  return send_reply(cs, &rp);
}

/* ---- requests -------------------------------------------------------------------------------- */

static enum MHD_Result append_body(conn_state *cs, const char *data, size_t n) {
  int64_t cap = cs->srv->o.max_body;
  if (cs->too_big || (int64_t)(cs->n + n) > cap) {
    cs->too_big = 1; /* keep reading (and dropping) so the 413 reaches the client */
    return MHD_YES;
  }
  if (cs->n + n + 1 > cs->cap) {
    size_t c = cs->cap ? cs->cap : 4096;
    while (c < cs->n + n + 1)
      c *= 2;
    char *p = realloc(cs->body, c);
    if (!p) return MHD_NO;
    cs->body = p;
    cs->cap = c;
  }
  memcpy(cs->body + cs->n, data, n);
  cs->n += n;
  cs->body[cs->n] = '\0';
  return MHD_YES;
}

/* First call: headers only. A declared body over the cap is refused before it is read. */
static enum MHD_Result on_headers(lm_server *s, struct MHD_Connection *c, const char *url,
                                  const char *method, void **con_cls) {
  conn_state *cs = calloc(1, sizeof *cs);
  if (!cs) return MHD_NO;
  cs->srv = s;
  cs->c = c;
  cs->t0 = now_s();
  snprintf(cs->method, sizeof cs->method, "%s", method);
  *con_cls = cs;
  const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
  long long declared = cl ? strtoll(cl, NULL, 10) : 0;
  if (declared > s->o.max_body) {
    cs->too_big = 1;
    return send_error(cs, url, 413, "request_too_large",
                      "the request body exceeds the limit of %lld bytes", (long long)s->o.max_body);
  }
  if (declared > 0 && !(cs->body = malloc((size_t)declared + 1)))
    return MHD_NO; /* exact size: no doubling copies of a large body */
  cs->cap = declared > 0 ? (size_t)declared + 1 : 0;
  return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls) {
  (void)version;
  lm_server *s = cls;
  conn_state *cs = *con_cls;
  if (!cs) return on_headers(s, c, url, method, con_cls);
  if (*upload_size) {
    enum MHD_Result r = append_body(cs, upload, *upload_size);
    *upload_size = 0;
    return r;
  }
  if (cs->status) return MHD_YES; /* already answered (413 at the headers) */
  if (cs->too_big)
    return send_error(cs, url, 413, "request_too_large",
                      "the request body exceeds the limit of %lld bytes", (long long)s->o.max_body);
  lm_srv_http_req rq = {.srv = s,
                        .method = method,
                        .path = url,
                        .body = cs->body,
                        .len = cs->n,
                        .authorization =
                            MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization"),
                        .x_api_key = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key"),
                        .gone = gone_cb,
                        .gone_ctx = c};
  lm_srv_reply rp;
  lm_srv_route(&rq, &rp);
  lm_srv_metrics_request(&s->metrics, lm_srv_metrics_endpoint(url), rp.dropped ? 499 : rp.status);
  if (rp.dropped) {
    cs->status = 499;
    free(rp.body);
    return MHD_NO; /* the client left: close the connection */
  }
  return send_reply(cs, &rp);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode code) {
  (void)c;
  lm_server *s = cls;
  conn_state *cs = *con_cls;
  if (!cs) return;
  if (s->o.log_requests)
    fprintf(stderr, "lumen: %s %d %.3fs%s\n", cs->method, cs->status, now_s() - cs->t0,
            code == MHD_REQUEST_TERMINATED_COMPLETED_OK ? "" : " (connection ended early)");
  int big = cs->cap >= LM_SRV_TRIM_BYTES;
  free(cs->body);
  free(cs);
  *con_cls = NULL;
  /* a large request's buffers (body, parsed JSON, rendering) are freed by now, but glibc keeps
   * freed memory in the thread's arena: give it back so a burst of refusals leaves no RSS */
  if (big) malloc_trim(0);
}

static void on_log(void *cls, const char *fmt, va_list ap) {
  lm_server *s = cls;
  if (!s->o.log_requests) return;
  fputs("lumen: http: ", stderr);
  vfprintf(stderr, fmt, ap);
}

/* ---- the daemon ------------------------------------------------------------------------------ */

static lm_status resolve(const char *host, int port, struct sockaddr_storage *sa, int *v6) {
  struct addrinfo hints = {.ai_family = AF_UNSPEC,
                           .ai_socktype = SOCK_STREAM,
                           .ai_flags = AI_NUMERICSERV},
                  *res;
  char ps[16];
  snprintf(ps, sizeof ps, "%d", port);
  int rc = getaddrinfo(host, ps, &hints, &res);
  if (rc) return LM_ERRF(LM_ERR_INVALID, "--host %s: %s", host, gai_strerror(rc));
  memcpy(sa, res->ai_addr, res->ai_addrlen);
  *v6 = res->ai_family == AF_INET6;
  freeaddrinfo(res);
  return LM_OK;
}

lm_status lm_srv_http_start(lm_server *s) {
  struct sockaddr_storage sa;
  int v6 = 0;
  LM_TRY(resolve(s->host, s->o.port, &sa, &v6));
  s->longest_piece = lm_srv_longest_piece(s->tok); /* for the prompt-size refusal */
  /* MHD's idle timeout also runs while a handler waits for a long non-streamed answer: keep it
   * above the request deadline (none when requests have none) */
  unsigned idle = s->o.timeout_s > 0 ? (unsigned)s->o.timeout_s + 60u : 0u;
  unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL_INTERNAL_THREAD |
                   MHD_USE_ERROR_LOG | (v6 ? MHD_USE_IPv6 : 0);
  s->d = MHD_start_daemon(flags, (uint16_t)s->o.port, NULL, NULL, on_request, s,
                          MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa, MHD_OPTION_CONNECTION_LIMIT,
                          (unsigned)s->o.max_connections, MHD_OPTION_CONNECTION_TIMEOUT, idle,
                          MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_EXTERNAL_LOGGER,
                          on_log, s, MHD_OPTION_LISTENING_ADDRESS_REUSE, 1u, MHD_OPTION_END);
  if (!s->d)
    return LM_ERRF(LM_ERR_IO,
                   "could not listen on %s:%d (in use, or not an address of this machine)", s->host,
                   s->o.port);
  const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
  s->port = di ? di->port : s->o.port;
  return LM_OK;
}

void lm_srv_http_stop(lm_server *s) {
  if (!s->d) return;
  MHD_stop_daemon(s->d);
  s->d = NULL;
}
