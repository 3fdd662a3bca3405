/* knapsack.c — the multiple-choice knapsack by dynamic programming (see knapsack.h). */
#include "base/knapsack.h"

#include <float.h>
#include <stdlib.h>
#include <string.h>

#define LM_KNAPSACK_UNITS 65536     /* units of a rounded program */
#define LM_KNAPSACK_EXACT (1 << 20) /* the most units of an exact one */

static int64_t gcd(int64_t a, int64_t b) {
  while (b) {
    int64_t t = a % b;
    a = b;
    b = t;
  }
  return a;
}

/* The unit: the costs' common divisor when the budget spans few enough of them (no rounding at
 * all: a budget that one assignment meets exactly is met), else budget / 65536 rounded up. */
static int64_t pick_unit(const lm_knapsack *k) {
  int64_t g = 0;
  for (int i = 0; i < k->n * k->nk; i++)
    if (k->cost[i] > 0) g = gcd(k->cost[i], g);
  if (g > 0 && k->budget / g <= LM_KNAPSACK_EXACT) return g;
  return k->budget / LM_KNAPSACK_UNITS + 1;
}

static int64_t units(int64_t cost, int64_t unit) { return (cost + unit - 1) / unit; }

/* dp[u] = least value of the items so far within u units; pick[i][u] = item i's choice in
 * that optimum (-1: nothing fits). */
static void solve(const lm_knapsack *k, int64_t unit, int64_t U, double *dp, double *nx,
                  int8_t *pick) {
  for (int64_t u = 0; u <= U; u++)
    dp[u] = 0;
  for (int i = 0; i < k->n; i++) {
    int8_t *pk = pick + (size_t)i * (size_t)(U + 1);
    for (int64_t u = 0; u <= U; u++) {
      double best = DBL_MAX;
      int8_t arg = -1;
      for (int j = 0; j < k->nk; j++) {
        int64_t c = k->cost[i * k->nk + j];
        if (c < 0 || (c = units(c, unit)) > u || dp[u - c] == DBL_MAX) continue;
        double v = dp[u - c] + k->value[i * k->nk + j];
        if (v < best) best = v, arg = (int8_t)j;
      }
      nx[u] = best;
      pk[u] = arg;
    }
    memcpy(dp, nx, (size_t)(U + 1) * sizeof *dp);
  }
}

/* The budget in units the answer is read at: all of it, or the least that meets max_value. */
static int64_t answer_at(const lm_knapsack *k, const double *dp, int64_t U) {
  if (k->max_value < 0) return dp[U] == DBL_MAX ? -1 : U;
  for (int64_t u = 0; u <= U; u++)
    if (dp[u] <= k->max_value) return u;
  return -1;
}

lm_status lm_knapsack_solve(const lm_knapsack *k, lm_knapsack_result *out) {
  memset(out, 0, sizeof *out);
  if (k->n < 0 || k->nk < 1 || k->nk > 127 || k->budget < 0)
    return LM_ERRF(LM_ERR_INVALID, "knapsack: %d items of %d choices within %lld", k->n, k->nk,
                   (long long)k->budget);
  int64_t unit = pick_unit(k), U = k->budget / unit;
  double *dp = malloc((size_t)(U + 1) * sizeof *dp), *nx = malloc((size_t)(U + 1) * sizeof *nx);
  int8_t *pick = malloc((size_t)(k->n ? k->n : 1) * (size_t)(U + 1) * sizeof *pick);
  out->choice = malloc((size_t)(k->n ? k->n : 1) * sizeof *out->choice);
  lm_status s = dp && nx && pick && out->choice ? LM_OK : LM_ERRF(LM_ERR_NOMEM, "out of memory");
  int64_t u = -1;
  if (!s) {
    solve(k, unit, U, dp, nx, pick);
    if ((u = answer_at(k, dp, U)) < 0) s = LM_ERRF(LM_ERR_NOT_FOUND, "no plan fits");
  }
  if (!s) {
    out->value = dp[u];
    out->unit = unit;
    for (int i = k->n - 1; i >= 0; i--) { /* walk the choices back */
      int j = pick[(size_t)i * (size_t)(U + 1) + (size_t)u];
      out->choice[i] = j;
      out->cost += k->cost[i * k->nk + j];
      u -= units(k->cost[i * k->nk + j], unit);
    }
  }
  free(dp);
  free(nx);
  free(pick);
  if (s) lm_knapsack_result_free(out);
  return s;
}

void lm_knapsack_result_free(lm_knapsack_result *r) {
  free(r->choice);
  r->choice = NULL;
}
