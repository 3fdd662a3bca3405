/* quant_plan.c — the knapsack over a sensitivity table (see quant_plan.h). */
#include "model/quant_plan.h"

#include <stdlib.h>
#include <string.h>

#include "base/knapsack.h"

static int64_t total_params(const lm_qsweep *t) {
  int64_t params = 0;
  for (int i = 0; i < t->n_rows; i++)
    params += t->rows[i].params;
  return params;
}

/* Smallest bytes a row can take (-1: no kind fits). */
static int64_t min_bytes(const lm_qsweep *t, int r) {
  int64_t b = -1;
  for (int k = 0; k < t->n_kinds; k++)
    if (t->rows[r].kl[k] >= 0 && (b < 0 || t->rows[r].bytes[k] < b)) b = t->rows[r].bytes[k];
  return b;
}

static lm_status check_reachable(const lm_qsweep *t, double target, double budget) {
  int64_t least = 0;
  for (int i = 0; i < t->n_rows; i++) {
    int64_t b = min_bytes(t, i);
    if (b < 0)
      return LM_ERRF(LM_ERR_INVALID,
                     "%s: none of the candidate kinds fits it (its width, or a width it is kept "
                     "at: the MoE router takes 8 bits)",
                     t->rows[i].module);
    least += b;
  }
  if ((double)least > budget)
    return LM_ERRF(LM_ERR_INVALID,
                   "--target-bpw %.3g is below the smallest plan of these kinds (%.3f bits per "
                   "weight)",
                   target, 8.0 * (double)least / (double)total_params(t));
  return LM_OK;
}

lm_status lm_quant_plan(const lm_qsweep *t, double target_bpw, lm_qplan *out) {
  memset(out, 0, sizeof *out);
  int64_t params = total_params(t);
  double budget = target_bpw * (double)params / 8.0;
  LM_TRY(check_reachable(t, target_bpw, budget));
  int n = t->n_rows, nk = t->n_kinds;
  int64_t *cost = malloc((size_t)(n ? n : 1) * (size_t)nk * sizeof *cost);
  double *kl = malloc((size_t)(n ? n : 1) * (size_t)nk * sizeof *kl);
  if (!cost || !kl) {
    free(cost), free(kl);
    return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  }
  for (int i = 0; i < n; i++)
    for (int k = 0; k < nk; k++) {
      cost[i * nk + k] = t->rows[i].kl[k] < 0 ? -1 : t->rows[i].bytes[k];
      kl[i * nk + k] = t->rows[i].kl[k];
    }
  lm_knapsack ks = {
      .n = n, .nk = nk, .cost = cost, .value = kl, .budget = (int64_t)budget, .max_value = -1};
  lm_knapsack_result r;
  lm_status s = lm_knapsack_solve(&ks, &r);
  free(cost);
  free(kl);
  if (s == LM_ERR_NOT_FOUND) /* rounding to units can lose a plan that fits by a hair */
    return LM_ERRF(LM_ERR_INVALID, "--target-bpw %.3g leaves no plan at this resolution",
                   target_bpw);
  LM_TRY(s);
  *out = (lm_qplan){.choice = r.choice,
                    .kl_sum = r.value,
                    .bytes = r.cost,
                    .unit = r.unit,
                    .bpw = 8.0 * (double)r.cost / (double)params};
  return LM_OK;
}

void lm_qplan_free(lm_qplan *p) {
  free(p->choice);
  p->choice = NULL;
}
