/* admit.c — KV cost of a context and the budget check (admit.h). */
#include "engine/admit.h"

#include <string.h>

#include "base/status.h"

lm_status lm_admit_init(lm_admit *a, const lm_kv_spec *specs, int n_caches, lm_dtype act,
                        int64_t budget, int64_t max_ctx) {
  memset(a, 0, sizeof *a);
  if (n_caches > 64)
    return LM_ERRF(LM_ERR_UNSUPPORTED, "engine: %d caches per sequence (max 64)", n_caches);
  a->n_caches = n_caches;
  for (int i = 0; i < n_caches; i++) {
    a->bpt[i] = lm_kv_spec_bytes_per_token(&specs[i], act);
    a->cap[i] = lm_kv_spec_capacity(&specs[i]);
  }
  a->budget = budget;
  a->max_ctx = max_ctx;
  return LM_OK;
}

int64_t lm_admit_bytes(const lm_admit *a, int64_t n) {
  int64_t b = 0;
  for (int i = 0; i < a->n_caches; i++)
    b += a->bpt[i] * (n < a->cap[i] ? n : a->cap[i]);
  return b;
}

int64_t lm_admit_bytes_per_token(const lm_admit *a) {
  int64_t b = 0;
  for (int i = 0; i < a->n_caches; i++)
    b += a->bpt[i];
  return b;
}

int64_t lm_admit_max_context(const lm_admit *a) {
  /* bytes(n) is non-decreasing in n: binary search the largest n with bytes(n) <= budget */
  int64_t lo = 0, hi = a->max_ctx;
  if (lm_admit_bytes(a, hi) <= a->budget) return hi;
  while (lo < hi) {
    int64_t mid = lo + (hi - lo + 1) / 2;
    if (lm_admit_bytes(a, mid) <= a->budget)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}
