/* weight.h — a weight matrix as stored in a checkpoint: dense (f32/f16/bf16) or MLX
 * affine-quantized (gemma4-spec §8), optionally a stack of experts.
 *
 * Layout (row-major, rows = output features, cols = input features; y = x · Wᵀ):
 *   dense:     data  [E][rows][cols]                 elements of `dtype`
 *   quantized: data  [E][rows][cols*bits/32]          u32 words, little-endian bit stream per row
 *              scales/biases [E][rows][cols/group]    elements of `sdtype`
 *              w[r][c] = scale[r][c/group] * q[r][c] + bias[r][c/group]
 * `expert_rows` is the row distance between experts in storage; it equals `rows` except for
 * views (e.g. the gate half of HF's fused gate_up_proj [E, 2*I, H]). */
#ifndef LM_TENSOR_WEIGHT_H
#define LM_TENSOR_WEIGHT_H

#include <stdint.h>
#include "tensor/dtype.h"

typedef struct lm_weight {
  const char *name;    /* checkpoint tensor name, for messages */
  int64_t n_experts;   /* 0: a plain matrix; E: E stacked matrices */
  int64_t rows, cols;  /* per expert: out, in */
  int64_t expert_rows; /* rows between consecutive experts in storage (>= rows) */
  lm_dtype dtype;      /* dense element type; LM_DT_U32 when quantized */
  int bits, group;     /* 0, 0 when dense; else 2..8 (not 7), 32/64/128 */
  lm_dtype sdtype;     /* scales/biases element type (quantized only) */
  const void *data;    /* first element / word of row 0 of expert 0 */
  const void *scales;
  const void *biases;
  void *backend; /* a backend's own copy/handle (device pointer, repacked layout) */
  void *owned;   /* the allocation holding a payload exchanged in (freed with the model); NULL
                    while the payload is the checkpoint's */
} lm_weight;

/* Bytes of one stored row of codes or elements. */
static inline int64_t lm_weight_row_bytes(const lm_weight *w) {
  return w->bits ? w->cols * w->bits / 8 : w->cols * (int64_t)lm_dtype_size(w->dtype);
}

/* Total bytes a weight occupies (codes + scales + biases), counting every expert. */
int64_t lm_weight_bytes(const lm_weight *w);

/* Code k of a packed row (any bit width 2..8). Reads 2 bytes, so for the row's last byte the
 * caller must stay inside the tensor; lm_weight_dequant_row shows how. */
static inline uint32_t lm_affine_code(const uint8_t *row, int64_t k, int bits) {
  uint64_t bitpos = (uint64_t)k * (uint64_t)bits, v = 0;
  memcpy(&v, row + (bitpos >> 3), 2); /* bits <= 8: a code spans at most 2 bytes */
  return (uint32_t)(v >> (bitpos & 7)) & ((1u << bits) - 1u);
}

/* Dequantizes (or converts) row r of expert e into out[cols] as f32. Exact: s*q + b in f32. */
void lm_weight_dequant_row(const lm_weight *w, int64_t e, int64_t r, float *out);

/* Pointer to row r of expert e (codes or elements) and, when quantized, its scales/biases. */
const uint8_t *lm_weight_row_ptr(const lm_weight *w, int64_t e, int64_t r);
const uint8_t *lm_weight_scale_ptr(const lm_weight *w, int64_t e, int64_t r);
const uint8_t *lm_weight_bias_ptr(const lm_weight *w, int64_t e, int64_t r);

/* Reads element i of a scales/biases/dense array of type t as f32. */
float lm_load_f32(const void *p, lm_dtype t, int64_t i);

#endif
