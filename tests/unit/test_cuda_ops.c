/* test_cuda_ops.c — every op of the CUDA backend against the CPU backend (the reference) on
 * seeded random inputs of odd shapes, in both activation dtypes (f32: the parity path; bf16:
 * the fast path, inputs rounded to bf16 on the device). Each device output carries guard
 * sentinels in its row padding and after its last row; they must come back unchanged.
 * Scores are NMSE = Σ(gpu − cpu)² / Σ cpu²: f32 ≤ 1e-10 (elementwise/norms) and ≤ 1e-9
 * (reductions over thousands of terms, attention); bf16 ≤ 2e-5 (one rounding of a value at
 * 2^-9 relative gives ~3e-6) and ≤ 1e-4 where bf16 inputs feed long reductions. Exact ops
 * (argmax, routing ids, gather) must match exactly in f32. Quantized caches must match exactly
 * in both dtypes (inputs are bf16 values in the bf16 runs, so both backends quantize the same
 * numbers): stage bytes, the K/V values kv_stage leaves, and every cache's codes/scales/biases.
 * Skips (exit 0) when the build has no CUDA backend or the machine has no GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "base/rng.h"
#include "base/status.h"
#include "kv/batch.h"
#include "kv/kv.h"
#include "model/logit_stats.h"
#ifdef LM_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_kernels.h"
#endif

#define GUARD 32
#define PAD 3

typedef struct env {
  lm_backend *cpu, *gpu;
} env;

static uint64_t g_seed = 1;

static float urand(void) { return 2.0f * lm_rng_uniform(7, 11, g_seed++) - 1.0f; }

static float *rand_vec(int64_t n, float scale) {
  float *v = malloc((size_t)n * sizeof *v);
  for (int64_t i = 0; i < n; i++)
    v[i] = urand() * scale;
  return v;
}

/* ---- device buffers with sentinels ------------------------------------------------------ */

typedef struct dbuf {
  lm_tensor t;
  int64_t n; /* elements in the allocation: rows*ld + GUARD */
} dbuf;

static uint32_t sentinel_bits(lm_dtype dt) {
  return dt == LM_DT_BF16 ? lm_f32_to_bf16(1234.5f) : dt == LM_DT_I32 ? 0x7f7f7f7fu : 0x449a5000u;
}

static void put_elem(void *p, lm_dtype dt, int64_t i, float v) {
  if (dt == LM_DT_BF16)
    ((uint16_t *)p)[i] = lm_f32_to_bf16(v);
  else if (dt == LM_DT_I32)
    ((int32_t *)p)[i] = (int32_t)v;
  else
    ((float *)p)[i] = v;
}

static void put_bits(void *p, lm_dtype dt, int64_t i, uint32_t b) {
  if (dt == LM_DT_BF16)
    ((uint16_t *)p)[i] = (uint16_t)b;
  else
    memcpy((char *)p + 4 * i, &b, 4);
}

static uint32_t get_bits(const void *p, lm_dtype dt, int64_t i) {
  uint32_t b = 0;
  if (dt == LM_DT_BF16) return ((const uint16_t *)p)[i];
  memcpy(&b, (const char *)p + 4 * i, 4);
  return b;
}

/* [rows][cols] with ld = cols + PAD; vals (f32, [rows][cols]) or NULL for an output. */
/* A device buffer [rows][cols] with row stride ld, guarded by sentinels. */
static dbuf dput_ld(lm_backend *be, int64_t rows, int64_t cols, int64_t ld, lm_dtype dt,
                    const float *vals) {
  dbuf b = {.t = {.rows = rows, .cols = cols, .ld = ld, .dtype = dt}};
  b.n = rows * b.t.ld + GUARD;
  size_t es = lm_dtype_size(dt);
  void *h = malloc((size_t)b.n * es);
  for (int64_t i = 0; i < b.n; i++)
    put_bits(h, dt, i, sentinel_bits(dt));
  for (int64_t r = 0; vals && r < rows; r++)
    for (int64_t c = 0; c < cols; c++)
      put_elem(h, dt, r * b.t.ld + c, vals[r * cols + c]);
  assert_int_equal(be->ops->alloc(be, (size_t)b.n * es, &b.t.data), LM_OK);
  assert_int_equal(be->ops->upload(be, b.t.data, h, (size_t)b.n * es), LM_OK);
  free(h);
  return b;
}

static dbuf dput(lm_backend *be, int64_t rows, int64_t cols, lm_dtype dt, const float *vals) {
  return dput_ld(be, rows, cols, cols + PAD, dt, vals);
}

/* Values of b as f32 [rows][cols]; fails the test if a sentinel moved. */
static float *dget(lm_backend *be, dbuf *b) {
  size_t es = lm_dtype_size(b->t.dtype);
  void *h = malloc((size_t)b->n * es);
  assert_int_equal(be->ops->download(be, h, b->t.data, (size_t)b->n * es), LM_OK);
  float *v = malloc((size_t)(b->t.rows * b->t.cols + 1) * sizeof *v);
  int64_t bad = 0;
  for (int64_t i = 0; i < b->n; i++) {
    int64_t r = i / b->t.ld, c = i % b->t.ld;
    if (r < b->t.rows && c < b->t.cols) {
      uint32_t bits = get_bits(h, b->t.dtype, i);
      float f;
      if (b->t.dtype == LM_DT_BF16)
        f = lm_bf16_to_f32((uint16_t)bits);
      else if (b->t.dtype == LM_DT_I32)
        f = (float)(int32_t)bits;
      else
        memcpy(&f, &bits, 4);
      v[r * b->t.cols + c] = f;
    } else {
      bad += get_bits(h, b->t.dtype, i) != sentinel_bits(b->t.dtype);
    }
  }
  free(h);
  if (bad) fprintf(stderr, "  %lld guard sentinels overwritten\n", (long long)bad);
  assert_int_equal(bad, 0);
  be->ops->free(be, b->t.data);
  b->t.data = NULL;
  return v;
}

static void dfree(lm_backend *be, dbuf *b) {
  be->ops->free(be, b->t.data);
  b->t.data = NULL;
}

/* A host f32 tensor for the CPU backend (same padding). */
static lm_tensor htensor(int64_t rows, int64_t cols, const float *vals) {
  lm_tensor t = {.rows = rows, .cols = cols, .ld = cols + PAD, .dtype = LM_DT_F32};
  float *d = calloc((size_t)(rows * t.ld + 1), sizeof *d);
  for (int64_t r = 0; vals && r < rows; r++)
    memcpy(d + r * t.ld, vals + r * cols, (size_t)cols * sizeof *d);
  t.data = d;
  return t;
}

static float *hget(lm_tensor t) { /* packs and frees */
  float *v = malloc((size_t)(t.rows * t.cols + 1) * sizeof *v);
  for (int64_t r = 0; r < t.rows; r++)
    memcpy(v + r * t.cols, (float *)t.data + r * t.ld, (size_t)t.cols * sizeof *v);
  free(t.data);
  return v;
}

static double nmse(const float *got, const float *ref, int64_t n) {
  double e = 0, s = 0;
  for (int64_t i = 0; i < n; i++) {
    if (!isfinite(got[i])) return INFINITY;
    e += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]);
    s += (double)ref[i] * ref[i];
  }
  return s > 0 ? e / s : e;
}

static void expect_close(const char *what, const float *got, const float *ref, int64_t n,
                         double bound) {
  double e = nmse(got, ref, n);
  printf("  %-44s nmse %.3g (bound %.3g)%s\n", what, e, bound, e <= bound ? "" : "  FAIL");
  assert_true(e <= bound);
}

static double bound_for(const lm_backend *gpu, double f32, double bf16) {
  return gpu->act_dtype == LM_DT_F32 ? f32 : bf16;
}

/* ---- weights ------------------------------------------------------------------------------ */

typedef struct hweight {
  lm_weight w;
  void *data, *scales, *biases;
} hweight;

static void store_dt(void *p, lm_dtype t, int64_t i, float f) {
  if (t == LM_DT_F32)
    ((float *)p)[i] = f;
  else
    ((uint16_t *)p)[i] = t == LM_DT_BF16 ? lm_f32_to_bf16(f) : lm_f32_to_f16(f);
}

/* bits 0: dense of dtype dt; else MLX affine codes (LSB-first) with sdt scales/biases. */
static hweight make_weight(int64_t ne, int64_t rows, int64_t cols, int bits, int group,
                           lm_dtype dt) {
  hweight h = {0};
  int64_t nr = (ne ? ne : 1) * rows;
  h.w = (lm_weight){
      .name = "test.weight", .n_experts = ne, .rows = rows, .cols = cols, .expert_rows = rows};
  if (!bits) {
    h.w.dtype = dt;
    h.data = malloc((size_t)(nr * cols) * lm_dtype_size(dt));
    float a = 1.0f / sqrtf((float)cols);
    for (int64_t i = 0; i < nr * cols; i++)
      store_dt(h.data, dt, i, urand() * a);
  } else {
    int64_t rb = cols * bits / 8, ng = cols / group;
    h.w.dtype = LM_DT_U32;
    h.w.bits = bits;
    h.w.group = group;
    h.w.sdtype = dt;
    h.data = calloc((size_t)(nr * rb) + 8, 1);
    h.scales = malloc((size_t)(nr * ng) * lm_dtype_size(dt));
    h.biases = malloc((size_t)(nr * ng) * lm_dtype_size(dt));
    uint8_t *d = h.data;
    for (int64_t r = 0; r < nr; r++)
      for (int64_t c = 0; c < cols; c++) {
        uint64_t q = lm_rng_u64(3, 5, g_seed++) & ((1u << bits) - 1u), bit = (uint64_t)c * bits;
        uint64_t *word = (uint64_t *)(d + r * rb + (bit >> 3));
        uint64_t v;
        memcpy(&v, word, 8); /* the 8 spare bytes at the end keep this in bounds */
        v |= q << (bit & 7);
        memcpy(word, &v, 8);
      }
    float a = 2.0f / sqrtf((float)cols) / (float)((1 << bits) - 1);
    for (int64_t i = 0; i < nr * ng; i++) {
      float s = a * (0.75f + 0.5f * lm_rng_uniform(9, 9, g_seed++));
      store_dt(h.scales, dt, i, s);
      store_dt(h.biases, dt, i, -s * (float)((1 << bits) - 1) / 2.0f + 0.1f * s * urand());
    }
  }
  h.w.data = h.data;
  h.w.scales = h.scales;
  h.w.biases = h.biases;
  return h;
}

static hweight make_vector(int64_t n, float base) {
  hweight h = {0};
  float *v = malloc((size_t)n * sizeof *v);
  for (int64_t i = 0; i < n; i++)
    v[i] = base + 0.3f * urand();
  h.data = v;
  h.w = (lm_weight){
      .name = "test.vector", .rows = 1, .cols = n, .expert_rows = 1, .dtype = LM_DT_F32, .data = v};
  return h;
}

static void hweight_free(hweight *h) {
  free(h->data);
  free(h->scales);
  free(h->biases);
}

/* ---- steps -------------------------------------------------------------------------------- */

/* A batch over n_seqs sequences with their own cache sets on each backend. */
typedef struct step_env {
  int n_seqs, n_caches;
  lm_kv_set *kc[4], *kg[4];
  int32_t ids[512], pos[512], seq[512], rows[512];
  lm_batch bc, bg;
} step_env;

/* Sequence i's caches are specs[i*stride ...]: stride 0 gives every sequence the same kinds. */
static void step_env_init_strided(env *e, step_env *s, int n_seqs, const lm_kv_spec *specs,
                                  int n_caches, int stride) {
  memset(s, 0, sizeof *s);
  s->n_seqs = n_seqs;
  s->n_caches = n_caches;
  for (int i = 0; i < n_seqs; i++) {
    assert_int_equal(lm_kv_set_create(e->cpu, specs + i * stride, n_caches, &s->kc[i]), LM_OK);
    assert_int_equal(lm_kv_set_create(e->gpu, specs + i * stride, n_caches, &s->kg[i]), LM_OK);
  }
}

static void step_env_init(env *e, step_env *s, int n_seqs, const lm_kv_spec *specs, int n_caches) {
  step_env_init_strided(e, s, n_seqs, specs, n_caches, 0);
}

static void step_env_free(step_env *s) {
  for (int i = 0; i < s->n_seqs; i++) {
    lm_kv_set_free(s->kc[i]);
    lm_kv_set_free(s->kg[i]);
  }
}

/* Lays out counts[i] tokens of sequence i (in order) continuing each cache set; reserves. */
static int step_batch(step_env *s, const int *counts, int n_logits) {
  int T = 0;
  for (int i = 0; i < s->n_seqs; i++) {
    int64_t len = lm_kv_set_len(s->kc[i]);
    assert_int_equal(lm_kv_set_reserve(s->kc[i], counts[i]), LM_OK);
    assert_int_equal(lm_kv_set_reserve(s->kg[i], counts[i]), LM_OK);
    for (int j = 0; j < counts[i]; j++, T++) {
      s->ids[T] = (int32_t)(T * 7 % 50);
      s->pos[T] = (int32_t)(len + j);
      s->seq[T] = i;
    }
  }
  for (int i = 0; i < n_logits; i++)
    s->rows[i] = (int32_t)((i * 5 + 1) % T);
  s->bc = (lm_batch){.n_tokens = T,
                     .ids = s->ids,
                     .pos = s->pos,
                     .seq = s->seq,
                     .n_seqs = s->n_seqs,
                     .kv = s->kc,
                     .n_logits = n_logits,
                     .logit_rows = s->rows};
  s->bg = s->bc;
  s->bg.kv = s->kg;
  return T;
}

/* Two sequences of c0 and c1 tokens over one small ring cache (so that made-up large positions
 * stay inside its slots), positions moved apart by `spread` per token (large RoPE angles; the
 * ops these steps test only read positions), the step begun on both backends; returns T. */
static int ring_step_begin(env *e, step_env *s, int c0, int c1, int n_logits, int spread) {
  lm_kv_spec spec = {.kind = LM_KV_ROTATING_PLAIN, .n_kv_heads = 1, .head_dim = 8, .window = 8};
  step_env_init(e, s, 2, &spec, 1);
  int counts[2] = {c0, c1};
  int T = step_batch(s, counts, n_logits);
  for (int i = 0; i < T; i++)
    s->pos[i] += spread * i;
  assert_int_equal(e->cpu->ops->begin_step(e->cpu, &s->bc), LM_OK);
  assert_int_equal(e->gpu->ops->begin_step(e->gpu, &s->bg), LM_OK);
  return T;
}

/* ---- the tests ---------------------------------------------------------------------------- */

static int setup(void **state, lm_precision prec) {
#ifdef LM_HAVE_CUDA
  if (lm_cuda_device_count() <= 0) return 0;
  env *e = calloc(1, sizeof *e);
  if (lm_backend_cpu_create(LM_PRECISION_F32, 0, &e->cpu) ||
      lm_backend_cuda_create(prec, 0, &e->gpu)) {
    fprintf(stderr, "backend: %s\n", lm_errmsg());
    return -1;
  }
  *state = e;
#else
  (void)prec;
  (void)state;
#endif
  return 0;
}
static int setup_f32(void **state) { return setup(state, LM_PRECISION_F32); }
static int setup_bf16(void **state) { return setup(state, LM_PRECISION_FAST); }
static int teardown(void **state) {
  env *e = *state;
  if (e) {
    lm_backend_destroy(e->gpu);
    lm_backend_destroy(e->cpu);
    free(e);
  }
  return 0;
}

#define NEED_GPU(state)                                                                            \
  env *e = *(state);                                                                               \
  if (!e) {                                                                                        \
    printf("no CUDA device (or no CUDA build): skipped\n");                                        \
    skip();                                                                                        \
  }

#ifdef LM_HAVE_CUDA
/* ---- the kernel picks (cuda_kernels.h): the parameters the op layer hands them ------------- */

static const char *gemv_kind_name(lm_cu_gemv_kind k) {
  static const char *const names[] = {"cuBLAS", "tensor-core gemv", "packed gemv", "dense gemv",
                                      "generic gemv"};
  return k >= 0 && k < LM_CU_GEMV_KINDS ? names[k] : "?";
}

static const char *moe_kind_name(lm_cu_moe_kind k) {
  return k == LM_CU_MOE_GROUPED_PAIR ? "grouped gemv, gate/up fused"
         : k == LM_CU_MOE_GROUPED    ? "grouped gemv"
                                     : "gathered gemm";
}

/* What cuda_matmul.c's gemv_params builds for weight w (as prepare_weight uploads it, its data
 * at `wdata`: device allocations are 256-byte aligned) times x into y, on a device with n_sms
 * SMs and smem_optin bytes of opt-in shared memory per block. */
static lm_cu_mm_p mm_params(const lm_weight *w, const void *wdata, lm_tensor x, lm_tensor y,
                            int n_sms, int smem_optin) {
  int sb = w->sdtype == LM_DT_F32   ? LM_CU_SB_F32
           : w->sdtype == LM_DT_F16 ? LM_CU_SB_F16
                                    : LM_CU_SB_BF16;
  lm_cu_w cw = {.data = wdata,
                .sb = w->bits ? wdata : NULL,
                .n_experts = w->n_experts,
                .rows = w->rows,
                .cols = w->cols,
                .row_bytes = lm_weight_row_bytes(w),
                .bits = w->bits,
                .group = w->group,
                .wdt = (int)w->dtype,
                .sb_kind = w->bits ? sb : 0};
  return (lm_cu_mm_p){
      .w = cw,
      .x = {.p = x.data, .rows = x.rows, .cols = x.cols, .ld = x.ld, .dt = (int)x.dtype},
      .y = {.p = y.data, .rows = y.rows, .cols = y.cols, .ld = y.ld, .dt = (int)y.dtype},
      .grid_cap = 4 * n_sms,
      .smem_optin = smem_optin};
}

/* The same, with the SM count and shared memory of device 0. */
static lm_cu_mm_p dev_params(const lm_weight *w, lm_tensor x, lm_tensor y) {
  static _Alignas(256) const unsigned char at[256];
  int n_sms = 0, optin = 0;
  assert_int_equal(cudaDeviceGetAttribute(&n_sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  assert_int_equal(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0),
                   cudaSuccess);
  return mm_params(w, at, x, y, n_sms, optin);
}

/* The switches a backend reads from an empty environment. */
static const lm_cu_switches all_on = {.pdl = 1, .tensor_cores = 1, .glu_pair = 1, .q_norm = 1};
#endif

/* The kernel the op layer runs for the matmul x · wᵀ into y (as the picks name it), checking
 * the decode-row limit and, where the layout promises it, the tensor cores. */
static const char *matmul_pick(const lm_weight *w, lm_tensor x, lm_tensor y, int acc, int want_tc) {
#ifdef LM_HAVE_CUDA
  lm_cu_mm_p p = dev_params(w, x, y);
  p.accumulate = acc;
  const lm_cu_gemv_kind kind = lm_cu_pick_gemv(&p, &all_on);
  if (x.rows > LM_CU_GEMV_MAX_ROWS)
    assert_int_equal(kind, LM_CU_GEMV_NONE);
  else if (want_tc)
    assert_int_equal(kind, LM_CU_GEMV_TC);
  return gemv_kind_name(kind);
#else
  (void)w, (void)x, (void)y, (void)acc, (void)want_tc;
  return "";
#endif
}

/* The route the op layer takes for an MoE block (gate, up: the expert stacks; x: the tokens;
 * ids: their top-k experts; g: the gate rows of the scratch), checking it against decode
 * (grouped) or prefill (gathered) and, in decode, whether gate and up should fuse. */
static const char *moe_pick(const lm_weight *gate, const lm_weight *up, lm_tensor x, lm_tensor ids,
                            lm_tensor g, int decode, int want_pair) {
#ifdef LM_HAVE_CUDA
  lm_cu_mm_p pair = dev_params(gate, x, g);
  pair.y.rows = x.rows * ids.cols;
  pair.ids = ids.data;
  pair.ids_ld = ids.ld;
  pair.ids_k = pair.x_div = (int)ids.cols;
  pair.epi = (int)LM_EPI_GLU_PAIR;
  pair.w2 = dev_params(up, x, g).w;
  const lm_cu_moe_kind route = lm_cu_pick_moe(&pair, &all_on);
  assert_int_equal(route, !decode     ? LM_CU_MOE_GATHERED
                          : want_pair ? LM_CU_MOE_GROUPED_PAIR
                                      : LM_CU_MOE_GROUPED);
  return moe_kind_name(route);
#else
  (void)gate, (void)up, (void)x, (void)ids, (void)g, (void)decode, (void)want_pair;
  return "";
#endif
}

static void t_rmsnorm(void **state) {
  NEED_GPU(state);
  static const int64_t shapes[][2] = {{1, 2560}, {7, 37}, {33, 512}, {130, 64}};
  lm_dtype act = e->gpu->act_dtype;
  for (size_t si = 0; si < 4; si++)
    for (int mode = 0; mode < 3; mode++) { /* 0: with weight, 1: no weight, 2: residual */
      int64_t R = shapes[si][0], C = shapes[si][1];
      float *x = rand_vec(R * C, 3.0f), *res = rand_vec(R * C, 1.0f);
      hweight w = make_vector(C, 1.0f);
      if (mode != 1) assert_int_equal(e->gpu->ops->prepare_weight(e->gpu, &w.w), LM_OK);
      lm_tensor hx = htensor(R, C, x), hr = htensor(R, C, res), ho = htensor(R, C, NULL);
      dbuf dx = dput(e->gpu, R, C, act, x), dr = dput(e->gpu, R, C, act, res),
           dout = dput(e->gpu, R, C, act, NULL);
      lm_rmsnorm_args ac = {.out = ho,
                            .x = hx,
                            .w = mode == 1 ? NULL : &w.w,
                            .eps = 1e-6f,
                            .residual = mode == 2 ? &hr : NULL};
      lm_rmsnorm_args ag = {
          .out = dout.t, .x = dx.t, .w = ac.w, .eps = 1e-6f, .residual = mode == 2 ? &dr.t : NULL};
      assert_int_equal(e->cpu->ops->rmsnorm(e->cpu, &ac), LM_OK);
      assert_int_equal(e->gpu->ops->rmsnorm(e->gpu, &ag), LM_OK);
      float *ref = hget(mode == 2 ? hr : ho), *got = dget(e->gpu, mode == 2 ? &dr : &dout);
      char what[64];
      snprintf(what, sizeof what, "rmsnorm %lldx%lld mode %d", (long long)R, (long long)C, mode);
      expect_close(what, got, ref, R * C, bound_for(e->gpu, 1e-10, 2e-5));
      free(mode == 2 ? ho.data : hr.data);
      free(hx.data);
      dfree(e->gpu, &dx);
      dfree(e->gpu, mode == 2 ? &dout : &dr);
      free(ref), free(got), free(x), free(res);
      hweight_free(&w);
    }
}

static void t_elementwise(void **state) {
  NEED_GPU(state);
  lm_dtype act = e->gpu->act_dtype;
  int64_t R = 9, C = 301;
  float *a = rand_vec(R * C, 4.0f), *b = rand_vec(R * C, 4.0f);
  for (int op = 0; op < 4; op++) { /* geglu, add, add (no b), softcap */
    lm_tensor ha = htensor(R, C, a), hb = htensor(R, C, b), ho = htensor(R, C, NULL);
    dbuf da = dput(e->gpu, R, C, act, a), db = dput(e->gpu, R, C, act, b),
         dout = dput(e->gpu, R, C, act, NULL);
    const char *name = op == 0   ? "geglu"
                       : op == 1 ? "add (a+b)*s"
                       : op == 2 ? "add a*s"
                                 : "softcap (in place)";
    if (op == 0) {
      assert_int_equal(e->cpu->ops->geglu(e->cpu, &(lm_geglu_args){ho, ha, hb}), LM_OK);
      assert_int_equal(e->gpu->ops->geglu(e->gpu, &(lm_geglu_args){dout.t, da.t, db.t}), LM_OK);
    } else if (op < 3) {
      lm_tensor none = {0};
      assert_int_equal(
          e->cpu->ops->add(e->cpu, &(lm_add_args){ho, ha, op == 1 ? hb : none, 0.7071f}), LM_OK);
      assert_int_equal(
          e->gpu->ops->add(e->gpu, &(lm_add_args){dout.t, da.t, op == 1 ? db.t : none, 0.7071f}),
          LM_OK);
    } else {
      assert_int_equal(e->cpu->ops->softcap(e->cpu, &(lm_softcap_args){ha, 3.0f}), LM_OK);
      assert_int_equal(e->gpu->ops->softcap(e->gpu, &(lm_softcap_args){da.t, 3.0f}), LM_OK);
    }
    float *ref = hget(op == 3 ? ha : ho), *got = dget(e->gpu, op == 3 ? &da : &dout);
    expect_close(name, got, ref, R * C, bound_for(e->gpu, 1e-10, 2e-5));
    free(op == 3 ? ho.data : ha.data);
    free(hb.data);
    dfree(e->gpu, op == 3 ? &dout : &da);
    dfree(e->gpu, &db);
    free(ref), free(got);
  }
  free(a), free(b);
}

static void t_argmax(void **state) {
  NEED_GPU(state);
  int64_t R = 5, C = 70001;
  float *x = rand_vec(R * C, 10.0f);
  x[3 * C + 12] = x[3 * C + 70000] = 50.0f; /* a tie: the lowest index wins */
  lm_tensor hx = htensor(R, C, x), hi = {.rows = R, .cols = 1, .ld = 2, .dtype = LM_DT_I32};
  hi.data = calloc((size_t)(2 * R), 4);
  dbuf dx = dput(e->gpu, R, C, LM_DT_F32, x), di = dput(e->gpu, R, 1, LM_DT_I32, NULL);
  assert_int_equal(e->cpu->ops->argmax(e->cpu, &(lm_argmax_args){hi, hx}), LM_OK);
  assert_int_equal(e->gpu->ops->argmax(e->gpu, &(lm_argmax_args){di.t, dx.t}), LM_OK);
  float *got = dget(e->gpu, &di);
  for (int64_t r = 0; r < R; r++)
    assert_int_equal((int32_t)got[r], ((int32_t *)hi.data)[r * 2]);
  assert_int_equal((int32_t)got[3], 3 * 0 + 12);
  printf("  argmax %lldx%lld: exact\n", (long long)R, (long long)C);
  dfree(e->gpu, &dx);
  free(hx.data), free(hi.data), free(got), free(x);
}

/* logits_kl against the host's lm_logits_kl, row by row: strided rows of 262,144 logits (the
 * Gemma vocabulary) at four distances from the reference (none, tiny, moderate, large); the f64
 * tree sum differs from the host's left-to-right sum only in the last bits. bf16 rows are
 * refused. */
static void t_logits_kl(void **state) {
  NEED_GPU(state);
  const int64_t R = 4, V = 262144;
  float *ref = rand_vec(R * V, 8.0f), *x = malloc((size_t)(R * V) * sizeof(float));
  for (int64_t i = 0; i < R * V; i++) {
    int64_t r = i / V;
    x[i] = ref[i] + (r == 0 ? 0.0f : r == 1 ? 1e-3f * urand() : r == 2 ? 0.5f * urand() : urand());
  }
  dbuf dr = dput(e->gpu, R, V, LM_DT_F32, ref), dx = dput(e->gpu, R, V, LM_DT_F32, x),
       dk = dput(e->gpu, R, 1, LM_DT_F32, NULL);
  assert_int_equal(e->gpu->ops->logits_kl(e->gpu, &(lm_logits_kl_args){dk.t, dx.t, dr.t}), LM_OK);
  float *got = dget(e->gpu, &dk);
  for (int64_t r = 0; r < R; r++) {
    double want;
    int64_t agree;
    lm_logits_kl(ref + r * V, x + r * V, 1, V, &want, &agree);
    double err = fabs(got[r] - want);
    printf("  logits_kl row %lld: %.6g (host %.6g)\n", (long long)r, (double)got[r], want);
    assert_true(err <= 1e-5 * want + 1e-9);
  }
  dbuf d16 = dput(e->gpu, R, V, LM_DT_BF16, x);
  assert_int_equal(e->gpu->ops->logits_kl(e->gpu, &(lm_logits_kl_args){dk.t, d16.t, dr.t}),
                   LM_ERR_INVALID);
  dfree(e->gpu, &dr), dfree(e->gpu, &dx), dfree(e->gpu, &dk), dfree(e->gpu, &d16);
  free(ref), free(x), free(got);
}

/* x · Wᵀ for each weight layout the kernels distinguish, decode and prefill row counts. */
static void t_matmul(void **state) {
  NEED_GPU(state);
  lm_dtype act = e->gpu->act_dtype;
  static const struct {
    int bits, group;
    lm_dtype dt;
    int64_t rows, cols, ne;
  } W[] = {{4, 64, LM_DT_BF16, 37, 2560, 0}, {4, 32, LM_DT_BF16, 100, 96, 0},
           {4, 128, LM_DT_BF16, 19, 384, 0}, {8, 64, LM_DT_BF16, 33, 192, 0},
           {2, 32, LM_DT_BF16, 21, 64, 0},   {2, 64, LM_DT_BF16, 7, 256, 0},
           {3, 32, LM_DT_BF16, 29, 320, 0},  {5, 64, LM_DT_BF16, 13, 128, 0},
           {6, 32, LM_DT_BF16, 11, 160, 0},  {4, 64, LM_DT_F16, 17, 128, 0},
           {4, 64, LM_DT_F32, 9, 192, 0},    {0, 0, LM_DT_BF16, 45, 200, 0},
           {0, 0, LM_DT_F32, 23, 36, 0},     {0, 0, LM_DT_F16, 31, 64, 0},
           {0, 0, LM_DT_BF16, 5, 37, 0},     {4, 64, LM_DT_BF16, 24, 128, 3},
           {0, 0, LM_DT_BF16, 12, 64, 4},    {4, 64, LM_DT_BF16, 40, 12288, 0},
           {4, 32, LM_DT_BF16, 50, 256, 0},  {4, 128, LM_DT_BF16, 19, 1024, 0},
           {4, 64, LM_DT_BF16, 24, 512, 3}};
  static const int64_t ms[] = {1, 2, 3, 5, 8, 17, 64};
  for (size_t wi = 0; wi < sizeof W / sizeof *W; wi++) {
    hweight w = make_weight(W[wi].ne, W[wi].rows, W[wi].cols, W[wi].bits, W[wi].group, W[wi].dt);
    assert_int_equal(e->gpu->ops->prepare_weight(e->gpu, &w.w), LM_OK);
    for (size_t mi = 0; mi < sizeof ms / sizeof *ms; mi++)
      for (int v = 0; v < 3;
           v++) { /* v 0: x rows padded by PAD; 1: accumulate; 2: x rows 16-byte aligned */
        int64_t M = ms[mi], N = W[wi].rows, K = W[wi].cols, ex = W[wi].ne ? W[wi].ne - 1 : 0;
        int acc = v == 1, aligned = v == 2;
        if ((acc && mi % 3) || (aligned && (K % 8 || M > 17))) continue;
        lm_dtype odt = mi == 4 ? LM_DT_F32 : act; /* an f32 output, as the logits are */
        float *x = rand_vec(M * K, 1.0f), *y0 = rand_vec(M * N, 0.5f);
        lm_tensor hx = htensor(M, K, x), hy = htensor(M, N, acc ? y0 : NULL);
        /* the packed and tensor-core GEMVs need x rows at 16-byte boundaries; others fall back */
        dbuf dx = dput_ld(e->gpu, M, K, aligned ? K + 8 : K + PAD, act, x),
             dy = dput(e->gpu, M, N, odt, acc ? y0 : NULL);
        assert_int_equal(
            e->cpu->ops->matmul(
                e->cpu,
                &(lm_matmul_args){.out = hy, .x = hx, .w = &w.w, .expert = ex, .accumulate = acc}),
            LM_OK);
        lm_status s = e->gpu->ops->matmul(
            e->gpu,
            &(lm_matmul_args){.out = dy.t, .x = dx.t, .w = &w.w, .expert = ex, .accumulate = acc});
        if (s) fprintf(stderr, "%s\n", lm_errmsg());
        assert_int_equal(s, LM_OK);
        float *ref = hget(hy), *got = dget(e->gpu, &dy);
        char what[112];
        /* what the layout promises: 4-bit bf16 products with aligned x rows take the tensor
         * cores in decode */
        const char *kind =
            matmul_pick(&w.w, dx.t, dy.t, acc,
                        aligned && W[wi].bits == 4 && W[wi].dt == LM_DT_BF16 && act == LM_DT_BF16);
        snprintf(what, sizeof what, "matmul q%d/g%d %s %lldx%lld%s m=%lld%s%s%s (%s)", W[wi].bits,
                 W[wi].group, lm_dtype_name(W[wi].dt), (long long)N, (long long)K,
                 W[wi].ne ? " expert" : "", (long long)M, acc ? " acc" : "",
                 aligned ? " aligned" : "", odt == LM_DT_F32 && act != LM_DT_F32 ? " ->f32" : "",
                 kind);
        expect_close(what, got, ref, M * N, bound_for(e->gpu, 1e-9, 1e-4));
        dfree(e->gpu, &dx);
        free(hx.data), free(ref), free(got), free(x), free(y0);
      }
    hweight_free(&w);
  }
}

/* Embedding, RoPE and the logit-row gather read the step's ids/positions/rows. */
static void t_step_ops(void **state) {
  NEED_GPU(state);
  lm_dtype act = e->gpu->act_dtype;
  hweight tq = make_weight(0, 50, 96, 4, 32, LM_DT_BF16),
          td = make_weight(0, 50, 40, 0, 0, LM_DT_BF16);
  hweight inv = make_vector(24, 0.5f);
  assert_int_equal(e->gpu->ops->prepare_weight(e->gpu, &tq.w), LM_OK);
  assert_int_equal(e->gpu->ops->prepare_weight(e->gpu, &td.w), LM_OK);
  assert_int_equal(e->gpu->ops->prepare_weight(e->gpu, &inv.w), LM_OK);
  step_env s;
  int T = ring_step_begin(e, &s, 7, 4, 3, 1000);
  for (int k = 0; k < 2; k++) { /* embed: quantized and dense tables */
    hweight *t = k ? &td : &tq;
    lm_tensor ho = htensor(T, t->w.cols, NULL);
    dbuf dout = dput(e->gpu, T, t->w.cols, act, NULL);
    assert_int_equal(e->cpu->ops->embed(e->cpu, &(lm_embed_args){ho, &t->w, 1.7f}), LM_OK);
    assert_int_equal(e->gpu->ops->embed(e->gpu, &(lm_embed_args){dout.t, &t->w, 1.7f}), LM_OK);
    float *ref = hget(ho), *got = dget(e->gpu, &dout);
    expect_close(k ? "embed dense bf16" : "embed q4/g32", got, ref, T * t->w.cols,
                 bound_for(e->gpu, 1e-12, 2e-5));
    free(ref), free(got);
  }
  { /* rope over 3 heads of 48 */
    float *x = rand_vec(T * 144, 2.0f);
    lm_tensor hx = htensor(T, 144, x);
    dbuf dx = dput(e->gpu, T, 144, act, x);
    assert_int_equal(e->cpu->ops->rope(e->cpu, &(lm_rope_args){hx, 3, 48, &inv.w}), LM_OK);
    assert_int_equal(e->gpu->ops->rope(e->gpu, &(lm_rope_args){dx.t, 3, 48, &inv.w}), LM_OK);
    float *ref = hget(hx), *got = dget(e->gpu, &dx);
    expect_close("rope 3x48, positions to 10000", got, ref, T * 144,
                 bound_for(e->gpu, 1e-10, 4e-5));
    free(ref), free(got), free(x);
  }
  { /* gather of 3 logit rows */
    float *x = rand_vec(T * 77, 1.0f);
    lm_tensor hx = htensor(T, 77, x), ho = htensor(3, 77, NULL);
    dbuf dx = dput(e->gpu, T, 77, LM_DT_F32, x), dout = dput(e->gpu, 3, 77, LM_DT_F32, NULL);
    assert_int_equal(e->cpu->ops->gather_logit_rows(e->cpu, &(lm_gather_args){ho, hx}), LM_OK);
    assert_int_equal(e->gpu->ops->gather_logit_rows(e->gpu, &(lm_gather_args){dout.t, dx.t}),
                     LM_OK);
    float *ref = hget(ho), *got = dget(e->gpu, &dout);
    free(dget(e->gpu, &dx)); /* frees x, checking its guards: the gather only reads it */
    assert_memory_equal(got, ref, 3 * 77 * sizeof(float));
    printf("  gather_logit_rows: exact\n");
    free(hx.data), free(ref), free(got), free(x);
  }
  assert_int_equal(e->cpu->ops->end_step(e->cpu), LM_OK);
  assert_int_equal(e->gpu->ops->end_step(e->gpu), LM_OK);
  hweight_free(&tq), hweight_free(&td), hweight_free(&inv);
  step_env_free(&s);
}

/* The fused forms the forward uses: norm + RoPE of head rows, the residual norm with the layer
 * scalar and the next norm, and the GeGLU epilogues of a matmul (GEMV and GEMM paths). */
static void t_fused(void **state) {
  NEED_GPU(state);
  lm_dtype act = e->gpu->act_dtype;
  step_env s;
  int T = ring_step_begin(e, &s, 4, 3, 0, 700);
  static const int hds[] = {48, 64, 256, 512};
  for (size_t hi = 0; hi < 4; hi++) { /* norm + RoPE: 3 heads per token */
    int hd = hds[hi], H = 3;
    int64_t R = (int64_t)T * H;
    float *x = rand_vec(R * hd, 3.0f);
    hweight w = make_vector(hd, 1.0f), inv = make_vector(hd / 2, 0.3f);
    assert_int_equal(e->gpu->ops->prepare_weight(e->gpu, &w.w), LM_OK);
    assert_int_equal(e->gpu->ops->prepare_weight(e->gpu, &inv.w), LM_OK);
    lm_tensor hx = htensor(R, hd, x);
    dbuf dx = dput(e->gpu, R, hd, act, x);
    lm_rmsnorm_args ac = {
        .out = hx, .x = hx, .w = &w.w, .eps = 1e-6f, .rope = &inv.w, .rope_heads = H};
    lm_rmsnorm_args ag = ac;
    ag.out = ag.x = dx.t;
    assert_int_equal(e->cpu->ops->rmsnorm(e->cpu, &ac), LM_OK);
    assert_int_equal(e->gpu->ops->rmsnorm(e->gpu, &ag), LM_OK);
    float *ref = hget(hx), *got = dget(e->gpu, &dx);
    char what[80];
    snprintf(what, sizeof what, "rmsnorm+rope %d heads x %d", H, hd);
    expect_close(what, got, ref, R * hd, bound_for(e->gpu, 1e-5, 6e-5));
    free(ref), free(got), free(x);
    hweight_free(&w), hweight_free(&inv);
  }
  static const int64_t shapes[][2] = {{1, 2560}, {7, 37}, {5, 512}, {3, 8192}};
  for (size_t si = 0; si < 4; si++) /* residual norm, layer scalar, next norm */
    for (int nw = 0; nw < 2; nw++) {
      int64_t R = shapes[si][0], C = shapes[si][1];
      float *x = rand_vec(R * C, 3.0f), *res = rand_vec(R * C, 1.0f);
      hweight w = make_vector(C, 1.0f), w2 = make_vector(C, 0.7f);
      assert_int_equal(e->gpu->ops->prepare_weight(e->gpu, &w.w), LM_OK);
      assert_int_equal(e->gpu->ops->prepare_weight(e->gpu, &w2.w), LM_OK);
      lm_tensor hx = htensor(R, C, x), hr = htensor(R, C, res), hn = htensor(R, C, NULL);
      dbuf dx = dput(e->gpu, R, C, act, x), dr = dput(e->gpu, R, C, act, res),
           dn = dput(e->gpu, R, C, act, NULL);
      lm_rmsnorm_args ac = {.x = hx,
                            .w = &w.w,
                            .eps = 1e-6f,
                            .residual = &hr,
                            .scaled = 1,
                            .scale = 0.625f,
                            .next_out = hn,
                            .next_w = nw ? &w2.w : NULL};
      lm_rmsnorm_args ag = ac;
      ag.x = dx.t, ag.residual = &dr.t, ag.next_out = dn.t;
      assert_int_equal(e->cpu->ops->rmsnorm(e->cpu, &ac), LM_OK);
      assert_int_equal(e->gpu->ops->rmsnorm(e->gpu, &ag), LM_OK);
      float *rr = hget(hr), *gr = dget(e->gpu, &dr), *rn = hget(hn), *gn = dget(e->gpu, &dn);
      char what[80];
      snprintf(what, sizeof what, "rmsnorm residual+scale %lldx%lld", (long long)R, (long long)C);
      expect_close(what, gr, rr, R * C, bound_for(e->gpu, 1e-10, 2e-5));
      snprintf(what, sizeof what, "  and next norm%s", nw ? " (weighted)" : "");
      expect_close(what, gn, rn, R * C, bound_for(e->gpu, 1e-6, 3e-5));
      free(hx.data), free(rr), free(gr), free(rn), free(gn), free(x), free(res);
      dfree(e->gpu, &dx);
      hweight_free(&w), hweight_free(&w2);
    }
  hweight wq = make_weight(0, 37, 2560, 4, 64, LM_DT_BF16);
  assert_int_equal(e->gpu->ops->prepare_weight(e->gpu, &wq.w), LM_OK);
  static const int64_t ms[] = {1, 3, 17};
  for (size_t mi = 0; mi < 3; mi++)
    for (int epi = LM_EPI_GLU_OTHER; epi <= LM_EPI_GLU_SELF; epi++) {
      int64_t M = ms[mi], N = wq.w.rows, K = wq.w.cols;
      float *x = rand_vec(M * K, 1.0f), *o = rand_vec(M * N, 2.0f);
      lm_tensor hx = htensor(M, K, x), ho = htensor(M, N, o), hy = htensor(M, N, NULL);
      dbuf dx = dput(e->gpu, M, K, act, x), dob = dput(e->gpu, M, N, act, o),
           dy = dput(e->gpu, M, N, act, NULL);
      lm_matmul_args ac = {
          .out = hy, .x = hx, .w = &wq.w, .epilogue = (lm_mm_epilogue)epi, .other = ho};
      lm_matmul_args ag = {
          .out = dy.t, .x = dx.t, .w = &wq.w, .epilogue = (lm_mm_epilogue)epi, .other = dob.t};
      assert_int_equal(e->cpu->ops->matmul(e->cpu, &ac), LM_OK);
      assert_int_equal(e->gpu->ops->matmul(e->gpu, &ag), LM_OK);
      float *ref = hget(hy), *got = dget(e->gpu, &dy);
      char what[80];
      snprintf(what, sizeof what, "matmul q4 %lldx%lld m=%lld epilogue %s", (long long)N,
               (long long)K, (long long)M,
               epi == LM_EPI_GLU_OTHER ? "gelu(other)*y" : "gelu(y)*other");
      expect_close(what, got, ref, M * N, bound_for(e->gpu, 1e-8, 2e-4));
      free(hx.data), free(ho.data), free(ref), free(got), free(x), free(o);
      dfree(e->gpu, &dx), dfree(e->gpu, &dob);
    }
  hweight_free(&wq);
  assert_int_equal(e->cpu->ops->end_step(e->cpu), LM_OK);
  assert_int_equal(e->gpu->ops->end_step(e->gpu), LM_OK);
  step_env_free(&s);
}

/* The gate/up pair (LM_EPI_GLU_PAIR) against its definition on the same device, bit for bit
 * (gate product into other, then up with the GeGLU epilogue), and against the CPU: shapes for
 * each warp count of the tensor-core launch, each group size, and x staged in chunks. */
static void t_glu_pair(void **state) {
  NEED_GPU(state);
  lm_dtype act = e->gpu->act_dtype;
  static const struct {
    int group;
    int64_t rows, cols;
  } W[] = {{64, 37, 256}, {64, 6000, 256}, {64, 9000, 128},
           {32, 100, 96}, {128, 19, 384},  {64, 37, 12288}};
  static const int64_t ms[] = {1, 3, 8};
  for (size_t wi = 0; wi < sizeof W / sizeof *W; wi++) {
    hweight wg = make_weight(0, W[wi].rows, W[wi].cols, 4, W[wi].group, LM_DT_BF16);
    hweight wu = make_weight(0, W[wi].rows, W[wi].cols, 4, W[wi].group, LM_DT_BF16);
    assert_int_equal(e->gpu->ops->prepare_weight(e->gpu, &wg.w), LM_OK);
    assert_int_equal(e->gpu->ops->prepare_weight(e->gpu, &wu.w), LM_OK);
    for (size_t mi = 0; mi < sizeof ms / sizeof *ms; mi++) {
      int64_t M = ms[mi], N = W[wi].rows, K = W[wi].cols;
      float *x = rand_vec(M * K, 1.0f);
      lm_tensor hx = htensor(M, K, x), hg = htensor(M, N, NULL), hy = htensor(M, N, NULL);
      dbuf dx = dput_ld(e->gpu, M, K, K + 8, act, x), dg = dput(e->gpu, M, N, act, NULL);
      dbuf dy = dput(e->gpu, M, N, act, NULL), dy2 = dput(e->gpu, M, N, act, NULL);
      lm_matmul_args ac = {
          .out = hy, .x = hx, .w = &wg.w, .w2 = &wu.w, .epilogue = LM_EPI_GLU_PAIR, .other = hg};
      lm_matmul_args ag = {.out = dy.t,
                           .x = dx.t,
                           .w = &wg.w,
                           .w2 = &wu.w,
                           .epilogue = LM_EPI_GLU_PAIR,
                           .other = dg.t};
      assert_int_equal(e->cpu->ops->matmul(e->cpu, &ac), LM_OK);
      assert_int_equal(e->gpu->ops->matmul(e->gpu, &ag), LM_OK);
      ag.out = dy2.t;
      assert_int_equal(lm_matmul_glu_pair(e->gpu, &ag, e->gpu->ops->matmul), LM_OK);
      float *ref = hget(hy), *got = dget(e->gpu, &dy), *two = dget(e->gpu, &dy2);
      char what[96];
      snprintf(what, sizeof what, "gate/up pair g%d %lldx%lld m=%lld", W[wi].group, (long long)N,
               (long long)K, (long long)M);
      expect_close(what, got, ref, M * N, bound_for(e->gpu, 1e-8, 2e-4));
      int64_t differ = 0;
      for (int64_t i = 0; i < M * N; i++)
        differ += memcmp(&got[i], &two[i], sizeof(float)) != 0;
      if (differ)
        fprintf(stderr, "%s: %lld values differ from the two products\n", what, (long long)differ);
      assert_int_equal(differ, 0);
      free(hx.data), free(hg.data), free(ref), free(got), free(two), free(x);
      dfree(e->gpu, &dx), dfree(e->gpu, &dg);
    }
    hweight_free(&wg), hweight_free(&wu);
  }
}

/* Attention + append over several steps of two sequences: prefill chunks, decode, a ring
 * that wraps, GQA ratios 1..16, head dims 32..512. */
static void t_attention(void **state) {
  NEED_GPU(state);
  lm_dtype act = e->gpu->act_dtype;
  static const struct {
    int nh, nkv, hd;
    int64_t window;
  } C[] = {{4, 1, 64, 0},
           {8, 2, 256, 0},
           {16, 1, 512, 0},
           {2, 2, 48, 0},
           {4, 2, 32, 5},
           {8, 8, 256, 40},
           /* 8 and 16 query heads per KV head: the shared-memory decode kernel */
           {8, 1, 256, 0},
           {16, 2, 512, 40},
           {32, 2, 256, 0}};
  static const int steps[][2] = {{150, 70}, {1, 1}, {3, 0}, {0, 1}, {1, 1}, {17, 2}, {1, 1}};
  for (size_t ci = 0; ci < sizeof C / sizeof *C; ci++) {
    /* the q norm + RoPE as attention's first step: fused in the decode kernel (power-of-two
     * head dims), else the separate norm; both must equal the norm op followed by attention */
    int hd = C[ci].hd, qn_on = hd >= 32 && (hd & (hd - 1)) == 0;
    hweight qw = make_vector(hd, 1.0f), qi = make_vector(hd / 2, 0.3f);
    assert_int_equal(e->gpu->ops->prepare_weight(e->gpu, &qw.w), LM_OK);
    assert_int_equal(e->gpu->ops->prepare_weight(e->gpu, &qi.w), LM_OK);
    lm_kv_spec spec = {.kind = C[ci].window ? LM_KV_ROTATING_PLAIN : LM_KV_PLAIN,
                       .n_kv_heads = C[ci].nkv,
                       .head_dim = C[ci].hd,
                       .window = C[ci].window};
    step_env s;
    step_env_init(e, &s, 2, &spec, 1);
    int64_t qd = (int64_t)C[ci].nh * C[ci].hd, kvd = (int64_t)C[ci].nkv * C[ci].hd;
    for (size_t st = 0; st < sizeof steps / sizeof *steps; st++) {
      int T = step_batch(&s, steps[st], 0);
      if (!T) continue;
      float *q = rand_vec(T * qd, 1.0f), *k = rand_vec(T * kvd, 1.0f), *v = rand_vec(T * kvd, 1.0f);
      lm_tensor hq = htensor(T, qd, q), hk = htensor(T, kvd, k), hv = htensor(T, kvd, v),
                ho = htensor(T, qd, NULL);
      dbuf dq = dput(e->gpu, T, qd, act, q), dk = dput(e->gpu, T, kvd, act, k),
           dv = dput(e->gpu, T, kvd, act, v);
      dbuf dout = dput(e->gpu, T, qd, act, NULL);
      lm_attn_args ac = {.out = ho,
                         .q = hq,
                         .k_new = hk,
                         .v_new = hv,
                         .cache = 0,
                         .n_heads = C[ci].nh,
                         .n_kv_heads = C[ci].nkv,
                         .head_dim = C[ci].hd,
                         .window = C[ci].window,
                         .scale = 0.125f};
      lm_attn_args ag = ac;
      ag.out = dout.t, ag.q = dq.t, ag.k_new = dk.t, ag.v_new = dv.t;
      /* the q norm works on head rows: q's tokens must be contiguous (a padded q is refused) */
      lm_tensor hqn = {.rows = T,
                       .cols = qd,
                       .ld = qd,
                       .dtype = LM_DT_F32,
                       .data = malloc((size_t)(T * qd) * 4)};
      lm_tensor hon = htensor(T, qd, NULL);
      memcpy(hqn.data, q, (size_t)(T * qd) * 4);
      lm_attn_args acn = ac;
      acn.q = hqn, acn.out = hon, acn.q_norm = &qw.w, acn.q_rope = &qi.w, acn.q_eps = 1e-6f;
      assert_int_equal(e->cpu->ops->begin_step(e->cpu, &s.bc), LM_OK);
      assert_int_equal(e->cpu->ops->attention(e->cpu, &ac), LM_OK);
      if (qn_on) {
        assert_int_equal(e->cpu->ops->attention(e->cpu, &acn), LM_OK);
        lm_attn_args bad = acn;
        bad.q = hq;
        assert_int_equal(e->cpu->ops->attention(e->cpu, &bad), LM_ERR_INVALID);
      }
      assert_int_equal(e->cpu->ops->kv_append(
                           e->cpu, &(lm_kv_append_args){.k_new = hk, .v_new = hv, .cache = 0}),
                       LM_OK);
      assert_int_equal(e->cpu->ops->end_step(e->cpu), LM_OK);
      assert_int_equal(e->gpu->ops->begin_step(e->gpu, &s.bg), LM_OK);
      lm_status rs = e->gpu->ops->attention(e->gpu, &ag);
      if (rs) fprintf(stderr, "%s\n", lm_errmsg());
      assert_int_equal(rs, LM_OK);
      dbuf dqn = dput_ld(e->gpu, T, qd, qd, act, q), dqs = dput_ld(e->gpu, T, qd, qd, act, q);
      dbuf don = dput(e->gpu, T, qd, act, NULL), dos = dput(e->gpu, T, qd, act, NULL);
      if (qn_on) {
        lm_attn_args agn = acn;
        agn.out = don.t, agn.q = dqn.t, agn.k_new = dk.t, agn.v_new = dv.t;
        assert_int_equal(e->gpu->ops->attention(e->gpu, &agn), LM_OK);
        agn.out = dos.t, agn.q = dqs.t;
        assert_int_equal(lm_attention_q_norm(e->gpu, &agn, e->gpu->ops->attention), LM_OK);
        agn.q = dq.t; /* padded */
        assert_int_equal(e->gpu->ops->attention(e->gpu, &agn), LM_ERR_INVALID);
      }
      assert_int_equal(e->gpu->ops->kv_append(
                           e->gpu, &(lm_kv_append_args){.k_new = dk.t, .v_new = dv.t, .cache = 0}),
                       LM_OK);
      assert_int_equal(e->gpu->ops->end_step(e->gpu), LM_OK);
      for (int i = 0; i < 2; i++)
        assert_int_equal(lm_kv_set_len(s.kc[i]), lm_kv_set_len(s.kg[i]));
      float *ref = hget(ho), *got = dget(e->gpu, &dout);
      char what[96];
      snprintf(what, sizeof what, "attention %d/%d x%d win %lld step %zu (T=%d)", C[ci].nh,
               C[ci].nkv, C[ci].hd, (long long)C[ci].window, st, T);
      expect_close(what, got, ref, T * qd, bound_for(e->gpu, 1e-9, 1e-4));
      float *rn = hget(hon), *gn = dget(e->gpu, &don), *gs = dget(e->gpu, &dos);
      if (qn_on) {
        strncat(what, " q norm", sizeof what - strlen(what) - 1);
        expect_close(what, gn, rn, T * qd, bound_for(e->gpu, 1e-9, 1e-4));
        int64_t differ = 0;
        for (int64_t i = 0; i < T * qd; i++)
          differ += memcmp(&gn[i], &gs[i], sizeof(float)) != 0;
        if (differ)
          fprintf(stderr, "%s: %lld values differ from norm-then-attention\n", what,
                  (long long)differ);
        assert_int_equal(differ, 0);
      }
      free(hq.data), free(hk.data), free(hv.data), free(ref), free(got), free(q), free(k), free(v);
      free(hqn.data), free(rn), free(gn), free(gs);
      dfree(e->gpu, &dq), dfree(e->gpu, &dk), dfree(e->gpu, &dv), dfree(e->gpu, &dqn),
          dfree(e->gpu, &dqs);
    }
    step_env_free(&s);
    hweight_free(&qw), hweight_free(&qi);
  }
}

static void t_moe(void **state) {
  NEED_GPU(state);
  lm_dtype act = e->gpu->act_dtype;
  int64_t E = 8, K = 2, H = 64, I = 96;
  hweight wg = make_weight(E, I, H, 4, 32, LM_DT_BF16),
          wu = make_weight(E, I, H, 4, 32, LM_DT_BF16);
  hweight wd = make_weight(E, H, I, 4, 32, LM_DT_BF16), pes = make_vector(E, 1.0f);
  assert_int_equal(e->gpu->ops->prepare_weight(e->gpu, &wg.w), LM_OK);
  assert_int_equal(e->gpu->ops->prepare_weight(e->gpu, &wu.w), LM_OK);
  assert_int_equal(e->gpu->ops->prepare_weight(e->gpu, &wd.w), LM_OK);
  assert_int_equal(e->gpu->ops->prepare_weight(e->gpu, &pes.w), LM_OK);
  static const int64_t Ts[] = {1, 3, 37};
  for (size_t ti = 0; ti < 3; ti++) {
    int64_t T = Ts[ti];
    float *lg = rand_vec(T * E, 3.0f), *x = rand_vec(T * H, 1.0f);
    lm_tensor hl = htensor(T, E, lg), hw = htensor(T, K, NULL), hx = htensor(T, H, x),
              ho = htensor(T, H, NULL);
    lm_tensor hi = {.rows = T,
                    .cols = K,
                    .ld = K + PAD,
                    .dtype = LM_DT_I32,
                    .data = calloc((size_t)(T * (K + PAD)), 4)};
    dbuf dl = dput(e->gpu, T, E, LM_DT_F32, lg), dw = dput(e->gpu, T, K, LM_DT_F32, NULL);
    dbuf di = dput(e->gpu, T, K, LM_DT_I32, NULL);
    assert_int_equal(
        e->cpu->ops->moe_route(e->cpu, &(lm_moe_route_args){hi, hw, hl, (int)K, &pes.w}), LM_OK);
    assert_int_equal(
        e->gpu->ops->moe_route(e->gpu, &(lm_moe_route_args){di.t, dw.t, dl.t, (int)K, &pes.w}),
        LM_OK);
    float *gi = dget(e->gpu, &di), *gw = dget(e->gpu, &dw), *rw = hget(hw);
    for (int64_t i = 0; i < T * K; i++)
      assert_int_equal((int32_t)gi[i], ((int32_t *)hi.data)[(i / K) * hi.ld + i % K]);
    expect_close("moe_route weights (ids exact)", gw, rw, T * K, 1e-12);
    /* experts on the CPU's routing */
    float ids_f[T * K];
    for (int64_t i = 0; i < T * K; i++)
      ids_f[i] = (float)((int32_t *)hi.data)[(i / K) * hi.ld + i % K];
    di = dput(e->gpu, T, K, LM_DT_I32, ids_f);
    dw = dput(e->gpu, T, K, LM_DT_F32, rw);
    hw = htensor(T, K, rw);
    /* T = 3 with rows padded by PAD (the generic kernels), else 16-byte aligned rows (packed,
     * tensor cores) */
    int64_t pad = ti == 1 ? PAD : 8;
    dbuf dx = dput_ld(e->gpu, T, H, H + pad, act, x), dout = dput(e->gpu, T, H, act, NULL);
    dbuf dsc = dput_ld(e->gpu, T * K, 2 * I + 2 * H, 2 * I + 2 * H + pad, act, NULL),
         dis = dput(e->gpu, 1, T * K + E + 1, LM_DT_I32, NULL);
    lm_tensor hsc = htensor(T * K, 2 * I + 2 * H, NULL),
              his = {.rows = 1, .cols = T * K + E + 1, .ld = T * K + E + 1, .dtype = LM_DT_I32};
    his.data = calloc((size_t)his.cols, 4);
    assert_int_equal(
        e->cpu->ops->moe_experts(
            e->cpu, &(lm_moe_experts_args){ho, hx, hi, hw, &wg.w, &wu.w, &wd.w, hsc, his}),
        LM_OK);
    lm_status s =
        e->gpu->ops->moe_experts(e->gpu, &(lm_moe_experts_args){dout.t, dx.t, di.t, dw.t, &wg.w,
                                                                &wu.w, &wd.w, dsc.t, dis.t});
    if (s) fprintf(stderr, "%s\n", lm_errmsg());
    assert_int_equal(s, LM_OK);
    float *ref = hget(ho), *got = dget(e->gpu, &dout);
    /* 4-bit bf16 experts with 16-byte aligned x rows fuse gate and up in decode */
    const char *route = moe_pick(&wg.w, &wu.w, dx.t, di.t, lm_tensor_cols(dsc.t, 0, I), T <= 4,
                                 act == LM_DT_BF16 && pad == 8);
    char what[80];
    snprintf(what, sizeof what, "moe_experts T=%lld (%s)", (long long)T, route);
    expect_close(what, got, ref, T * H, bound_for(e->gpu, 1e-9, 1e-4));
    free(ref), free(got), free(gi), free(gw), free(rw), free(lg), free(x);
    free(hl.data), free(hw.data), free(hx.data), free(hi.data), free(hsc.data), free(his.data);
    dfree(e->gpu, &dl), dfree(e->gpu, &di), dfree(e->gpu, &dw), dfree(e->gpu, &dx),
        dfree(e->gpu, &dsc);
    dfree(e->gpu, &dis);
  }
  hweight_free(&wg), hweight_free(&wu), hweight_free(&wd), hweight_free(&pes);
}

/* ---- quantized caches ------------------------------------------------------------------------ */

/* K/V rows both backends quantize; with bf16 activations rounded to bf16 first, so the device
 * (which holds bf16) and the CPU (f32) quantize the same numbers and must agree bit for bit.
 * Groups (of `group` values) of every shape the quantizer branches on: constant (the scale
 * clamps to 1e-7 and q0 != 0), zero (q0 == 0, bias 0), tiny (below the clamp), large (`big`
 * times), one negative outlier of -big, all negative (the min edge maps exactly), random. */
static float *kv_values(int64_t rows, int64_t w, int group, float big, lm_dtype act) {
  float *v = rand_vec(rows * w, 1.0f);
  for (int64_t r = 0; r < rows; r++)
    for (int64_t g = 0; g < w / group; g++) {
      float *x = v + r * w + g * group, c = x[0];
      for (int i = 0; i < group; i++) {
        int kind = (int)((r + g) % 8);
        x[i] = kind == 0                     ? c
               : kind == 1                   ? 0.0f
               : kind == 2                   ? x[i] * 1e-9f
               : kind == 3                   ? x[i] * big
               : kind == 4 && i == group / 2 ? -big
               : kind == 5                   ? -fabsf(x[i]) - 0.5f
                                             : x[i];
      }
    }
  for (int64_t i = 0; act == LM_DT_BF16 && i < rows * w; i++)
    v[i] = lm_round_bf16(v[i]);
  return v;
}

/* K/V rows for TurboQuant caches: kv_values' group shapes at 32, except that a constant group
 * becomes a ramp (the reference codec turns a constant key group into NaN, by design). */
static float *tq_values(int64_t rows, int64_t w, lm_dtype act) {
  float *v = kv_values(rows, w, 32, 4.0f, act);
  for (int64_t r = 0; r < rows; r++)
    for (int64_t g = 0; g < w / 32; g++)
      for (int i = 0; (r + g) % 8 == 0 && i < 32; i++) {
        float *x = v + r * w + g * 32 + i;
        *x += 0.03f * (float)i;
        if (act == LM_DT_BF16) *x = lm_round_bf16(*x);
      }
  return v;
}

/* Stage rows: filled alike on both backends, so bytes neither writes compare too. */
static uint8_t *bytes_filled(size_t n) {
  uint8_t *h = malloc(n);
  memset(h, 0xa5, n);
  return h;
}

static void *dbytes(lm_backend *be, size_t n) {
  uint8_t *h = bytes_filled(n);
  void *d = NULL;
  assert_int_equal(be->ops->alloc(be, n, &d), LM_OK);
  assert_int_equal(be->ops->upload(be, d, h, n), LM_OK);
  free(h);
  return d;
}

static uint8_t *dbytes_get(lm_backend *be, const void *d, size_t n) {
  uint8_t *h = malloc(n ? n : 1);
  assert_int_equal(be->ops->download(be, h, d, n), LM_OK);
  return h;
}

/* Mismatching bytes, the first one reported under `what`. */
static int64_t diff_bytes(const char *what, const uint8_t *got, const uint8_t *ref, size_t n) {
  int64_t bad = 0;
  for (size_t i = 0; i < n; i++)
    if (got[i] != ref[i] && !bad++)
      printf("  %s: byte %zu of %zu is %02x, want %02x  FAIL\n", what, i, n, got[i], ref[i]);
  return bad;
}

/* The device cache holds what the CPU's holds, bit for bit: codes, scales and biases of the
 * held slots for quantized kinds, the K/V values for plain ones. */
static void expect_same_cache(lm_backend *gpu, const lm_kv_cache *hc, const lm_kv_cache *gc,
                              const char *what) {
  char s1[64], s2[64], w[160];
  assert_string_equal(lm_kv_signature(hc, s1, sizeof s1), lm_kv_signature(gc, s2, sizeof s2));
  assert_int_equal(hc->n, gc->n);
  int64_t held = lm_kv_held(hc), bad = 0;
  const void *ha[LM_KV_ARRAYS] = {hc->k, hc->v, hc->ks, hc->kb, hc->vs, hc->vb};
  const void *ga[LM_KV_ARRAYS] = {gc->k, gc->v, gc->ks, gc->kb, gc->vs, gc->vb};
  static const char *names[LM_KV_ARRAYS] = {"K codes",  "V codes",  "K scales",
                                            "K biases", "V scales", "V biases"};
  for (int a = 0; a < LM_KV_ARRAYS && hc->bits; a++) {
    if (!lm_kv_row_bytes(hc, a)) continue; /* turboquant has no sixth array */
    size_t n = (size_t)(held * lm_kv_row_bytes(hc, a));
    uint8_t *g = dbytes_get(gpu, ga[a], n);
    snprintf(w, sizeof w, "%s %s %s", what, s1, names[a]);
    bad += diff_bytes(w, g, ha[a], n);
    free(g);
  }
  int64_t nv = held * hc->n_kv_heads * hc->head_dim;
  for (int a = 0; a < 2 && !hc->bits; a++) {
    uint8_t *g = dbytes_get(gpu, ga[a], (size_t)nv * lm_dtype_size(gc->dtype));
    for (int64_t i = 0; i < nv; i++) {
      float x = gc->dtype == LM_DT_BF16 ? lm_bf16_to_f32(((const uint16_t *)g)[i])
                                        : ((const float *)g)[i];
      if (x != ((const float *)ha[a])[i] && !bad++)
        printf("  %s %s %s: value %lld is %g, want %g  FAIL\n", what, s1, a ? "V" : "K",
               (long long)i, (double)x, (double)((const float *)ha[a])[i]);
    }
    free(g);
  }
  assert_int_equal(bad, 0);
}

/* kv_stage alone: three sequences whose caches of one index differ (quantized with the case's
 * bits/group, plain, quantized with the other width and groups of 32), stage rows of an odd
 * stride. The stage bytes and the replaced K/V rows must equal the CPU's exactly (bf16: the
 * CPU's values rounded to bf16, which is what the device stores in a bf16 tensor). */
static void t_kv_stage(void **state) {
  NEED_GPU(state);
  lm_dtype act = e->gpu->act_dtype;
  static const struct {
    int bits, group, nkv, hd;
  } C[] = {{8, 32, 2, 32},   {4, 32, 1, 64},   {8, 64, 4, 128},
           {4, 128, 2, 256}, {8, 128, 1, 512}, {4, 64, 8, 256}};
  for (size_t ci = 0; ci < sizeof C / sizeof *C; ci++) {
    lm_kv_spec specs[3] = {{.kind = LM_KV_QUANT,
                            .n_kv_heads = C[ci].nkv,
                            .head_dim = C[ci].hd,
                            .bits = C[ci].bits,
                            .group = C[ci].group},
                           {.kind = LM_KV_PLAIN, .n_kv_heads = C[ci].nkv, .head_dim = C[ci].hd},
                           {.kind = LM_KV_QUANT,
                            .n_kv_heads = C[ci].nkv,
                            .head_dim = C[ci].hd,
                            .bits = 12 - C[ci].bits,
                            .group = 32}};
    step_env s;
    step_env_init_strided(e, &s, 3, specs, 1, 1);
    int counts[3] = {5, 3, 4};
    int T = step_batch(&s, counts, 0);
    int64_t w = (int64_t)C[ci].nkv * C[ci].hd, sld = lm_kv_stage_row_bound(w) + 5;
    size_t sbytes = (size_t)(T * sld + GUARD);
    float *k = kv_values(T, w, C[ci].group, 3e4f, act),
          *v = kv_values(T, w, C[ci].group, 3e4f, act);
    lm_tensor hk = htensor(T, w, k), hv = htensor(T, w, v);
    dbuf dk = dput(e->gpu, T, w, act, k), dv = dput(e->gpu, T, w, act, v);
    lm_tensor hs = {
        .data = bytes_filled(sbytes), .rows = T, .cols = sld - 5, .ld = sld, .dtype = LM_DT_U8};
    lm_tensor ds = hs;
    ds.data = dbytes(e->gpu, sbytes);
    assert_int_equal(e->cpu->ops->begin_step(e->cpu, &s.bc), LM_OK);
    assert_int_equal(e->cpu->ops->kv_stage(e->cpu, &(lm_kv_stage_args){hk, hv, hs, 0}), LM_OK);
    assert_int_equal(e->cpu->ops->end_step(e->cpu), LM_OK);
    assert_int_equal(e->gpu->ops->begin_step(e->gpu, &s.bg), LM_OK);
    lm_status st = e->gpu->ops->kv_stage(e->gpu, &(lm_kv_stage_args){dk.t, dv.t, ds, 0});
    if (st) fprintf(stderr, "%s\n", lm_errmsg());
    assert_int_equal(st, LM_OK);
    assert_int_equal(e->gpu->ops->end_step(e->gpu), LM_OK);
    char what[96];
    snprintf(what, sizeof what, "kv_stage q%d/g%d %dx%d (+ plain, + q%d/g32)", C[ci].bits,
             C[ci].group, C[ci].nkv, C[ci].hd, 12 - C[ci].bits);
    uint8_t *gs = dbytes_get(e->gpu, ds.data, sbytes);
    int64_t bad = diff_bytes(what, gs, hs.data, sbytes);
    float *rk = hget(hk), *rv = hget(hv), *gk = dget(e->gpu, &dk), *gv = dget(e->gpu, &dv);
    for (int64_t i = 0; i < T * w; i++) {
      float ek = act == LM_DT_BF16 ? lm_round_bf16(rk[i]) : rk[i];
      float ev = act == LM_DT_BF16 ? lm_round_bf16(rv[i]) : rv[i];
      if ((gk[i] != ek || gv[i] != ev) && !bad++)
        printf("  %s: stored value %lld is K %g V %g, want %g %g  FAIL\n", what, (long long)i,
               (double)gk[i], (double)gv[i], (double)ek, (double)ev);
    }
    printf("  %-56s %s\n", what, bad ? "FAIL" : "stage bytes and stored K/V exact");
    assert_int_equal(bad, 0);
    e->gpu->ops->free(e->gpu, ds.data);
    free(hs.data), free(gs), free(rk), free(rv), free(gk), free(gv), free(k), free(v);
    step_env_free(&s);
  }
}

/* One step on both backends, as the forward issues it for a donor layer: kv_stage, attention,
 * kv_append. The output is compared by NMSE, the stage rows and then every cache exactly. */
static void kvq_step(env *e, step_env *s, int T, int nh, int nkv, int hd, int64_t window, int group,
                     const char *what) {
  lm_dtype act = e->gpu->act_dtype;
  int64_t qd = (int64_t)nh * hd, kvd = (int64_t)nkv * hd, sld = lm_kv_stage_row_bound(kvd) + 5;
  size_t sbytes = (size_t)(T * sld + GUARD);
  /* group 0: TurboQuant rows (groups of 32, none constant) */
  float *q = rand_vec(T * qd, 1.0f),
        *k = group ? kv_values(T, kvd, group, 4.0f, act) : tq_values(T, kvd, act),
        *v = group ? kv_values(T, kvd, group, 4.0f, act) : tq_values(T, kvd, act);
  lm_tensor hq = htensor(T, qd, q), hk = htensor(T, kvd, k), hv = htensor(T, kvd, v),
            ho = htensor(T, qd, NULL);
  dbuf dq = dput(e->gpu, T, qd, act, q), dk = dput(e->gpu, T, kvd, act, k),
       dv = dput(e->gpu, T, kvd, act, v);
  dbuf dout = dput(e->gpu, T, qd, act, NULL);
  lm_tensor hs = {
      .data = bytes_filled(sbytes), .rows = T, .cols = sld - 5, .ld = sld, .dtype = LM_DT_U8};
  lm_tensor ds = hs;
  ds.data = dbytes(e->gpu, sbytes);
  lm_attn_args ac = {.out = ho,
                     .q = hq,
                     .k_new = hk,
                     .v_new = hv,
                     .cache = 0,
                     .n_heads = nh,
                     .n_kv_heads = nkv,
                     .head_dim = hd,
                     .window = window,
                     .scale = 0.125f};
  lm_attn_args ag = ac;
  ag.out = dout.t, ag.q = dq.t, ag.k_new = dk.t, ag.v_new = dv.t;
  assert_int_equal(e->cpu->ops->begin_step(e->cpu, &s->bc), LM_OK);
  assert_int_equal(e->cpu->ops->kv_stage(e->cpu, &(lm_kv_stage_args){hk, hv, hs, 0}), LM_OK);
  assert_int_equal(e->cpu->ops->attention(e->cpu, &ac), LM_OK);
  assert_int_equal(e->cpu->ops->kv_append(e->cpu, &(lm_kv_append_args){hk, hv, hs, 0}), LM_OK);
  assert_int_equal(e->cpu->ops->end_step(e->cpu), LM_OK);
  assert_int_equal(e->gpu->ops->begin_step(e->gpu, &s->bg), LM_OK);
  lm_status rs = e->gpu->ops->kv_stage(e->gpu, &(lm_kv_stage_args){dk.t, dv.t, ds, 0});
  if (!rs) rs = e->gpu->ops->attention(e->gpu, &ag);
  if (!rs) rs = e->gpu->ops->kv_append(e->gpu, &(lm_kv_append_args){dk.t, dv.t, ds, 0});
  if (rs) fprintf(stderr, "%s\n", lm_errmsg());
  assert_int_equal(rs, LM_OK);
  assert_int_equal(e->gpu->ops->end_step(e->gpu), LM_OK);
  float *ref = hget(ho), *got = dget(e->gpu, &dout);
  expect_close(what, got, ref, T * qd, bound_for(e->gpu, 1e-9, 1e-4));
  uint8_t *gs = dbytes_get(e->gpu, ds.data, sbytes);
  assert_int_equal(diff_bytes(what, gs, hs.data, sbytes), 0);
  for (int i = 0; i < s->n_seqs; i++)
    expect_same_cache(e->gpu, s->kc[i]->caches[0], s->kg[i]->caches[0], what);
  e->gpu->ops->free(e->gpu, ds.data);
  free(hs.data), free(gs), free(hq.data), free(hk.data), free(hv.data), free(ref), free(got),
      free(q), free(k), free(v);
  dfree(e->gpu, &dq), dfree(e->gpu, &dk), dfree(e->gpu, &dv);
}

/* kvq_step over the steps of t_attention (prefill chunks, decode with split keys, a chunk
 * longer than its ring, ring wraps) for two sequences whose caches of one index are specs[0]
 * and specs[1]. */
static void kvq_steps(env *e, const lm_kv_spec *specs, int nh, int nkv, int hd, int64_t window,
                      int group, const char *label) {
  static const int steps[][2] = {{150, 70}, {1, 1}, {3, 0}, {0, 1}, {1, 1}, {17, 2}, {1, 1}};
  step_env s;
  step_env_init_strided(e, &s, 2, specs, 1, 1);
  for (size_t st = 0; st < sizeof steps / sizeof *steps; st++) {
    int T = step_batch(&s, steps[st], 0);
    if (!T) continue;
    char what[160];
    snprintf(what, sizeof what, "%s step %zu (T=%d)", label, st, T);
    kvq_step(e, &s, T, nh, nkv, hd, window, group, what);
  }
  step_env_free(&s);
}

/* Attention over quantized caches read in place, with the append of staged codes, over the
 * steps of t_attention (prefill chunks, decode with split keys, a chunk longer than its ring,
 * ring wraps), GQA ratios 1..16, head dims 32..512, 4- and 8-bit codes, groups 32..128; in
 * the "mixed" cases the second sequence's cache of the same index is plain. */
static void t_kv_quant_attention(void **state) {
  NEED_GPU(state);
  static const struct {
    int nh, nkv, hd;
    int64_t window;
    int bits, group, mixed;
  } C[] = {{4, 1, 64, 0, 8, 32, 0}, {8, 2, 256, 0, 4, 64, 0},  {16, 1, 512, 0, 8, 128, 0},
           {4, 2, 32, 5, 4, 32, 0}, {8, 8, 256, 40, 8, 64, 1}, {2, 2, 128, 0, 4, 128, 1},
           {8, 1, 256, 0, 4, 32, 0}};
  for (size_t ci = 0; ci < sizeof C / sizeof *C; ci++) {
    lm_kv_spec specs[2] = {{.kind = C[ci].window ? LM_KV_ROTATING_QUANT : LM_KV_QUANT,
                            .n_kv_heads = C[ci].nkv,
                            .head_dim = C[ci].hd,
                            .window = C[ci].window,
                            .bits = C[ci].bits,
                            .group = C[ci].group}};
    specs[1] = specs[0];
    if (C[ci].mixed)
      specs[1] = (lm_kv_spec){.kind = C[ci].window ? LM_KV_ROTATING_PLAIN : LM_KV_PLAIN,
                              .n_kv_heads = C[ci].nkv,
                              .head_dim = C[ci].hd,
                              .window = C[ci].window};
    char label[96];
    snprintf(label, sizeof label, "kvq attention %d/%d x%d q%d/g%d%s win %lld", C[ci].nh, C[ci].nkv,
             C[ci].hd, C[ci].bits, C[ci].group, C[ci].mixed ? " +plain" : "",
             (long long)C[ci].window);
    kvq_steps(e, specs, C[ci].nh, C[ci].nkv, C[ci].hd, C[ci].window, C[ci].group, label);
  }
}

/* TurboQuant caches on the device: kv_stage's codes (stage rows) and every cache equal the
 * CPU codec's bit for bit (tq_codec.c, itself bit-exact with the reference cases), attention
 * (values summed rotated, each output row un-rotated once, with and without split keys) within
 * the backends' tolerance, over prefill chunks and decode steps; head dims 64..512, every key
 * width and value widths 2..5; in the mixed cases the second sequence's cache of the same
 * index is plain (1) or affine 8-bit (2), so both encoders run in one step. */
static void t_kv_tq_attention(void **state) {
  NEED_GPU(state);
  static const struct {
    int nh, nkv, hd, kb, vb, mixed;
  } C[] = {{4, 1, 64, 8, 3, 0},  {8, 2, 256, 4, 2, 0}, {16, 1, 512, 8, 4, 0},
           {8, 8, 128, 5, 5, 1}, {8, 2, 512, 2, 3, 2}, {2, 2, 256, 8, 3, 0}};
  for (size_t ci = 0; ci < sizeof C / sizeof *C; ci++) {
    lm_kv_spec specs[2] = {{.kind = LM_KV_TURBOQUANT,
                            .n_kv_heads = C[ci].nkv,
                            .head_dim = C[ci].hd,
                            .bits = C[ci].kb,
                            .group = 32,
                            .v_bits = C[ci].vb}};
    specs[1] = specs[0];
    if (C[ci].mixed == 1)
      specs[1] = (lm_kv_spec){.kind = LM_KV_PLAIN, .n_kv_heads = C[ci].nkv, .head_dim = C[ci].hd};
    if (C[ci].mixed == 2)
      specs[1] = (lm_kv_spec){.kind = LM_KV_QUANT,
                              .n_kv_heads = C[ci].nkv,
                              .head_dim = C[ci].hd,
                              .bits = 8,
                              .group = 32};
    char label[96];
    snprintf(label, sizeof label, "tq attention %d/%d x%d k%dv%d%s", C[ci].nh, C[ci].nkv, C[ci].hd,
             C[ci].kb, C[ci].vb,
             C[ci].mixed == 1   ? " +plain"
             : C[ci].mixed == 2 ? " +q8"
                                : "");
    kvq_steps(e, specs, C[ci].nh, C[ci].nkv, C[ci].hd, 0, 0, label);
  }
}

/* --kv-quant-start on the device: caches start plain and kv_convert quantizes their held slots
 * when lm_kv_reserve finds them long enough (the ring case converts after it has wrapped). The
 * two sequences convert at different steps, so steps in between mix a quantized and a plain
 * cache of one index. Converted caches must equal the CPU's bit for bit. */
static void t_kv_convert(void **state) {
  NEED_GPU(state);
  static const struct {
    int nh, nkv, hd;
    int64_t window;
    int bits, group;
  } C[] = {{4, 2, 64, 0, 8, 32}, {2, 1, 128, 6, 4, 64}, {8, 4, 256, 0, 4, 128}};
  static const int steps[][2] = {{7, 4}, {5, 9}, {1, 1}, {2, 8}, {1, 1}, {1, 1}};
  for (size_t ci = 0; ci < sizeof C / sizeof *C; ci++) {
    lm_kv_spec specs[2] = {{.kind = C[ci].window ? LM_KV_ROTATING_QUANT : LM_KV_QUANT,
                            .n_kv_heads = C[ci].nkv,
                            .head_dim = C[ci].hd,
                            .window = C[ci].window,
                            .bits = C[ci].bits,
                            .group = C[ci].group,
                            .quant_start = 9}};
    specs[1] = specs[0];
    specs[1].quant_start = 20;
    step_env s;
    step_env_init_strided(e, &s, 2, specs, 1, 1);
    for (size_t st = 0; st < sizeof steps / sizeof *steps; st++) {
      int T =
          step_batch(&s, steps[st], 0); /* reserves: converts the caches that reached their start */
      char what[96];
      snprintf(what, sizeof what, "kv_convert %dx%d q%d/g%d win %lld step %zu", C[ci].nkv, C[ci].hd,
               C[ci].bits, C[ci].group, (long long)C[ci].window, st);
      for (int i = 0; i < 2; i++)
        expect_same_cache(e->gpu, s.kc[i]->caches[0], s.kg[i]->caches[0], what);
      kvq_step(e, &s, T, C[ci].nh, C[ci].nkv, C[ci].hd, C[ci].window, C[ci].group, what);
    }
    for (int i = 0; i < 2; i++)
      assert_true(lm_kv_kind_quant(s.kg[i]->caches[0]->kind));
    step_env_free(&s);
  }
}

/* Bad calls fail closed with a message, never crash. */
static void t_bad_calls(void **state) {
  NEED_GPU(state);
  hweight w = make_weight(0, 16, 64, 4, 32, LM_DT_BF16);
  dbuf dx = dput(e->gpu, 2, 64, e->gpu->act_dtype, NULL),
       dy = dput(e->gpu, 2, 16, e->gpu->act_dtype, NULL);
  /* not prepared */
  assert_int_equal(
      e->gpu->ops->matmul(e->gpu, &(lm_matmul_args){.out = dy.t, .x = dx.t, .w = &w.w}),
      LM_ERR_STATE);
  assert_int_equal(e->gpu->ops->prepare_weight(e->gpu, &w.w), LM_OK);
  lm_tensor bad = dx.t;
  bad.cols = 63;
  assert_int_equal(e->gpu->ops->matmul(e->gpu, &(lm_matmul_args){.out = dy.t, .x = bad, .w = &w.w}),
                   LM_ERR_INVALID);
  assert_int_equal(e->gpu->ops->matmul(
                       e->gpu, &(lm_matmul_args){.out = dy.t, .x = dx.t, .w = &w.w, .expert = 1}),
                   LM_ERR_INVALID);
  /* a half-formed gate/up pair: the second weight without the epilogue, the epilogue without it */
  assert_int_equal(
      e->gpu->ops->matmul(e->gpu, &(lm_matmul_args){.out = dy.t, .x = dx.t, .w = &w.w, .w2 = &w.w}),
      LM_ERR_INVALID);
  {
    lm_tensor hx = htensor(2, 64, NULL), hy = htensor(2, 16, NULL);
    assert_int_equal(
        e->cpu->ops->matmul(e->cpu, &(lm_matmul_args){.out = hy, .x = hx, .w = &w.w, .w2 = &w.w}),
        LM_ERR_INVALID);
    free(hx.data), free(hy.data);
  }
  /* ops that need a step, outside one */
  assert_int_equal(e->gpu->ops->embed(e->gpu, &(lm_embed_args){dx.t, &w.w, 1.0f}), LM_ERR_STATE);
  /* an allocation larger than the device says how much was asked and what is free */
  void *p = NULL;
  lm_status s = e->gpu->ops->alloc(e->gpu, (size_t)1 << 50, &p);
  assert_int_equal(s, LM_ERR_NOMEM);
  assert_non_null(strstr(lm_errmsg(), "free of"));
  printf("  out of memory: %s\n", lm_errmsg());
  /* quantized kinds: exactly the widths and groups kv.c creates */
  assert_true(e->gpu->ops->supports_cache(e->gpu, "kv:quant:8:64"));
  assert_true(e->gpu->ops->supports_cache(e->gpu, "kv:rotating-quant:4:128"));
  assert_false(e->gpu->ops->supports_cache(e->gpu, "kv:quant:3:64"));
  assert_false(e->gpu->ops->supports_cache(e->gpu, "kv:quant:8:16"));
  assert_false(e->gpu->ops->supports_cache(e->gpu, "kv:rotating-quant:8:64x"));
  assert_true(e->gpu->ops->supports_cache(e->gpu, "kv:turboquant:8:3"));
  assert_true(e->gpu->ops->supports_cache(e->gpu, "kv:turboquant:2:5"));
  assert_false(e->gpu->ops->supports_cache(e->gpu, "kv:turboquant:8:8"));
  assert_false(e->gpu->ops->supports_cache(e->gpu, "kv:turboquant:3:3"));
  { /* a stage row too small for a quantized cache's codes, scales and biases */
    lm_kv_spec spec = {
        .kind = LM_KV_QUANT, .n_kv_heads = 1, .head_dim = 64, .bits = 8, .group = 32};
    step_env se;
    step_env_init(e, &se, 1, &spec, 1);
    int counts[1] = {2};
    step_batch(&se, counts, 0);
    lm_tensor ds = {
        .data = dbytes(e->gpu, 256), .rows = 2, .cols = 64, .ld = 64, .dtype = LM_DT_U8};
    assert_int_equal(e->gpu->ops->begin_step(e->gpu, &se.bg), LM_OK);
    assert_int_equal(e->gpu->ops->kv_stage(e->gpu, &(lm_kv_stage_args){dx.t, dx.t, ds, 0}),
                     LM_ERR_INVALID);
    assert_int_equal(e->gpu->ops->kv_append(e->gpu, &(lm_kv_append_args){dx.t, dx.t, ds, 0}),
                     LM_ERR_INVALID);
    assert_int_equal(e->gpu->ops->end_step(e->gpu), LM_OK);
    e->gpu->ops->free(e->gpu, ds.data);
    step_env_free(&se);
  }
  dfree(e->gpu, &dx), dfree(e->gpu, &dy);
  hweight_free(&w);
}

/* ---- the picks, without a GPU -------------------------------------------------------------- */

#ifdef LM_HAVE_CUDA
static const _Alignas(256) unsigned char g_at[512]; /* where aligned device data would sit */

/* A plain product's parameters on an H200 (132 SMs, 227 KiB of opt-in shared memory): an
 * [m][cols] activation with row stride cols + xpad into [m][rows]. wdt: the dense dtype, or
 * the scales' dtype of a quantized weight. */
static lm_cu_mm_p h200_params(int bits, int group, lm_dtype wdt, int64_t rows, int64_t cols,
                              int64_t m, lm_dtype act, int64_t xpad) {
  lm_weight w = {
      .name = "w", .rows = rows, .cols = cols, .expert_rows = rows, .bits = bits, .group = group};
  w.dtype = bits ? LM_DT_U32 : wdt;
  w.sdtype = bits ? wdt : LM_DT_F32;
  lm_tensor x = {.data = (void *)g_at, .rows = m, .cols = cols, .ld = cols + xpad, .dtype = act};
  lm_tensor y = {.data = (void *)g_at, .rows = m, .cols = rows, .ld = rows, .dtype = act};
  return mm_params(&w, g_at, x, y, 132, 232448);
}
#endif

/* The kernel each decode product takes, for a table of shapes: what the op layer ran before
 * the picks existed (a kernel tried, cudaErrorNotSupported falling through to the next), which
 * the picks must reproduce exactly. Host logic only, so this runs on machines without a GPU. */
static void t_pick_gemv(void **state) {
  (void)state;
#ifndef LM_HAVE_CUDA
  printf("no CUDA build: skipped\n");
  skip();
#else
#define NONE LM_CU_GEMV_NONE
#define TC LM_CU_GEMV_TC
#define PK LM_CU_GEMV_PACKED
#define DN LM_CU_GEMV_DENSE
#define GN LM_CU_GEMV_GENERIC
  static const struct {
    int bits, group;
    lm_dtype wdt;
    int64_t rows, cols, m;
    lm_dtype act;
    int64_t xpad;
    int acc;
    lm_cu_gemv_kind on, cores; /* every switch on; LUMEN_CUDA_GEMV=cores */
  } C[] = {
      {4, 64, LM_DT_BF16, 2048, 2048, 1, LM_DT_BF16, 8, 0, TC, PK},
      {4, 64, LM_DT_BF16, 2048, 2048, 8, LM_DT_BF16, 8, 1, TC, PK},
      {4, 64, LM_DT_BF16, 2048, 2048, 9, LM_DT_BF16, 8, 0, NONE, NONE}, /* prefill: cuBLAS */
      {4, 128, LM_DT_BF16, 100, 4096, 3, LM_DT_BF16, 8, 0, TC, PK},
      {4, 32, LM_DT_BF16, 262144, 2560, 1, LM_DT_BF16, 8, 0, TC, PK}, /* a vocabulary */
      {4, 64, LM_DT_BF16, 2048, 2048, 1, LM_DT_F32, 4, 0, PK, PK},    /* f32: no tensor cores */
      {4, 64, LM_DT_BF16, 2048, 2048, 1, LM_DT_BF16, 3, 0, GN, GN},   /* x rows unaligned */
      {4, 64, LM_DT_F16, 512, 2048, 1, LM_DT_BF16, 8, 0, GN, GN},     /* f16 scales */
      {4, 64, LM_DT_F32, 512, 2048, 2, LM_DT_F32, 4, 0, GN, GN},      /* f32 scales */
      {8, 32, LM_DT_BF16, 512, 2048, 4, LM_DT_BF16, 8, 0, PK, PK},
      {2, 32, LM_DT_BF16, 256, 1024, 2, LM_DT_BF16, 8, 0, PK, PK},
      {3, 64, LM_DT_BF16, 512, 2048, 2, LM_DT_BF16, 8, 0, GN, GN},
      {4, 32, LM_DT_BF16, 100, 96, 5, LM_DT_BF16, 8, 0, TC, PK}, /* rows of 48 bytes */
      {0, 0, LM_DT_BF16, 1000, 2048, 1, LM_DT_BF16, 8, 0, DN, DN},
      {0, 0, LM_DT_F32, 300, 2048, 5, LM_DT_F32, 3, 0, DN, DN},
      {0, 0, LM_DT_F16, 31, 64, 8, LM_DT_BF16, 3, 0, DN, DN},
      {0, 0, LM_DT_BF16, 45, 37, 1, LM_DT_BF16, 3, 0, GN, GN},
      {0, 0, LM_DT_BF16, 64, 32768, 4, LM_DT_BF16, 8, 0, DN, DN},   /* x staged one row a launch */
      {0, 0, LM_DT_F32, 64, 65536, 1, LM_DT_F32, 4, 0, NONE, NONE}, /* x row beyond shared mem */
  };
  const lm_cu_switches cores = {.pdl = 1, .tensor_cores = 0, .glu_pair = 1, .q_norm = 1};
  for (size_t i = 0; i < sizeof C / sizeof *C; i++) {
    lm_cu_mm_p p = h200_params(C[i].bits, C[i].group, C[i].wdt, C[i].rows, C[i].cols, C[i].m,
                               C[i].act, C[i].xpad);
    p.accumulate = C[i].acc;
    lm_cu_gemv_kind on = lm_cu_pick_gemv(&p, &all_on), off = lm_cu_pick_gemv(&p, &cores);
    if (on != C[i].on || off != C[i].cores)
      fprintf(stderr, "case %zu: q%d/g%d %lldx%lld m=%lld: %s / %s, expected %s / %s\n", i,
              C[i].bits, C[i].group, (long long)C[i].rows, (long long)C[i].cols, (long long)C[i].m,
              gemv_kind_name(on), gemv_kind_name(off), gemv_kind_name(C[i].on),
              gemv_kind_name(C[i].cores));
    assert_int_equal(on, C[i].on);
    assert_int_equal(off, C[i].cores);
    /* the epilogues 1 and 2 take the same kernel; a pair is lm_cu_pick_pair's */
    p.accumulate = 0;
    p.epi = 1;
    p.other = p.y;
    assert_int_equal(lm_cu_pick_gemv(&p, &all_on), C[i].on);
    p.epi = 3;
    p.w2 = p.w;
    assert_int_equal(lm_cu_pick_gemv(&p, &all_on), NONE);
  }
  /* grouped (MoE decode): one group per (token, slot) pair, at most 65535 */
  lm_cu_mm_p g = h200_params(4, 64, LM_DT_BF16, 704, 2816, 1, LM_DT_BF16, 8);
  g.ids = (const int32_t *)g_at;
  g.ids_ld = g.ids_k = g.x_div = 8;
  g.y.rows = 8;
  assert_int_equal(lm_cu_pick_gemv(&g, &all_on), TC);
  assert_int_equal(lm_cu_pick_gemv(&g, &cores), PK);
  g.y.rows = 65536;
  assert_int_equal(lm_cu_pick_gemv(&g, &all_on), NONE);
  /* a kernel that does not take the shape launches nothing: no device needed to see it */
  lm_cu_mm_p q3 = h200_params(3, 64, LM_DT_BF16, 512, 2048, 1, LM_DT_BF16, 8);
  const lm_cu_stream none = {0};
  assert_int_equal(lm_cu_gemv(none, &q3, LM_CU_GEMV_TC), cudaErrorInvalidValue);
  assert_int_equal(lm_cu_gemv(none, &q3, LM_CU_GEMV_PACKED), cudaErrorInvalidValue);
  assert_int_equal(lm_cu_gemv(none, &q3, LM_CU_GEMV_NONE), cudaErrorInvalidValue);
#undef NONE
#undef TC
#undef PK
#undef DN
#undef GN
#endif
}

/* Gate/up pairs and MoE routes for a table of shapes, as the op layer chose them before. */
static void t_pick_pair_moe(void **state) {
  (void)state;
#ifndef LM_HAVE_CUDA
  printf("no CUDA build: skipped\n");
  skip();
#else
#define SP LM_CU_PAIR_SPLIT
#define FU LM_CU_PAIR_FUSED
  static const struct {
    int bits, group;
    int64_t rows, cols, m, rows2;
    int acc;
    lm_cu_pair_kind on, no_pair, cores; /* switches on; glu_pair unfused; GEMV=cores */
  } P[] = {
      {4, 64, 2048, 2048, 1, 2048, 0, FU, SP, SP},
      {4, 64, 2048, 2048, 8, 2048, 0, FU, SP, SP},
      {4, 64, 2048, 2048, 9, 2048, 0, SP, SP, SP}, /* prefill */
      {4, 32, 100, 96, 3, 100, 0, FU, SP, SP},     /* rows of 48 bytes */
      {4, 128, 19, 384, 3, 19, 0, FU, SP, SP},
      {4, 64, 8192, 8192, 1, 8192, 0, FU, SP, SP},   /* 2^26 weights: still fused */
      {4, 64, 8193, 8192, 1, 8193, 0, SP, SP, SP},   /* more: two launches (31B's MLP) */
      {4, 64, 21504, 5376, 1, 21504, 0, SP, SP, SP}, /* 31B */
      {4, 64, 2048, 2048, 1, 2048, 1, SP, SP, SP},   /* accumulate */
      {4, 64, 2048, 2048, 1, 1024, 0, SP, SP, SP},   /* up of another shape */
      {8, 64, 2048, 2048, 1, 2048, 0, SP, SP, SP},   /* 8-bit */
  };
  const lm_cu_switches no_pair = {.pdl = 1, .tensor_cores = 1, .glu_pair = 0, .q_norm = 1},
                       cores = {.pdl = 1, .tensor_cores = 0, .glu_pair = 1, .q_norm = 1};
  for (size_t i = 0; i < sizeof P / sizeof *P; i++) {
    lm_cu_mm_p p =
        h200_params(P[i].bits, P[i].group, LM_DT_BF16, P[i].rows, P[i].cols, P[i].m, LM_DT_BF16, 8);
    lm_cu_mm_p up = h200_params(P[i].bits, P[i].group, LM_DT_BF16, P[i].rows2, P[i].cols, P[i].m,
                                LM_DT_BF16, 8);
    p.epi = (int)LM_EPI_GLU_PAIR;
    p.w2 = up.w;
    p.accumulate = P[i].acc;
    if (lm_cu_pick_pair(&p, &all_on) != P[i].on) fprintf(stderr, "pair case %zu\n", i);
    assert_int_equal(lm_cu_pick_pair(&p, &all_on), P[i].on);
    assert_int_equal(lm_cu_pick_pair(&p, &no_pair), P[i].no_pair);
    assert_int_equal(lm_cu_pick_pair(&p, &cores), P[i].cores);
  }
  /* MoE: tokens, top k, expert bits, x row padding -> the route with each switch set */
#define GA LM_CU_MOE_GATHERED
#define GR LM_CU_MOE_GROUPED
#define GP LM_CU_MOE_GROUPED_PAIR
  static const struct {
    int64_t tokens;
    int top_k, bits;
    int64_t xpad;
    lm_cu_moe_kind on, no_pair, cores;
  } M[] = {
      {1, 8, 4, 8, GP, GR, GR},     {4, 8, 4, 8, GP, GR, GR},     {5, 8, 4, 8, GA, GA, GA},
      {37, 8, 4, 8, GA, GA, GA},    {1, 8, 8, 8, GR, GR, GR},     {3, 2, 4, 3, GR, GR, GR},
      {4, 16383, 4, 8, GP, GR, GR}, {4, 16384, 4, 8, GA, GA, GA}, /* 65536 pairs */
  };
  for (size_t i = 0; i < sizeof M / sizeof *M; i++) {
    int64_t T = M[i].tokens, K = M[i].top_k, P_ = T * K;
    lm_cu_mm_p pair = h200_params(M[i].bits, 64, LM_DT_BF16, 704, 2816, T, LM_DT_BF16, M[i].xpad);
    pair.y.rows = P_;
    pair.ids = (const int32_t *)g_at;
    pair.ids_ld = K;
    pair.ids_k = pair.x_div = (int)K;
    pair.epi = (int)LM_EPI_GLU_PAIR;
    pair.w2 = pair.w;
    if (lm_cu_pick_moe(&pair, &all_on) != M[i].on) fprintf(stderr, "moe case %zu\n", i);
    assert_int_equal(lm_cu_pick_moe(&pair, &all_on), M[i].on);
    assert_int_equal(lm_cu_pick_moe(&pair, &no_pair), M[i].no_pair);
    assert_int_equal(lm_cu_pick_moe(&pair, &cores), M[i].cores);
  }
#undef SP
#undef FU
#undef GA
#undef GR
#undef GP
#endif
}

/* The attention kernel each step takes, for a table of steps, as the op layer chose it before
 * (decode kernel tried first, the q norm applied separately where it declined). */
static void t_pick_attn(void **state) {
  (void)state;
#ifndef LM_HAVE_CUDA
  printf("no CUDA build: skipped\n");
  skip();
#else
#define TI LM_CU_ATTN_TILED
#define DE LM_CU_ATTN_DECODE
#define NF LM_CU_ATTN_NORM_FIRST
  static const struct {
    int nh, nkv, hd, tiles, max_tile;
    lm_dtype dt;
    int64_t qpad;        /* q's row stride beyond its heads */
    int64_t part_floats; /* the split partials scratch */
    /* raw q off / on, each with every switch on, LUMEN_CUDA_UNFUSE=q_norm, a quantized cache */
    lm_cu_attn_kind normed, normed_unfused, normed_quant, raw, raw_unfused, raw_quant;
  } C[] = {
      {8, 2, 256, 1, 1, LM_DT_BF16, 0, 8 << 20, DE, DE, TI, DE, NF, NF}, /* decode */
      {8, 2, 256, 4, 1, LM_DT_F32, 0, 8 << 20, DE, DE, TI, DE, NF, NF},  /* 4 sequences */
      {8, 1, 256, 1, 1, LM_DT_BF16, 0, 8 << 20, DE, DE, TI, DE, NF, NF}, /* shared-memory kernel */
      {16, 2, 512, 2, 1, LM_DT_BF16, 0, 8 << 20, DE, DE, TI, DE, NF, NF},
      {4, 1, 32, 1, 1, LM_DT_BF16, 0, 8 << 20, DE, DE, TI, DE, NF, NF},
      {8, 2, 256, 3, 16, LM_DT_BF16, 0, 8 << 20, TI, TI, TI, NF, NF, NF}, /* prefill */
      {8, 2, 256, 1, 2, LM_DT_BF16, 0, 8 << 20, TI, TI, TI, NF, NF, NF},
      {2, 2, 48, 1, 1, LM_DT_BF16, 0, 8 << 20, TI, TI, TI, NF, NF, NF},  /* head dim 48 */
      {8, 2, 256, 1, 1, LM_DT_BF16, 3, 8 << 20, TI, TI, TI, NF, NF, NF}, /* q rows unaligned */
      {8, 2, 256, 1, 1, LM_DT_BF16, 0, 131072, TI, TI, TI, NF, NF, NF},  /* no room for counters */
      {8, 2, 256, 1, 1, LM_DT_BF16, 0, 131073, DE, DE, TI, DE, NF, NF},  /* just enough */
  };
  const lm_cu_switches unfused = {.pdl = 1, .tensor_cores = 1, .glu_pair = 1, .q_norm = 0};
  for (size_t i = 0; i < sizeof C / sizeof *C; i++) {
    int64_t qd = (int64_t)C[i].nh * C[i].hd, kvd = (int64_t)C[i].nkv * C[i].hd;
    int64_t T = C[i].tiles * C[i].max_tile;
    lm_cu_t q = {.p = (void *)g_at, .rows = T, .cols = qd, .ld = qd + C[i].qpad, .dt = C[i].dt},
            kv = {.p = (void *)g_at, .rows = T, .cols = kvd, .ld = kvd, .dt = C[i].dt};
    lm_cu_attn_p p = {.out = q,
                      .q = q,
                      .k_new = kv,
                      .v_new = kv,
                      .n_tiles = C[i].tiles,
                      .max_tile = C[i].max_tile,
                      .n_heads = C[i].nh,
                      .n_kv_heads = C[i].nkv,
                      .head_dim = C[i].hd,
                      .scale = 0.125f,
                      .part_floats = C[i].part_floats};
    lm_cu_attn_kind got[6];
    for (int raw = 0; raw < 2; raw++) {
      p.q_w = p.q_inv = raw ? (const float *)g_at : NULL;
      got[3 * raw] = lm_cu_pick_attn(&p, 0, 132, &all_on);
      got[3 * raw + 1] = lm_cu_pick_attn(&p, 0, 132, &unfused);
      got[3 * raw + 2] = lm_cu_pick_attn(&p, 1, 132, &all_on);
    }
    const lm_cu_attn_kind want[6] = {C[i].normed, C[i].normed_unfused, C[i].normed_quant,
                                     C[i].raw,    C[i].raw_unfused,    C[i].raw_quant};
    for (int j = 0; j < 6; j++) {
      if (got[j] != want[j]) fprintf(stderr, "attention case %zu, column %d\n", i, j);
      assert_int_equal(got[j], want[j]);
    }
  }
  /* a kernel handed a step it does not take launches nothing */
  lm_cu_attn_p none = {.n_heads = 2, .n_kv_heads = 2, .head_dim = 48, .n_tiles = 1};
  assert_int_equal(lm_cu_attention((lm_cu_stream){0}, &none, 132, LM_CU_ATTN_DECODE),
                   cudaErrorInvalidValue);
  assert_int_equal(lm_cu_attention((lm_cu_stream){0}, &none, 132, LM_CU_ATTN_NORM_FIRST),
                   cudaErrorInvalidValue);
#undef TI
#undef DE
#undef NF
#endif
}

int main(void) {
#define BOTH(fn) cmocka_unit_test_setup_teardown(fn, setup_f32, teardown)
#define BF16(fn) cmocka_unit_test_setup_teardown(fn, setup_bf16, teardown)
  const struct CMUnitTest tests[] = {cmocka_unit_test(t_pick_gemv),
                                     cmocka_unit_test(t_pick_pair_moe),
                                     cmocka_unit_test(t_pick_attn),
                                     BOTH(t_rmsnorm),
                                     BF16(t_rmsnorm),
                                     BOTH(t_elementwise),
                                     BF16(t_elementwise),
                                     BOTH(t_argmax),
                                     BOTH(t_logits_kl),
                                     BOTH(t_matmul),
                                     BF16(t_matmul),
                                     BOTH(t_step_ops),
                                     BF16(t_step_ops),
                                     BOTH(t_fused),
                                     BF16(t_fused),
                                     BOTH(t_glu_pair),
                                     BF16(t_glu_pair),
                                     BOTH(t_attention),
                                     BF16(t_attention),
                                     BOTH(t_moe),
                                     BF16(t_moe),
                                     BOTH(t_kv_stage),
                                     BF16(t_kv_stage),
                                     BOTH(t_kv_convert),
                                     BF16(t_kv_convert),
                                     BOTH(t_kv_quant_attention),
                                     BF16(t_kv_quant_attention),
                                     BOTH(t_kv_tq_attention),
                                     BF16(t_kv_tq_attention),
                                     BOTH(t_bad_calls)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
