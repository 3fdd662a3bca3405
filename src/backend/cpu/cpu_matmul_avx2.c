/* cpu_matmul_avx2.c — the AVX2 + FMA + F16C kernel family (compiled with target
 * attributes, chosen at run time). Fast paths: dense f32/bf16/f16, 4-bit and 8-bit codes;
 * other widths unpack their codes to bytes (lm_mm_unpack_codes) and share the 8-bit loops.
 *
 * F32 gemv:  per group, Σ float(q)·x in four independent FMA chains, then acc += s·dot;
 *            the b·Σx half of the affine term comes from the driver's group sums.
 * FAST gemv: vpmaddubsw (u8 codes × s8 activations → s16 pairs) + vpmaddwd → s32 per block
 *            of 32, scaled in f32 by s_g·d_b. 4-bit codes read the activations in the perm-64
 *            layout, so low and high nibbles need no interleaving. 8-bit codes exceed
 *            vpmaddubsw's s16 range (2·255·127), so they run as signed w' = q − 128 with the
 *            sign trick |w'|·sign(x, w') and the 128·Σxq term (lm_qact.c8) added back.
 * GEMM:      tiles of 8 rows × 4-column quads (one 32-bit lane per row), MR = 4 tokens, the
 *            activations' 4 bytes broadcast; s16 partial sums flushed to s32 per block. */
#if defined(__x86_64__)
#include <immintrin.h>
#include <string.h>

#include "backend/cpu/cpu_matmul_impl.h"

#define LM_AVX2 __attribute__((target("avx2,fma,f16c")))

/* ---- small helpers ------------------------------------------------------------------- */

LM_AVX2 static inline float lm_hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

LM_AVX2 static inline __m256 lm_u8x8_to_f32(const uint8_t *p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)p)));
}

LM_AVX2 static inline __m256 lm_bf16x8(const uint8_t *p) {
  __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

/* 32 codes of a 4-bit row (16 bytes) in natural order: two vectors of 16 bytes. */
LM_AVX2 static inline void lm_q4_unpack32(const uint8_t *p, __m128i *c0, __m128i *c1) {
  const __m128i m4 = _mm_set1_epi8(0x0f);
  __m128i v = _mm_loadu_si128((const __m128i *)(const void *)p);
  __m128i lo = _mm_and_si128(v, m4), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m4);
  *c0 = _mm_unpacklo_epi8(lo, hi);
  *c1 = _mm_unpackhi_epi8(lo, hi);
}

/* ---- dense rows ------------------------------------------------------------------------ */

#define LM_DENSE_DOT(NAME, ESZ, LOAD8, LOAD1)                                                          \
  LM_AVX2 static float NAME(const uint8_t *row, const float *x, int64_t k) {                          \
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                                         \
    int64_t c = 0;                                                                                     \
    for (; c + 32 <= k; c += 32) {                                                                     \
      a0 = _mm256_fmadd_ps(LOAD8(row + (c + 0) * ESZ), _mm256_loadu_ps(x + c + 0), a0);                \
      a1 = _mm256_fmadd_ps(LOAD8(row + (c + 8) * ESZ), _mm256_loadu_ps(x + c + 8), a1);                \
      a2 = _mm256_fmadd_ps(LOAD8(row + (c + 16) * ESZ), _mm256_loadu_ps(x + c + 16), a2);              \
      a3 = _mm256_fmadd_ps(LOAD8(row + (c + 24) * ESZ), _mm256_loadu_ps(x + c + 24), a3);              \
    }                                                                                                  \
    for (; c + 8 <= k; c += 8) a0 = _mm256_fmadd_ps(LOAD8(row + c * ESZ), _mm256_loadu_ps(x + c), a0); \
    float s = lm_hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));                   \
    for (; c < k; c++) s += LOAD1(row, c) * x[c];                                                      \
    return s;                                                                                          \
  }

#define LM_LD_F32(p) _mm256_loadu_ps((const float *)(const void *)(p))
#define LM_LD_F16(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p)))
#define LM_LD1_F32(row, c) lm_load_f32(row, LM_DT_F32, c)
#define LM_LD1_F16(row, c) lm_load_f32(row, LM_DT_F16, c)
#define LM_LD1_BF16(row, c) lm_load_f32(row, LM_DT_BF16, c)
LM_DENSE_DOT(lm_dot_f32_avx2, 4, LM_LD_F32, LM_LD1_F32)
LM_DENSE_DOT(lm_dot_f16_avx2, 2, LM_LD_F16, LM_LD1_F16)
LM_DENSE_DOT(lm_dot_bf16_avx2, 2, lm_bf16x8, LM_LD1_BF16)

LM_AVX2 static float lm_dot_dense_avx2(const lm_weight *w, const uint8_t *row, const float *x, int64_t k) {
  switch (w->dtype) {
  case LM_DT_F32: return lm_dot_f32_avx2(row, x, k);
  case LM_DT_F16: return lm_dot_f16_avx2(row, x, k);
  default: return lm_dot_bf16_avx2(row, x, k);
  }
}

/* ---- quantized rows, F32 math ----------------------------------------------------------- */

/* Σ float(q)·x over n codes (n a multiple of 32) given as bytes. */
LM_AVX2 static inline __m256 lm_u8_dot_f32(const uint8_t *q, const float *x, int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t c = 0; c < n; c += 32) {
    a0 = _mm256_fmadd_ps(lm_u8x8_to_f32(q + c + 0), _mm256_loadu_ps(x + c + 0), a0);
    a1 = _mm256_fmadd_ps(lm_u8x8_to_f32(q + c + 8), _mm256_loadu_ps(x + c + 8), a1);
    a2 = _mm256_fmadd_ps(lm_u8x8_to_f32(q + c + 16), _mm256_loadu_ps(x + c + 16), a2);
    a3 = _mm256_fmadd_ps(lm_u8x8_to_f32(q + c + 24), _mm256_loadu_ps(x + c + 24), a3);
  }
  return _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
}

/* The same for n 4-bit codes packed two per byte. */
LM_AVX2 static inline __m256 lm_q4_dot_f32(const uint8_t *p, const float *x, int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t c = 0; c < n; c += 32) {
    __m128i c0, c1;
    lm_q4_unpack32(p + c / 2, &c0, &c1);
    a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(c0)), _mm256_loadu_ps(x + c + 0), a0);
    a1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(c0, 8))),
                         _mm256_loadu_ps(x + c + 8), a1);
    a2 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(c1)), _mm256_loadu_ps(x + c + 16), a2);
    a3 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(c1, 8))),
                         _mm256_loadu_ps(x + c + 24), a3);
  }
  return _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
}

/* Σ_g s_g·Σ_{k in g} q_k·x_k + b_g·Σx_g for one row and one token. */
LM_AVX2 static float lm_dot_quant_f32_avx2(const lm_mm_job *j, int64_t r, const float *x, const float *gsum) {
  const lm_weight *w = j->w;
  const uint8_t *row = lm_weight_row_ptr(w, j->e, r);
  const uint8_t *sp = lm_weight_scale_ptr(w, j->e, r), *bp = lm_weight_bias_ptr(w, j->e, r);
  int64_t gs = w->group;
  uint8_t q[128];
  __m256 acc = _mm256_setzero_ps();
  float bsum = 0.0f;
  for (int64_t g = 0; g < j->ng; g++) {
    __m256 d;
    if (w->bits == 4) {
      d = lm_q4_dot_f32(row + g * gs / 2, x + g * gs, gs);
    } else if (w->bits == 8) {
      d = lm_u8_dot_f32(row + g * gs, x + g * gs, gs);
    } else {
      lm_mm_unpack_codes(row, w->bits, g * gs, gs, q);
      d = lm_u8_dot_f32(q, x + g * gs, gs);
    }
    acc = _mm256_fmadd_ps(d, _mm256_set1_ps(lm_load_f32(sp, w->sdtype, g)), acc);
    bsum += lm_load_f32(bp, w->sdtype, g) * gsum[g];
  }
  return lm_hsum8(acc) + bsum;
}

LM_AVX2 static void lm_gemv_f32_avx2(const lm_mm_job *j, int64_t r0, int64_t r1) {
  const lm_weight *w = j->w;
  for (int64_t r = r0; r < r1; r++)
    for (int64_t t = 0; t < j->m; t++) {
      const float *x = j->x + t * j->ldx;
      float v = w->bits ? lm_dot_quant_f32_avx2(j, r, x, j->gsum + t * j->ng)
                        : lm_dot_dense_avx2(w, lm_weight_row_ptr(w, j->e, r), x, j->k);
      lm_mm_put(j->y + t * j->ldy + r, v, j->acc);
    }
}

/* ---- dequantization to f32 (the sgemm tiles) ---------------------------------------------- */

/* s·q + b as a multiply then an add, so the tile is bit-identical to lm_weight_dequant_row. */
LM_AVX2 static inline void lm_affine8(float *out, __m256 q, __m256 s, __m256 b) {
  _mm256_storeu_ps(out, _mm256_add_ps(_mm256_mul_ps(q, s), b));
}

LM_AVX2 static void lm_dequant_row_avx2(const lm_weight *w, int64_t e, int64_t r, float *out, uint8_t *qbuf) {
  const uint8_t *row = lm_weight_row_ptr(w, e, r);
  if (!w->bits) {
    int64_t c = 0;
    if (w->dtype == LM_DT_BF16)
      for (; c + 8 <= w->cols; c += 8) _mm256_storeu_ps(out + c, lm_bf16x8(row + 2 * c));
    else if (w->dtype == LM_DT_F16)
      for (; c + 8 <= w->cols; c += 8) _mm256_storeu_ps(out + c, LM_LD_F16(row + 2 * c));
    for (; c < w->cols; c++) out[c] = lm_load_f32(row, w->dtype, c);
    return;
  }
  const uint8_t *sp = lm_weight_scale_ptr(w, e, r), *bp = lm_weight_bias_ptr(w, e, r), *q = row;
  if (w->bits == 4) {
    for (int64_t c = 0; c < w->cols; c += 32) {
      __m128i c0, c1;
      lm_q4_unpack32(row + c / 2, &c0, &c1);
      _mm_storeu_si128((__m128i *)(void *)(qbuf + c), c0);
      _mm_storeu_si128((__m128i *)(void *)(qbuf + c + 16), c1);
    }
    q = qbuf;
  } else if (w->bits != 8) {
    lm_mm_unpack_codes(row, w->bits, 0, w->cols, qbuf);
    q = qbuf;
  }
  for (int64_t g = 0; g < w->cols / w->group; g++) {
    __m256 s = _mm256_set1_ps(lm_load_f32(sp, w->sdtype, g)), b = _mm256_set1_ps(lm_load_f32(bp, w->sdtype, g));
    for (int64_t c = g * w->group; c < (g + 1) * w->group; c += 8) lm_affine8(out + c, lm_u8x8_to_f32(q + c), s, b);
  }
}

LM_AVX2 static void lm_dequant_rows_avx2(const lm_weight *w, int64_t e, int64_t r0, int64_t n, float *out,
                                         int64_t ldo) {
  /* codes of one row as bytes; rows wider than the buffer fall back to the reference */
  uint8_t qbuf[16384];
  for (int64_t i = 0; i < n; i++) {
    if (w->bits && w->bits != 8 && w->cols > (int64_t)sizeof qbuf)
      lm_weight_dequant_row(w, e, r0 + i, out + i * ldo);
    else
      lm_dequant_row_avx2(w, e, r0 + i, out + i * ldo, qbuf);
  }
}

LM_AVX2 static void lm_unpack_row_avx2(const lm_weight *w, const uint8_t *row, uint8_t *out) {
  if (w->bits == 8) {
    memcpy(out, row, (size_t)w->cols);
  } else if (w->bits == 4) {
    for (int64_t c = 0; c < w->cols; c += 32) {
      __m128i c0, c1;
      lm_q4_unpack32(row + c / 2, &c0, &c1);
      _mm_storeu_si128((__m128i *)(void *)(out + c), c0);
      _mm_storeu_si128((__m128i *)(void *)(out + c + 16), c1);
    }
  } else {
    lm_mm_unpack_codes(row, w->bits, 0, w->cols, out);
  }
}

const lm_cpu_kernels lm_cpu_kernels_avx2 = {
    .isa = LM_CPU_ISA_AVX2,
    .name = "avx2",
    .q4_perm = 0,
    .gemv_f32 = lm_gemv_f32_avx2,
    .gemv_fast = NULL,
    .dequant_rows = lm_dequant_rows_avx2,
    .quantize = lm_mm_quantize_rows,
    .unpack_row = lm_unpack_row_avx2,
    .gemm_nr = 0,
    .gemm_mr = 0,
    .gemm_signed8 = 1,
    .gemm_fast = NULL,
};

#endif
