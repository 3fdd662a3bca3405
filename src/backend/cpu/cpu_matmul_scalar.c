/* cpu_matmul_scalar.c — the portable kernel family: plain C, every bit width and dtype.
 * It is the generic path on CPUs without AVX2 and the readable statement of both precisions:
 * F32 computes w = s·q + b and an f32 dot; FAST the int8 block formula of cpu_matmul.h. */
#include "backend/cpu/cpu_matmul_impl.h"

/* Σ_k w[k]·x[k] for a dense row. */
static float lm_dot_dense(const lm_weight *w, const uint8_t *row, const float *x, int64_t k) {
  float acc = 0.0f;
  for (int64_t c = 0; c < k; c++)
    acc += lm_load_f32(row, w->dtype, c) * x[c];
  return acc;
}

/* Σ_k (s·q + b)·x for a quantized row, group by group as lm_weight_dequant_row does. */
static float lm_dot_quant_f32(const lm_mm_job *j, int64_t r, const float *x) {
  const lm_weight *w = j->w;
  const uint8_t *row = lm_weight_row_ptr(w, j->e, r);
  const uint8_t *sp = lm_weight_scale_ptr(w, j->e, r), *bp = lm_weight_bias_ptr(w, j->e, r);
  uint8_t q[128];
  float acc = 0.0f;
  for (int64_t g = 0; g < j->ng; g++) {
    float s = lm_load_f32(sp, w->sdtype, g), b = lm_load_f32(bp, w->sdtype, g);
    lm_mm_unpack_codes(row, w->bits, g * w->group, w->group, q);
    const float *xg = x + g * w->group;
    for (int i = 0; i < w->group; i++)
      acc += (s * (float)q[i] + b) * xg[i];
  }
  return acc;
}

static void lm_gemv_f32_scalar(const lm_mm_job *j, int64_t r0, int64_t r1) {
  const lm_weight *w = j->w;
  for (int64_t r = r0; r < r1; r++)
    for (int64_t t = 0; t < j->m; t++) {
      const float *x = j->x + t * j->ldx;
      float v = w->bits ? lm_dot_quant_f32(j, r, x)
                        : lm_dot_dense(w, lm_weight_row_ptr(w, j->e, r), x, j->k);
      lm_mm_put(j->y + t * j->ldy + r, v, j->acc);
    }
}

/* y = Σ_g s_g·Σ_{b in g} d_b·Σ q·xq + b_g·sx_g (natural activation layout). */
static float lm_dot_quant_fast(const lm_mm_job *j, int64_t r, int64_t t) {
  const lm_weight *w = j->w;
  const lm_qact *qa = j->qa;
  const uint8_t *row = lm_weight_row_ptr(w, j->e, r);
  const uint8_t *sp = lm_weight_scale_ptr(w, j->e, r), *bp = lm_weight_bias_ptr(w, j->e, r);
  const int8_t *xq = qa->q + t * qa->ldq;
  const float *d = qa->d + t * j->nb, *sx = qa->sx + t * j->ng;
  int bpg = w->group / LM_QA_BLOCK;
  uint8_t q[LM_QA_BLOCK];
  float acc = 0.0f;
  for (int64_t g = 0; g < j->ng; g++) {
    float gs = 0.0f;
    for (int bb = 0; bb < bpg; bb++) {
      int64_t b = g * bpg + bb;
      lm_mm_unpack_codes(row, w->bits, b * LM_QA_BLOCK, LM_QA_BLOCK, q);
      int32_t isum = 0;
      for (int i = 0; i < LM_QA_BLOCK; i++)
        isum += (int32_t)q[i] * xq[b * LM_QA_BLOCK + i];
      gs += d[b] * (float)isum;
    }
    acc += lm_load_f32(sp, w->sdtype, g) * gs + lm_load_f32(bp, w->sdtype, g) * sx[g];
  }
  return acc;
}

static void lm_gemv_fast_scalar(const lm_mm_job *j, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; r++)
    for (int64_t t = 0; t < j->m; t++)
      lm_mm_put(j->y + t * j->ldy + r, lm_dot_quant_fast(j, r, t), j->acc);
}

static void lm_dequant_rows_scalar(const lm_weight *w, int64_t e, int64_t r0, int64_t n, float *out,
                                   int64_t ldo) {
  for (int64_t i = 0; i < n; i++)
    lm_weight_dequant_row(w, e, r0 + i, out + i * ldo);
}

static void lm_unpack_codes_scalar(const lm_weight *w, const uint8_t *row, int64_t c0, int64_t n,
                                   uint8_t *out) {
  lm_mm_unpack_codes(row, w->bits, c0, n, out);
}

const lm_cpu_kernels lm_cpu_kernels_scalar = {
    .isa = LM_CPU_ISA_SCALAR,
    .name = "scalar",
    .q4_perm = 0,
    .gemv_f32 = lm_gemv_f32_scalar,
    .gemv_fast = lm_gemv_fast_scalar,
    .dequant_rows = lm_dequant_rows_scalar,
    .quantize = lm_mm_quantize_rows,
    .unpack_codes = lm_unpack_codes_scalar,
    .interleave = NULL,
    .gemm_nr = 0,
    .gemm_mr = 0,
    .gemm_fast = NULL,
};
