/* cpu_vec_avx2.c — cpu_vec.h on AVX2 + FMA: the AVX-512 file's arithmetic on 8 lanes, tails
 * through masked loads and stores, 2^n built in the exponent bits. */
#if defined(__x86_64__)
#include <immintrin.h>
#include <math.h>

#include "backend/cpu/cpu_vec.h"

#define LM_AVX2 __attribute__((target("avx2,fma")))
#define LM_INLINE __attribute__((always_inline)) inline

static const float lm_ln2_hi = 0.693145751953125f, lm_ln2_lo = 1.428606765330187045e-6f;
static const float lm_log2e = 1.44269504088896341f;

/* Lanes below n set (as maskload wants: the sign bit). */
LM_AVX2 static LM_INLINE __m256i lm_mask8(int64_t n) {
  const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n >= 8 ? 8 : n <= 0 ? 0 : (int)n), iota);
}
#define LM_LD(m, p) _mm256_maskload_ps((p), (m))

LM_AVX2 static LM_INLINE __m256 lm_reduce8(__m256 x, __m256 *n) {
  *n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(lm_log2e)),
                       _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(*n, _mm256_set1_ps(lm_ln2_hi), x);
  return _mm256_fnmadd_ps(*n, _mm256_set1_ps(lm_ln2_lo), r);
}

/* 2^n for integral n in [-126, 127]. */
LM_AVX2 static LM_INLINE __m256 lm_pow2_8(__m256 n) {
  __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
  return _mm256_castsi256_ps(_mm256_slli_epi32(e, 23));
}

LM_AVX2 static LM_INLINE __m256 lm_exp8(__m256 x) {
  const __m256 lim = _mm256_set1_ps(-87.33f);
  __m256 keep = _mm256_cmp_ps(x, lim, _CMP_NLT_UQ);
  __m256 n, r = lm_reduce8(_mm256_max_ps(lim, x), &n); /* max(lim, NaN) is NaN */
  __m256 p = _mm256_set1_ps(1.0f / 5040);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  return _mm256_and_ps(keep, _mm256_mul_ps(p, lm_pow2_8(n)));
}

LM_AVX2 static LM_INLINE __m256 lm_expm1_8(__m256 x) {
  __m256 n, r = lm_reduce8(x, &n);
  __m256 p = _mm256_set1_ps(1.0f / 40320);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 5040));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  __m256 q = _mm256_fmadd_ps(_mm256_mul_ps(r, r), p, r);
  __m256 t = lm_pow2_8(n);
  return _mm256_fmadd_ps(t, q, _mm256_sub_ps(t, _mm256_set1_ps(1.0f)));
}

LM_AVX2 static LM_INLINE __m256 lm_tanh8(__m256 z) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 a = _mm256_min_ps(_mm256_set1_ps(9.0f), _mm256_andnot_ps(sign, z));
  __m256 e = lm_expm1_8(_mm256_add_ps(a, a));
  __m256 t = _mm256_div_ps(e, _mm256_add_ps(e, _mm256_set1_ps(2.0f)));
  return _mm256_or_ps(t, _mm256_and_ps(sign, z));
}

LM_AVX2 static LM_INLINE __m256 lm_gelu8(__m256 x) {
  __m256 z = _mm256_mul_ps(
      _mm256_set1_ps(0.7978845608028654f),
      _mm256_fmadd_ps(_mm256_mul_ps(_mm256_mul_ps(x, x), x), _mm256_set1_ps(0.044715f), x));
  return _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), x),
                       _mm256_add_ps(_mm256_set1_ps(1.0f), lm_tanh8(z)));
}

LM_AVX2 static void geglu_8(float *y, const float *g, const float *u, int64_t n) {
  for (int64_t i = 0; i < n; i += 8) {
    __m256i m = lm_mask8(n - i);
    _mm256_maskstore_ps(y + i, m, _mm256_mul_ps(lm_gelu8(LM_LD(m, g + i)), LM_LD(m, u + i)));
  }
}

LM_AVX2 static void softcap_8(float *y, int64_t n, float cap) {
  __m256 c = _mm256_set1_ps(cap);
  for (int64_t i = 0; i < n; i += 8) {
    __m256i m = lm_mask8(n - i);
    _mm256_maskstore_ps(y + i, m, _mm256_mul_ps(lm_tanh8(_mm256_div_ps(LM_LD(m, y + i), c)), c));
  }
}

LM_AVX2 static LM_INLINE float lm_hsum8f(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* One chain per key: whole vectors, then a masked tail. */
LM_AVX2 static LM_INLINE float lm_dot8(const float *q, const float *k, int hd) {
  __m256 a = _mm256_setzero_ps();
  int d = 0;
  for (; d + 8 <= hd; d += 8)
    a = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(k + d), a);
  if (d < hd) {
    __m256i m = lm_mask8(hd - d);
    a = _mm256_fmadd_ps(LM_LD(m, q + d), LM_LD(m, k + d), a);
  }
  return lm_hsum8f(a);
}

LM_AVX2 static void dots_8(const float *q, const float *const *k, int n, int hd, float scale,
                           float *s) {
  int j = 0;
  for (; j + 4 <= n; j += 4) {
    const float *k0 = k[j], *k1 = k[j + 1], *k2 = k[j + 2], *k3 = k[j + 3];
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int d = 0;
    for (; d + 8 <= hd; d += 8) {
      __m256 qv = _mm256_loadu_ps(q + d);
      a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + d), a0);
      a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k1 + d), a1);
      a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k2 + d), a2);
      a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k3 + d), a3);
    }
    if (d < hd) {
      __m256i m = lm_mask8(hd - d);
      __m256 qv = LM_LD(m, q + d);
      a0 = _mm256_fmadd_ps(qv, LM_LD(m, k0 + d), a0);
      a1 = _mm256_fmadd_ps(qv, LM_LD(m, k1 + d), a1);
      a2 = _mm256_fmadd_ps(qv, LM_LD(m, k2 + d), a2);
      a3 = _mm256_fmadd_ps(qv, LM_LD(m, k3 + d), a3);
    }
    s[j] = lm_hsum8f(a0) * scale;
    s[j + 1] = lm_hsum8f(a1) * scale;
    s[j + 2] = lm_hsum8f(a2) * scale;
    s[j + 3] = lm_hsum8f(a3) * scale;
  }
  for (; j < n; j++)
    s[j] = lm_dot8(q, k[j], hd) * scale;
}

/* dots_8 for two heads over the same keys: each key's vector is loaded once for both, and each
 * head's sums take exactly dots_8's steps (the same chains, the same order), so s0 and s1 are
 * the bits two dots_8 calls would give. */
LM_AVX2 static void dots2_8(const float *q0, const float *q1, const float *const *k, int n, int hd,
                            float scale, float *s0, float *s1) {
  int j = 0;
  for (; j + 4 <= n; j += 4) {
    const float *k0 = k[j], *k1 = k[j + 1], *k2 = k[j + 2], *k3 = k[j + 3];
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    int d = 0;
    for (; d + 8 <= hd; d += 8) {
      __m256 qa = _mm256_loadu_ps(q0 + d), qb = _mm256_loadu_ps(q1 + d);
      __m256 v0 = _mm256_loadu_ps(k0 + d), v1 = _mm256_loadu_ps(k1 + d);
      __m256 v2 = _mm256_loadu_ps(k2 + d), v3 = _mm256_loadu_ps(k3 + d);
      a0 = _mm256_fmadd_ps(qa, v0, a0);
      b0 = _mm256_fmadd_ps(qb, v0, b0);
      a1 = _mm256_fmadd_ps(qa, v1, a1);
      b1 = _mm256_fmadd_ps(qb, v1, b1);
      a2 = _mm256_fmadd_ps(qa, v2, a2);
      b2 = _mm256_fmadd_ps(qb, v2, b2);
      a3 = _mm256_fmadd_ps(qa, v3, a3);
      b3 = _mm256_fmadd_ps(qb, v3, b3);
    }
    if (d < hd) {
      __m256i m = lm_mask8(hd - d);
      __m256 qa = LM_LD(m, q0 + d), qb = LM_LD(m, q1 + d);
      __m256 v0 = LM_LD(m, k0 + d), v1 = LM_LD(m, k1 + d), v2 = LM_LD(m, k2 + d),
             v3 = LM_LD(m, k3 + d);
      a0 = _mm256_fmadd_ps(qa, v0, a0);
      b0 = _mm256_fmadd_ps(qb, v0, b0);
      a1 = _mm256_fmadd_ps(qa, v1, a1);
      b1 = _mm256_fmadd_ps(qb, v1, b1);
      a2 = _mm256_fmadd_ps(qa, v2, a2);
      b2 = _mm256_fmadd_ps(qb, v2, b2);
      a3 = _mm256_fmadd_ps(qa, v3, a3);
      b3 = _mm256_fmadd_ps(qb, v3, b3);
    }
    s0[j] = lm_hsum8f(a0) * scale;
    s0[j + 1] = lm_hsum8f(a1) * scale;
    s0[j + 2] = lm_hsum8f(a2) * scale;
    s0[j + 3] = lm_hsum8f(a3) * scale;
    s1[j] = lm_hsum8f(b0) * scale;
    s1[j + 1] = lm_hsum8f(b1) * scale;
    s1[j + 2] = lm_hsum8f(b2) * scale;
    s1[j + 3] = lm_hsum8f(b3) * scale;
  }
  for (; j < n; j++) {
    s0[j] = lm_dot8(q0, k[j], hd) * scale;
    s1[j] = lm_dot8(q1, k[j], hd) * scale;
  }
}

LM_AVX2 static float exps_8(float *s, int n, float m) {
  __m256 mv = _mm256_set1_ps(m), sum = _mm256_setzero_ps();
  for (int j = 0; j < n; j += 8) {
    __m256i k = lm_mask8(n - j);
    __m256 e = _mm256_and_ps(_mm256_castsi256_ps(k), lm_exp8(_mm256_sub_ps(LM_LD(k, s + j), mv)));
    _mm256_maskstore_ps(s + j, k, e);
    sum = _mm256_add_ps(sum, e);
  }
  return lm_hsum8f(sum);
}

LM_AVX2 static float softmax_tile_8(float *s, int n, float *m, float *l) {
  const __m256 ninf = _mm256_set1_ps(-INFINITY);
  __m256 v[4], mx = ninf;
  for (int i = 0; i < 4; i++) {
    __m256i k = lm_mask8(n - 8 * i);
    v[i] = _mm256_blendv_ps(ninf, LM_LD(k, s + 8 * i), _mm256_castsi256_ps(k));
    mx = _mm256_max_ps(mx, v[i]);
  }
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  float mt = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
  mt = mt > *m ? mt : *m;
  __m256 mv = _mm256_set1_ps(mt), sum = _mm256_setzero_ps();
  for (int i = 0; i < 4; i++) {
    __m256i k = lm_mask8(n - 8 * i);
    __m256 e = _mm256_and_ps(_mm256_castsi256_ps(k), lm_exp8(_mm256_sub_ps(v[i], mv)));
    _mm256_maskstore_ps(s + 8 * i, k, e);
    sum = _mm256_add_ps(sum, e);
  }
  float r = _mm256_cvtss_f32(lm_exp8(_mm256_set1_ps(*m - mt)));
  *l = *l * r + lm_hsum8f(sum);
  *m = mt;
  return r;
}

LM_AVX2 static void axpys_8(float *acc, float r, const float *p, const float *const *v, int n,
                            int hd) {
  __m256 rv = _mm256_set1_ps(r);
  int d = 0;
  for (; d + 32 <= hd; d += 32) {
    __m256 a0 = _mm256_mul_ps(_mm256_loadu_ps(acc + d), rv);
    __m256 a1 = _mm256_mul_ps(_mm256_loadu_ps(acc + d + 8), rv);
    __m256 a2 = _mm256_mul_ps(_mm256_loadu_ps(acc + d + 16), rv);
    __m256 a3 = _mm256_mul_ps(_mm256_loadu_ps(acc + d + 24), rv);
    for (int j = 0; j < n; j++) {
      __m256 pj = _mm256_set1_ps(p[j]);
      const float *vj = v[j] + d;
      a0 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj), a0);
      a1 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 8), a1);
      a2 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 16), a2);
      a3 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 24), a3);
    }
    _mm256_storeu_ps(acc + d, a0);
    _mm256_storeu_ps(acc + d + 8, a1);
    _mm256_storeu_ps(acc + d + 16, a2);
    _mm256_storeu_ps(acc + d + 24, a3);
  }
  for (; d < hd; d += 8) {
    __m256i m = lm_mask8(hd - d);
    __m256 a = _mm256_mul_ps(LM_LD(m, acc + d), rv);
    for (int j = 0; j < n; j++)
      a = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), LM_LD(m, v[j] + d), a);
    _mm256_maskstore_ps(acc + d, m, a);
  }
}

/* axpys_8 for two heads over the same values: each value vector is loaded once for both, and
 * each head's accumulator takes exactly axpys_8's steps. */
LM_AVX2 static void axpys2_8(float *acc0, float r0, const float *p0, float *acc1, float r1,
                             const float *p1, const float *const *v, int n, int hd) {
  __m256 ra = _mm256_set1_ps(r0), rb = _mm256_set1_ps(r1);
  int d = 0;
  for (; d + 32 <= hd; d += 32) {
    __m256 a0 = _mm256_mul_ps(_mm256_loadu_ps(acc0 + d), ra);
    __m256 a1 = _mm256_mul_ps(_mm256_loadu_ps(acc0 + d + 8), ra);
    __m256 a2 = _mm256_mul_ps(_mm256_loadu_ps(acc0 + d + 16), ra);
    __m256 a3 = _mm256_mul_ps(_mm256_loadu_ps(acc0 + d + 24), ra);
    __m256 b0 = _mm256_mul_ps(_mm256_loadu_ps(acc1 + d), rb);
    __m256 b1 = _mm256_mul_ps(_mm256_loadu_ps(acc1 + d + 8), rb);
    __m256 b2 = _mm256_mul_ps(_mm256_loadu_ps(acc1 + d + 16), rb);
    __m256 b3 = _mm256_mul_ps(_mm256_loadu_ps(acc1 + d + 24), rb);
    for (int j = 0; j < n; j++) {
      __m256 pa = _mm256_set1_ps(p0[j]), pb = _mm256_set1_ps(p1[j]);
      const float *vj = v[j] + d;
      __m256 v0 = _mm256_loadu_ps(vj), v1 = _mm256_loadu_ps(vj + 8);
      __m256 v2 = _mm256_loadu_ps(vj + 16), v3 = _mm256_loadu_ps(vj + 24);
      a0 = _mm256_fmadd_ps(pa, v0, a0);
      b0 = _mm256_fmadd_ps(pb, v0, b0);
      a1 = _mm256_fmadd_ps(pa, v1, a1);
      b1 = _mm256_fmadd_ps(pb, v1, b1);
      a2 = _mm256_fmadd_ps(pa, v2, a2);
      b2 = _mm256_fmadd_ps(pb, v2, b2);
      a3 = _mm256_fmadd_ps(pa, v3, a3);
      b3 = _mm256_fmadd_ps(pb, v3, b3);
    }
    _mm256_storeu_ps(acc0 + d, a0);
    _mm256_storeu_ps(acc0 + d + 8, a1);
    _mm256_storeu_ps(acc0 + d + 16, a2);
    _mm256_storeu_ps(acc0 + d + 24, a3);
    _mm256_storeu_ps(acc1 + d, b0);
    _mm256_storeu_ps(acc1 + d + 8, b1);
    _mm256_storeu_ps(acc1 + d + 16, b2);
    _mm256_storeu_ps(acc1 + d + 24, b3);
  }
  for (; d < hd; d += 8) {
    __m256i m = lm_mask8(hd - d);
    __m256 a = _mm256_mul_ps(LM_LD(m, acc0 + d), ra), b = _mm256_mul_ps(LM_LD(m, acc1 + d), rb);
    for (int j = 0; j < n; j++) {
      __m256 vj = LM_LD(m, v[j] + d);
      a = _mm256_fmadd_ps(_mm256_set1_ps(p0[j]), vj, a);
      b = _mm256_fmadd_ps(_mm256_set1_ps(p1[j]), vj, b);
    }
    _mm256_maskstore_ps(acc0 + d, m, a);
    _mm256_maskstore_ps(acc1 + d, m, b);
  }
}

const lm_cpu_vec lm_cpu_vec_avx2 = {.name = "avx2",
                                    .geglu = geglu_8,
                                    .softcap = softcap_8,
                                    .dots = dots_8,
                                    .exps = exps_8,
                                    .softmax_tile = softmax_tile_8,
                                    .axpys = axpys_8,
                                    .dots2 = dots2_8,
                                    .axpys2 = axpys2_8};
#endif
