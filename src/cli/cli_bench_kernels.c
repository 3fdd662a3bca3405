/* cli_bench_kernels.c — `lumen bench-kernels`: a micro-benchmark of the CPU matmul kernels on
 * random weights of the Gemma 4 E2B shapes (hidden 1536). Decode (m = 1) is reported in GB/s
 * of weight bytes read against the machine's measured read bandwidth; prefill (m = 128) in
 * GFLOP/s of useful work (2·m·rows·cols). Weights are replicated so that one pass over the
 * copies exceeds the last-level cache: a decode step streams every weight from memory. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_matmul.h"
#include "base/rng.h"
#include "cli/cli.h"

#define LM_BK_COLD_BYTES ((int64_t)128 << 20)

typedef struct lm_bk_shape {
  const char *name;
  int64_t rows, cols;
} lm_bk_shape;

static const lm_bk_shape lm_bk_shapes[] = {
    {"q", 2048, 1536},        {"kv", 256, 1536},           {"o", 1536, 2048},
    {"gate_up", 6144, 1536},  {"gate_up_2x", 12288, 1536}, {"down", 1536, 6144},
    {"down_2x", 1536, 12288}, {"head", 262144, 1536},
};

typedef struct lm_bk_opts {
  int bits, group, m, reps, all_isas;
  const char *isa, *shapes;
  double min_time;
} lm_bk_opts;

/* `copies` identical random quantized matrices laid out back to back. */
typedef struct lm_bk_weight {
  lm_weight w[64];
  int copies;
  uint8_t *mem;
} lm_bk_weight;

static int lm_bk_make(lm_bk_weight *b, const lm_bk_shape *s, int bits, int group) {
  int64_t cb = s->rows * s->cols * bits / 8, ng = s->cols / group, sb = s->rows * ng * 2;
  int64_t one = cb + 2 * sb;
  b->copies = (int)((LM_BK_COLD_BYTES + one - 1) / one);
  if (b->copies > 64) b->copies = 64;
  b->mem = malloc((size_t)(one * b->copies));
  if (!b->mem) return -1;
  uint8_t *codes = b->mem;
  uint16_t *sc = (uint16_t *)(void *)(b->mem + cb), *bi = sc + s->rows * ng;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < cb / 8; i++) {
    uint64_t v = lm_rng_u64(7, 1, (uint64_t)i);
    memcpy(codes + 8 * i, &v, 8);
  }
  for (int64_t i = 0; i < s->rows * ng; i++) {
    float sv = 0.001f + 0.02f * lm_rng_uniform(7, 2, (uint64_t)i);
    sc[i] = lm_f32_to_bf16(sv);
    bi[i] = lm_f32_to_bf16(-sv * (float)((1 << bits) - 1) / 2.0f);
  }
  for (int c = 0; c < b->copies; c++) {
    uint8_t *base = b->mem + one * c;
    if (c) memcpy(base, b->mem, (size_t)one);
    b->w[c] = (lm_weight){.name = s->name,
                          .rows = s->rows,
                          .cols = s->cols,
                          .expert_rows = s->rows,
                          .dtype = LM_DT_U32,
                          .bits = bits,
                          .group = group,
                          .sdtype = LM_DT_BF16,
                          .data = base,
                          .scales = base + cb,
                          .biases = base + cb + sb};
  }
  return 0;
}

/* Median seconds per call over the copies, at least `reps` calls and min_time seconds. */
static double lm_bk_time(lm_bk_weight *b, const float *x, float *y, int64_t m, lm_cpu_prec prec,
                         lm_cpu_isa isa, const lm_bk_opts *o, int *ok) {
  double t[256];
  int n = 0;
  if (!*ok) return 1.0; /* an earlier call failed and said why */
  double start = omp_get_wtime();
  for (int i = 0; n < 256 && (n < o->reps || omp_get_wtime() - start < o->min_time); i++) {
    lm_cpu_matmul_args a = {.y = y,
                            .ldy = b->w[0].rows,
                            .x = x,
                            .ldx = b->w[0].cols,
                            .m = m,
                            .w = &b->w[i % b->copies],
                            .prec = prec};
    double t0 = omp_get_wtime();
    if (lm_cpu_matmul_isa(&a, isa) != LM_OK) {
      fprintf(stderr, "bench-kernels: %s\n", lm_errmsg());
      *ok = 0;
      return 1.0;
    }
    t[n++] = omp_get_wtime() - t0;
  }
  for (int i = 1; i < n; i++) /* insertion sort: n ≤ 256 */
    for (int k = i; k > 0 && t[k] < t[k - 1]; k--) {
      double s = t[k];
      t[k] = t[k - 1];
      t[k - 1] = s;
    }
  return t[n / 2];
}

static int lm_bk_parse(int argc, char **argv, lm_bk_opts *o) {
  *o = (lm_bk_opts){
      .bits = 4, .group = 64, .m = 128, .reps = 5, .isa = NULL, .shapes = NULL, .min_time = 0.3};
  for (int i = 1; i < argc; i += 2) { /* flags take one value each */
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) return 1;
    if (!v) return -1;
    if (!strcmp(a, "--bits"))
      o->bits = atoi(v);
    else if (!strcmp(a, "--group"))
      o->group = atoi(v);
    else if (!strcmp(a, "--m"))
      o->m = atoi(v);
    else if (!strcmp(a, "--reps"))
      o->reps = atoi(v);
    else if (!strcmp(a, "--min-time"))
      o->min_time = atof(v);
    else if (!strcmp(a, "--isa"))
      o->isa = v;
    else if (!strcmp(a, "--shapes"))
      o->shapes = v;
    else
      return -1;
  }
  int bits_ok = o->bits >= 2 && o->bits <= 8 && o->bits != 7,
      group_ok = o->group == 32 || o->group == 64 || o->group == 128;
  return bits_ok && group_ok && o->m > 0 && o->m <= 4096 && o->reps > 0 && o->reps <= 256 ? 0 : -1;
}

static int lm_bk_want_shape(const lm_bk_opts *o, const char *name) {
  if (!o->shapes) return 1;
  char buf[256];
  snprintf(buf, sizeof buf, ",%s,", o->shapes);
  char key[64];
  snprintf(key, sizeof key, ",%s,", name);
  return strstr(buf, key) != NULL;
}

static int lm_bk_want_isa(const lm_bk_opts *o, lm_cpu_isa isa) {
  if (!lm_cpu_isa_available(isa)) return 0;
  if (!o->isa) return isa != LM_CPU_ISA_SCALAR; /* the generic path is slow; ask for it by name */
  return !strcmp(o->isa, "all") || !strcmp(o->isa, lm_cpu_isa_name(isa));
}

static void lm_bk_usage(FILE *f) {
  fprintf(
      f, "usage: lumen bench-kernels [--bits 4] [--group 64] [--m 128] [--isa "
         "scalar|avx2|avx512|all]\n"
         "                           [--shapes q,kv,o,gate_up,gate_up_2x,down,down_2x,head] "
         "[--reps 5]\n"
         "                           [--min-time 0.3]\n"
         "Times lm_cpu_matmul on random E2B-shaped weights: GB/s at m=1, GFLOP/s at --m (the head\n"
         "only at m=1). Threads: OMP_NUM_THREADS.\n");
}

static int lm_bk_run_shape(const lm_bk_shape *s, const lm_bk_opts *o, double bw, float *x,
                           float *y) {
  lm_bk_weight b;
  if (lm_bk_make(&b, s, o->bits, o->group)) {
    fprintf(stderr, "bench-kernels: out of memory for %s\n", s->name);
    return 1;
  }
  double gb = (double)lm_weight_bytes(&b.w[0]) / 1e9,
         flop = 2.0 * o->m * (double)s->rows * (double)s->cols;
  int ok = 1, prefill = strcmp(s->name, "head") != 0;
  for (int isa = LM_CPU_ISA_SCALAR; isa < LM_CPU_ISA_COUNT && ok; isa++) {
    if (!lm_bk_want_isa(o, (lm_cpu_isa)isa)) continue;
    double r[4];
    for (int p = 0; p < 2; p++) {
      r[p] = gb / lm_bk_time(&b, x, y, 1, (lm_cpu_prec)p, (lm_cpu_isa)isa, o, &ok);
      r[2 + p] =
          prefill ? flop / 1e9 / lm_bk_time(&b, x, y, o->m, (lm_cpu_prec)p, (lm_cpu_isa)isa, o, &ok)
                  : 0;
    }
    printf("%-11s %6lldx%-6lld %7.1f  %-7s %7.1f (%3.0f%%) %7.1f (%3.0f%%)", s->name,
           (long long)s->rows, (long long)s->cols, gb * 1e3, lm_cpu_isa_name((lm_cpu_isa)isa), r[0],
           100 * r[0] / bw, r[1], 100 * r[1] / bw);
    if (prefill)
      printf("  %9.1f %9.1f\n", r[2], r[3]);
    else
      printf("  %9s %9s\n", "-", "-");
  }
  free(b.mem);
  return ok ? 0 : 1;
}

int lm_cli_bench_kernels(int argc, char **argv) {
  lm_bk_opts o;
  int pr = lm_bk_parse(argc, argv, &o);
  if (pr) {
    lm_bk_usage(pr > 0 ? stdout : stderr);
    return pr > 0 ? 0 : 2;
  }
  char info[512];
  lm_cpu_kernels_info(info, sizeof info);
  double bw = lm_cpu_read_bandwidth_gbs(0);
  printf("%s\nread bandwidth: %.1f GB/s (%d threads); weights q%d g%d bf16 scales\n\n", info, bw,
         omp_get_max_threads(), o.bits, o.group);
  printf("%-11s %13s %7s  %-7s %15s %15s  %9s %9s\n", "shape", "rows x cols", "MB", "isa",
         "m=1 F32 GB/s", "m=1 FAST GB/s", "F32 GF/s", "FAST GF/s");
  int64_t maxc = 12288;
  float *x = malloc((size_t)(o.m * maxc) * sizeof(float)),
        *y = malloc((size_t)(o.m * maxc > 262144 ? o.m * maxc : 262144) * sizeof(float));
  if (!x || !y) {
    fprintf(stderr, "bench-kernels: out of memory\n");
    free(x);
    free(y);
    return 1;
  }
  for (int64_t i = 0; i < o.m * maxc; i++)
    x[i] = 2.0f * lm_rng_uniform(3, 0, (uint64_t)i) - 1.0f;
  int rc = 0;
  for (size_t i = 0; i < sizeof lm_bk_shapes / sizeof lm_bk_shapes[0] && !rc; i++)
    if (lm_bk_want_shape(&o, lm_bk_shapes[i].name))
      rc = lm_bk_run_shape(&lm_bk_shapes[i], &o, bw, x, y);
  free(x);
  free(y);
  return rc;
}
