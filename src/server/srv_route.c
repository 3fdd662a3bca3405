/* srv_route.c — the route table (srv_route.h): authentication (every route but /health and the
 * chat page), body parsing, dispatch, the small endpoints (/health, /stats, /metrics) and the
 * reply helpers. */
#include "server/srv_route.h"

#include <stdlib.h>
#include <string.h>

#include "server/srv_adapters.h"
#include "server/srv_gen.h"
#include "server/srv_size.h"

void lm_srv_reply_text(lm_srv_reply *rp, int status, const char *ctype, char *text) {
  rp->status = text ? status : 500;
  rp->ctype = ctype;
  rp->body = text ? text
                  : strdup("{\"error\":{\"message\":\"out of "
                           "memory\",\"type\":\"server_error\",\"param\":null,"
                           "\"code\":null}}");
  rp->len = rp->body ? strlen(rp->body) : 0;
}

void lm_srv_reply_json(lm_srv_reply *rp, int status, json_t *obj) {
  char *s = obj ? json_dumps(obj, JSON_COMPACT) : NULL;
  json_decref(obj);
  lm_srv_reply_text(rp, status, "application/json", s);
}

void lm_srv_reply_error(lm_srv_reply *rp, const lm_srv_err *e, int anthropic) {
  lm_srv_reply_text(rp, e->http ? e->http : 500, "application/json",
                    anthropic ? lm_srv_err_anthropic_json(e) : lm_srv_err_openai_json(e));
  rp->auth_challenge = e->http == 401;
}

void lm_srv_reply_stream(lm_srv_reply *rp, lm_srv_stream *st) {
  rp->status = 200;
  rp->ctype = "text/event-stream";
  rp->stream = st;
}

void lm_srv_reply_later(lm_srv_reply *rp, lm_srv_gen *g, void *obj,
                        void (*answer)(void *obj, int r, lm_srv_reply *rp),
                        void (*drop)(void *obj)) {
  lm_srv_later *l = malloc(sizeof *l);
  if (!l) {
    lm_request_cancel(g->r);
    drop(obj);
    lm_srv_reply_text(rp, 500, "application/json", NULL);
    return;
  }
  *l = (lm_srv_later){.g = g, .obj = obj, .answer = answer, .drop = drop};
  rp->status = 200;
  rp->later = l;
}

void lm_srv_reply_later_n(lm_srv_reply *rp, void *obj, int (*pump)(void *obj),
                          void (*answer)(void *obj, int r, lm_srv_reply *rp),
                          void (*drop)(void *obj)) {
  lm_srv_later *l = malloc(sizeof *l);
  if (!l) {
    drop(obj); /* frees its generations, which cancels them */
    lm_srv_reply_text(rp, 500, "application/json", NULL);
    return;
  }
  *l = (lm_srv_later){.obj = obj, .answer = answer, .drop = drop, .pump = pump};
  rp->status = 200;
  rp->later = l;
}

/* ---- authentication -------------------------------------------------------------------------- */

/* Compares without an early exit, so the time taken does not tell how much of a key matched. */
static int same_key(const char *a, const char *b) {
  size_t na = strlen(a), nb = strlen(b);
  unsigned char d = na != nb;
  for (size_t i = 0; i < na; i++)
    d |= (unsigned char)(a[i] ^ b[i % (nb ? nb : 1)]);
  return d == 0;
}

static int authorized(const lm_srv_http_req *rq) {
  const char *key = rq->srv->api_key;
  if (!key || !strcmp(rq->path, "/health")) return 1;
  const char *a = rq->authorization;
  if (a && !strncmp(a, "Bearer ", 7) && same_key(a + 7, key)) return 1;
  return rq->x_api_key && same_key(rq->x_api_key, key);
}

/* ---- routes ---------------------------------------------------------------------------------- */

typedef enum body_kind { NO_BODY = 0, JSON_BODY } body_kind;

enum {
  OPEN = 1,  /* served without the API key: holds no data (the chat page) */
  WEBUI = 2, /* not there with --no-webui (404 like any unknown path) */
  MODEL = 4, /* the body's "model" must be one the server serves (404 model_not_found), or
                BASE:ADAPTER; the body may choose adapters (srv_adapters.h) */
};

typedef struct route {
  const char *method, *path;
  int prefix; /* path is a prefix (e.g. /v1/models/<id>) */
  body_kind body;
  int anthropic;                                            /* error shape */
  void (*get)(const lm_srv_http_req *rq, lm_srv_reply *rp); /* a request without a body */
  void (*post)(const lm_srv_http_req *rq, const json_t *body, lm_srv_reply *rp);
  unsigned flags; /* OPEN, WEBUI, MODEL */
} route;

static void health(const lm_srv_http_req *rq, lm_srv_reply *rp) {
  (void)rq;
  lm_srv_reply_text(rp, 200, "application/json", strdup("{\"status\":\"ok\"}"));
}

static void stats(const lm_srv_http_req *rq, lm_srv_reply *rp) {
  lm_srv_reply_json(rp, 200, lm_srv_stats_json(rq->srv));
}

static void metrics(const lm_srv_http_req *rq, lm_srv_reply *rp) {
  lm_engine_stats st;
  lm_engine_get_stats(rq->srv->e, &st);
  lm_srv_reply_text(rp, 200, "text/plain; version=0.0.4",
                    lm_srv_metrics_render(&rq->srv->metrics, &st));
}

static const route routes[] = {
    {"POST", "/v1/chat/completions", 0, JSON_BODY, 0, NULL, lm_srv_openai_chat, MODEL},
    {"POST", "/v1/completions", 0, JSON_BODY, 0, NULL, lm_srv_openai_completions, MODEL},
    {"POST", "/v1/responses", 0, JSON_BODY, 0, NULL, lm_srv_responses_create, MODEL},
    {"GET", "/v1/responses/", 1, NO_BODY, 0, lm_srv_responses_get, NULL, 0},
    {"DELETE", "/v1/responses/", 1, NO_BODY, 0, lm_srv_responses_delete, NULL, 0},
    {"POST", "/v1/messages", 0, JSON_BODY, 1, NULL, lm_srv_anthropic_messages, MODEL},
    {"POST", "/v1/messages/count_tokens", 0, JSON_BODY, 1, NULL, lm_srv_anthropic_count_tokens,
     MODEL},
    {"GET", "/v1/models", 0, NO_BODY, 0, lm_srv_openai_models, NULL, 0},
    {"GET", "/v1/models/", 1, NO_BODY, 0, lm_srv_openai_models, NULL, 0},
    {"POST", "/v1/adapters", 0, JSON_BODY, 0, NULL, lm_srv_adapters_load, 0},
    {"GET", "/v1/adapters", 0, NO_BODY, 0, lm_srv_adapters_list, NULL, 0},
    {"GET", "/v1/adapters/", 1, NO_BODY, 0, lm_srv_adapters_get, NULL, 0},
    {"DELETE", "/v1/adapters/", 1, NO_BODY, 0, lm_srv_adapters_delete, NULL, 0},
    {"POST", "/tokenize", 0, JSON_BODY, 0, NULL, lm_srv_tokenize, 0},
    {"POST", "/detokenize", 0, JSON_BODY, 0, NULL, lm_srv_detokenize, 0},
    {"POST", "/apply-template", 0, JSON_BODY, 0, NULL, lm_srv_apply_template, 0},
    {"GET", "/health", 0, NO_BODY, 0, health, NULL, 0},
    {"GET", "/stats", 0, NO_BODY, 0, stats, NULL, 0},
    {"GET", "/metrics", 0, NO_BODY, 0, metrics, NULL, 0},
    {"GET", "/", 0, NO_BODY, 0, lm_srv_web, NULL, OPEN | WEBUI},
    {"GET", "/index.html", 0, NO_BODY, 0, lm_srv_web, NULL, OPEN | WEBUI},
};
enum { N_ROUTES = sizeof routes / sizeof *routes };

static int path_matches(const route *r, const char *path) {
  return r->prefix ? !strncmp(path, r->path, strlen(r->path)) && path[strlen(r->path)]
                   : !strcmp(path, r->path);
}

/* The Allow header for the methods of a path (bit 0 GET, 1 POST, 2 DELETE), OPTIONS included. */
static const char *allow_header(unsigned methods) {
  static const char *const allow[8] = {"OPTIONS",
                                       "GET, HEAD, OPTIONS",
                                       "POST, OPTIONS",
                                       "GET, HEAD, POST, OPTIONS",
                                       "DELETE, OPTIONS",
                                       "GET, HEAD, DELETE, OPTIONS",
                                       "POST, DELETE, OPTIONS",
                                       "GET, HEAD, POST, DELETE, OPTIONS"};
  return allow[methods & 7u];
}

static unsigned method_bit(const char *m) {
  return !strcmp(m, "GET") ? 1u : !strcmp(m, "POST") ? 2u : !strcmp(m, "DELETE") ? 4u : 0u;
}

/* The body's model: a served id, or the default one when it names none, or BASE:ADAPTER (the
 * adapters into ad); 0 or the HTTP status. */
static int check_model(const lm_srv_http_req *rq, const json_t *body, const char **out,
                       lm_srv_adapters *ad, lm_srv_err *e) {
  const lm_server *s = rq->srv;
  const json_t *m = json_object_get(body, "model");
  *out = s->model_id;
  if (!m || json_is_null(m)) return 0;
  if (!json_is_string(m)) return lm_srv_err_bad(e, "model", "model must be a string");
  const char *name = json_string_value(m);
  if (!*name) return 0; /* "" from clients that always send the field: the served model */
  if ((*out = lm_srv_model_served(s, name))) return 0;
  int r = lm_srv_adapters_from_model(s, name, out, ad, e);
  if (r >= 0) return r;
  *out = s->model_id;
  char ids[512] = "";
  for (int i = 0; i < s->n_ids && strlen(ids) < sizeof ids - 80; i++)
    snprintf(ids + strlen(ids), sizeof ids - strlen(ids), "%s'%.64s'", i ? ", " : "", s->ids[i]);
  return lm_srv_err_set(e, 404, "invalid_request_error", "model_not_found", "model",
                        "the model '%.200s' does not exist (this server serves %s)", name, ids);
}

/* A JSON request: the size checks, the body, its model, then the route. */
static void post_json(const route *hit, const lm_srv_http_req *rq, lm_srv_reply *rp) {
  lm_srv_err e;
  json_t *body;
  if (lm_srv_size_check_body(rq->srv, rq->len, &e) ||
      lm_srv_parse_body(rq->body ? rq->body : "", rq->len, &body, &e)) {
    lm_srv_reply_error(rp, &e, hit->anthropic);
    return;
  }
  lm_srv_http_req r = *rq;
  lm_srv_adapters ad;
  memset(&ad, 0, sizeof ad);
  int bad = lm_srv_size_check_prompt(rq->srv, body, &e);
  if (!bad && (hit->flags & MODEL)) bad = check_model(rq, body, &r.model, &ad, &e);
  if (!bad && (hit->flags & MODEL)) bad = lm_srv_adapters_parse(body, &ad, &e);
  if (hit->flags & MODEL) r.adapters = &ad;
  if (bad)
    lm_srv_reply_error(rp, &e, hit->anthropic);
  else
    hit->post(&r, body, rp);
  json_decref(body);
}

void lm_srv_route(const lm_srv_http_req *rq, lm_srv_reply *rp) {
  memset(rp, 0, sizeof *rp);
  lm_srv_err e;
  const route *hit = NULL;
  unsigned methods = 0;
  int path_known = 0;
  for (int i = 0; i < N_ROUTES; i++) {
    if (!path_matches(&routes[i], rq->path)) continue;
    if ((routes[i].flags & WEBUI) && rq->srv->o.no_webui) continue;
    path_known = 1;
    methods |= method_bit(routes[i].method);
    int head = !strcmp(rq->method, "HEAD") && !strcmp(routes[i].method, "GET");
    if (!hit && (!strcmp(rq->method, routes[i].method) || head)) hit = &routes[i];
  }
  int anthropic = !strncmp(rq->path, "/v1/messages", 12);
  /* a preflight carries no credentials: answered before the key is checked (srv_http.c adds the
   * CORS headers when --cors allows the origin) */
  if (!strcmp(rq->method, "OPTIONS") && path_known) {
    rp->status = 204;
    rp->allow = allow_header(methods);
    return;
  }
  if (!(hit && (hit->flags & OPEN)) && !authorized(rq)) {
    lm_srv_err_set(&e, 401, "authentication_error", "invalid_api_key", NULL,
                   "invalid or missing API key");
    lm_srv_reply_error(rp, &e, anthropic);
    return;
  }
  if (!hit) {
    rp->allow = path_known ? allow_header(methods) : NULL;
    if (path_known)
      lm_srv_err_set(&e, 405, "invalid_request_error", "method_not_allowed", NULL,
                     "%.16s is not allowed on %.200s (use %s)", rq->method, rq->path, rp->allow);
    else
      lm_srv_err_set(&e, 404, "invalid_request_error", "unknown_url", NULL,
                     "unknown endpoint %.16s %.200s", rq->method, rq->path);
    lm_srv_reply_error(rp, &e, anthropic);
    return;
  }
  if (hit->body == NO_BODY) {
    hit->get(rq, rp);
    return;
  }
  post_json(hit, rq, rp);
}
