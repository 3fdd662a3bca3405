/* weight.c — reference access to dense and MLX affine-quantized weights. These scalar
 * routines define the math; backends' fast kernels are tested against them. */
#include "tensor/weight.h"

float lm_load_f32(const void *p, lm_dtype t, int64_t i) {
  switch (t) {
  case LM_DT_F32: return ((const float *)p)[i];
  case LM_DT_BF16: return lm_bf16_to_f32(((const uint16_t *)p)[i]);
  case LM_DT_F16: return lm_f16_to_f32(((const uint16_t *)p)[i]);
  default: return 0.0f; /* loaders only bind f32/bf16/f16 here */
  }
}

int64_t lm_weight_bytes(const lm_weight *w) {
  int64_t ne = w->n_experts ? w->n_experts : 1, b = w->rows * lm_weight_row_bytes(w);
  if (w->bits) b += 2 * w->rows * (w->cols / w->group) * (int64_t)lm_dtype_size(w->sdtype);
  return ne * b;
}

static int64_t lm_row_index(const lm_weight *w, int64_t e, int64_t r) {
  return e * w->expert_rows + r;
}

const uint8_t *lm_weight_row_ptr(const lm_weight *w, int64_t e, int64_t r) {
  return (const uint8_t *)w->data + lm_row_index(w, e, r) * lm_weight_row_bytes(w);
}

const uint8_t *lm_weight_scale_ptr(const lm_weight *w, int64_t e, int64_t r) {
  return (const uint8_t *)w->scales +
         lm_row_index(w, e, r) * (w->cols / w->group) * (int64_t)lm_dtype_size(w->sdtype);
}

const uint8_t *lm_weight_bias_ptr(const lm_weight *w, int64_t e, int64_t r) {
  return (const uint8_t *)w->biases +
         lm_row_index(w, e, r) * (w->cols / w->group) * (int64_t)lm_dtype_size(w->sdtype);
}

void lm_weight_dequant_row(const lm_weight *w, int64_t e, int64_t r, float *out) {
  const uint8_t *row = lm_weight_row_ptr(w, e, r);
  if (!w->bits) {
    for (int64_t c = 0; c < w->cols; c++)
      out[c] = lm_load_f32(row, w->dtype, c);
    return;
  }
  const uint8_t *sp = lm_weight_scale_ptr(w, e, r), *bp = lm_weight_bias_ptr(w, e, r);
  int64_t rb = lm_weight_row_bytes(w);
  for (int64_t c = 0; c < w->cols; c++) {
    /* Near the row's end read byte-wise so we never touch memory past the tensor. */
    uint64_t bitpos = (uint64_t)c * (uint64_t)w->bits;
    uint32_t q;
    if ((int64_t)(bitpos >> 3) + 2 <= rb) {
      q = lm_affine_code(row, c, w->bits);
    } else {
      uint32_t v = row[bitpos >> 3];
      q = (v >> (bitpos & 7)) & ((1u << w->bits) - 1u);
    }
    int64_t g = c / w->group;
    out[c] = lm_load_f32(sp, w->sdtype, g) * (float)q + lm_load_f32(bp, w->sdtype, g);
  }
}
