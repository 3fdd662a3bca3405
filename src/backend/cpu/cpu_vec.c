/* cpu_vec.c — the portable table of cpu_vec.h (libm's tanhf and expf), and the choice of
 * table for this CPU. */
#include "backend/cpu/cpu_vec.h"

#include <math.h>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/cpu_matmul.h"

static void geglu_scalar(float *y, const float *g, const float *u, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    y[i] = lm_gelu_tanh(g[i]) * u[i];
}

static void softcap_scalar(float *y, int64_t n, float cap) {
  for (int64_t i = 0; i < n; i++)
    y[i] = tanhf(y[i] / cap) * cap;
}

static void dots_scalar(const float *q, const float *const *k, int n, int hd, float scale,
                        float *s) {
  for (int j = 0; j < n; j++) {
    float a = 0.0f;
    for (int d = 0; d < hd; d++)
      a += q[d] * k[j][d];
    s[j] = a * scale;
  }
}

static float exps_scalar(float *s, int n, float m) {
  float sum = 0.0f;
  for (int j = 0; j < n; j++) {
    s[j] = expf(s[j] - m);
    sum += s[j];
  }
  return sum;
}

static float softmax_tile_scalar(float *s, int n, float *m, float *l) {
  float mt = *m;
  for (int j = 0; j < n; j++)
    mt = s[j] > mt ? s[j] : mt;
  float r = expf(*m - mt), sum = exps_scalar(s, n, mt);
  *l = *l * r + sum;
  *m = mt;
  return r;
}

static void axpys_scalar(float *acc, float r, const float *p, const float *const *v, int n,
                         int hd) {
  for (int d = 0; d < hd; d++) {
    float a = acc[d] * r;
    for (int j = 0; j < n; j++)
      a += p[j] * v[j][d];
    acc[d] = a;
  }
}

const lm_cpu_vec lm_cpu_vec_scalar = {.name = "scalar",
                                      .geglu = geglu_scalar,
                                      .softcap = softcap_scalar,
                                      .dots = dots_scalar,
                                      .exps = exps_scalar,
                                      .softmax_tile = softmax_tile_scalar,
                                      .axpys = axpys_scalar};

const lm_cpu_vec *lm_cpu_vec_best(void) {
#if defined(__x86_64__)
  if (lm_cpu_isa_available(LM_CPU_ISA_AVX512)) return &lm_cpu_vec_avx512;
  if (lm_cpu_isa_available(LM_CPU_ISA_AVX2)) return &lm_cpu_vec_avx2;
#endif
  return &lm_cpu_vec_scalar;
}
