/* srv_ctx.h — the server's state, shared by its modules (HTTP layer, routes, protocols). */
#ifndef LM_SERVER_SRV_CTX_H
#define LM_SERVER_SRV_CTX_H

#include <stdatomic.h>

#include "lumen.h"
#include "server/server.h"
#include "server/srv_metrics.h"

struct MHD_Daemon;
struct lm_srv_http;

struct lm_srv_store;

struct lm_server {
  lm_server_opts o;
  char *model_dir, *host, *api_key, *spec;
  char **ids; /* the served ids (aliases, then the model's name; no repeats) */
  int n_ids;
  const char *model_id;       /* ids[0]: what responses report when a request names no model */
  char **cors;                /* --cors origins (NULL: no CORS headers) */
  int n_cors, cors_any;       /* cors_any: "*" */
  struct lm_srv_store *store; /* past Responses (NULL: none kept) */
  lm_checkpoint *ck;          /* borrowed: outlives the server */
  lm_checkpoint_info ci;
  lm_engine *e;
  lm_engine_info ei;
  lm_sampling defaults;
  struct MHD_Daemon *d;
  struct lm_srv_http *http; /* the HTTP layer's connections and parked requests (srv_http.c) */
  int port;
  double t_start;           /* monotonic seconds */
  long long t_created;      /* unix seconds of the start */
  atomic_uint_fast64_t seq; /* request ids */
  /* adapters being loaded on threads of their own (srv_adapters.c), and whether the server is
   * being freed: no load starts then, and the engine is freed after the last one */
  atomic_int loads, closing;
  lm_srv_metrics metrics;
};

/* The served id equal to name (a string the server owns), or NULL when it serves no such id. */
const char *lm_srv_model_served(const lm_server *s, const char *name);

/* The HTTP layer (srv_http.c). */
lm_status lm_srv_http_start(lm_server *s);
void lm_srv_http_stop(lm_server *s);

#endif
