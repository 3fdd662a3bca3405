/* cli_kv_plan.h — `lumen kv-eval --write-config`: each donor cache's measured KL at each
 * quantized kind (that cache alone quantized, the rest plain), the knapsack over that table
 * under a bytes-per-token budget or a KL bound, and the plan written as kv_config.json. */
#ifndef LM_CLI_KV_PLAN_H
#define LM_CLI_KV_PLAN_H

#include "cli/cli_progress.h"
#include "kv/kv.h"
#include "model/model.h"

typedef struct lm_cli_kv_plan_opts {
  const char *out;    /* kv_config.json to write */
  int64_t target_bpt; /* a budget in KV bytes per token (every cache, plain ones included) */
  double max_kl;      /* or: the least bytes whose predicted KL is within this (< 0: unset) */
  const char *kinds;  /* candidate kinds, "8:64,4:64,4:32" */
} lm_cli_kv_plan_opts;

/* Feeds ids through caches of these specs (kv-eval's runner, cli_kv_eval.c). */
lm_status lm_cli_kv_feed(lm_model *m, lm_backend *be, const lm_kv_spec *specs, const int32_t *ids,
                         int64_t T, int64_t C, float *out, int64_t *bytes, lm_cli_progress *pr);

/* Measures, plans, prints, writes o->out, and measures the written plan. ref: the plain
 * caches' logits [T][V]. Returns 0, or 1 after printing the error. */
int lm_cli_kv_write_plan(lm_model *m, lm_backend *be, const int32_t *ids, int64_t T, int64_t C,
                         const float *ref, const lm_cli_kv_plan_opts *o);

#endif
