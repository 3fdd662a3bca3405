/* cpu_vec_avx512.c — cpu_vec.h on AVX-512 (16 lanes, masked tails, so a tail element runs
 * exactly the arithmetic of a full vector's). exp and expm1 are our own: range reduction by
 * ln 2 split in two constants, Taylor polynomials to the 7th / 8th power on |r| <= ln2/2
 * (truncation below 1e-8 relative), vscalefps for the power of two; about one ulp. */
#if defined(__x86_64__)
#include <immintrin.h>
#include <math.h>

#include "backend/cpu/cpu_vec.h"

#define LM_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma")))
#define LM_INLINE __attribute__((always_inline)) inline

static const float lm_ln2_hi = 0.693145751953125f, lm_ln2_lo = 1.428606765330187045e-6f;
static const float lm_log2e = 1.44269504088896341f;

static inline __mmask16 lm_mask16(int64_t n) {
  return n >= 16 ? (__mmask16)0xffff : n <= 0 ? 0 : (__mmask16)((1u << n) - 1);
}

/* x = n·ln2 + r, n an integer as a float. */
LM_AVX512 static LM_INLINE __m512 lm_reduce512(__m512 x, __m512 *n) {
  *n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(lm_log2e)),
                            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(*n, _mm512_set1_ps(lm_ln2_hi), x);
  return _mm512_fnmadd_ps(*n, _mm512_set1_ps(lm_ln2_lo), r);
}

/* Σ_{i<=7} r^i / i! by Horner. */
LM_AVX512 static LM_INLINE __m512 lm_exp_poly512(__m512 r) {
  __m512 p = _mm512_set1_ps(1.0f / 5040);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
}

/* exp(x); 0 below -87.33 (where f32 turns subnormal), NaN kept. */
LM_AVX512 static LM_INLINE __m512 lm_exp512(__m512 x) {
  const __m512 lim = _mm512_set1_ps(-87.33f);
  __mmask16 keep = _mm512_cmp_ps_mask(x, lim, _CMP_NLT_UQ);
  __m512 n, r = lm_reduce512(_mm512_max_ps(lim, x), &n); /* max(lim, NaN) is NaN */
  return _mm512_maskz_mov_ps(keep, _mm512_scalef_ps(lm_exp_poly512(r), n));
}

/* expm1(x) for 0 <= x <= 18: 2^n·q + (2^n - 1) with q = expm1(r), exact at n = 0 (small x). */
LM_AVX512 static LM_INLINE __m512 lm_expm1_512(__m512 x) {
  __m512 n, r = lm_reduce512(x, &n);
  __m512 p = _mm512_set1_ps(1.0f / 40320);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 5040));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  __m512 q = _mm512_fmadd_ps(_mm512_mul_ps(r, r), p, r);
  __m512 t = _mm512_scalef_ps(_mm512_set1_ps(1.0f), n);
  return _mm512_fmadd_ps(t, q, _mm512_sub_ps(t, _mm512_set1_ps(1.0f)));
}

/* tanh(z) = sign(z)·e/(e + 2), e = expm1(2|z|): no cancellation near 0; |z| past 9 is
 * tanh = 1 in f32 (min(9, NaN) is NaN: a NaN stays one). */
LM_AVX512 static LM_INLINE __m512 lm_tanh512(__m512 z) {
  const __m512i sign = _mm512_set1_epi32((int)0x80000000u);
  __m512 a = _mm512_min_ps(_mm512_set1_ps(9.0f), _mm512_abs_ps(z));
  __m512 e = lm_expm1_512(_mm512_add_ps(a, a));
  __m512 t = _mm512_div_ps(e, _mm512_add_ps(e, _mm512_set1_ps(2.0f)));
  return _mm512_castsi512_ps(
      _mm512_or_si512(_mm512_castps_si512(t), _mm512_and_si512(_mm512_castps_si512(z), sign)));
}

/* 0.5·x·(1 + tanh(z)), z = sqrt(2/pi)·(x + 0.044715·x³): torch's formula. */
LM_AVX512 static LM_INLINE __m512 lm_gelu512(__m512 x) {
  __m512 z = _mm512_mul_ps(
      _mm512_set1_ps(0.7978845608028654f),
      _mm512_fmadd_ps(_mm512_mul_ps(_mm512_mul_ps(x, x), x), _mm512_set1_ps(0.044715f), x));
  return _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.5f), x),
                       _mm512_add_ps(_mm512_set1_ps(1.0f), lm_tanh512(z)));
}

LM_AVX512 static void geglu_512(float *y, const float *g, const float *u, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    __mmask16 m = lm_mask16(n - i);
    __m512 v =
        _mm512_mul_ps(lm_gelu512(_mm512_maskz_loadu_ps(m, g + i)), _mm512_maskz_loadu_ps(m, u + i));
    _mm512_mask_storeu_ps(y + i, m, v);
  }
}

LM_AVX512 static void softcap_512(float *y, int64_t n, float cap) {
  __m512 c = _mm512_set1_ps(cap);
  for (int64_t i = 0; i < n; i += 16) {
    __mmask16 m = lm_mask16(n - i);
    __m512 v = lm_tanh512(_mm512_div_ps(_mm512_maskz_loadu_ps(m, y + i), c));
    _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(v, c));
  }
}

/* Σ_d q[d]·k[d] as one chain of 16-lane FMAs (whole vectors, then a masked tail), then the
 * lanes' sum. */
LM_AVX512 static LM_INLINE float lm_dot512(const float *q, const float *k, int hd) {
  __m512 a = _mm512_setzero_ps();
  int d = 0;
  for (; d + 16 <= hd; d += 16)
    a = _mm512_fmadd_ps(_mm512_loadu_ps(q + d), _mm512_loadu_ps(k + d), a);
  if (d < hd) {
    __mmask16 m = lm_mask16(hd - d);
    a = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q + d), _mm512_maskz_loadu_ps(m, k + d), a);
  }
  return _mm512_reduce_add_ps(a);
}

/* Four keys at a time for the loads' sake; each key's chain is the one lm_dot512 runs. */
LM_AVX512 static void dots_512(const float *q, const float *const *k, int n, int hd, float scale,
                               float *s) {
  int j = 0;
  for (; j + 4 <= n; j += 4) {
    const float *k0 = k[j], *k1 = k[j + 1], *k2 = k[j + 2], *k3 = k[j + 3];
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int d = 0;
    for (; d + 16 <= hd; d += 16) {
      __m512 qv = _mm512_loadu_ps(q + d);
      a0 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k0 + d), a0);
      a1 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k1 + d), a1);
      a2 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k2 + d), a2);
      a3 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k3 + d), a3);
    }
    if (d < hd) {
      __mmask16 m = lm_mask16(hd - d);
      __m512 qv = _mm512_maskz_loadu_ps(m, q + d);
      a0 = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(m, k0 + d), a0);
      a1 = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(m, k1 + d), a1);
      a2 = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(m, k2 + d), a2);
      a3 = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(m, k3 + d), a3);
    }
    s[j] = _mm512_reduce_add_ps(a0) * scale;
    s[j + 1] = _mm512_reduce_add_ps(a1) * scale;
    s[j + 2] = _mm512_reduce_add_ps(a2) * scale;
    s[j + 3] = _mm512_reduce_add_ps(a3) * scale;
  }
  for (; j < n; j++)
    s[j] = lm_dot512(q, k[j], hd) * scale;
}

LM_AVX512 static float exps_512(float *s, int n, float m) {
  __mmask16 k = lm_mask16(n);
  __m512 e = lm_exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s), _mm512_set1_ps(m)));
  e = _mm512_maskz_mov_ps(k, e);
  _mm512_mask_storeu_ps(s, k, e);
  return _mm512_reduce_add_ps(e);
}

/* Two vectors of scores: their max, then both exps; the old max's factor from the same exp. */
LM_AVX512 static float softmax_tile_512(float *s, int n, float *m, float *l) {
  __mmask16 k0 = lm_mask16(n), k1 = lm_mask16(n - 16);
  const __m512 ninf = _mm512_set1_ps(-INFINITY);
  __m512 v0 = _mm512_mask_loadu_ps(ninf, k0, s), v1 = _mm512_mask_loadu_ps(ninf, k1, s + 16);
  float mt = _mm512_reduce_max_ps(_mm512_max_ps(v0, v1));
  mt = mt > *m ? mt : *m;
  __m512 mv = _mm512_set1_ps(mt);
  __m512 e0 = _mm512_maskz_mov_ps(k0, lm_exp512(_mm512_sub_ps(v0, mv)));
  __m512 e1 = _mm512_maskz_mov_ps(k1, lm_exp512(_mm512_sub_ps(v1, mv)));
  _mm512_mask_storeu_ps(s, k0, e0);
  _mm512_mask_storeu_ps(s + 16, k1, e1);
  float r = _mm512_cvtss_f32(lm_exp512(_mm512_set1_ps(*m - mt)));
  *l = *l * r + _mm512_reduce_add_ps(_mm512_add_ps(e0, e1));
  *m = mt;
  return r;
}

/* 64 columns at a time in four registers, every key folded in before they are stored. */
LM_AVX512 static void axpys_512(float *acc, float r, const float *p, const float *const *v, int n,
                                int hd) {
  __m512 rv = _mm512_set1_ps(r);
  int d = 0;
  for (; d + 64 <= hd; d += 64) {
    __m512 a0 = _mm512_mul_ps(_mm512_loadu_ps(acc + d), rv);
    __m512 a1 = _mm512_mul_ps(_mm512_loadu_ps(acc + d + 16), rv);
    __m512 a2 = _mm512_mul_ps(_mm512_loadu_ps(acc + d + 32), rv);
    __m512 a3 = _mm512_mul_ps(_mm512_loadu_ps(acc + d + 48), rv);
    for (int j = 0; j < n; j++) {
      __m512 pj = _mm512_set1_ps(p[j]);
      const float *vj = v[j] + d;
      a0 = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vj), a0);
      a1 = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vj + 16), a1);
      a2 = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vj + 32), a2);
      a3 = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vj + 48), a3);
    }
    _mm512_storeu_ps(acc + d, a0);
    _mm512_storeu_ps(acc + d + 16, a1);
    _mm512_storeu_ps(acc + d + 32, a2);
    _mm512_storeu_ps(acc + d + 48, a3);
  }
  for (; d < hd; d += 16) {
    __mmask16 m = lm_mask16(hd - d);
    __m512 a = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, acc + d), rv);
    for (int j = 0; j < n; j++)
      a = _mm512_fmadd_ps(_mm512_set1_ps(p[j]), _mm512_maskz_loadu_ps(m, v[j] + d), a);
    _mm512_mask_storeu_ps(acc + d, m, a);
  }
}

/* dots_512 for two heads over the same keys: each key vector is loaded once for both, and each
 * head's chains are dots_512's (four keys at a time, then lm_dot512), so its scores are the
 * bits of its own call. */
LM_AVX512 static void dots2_512(const float *q0, const float *q1, const float *const *k, int n,
                                int hd, float scale, float *s0, float *s1) {
  int j = 0;
  for (; j + 4 <= n; j += 4) {
    const float *k0 = k[j], *k1 = k[j + 1], *k2 = k[j + 2], *k3 = k[j + 3];
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    int d = 0;
    for (; d + 16 <= hd; d += 16) {
      __m512 qa = _mm512_loadu_ps(q0 + d), qb = _mm512_loadu_ps(q1 + d);
      __m512 v0 = _mm512_loadu_ps(k0 + d), v1 = _mm512_loadu_ps(k1 + d);
      __m512 v2 = _mm512_loadu_ps(k2 + d), v3 = _mm512_loadu_ps(k3 + d);
      a0 = _mm512_fmadd_ps(qa, v0, a0);
      b0 = _mm512_fmadd_ps(qb, v0, b0);
      a1 = _mm512_fmadd_ps(qa, v1, a1);
      b1 = _mm512_fmadd_ps(qb, v1, b1);
      a2 = _mm512_fmadd_ps(qa, v2, a2);
      b2 = _mm512_fmadd_ps(qb, v2, b2);
      a3 = _mm512_fmadd_ps(qa, v3, a3);
      b3 = _mm512_fmadd_ps(qb, v3, b3);
    }
    if (d < hd) {
      __mmask16 m = lm_mask16(hd - d);
      __m512 qa = _mm512_maskz_loadu_ps(m, q0 + d), qb = _mm512_maskz_loadu_ps(m, q1 + d);
      __m512 v0 = _mm512_maskz_loadu_ps(m, k0 + d), v1 = _mm512_maskz_loadu_ps(m, k1 + d);
      __m512 v2 = _mm512_maskz_loadu_ps(m, k2 + d), v3 = _mm512_maskz_loadu_ps(m, k3 + d);
      a0 = _mm512_fmadd_ps(qa, v0, a0);
      b0 = _mm512_fmadd_ps(qb, v0, b0);
      a1 = _mm512_fmadd_ps(qa, v1, a1);
      b1 = _mm512_fmadd_ps(qb, v1, b1);
      a2 = _mm512_fmadd_ps(qa, v2, a2);
      b2 = _mm512_fmadd_ps(qb, v2, b2);
      a3 = _mm512_fmadd_ps(qa, v3, a3);
      b3 = _mm512_fmadd_ps(qb, v3, b3);
    }
    s0[j] = _mm512_reduce_add_ps(a0) * scale;
    s0[j + 1] = _mm512_reduce_add_ps(a1) * scale;
    s0[j + 2] = _mm512_reduce_add_ps(a2) * scale;
    s0[j + 3] = _mm512_reduce_add_ps(a3) * scale;
    s1[j] = _mm512_reduce_add_ps(b0) * scale;
    s1[j + 1] = _mm512_reduce_add_ps(b1) * scale;
    s1[j + 2] = _mm512_reduce_add_ps(b2) * scale;
    s1[j + 3] = _mm512_reduce_add_ps(b3) * scale;
  }
  for (; j < n; j++) {
    s0[j] = lm_dot512(q0, k[j], hd) * scale;
    s1[j] = lm_dot512(q1, k[j], hd) * scale;
  }
}

/* axpys_512 for two heads over the same values: each value vector is loaded once for both, and
 * each head's accumulator takes exactly axpys_512's steps (64 columns in four registers, then
 * masked 16-column tails). */
LM_AVX512 static void axpys2_512(float *acc0, float r0, const float *p0, float *acc1, float r1,
                                 const float *p1, const float *const *v, int n, int hd) {
  __m512 ra = _mm512_set1_ps(r0), rb = _mm512_set1_ps(r1);
  int d = 0;
  for (; d + 64 <= hd; d += 64) {
    __m512 a0 = _mm512_mul_ps(_mm512_loadu_ps(acc0 + d), ra);
    __m512 a1 = _mm512_mul_ps(_mm512_loadu_ps(acc0 + d + 16), ra);
    __m512 a2 = _mm512_mul_ps(_mm512_loadu_ps(acc0 + d + 32), ra);
    __m512 a3 = _mm512_mul_ps(_mm512_loadu_ps(acc0 + d + 48), ra);
    __m512 b0 = _mm512_mul_ps(_mm512_loadu_ps(acc1 + d), rb);
    __m512 b1 = _mm512_mul_ps(_mm512_loadu_ps(acc1 + d + 16), rb);
    __m512 b2 = _mm512_mul_ps(_mm512_loadu_ps(acc1 + d + 32), rb);
    __m512 b3 = _mm512_mul_ps(_mm512_loadu_ps(acc1 + d + 48), rb);
    for (int j = 0; j < n; j++) {
      __m512 pa = _mm512_set1_ps(p0[j]), pb = _mm512_set1_ps(p1[j]);
      const float *vj = v[j] + d;
      __m512 v0 = _mm512_loadu_ps(vj), v1 = _mm512_loadu_ps(vj + 16);
      __m512 v2 = _mm512_loadu_ps(vj + 32), v3 = _mm512_loadu_ps(vj + 48);
      a0 = _mm512_fmadd_ps(pa, v0, a0);
      b0 = _mm512_fmadd_ps(pb, v0, b0);
      a1 = _mm512_fmadd_ps(pa, v1, a1);
      b1 = _mm512_fmadd_ps(pb, v1, b1);
      a2 = _mm512_fmadd_ps(pa, v2, a2);
      b2 = _mm512_fmadd_ps(pb, v2, b2);
      a3 = _mm512_fmadd_ps(pa, v3, a3);
      b3 = _mm512_fmadd_ps(pb, v3, b3);
    }
    _mm512_storeu_ps(acc0 + d, a0);
    _mm512_storeu_ps(acc0 + d + 16, a1);
    _mm512_storeu_ps(acc0 + d + 32, a2);
    _mm512_storeu_ps(acc0 + d + 48, a3);
    _mm512_storeu_ps(acc1 + d, b0);
    _mm512_storeu_ps(acc1 + d + 16, b1);
    _mm512_storeu_ps(acc1 + d + 32, b2);
    _mm512_storeu_ps(acc1 + d + 48, b3);
  }
  for (; d < hd; d += 16) {
    __mmask16 m = lm_mask16(hd - d);
    __m512 a = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, acc0 + d), ra);
    __m512 b = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, acc1 + d), rb);
    for (int j = 0; j < n; j++) {
      __m512 vj = _mm512_maskz_loadu_ps(m, v[j] + d);
      a = _mm512_fmadd_ps(_mm512_set1_ps(p0[j]), vj, a);
      b = _mm512_fmadd_ps(_mm512_set1_ps(p1[j]), vj, b);
    }
    _mm512_mask_storeu_ps(acc0 + d, m, a);
    _mm512_mask_storeu_ps(acc1 + d, m, b);
  }
}

const lm_cpu_vec lm_cpu_vec_avx512 = {.name = "avx512",
                                      .geglu = geglu_512,
                                      .softcap = softcap_512,
                                      .dots = dots_512,
                                      .exps = exps_512,
                                      .softmax_tile = softmax_tile_512,
                                      .axpys = axpys_512,
                                      .dots2 = dots2_512,
                                      .axpys2 = axpys2_512};
#endif
