/* srv_route.h — what the HTTP layer hands a route (method, path, body, a way to notice the
 * client left) and what the route answers (a full body, or an SSE stream, with any extra
 * headers), plus the route table: authentication, 404 for unknown paths, 405 for known paths
 * with the wrong method, 204 for OPTIONS (CORS preflights: no authentication), 404
 * model_not_found for a body that names a model the server does not serve, and the adapters a
 * generating request chooses (srv_adapters.h). */
#ifndef LM_SERVER_SRV_ROUTE_H
#define LM_SERVER_SRV_ROUTE_H

#include <jansson.h>

#include "server/srv_ctx.h"
#include "server/srv_error.h"
#include "server/srv_sse.h"

typedef struct lm_srv_http_req {
  lm_server *srv;
  const char *method, *path;
  const char *body;
  size_t len;
  const char *authorization; /* Authorization header (NULL: none) */
  const char *x_api_key;     /* x-api-key header (Anthropic clients) */
  int (*gone)(void *ctx);    /* 1 when the client has disconnected */
  void *gone_ctx;
  struct lm_srv_tally *tally; /* the request log's token counts (srv_tally.h; NULL: none) */
  const char *model;          /* set by the route table: the served id the body names, else the
                                 default one (a string the server owns) */
  /* set by the route table for generating endpoints: the adapters the body's "adapter" field or
   * model id BASE:ADAPTER chose (srv_adapters.h; NULL elsewhere) */
  const struct lm_srv_adapters *adapters;
} lm_srv_http_req;

/* A non-streamed answer still being generated. The HTTP layer parks the connection (no thread
 * waits for it), polls g without blocking, and once it has ended asks answer() for the reply; if
 * the client leaves first, drop() is called instead. Either frees obj. */
struct lm_srv_gen;
struct lm_srv_reply;
typedef struct lm_srv_later {
  struct lm_srv_gen *g;
  void *obj;
  void (*answer)(void *obj, int r, struct lm_srv_reply *rp); /* r: 1 ended, -1 sink failure */
  void (*drop)(void *obj);
  /* Instead of polling g (NULL: g): polls obj's generations without blocking, as
   * lm_srv_gen_pump(g, 0) does one (answers with several choices). */
  int (*pump)(void *obj);
} lm_srv_later;

/* An extra response header (static strings). */
typedef struct lm_srv_header {
  const char *name, *value;
} lm_srv_header;

typedef struct lm_srv_reply {
  int status;
  const char *ctype; /* static string */
  char *body;        /* owned (NULL with a stream, or when the client left) */
  size_t len;
  const void *static_body;      /* instead of body: len bytes that live as long as the program */
  const lm_srv_header *headers; /* static, ended by {NULL, NULL}: sent besides the usual ones */
  lm_srv_stream *stream;        /* owned: an SSE body */
  const char *allow;            /* 405: the Allow header */
  int auth_challenge;           /* 401: add WWW-Authenticate */
  int dropped;                  /* the client left: send nothing */
  lm_srv_later *later;          /* owned: the answer comes when the generation ends */
} lm_srv_reply;

/* Dispatches one request. Never fails: every problem becomes an error reply. */
void lm_srv_route(const lm_srv_http_req *rq, lm_srv_reply *rp);

/* Reply helpers for the routes. json takes the reference to obj. */
void lm_srv_reply_json(lm_srv_reply *rp, int status, json_t *obj);
void lm_srv_reply_error(lm_srv_reply *rp, const lm_srv_err *e, int anthropic);
void lm_srv_reply_text(lm_srv_reply *rp, int status, const char *ctype,
                       char *text); /* takes text */
void lm_srv_reply_stream(lm_srv_reply *rp, lm_srv_stream *st);

/* Protocol endpoints (srv_openai.c, srv_anthropic.c, srv_responses.c, srv_tokens.c). */
void lm_srv_openai_chat(const lm_srv_http_req *rq, const json_t *body, lm_srv_reply *rp);
void lm_srv_openai_completions(const lm_srv_http_req *rq, const json_t *body, lm_srv_reply *rp);
void lm_srv_openai_models(const lm_srv_http_req *rq, lm_srv_reply *rp);
void lm_srv_anthropic_messages(const lm_srv_http_req *rq, const json_t *body, lm_srv_reply *rp);
void lm_srv_anthropic_count_tokens(const lm_srv_http_req *rq, const json_t *body, lm_srv_reply *rp);
void lm_srv_responses_create(const lm_srv_http_req *rq, const json_t *body, lm_srv_reply *rp);
void lm_srv_responses_get(const lm_srv_http_req *rq, lm_srv_reply *rp);
void lm_srv_responses_delete(const lm_srv_http_req *rq, lm_srv_reply *rp);
void lm_srv_tokenize(const lm_srv_http_req *rq, const json_t *body, lm_srv_reply *rp);
void lm_srv_detokenize(const lm_srv_http_req *rq, const json_t *body, lm_srv_reply *rp);
void lm_srv_apply_template(const lm_srv_http_req *rq, const json_t *body, lm_srv_reply *rp);
/* LoRA adapters (srv_adapters.c): POST /v1/adapters, GET /v1/adapters[/NAME], DELETE
 * /v1/adapters/NAME. */
void lm_srv_adapters_load(const lm_srv_http_req *rq, const json_t *body, lm_srv_reply *rp);
void lm_srv_adapters_list(const lm_srv_http_req *rq, lm_srv_reply *rp);
void lm_srv_adapters_get(const lm_srv_http_req *rq, lm_srv_reply *rp);
void lm_srv_adapters_delete(const lm_srv_http_req *rq, lm_srv_reply *rp);
/* GET / and /index.html: the chat page (srv_web.c). */
void lm_srv_web(const lm_srv_http_req *rq, lm_srv_reply *rp);
/* GET /stats (srv_stats.c). */
json_t *lm_srv_stats_json(lm_server *s);

/* A reply that comes when g ends (see lm_srv_later). On failure (out of memory) rp is a 500 and
 * drop(obj) has been called. */
void lm_srv_reply_later(lm_srv_reply *rp, struct lm_srv_gen *g, void *obj,
                        void (*answer)(void *obj, int r, lm_srv_reply *rp),
                        void (*drop)(void *obj));
/* The same for an answer of several generations, polled with pump(obj) (see lm_srv_later). */
void lm_srv_reply_later_n(lm_srv_reply *rp, void *obj, int (*pump)(void *obj),
                          void (*answer)(void *obj, int r, lm_srv_reply *rp),
                          void (*drop)(void *obj));

#endif
