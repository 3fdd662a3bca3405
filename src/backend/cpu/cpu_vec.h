/* cpu_vec.h — the CPU backend's vector math outside the matmul: the GeGLU of the MLP, the logits'
 * soft cap and the loops of attention's online softmax over a tile of keys. One table per
 * instruction set (cpu_vec.c: portable, cpu_vec_avx2.c, cpu_vec_avx512.c); a CPU backend picks
 * one when it is created (lm_cpu_vec_of), so its team and its separate ops compute the same bits.
 *
 * Each function's result for an element depends only on that element's inputs (and, for the
 * sums, on the order of the keys), never on how many elements a call covers or where they
 * sit in it: a row computes the same whether it is decoded alone or verified in a batch. */
#ifndef LM_BACKEND_CPU_VEC_H
#define LM_BACKEND_CPU_VEC_H

#include <stdint.h>

typedef struct lm_cpu_vec {
  const char *name;
  /* y[i] = gelu_tanh(g[i]) · u[i] for i < n (y may alias g or u) */
  void (*geglu)(float *y, const float *g, const float *u, int64_t n);
  /* y[i] = tanh(y[i] / cap) · cap (final_logit_softcapping) */
  void (*softcap)(float *y, int64_t n, float cap);
  /* s[j] = scale · Σ_d q[d]·k[j][d] for j < n: one accumulation chain per key */
  void (*dots)(const float *q, const float *const *k, int n, int hd, float scale, float *s);
  /* s[j] = exp(s[j] - m) for j < n (n <= 16); returns their sum */
  float (*exps)(float *s, int n, float m);
  /* One tile (n <= 32 scores) of a head's online softmax: the running max *m and sum *l take
   * the tile in; s[j] = exp(s[j] - new max); returns exp(old max - new max), the factor the
   * head's accumulator takes (0 on a first tile, whose old max is -inf) */
  float (*softmax_tile)(float *s, int n, float *m, float *l);
  /* acc[d] = acc[d]·r + Σ_j p[j]·v[j][d] for d < hd, the keys in order */
  void (*axpys)(float *acc, float r, const float *p, const float *const *v, int n, int hd);
  /* Optional (NULL: two calls of the above): dots and axpys for two heads over the same keys,
   * each head's result the bits of its own call, each key and value row loaded once for both
   * (attention's heads share their KV head, and a tile of keys does not fit in L1). */
  void (*dots2)(const float *q0, const float *q1, const float *const *k, int n, int hd, float scale,
                float *s0, float *s1);
  void (*axpys2)(float *acc0, float r0, const float *p0, float *acc1, float r1, const float *p1,
                 const float *const *v, int n, int hd);
} lm_cpu_vec;

extern const lm_cpu_vec lm_cpu_vec_scalar;
extern const lm_cpu_vec lm_cpu_vec_avx2;
extern const lm_cpu_vec lm_cpu_vec_avx512;

/* The widest table this CPU runs (the matmul's choice of family, cpu_matmul.c). */
const lm_cpu_vec *lm_cpu_vec_best(void);

#endif
