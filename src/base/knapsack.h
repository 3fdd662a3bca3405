/* knapsack.h — the multiple-choice knapsack that the measured-quantization plans solve: n items,
 * each taking exactly one of nk choices with a cost (bytes) and a value (a measured KL); the
 * least total value within a budget, or the least budget whose least value is within a bound.
 * Exact by dynamic programming over cost units: the costs' common divisor where the budget
 * spans at most 2^20 of it, else budget / 65536 with each cost rounded up to whole units, so a
 * plan's real cost never exceeds the budget (that rounding can only forgo a plan that fits by
 * less than n units). */
#ifndef LM_BASE_KNAPSACK_H
#define LM_BASE_KNAPSACK_H

#include <stdint.h>

#include "base/status.h"

typedef struct lm_knapsack {
  int n, nk;           /* nk <= 127 */
  const int64_t *cost; /* [n][nk]; negative: the choice is not allowed */
  const double *value; /* [n][nk] */
  int64_t budget;
  /* >= 0: instead of the least value within the budget, the least cost within the budget
   * whose least value is <= max_value */
  double max_value;
} lm_knapsack;

typedef struct lm_knapsack_result {
  int *choice;  /* [n], malloc'ed (lm_knapsack_result_free) */
  double value; /* Σ of the chosen values */
  int64_t cost; /* Σ of the chosen costs */
  int64_t unit; /* the cost unit of the program */
} lm_knapsack_result;

/* LM_ERR_NOT_FOUND when no assignment fits (an item without an allowed choice, a budget below
 * the cheapest assignment, or a max_value no plan within the budget reaches). */
lm_status lm_knapsack_solve(const lm_knapsack *k, lm_knapsack_result *out);
void lm_knapsack_result_free(lm_knapsack_result *r);

#endif
