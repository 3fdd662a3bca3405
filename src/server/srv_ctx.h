/* srv_ctx.h — the server's state, shared by its modules (HTTP layer, routes, protocols). */
#ifndef LM_SERVER_SRV_CTX_H
#define LM_SERVER_SRV_CTX_H

#include <stdatomic.h>

#include "sample/gen_config.h"
#include "server/server.h"
#include "server/srv_metrics.h"
#include "server/srv_sched.h"
#include "text/chat.h"
#include "text/parse.h"
#include "text/tokenizer.h"

struct MHD_Daemon;
struct lm_srv_http;

struct lm_server {
  lm_server_opts o;
  char *model_dir, *model_id, *host, *api_key;
  lm_model *m;
  lm_backend *be;
  lm_tokenizer *tok;
  lm_chat_template *tmpl; /* NULL: the checkpoint has none (chat completions refused) */
  lm_gen_config gc;
  lm_sampling defaults;
  int32_t *stop_ids;
  int32_t n_stop_ids;
  int gemma4; /* the vocabulary has Gemma 4's control tokens */
  lm_parser_tokens ptok;
  char *bos, *eos; /* token strings for the template */
  lm_kv_spec *specs;
  int64_t weight_bytes, workspace_bytes, kv_budget, max_ctx;
  size_t longest_piece; /* the vocabulary's longest piece in bytes (srv_size.h; set at start) */
  lm_srv_sched *sched;
  lm_srv_metrics metrics;
  struct MHD_Daemon *d;
  struct lm_srv_http *http; /* the HTTP layer's connections and parked requests (srv_http.c) */
  int port;
  double t_start;           /* monotonic seconds */
  long long t_created;      /* unix seconds of the start */
  atomic_uint_fast64_t seq; /* request ids */
};

/* The HTTP layer (srv_http.c). */
lm_status lm_srv_http_start(lm_server *s);
void lm_srv_http_stop(lm_server *s);

#endif
