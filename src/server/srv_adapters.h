/* srv_adapters.h — LoRA adapters in the server, over lm_engine_load_adapter and
 * lm_request_options.adapters (lumen.h):
 *   POST   /v1/adapters       {"name": NAME, "path": DIR} loads the adapter in DIR and mounts it
 *                             under NAME ("adapter_path" and "dir" stand for "path")
 *   GET    /v1/adapters       {"object": "list", "data": [adapter, ...]}
 *   GET    /v1/adapters/NAME  one adapter
 *   DELETE /v1/adapters/NAME  unmounts it (requests that chose it before finish with it)
 * and what a generation request chooses: its "adapter" field ("NAME", "A+B" stacked at weight 1
 * each, or a list of names and {"name", "weight"} objects; [] is the base model alone, even on a
 * server started with --adapter) or a model id BASE:ADAPTER, BASE one of the served ids. */
#ifndef LM_SERVER_SRV_ADAPTERS_H
#define LM_SERVER_SRV_ADAPTERS_H

#include <jansson.h>

#include "lumen.h"
#include "server/srv_ctx.h"
#include "server/srv_error.h"

/* A request's choice. The names live in the struct: the body may go before the request is
 * built, and lm_request_create copies them. */
typedef struct lm_srv_adapters {
  int n;    /* adapters chosen (0: the engine's own set, unless none) */
  int none; /* the base model alone */
  const char *names[LM_ADAPTER_STACK_MAX]; /* into name[] */
  float weights[LM_ADAPTER_STACK_MAX];
  char name[LM_ADAPTER_STACK_MAX][LM_ADAPTER_NAME_MAX];
  const char *param; /* the field that chose them ("adapter" or "model"), for errors */
} lm_srv_adapters;

/* A model id BASE:ADAPTER (ADAPTER a name or A+B...) whose BASE the server serves: the served id
 * into *base, the stack into a (which mounted names exist is the engine's to say). Returns 0, -1
 * when id is not of that form (the caller's model_not_found), or the HTTP status of e (400: too
 * many adapters). */
int lm_srv_adapters_from_model(const lm_server *s, const char *id, const char **base,
                               lm_srv_adapters *a, lm_srv_err *e);
/* The body's "adapter" field into a, which may already hold the choice of the model id: the two
 * must then agree. 0 or the HTTP status of e. */
int lm_srv_adapters_parse(const json_t *body, lm_srv_adapters *a, lm_srv_err *e);
/* The mounted adapters (malloc'ed, *out NULL when none); their count, or -1 out of memory. */
int lm_srv_adapters_mounted(lm_server *s, lm_adapter_info **out);

#endif
