/* test_cpu_vec.c — the CPU backend's vector math (cpu_vec.h), every table this CPU runs:
 * GeGLU, the soft cap and exp within a few ulp of the double-precision formulas over the
 * whole range they see (tails, zero, huge, NaN); the attention loops and a softmax tile
 * against plain loops; and every element computed the same whatever the length of the call
 * and its place in it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "backend/cpu/cpu_matmul.h"
#include "backend/cpu/cpu_vec.h"
#include "base/rng.h"

#define N 4099 /* a length no vector width divides */

/* The tables this CPU can run. */
static int tables(const lm_cpu_vec **t) {
  int n = 0;
  t[n++] = &lm_cpu_vec_scalar;
#if defined(__x86_64__)
  if (lm_cpu_isa_available(LM_CPU_ISA_AVX2)) t[n++] = &lm_cpu_vec_avx2;
  if (lm_cpu_isa_available(LM_CPU_ISA_AVX512)) t[n++] = &lm_cpu_vec_avx512;
#endif
  return n;
}

static double gelu_ref(double x) {
  return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

/* |got - want| in units of the f32 spacing at want (that of the smallest normal below it). */
static double ulps(float got, double want) {
  double unit = (fabs(want) > 0x1p-126 ? fabs(want) : 0x1p-126) * 0x1p-23;
  return fabs((double)got - want) / unit;
}

static void fill(float *x, int n, float lo, float hi, uint64_t seed) {
  for (int i = 0; i < n; i++)
    x[i] = lo + (hi - lo) * lm_rng_uniform(seed, 0, (uint64_t)i);
}

static void t_geglu_softcap(void **st) {
  (void)st;
  const lm_cpu_vec *t[3];
  int nt = tables(t);
  static float g[N], u[N], y[N], c[N];
  fill(g, N, -12.0f, 12.0f, 1);
  fill(u, N, -2.0f, 2.0f, 2);
  g[0] = 0.0f, g[1] = -0.0f, g[2] = 1e-20f, g[3] = -30.0f, g[4] = 30.0f, g[5] = 1e30f;
  for (int k = 0; k < nt; k++) {
    t[k]->geglu(y, g, u, N);
    double worst = 0;
    for (int i = 0; i < N; i++) {
      double want = gelu_ref(g[i]) * u[i];
      /* the product with u and the cancellation of 1 + tanh for x << 0 cost a few ulp of the
       * larger terms; measure against the size of the terms, not of the result */
      double scale = fabs(0.5 * g[i] * u[i]) * 0x1p-23 + 1e-37;
      double e = fabs((double)y[i] - want) / scale;
      if (e > worst) worst = e;
    }
    printf("%-6s geglu: worst %.1f ulp of 0.5·x·u\n", t[k]->name, worst);
    assert_true(worst < 8.0);
    memcpy(c, g, sizeof c);
    t[k]->softcap(c, N, 30.0f);
    worst = 0;
    for (int i = 0; i < N; i++) {
      double e = ulps(c[i], tanh((double)g[i] / 30.0) * 30.0);
      if (e > worst) worst = e;
    }
    printf("%-6s softcap: worst %.1f ulp\n", t[k]->name, worst);
    assert_true(worst < 6.0);
    float nan[3] = {NAN, -INFINITY, INFINITY}, one[3] = {1, 1, 1}, out[3];
    t[k]->geglu(out, nan, one, 3);
    assert_true(isnan(out[0]) && out[2] == INFINITY); /* -inf: NaN, as torch's formula gives */
    t[k]->softcap(nan, 3, 30.0f); /* a NaN logit stays NaN; ±inf caps to ±30 */
    assert_true(isnan(nan[0]) && nan[1] == -30.0f && nan[2] == 30.0f);
  }
}

static void t_exps(void **st) {
  (void)st;
  const lm_cpu_vec *t[3];
  int nt = tables(t);
  float s[16], x[16];
  for (int k = 0; k < nt; k++) {
    double worst = 0;
    for (int rep = 0; rep < 2000; rep++) {
      int n = 1 + rep % 16;
      fill(x, n, -100.0f, 0.0f, 100 + (uint64_t)rep);
      memcpy(s, x, sizeof s);
      float sum = t[k]->exps(s, n, 0.0f), want_sum = 0;
      for (int j = 0; j < n; j++) {
        double want = exp((double)x[j]);
        want_sum += s[j];
        if (want < 0x1p-125) { /* at the edge of the normal range: 0 or within 2^-125 */
          assert_true(s[j] >= 0.0f && s[j] <= 0x1p-125);
          continue;
        }
        double e = ulps(s[j], want);
        if (e > worst) worst = e;
      }
      assert_true(fabsf(sum - want_sum) <= 1e-6f * (want_sum + 1e-30f));
    }
    printf("%-6s exps: worst %.1f ulp\n", t[k]->name, worst);
    assert_true(worst < 3.0);
    s[0] = -INFINITY, s[1] = NAN, s[2] = 0.0f;
    t[k]->exps(s, 3, 0.0f);
    assert_true(s[0] == 0.0f && isnan(s[1]) && s[2] == 1.0f);
  }
}

/* Each element's value does not depend on how long the call is or where the element sits. */
static void t_position_free(void **st) {
  (void)st;
  const lm_cpu_vec *t[3];
  int nt = tables(t);
  static float g[N], u[N], y[N], y1[40];
  fill(g, N, -6.0f, 6.0f, 3);
  fill(u, N, -1.0f, 1.0f, 4);
  for (int k = 0; k < nt; k++) {
    t[k]->geglu(y, g, u, N);
    for (int off = 0; off < 37; off += 5)
      for (int n = 1; n <= 19; n += 3) {
        t[k]->geglu(y1, g + off, u + off, n);
        assert_memory_equal(y1, y + off, (size_t)n * sizeof(float));
      }
  }
}

/* dots and axpys against plain loops (float sums in another order: a relative 1e-5), a key's
 * score the same whichever of a tile's places it takes, and the two-head forms (dots2, axpys2)
 * giving each head the bits of its own call. */
static void t_attention_loops(void **st) {
  (void)st;
  const lm_cpu_vec *t[3];
  int nt = tables(t);
  enum { HD = 72, NK = 13 };
  static float q[HD], kv[NK][HD], acc[HD], acc0[HD];
  fill(q, HD, -1.0f, 1.0f, 5);
  for (int j = 0; j < NK; j++)
    fill(kv[j], HD, -1.0f, 1.0f, 10 + (uint64_t)j);
  fill(acc0, HD, -1.0f, 1.0f, 6);
  const float *k[NK];
  float p[NK], s[NK], s1;
  for (int j = 0; j < NK; j++) {
    k[j] = kv[j];
    p[j] = 0.05f * (float)(j + 1);
  }
  for (int i = 0; i < nt; i++) {
    t[i]->dots(q, k, NK, HD, 0.5f, s);
    for (int j = 0; j < NK; j++) {
      double want = 0;
      for (int d = 0; d < HD; d++)
        want += (double)q[d] * kv[j][d];
      assert_true(fabs(s[j] - 0.5 * want) < 1e-5);
      t[i]->dots(q, &k[j], 1, HD, 0.5f, &s1); /* alone: the same bits */
      assert_memory_equal(&s1, &s[j], sizeof s1);
    }
    memcpy(acc, acc0, sizeof acc);
    t[i]->axpys(acc, 0.75f, p, k, NK, HD);
    for (int d = 0; d < HD; d++) {
      double want = 0.75 * acc0[d];
      for (int j = 0; j < NK; j++)
        want += (double)p[j] * kv[j][d];
      assert_true(fabs(acc[d] - want) < 1e-5);
    }
    if (!t[i]->dots2) continue;
    /* two heads at once: each head's bits are those of its own call */
    static float q1[HD], accb[HD], acc2a[HD], acc2b[HD];
    float p1[NK], sa[NK], sb[NK], s1b[NK];
    fill(q1, HD, -1.0f, 1.0f, 7);
    for (int j = 0; j < NK; j++)
      p1[j] = 0.03f * (float)(NK - j);
    t[i]->dots2(q, q1, k, NK, HD, 0.5f, sa, sb);
    t[i]->dots(q1, k, NK, HD, 0.5f, s1b);
    assert_memory_equal(sa, s, sizeof s);
    assert_memory_equal(sb, s1b, sizeof sb);
    memcpy(acc2a, acc0, sizeof acc2a);
    memcpy(acc2b, acc0, sizeof acc2b);
    memcpy(accb, acc0, sizeof accb);
    t[i]->axpys2(acc2a, 0.75f, p, acc2b, 0.5f, p1, k, NK, HD);
    t[i]->axpys(accb, 0.5f, p1, k, NK, HD);
    assert_memory_equal(acc2a, acc, sizeof acc);
    assert_memory_equal(acc2b, accb, sizeof accb);
  }
}

/* One tile of the online softmax: the new max, the sum and the factor of the old max. */
static void t_softmax_tile(void **st) {
  (void)st;
  const lm_cpu_vec *t[3];
  int nt = tables(t);
  for (int i = 0; i < nt; i++)
    for (int n = 1; n <= 32; n++) {
      float s[32], x[32], m = n % 3 ? 1.5f : -INFINITY, l = n % 3 ? 2.0f : 0.0f;
      fill(x, n, -8.0f, 8.0f, 50 + (uint64_t)n);
      memcpy(s, x, sizeof s);
      float m0 = m, l0 = l, r = t[i]->softmax_tile(s, n, &m, &l);
      double mt = m0;
      for (int j = 0; j < n; j++)
        mt = x[j] > mt ? x[j] : mt;
      double want_r = exp((double)m0 - mt), sum = 0;
      for (int j = 0; j < n; j++) {
        double e = exp((double)x[j] - mt);
        sum += e;
        assert_true(ulps(s[j], e) < 3.0);
      }
      assert_true(m == (float)mt);
      assert_true(fabs(r - want_r) <= 1e-6 * want_r + 1e-38);
      assert_true(fabs(l - (l0 * want_r + sum)) <= 1e-6 * (l0 * want_r + sum));
    }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(t_geglu_softcap), cmocka_unit_test(t_exps),
      cmocka_unit_test(t_position_free), cmocka_unit_test(t_attention_loops),
      cmocka_unit_test(t_softmax_tile),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
