/* quant_sweep.h — what each module's quantization costs the model: for every quantizable
 * matrix and every candidate (bits, group), the mean KL of the model's next-token distributions
 * on calibration tokens against the model as loaded, with only that module quantized. Each
 * candidate is exchanged in (lm_exchange_weight), measured, and exchanged back, so the
 * model is loaded once. The table feeds lm_quant_plan (quant_plan.h). */
#ifndef LM_MODEL_QUANT_SWEEP_H
#define LM_MODEL_QUANT_SWEEP_H

#include "backend/backend.h"
#include "model/model.h"
#include "tensor/weight_payload.h"

#define LM_QSWEEP_MAX_KINDS 24
#define LM_QSWEEP_MODULE_CHARS 160

typedef struct lm_qkind {
  int bits, group;
} lm_qkind;

typedef struct lm_qsweep_row {
  char module[LM_QSWEEP_MODULE_CHARS]; /* MLX path under the model prefix */
  lm_weight *w;                        /* NULL in a table read back from a file */
  int64_t params;                      /* elements, every expert */
  double kl[LM_QSWEEP_MAX_KINDS];      /* per kind; negative: the kind does not fit */
  int64_t bytes[LM_QSWEEP_MAX_KINDS];  /* codes + bf16 scales and biases */
} lm_qsweep_row;

typedef struct lm_qsweep {
  lm_qkind kinds[LM_QSWEEP_MAX_KINDS];
  int n_kinds;
  lm_qsweep_row *rows; /* every quantizable module */
  int n_rows;
  int64_t calib_tokens;
  /* where a measurement's time went, seconds summed over the sweep */
  double s_quantize, s_exchange, s_forward, s_kl;
} lm_qsweep;

typedef struct lm_qsweep_opts {
  const lm_qkind *kinds;
  int n_kinds;
  const int32_t *ids; /* calibration tokens */
  int64_t n_ids, chunk;
  /* after each measurement: done of total, the module just measured (may be NULL) */
  void (*progress)(void *ctx, int64_t done, int64_t total, const char *module);
  void *progress_ctx;
} lm_qsweep_opts;

/* Measures the table on be (the parity precision is the sensible one). The model must be
 * unquantized (the reference); its weights are as loaded again when this returns. */
lm_status lm_quant_sweep(lm_model *m, lm_backend *be, const lm_qsweep_opts *o, lm_qsweep *out);
void lm_qsweep_free(lm_qsweep *s);

/* The bytes of each kind on row r for weight w, and kl = -1 for a kind that does not fit it (its
 * width, or a module kept at a forced width: the MoE router takes 8-bit kinds only); the KL of a
 * kind that fits is left as it is. */
void lm_qsweep_row_kinds(lm_qsweep_row *r, const lm_weight *w, const lm_qkind *kinds, int n);

#endif
