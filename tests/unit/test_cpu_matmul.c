/* test_cpu_matmul.c — lm_cpu_matmul against the scalar reference (lm_weight_dequant_row and
 * a double-precision dot) for every bit width × group × scale dtype, every dense dtype,
 * m ∈ {1, 3, 17, 64} (decode and prefill paths), experts, row sub-ranges, padded strides,
 * accumulate, both precisions, and each kernel family this CPU has (AVX-512 skips at run
 * time when absent). Outputs carry guard sentinels around the written columns.
 *
 * Bounds: F32: |y − ref| ≤ 1e-5·Σ|w·x| (f32 rounding; the order of summation differs).
 * FAST: additionally Σ_k |s_g·q_k|·d_b/2 — each int8 activation is off by at most half its
 * block's step d_b = amax_b/127 — which is the whole error of that path, so it is tight. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_matmul.h"
#include "base/rng.h"
#include "base/status.h"

#define SENTINEL 1234.5f
#define GUARD 16

/* A weight with its own storage. */
typedef struct tw {
  lm_weight w;
  void *data, *scales, *biases;
} tw;

static void tw_free(tw *t) {
  free(t->data);
  free(t->scales);
  free(t->biases);
}

static uint16_t to_dtype16(float f, lm_dtype t) {
  return t == LM_DT_BF16 ? lm_f32_to_bf16(f) : lm_f32_to_f16(f);
}

static void store_f(void *p, lm_dtype t, int64_t i, float f) {
  if (t == LM_DT_F32)
    ((float *)p)[i] = f;
  else
    ((uint16_t *)p)[i] = to_dtype16(f, t);
}

/* Random codes packed LSB-first per row; scales/biases shaped like MLX's quantizer output
 * (bias = −scale·(2^bits−1)/2 ± jitter), so rows are centred and cancellation is exercised. */
static tw make_quant(int64_t rows, int64_t cols, int bits, int group, lm_dtype sdt, int64_t ne,
                     int64_t erows, uint64_t seed) {
  tw t = {0};
  int64_t nstore = (ne ? ne : 1) * erows, rb = cols * bits / 8, ng = cols / group;
  size_t ssz = lm_dtype_size(sdt);
  t.data = calloc((size_t)(nstore * rb), 1);
  t.scales = malloc((size_t)(nstore * ng) * ssz);
  t.biases = malloc((size_t)(nstore * ng) * ssz);
  uint8_t *d = t.data;
  for (int64_t r = 0; r < nstore; r++) {
    for (int64_t c = 0; c < cols; c++) {
      uint64_t q = lm_rng_u64(seed, 1, (uint64_t)(r * cols + c)) & ((1u << bits) - 1u),
               bit = (uint64_t)c * bits;
      for (int b = 0; b < bits; b++)
        if (q >> b & 1) d[r * rb + (int64_t)((bit + b) >> 3)] |= (uint8_t)(1u << ((bit + b) & 7));
    }
    for (int64_t g = 0; g < ng; g++) {
      float s = 0.002f + 0.03f * lm_rng_uniform(seed, 2, (uint64_t)(r * ng + g));
      float jit = 0.5f * (lm_rng_uniform(seed, 3, (uint64_t)(r * ng + g)) - 0.5f);
      store_f(t.scales, sdt, r * ng + g, s);
      store_f(t.biases, sdt, r * ng + g, -s * ((float)((1 << bits) - 1) / 2.0f + jit));
    }
  }
  t.w = (lm_weight){.name = "tq",
                    .n_experts = ne,
                    .rows = rows,
                    .cols = cols,
                    .expert_rows = erows,
                    .dtype = LM_DT_U32,
                    .bits = bits,
                    .group = group,
                    .sdtype = sdt,
                    .data = t.data,
                    .scales = t.scales,
                    .biases = t.biases};
  return t;
}

static tw make_dense(int64_t rows, int64_t cols, lm_dtype dt, int64_t ne, int64_t erows,
                     uint64_t seed) {
  tw t = {0};
  int64_t n = (ne ? ne : 1) * erows * cols;
  t.data = malloc((size_t)n * lm_dtype_size(dt));
  for (int64_t i = 0; i < n; i++)
    store_f(t.data, dt, i, 0.1f * (lm_rng_uniform(seed, 4, (uint64_t)i) - 0.5f));
  t.w = (lm_weight){.name = "td",
                    .n_experts = ne,
                    .rows = rows,
                    .cols = cols,
                    .expert_rows = erows,
                    .dtype = dt,
                    .data = t.data};
  return t;
}

/* Activations with a spread of magnitudes, one all-zero block and one outlier per row. */
static float *make_x(int64_t m, int64_t ldx, int64_t cols, uint64_t seed) {
  float *x = malloc((size_t)(m * ldx) * sizeof(float));
  for (int64_t t = 0; t < m; t++)
    for (int64_t c = 0; c < ldx; c++) {
      float v = 2.0f * lm_rng_uniform(seed, 5, (uint64_t)(t * ldx + c)) - 1.0f;
      if (c >= cols)
        v = NAN; /* past cols: must never be read */
      else if (c >= 32 && c < 64 && cols >= 96)
        v = 0.0f;
      else if (c == (t * 7) % cols)
        v *= 30.0f;
      x[t * ldx + c] = v;
    }
  return x;
}

/* Code k of a packed row, reading only bytes that belong to it. */
static unsigned code_at(const uint8_t *row, int64_t k, int bits) {
  unsigned v = 0;
  for (int b = 0; b < bits; b++) {
    uint64_t bit = (uint64_t)k * bits + b;
    v |= (unsigned)(row[bit >> 3] >> (bit & 7) & 1) << b;
  }
  return v;
}

typedef struct tcase {
  int64_t m, ldx, ldy, row0, nrows, expert;
  int acc;
  lm_cpu_prec prec;
  lm_cpu_isa isa;
} tcase;

/* Runs one case and checks every output against the reference and every guard. */
static void run_case(const lm_weight *w, const tcase *c, const char *label) {
  int64_t cols = w->cols, nr = c->nrows ? c->nrows : w->rows;
  float *x = make_x(c->m, c->ldx, cols, 77 + (uint64_t)c->m);
  int64_t ny = c->m * c->ldy + GUARD;
  float *y = malloc((size_t)ny * sizeof(float)), *init = malloc((size_t)ny * sizeof(float));
  for (int64_t i = 0; i < ny; i++)
    init[i] = y[i] = SENTINEL;
  for (int64_t t = 0; t < c->m; t++)
    for (int64_t r = c->row0; r < c->row0 + nr; r++)
      init[t * c->ldy + r] = y[t * c->ldy + r] = c->acc ? 0.25f * (float)((t + r) % 5) - 0.5f : NAN;
  lm_cpu_matmul_args a = {.y = y,
                          .ldy = c->ldy,
                          .x = x,
                          .ldx = c->ldx,
                          .m = c->m,
                          .w = w,
                          .expert = c->expert,
                          .row0 = c->row0,
                          .nrows = c->nrows,
                          .prec = c->prec,
                          .accumulate = c->acc};
  lm_status s = lm_cpu_matmul_isa(&a, c->isa);
  if (s != LM_OK) fail_msg("%s: %s", label, lm_errmsg());
  float *wr = malloc((size_t)cols * sizeof(float));
  double *step = malloc((size_t)(c->m * cols) * sizeof(double)); /* d_b/2 of each activation */
  for (int64_t t = 0; t < c->m; t++)
    for (int64_t b = 0; b < cols / 32; b++) {
      double amax = 0;
      for (int64_t i = b * 32; i < b * 32 + 32 && i < cols; i++)
        amax = fmax(amax, fabs(x[t * c->ldx + i]));
      for (int64_t i = b * 32; i < b * 32 + 32 && i < cols; i++)
        step[t * cols + i] = amax / 127.0 * 0.5;
    }
  for (int64_t r = c->row0; r < c->row0 + nr; r++) {
    lm_weight_dequant_row(w, c->expert, r, wr);
    for (int64_t t = 0; t < c->m; t++) {
      const float *xt = x + t * c->ldx;
      double ref = 0, mag = 0, qbound = 0;
      for (int64_t k = 0; k < cols; k++) {
        ref += (double)wr[k] * xt[k];
        mag += fabs((double)wr[k] * xt[k]);
      }
      if (c->prec == LM_CPU_PREC_FAST && w->bits) {
        const uint8_t *sp = lm_weight_scale_ptr(w, c->expert, r),
                      *row = lm_weight_row_ptr(w, c->expert, r);
        for (int64_t k = 0; k < cols; k++)
          qbound +=
              fabs(lm_load_f32(sp, w->sdtype, k / w->group) * (double)code_at(row, k, w->bits)) *
              step[t * cols + k];
      }
      double want = (c->acc ? init[t * c->ldy + r] : 0.0) + ref, got = y[t * c->ldy + r];
      double tol = 1e-5 * mag + 1.001 * qbound + 1e-6 * fabs(want) + 1e-30;
      if (!(fabs(got - want) <= tol))
        fail_msg("%s: t=%lld r=%lld: got %.9g want %.9g (tol %.3g, mag %.3g)", label, (long long)t,
                 (long long)r, got, want, tol, mag);
    }
  }
  free(step);
  for (int64_t i = 0; i < ny; i++) {
    int64_t t = i / c->ldy, col = i % c->ldy;
    int inside = t < c->m && col >= c->row0 && col < c->row0 + nr;
    if (!inside && y[i] != SENTINEL) fail_msg("%s: guard %lld overwritten", label, (long long)i);
  }
  free(wr);
  free(x);
  free(y);
  free(init);
}

static const lm_cpu_isa isas[] = {LM_CPU_ISA_SCALAR, LM_CPU_ISA_AVX2, LM_CPU_ISA_AVX512};
static const int64_t ms[] = {1, 3, 17, 64};

/* Varies sub-range, experts, strides and accumulate with the case number so that the cross
 * product stays small while every combination of the other axes meets each of them. */
static void quant_sweep(int bits) {
  static const int groups[] = {32, 64, 128};
  static const lm_dtype sdts[] = {LM_DT_BF16, LM_DT_F16, LM_DT_F32};
  int n = 0;
  for (int gi = 0; gi < 3; gi++)
    for (int si = 0; si < 3; si++) {
      int group = groups[gi];
      /* 4 bits, bf16 scales: rows of more than 16 groups, ending in a partial 128-column chunk
       * where the group allows (the AVX-512 4-bit kernel takes scales 16 groups at a time) */
      int64_t wide = group == 32 ? 21 : group == 64 ? 25 : 19;
      int64_t small = group == 32 ? 160 : group * 3;
      int64_t rows = 37, cols = si == 0 && bits == 4 ? group * wide : small,
              ne = (gi + si) % 2 ? 3 : 0;
      tw t = make_quant(rows, cols, bits, group, sdts[si], ne, ne ? rows + 5 : rows,
                        1000 + (uint64_t)(bits * 9 + n));
      for (size_t ii = 0; ii < 3; ii++) {
        if (!lm_cpu_isa_available(isas[ii])) continue;
        for (size_t mi = 0; mi < 4; mi++)
          for (int p = 0; p < 2; p++, n++) {
            tcase c = {.m = ms[mi],
                       .ldx = cols + (n % 3) * 5,
                       .isa = isas[ii],
                       .prec = (lm_cpu_prec)p,
                       .acc = n % 2,
                       .expert = ne ? n % 3 : 0};
            if (n % 4 >= 2) {
              c.row0 = 5;
              c.nrows = 21;
            }
            c.ldy = (c.nrows ? c.row0 + c.nrows : rows) + (n % 5);
            char label[160];
            snprintf(label, sizeof label,
                     "q%d g%d %s ne%lld m%lld %s %s row0 %lld nrows %lld acc %d", bits, group,
                     lm_dtype_name(sdts[si]), (long long)ne, (long long)c.m, lm_cpu_isa_name(c.isa),
                     p ? "fast" : "f32", (long long)c.row0, (long long)c.nrows, c.acc);
            run_case(&t.w, &c, label);
          }
      }
      tw_free(&t);
    }
}

static void t_q2(void **s) {
  (void)s;
  quant_sweep(2);
}
static void t_q3(void **s) {
  (void)s;
  quant_sweep(3);
}
static void t_q4(void **s) {
  (void)s;
  quant_sweep(4);
}
static void t_q5(void **s) {
  (void)s;
  quant_sweep(5);
}
static void t_q6(void **s) {
  (void)s;
  quant_sweep(6);
}
static void t_q8(void **s) {
  (void)s;
  quant_sweep(8);
}

static void t_dense(void **state) {
  (void)state;
  static const lm_dtype dts[] = {LM_DT_F32, LM_DT_F16, LM_DT_BF16};
  int n = 0;
  for (int di = 0; di < 3; di++) {
    int64_t rows = 29, cols = 203, ne = di == 1 ? 2 : 0;
    tw t = make_dense(rows, cols, dts[di], ne, ne ? rows + 3 : rows, 50 + (uint64_t)di);
    for (size_t ii = 0; ii < 3; ii++) {
      if (!lm_cpu_isa_available(isas[ii])) continue;
      for (size_t mi = 0; mi < 4; mi++)
        for (int p = 0; p < 2; p++, n++) {
          tcase c = {.m = ms[mi],
                     .ldx = cols + n % 4,
                     .isa = isas[ii],
                     .prec = (lm_cpu_prec)p,
                     .acc = n % 2,
                     .expert = ne ? n % 2 : 0};
          if (n % 3 == 1) {
            c.row0 = 3;
            c.nrows = 17;
          }
          c.ldy = (c.nrows ? c.row0 + c.nrows : rows) + n % 3;
          char label[128];
          snprintf(label, sizeof label, "dense %s m%lld %s %s", lm_dtype_name(dts[di]),
                   (long long)c.m, lm_cpu_isa_name(c.isa), p ? "fast" : "f32");
          run_case(&t.w, &c, label);
        }
    }
    tw_free(&t);
  }
}

/* A wide row (down_proj-like) through the decode and prefill paths of every family. */
static void t_wide(void **state) {
  (void)state;
  tw t = make_quant(24, 6144, 4, 64, LM_DT_BF16, 0, 24, 9);
  for (size_t ii = 0; ii < 3; ii++) {
    if (!lm_cpu_isa_available(isas[ii])) continue;
    for (int p = 0; p < 2; p++) {
      int64_t mm[] = {1, 9};
      for (int k = 0; k < 2; k++) {
        tcase c = {.m = mm[k], .ldx = 6144, .ldy = 24, .isa = isas[ii], .prec = (lm_cpu_prec)p};
        run_case(&t.w, &c, "wide q4");
      }
    }
  }
  tw_free(&t);
}

/* Bad arguments come back as errors naming the problem, never a crash. */
static void t_bad_args(void **state) {
  (void)state;
  tw t = make_quant(8, 64, 4, 64, LM_DT_BF16, 2, 8, 3);
  float x[2 * 64] = {0}, y[2 * 8];
  lm_cpu_matmul_args ok = {.y = y, .ldy = 8, .x = x, .ldx = 64, .m = 2, .w = &t.w};
  assert_int_equal(lm_cpu_matmul(&ok), LM_OK);
  struct {
    const char *what;
    lm_status want;
    lm_cpu_matmul_args a;
    lm_weight w;
  } rows[] = {
      {"NULL x", LM_ERR_INVALID, ok, t.w},       {"expert 2 of 2", LM_ERR_INVALID, ok, t.w},
      {"expert -1", LM_ERR_INVALID, ok, t.w},    {"row range", LM_ERR_INVALID, ok, t.w},
      {"negative m", LM_ERR_INVALID, ok, t.w},   {"ldx < cols", LM_ERR_INVALID, ok, t.w},
      {"ldy < rows", LM_ERR_INVALID, ok, t.w},   {"7-bit", LM_ERR_UNSUPPORTED, ok, t.w},
      {"group 48", LM_ERR_UNSUPPORTED, ok, t.w}, {"cols % group", LM_ERR_INVALID, ok, t.w},
      {"dense U8", LM_ERR_UNSUPPORTED, ok, t.w}, {"precision 5", LM_ERR_INVALID, ok, t.w},
      {"no scales", LM_ERR_INVALID, ok, t.w},    {"expert_rows < rows", LM_ERR_INVALID, ok, t.w},
  };
  rows[0].a.x = NULL;
  rows[1].a.expert = 2;
  rows[2].a.expert = -1;
  rows[3].a.row0 = 4, rows[3].a.nrows = 5;
  rows[4].a.m = -1;
  rows[5].a.ldx = 63;
  rows[6].a.ldy = 7;
  rows[7].w.bits = 7;
  rows[8].w.group = 48;
  rows[9].w.cols = 96;
  rows[10].w.bits = 0, rows[10].w.dtype = LM_DT_U8;
  rows[11].a.prec = (lm_cpu_prec)5;
  rows[12].w.scales = NULL;
  rows[13].w.expert_rows = 7;
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    rows[i].a.w = &rows[i].w;
    lm_status s = lm_cpu_matmul(&rows[i].a);
    if (s != rows[i].want)
      fail_msg("%s: status %s (%s)", rows[i].what, lm_status_name(s), lm_errmsg());
    assert_true(strlen(lm_errmsg()) > 0);
  }
  assert_int_equal(lm_cpu_matmul(NULL), LM_ERR_INVALID);
  assert_int_equal(lm_cpu_matmul_isa(&ok, (lm_cpu_isa)9), LM_ERR_INVALID);
  if (!lm_cpu_isa_available(LM_CPU_ISA_AVX512))
    assert_int_equal(lm_cpu_matmul_isa(&ok, LM_CPU_ISA_AVX512), LM_ERR_UNSUPPORTED);
  ok.m = 0; /* nothing to do is fine */
  assert_int_equal(lm_cpu_matmul(&ok), LM_OK);
  char info[512];
  lm_cpu_kernels_info(info, sizeof info);
  assert_non_null(strstr(info, lm_cpu_isa_name(LM_CPU_ISA_AUTO)));
  tw_free(&t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(t_bad_args), cmocka_unit_test(t_dense), cmocka_unit_test(t_q4),
      cmocka_unit_test(t_q8),       cmocka_unit_test(t_q2),    cmocka_unit_test(t_q3),
      cmocka_unit_test(t_q5),       cmocka_unit_test(t_q6),    cmocka_unit_test(t_wide),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
