/* srv_ctx.h — the server's state, shared by its modules (HTTP layer, routes, protocols). */
#ifndef LM_SERVER_SRV_CTX_H
#define LM_SERVER_SRV_CTX_H

#include <stdatomic.h>

#include "lumen.h"
#include "server/server.h"
#include "server/srv_metrics.h"

struct MHD_Daemon;
struct lm_srv_http;

struct lm_server {
  lm_server_opts o;
  char *model_dir, *model_id, *host, *api_key;
  lm_checkpoint *ck; /* borrowed: outlives the server */
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
  lm_srv_metrics metrics;
};

/* The HTTP layer (srv_http.c). */
lm_status lm_srv_http_start(lm_server *s);
void lm_srv_http_stop(lm_server *s);

#endif
