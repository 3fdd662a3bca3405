/* srv_http.c — the HTTP layer on libmicrohttpd: a small pool of epoll threads serves every
 * connection (no thread per connection), request bodies gathered up to the size cap, one route
 * call per request, and responses as a buffer or, for SSE, a chunked body read from the route's
 * stream.
 *
 * No pool thread ever waits for a generation. A non-streamed answer (lm_srv_later) and a stream
 * with nothing to send park their connection (MHD_suspend_connection); one pump thread polls the
 * parked generations without blocking, notices clients that hang up (their sequence is then
 * cancelled within ~100 ms), adds an SSE comment to a stream quiet for 10 s (a long prefill, a
 * full queue), and resumes a connection as soon as it has something to send.
 *
 * Hostile clients: a connection must deliver its request (headers, and a body at no less than
 * 64 KiB/s) within 10 s of connecting or of its previous answer, however it trickles bytes; and
 * the connections are capped (--max-connections): when one more arrives, the oldest connection
 * still sending its request (or idle between requests) is dropped, so clients that send complete
 * requests are served while slow ones are shed. The descriptor soft limit is raised to fit. */
#include <arpa/inet.h>
#include <malloc.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/status.h"
#include "server/srv_cors.h"
#include "server/srv_gen.h"
#include "server/srv_route.h"
#include "server/srv_size.h"

#define LM_SRV_PING_S 10.0
#define LM_SRV_TRIM_BYTES ((size_t)1 << 20)
#define LM_SRV_REQUEST_S 10.0         /* to deliver a request's headers (and body, below) */
#define LM_SRV_BODY_RATE 65536.0      /* bytes per second a declared body may take beyond that */
#define LM_SRV_IDLE_S 120u            /* MHD's inactivity timeout for connections not parked */
#define LM_SRV_GONE_S 0.1             /* how often a parked connection is checked for a hang-up */
#define LM_SRV_PUMP_SLEEP_NS 2000000L /* pump pause when nothing became ready */

/* One TCP connection (MHD's socket context), in the order connections arrived. */
typedef struct conn_rec {
  struct conn_rec *prev, *next;
  int fd;
  int in_request; /* delivering a request, or idle between requests: deadline and eviction */
  int evicted;    /* shut down by us; MHD closes it on its next read */
  double deadline;
} conn_rec;

typedef struct conn_state conn_state;

/* A parked connection: its stream (sc) or its later answer (cs->later). */
typedef struct parked {
  struct parked *next;
  struct MHD_Connection *c;
  conn_state *cs;        /* a later answer's request, else NULL */
  struct stream_ctx *sc; /* a stream, else NULL */
  int fd;
  double next_gone;
} parked;

typedef struct lm_srv_http {
  lm_server *s;
  pthread_mutex_t mu; /* the connection list and the parked list */
  conn_rec *head, *tail;
  int live; /* connections not evicted */
  int cap;
  parked *parked;
  int stopping;
  pthread_t pump;
  int pump_started;
} lm_srv_http;

struct conn_state {
  lm_server *srv;
  struct MHD_Connection *c;
  char *body;
  size_t n, cap;
  int too_big;
  int status;
  char method[16];
  char path[128];      /* for the request log, control characters replaced */
  lm_srv_tally *tally; /* the request log's token counts (a reference) */
  double t0;
  lm_srv_later *later; /* parked for its answer */
  int later_r;         /* lm_srv_gen_pump's result once ended */
  int aborted;         /* the client left (or the server stops) while parked */
};

typedef struct stream_ctx {
  lm_srv_http *h;
  struct MHD_Connection *c;
  lm_srv_stream *st;
  int fd;
  int failed;
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

static conn_rec *conn_of(struct MHD_Connection *c) {
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  return ci ? ci->socket_context : NULL;
}

/* The peer closed its end (or the socket failed). */
static int fd_gone(int fd) {
  if (fd < 0) return 0;
  struct pollfd p = {.fd = fd, .events = POLLRDHUP};
  if (poll(&p, 1, 0) <= 0) return 0;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

static int gone_cb(void *ctx) { return fd_gone(conn_fd(ctx)); }

/* ---- connections: the request deadline and the cap ------------------------------------------ */

/* Under mu. The fd stays open until MHD's CLOSED notification, which also takes mu. */
static void evict(lm_srv_http *h, conn_rec *cr) {
  cr->evicted = 1;
  h->live--;
  shutdown(cr->fd, SHUT_RDWR);
}

static void request_phase(lm_srv_http *h, conn_rec *cr, int on, double deadline) {
  if (!cr) return;
  pthread_mutex_lock(&h->mu);
  cr->in_request = on;
  cr->deadline = deadline;
  pthread_mutex_unlock(&h->mu);
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code) {
  lm_srv_http *h = cls;
  if (code == MHD_CONNECTION_NOTIFY_STARTED) {
    conn_rec *cr = calloc(1, sizeof *cr);
    *socket_context = cr;
    if (!cr) {
      shutdown(conn_fd(c), SHUT_RDWR);
      return;
    }
    *cr = (conn_rec){.fd = conn_fd(c), .in_request = 1, .deadline = now_s() + LM_SRV_REQUEST_S};
    pthread_mutex_lock(&h->mu);
    cr->prev = h->tail;
    if (h->tail)
      h->tail->next = cr;
    else
      h->head = cr;
    h->tail = cr;
    h->live++;
    if (h->live > h->cap) { /* the oldest still sending its request goes; else the newcomer */
      conn_rec *v = h->head;
      while (v && (v->evicted || !v->in_request || v == cr))
        v = v->next;
      evict(h, v ? v : cr);
    }
    pthread_mutex_unlock(&h->mu);
    return;
  }
  conn_rec *cr = *socket_context;
  if (!cr) return;
  pthread_mutex_lock(&h->mu);
  if (cr->prev)
    cr->prev->next = cr->next;
  else
    h->head = cr->next;
  if (cr->next)
    cr->next->prev = cr->prev;
  else
    h->tail = cr->prev;
  if (!cr->evicted) h->live--;
  pthread_mutex_unlock(&h->mu);
  free(cr);
  *socket_context = NULL;
}

/* Under mu: connections past their request deadline are shut down. */
static void reap(lm_srv_http *h, double now) {
  for (conn_rec *cr = h->head; cr; cr = cr->next)
    if (cr->in_request && !cr->evicted && now > cr->deadline) evict(h, cr);
}

/* Raises the descriptor soft limit so that the connection cap, not EMFILE, is what binds. */
static void fit_fd_limit(int cap) {
  struct rlimit rl;
  rlim_t want = (rlim_t)cap + 1024;
  if (getrlimit(RLIMIT_NOFILE, &rl) || rl.rlim_cur >= want) return;
  rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > want ? want : rl.rlim_max;
  (void)setrlimit(RLIMIT_NOFILE, &rl);
}

/* ---- parking: connections waiting for their generation --------------------------------------- */

/* Suspends c and hands it to the pump; 0 when the server is stopping (nothing suspended). */
static int park(lm_srv_http *h, struct MHD_Connection *c, conn_state *cs, stream_ctx *sc) {
  parked *p = calloc(1, sizeof *p);
  if (!p) return 0;
  *p = (parked){.c = c, .cs = cs, .sc = sc, .fd = conn_fd(c), .next_gone = now_s() + LM_SRV_GONE_S};
  pthread_mutex_lock(&h->mu);
  if (h->stopping) {
    pthread_mutex_unlock(&h->mu);
    free(p);
    return 0;
  }
  /* suspend under mu: the pump resumes under mu too, so never before the suspension */
  MHD_suspend_connection(c);
  p->next = h->parked;
  h->parked = p;
  pthread_mutex_unlock(&h->mu);
  return 1;
}

/* Whether a parked stream has something for MHD (bytes, its end, or a failure). Never blocks. */
static int stream_ready(stream_ctx *sc, double now) {
  lm_srv_stream *st = sc->st;
  if (sc->failed || st->ended || st->out.off < st->out.n) return 1;
  int r = st->produce(st, 0);
  if (r < 0) sc->failed = 1;
  if (r == 1) st->ended = 1;
  if (sc->failed || st->ended || st->out.off < st->out.n) return 1;
  if (now - sc->last > LM_SRV_PING_S) {
    if (lm_srv_sse_raw(&st->out, ": ping\n\n")) sc->failed = 1;
    sc->last = now;
    return 1;
  }
  return 0;
}

static int later_ready(conn_state *cs) {
  lm_srv_later *l = cs->later;
  int r = l->pump ? l->pump(l->obj) : lm_srv_gen_pump(l->g, 0);
  if (!r) return 0;
  cs->later_r = r;
  return 1;
}

/* 1 when p's connection should be resumed. */
static int parked_ready(parked *p, double now) {
  if (p->sc ? stream_ready(p->sc, now) : later_ready(p->cs)) return 1;
  if (now < p->next_gone) return 0;
  p->next_gone = now + LM_SRV_GONE_S;
  if (!fd_gone(p->fd)) return 0;
  if (p->sc)
    p->sc->failed = 1; /* the stream's destroy cancels the job */
  else
    p->cs->aborted = 1;
  return 1;
}

static void *pump_main(void *arg) {
  lm_srv_http *h = arg;
  double next_reap = 0;
  for (;;) {
    pthread_mutex_lock(&h->mu);
    parked *list = h->parked;
    h->parked = NULL;
    int stop = h->stopping;
    pthread_mutex_unlock(&h->mu);
    double now = now_s();
    parked *keep = NULL, *ready = NULL;
    while (list) { /* polled outside mu: producing output may take a moment */
      parked *p = list;
      list = p->next;
      int go = stop || parked_ready(p, now);
      if (go && stop) {
        if (p->sc)
          p->sc->failed = 1;
        else
          p->cs->aborted = 1;
      }
      p->next = go ? ready : keep;
      *(go ? &ready : &keep) = p;
    }
    pthread_mutex_lock(&h->mu);
    int woke = ready != NULL;
    while (ready) {
      parked *p = ready;
      ready = p->next;
      MHD_resume_connection(p->c);
      free(p);
    }
    while (keep) {
      parked *p = keep;
      keep = p->next;
      p->next = h->parked;
      h->parked = p;
    }
    if (now >= next_reap) {
      reap(h, now);
      next_reap = now + 0.1;
    }
    stop = h->stopping && !h->parked;
    pthread_mutex_unlock(&h->mu);
    if (stop) return NULL;
    if (!woke) nanosleep(&(struct timespec){0, LM_SRV_PUMP_SLEEP_NS}, NULL);
  }
}

/* ---- streamed bodies ------------------------------------------------------------------------- */

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
  (void)pos;
  stream_ctx *sc = cls;
  lm_srv_stream *st = sc->st;
  lm_srv_buf *b = &st->out;
  if (b->off == b->n && !st->ended && !sc->failed) {
    int r = st->produce(st, 0);
    if (r < 0) sc->failed = 1;
    if (r == 1) st->ended = 1;
  }
  if (b->off < b->n) {
    size_t k = b->n - b->off < max ? b->n - b->off : max;
    memcpy(buf, b->p + b->off, k);
    b->off += k;
    sc->last = now_s();
    return (ssize_t)k;
  }
  if (sc->failed) return MHD_CONTENT_READER_END_WITH_ERROR; /* destroy cancels the job */
  if (st->ended) return MHD_CONTENT_READER_END_OF_STREAM;
  /* nothing yet: park the connection until the generation has more */
  return park(sc->h, sc->c, NULL, sc) ? 0 : MHD_CONTENT_READER_END_WITH_ERROR;
}

static void stream_free(void *cls) {
  stream_ctx *sc = cls;
  sc->st->destroy(sc->st);
  free(sc);
}

/* ---- responses ------------------------------------------------------------------------------- */

/* --cors: the origin's headers on every response; a preflight also gets the methods, the headers
 * and how long the browser may keep the answer. */
static void add_cors(conn_state *cs, const lm_srv_reply *rp, struct MHD_Response *r) {
  lm_server *s = cs->srv;
  if (!s->cors) return;
  const char *origin = MHD_lookup_connection_value(cs->c, MHD_HEADER_KIND, "Origin");
  const char *allow = lm_srv_cors_origin(s, origin);
  if (!s->cors_any) MHD_add_response_header(r, "Vary", "Origin");
  if (!allow) return;
  MHD_add_response_header(r, "Access-Control-Allow-Origin", allow);
  if (rp->status != 204 || strcmp(cs->method, "OPTIONS")) return;
  char hdrs[2304];
  lm_srv_cors_allow_headers(
      MHD_lookup_connection_value(cs->c, MHD_HEADER_KIND, "Access-Control-Request-Headers"), hdrs,
      sizeof hdrs);
  MHD_add_response_header(r, "Access-Control-Allow-Methods", LM_SRV_CORS_METHODS);
  MHD_add_response_header(r, "Access-Control-Allow-Headers", hdrs);
  MHD_add_response_header(r, "Access-Control-Max-Age", LM_SRV_CORS_MAX_AGE);
}

static struct MHD_Response *make_response(conn_state *cs, lm_srv_reply *rp) {
  struct MHD_Response *r;
  if (rp->stream) {
    stream_ctx *sc = calloc(1, sizeof *sc);
    if (!sc) {
      rp->stream->destroy(rp->stream);
      return NULL;
    }
    *sc = (stream_ctx){
        .h = cs->srv->http, .c = cs->c, .st = rp->stream, .fd = conn_fd(cs->c), .last = now_s()};
    r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, sc, stream_free);
    if (!r) {
      stream_free(sc);
      return NULL;
    }
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");
  } else if (rp->static_body) { /* MHD sends it in place: no copy per request */
    r = MHD_create_response_from_buffer(rp->len, (void *)rp->static_body, MHD_RESPMEM_PERSISTENT);
    if (!r) return NULL;
  } else {
    r = MHD_create_response_from_buffer(rp->len, rp->body, MHD_RESPMEM_MUST_FREE);
    if (!r) return NULL;
    rp->body = NULL;
  }
  if (rp->status != 204)
    MHD_add_response_header(r, "Content-Type", rp->ctype ? rp->ctype : "application/json");
  if (rp->allow) MHD_add_response_header(r, "Allow", rp->allow);
  add_cors(cs, rp, r);
  if (rp->auth_challenge) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
  for (const lm_srv_header *h = rp->headers; h && h->name; h++)
    MHD_add_response_header(r, h->name, h->value);
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
  snprintf(cs->path, sizeof cs->path, "%s", url);
  for (char *p = cs->path; *p; p++) /* a log line stays one line */
    if ((unsigned char)*p < 0x20 || *p == 0x7f) *p = '?';
  cs->tally = s->o.log_requests ? lm_srv_tally_new() : NULL;
  *con_cls = cs;
  const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
  long long declared = cl ? strtoll(cl, NULL, 10) : 0;
  if (declared > s->o.max_body) {
    cs->too_big = 1;
    return send_error(cs, url, 413, "request_too_large",
                      "the request body exceeds the limit of %lld bytes", (long long)s->o.max_body);
  }
  if (declared > 0) { /* the body gets time in proportion to its size */
    conn_rec *cr = conn_of(c);
    if (cr) request_phase(s->http, cr, 1, cr->deadline + (double)declared / LM_SRV_BODY_RATE);
    if (!(cs->body = malloc((size_t)declared + 1)))
      return MHD_NO; /* exact size: no doubling copies of a large body */
    cs->cap = (size_t)declared + 1;
  }
  return MHD_YES;
}

/* A parked request's answer is ready (or its client left). */
static enum MHD_Result on_later(conn_state *cs, const char *url) {
  lm_srv_later *l = cs->later;
  cs->later = NULL;
  if (cs->aborted) {
    l->drop(l->obj);
    free(l);
    cs->status = 499;
    lm_srv_metrics_request(&cs->srv->metrics, lm_srv_metrics_endpoint(url), 499);
    return MHD_NO; /* the client left: close the connection */
  }
  lm_srv_reply rp = {0};
  l->answer(l->obj, cs->later_r, &rp);
  free(l);
  lm_srv_metrics_request(&cs->srv->metrics, lm_srv_metrics_endpoint(url), rp.status);
  return send_reply(cs, &rp);
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
  if (cs->later) return on_later(cs, url);
  if (cs->status) return MHD_YES;           /* already answered (413 at the headers) */
  request_phase(s->http, conn_of(c), 0, 0); /* the request is in: no deadline while it is served */
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
                        .gone_ctx = c,
                        .tally = cs->tally,
                        .model = s->model_id};
  lm_srv_reply rp;
  lm_srv_route(&rq, &rp);
  if (rp.later) {
    cs->later = rp.later;
    if (park(s->http, c, cs, NULL)) return MHD_YES;
    cs->aborted = 1; /* stopping */
    return on_later(cs, url);
  }
  lm_srv_metrics_request(&s->metrics, lm_srv_metrics_endpoint(url), rp.dropped ? 499 : rp.status);
  if (rp.dropped) {
    cs->status = 499;
    free(rp.body);
    return MHD_NO; /* the client left: close the connection */
  }
  return send_reply(cs, &rp);
}

/* One line per request (--log-requests): what was asked, the answer, the tokens, the time. */
static void log_request(const conn_state *cs, enum MHD_RequestTerminationCode code) {
  char tokens[128] = "";
  if (cs->tally && atomic_load(&cs->tally->generations))
    snprintf(tokens, sizeof tokens, " prompt=%lld cached=%lld generated=%lld",
             (long long)atomic_load(&cs->tally->prompt), (long long)atomic_load(&cs->tally->cached),
             (long long)atomic_load(&cs->tally->generated));
  fprintf(stderr, "lumen: %s %s %d%s %.3fs%s\n", cs->method, cs->path, cs->status, tokens,
          now_s() - cs->t0,
          code == MHD_REQUEST_TERMINATED_COMPLETED_OK ? "" : " (connection ended early)");
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode code) {
  lm_server *s = cls;
  conn_state *cs = *con_cls;
  if (!cs) return;
  if (s->o.log_requests) log_request(cs, code);
  if (cs->later) { /* never answered (the daemon stops) */
    cs->later->drop(cs->later->obj);
    free(cs->later);
  }
  /* idle until the next request: the same deadline as a new connection */
  request_phase(s->http, conn_of(c), 1, now_s() + LM_SRV_REQUEST_S);
  int big = cs->cap >= LM_SRV_TRIM_BYTES;
  lm_srv_tally_unref(cs->tally);
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

static unsigned pool_size(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n < 2 ? 2u : n > 8 ? 8u : (unsigned)n;
}

static void http_free(lm_srv_http *h) {
  if (!h) return;
  pthread_mutex_destroy(&h->mu);
  free(h);
}

lm_status lm_srv_http_start(lm_server *s) {
  struct sockaddr_storage sa;
  int v6 = 0;
  LM_TRY(resolve(s->host, s->o.port, &sa, &v6));
  lm_srv_http *h = calloc(1, sizeof *h);
  if (!h) return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  h->s = s;
  h->cap = s->o.max_connections > 0 ? s->o.max_connections : 256;
  pthread_mutex_init(&h->mu, NULL);
  s->http = h;
  fit_fd_limit(h->cap);
  if (pthread_create(&h->pump, NULL, pump_main, h)) {
    s->http = NULL;
    http_free(h);
    return LM_ERRF(LM_ERR_IO, "cannot start the HTTP pump thread");
  }
  h->pump_started = 1;
  unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME |
                   MHD_USE_ERROR_LOG | (v6 ? MHD_USE_IPv6 : 0);
  /* MHD's own limit sits above the cap, so that a newcomer can displace a slow connection */
  /* the logger comes first: MHD reports the options that follow through it (and warns on stderr
   * when it comes later) */
  s->d = MHD_start_daemon(
      flags, (uint16_t)s->o.port, NULL, NULL, on_request, s, MHD_OPTION_EXTERNAL_LOGGER, on_log, s,
      MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa, MHD_OPTION_THREAD_POOL_SIZE, pool_size(),
      MHD_OPTION_CONNECTION_LIMIT, (unsigned)h->cap + 64u, MHD_OPTION_CONNECTION_TIMEOUT,
      LM_SRV_IDLE_S, MHD_OPTION_NOTIFY_CONNECTION, on_connection, h, MHD_OPTION_NOTIFY_COMPLETED,
      on_completed, s, MHD_OPTION_END);
  /* no SO_REUSEPORT: a second server on a port in use must fail, not share the traffic */
  if (!s->d) {
    lm_srv_http_stop(s);
    return LM_ERRF(LM_ERR_IO,
                   "could not listen on %s:%d: the port is in use (another server?) or the "
                   "address is not one of this machine's",
                   s->host, s->o.port);
  }
  const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
  s->port = di ? di->port : s->o.port;
  return LM_OK;
}

void lm_srv_http_stop(lm_server *s) {
  lm_srv_http *h = s->http;
  if (h) { /* every parked connection is resumed (as aborted) before the daemon stops */
    pthread_mutex_lock(&h->mu);
    h->stopping = 1;
    pthread_mutex_unlock(&h->mu);
    if (h->pump_started) pthread_join(h->pump, NULL);
  }
  if (s->d) MHD_stop_daemon(s->d);
  s->d = NULL;
  s->http = NULL;
  http_free(h);
}
