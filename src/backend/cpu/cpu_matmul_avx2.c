/* cpu_matmul_avx2.c — the AVX2 + FMA + F16C kernel family (compiled with target
 * attributes, chosen at run time). Fast paths: dense f32/bf16/f16, 4-bit and 8-bit codes;
 * other widths unpack their codes to bytes (lm_mm_unpack_codes) and share the 8-bit loops.
 *
 * F32 gemv:  per group, Σ float(q)·x in four independent FMA chains, then acc += s·dot;
 *            the b·Σx half of the affine term comes from the driver's group sums.
 * FAST gemv: vpmaddubsw (u8 codes × s8 activations → s16 pairs) + vpmaddwd → s32 per block
 *            of 32, scaled in f32 by s_g·d_b. 4-bit codes read the activations in the perm-64
 *            layout, so low and high nibbles need no interleaving, and go four rows at a time
 *            (lm_q4_rows: one FMA per chunk of 64 columns of four rows). 8-bit codes exceed
 *            vpmaddubsw's s16 range (2·255·127), so they run as signed w' = q − 128 with the
 *            sign trick |w'|·sign(x, w') and the 128·Σxq term (lm_qact.c8) added back.
 * GEMM:      tiles of 8 rows × 4-column quads (one 32-bit lane per row), MR = 4 tokens, the
 *            activations' 4 bytes broadcast; s16 partial sums flushed to s32 per block. */
#if defined(__x86_64__)
#include <immintrin.h>
#include <string.h>

#include "backend/cpu/cpu_matmul_impl.h"

#define LM_AVX2 __attribute__((target("avx2,fma,f16c")))
#define LM_INLINE __attribute__((always_inline)) inline

/* ---- small helpers ------------------------------------------------------------------- */

LM_AVX2 static inline float lm_hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

LM_AVX2 static inline __m256 lm_u8x8_to_f32(const uint8_t *p) {
  return _mm256_cvtepi32_ps(
      _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)p)));
}

LM_AVX2 static inline __m256 lm_bf16x8(const uint8_t *p) {
  __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

/* 32 codes of a 4-bit row (16 bytes) in natural order: two vectors of 16 bytes. */
LM_AVX2 static LM_INLINE void lm_q4_unpack32(const uint8_t *p, __m128i *c0, __m128i *c1) {
  const __m128i m4 = _mm_set1_epi8(0x0f);
  __m128i v = _mm_loadu_si128((const __m128i *)(const void *)p);
  __m128i lo = _mm_and_si128(v, m4), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m4);
  *c0 = _mm_unpacklo_epi8(lo, hi);
  *c1 = _mm_unpackhi_epi8(lo, hi);
}

/* log2(group / 32): the group of block b is b >> shift (no integer division in the loops). */
static inline int lm_gshift(int group) { return group == 32 ? 0 : group == 64 ? 1 : 2; }

#define LM_SEG 8192      /* columns per segment: bounds the per-row f32 scale buffers below */
#define LM_PF_BYTES 2048 /* decode: how far ahead of the codes being read to prefetch */

/* Prefetches the codes LM_PF_BYTES past row r (rb bytes) and a row's scales ahead, as far as
 * `left` bytes remain in this thread's range: one core's hardware prefetch alone does not
 * keep enough misses in flight to reach the memory bandwidth. */
static inline void lm_prefetch_ahead(const uint8_t *row, int64_t rb, int64_t left,
                                     const uint8_t *sp, int64_t sb) {
  for (int64_t o = LM_PF_BYTES; o < LM_PF_BYTES + rb && o < left; o += 64)
    __builtin_prefetch(row + o);
  if (left > LM_PF_BYTES) __builtin_prefetch(sp + sb * (LM_PF_BYTES / rb + 1));
}

/* Scales and biases of groups [g0, g0+n) of a row as f32. */
LM_AVX2 static LM_INLINE void lm_load_sb(const lm_weight *w, const uint8_t *sp, const uint8_t *bp,
                                         int64_t g0, int64_t n, float *sf, float *bf) {
  int64_t i = 0;
  if (w->sdtype == LM_DT_BF16)
    for (; i + 8 <= n; i += 8) {
      _mm256_storeu_ps(sf + i, lm_bf16x8(sp + 2 * (g0 + i)));
      _mm256_storeu_ps(bf + i, lm_bf16x8(bp + 2 * (g0 + i)));
    }
  for (; i < n; i++) {
    sf[i] = lm_load_f32(sp, w->sdtype, g0 + i);
    bf[i] = lm_load_f32(bp, w->sdtype, g0 + i);
  }
}

LM_AVX2 static LM_INLINE float lm_dot_sb(const float *a, const float *b, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  float s = lm_hsum8(acc);
  for (; i < n; i++)
    s += a[i] * b[i];
  return s;
}

/* ---- dense rows ------------------------------------------------------------------------ */

#define LM_DENSE_DOT(NAME, ESZ, LOAD8, LOAD1)                                                      \
  LM_AVX2 static float NAME(const uint8_t *row, const float *x, int64_t k) {                       \
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                                    \
    int64_t c = 0;                                                                                 \
    for (; c + 32 <= k; c += 32) {                                                                 \
      a0 = _mm256_fmadd_ps(LOAD8(row + (c + 0) * ESZ), _mm256_loadu_ps(x + c + 0), a0);            \
      a1 = _mm256_fmadd_ps(LOAD8(row + (c + 8) * ESZ), _mm256_loadu_ps(x + c + 8), a1);            \
      a2 = _mm256_fmadd_ps(LOAD8(row + (c + 16) * ESZ), _mm256_loadu_ps(x + c + 16), a2);          \
      a3 = _mm256_fmadd_ps(LOAD8(row + (c + 24) * ESZ), _mm256_loadu_ps(x + c + 24), a3);          \
    }                                                                                              \
    for (; c + 8 <= k; c += 8)                                                                     \
      a0 = _mm256_fmadd_ps(LOAD8(row + c * ESZ), _mm256_loadu_ps(x + c), a0);                      \
    float s = lm_hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));               \
    for (; c < k; c++)                                                                             \
      s += LOAD1(row, c) * x[c];                                                                   \
    return s;                                                                                      \
  }

#define LM_LD_F32(p) _mm256_loadu_ps((const float *)(const void *)(p))
#define LM_LD_F16(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p)))
#define LM_LD1_F32(row, c) lm_load_f32(row, LM_DT_F32, c)
#define LM_LD1_F16(row, c) lm_load_f32(row, LM_DT_F16, c)
#define LM_LD1_BF16(row, c) lm_load_f32(row, LM_DT_BF16, c)
LM_DENSE_DOT(lm_dot_f32_avx2, 4, LM_LD_F32, LM_LD1_F32)
LM_DENSE_DOT(lm_dot_f16_avx2, 2, LM_LD_F16, LM_LD1_F16)
LM_DENSE_DOT(lm_dot_bf16_avx2, 2, lm_bf16x8, LM_LD1_BF16)

LM_AVX2 static float lm_dot_dense_avx2(const lm_weight *w, const uint8_t *row, const float *x,
                                       int64_t k) {
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
    a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(c0)), _mm256_loadu_ps(x + c + 0),
                         a0);
    a1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(c0, 8))),
                         _mm256_loadu_ps(x + c + 8), a1);
    a2 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(c1)), _mm256_loadu_ps(x + c + 16),
                         a2);
    a3 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(c1, 8))),
                         _mm256_loadu_ps(x + c + 24), a3);
  }
  return _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
}

/* Σ_g s_g·Σ_{k in g} q_k·x_k over one segment of a row (n columns from code c0 = 0 of
 * `row`, codes as bytes in q when the width is not 4 or 8); the b_g·Σx_g half is added by
 * the caller. */
LM_AVX2 static LM_INLINE float lm_seg_quant_f32(const lm_weight *w, const uint8_t *row,
                                                const float *x, const float *sf, int64_t n) {
  int64_t gs = w->group;
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
  for (int64_t g = 0; g < n / gs; g++) {
    __m256 d = w->bits == 4 ? lm_q4_dot_f32(row + g * gs / 2, x + g * gs, gs)
                            : lm_u8_dot_f32(row + g * gs, x + g * gs, gs);
    if (g & 1)
      acc1 = _mm256_fmadd_ps(d, _mm256_broadcast_ss(sf + g), acc1);
    else
      acc0 = _mm256_fmadd_ps(d, _mm256_broadcast_ss(sf + g), acc0);
  }
  return lm_hsum8(_mm256_add_ps(acc0, acc1));
}

/* The row drivers below are shared with the AVX-512 family, which passes its own segment
 * kernels (lm_seg_kernels); here they are inlined with the AVX2 ones. */
LM_AVX2 static LM_INLINE void lm_gemv_f32_rows(const lm_seg_kernels *sk, const lm_mm_job *j,
                                               int64_t r0, int64_t r1) {
  const lm_weight *w = j->w;
  if (!w->bits) {
    for (int64_t r = r0; r < r1; r++)
      for (int64_t t = 0; t < j->m; t++)
        lm_mm_put(j->y + t * j->ldy + r,
                  sk->f32_dense(w, lm_weight_row_ptr(w, j->e, r), j->x + t * j->ldx, j->k), j->acc);
    return;
  }
  float sf[LM_SEG / 32], bf[LM_SEG / 32], ys[LM_MM_GEMV_MAX_M];
  uint8_t qbuf[LM_SEG];
  int64_t rb = lm_weight_row_bytes(w), sb = j->ng * (int64_t)lm_dtype_size(w->sdtype);
  const uint8_t *row = lm_weight_row_ptr(w, j->e, r0), *sp = lm_weight_scale_ptr(w, j->e, r0),
                *bp = lm_weight_bias_ptr(w, j->e, r0);
  for (int64_t r = r0; r < r1; r++, row += rb, sp += sb, bp += sb) {
    lm_prefetch_ahead(row, rb, (r1 - r) * rb, sp, sb);
    for (int64_t t = 0; t < j->m; t++)
      ys[t] = 0.0f;
    for (int64_t c0 = 0; c0 < j->k; c0 += LM_SEG) {
      int64_t n = j->k - c0 < LM_SEG ? j->k - c0 : LM_SEG, g0 = c0 / w->group, ngs = n / w->group;
      lm_load_sb(w, sp, bp, g0, ngs, sf, bf);
      const uint8_t *q = row + c0 * w->bits / 8;
      if (w->bits != 4 && w->bits != 8) {
        lm_mm_unpack_codes(row, w->bits, c0, n, qbuf);
        q = qbuf;
      }
      for (int64_t t = 0; t < j->m; t++)
        ys[t] += sk->f32_quant(w, q, j->x + t * j->ldx + c0, sf, n) +
                 lm_dot_sb(bf, j->gsum + t * j->ng + g0, ngs);
    }
    for (int64_t t = 0; t < j->m; t++)
      lm_mm_put(j->y + t * j->ldy + r, ys[t], j->acc);
  }
}

/* ---- dequantization to f32 (the sgemm tiles) ---------------------------------------------- */

/* s·q + b as a multiply then an add, so the tile is bit-identical to lm_weight_dequant_row. */
LM_AVX2 static inline void lm_affine8(float *out, __m256 q, __m256 s, __m256 b) {
  _mm256_storeu_ps(out, _mm256_add_ps(_mm256_mul_ps(q, s), b));
}

LM_AVX2 static void lm_dequant_row_avx2(const lm_weight *w, int64_t e, int64_t r, float *out,
                                        uint8_t *qbuf) {
  const uint8_t *row = lm_weight_row_ptr(w, e, r);
  if (!w->bits) {
    int64_t c = 0;
    if (w->dtype == LM_DT_BF16)
      for (; c + 8 <= w->cols; c += 8)
        _mm256_storeu_ps(out + c, lm_bf16x8(row + 2 * c));
    else if (w->dtype == LM_DT_F16)
      for (; c + 8 <= w->cols; c += 8)
        _mm256_storeu_ps(out + c, LM_LD_F16(row + 2 * c));
    for (; c < w->cols; c++)
      out[c] = lm_load_f32(row, w->dtype, c);
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
    __m256 s = _mm256_set1_ps(lm_load_f32(sp, w->sdtype, g)),
           b = _mm256_set1_ps(lm_load_f32(bp, w->sdtype, g));
    for (int64_t c = g * w->group; c < (g + 1) * w->group; c += 8)
      lm_affine8(out + c, lm_u8x8_to_f32(q + c), s, b);
  }
}

LM_AVX2 void lm_mm_avx2_dequant_rows(const lm_weight *w, int64_t e, int64_t r0, int64_t n,
                                     float *out, int64_t ldo) {
  /* codes of one row as bytes; rows wider than the buffer fall back to the reference */
  uint8_t qbuf[16384];
  for (int64_t i = 0; i < n; i++) {
    if (w->bits && w->bits != 8 && w->cols > (int64_t)sizeof qbuf)
      lm_weight_dequant_row(w, e, r0 + i, out + i * ldo);
    else
      lm_dequant_row_avx2(w, e, r0 + i, out + i * ldo, qbuf);
  }
}

LM_AVX2 void lm_mm_avx2_unpack_codes(const lm_weight *w, const uint8_t *row, int64_t c0, int64_t n,
                                     uint8_t *out) {
  if (w->bits == 8) {
    memcpy(out, row + c0, (size_t)n);
  } else if (w->bits == 4) {
    for (int64_t c = 0; c < n; c += 32) {
      __m128i v0, v1;
      lm_q4_unpack32(row + (c0 + c) / 2, &v0, &v1);
      _mm_storeu_si128((__m128i *)(void *)(out + c), v0);
      _mm_storeu_si128((__m128i *)(void *)(out + c + 16), v1);
    }
  } else {
    lm_mm_unpack_codes(row, w->bits, c0, n, out);
  }
}

/* 8 rows × 8 quads (32 bytes of each row) transposed as 32-bit elements: the classic
 * unpack/permute network; output vector q holds quad q of the 8 rows. */
LM_AVX2 static LM_INLINE void lm_transpose8x8_epi32(const uint8_t *src, int64_t ld, uint8_t *dst,
                                                    int64_t dst_stride) {
  __m256i r[8], t[8], u[8];
  _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) r[i] =
      _mm256_loadu_si256((const __m256i *)(const void *)(src + i * ld));
  _Pragma("GCC unroll 8") for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);
  }
  _Pragma("GCC unroll 8") for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);
    u[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);
    u[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);
    u[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  _Pragma("GCC unroll 8") for (int i = 0; i < 4; i++) {
    _mm256_storeu_si256((__m256i *)(void *)(dst + i * dst_stride),
                        _mm256_permute2x128_si256(u[i], u[i + 4], 0x20));
    _mm256_storeu_si256((__m256i *)(void *)(dst + (i + 4) * dst_stride),
                        _mm256_permute2x128_si256(u[i], u[i + 4], 0x31));
  }
}

LM_AVX2 void lm_mm_avx2_interleave(const uint8_t *rows, int64_t ldr, int nr, int64_t nq,
                                   uint8_t *dst) {
  for (int64_t q = 0; q < nq; q += 8)
    for (int r = 0; r < nr; r += 8)
      lm_transpose8x8_epi32(rows + r * ldr + 4 * q, ldr, dst + q * nr * 4 + r * 4, (int64_t)nr * 4);
}

/* ---- FAST: activation quantization ----------------------------------------------------- */

LM_AVX2 static inline float lm_hmax8(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

LM_AVX2 static inline int32_t lm_hsum8_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

/* 32 values → [16 evens | 16 odds] (the perm layout of one block). */
LM_AVX2 static inline __m256i lm_split_even_odd(__m256i v) {
  const __m256i sh = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4,
                                      6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  return _mm256_permute4x64_epi64(_mm256_shuffle_epi8(v, sh), _MM_SHUFFLE(3, 1, 2, 0));
}

/* Rewrites a natural-order row of k int8 values into the perm-P layout (P = 64 or 128), in
 * place: each chunk of P holds its evens, then its odds; a final chunk of 64 or 32 likewise. */
LM_AVX2 static void lm_perm_row(int8_t *q, int64_t k, int perm) {
  int64_t c = 0;
  if (perm == 128)
    for (; c + 128 <= k; c += 128) {
      __m256i v[4];
      for (int i = 0; i < 4; i++)
        v[i] =
            lm_split_even_odd(_mm256_loadu_si256((const __m256i *)(const void *)(q + c + 32 * i)));
      _mm256_storeu_si256((__m256i *)(void *)(q + c), _mm256_permute2x128_si256(v[0], v[1], 0x20));
      _mm256_storeu_si256((__m256i *)(void *)(q + c + 32),
                          _mm256_permute2x128_si256(v[2], v[3], 0x20));
      _mm256_storeu_si256((__m256i *)(void *)(q + c + 64),
                          _mm256_permute2x128_si256(v[0], v[1], 0x31));
      _mm256_storeu_si256((__m256i *)(void *)(q + c + 96),
                          _mm256_permute2x128_si256(v[2], v[3], 0x31));
    }
  for (; c + 64 <= k; c += 64) {
    __m256i a = lm_split_even_odd(_mm256_loadu_si256((const __m256i *)(const void *)(q + c)));
    __m256i b = lm_split_even_odd(_mm256_loadu_si256((const __m256i *)(const void *)(q + c + 32)));
    _mm256_storeu_si256((__m256i *)(void *)(q + c), _mm256_permute2x128_si256(a, b, 0x20));
    _mm256_storeu_si256((__m256i *)(void *)(q + c + 32), _mm256_permute2x128_si256(a, b, 0x31));
  }
  if (c < k)
    _mm256_storeu_si256((__m256i *)(void *)(q + c), lm_split_even_odd(_mm256_loadu_si256(
                                                        (const __m256i *)(const void *)(q + c))));
}

/* Same values as lm_mm_quantize_rows (cvtps2dq rounds to nearest even like its f32 trick);
 * only the f32 sums may differ in their last bits (another summation order). */
LM_AVX2 void lm_mm_avx2_quantize(const lm_mm_job *j, lm_qact *qa, int64_t t0, int64_t t1) {
  const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  int64_t bpg = j->w->group / LM_QA_BLOCK;
  int sh = lm_gshift(j->w->group);
  for (int64_t t = t0; t < t1; t++) {
    const float *x = j->x + t * j->ldx;
    int8_t *q = qa->q + t * qa->ldq;
    float *d = qa->d + t * j->nb, *sx = qa->sx + t * j->ng, *c8 = qa->c8 + t * j->ng;
    for (int64_t b = 0; b < j->nb; b++) {
      const float *xb = x + b * LM_QA_BLOCK;
      __m256 v0 = _mm256_loadu_ps(xb), v1 = _mm256_loadu_ps(xb + 8), v2 = _mm256_loadu_ps(xb + 16),
             v3 = _mm256_loadu_ps(xb + 24);
      __m256 mx = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v0, absm), _mm256_and_ps(v1, absm)),
                                _mm256_max_ps(_mm256_and_ps(v2, absm), _mm256_and_ps(v3, absm)));
      float amax = lm_hmax8(mx),
            sum = lm_hsum8(_mm256_add_ps(_mm256_add_ps(v0, v1), _mm256_add_ps(v2, v3)));
      __m256 id = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
      __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v0, id)),
              i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v1, id));
      __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v2, id)),
              i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v3, id));
      int32_t qsum =
          lm_hsum8_epi32(_mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3)));
      __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
      _mm256_storeu_si256((__m256i *)(void *)(q + b * LM_QA_BLOCK),
                          _mm256_permutevar8x32_epi32(p, order));
      d[b] = amax / 127.0f;
      if (qa->dexp) _mm_storeu_ps(qa->dexp + (t * j->nb + b) * 4, _mm_set1_ps(d[b]));
      int64_t g = b >> sh;
      if (!(b & (bpg - 1))) sx[g] = c8[g] = 0.0f;
      sx[g] += sum;
      c8[g] += 128.0f * d[b] * (float)qsum;
    }
    if (qa->perm) lm_perm_row(q, j->k, qa->perm);
  }
}

/* ---- FAST gemv, 4-bit codes ---------------------------------------------------------------- */

/* Rows go in blocks of four, a chunk of 64 columns at a time: one 32-byte load of each row's
 * codes, whose low nibbles meet the chunk's 32 even activations and high nibbles its 32 odd
 * ones (the perm-64 layout), so the two activation vectors are loaded once for four rows. A
 * row's two vpmaddubsw products stay in s16 (each lane the sum of 4 products, |.| <= 4·15·127)
 * and a tree of vpmaddwd and packs (lm_q4_sum4) folds the four rows into each block's exact sum
 * of 32 products in s32:
 *   lanes [r0 r1 r2 r3 | r0 r1 r2 r3] = the four rows' sums of the chunk's block 0 | block 1.
 * One conversion and one FMA with the lanes' d_b·s_g then scale a chunk of four rows (the chunk
 * at a time per row took four of each), and a block needs no horizontal sum per row: its four
 * results leave as one vector. The group scales are transposed once per block (lm_q4_scales4),
 * so a chunk's lanes get theirs with one load. */

#define LM_Q4_BURST 8192 /* at most this many bytes of a range's first block prefetched at once */

/* The s16 pair sums of one row's chunk: lanes 0-7 block 0, lanes 8-15 block 1. */
LM_AVX2 static LM_INLINE __m256i lm_q4_pairs(const uint8_t *p, __m256i xe, __m256i xo) {
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)p);
  __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
  return _mm256_add_epi16(_mm256_maddubs_epi16(lo, xe), _mm256_maddubs_epi16(hi, xo));
}

/* Each block's s32 sum of four rows' pair sums, lanes [r0 r1 r2 r3 | r0 r1 r2 r3]: vpmaddwd
 * to s32 (8 products a lane, |.| <= 15240), then twice a pack of two vectors back to s16 (no
 * saturation: 16 products a lane at most 30480) and a vpmaddwd of adjacent lanes. vphaddw would
 * do the same in three instructions, but takes two cycles of its pipe each on this core family. */
LM_AVX2 static LM_INLINE __m256i lm_q4_sum4(__m256i p0, __m256i p1, __m256i p2, __m256i p3) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i m0 = _mm256_madd_epi16(p0, ones), m1 = _mm256_madd_epi16(p1, ones),
          m2 = _mm256_madd_epi16(p2, ones), m3 = _mm256_madd_epi16(p3, ones);
  __m256i n01 = _mm256_madd_epi16(_mm256_packs_epi32(m0, m1), ones),
          n23 = _mm256_madd_epi16(_mm256_packs_epi32(m2, m3), ones);
  return _mm256_madd_epi16(_mm256_packs_epi32(n01, n23), ones);
}

/* The same for a final block of 32 columns (perm layout [16 evens | 16 odds]): 8 lanes. */
LM_AVX2 static LM_INLINE __m128i lm_q4_pairs32(const uint8_t *p, __m128i xe, __m128i xo) {
  const __m128i m4 = _mm_set1_epi8(0x0f);
  __m128i v = _mm_loadu_si128((const __m128i *)(const void *)p);
  __m128i lo = _mm_and_si128(v, m4), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m4);
  return _mm_add_epi16(_mm_maddubs_epi16(lo, xe), _mm_maddubs_epi16(hi, xo));
}

/* 8 scales (or biases) of a row from group g, as f32. */
LM_AVX2 static LM_INLINE __m256 lm_q4_sb8(const uint8_t *p, lm_dtype t, int64_t g) {
  if (t == LM_DT_BF16) return lm_bf16x8(p + 2 * g);
  if (t == LM_DT_F16) return LM_LD_F16(p + 2 * g);
  return _mm256_loadu_ps((const float *)(const void *)p + g);
}

/* One scale (or bias) of a row as f32. */
LM_AVX2 static LM_INLINE float lm_q4_sb1(const uint8_t *p, lm_dtype t, int64_t g) {
  if (t == LM_DT_F32) {
    float f;
    memcpy(&f, p + 4 * g, 4);
    return f;
  }
  uint16_t h;
  memcpy(&h, p + 2 * g, 2);
  if (t == LM_DT_F16) return _cvtsh_ss(h);
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* The scales of groups [g0, g0+n) of a block's four rows (row i at sp + so[i]) transposed into
 * st[g][4], the order the chunk loop multiplies them in. */
LM_AVX2 static LM_INLINE void lm_q4_scales4(const uint8_t *sp, const int64_t *so, lm_dtype t,
                                            int64_t g0, int64_t n, float *st) {
  int64_t g = 0;
  for (; g + 8 <= n; g += 8) {
    __m256 a0 = lm_q4_sb8(sp + so[0], t, g0 + g), a1 = lm_q4_sb8(sp + so[1], t, g0 + g);
    __m256 a2 = lm_q4_sb8(sp + so[2], t, g0 + g), a3 = lm_q4_sb8(sp + so[3], t, g0 + g);
    __m256 t0 = _mm256_unpacklo_ps(a0, a1), t1 = _mm256_unpackhi_ps(a0, a1);
    __m256 t2 = _mm256_unpacklo_ps(a2, a3), t3 = _mm256_unpackhi_ps(a2, a3);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee);
    __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee);
    /* u0 holds groups 0 | 4, u1 1 | 5, u2 2 | 6, u3 3 | 7 */
    _mm256_storeu_ps(st + 4 * g, _mm256_permute2f128_ps(u0, u1, 0x20));
    _mm256_storeu_ps(st + 4 * g + 8, _mm256_permute2f128_ps(u2, u3, 0x20));
    _mm256_storeu_ps(st + 4 * g + 16, _mm256_permute2f128_ps(u0, u1, 0x31));
    _mm256_storeu_ps(st + 4 * g + 24, _mm256_permute2f128_ps(u2, u3, 0x31));
  }
  for (; g < n; g++)
    for (int i = 0; i < 4; i++)
      st[4 * g + i] = lm_q4_sb1(sp + so[i], t, g0 + g);
}

/* Σ_g bias_g·Σx_g of the block's four rows (row i at bp + so[i]) as four lanes. */
LM_AVX2 static LM_INLINE __m128 lm_q4_bias4(const uint8_t *bp, const int64_t *so, lm_dtype t,
                                            const float *sx, int64_t ng) {
  __m256 v[4];
  float tail[4];
  for (int i = 0; i < 4; i++) {
    __m256 acc = _mm256_setzero_ps();
    int64_t g = 0;
    for (; g + 8 <= ng; g += 8)
      acc = _mm256_fmadd_ps(lm_q4_sb8(bp + so[i], t, g), _mm256_loadu_ps(sx + g), acc);
    float s = 0.0f;
    for (; g < ng; g++)
      s += lm_q4_sb1(bp + so[i], t, g) * sx[g];
    v[i] = acc;
    tail[i] = s;
  }
  __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
  return _mm_add_ps(_mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)),
                    _mm_loadu_ps(tail));
}

/* Σ_{b in [c0, c0+n)} d_b·s_g(b)·(q·xq)_b of the block's four rows (row i at row + ro[i]) for one
 * token: chunks of 64 columns, then a final block of 32. st: the segment's scales (lm_q4_scales4),
 * dexp: the token's d_b, four times each, from block c0/32. A chunk reads two lines of the block
 * and prefetches the two at pfp + 2·c (the block's bytes in the order they are read, elsewhere). */
LM_AVX2 static LM_INLINE __m128 lm_q4_seg4(const uint8_t *row, const int64_t *ro, const int8_t *xq,
                                           const float *dexp, const float *st, int64_t n, int gsh,
                                           const uint8_t *pfp) {
  __m256 acc = _mm256_setzero_ps();
  int64_t c = 0;
  for (; c + 64 <= n; c += 64) {
    const uint8_t *p = row + c / 2;
    _mm_prefetch((const char *)(pfp + 2 * c), _MM_HINT_T0);
    _mm_prefetch((const char *)(pfp + 2 * c + 64), _MM_HINT_T0);
    __m256i xe = _mm256_loadu_si256((const __m256i *)(const void *)(xq + c)),
            xo = _mm256_loadu_si256((const __m256i *)(const void *)(xq + c + 32));
    __m256 f = _mm256_cvtepi32_ps(
        lm_q4_sum4(lm_q4_pairs(p + ro[0], xe, xo), lm_q4_pairs(p + ro[1], xe, xo),
                   lm_q4_pairs(p + ro[2], xe, xo), lm_q4_pairs(p + ro[3], xe, xo)));
    /* the lanes' group scales: the two blocks' groups (32), one group (64), half a group (128) */
    __m256 s = gsh == 5   ? _mm256_loadu_ps(st + 4 * (c >> 5))
               : gsh == 6 ? _mm256_broadcast_ps((const __m128 *)(const void *)(st + 4 * (c >> 6)))
                          : _mm256_broadcast_ps((const __m128 *)(const void *)(st + 4 * (c >> 7)));
    acc = _mm256_fmadd_ps(f, _mm256_mul_ps(_mm256_loadu_ps(dexp + c / 8), s), acc);
  }
  __m128 r = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  if (c < n) {
    const uint8_t *p = row + c / 2;
    __m128i xe = _mm_loadu_si128((const __m128i *)(const void *)(xq + c)),
            xo = _mm_loadu_si128((const __m128i *)(const void *)(xq + c + 16));
    __m128i h01 =
        _mm_hadd_epi16(lm_q4_pairs32(p + ro[0], xe, xo), lm_q4_pairs32(p + ro[1], xe, xo));
    __m128i h23 =
        _mm_hadd_epi16(lm_q4_pairs32(p + ro[2], xe, xo), lm_q4_pairs32(p + ro[3], xe, xo));
    __m128 f = _mm_cvtepi32_ps(_mm_madd_epi16(_mm_hadd_epi16(h01, h23), _mm_set1_epi16(1)));
    r = _mm_fmadd_ps(f, _mm_mul_ps(_mm_loadu_ps(dexp + c / 8), _mm_loadu_ps(st + 4 * (c >> gsh))),
                     r);
  }
  return r;
}

/* Rows [r0, r1) of the 4-bit FAST product for every token, for a scale type and group size the
 * compiler knows (LM_Q4_ROWS below): Σ_g s_g·Σ_{b in g} d_b·(q·xq)_b + Σ_g bias_g·Σx_g. A final
 * block of fewer than four rows repeats its last row in the spare lanes and stores only its own.
 * Each chunk prefetches the next block's lines at the same place (a block's chunks read as many
 * bytes as the block holds), while that block is inside the rows being read; past them it
 * touches its own lines again, so the loop has no branch for it. */
LM_AVX2 static LM_INLINE void lm_q4_rows(const lm_mm_job *j, int64_t r0, int64_t r1, lm_dtype sdt,
                                         int gsh) {
  const lm_weight *w = j->w;
  const lm_qact *qa = j->qa;
  int64_t k = j->k, rb = lm_weight_row_bytes(w), sb = j->ng * (int64_t)lm_dtype_size(sdt);
  const uint8_t *row = lm_weight_row_ptr(w, j->e, r0), *sp = lm_weight_scale_ptr(w, j->e, r0),
                *bp = lm_weight_bias_ptr(w, j->e, r0), *end = row + (r1 - r0) * rb;
  float st[LM_SEG / 32 * 4];
  __m128 ys[LM_MM_GEMV_MAX_M];
  /* the first block's lines at once: the loop's prefetches only run ahead of it */
  for (const uint8_t *p = row; p < row + 4 * rb && p < end && p < row + LM_Q4_BURST; p += 64)
    _mm_prefetch((const char *)p, _MM_HINT_T0);
  for (int64_t r = r0; r < r1; r += 4, row += 4 * rb, sp += 4 * sb, bp += 4 * sb) {
    int nv = r1 - r < 4 ? (int)(r1 - r) : 4;
    int64_t ro[4], so[4];
    for (int i = 0; i < 4; i++) {
      ro[i] = (i < nv ? i : nv - 1) * rb;
      so[i] = (i < nv ? i : nv - 1) * sb;
    }
    int64_t pf = row + 8 * rb <= end ? 4 * rb : 0;
    if (pf)
      for (int64_t o = 0; o < 4 * sb; o += 64) {
        _mm_prefetch((const char *)(sp + 4 * sb + o), _MM_HINT_T0);
        _mm_prefetch((const char *)(bp + 4 * sb + o), _MM_HINT_T0);
      }
    for (int64_t t = 0; t < j->m; t++)
      ys[t] = lm_q4_bias4(bp, so, sdt, qa->sx + t * j->ng, j->ng);
    for (int64_t c0 = 0; c0 < k; c0 += LM_SEG) {
      int64_t n = k - c0 < LM_SEG ? k - c0 : LM_SEG;
      lm_q4_scales4(sp, so, sdt, c0 >> gsh, n >> gsh, st);
      for (int64_t t = 0; t < j->m; t++)
        ys[t] = _mm_add_ps(ys[t], lm_q4_seg4(row + c0 / 2, ro, qa->q + t * qa->ldq + c0,
                                             qa->dexp + (t * j->nb + c0 / 32) * 4, st, n, gsh,
                                             row + pf + 2 * c0));
    }
    for (int64_t t = 0; t < j->m; t++) {
      float *y = j->y + t * j->ldy + r;
      if (nv == 4 && !j->acc) {
        _mm_storeu_ps(y, ys[t]);
      } else {
        float v[4];
        _mm_storeu_ps(v, ys[t]);
        for (int i = 0; i < nv; i++)
          lm_mm_put(y + i, v[i], j->acc);
      }
    }
  }
}

#define LM_Q4_ROWS(NAME, SDT, GSH)                                                                 \
  LM_AVX2 static void NAME(const lm_mm_job *j, int64_t r0, int64_t r1) {                           \
    lm_q4_rows(j, r0, r1, SDT, GSH);                                                               \
  }
LM_Q4_ROWS(lm_q4_rows_bf16_g32, LM_DT_BF16, 5)
LM_Q4_ROWS(lm_q4_rows_bf16_g64, LM_DT_BF16, 6)
LM_Q4_ROWS(lm_q4_rows_bf16_g128, LM_DT_BF16, 7)
LM_Q4_ROWS(lm_q4_rows_f16_g32, LM_DT_F16, 5)
LM_Q4_ROWS(lm_q4_rows_f16_g64, LM_DT_F16, 6)
LM_Q4_ROWS(lm_q4_rows_f16_g128, LM_DT_F16, 7)
LM_Q4_ROWS(lm_q4_rows_f32_g32, LM_DT_F32, 5)
LM_Q4_ROWS(lm_q4_rows_f32_g64, LM_DT_F32, 6)
LM_Q4_ROWS(lm_q4_rows_f32_g128, LM_DT_F32, 7)

typedef void (*lm_q4_rows_fn)(const lm_mm_job *j, int64_t r0, int64_t r1);
static const lm_q4_rows_fn lm_q4_rows_tab[3][3] = {
    {lm_q4_rows_bf16_g32, lm_q4_rows_bf16_g64, lm_q4_rows_bf16_g128},
    {lm_q4_rows_f16_g32, lm_q4_rows_f16_g64, lm_q4_rows_f16_g128},
    {lm_q4_rows_f32_g32, lm_q4_rows_f32_g64, lm_q4_rows_f32_g128}};

/* ---- FAST gemv, other widths ---------------------------------------------------------- */

/* Σ q·xq over one block of 32 byte codes as 8 s32 lanes in f32; 8-bit codes use the signed
 * trick, narrower ones go straight into vpmaddubsw. */
LM_AVX2 static inline __m256 lm_u8_block(const uint8_t *q, const int8_t *xq, int signed8) {
  const __m256i ones = _mm256_set1_epi16(1), flip = _mm256_set1_epi8((char)0x80);
  __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)q);
  __m256i x = _mm256_loadu_si256((const __m256i *)(const void *)xq), p;
  if (signed8) {
    __m256i ws = _mm256_xor_si256(v, flip);
    p = _mm256_maddubs_epi16(_mm256_abs_epi8(ws), _mm256_sign_epi8(x, ws));
  } else {
    p = _mm256_maddubs_epi16(v, x);
  }
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones));
}

/* Σ over one segment of byte codes (natural layout); nb blocks of 32, two FMA chains. */
LM_AVX2 static LM_INLINE float lm_u8_seg_fast(const uint8_t *q, const int8_t *xq, const float *d,
                                              const float *sf, int group, int64_t n, int signed8) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
  int sh = lm_gshift(group);
  int64_t nb = n / 32, b = 0;
  for (; b + 2 <= nb; b += 2) {
    acc0 = _mm256_fmadd_ps(
        lm_u8_block(q + 32 * b, xq + 32 * b, signed8),
        _mm256_mul_ps(_mm256_broadcast_ss(sf + (b >> sh)), _mm256_broadcast_ss(d + b)), acc0);
    acc1 = _mm256_fmadd_ps(
        lm_u8_block(q + 32 * b + 32, xq + 32 * b + 32, signed8),
        _mm256_mul_ps(_mm256_broadcast_ss(sf + ((b + 1) >> sh)), _mm256_broadcast_ss(d + b + 1)),
        acc1);
  }
  if (b < nb)
    acc0 = _mm256_fmadd_ps(
        lm_u8_block(q + 32 * b, xq + 32 * b, signed8),
        _mm256_mul_ps(_mm256_broadcast_ss(sf + (b >> sh)), _mm256_broadcast_ss(d + b)), acc0);
  return lm_hsum8(_mm256_add_ps(acc0, acc1));
}

/* One row of the FAST product for every token, columns [c0, c0+n) (n <= LM_SEG); codes of
 * widths other than 4 (lm_q4_rows) and 8 unpacked to bytes. */
LM_AVX2 static LM_INLINE void lm_fast_row_seg(const lm_seg_kernels *sk, const lm_mm_job *j,
                                              const uint8_t *row, const uint8_t *sp,
                                              const uint8_t *bp, int64_t c0, int64_t n, float *ys,
                                              uint8_t *qbuf) {
  const lm_weight *w = j->w;
  const lm_qact *qa = j->qa;
  float sf[LM_SEG / 32], bf[LM_SEG / 32];
  int64_t g0 = c0 / w->group, ngs = n / w->group;
  int signed8 = w->bits == 8 && sk->signed8;
  lm_load_sb(w, sp, bp, g0, ngs, sf, bf);
  const uint8_t *q = row + c0 * w->bits / 8;
  if (w->bits != 8) {
    lm_mm_unpack_codes(row, w->bits, c0, n, qbuf);
    q = qbuf;
  }
  for (int64_t t = 0; t < j->m; t++) {
    const int8_t *xq = qa->q + t * qa->ldq + c0;
    float v = sk->fast_u8(q, xq, qa->d + t * j->nb + c0 / 32, sf, w->group, n, signed8);
    v += lm_dot_sb(bf, qa->sx + t * j->ng + g0, ngs);
    if (signed8) v += lm_dot_sb(sf, qa->c8 + t * j->ng + g0, ngs);
    ys[t] += v;
  }
}

LM_AVX2 static LM_INLINE void lm_gemv_fast_rows(const lm_seg_kernels *sk, const lm_mm_job *j,
                                                int64_t r0, int64_t r1) {
  const lm_weight *w = j->w;
  uint8_t qbuf[LM_SEG];
  float ys[LM_MM_GEMV_MAX_M];
  /* row pointers by stride: no per-row calls */
  int64_t rb = lm_weight_row_bytes(w), sb = j->ng * (int64_t)lm_dtype_size(w->sdtype);
  const uint8_t *row = lm_weight_row_ptr(w, j->e, r0), *sp = lm_weight_scale_ptr(w, j->e, r0),
                *bp = lm_weight_bias_ptr(w, j->e, r0);
  for (int64_t r = r0; r < r1; r++, row += rb, sp += sb, bp += sb) {
    lm_prefetch_ahead(row, rb, (r1 - r) * rb, sp, sb);
    for (int64_t t = 0; t < j->m; t++)
      ys[t] = 0.0f;
    if (j->k <= LM_SEG)
      lm_fast_row_seg(sk, j, row, sp, bp, 0, j->k, ys, qbuf);
    else
      for (int64_t c0 = 0; c0 < j->k; c0 += LM_SEG)
        lm_fast_row_seg(sk, j, row, sp, bp, c0, j->k - c0 < LM_SEG ? j->k - c0 : LM_SEG, ys, qbuf);
    for (int64_t t = 0; t < j->m; t++)
      lm_mm_put(j->y + t * j->ldy + r, ys[t], j->acc);
  }
}

static const lm_seg_kernels lm_seg_avx2 = {.f32_quant = lm_seg_quant_f32,
                                           .f32_dense = lm_dot_dense_avx2,
                                           .fast_u8 = lm_u8_seg_fast,
                                           .signed8 = 1};

LM_AVX2 static void lm_gemv_f32_avx2(const lm_mm_job *j, int64_t r0, int64_t r1) {
  lm_gemv_f32_rows(&lm_seg_avx2, j, r0, r1);
}

LM_AVX2 void lm_mm_avx2_gemv_fast(const lm_mm_job *j, int64_t r0, int64_t r1) {
  const lm_weight *w = j->w;
  if (w->bits == 4 && j->qa->perm == 64) {
    int si = w->sdtype == LM_DT_BF16 ? 0 : w->sdtype == LM_DT_F16 ? 1 : 2;
    lm_q4_rows_tab[si][lm_gshift(w->group)](j, r0, r1);
    return;
  }
  lm_gemv_fast_rows(&lm_seg_avx2, j, r0, r1);
}

LM_AVX2 void lm_mm_avx2_gemv_f32_with(const lm_seg_kernels *sk, const lm_mm_job *j, int64_t r0,
                                      int64_t r1) {
  lm_gemv_f32_rows(sk, j, r0, r1);
}

/* ---- FAST GEMM: 4 tokens × 16 rows ------------------------------------------------------ */

/* Width classes of the codes: how often the s16 partial sums must be widened to s32.
 * ≤4 bits: 8 vpmaddubsw steps stay below 2^15 (8·2·15·127); 5–6 bits: 2 steps; 8 bits
 * (signed trick): 1 step. */
enum { LM_W4 = 0, LM_W6 = 1, LM_W8 = 2 };

/* Keeps v in a register as is: stops GCC from reassociating a chain of integer adds into a
 * tree, which would hold every product live at once and spill the accumulators. */
#define LM_KEEP(v) __asm__("" : "+x"(v))

LM_AVX2 static inline __m256i lm_bcast4(const int8_t *p) {
  int32_t v;
  memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

/* s32 sums of one block (32 columns) for 4 tokens × 16 rows: a[t][h] holds rows 8h..8h+7.
 * A tile step is 64 bytes: 16 rows × 4 codes. */
__attribute__((always_inline)) LM_AVX2 static inline void
lm_gemm_block(const uint8_t *wp, const int8_t *const *xq, int64_t kb, int cls, __m256i a[4][2]) {
  const __m256i ones = _mm256_set1_epi16(1);
  _Pragma("GCC unroll 4") for (int t = 0; t < 4; t++) a[t][0] = a[t][1] = _mm256_setzero_si256();
  if (cls == LM_W4) {
    _Pragma("GCC unroll 8") for (int s = 0; s < 8; s++) {
      __m256i w0 = _mm256_loadu_si256((const __m256i *)(const void *)(wp + s * 64));
      __m256i w1 = _mm256_loadu_si256((const __m256i *)(const void *)(wp + s * 64 + 32));
      _Pragma("GCC unroll 4") for (int t = 0; t < 4; t++) {
        __m256i xb = lm_bcast4(xq[t] + kb + 4 * s);
        a[t][0] = _mm256_add_epi16(a[t][0], _mm256_maddubs_epi16(w0, xb));
        a[t][1] = _mm256_add_epi16(a[t][1], _mm256_maddubs_epi16(w1, xb));
        LM_KEEP(a[t][0]);
        LM_KEEP(a[t][1]);
      }
    }
    _Pragma("GCC unroll 4") for (int t = 0; t < 4; t++) {
      a[t][0] = _mm256_madd_epi16(a[t][0], ones);
      a[t][1] = _mm256_madd_epi16(a[t][1], ones);
    }
    return;
  }
  _Pragma("GCC unroll 8") for (int s = 0; s < 8; s++) {
    _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
      __m256i wv = _mm256_loadu_si256((const __m256i *)(const void *)(wp + s * 64 + h * 32));
      __m256i wa = cls == LM_W8 ? _mm256_abs_epi8(wv) : wv;
      _Pragma("GCC unroll 4") for (int t = 0; t < 4; t++) {
        __m256i xb = lm_bcast4(xq[t] + kb + 4 * s);
        if (cls == LM_W8) xb = _mm256_sign_epi8(xb, wv);
        a[t][h] = _mm256_add_epi32(a[t][h], _mm256_madd_epi16(_mm256_maddubs_epi16(wa, xb), ones));
        LM_KEEP(a[t][h]);
      }
    }
  }
}

__attribute__((always_inline)) LM_AVX2 static inline void
lm_gemm_avx2_body(const lm_mm_job *j, const lm_qtile *tl, int64_t tile_r0, int nvalid, int64_t tt,
                  int cls) {
  const lm_qact *qa = j->qa;
  int64_t bpg = j->w->group / LM_QA_BLOCK;
  int sh = lm_gshift(j->w->group);
  const int8_t *xq[4];
  const float *d[4], *sx[4], *c8[4];
  _Pragma("GCC unroll 4") for (int t = 0; t < 4; t++) {
    xq[t] = qa->q + (tt + t) * qa->ldq;
    d[t] = qa->d + (tt + t) * j->nb;
    sx[t] = qa->sx + (tt + t) * j->ng;
    c8[t] = qa->c8 + (tt + t) * j->ng;
  }
  __m256 f[4][2];
  _Pragma("GCC unroll 4") for (int t = 0; t < 4; t++) f[t][0] = f[t][1] = _mm256_setzero_ps();
  const uint8_t *wp = tl->codes;
  for (int64_t b = 0; b < j->nb; b++, wp += 16 * 32) {
    __m256i a[4][2];
    lm_gemm_block(wp, xq, b * LM_QA_BLOCK, cls, a);
    int64_t g = b >> sh;
    __m256 s0 = _mm256_loadu_ps(tl->s + g * 16), s1 = _mm256_loadu_ps(tl->s + g * 16 + 8);
    _Pragma("GCC unroll 4") for (int t = 0; t < 4; t++) {
      __m256 dt = _mm256_broadcast_ss(d[t] + b);
      f[t][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a[t][0]), _mm256_mul_ps(s0, dt), f[t][0]);
      f[t][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a[t][1]), _mm256_mul_ps(s1, dt), f[t][1]);
    }
    if ((b & (bpg - 1)) == bpg - 1) {
      __m256 b0 = _mm256_loadu_ps(tl->b + g * 16), b1 = _mm256_loadu_ps(tl->b + g * 16 + 8);
      _Pragma("GCC unroll 4") for (int t = 0; t < 4; t++) {
        __m256 st = _mm256_broadcast_ss(sx[t] + g);
        f[t][0] = _mm256_fmadd_ps(b0, st, f[t][0]);
        f[t][1] = _mm256_fmadd_ps(b1, st, f[t][1]);
        if (cls == LM_W8) {
          __m256 ct = _mm256_broadcast_ss(c8[t] + g);
          f[t][0] = _mm256_fmadd_ps(s0, ct, f[t][0]);
          f[t][1] = _mm256_fmadd_ps(s1, ct, f[t][1]);
        }
      }
    }
  }
  for (int t = 0; t < 4 && tt + t < j->m; t++) {
    float *y = j->y + (tt + t) * j->ldy + tile_r0;
    if (nvalid == 16) {
      _mm256_storeu_ps(y, j->acc ? _mm256_add_ps(_mm256_loadu_ps(y), f[t][0]) : f[t][0]);
      _mm256_storeu_ps(y + 8, j->acc ? _mm256_add_ps(_mm256_loadu_ps(y + 8), f[t][1]) : f[t][1]);
    } else {
      float tmp[16];
      _mm256_storeu_ps(tmp, f[t][0]);
      _mm256_storeu_ps(tmp + 8, f[t][1]);
      for (int r = 0; r < nvalid; r++)
        lm_mm_put(y + r, tmp[r], j->acc);
    }
  }
}

LM_AVX2 static void lm_gemm_fast_avx2(const lm_mm_job *j, const lm_qtile *tl, int64_t tile_r0,
                                      int nvalid, int64_t t0, int64_t t1) {
  int bits = j->w->bits;
  for (int64_t tt = t0; tt < t1; tt += 4) {
    if (bits <= 4)
      lm_gemm_avx2_body(j, tl, tile_r0, nvalid, tt, LM_W4);
    else if (bits <= 6)
      lm_gemm_avx2_body(j, tl, tile_r0, nvalid, tt, LM_W6);
    else
      lm_gemm_avx2_body(j, tl, tile_r0, nvalid, tt, LM_W8);
  }
}

const lm_cpu_kernels lm_cpu_kernels_avx2 = {
    .isa = LM_CPU_ISA_AVX2,
    .name = "avx2",
    .q4_perm = 64,
    .gemv_f32 = lm_gemv_f32_avx2,
    .gemv_fast = lm_mm_avx2_gemv_fast,
    .dequant_rows = lm_mm_avx2_dequant_rows,
    .quantize = lm_mm_avx2_quantize,
    .unpack_codes = lm_mm_avx2_unpack_codes,
    .interleave = lm_mm_avx2_interleave,
    .gemm_nr = 16,
    .gemm_mr = 4,
    .gemm_signed8 = 1,
    .gemm_fast = lm_gemm_fast_avx2,
};

#endif
