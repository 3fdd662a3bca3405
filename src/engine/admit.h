/* admit.h — memory admission: what a sequence's caches cost for N tokens of context, and
 * whether a request fits the KV budget.
 *
 * The memory of N tokens is Σ over the sequence's caches of bytes_per_token × min(N, capacity)
 * (architecture guide, "Caches are values"): rings stop growing at their window, plain caches
 * grow with the context. A request reserves the cost of prompt + max_tokens when it is admitted
 * and gives it back when it ends, so a running sequence never runs out of room mid-response.
 * A request whose cost exceeds the whole budget is refused before any work (the server answers 400,
 * type "memory_admission"); one that fits the budget but not what is free now waits its turn. */
#ifndef LM_ENGINE_ADMIT_H
#define LM_ENGINE_ADMIT_H

#include <stdint.h>

#include "kv/kv.h"

typedef struct lm_admit {
  int n_caches;
  int64_t bpt[64]; /* bytes per token of each cache */
  int64_t cap[64]; /* capacity of each cache (LM_KV_UNBOUNDED or the window) */
  int64_t budget;  /* bytes the KV caches may use in all */
  int64_t max_ctx; /* per-sequence context limit (tokens) */
} lm_admit;

/* Fills a from the cache specs of the model's plan; act is the backend's activation dtype.
 * Errors: LM_ERR_UNSUPPORTED when the model has more than 64 caches. */
lm_status lm_admit_init(lm_admit *a, const lm_kv_spec *specs, int n_caches, lm_dtype act,
                        int64_t budget, int64_t max_ctx);
/* Bytes the caches of one sequence hold at n tokens. */
int64_t lm_admit_bytes(const lm_admit *a, int64_t n);
/* The longest context (tokens, <= max_ctx) one sequence can have within the whole budget. */
int64_t lm_admit_max_context(const lm_admit *a);
/* Bytes per token summed over the caches (for context below every window). */
int64_t lm_admit_bytes_per_token(const lm_admit *a);

#endif
