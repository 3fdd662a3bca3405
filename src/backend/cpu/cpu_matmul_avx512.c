/* cpu_matmul_avx512.c — the AVX-512 (F/BW/VL) + VNNI kernel family, chosen at run time on
 * CPUs that have it (Intel Xeon since Cascade Lake, AMD Zen 4). What differs from AVX2:
 *  - F32 gemv: 16-lane FMAs, bytes widened with one vpmovzxbd per 16 codes;
 *  - GEMM: 4 tokens × 32 rows of vpdpbusd (u8 × s8, four products summed straight into s32:
 *    no s16 saturation, so 8-bit codes need no signed trick) on 512-bit tiles;
 *  - FAST gemv (4-bit): 128 columns per step, both nibble halves into one vpdpbusd
 *    accumulator, each lane's group scale picked by a permute: about 12 instructions per 64
 *    bytes of codes, where the AVX2 kernel spends 14 per 32 and cannot keep up with the memory
 *    of a Sapphire Rapids core (6.5 GB/s a core from L2). Other widths use the AVX2 gemv.
 * Row drivers, dequantization, unpacking and the activation quantizer are the AVX2 ones. */
#if defined(__x86_64__)
#include <immintrin.h>
#include <string.h>

#include "backend/cpu/cpu_matmul_impl.h"

#define LM_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define LM_INLINE __attribute__((always_inline)) inline
/* see cpu_matmul_avx2.c: keeps GCC from reassociating accumulator chains */
#define LM_KEEP(v) __asm__("" : "+v"(v))

/* ---- F32 ------------------------------------------------------------------------------- */

#define LM_DENSE_DOT16(NAME, ESZ, LOAD16)                                                          \
  LM_AVX512 static float NAME(const lm_weight *w, const uint8_t *row, const float *x, int64_t k) { \
    __m512 a0 = _mm512_setzero_ps(), a1 = a0;                                                      \
    int64_t c = 0;                                                                                 \
    for (; c + 32 <= k; c += 32) {                                                                 \
      a0 = _mm512_fmadd_ps(LOAD16(row + c * ESZ), _mm512_loadu_ps(x + c), a0);                     \
      a1 = _mm512_fmadd_ps(LOAD16(row + (c + 16) * ESZ), _mm512_loadu_ps(x + c + 16), a1);         \
    }                                                                                              \
    float s = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));                                         \
    for (; c < k; c++)                                                                             \
      s += lm_load_f32(row, w->dtype, c) * x[c];                                                   \
    return s;                                                                                      \
  }

#define LM_LD16_F32(p) _mm512_loadu_ps((const float *)(const void *)(p))
#define LM_LD16_F16(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(p)))
#define LM_LD16_BF16(p)                                                                            \
  _mm512_castsi512_ps(_mm512_slli_epi32(                                                           \
      _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(p))), 16))
LM_DENSE_DOT16(lm_dot_f32_512, 4, LM_LD16_F32)
LM_DENSE_DOT16(lm_dot_f16_512, 2, LM_LD16_F16)
LM_DENSE_DOT16(lm_dot_bf16_512, 2, LM_LD16_BF16)

LM_AVX512 static float lm_dot_dense_512(const lm_weight *w, const uint8_t *row, const float *x,
                                        int64_t k) {
  switch (w->dtype) {
  case LM_DT_F32: return lm_dot_f32_512(w, row, x, k);
  case LM_DT_F16: return lm_dot_f16_512(w, row, x, k);
  default: return lm_dot_bf16_512(w, row, x, k);
  }
}

LM_AVX512 static inline __m512 lm_u8x16_to_f32(__m128i v) {
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v));
}

/* Σ float(q)·x over one group: 4-bit codes packed, or codes as bytes. */
LM_AVX512 static LM_INLINE __m512 lm_group_dot_f32(const lm_weight *w, const uint8_t *q,
                                                   const float *x) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0;
  if (w->bits == 4) {
    const __m128i m4 = _mm_set1_epi8(0x0f);
    for (int c = 0; c < w->group; c += 32) {
      __m128i v = _mm_loadu_si128((const __m128i *)(const void *)(q + c / 2));
      __m128i lo = _mm_and_si128(v, m4), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m4);
      a0 = _mm512_fmadd_ps(lm_u8x16_to_f32(_mm_unpacklo_epi8(lo, hi)), _mm512_loadu_ps(x + c), a0);
      a1 = _mm512_fmadd_ps(lm_u8x16_to_f32(_mm_unpackhi_epi8(lo, hi)), _mm512_loadu_ps(x + c + 16),
                           a1);
    }
  } else {
    for (int c = 0; c < w->group; c += 32) {
      a0 = _mm512_fmadd_ps(lm_u8x16_to_f32(_mm_loadu_si128((const __m128i *)(const void *)(q + c))),
                           _mm512_loadu_ps(x + c), a0);
      a1 = _mm512_fmadd_ps(
          lm_u8x16_to_f32(_mm_loadu_si128((const __m128i *)(const void *)(q + c + 16))),
          _mm512_loadu_ps(x + c + 16), a1);
    }
  }
  return _mm512_add_ps(a0, a1);
}

LM_AVX512 static float lm_seg_quant_f32_512(const lm_weight *w, const uint8_t *q, const float *x,
                                            const float *sf, int64_t n) {
  int64_t gs = w->group, qstep = w->bits == 4 ? gs / 2 : gs;
  __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0;
  int64_t g = 0;
  for (; g + 2 <= n / gs; g += 2) {
    acc0 = _mm512_fmadd_ps(lm_group_dot_f32(w, q + g * qstep, x + g * gs), _mm512_set1_ps(sf[g]),
                           acc0);
    acc1 = _mm512_fmadd_ps(lm_group_dot_f32(w, q + (g + 1) * qstep, x + (g + 1) * gs),
                           _mm512_set1_ps(sf[g + 1]), acc1);
  }
  if (g < n / gs)
    acc0 = _mm512_fmadd_ps(lm_group_dot_f32(w, q + g * qstep, x + g * gs), _mm512_set1_ps(sf[g]),
                           acc0);
  return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

static const lm_seg_kernels lm_seg_avx512 = {.f32_quant = lm_seg_quant_f32_512,
                                             .f32_dense = lm_dot_dense_512};

static void lm_gemv_f32_avx512(const lm_mm_job *j, int64_t r0, int64_t r1) {
  lm_mm_avx2_gemv_f32_with(&lm_seg_avx512, j, r0, r1);
}

/* ---- FAST gemv: 4-bit codes against perm-128 activations ------------------------------ */

/* Scales (or biases) of groups [g0, g0+n) of a row, n <= 16, as f32 lanes (the rest 0). */
LM_AVX512 static LM_INLINE __m512 lm_sb16(const uint8_t *p, lm_dtype t, int64_t g0, int n) {
  __mmask16 m = (__mmask16)((1u << n) - 1);
  if (t == LM_DT_F32) return _mm512_maskz_loadu_ps(m, (const float *)(const void *)p + g0);
  __m256i h = _mm256_maskz_loadu_epi16(m, p + 2 * g0);
  if (t == LM_DT_F16) return _mm512_cvtph_ps(h);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* Σ q·xq of a chunk of 128 columns as 16 s32 lanes in f32: lane l holds columns 8l..8l+7
 * (block l/4), the low nibbles meeting the chunk's 64 even activations, the high ones the 64
 * odd ones. A row's final 64 or 32 columns are the same step on masked (zeroed) loads. */
LM_AVX512 static LM_INLINE __m512 lm_q4_chunk512(__m512i v, __m512i xe, __m512i xo) {
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  __m512i lo = _mm512_and_si512(v, m4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
  __m512i a = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, xe);
  return _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(a, hi, xo));
}

/* Lane l of chunk j of a run of 16 groups reads the scale of group (128·j + 8·l) / group:
 * the permute indices, one table per group size (32: 4 chunks per run, 64: 8, 128: 16). */
static const int32_t lm_q4_idx32[4][16] = {
    {0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3},
    {4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7},
    {8, 8, 8, 8, 9, 9, 9, 9, 10, 10, 10, 10, 11, 11, 11, 11},
    {12, 12, 12, 12, 13, 13, 13, 13, 14, 14, 14, 14, 15, 15, 15, 15}};
static const int32_t lm_q4_idx64[8][16] = {
    {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1},
    {2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3},
    {4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5},
    {6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7},
    {8, 8, 8, 8, 8, 8, 8, 8, 9, 9, 9, 9, 9, 9, 9, 9},
    {10, 10, 10, 10, 10, 10, 10, 10, 11, 11, 11, 11, 11, 11, 11, 11},
    {12, 12, 12, 12, 12, 12, 12, 12, 13, 13, 13, 13, 13, 13, 13, 13},
    {14, 14, 14, 14, 14, 14, 14, 14, 15, 15, 15, 15, 15, 15, 15, 15}};

#define LM_PF512_BYTES 4096 /* how far ahead of the codes being read to prefetch */

/* One row of the 4-bit FAST product for one token: Σ_g s_g·Σ_{b in g} d_b·(q·xq)_b plus
 * Σ_g bias_g·Σx_g. Groups go 16 at a time (one vector of scales, one of biases); each chunk's
 * lanes pick their group's scale with one permute. Each chunk prefetches the line
 * LM_PF512_BYTES ahead while that stays inside the rows being read (`end`): one core's
 * hardware prefetch alone keeps too few misses in flight. */
LM_AVX512 static LM_INLINE float lm_q4_row512(lm_dtype sdt, const uint8_t *row, const uint8_t *sp,
                                              const uint8_t *bp, const int8_t *xq,
                                              const float *dexp, const float *sx, int64_t k,
                                              int gsh, const uint8_t *end) {
  __m512 acc = _mm512_setzero_ps(), accb = acc;
  int64_t ng = k >> gsh;
  for (int64_t g0 = 0; g0 < ng; g0 += 16) {
    int n = ng - g0 < 16 ? (int)(ng - g0) : 16;
    __m512 s = lm_sb16(sp, sdt, g0, n);
    accb = _mm512_fmadd_ps(lm_sb16(bp, sdt, g0, n),
                           _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1), sx + g0), accb);
    int64_t c0 = g0 << gsh, c1 = (g0 + n) << gsh;
    for (int64_t c = c0, jc = 0; c < c1; c += 128, jc++) {
      __m512i idx = gsh == 6   ? _mm512_loadu_si512((const void *)lm_q4_idx64[jc])
                    : gsh == 5 ? _mm512_loadu_si512((const void *)lm_q4_idx32[jc])
                               : _mm512_set1_epi32((int)jc);
      __m512 sv = _mm512_permutexvar_ps(idx, s), f, dx;
      const uint8_t *pc = row + c / 2;
      if (pc + LM_PF512_BYTES < end) _mm_prefetch((const char *)(pc + LM_PF512_BYTES), _MM_HINT_T0);
      if (c1 - c >= 128) {
        f = lm_q4_chunk512(_mm512_loadu_si512((const void *)pc),
                           _mm512_loadu_si512((const void *)(xq + c)),
                           _mm512_loadu_si512((const void *)(xq + c + 64)));
        dx = _mm512_loadu_ps(dexp + c / 8);
      } else { /* 64 or 32 columns: perm-64 / perm-32 layout, half of them even */
        int64_t h = (c1 - c) / 2;
        __mmask64 m = (__mmask64)((1ull << h) - 1);
        f = lm_q4_chunk512(_mm512_maskz_loadu_epi8(m, pc), _mm512_maskz_loadu_epi8(m, xq + c),
                           _mm512_maskz_loadu_epi8(m, xq + c + h));
        dx = _mm512_maskz_loadu_ps((__mmask16)((1u << (h / 4)) - 1), dexp + c / 8);
      }
      acc = _mm512_fmadd_ps(_mm512_mul_ps(f, dx), sv, acc);
    }
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc, accb));
}

/* Rows [r0, r1) of the 4-bit FAST product, for a scale type and group size the compiler
 * knows (the loops specialize: no per-chunk choice of index table or scale loader). */
LM_AVX512 static LM_INLINE void lm_q4_rows512(const lm_mm_job *j, int64_t r0, int64_t r1,
                                              lm_dtype sdt, int gsh) {
  const lm_weight *w = j->w;
  const lm_qact *qa = j->qa;
  int64_t rb = lm_weight_row_bytes(w), sb = j->ng * (int64_t)lm_dtype_size(sdt);
  const uint8_t *row = lm_weight_row_ptr(w, j->e, r0), *sp = lm_weight_scale_ptr(w, j->e, r0),
                *bp = lm_weight_bias_ptr(w, j->e, r0), *end = row + (r1 - r0) * rb;
  int64_t sahead = sb * (LM_PF512_BYTES / rb + 1);
  /* the lines the loop's prefetches would have fetched had these rows continued a stream */
  for (const uint8_t *p = row; p < row + LM_PF512_BYTES && p < end; p += 64)
    _mm_prefetch((const char *)p, _MM_HINT_T0);
  for (int64_t r = r0; r < r1; r++, row += rb, sp += sb, bp += sb) {
    if (row + LM_PF512_BYTES < end) {
      _mm_prefetch((const char *)(sp + sahead), _MM_HINT_T0);
      _mm_prefetch((const char *)(bp + sahead), _MM_HINT_T0);
    }
    for (int64_t t = 0; t < j->m; t++) {
      float v = lm_q4_row512(sdt, row, sp, bp, qa->q + t * qa->ldq, qa->dexp + t * j->nb * 4,
                             qa->sx + t * j->ng, j->k, gsh, end);
      lm_mm_put(j->y + t * j->ldy + r, v, j->acc);
    }
  }
}

#define LM_Q4_ROWS(NAME, SDT, GSH)                                                                 \
  LM_AVX512 static void NAME(const lm_mm_job *j, int64_t r0, int64_t r1) {                         \
    lm_q4_rows512(j, r0, r1, SDT, GSH);                                                            \
  }
LM_Q4_ROWS(lm_q4_rows_bf16_g32, LM_DT_BF16, 5)
LM_Q4_ROWS(lm_q4_rows_bf16_g64, LM_DT_BF16, 6)
LM_Q4_ROWS(lm_q4_rows_bf16_g128, LM_DT_BF16, 7)

/* FAST product over rows [r0, r1): 4-bit weights here, the rest on the AVX2 row kernels. */
LM_AVX512 static void lm_gemv_fast_avx512(const lm_mm_job *j, int64_t r0, int64_t r1) {
  const lm_weight *w = j->w;
  if (w->bits != 4) {
    lm_mm_avx2_gemv_fast(j, r0, r1);
    return;
  }
  int gsh = w->group == 32 ? 5 : w->group == 64 ? 6 : 7;
  if (w->sdtype != LM_DT_BF16)
    lm_q4_rows512(j, r0, r1, w->sdtype, gsh);
  else if (gsh == 6)
    lm_q4_rows_bf16_g64(j, r0, r1);
  else if (gsh == 5)
    lm_q4_rows_bf16_g32(j, r0, r1);
  else
    lm_q4_rows_bf16_g128(j, r0, r1);
}

/* ---- FAST GEMM: 4 tokens × 32 rows ------------------------------------------------------ */

LM_AVX512 static LM_INLINE __m512i lm_bcast4_512(const int8_t *p) {
  int32_t v;
  memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

/* Tile step = 128 bytes: 32 rows × 4 codes, as two 16-row vectors. */
LM_AVX512 static void lm_gemm_body_512(const lm_mm_job *j, const lm_qtile *tl, int64_t tile_r0,
                                       int nvalid, int64_t tt) {
  const lm_qact *qa = j->qa;
  int64_t bpg = j->w->group / LM_QA_BLOCK;
  int sh = bpg == 1 ? 0 : bpg == 2 ? 1 : 2;
  const int8_t *xq[4];
  const float *d[4], *sx[4];
  _Pragma("GCC unroll 4") for (int t = 0; t < 4; t++) {
    xq[t] = qa->q + (tt + t) * qa->ldq;
    d[t] = qa->d + (tt + t) * j->nb;
    sx[t] = qa->sx + (tt + t) * j->ng;
  }
  __m512 f[4][2];
  _Pragma("GCC unroll 4") for (int t = 0; t < 4; t++) f[t][0] = f[t][1] = _mm512_setzero_ps();
  const uint8_t *wp = tl->codes;
  for (int64_t b = 0; b < j->nb; b++, wp += 32 * 32) {
    __m512i a[4][2];
    _Pragma("GCC unroll 4") for (int t = 0; t < 4; t++) a[t][0] = a[t][1] = _mm512_setzero_si512();
    _Pragma("GCC unroll 8") for (int s = 0; s < 8; s++) {
      __m512i w0 = _mm512_loadu_si512((const void *)(wp + s * 128)),
              w1 = _mm512_loadu_si512((const void *)(wp + s * 128 + 64));
      _Pragma("GCC unroll 4") for (int t = 0; t < 4; t++) {
        __m512i xb = lm_bcast4_512(xq[t] + b * LM_QA_BLOCK + 4 * s);
        a[t][0] = _mm512_dpbusd_epi32(a[t][0], w0, xb);
        a[t][1] = _mm512_dpbusd_epi32(a[t][1], w1, xb);
        LM_KEEP(a[t][0]);
        LM_KEEP(a[t][1]);
      }
    }
    int64_t g = b >> sh;
    __m512 s0 = _mm512_loadu_ps(tl->s + g * 32), s1 = _mm512_loadu_ps(tl->s + g * 32 + 16);
    _Pragma("GCC unroll 4") for (int t = 0; t < 4; t++) {
      __m512 dt = _mm512_set1_ps(d[t][b]);
      f[t][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a[t][0]), _mm512_mul_ps(s0, dt), f[t][0]);
      f[t][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a[t][1]), _mm512_mul_ps(s1, dt), f[t][1]);
    }
    if ((b & (bpg - 1)) == bpg - 1) {
      __m512 b0 = _mm512_loadu_ps(tl->b + g * 32), b1 = _mm512_loadu_ps(tl->b + g * 32 + 16);
      _Pragma("GCC unroll 4") for (int t = 0; t < 4; t++) {
        __m512 st = _mm512_set1_ps(sx[t][g]);
        f[t][0] = _mm512_fmadd_ps(b0, st, f[t][0]);
        f[t][1] = _mm512_fmadd_ps(b1, st, f[t][1]);
      }
    }
  }
  for (int t = 0; t < 4 && tt + t < j->m; t++) {
    float *y = j->y + (tt + t) * j->ldy + tile_r0;
    if (nvalid == 32) {
      _mm512_storeu_ps(y, j->acc ? _mm512_add_ps(_mm512_loadu_ps(y), f[t][0]) : f[t][0]);
      _mm512_storeu_ps(y + 16, j->acc ? _mm512_add_ps(_mm512_loadu_ps(y + 16), f[t][1]) : f[t][1]);
    } else {
      float tmp[32];
      _mm512_storeu_ps(tmp, f[t][0]);
      _mm512_storeu_ps(tmp + 16, f[t][1]);
      for (int r = 0; r < nvalid; r++)
        lm_mm_put(y + r, tmp[r], j->acc);
    }
  }
}

LM_AVX512 static void lm_gemm_fast_avx512(const lm_mm_job *j, const lm_qtile *tl, int64_t tile_r0,
                                          int nvalid, int64_t t0, int64_t t1) {
  for (int64_t tt = t0; tt < t1; tt += 4)
    lm_gemm_body_512(j, tl, tile_r0, nvalid, tt);
}

const lm_cpu_kernels lm_cpu_kernels_avx512 = {
    .isa = LM_CPU_ISA_AVX512,
    .name = "avx512",
    .q4_perm = 128,
    .gemv_f32 = lm_gemv_f32_avx512,
    .gemv_fast = lm_gemv_fast_avx512,
    .dequant_rows = lm_mm_avx2_dequant_rows,
    .quantize = lm_mm_avx2_quantize,
    .unpack_codes = lm_mm_avx2_unpack_codes,
    .interleave = lm_mm_avx2_interleave,
    .gemm_nr = 32,
    .gemm_mr = 4,
    .gemm_signed8 = 0,
    .gemm_fast = lm_gemm_fast_avx512,
};

#endif
