/* cli_common.h — helpers shared by the CLI verbs: id lists, backend flags, model setup. */
#ifndef LM_CLI_COMMON_H
#define LM_CLI_COMMON_H

#include <stdint.h>
#include <stdio.h>

#include "backend/backend.h"
#include "model/model.h"

/* Parses "2,17,300" into a malloc'ed array. Returns 0 on success, prints an error otherwise. */
int lm_cli_parse_ids(const char *s, int32_t **ids, int64_t *n);

/* Backend selection flags shared by logits/run/bench/serve. */
typedef struct lm_cli_backend_opts {
  const char *backend;   /* "cpu", "cuda" or NULL (auto) */
  const char *precision; /* "f32", "fast" or NULL (verb default) */
  int threads;           /* 0: OpenMP default */
} lm_cli_backend_opts;

/* Creates the backend the flags ask for; prints the error and returns NULL on failure.
 * default_prec is the verb's default precision. */
lm_backend *lm_cli_backend(const lm_cli_backend_opts *o, lm_precision default_prec);

/* Loads a model, printing the error on failure. */
lm_model *lm_cli_load_model(const char *dir);

/* lm_model_prepare with a progress line while a device backend takes the weights. */
lm_status lm_cli_prepare(lm_model *m, lm_backend *be);

/* Prints "lumen: <message>" for the current thread's error and returns 1. */
int lm_cli_fail(const char *what);

/* Monotonic seconds. */
double lm_cli_now(void);

#endif
