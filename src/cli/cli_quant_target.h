/* cli_quant_target.h — `lumen quantize --target-bpw`: calibration tokens, the sensitivity
 * sweep (or a table saved by an earlier one), the knapsack, and the per-module rules that
 * lm_model_quantize then writes. */
#ifndef LM_CLI_QUANT_TARGET_H
#define LM_CLI_QUANT_TARGET_H

#include "cli/cli_common.h"
#include "model/quantize.h"

extern const char lm_cli_default_calib[]; /* cli_calib_text.c */

typedef struct lm_cli_qtarget {
  double bpw;                       /* the average-bits budget */
  const char *calib, *calib_ids;    /* a text file, or comma-separated ids (else the default) */
  const char *bits_set, *groups;    /* candidate lists, e.g. "2,3,4,5,6,8" and "32,64,128" */
  const char *table_out, *table_in; /* --table FILE (write), --from-table FILE (read) */
  int64_t calib_tokens;             /* the calibration tokens used (the first ones) */
  const char *preset;               /* measure a synthetic bf16 model of this geometry */
  lm_cli_backend_opts be;
} lm_cli_qtarget;

/* Measures (or reads) the table, plans, prints the plan, and fills rules [one per module, exact]
 * and the default kind of o (the plan's most common). rules and their patterns are malloc'ed
 * (lm_cli_qtarget_free_rules). Returns 0, or 1 after printing the error. */
int lm_cli_qtarget_plan(lm_model *m, const lm_cli_qtarget *q, lm_quantize_opts *o);
void lm_cli_qtarget_free_rules(lm_quantize_opts *o);

#endif
