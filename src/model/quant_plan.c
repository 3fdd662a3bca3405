/* quant_plan.c — the knapsack over a sensitivity table (see quant_plan.h). */
#include "model/quant_plan.h"

#include <float.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define LM_QPLAN_UNITS 65536 /* the budget's resolution: ≤ n_rows / 65536 of it is lost */

double lm_qsweep_bpw(const lm_qsweep *t, int r, int k) {
  return 8.0 * (double)t->rows[r].bytes[k] / (double)t->rows[r].params;
}

/* The budget in bytes for the choosable rows. */
static double budget_bytes(const lm_qsweep *t, double bpw) {
  int64_t params = t->fixed_params;
  for (int i = 0; i < t->n_rows; i++)
    params += t->rows[i].params;
  return bpw * (double)params / 8.0 - (double)t->fixed_bytes;
}

/* Smallest bytes a row can take (-1: no kind fits). */
static int64_t min_bytes(const lm_qsweep *t, int r) {
  int64_t b = -1;
  for (int k = 0; k < t->n_kinds; k++)
    if (t->rows[r].kl[k] >= 0 && (b < 0 || t->rows[r].bytes[k] < b)) b = t->rows[r].bytes[k];
  return b;
}

static lm_status check_reachable(const lm_qsweep *t, double target, double budget) {
  int64_t least = t->fixed_bytes, params = t->fixed_params;
  for (int i = 0; i < t->n_rows; i++) {
    int64_t b = min_bytes(t, i);
    if (b < 0) return LM_ERRF(LM_ERR_INVALID, "%s: no candidate kind fits it", t->rows[i].module);
    least += b;
    params += t->rows[i].params;
  }
  if ((double)(least - t->fixed_bytes) > budget)
    return LM_ERRF(LM_ERR_INVALID,
                   "--target-bpw %.3g is below the smallest plan of these kinds (%.3f bits per "
                   "weight)",
                   target, 8.0 * (double)least / (double)params);
  return LM_OK;
}

/* dp[u] = least Σ KL of the rows so far within u units; pick[i][u] = the kind row i takes
 * in that optimum (255: none reaches). */
static void solve(const lm_qsweep *t, int64_t unit, int64_t U, double *dp, double *nx,
                  uint8_t *pick) {
  for (int64_t u = 0; u <= U; u++)
    dp[u] = 0;
  for (int i = 0; i < t->n_rows; i++) {
    const lm_qsweep_row *r = &t->rows[i];
    uint8_t *pk = pick + (size_t)i * (size_t)(U + 1);
    for (int64_t u = 0; u <= U; u++) {
      double best = DBL_MAX;
      uint8_t arg = 255;
      for (int k = 0; k < t->n_kinds; k++) {
        int64_t c = (r->bytes[k] + unit - 1) / unit;
        if (r->kl[k] < 0 || c > u || dp[u - c] == DBL_MAX) continue;
        if (dp[u - c] + r->kl[k] < best) best = dp[u - c] + r->kl[k], arg = (uint8_t)k;
      }
      nx[u] = best;
      pk[u] = arg;
    }
    memcpy(dp, nx, (size_t)(U + 1) * sizeof *dp);
  }
}

lm_status lm_quant_plan(const lm_qsweep *t, double target_bpw, lm_qplan *out) {
  memset(out, 0, sizeof *out);
  double budget = budget_bytes(t, target_bpw);
  LM_TRY(check_reachable(t, target_bpw, budget));
  int64_t unit = (int64_t)(budget / LM_QPLAN_UNITS) + 1, U = (int64_t)(budget / (double)unit);
  double *dp = malloc((size_t)(U + 1) * sizeof *dp), *nx = malloc((size_t)(U + 1) * sizeof *nx);
  uint8_t *pick = malloc((size_t)t->n_rows * (size_t)(U + 1));
  out->choice = malloc((size_t)(t->n_rows ? t->n_rows : 1) * sizeof *out->choice);
  lm_status s = dp && nx && pick && out->choice ? LM_OK : LM_ERRF(LM_ERR_NOMEM, "out of memory");
  if (!s) {
    solve(t, unit, U, dp, nx, pick);
    if (dp[U] == DBL_MAX) /* rounding to units can lose a plan that fits by a hair */
      s = LM_ERRF(LM_ERR_INVALID, "--target-bpw %.3g leaves no plan at a %lld-byte resolution",
                  target_bpw, (long long)unit);
  }
  if (!s) {
    out->kl_sum = dp[U];
    out->bytes = t->fixed_bytes;
    out->unit = unit;
    int64_t params = t->fixed_params;
    for (int i = t->n_rows - 1, u = (int)U; i >= 0; i--) { /* walk the choices back */
      int k = pick[(size_t)i * (size_t)(U + 1) + (size_t)u];
      out->choice[i] = k;
      out->bytes += t->rows[i].bytes[k];
      params += t->rows[i].params;
      u -= (int)((t->rows[i].bytes[k] + unit - 1) / unit);
    }
    out->bpw = 8.0 * (double)out->bytes / (double)params;
  }
  free(dp);
  free(nx);
  free(pick);
  if (s) lm_qplan_free(out);
  return s;
}

void lm_qplan_free(lm_qplan *p) {
  free(p->choice);
  p->choice = NULL;
}
