/* quant_plan.h — per-module widths under an average-bits budget: the multiple-choice knapsack
 * over a sweep's table (quant_sweep.h) that minimizes the sum of the modules' measured KLs
 * while the bytes of codes, scales and biases of every quantized module stay within
 * target_bpw bits per weight (lm_knapsack_solve: exact over byte units, never over budget). */
#ifndef LM_MODEL_QUANT_PLAN_H
#define LM_MODEL_QUANT_PLAN_H

#include "model/quant_sweep.h"

typedef struct lm_qplan {
  int *choice;   /* [n_rows]: an index into the sweep's kinds */
  double kl_sum; /* Σ of the chosen measured KLs (the additive prediction) */
  double bpw;    /* achieved bits per weight over every quantized module */
  int64_t bytes; /* of every module at its chosen kind */
  int64_t unit;  /* the byte unit of the program */
} lm_qplan;

/* Errors: LM_ERR_INVALID when even the smallest kind of every module exceeds the budget (the
 * message gives the smallest reachable bpw) or a module has no kind that fits. */
lm_status lm_quant_plan(const lm_qsweep *t, double target_bpw, lm_qplan *out);
void lm_qplan_free(lm_qplan *p);

#endif
