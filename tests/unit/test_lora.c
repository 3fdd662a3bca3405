/* test_lora.c — LoRA adapters (model/lora.c) on the embedded model, CPU f32:
 *  - an adapter applied as a residual gives the logits of the model whose weights are
 *    W + s·B·A (formed here on the host), in one pass and in chunks, over every kind of module
 *    (q, k, v, o, gate and up, which take the unfused MLP path, down, the per-layer-input gate
 *    and projection); two stacked adapters with weights likewise;
 *  - the same matrices in mlx-lm's layout (transposed, one scale) give the same logits bit for
 *    bit; bf16 tensors load;
 *  - detaching gives the base logits bit for bit;
 *  - scales: alpha / r, rsLoRA's alpha / sqrt(r), rank_pattern and alpha_pattern as PEFT
 *    matches them, mlx-lm's scale, the caller's weight;
 *  - refusals, each naming its cause: DoRA (config and tensors), modules_to_save, biases, an
 *    embedding or expert target, a layer the model lacks, shapes that disagree, a lone lora_A, a
 *    rank the config contradicts, a full fine-tune, a directory without adapter_config.json. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/status.h"
#include "lumen.h"
#include "io/safetensors.h"
#include "io/st_writer.h"
#include "model/forward.h"
#include "model/logit_stats.h"
#include "model/lora.h"
#include "model/lora_merge.h"
#include "tensor/dtype.h"
#include "util/lora_fixture.h"

#define TINY LM_SOURCE_DIR "/models/lumen-tiny-kjv"
#define TMP LM_BUILD_DIR "/tmp/test_lora"
#define FIXTURES                                                                                   \
  (getenv("LUMEN_FIXTURES") ? getenv("LUMEN_FIXTURES") : LM_SOURCE_DIR "/tests/fixtures")

static uint64_t rng = 99;
static float urand(void) {
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((double)(rng >> 11) / (double)(1ull << 53)) * 2.0f - 1.0f;
}

static lm_model *g_m;

static const char *const paths[LM_LORA_KINDS] = {
    "self_attn.q_proj", "self_attn.k_proj",     "self_attn.v_proj",
    "self_attn.o_proj", "mlp.gate_proj",        "mlp.up_proj",
    "mlp.down_proj",    "per_layer_input_gate", "per_layer_projection"};

static const lm_weight *base_w(int layer, int kind) {
  return lm_lora_target(g_m, layer, (lm_lora_kind)kind);
}

/* A module an adapter targets, with its raw matrices (PEFT layout: A [r][in], B [out][r]). */
typedef struct target {
  int layer, kind, rank;
  int shape_kind; /* the module whose shapes the matrices have (kind, but for a refusal case) */
  float *a, *b;
} target;

static void make_target(target *t, int layer, int kind, int rank) {
  const lm_weight *w = base_w(layer, kind);
  t->layer = layer, t->kind = kind, t->rank = rank, t->shape_kind = kind;
  t->a = malloc((size_t)(rank * w->cols) * sizeof(float));
  t->b = malloc((size_t)(w->rows * rank) * sizeof(float));
  for (int64_t i = 0; i < rank * w->cols; i++)
    t->a[i] = 0.3f * urand();
  for (int64_t i = 0; i < w->rows * rank; i++)
    t->b[i] = 0.3f * urand();
}

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

/* Writes the targets as an adapter in dir: PEFT (adapter_model.safetensors, names as PEFT saves
 * them) or mlx-lm (adapters.safetensors, transposed). dt: F32 or BF16. extra: one more tensor
 * name (a refusal case) or NULL. */
static void write_adapter(const char *dir, int mlx, const target *t, int n, lm_dtype dt,
                          const char *config, const char *extra) {
  mkdir(TMP, 0755);
  mkdir(dir, 0755);
  char p[512];
  snprintf(p, sizeof p, "%s/adapter_config.json", dir);
  write_file(p, config);
  lm_st_writer *w;
  assert_int_equal(lm_st_writer_create(&w), LM_OK);
  void *bufs[64];
  int nb = 0;
  for (int i = 0; i < n; i++) {
    /* shapes of the layer named, or of layer 1 for a layer the model lacks (a refusal case) */
    const lm_weight *bw = base_w(t[i].layer < g_m->cfg.n_layers ? t[i].layer : 1, t[i].shape_kind);
    int64_t r = t[i].rank, in = bw->cols, out = bw->rows;
    for (int ab = 0; ab < 2; ab++) {
      int64_t rows = ab ? out : r, cols = ab ? r : in;
      const float *src = ab ? t[i].b : t[i].a;
      size_t es = lm_dtype_size(dt);
      uint8_t *d = malloc((size_t)(rows * cols) * es);
      for (int64_t y = 0; y < rows; y++)
        for (int64_t x = 0; x < cols; x++) {
          float v = src[y * cols + x];
          int64_t at = mlx ? x * rows + y : y * cols + x; /* mlx-lm: the transpose */
          if (dt == LM_DT_BF16) {
            uint16_t h = lm_f32_to_bf16(v);
            memcpy(d + at * 2, &h, 2);
          } else {
            memcpy(d + at * 4, &v, 4);
          }
        }
      bufs[nb++] = d;
      char name[256];
      if (mlx)
        snprintf(name, sizeof name, "language_model.model.layers.%d.%s.lora_%c", t[i].layer,
                 paths[t[i].kind], ab ? 'b' : 'a');
      else
        snprintf(name, sizeof name,
                 "base_model.model.model.language_model.layers.%d.%s.lora_%c.weight", t[i].layer,
                 paths[t[i].kind], ab ? 'B' : 'A');
      int64_t shape[2] = {mlx ? cols : rows, mlx ? rows : cols};
      assert_int_equal(lm_st_writer_add(w, name, dt, 2, shape, d), LM_OK);
    }
  }
  static const float one[4] = {1, 1, 1, 1};
  if (extra) {
    int64_t shape[1] = {4};
    assert_int_equal(lm_st_writer_add(w, extra, LM_DT_F32, 1, shape, one), LM_OK);
  }
  snprintf(p, sizeof p, "%s/%s", dir, mlx ? "adapters.safetensors" : "adapter_model.safetensors");
  assert_int_equal(lm_st_writer_write(w, p), LM_OK);
  lm_st_writer_free(w);
  for (int i = 0; i < nb; i++)
    free(bufs[i]);
}

static const int32_t ids[] = {2, 40, 300, 17, 988, 5, 77, 1200, 64, 3, 451, 9, 2200, 18, 600, 31};
#define T ((int64_t)(sizeof ids / sizeof *ids))

/* Logits of ids[0..T) of model m: the first P in chunks of `chunk`, the rest one by one, with
 * the adapters set[0..n) attached. */
static float *run_model(lm_model *m, lm_backend *be, lm_lora *const *set, int n, const int32_t *tok,
                        int64_t T_, int64_t P, int64_t chunk) {
  int64_t V = m->cfg.vocab_size;
  float *out = malloc((size_t)(T_ * V) * sizeof(float));
  lm_forward *f;
  assert_int_equal(lm_forward_create(m, be, chunk, chunk, &f), LM_OK);
  lm_status s = lm_forward_set_adapters(f, set, n);
  if (s) fprintf(stderr, "%s\n", lm_errmsg());
  assert_int_equal(s, LM_OK);
  lm_kv_spec specs[m->cfg.n_caches + 1];
  lm_model_kv_specs(m, specs);
  lm_kv_set *kv;
  assert_int_equal(lm_kv_set_create(be, specs, m->cfg.n_caches, &kv), LM_OK);
  assert_int_equal(lm_forward_feed(f, kv, tok, P, chunk, out), LM_OK);
  if (T_ > P) assert_int_equal(lm_forward_feed(f, kv, tok + P, T_ - P, 1, out + P * V), LM_OK);
  lm_kv_set_free(kv);
  lm_forward_free(f);
  return out;
}

static float *run(lm_backend *be, lm_lora *const *set, int n, int64_t chunk) {
  return run_model(g_m, be, set, n, ids, T, T, chunk);
}

/* The model with each target's weight replaced by W + Σ scale·B·A (dense f32, formed here). */
typedef struct merged {
  lm_weight saved[32];
  lm_weight *where[32];
  float *data[32];
  int n;
} merged;

static void merge_in(merged *mg, const target *t, int n, const float *scale) {
  for (int i = 0; i < n; i++) {
    lm_weight *w = (lm_weight *)base_w(t[i].layer, t[i].kind);
    int j = 0;
    while (j < mg->n && mg->where[j] != w)
      j++;
    if (j == mg->n) { /* first adapter on this module: start from the base, as f32 */
      mg->where[j] = w, mg->saved[j] = *w, mg->n++;
      mg->data[j] = malloc((size_t)(w->rows * w->cols) * sizeof(float));
      assert_int_equal(w->dtype, LM_DT_BF16);
      for (int64_t k = 0; k < w->rows * w->cols; k++)
        mg->data[j][k] = lm_bf16_to_f32(((const uint16_t *)w->data)[k]);
    }
    for (int64_t o = 0; o < w->rows; o++)
      for (int64_t c = 0; c < w->cols; c++) {
        double acc = 0;
        for (int r = 0; r < t[i].rank; r++)
          acc += (double)t[i].b[o * t[i].rank + r] * (double)t[i].a[r * w->cols + c];
        mg->data[j][o * w->cols + c] += (float)(scale[i] * acc);
      }
  }
  for (int j = 0; j < mg->n; j++) {
    lm_weight *w = mg->where[j];
    w->dtype = LM_DT_F32, w->data = mg->data[j];
  }
}

static void merge_out(merged *mg) {
  for (int j = 0; j < mg->n; j++) {
    *mg->where[j] = mg->saved[j];
    free(mg->data[j]);
  }
  mg->n = 0;
}

static double max_rel(const float *a, const float *b, int64_t n) {
  double d = 0, m = 0;
  for (int64_t i = 0; i < n; i++) {
    d = fmax(d, fabs((double)a[i] - b[i]));
    m = fmax(m, fabs((double)b[i]));
  }
  return d / m;
}

static const char *peft_cfg = "{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, "
                              "\"target_modules\": [\"q_proj\"], \"bias\": \"none\", "
                              "\"use_dora\": false, \"modules_to_save\": null}";

static int setup(void **state) {
  (void)state;
  return lm_model_load(TINY, &g_m) ? -1 : 0;
}
static int teardown(void **state) {
  (void)state;
  lm_model_free(g_m);
  return 0;
}

/* Every kind of module, one adapter; then the same in mlx-lm's layout and in bf16. */
static void t_residual_equals_merged(void **state) {
  (void)state;
  target t[LM_LORA_KINDS];
  int layers[LM_LORA_KINDS] = {0, 2, 4, 5, 1, 3, 7, 6, 9};
  for (int k = 0; k < LM_LORA_KINDS; k++)
    make_target(&t[k], layers[k], k, 4);
  write_adapter(TMP "/one", 0, t, LM_LORA_KINDS, LM_DT_F32, peft_cfg, NULL);
  write_adapter(TMP "/one_mlx", 1, t, LM_LORA_KINDS, LM_DT_F32,
                "{\"fine_tune_type\": \"lora\", \"num_layers\": 10, \"lora_parameters\": "
                "{\"rank\": 4, \"scale\": 2.0, \"dropout\": 0.0}}",
                NULL);
  lm_backend *be;
  assert_int_equal(lm_backend_cpu_create(LM_PRECISION_F32, 0, &be), LM_OK);
  lm_lora *a, *b;
  assert_int_equal(lm_lora_load(g_m, TMP "/one", 1.0f, &a), LM_OK);
  assert_int_equal(lm_lora_load(g_m, TMP "/one_mlx", 1.0f, &b), LM_OK);
  assert_int_equal(a->n_mods, LM_LORA_KINDS);
  assert_string_equal(a->format, "peft");
  assert_string_equal(b->format, "mlx-lm");
  assert_float_equal(lm_lora_find(a, 4, LM_LORA_V)->scale, 2.0f, 0);
  float *base = run(be, NULL, 0, T);
  float *got = run(be, &a, 1, T), *got_chunked = run(be, &a, 1, 3), *got_mlx = run(be, &b, 1, T);
  float s[LM_LORA_KINDS];
  for (int k = 0; k < LM_LORA_KINDS; k++)
    s[k] = 2.0f;
  merged mg = {0};
  merge_in(&mg, t, LM_LORA_KINDS, s);
  float *ref = run(be, NULL, 0, T);
  merge_out(&mg);
  int64_t n = T * g_m->cfg.vocab_size;
  double e1 = max_rel(got, ref, n), e2 = max_rel(got_chunked, ref, n),
         moved = max_rel(base, ref, n);
  printf("  adapter vs merged: %.3g (one pass), %.3g (chunks of 3); base vs merged %.3g\n", e1, e2,
         moved);
  assert_true(moved > 1e-2); /* the adapter changes the model */
  assert_true(e1 < 1e-5 && e2 < 1e-5);
  assert_memory_equal(got, got_mlx, (size_t)n * sizeof(float));
  /* detached from the forward that had it: the base, bit for bit */
  float *again = malloc((size_t)n * sizeof(float));
  {
    lm_forward *f;
    lm_kv_spec specs[g_m->cfg.n_caches + 1];
    lm_model_kv_specs(g_m, specs);
    assert_int_equal(lm_forward_create(g_m, be, T, T, &f), LM_OK);
    for (int pass = 0; pass < 2; pass++) {
      assert_int_equal(lm_forward_set_adapters(f, &a, pass ? 0 : 1), LM_OK);
      lm_kv_set *kv;
      assert_int_equal(lm_kv_set_create(be, specs, g_m->cfg.n_caches, &kv), LM_OK);
      assert_int_equal(lm_forward_feed(f, kv, ids, T, T, again), LM_OK);
      lm_kv_set_free(kv);
      if (!pass) assert_memory_equal(again, got, (size_t)n * sizeof(float));
    }
    lm_forward_free(f);
  }
  assert_memory_equal(again, base, (size_t)n * sizeof(float));
  lm_lora *c;
  write_adapter(TMP "/one_bf16", 0, t, 3, LM_DT_BF16, peft_cfg, NULL);
  assert_int_equal(lm_lora_load(g_m, TMP "/one_bf16", 1.0f, &c), LM_OK);
  assert_float_equal(c->mods[0].a_data[0], lm_round_bf16(t[0].a[0]), 0);
  lm_lora_free(c);
  free(base), free(got), free(got_chunked), free(got_mlx), free(ref), free(again);
  lm_lora_free(a), lm_lora_free(b);
  for (int k = 0; k < LM_LORA_KINDS; k++)
    free(t[k].a), free(t[k].b);
  lm_backend_destroy(be);
}

/* Two adapters stacked, the second at weight 0.5 and with rsLoRA, sharing one module. */
static void t_stacked(void **state) {
  (void)state;
  target t1[2], t2[2];
  make_target(&t1[0], 1, LM_LORA_Q, 4);
  make_target(&t1[1], 3, LM_LORA_DOWN, 4);
  make_target(&t2[0], 3, LM_LORA_DOWN, 2);
  make_target(&t2[1], 8, LM_LORA_UP, 2);
  write_adapter(TMP "/s1", 0, t1, 2, LM_DT_F32, peft_cfg, NULL);
  write_adapter(TMP "/s2", 0, t2, 2, LM_DT_F32,
                "{\"r\": 2, \"lora_alpha\": 4, \"use_rslora\": true}", NULL);
  lm_backend *be;
  assert_int_equal(lm_backend_cpu_create(LM_PRECISION_F32, 0, &be), LM_OK);
  lm_lora *set[2];
  assert_int_equal(lm_lora_load(g_m, TMP "/s1", 1.0f, &set[0]), LM_OK);
  assert_int_equal(lm_lora_load(g_m, TMP "/s2", 0.5f, &set[1]), LM_OK);
  assert_float_equal(set[1]->mods[0].scale, (float)(4 / sqrt(2.0)), 1e-6);
  float *got = run(be, set, 2, 5);
  merged mg = {0};
  float s1[2] = {2.0f, 2.0f}, s2[2] = {(float)(0.5 * 4 / sqrt(2.0)), (float)(0.5 * 4 / sqrt(2.0))};
  merge_in(&mg, t1, 2, s1);
  merged mg2 = {0};
  for (int i = 0; i < 2; i++) { /* modules only the second adapter touches */
    lm_weight *w = (lm_weight *)base_w(t2[i].layer, t2[i].kind);
    if (w->dtype == LM_DT_BF16) merge_in(&mg2, &t2[i], 1, &s2[i]);
  }
  for (int i = 0; i < 2; i++) { /* the shared module: add the second adapter's delta in place */
    lm_weight *w = (lm_weight *)base_w(t2[i].layer, t2[i].kind);
    int in1 = 0;
    for (int j = 0; j < mg.n; j++)
      in1 |= mg.where[j] == w;
    if (!in1) continue;
    float *d = (float *)w->data;
    for (int64_t o = 0; o < w->rows; o++)
      for (int64_t c = 0; c < w->cols; c++) {
        double acc = 0;
        for (int r = 0; r < t2[i].rank; r++)
          acc += (double)t2[i].b[o * t2[i].rank + r] * (double)t2[i].a[r * w->cols + c];
        d[o * w->cols + c] += (float)(s2[i] * acc);
      }
  }
  float *ref = run(be, NULL, 0, T);
  merge_out(&mg2);
  merge_out(&mg);
  double e = max_rel(got, ref, T * g_m->cfg.vocab_size);
  printf("  two stacked adapters vs merged: %.3g\n", e);
  assert_true(e < 1e-5);
  free(got), free(ref);
  lm_lora_free(set[0]), lm_lora_free(set[1]);
  for (int i = 0; i < 2; i++)
    free(t1[i].a), free(t1[i].b), free(t2[i].a), free(t2[i].b);
  lm_backend_destroy(be);
}

/* rank_pattern / alpha_pattern as PEFT matches them ((.*\.)?(KEY)$), and the caller's weight. */
static void t_patterns(void **state) {
  (void)state;
  target t[3];
  make_target(&t[0], 2, LM_LORA_O, 2);
  make_target(&t[1], 3, LM_LORA_O, 4);
  make_target(&t[2], 5, LM_LORA_Q, 4);
  write_adapter(
      TMP "/pat", 0, t, 3, LM_DT_F32,
      "{\"r\": 4, \"lora_alpha\": 8, \"rank_pattern\": {\"layers.2.self_attn.o_proj\": "
      "2}, \"alpha_pattern\": {\"o_proj\": 1, \"language_model\\\\.layers\\\\.5\\\\..*\": 32}}",
      NULL);
  lm_lora *l;
  lm_status s = lm_lora_load(g_m, TMP "/pat", 3.0f, &l);
  if (s) fprintf(stderr, "%s\n", lm_errmsg());
  assert_int_equal(s, LM_OK);
  assert_float_equal(lm_lora_find(l, 2, LM_LORA_O)->scale, 0.5f, 0);  /* alpha 1 / r 2 */
  assert_float_equal(lm_lora_find(l, 3, LM_LORA_O)->scale, 0.25f, 0); /* alpha 1 / r 4 */
  assert_float_equal(lm_lora_find(l, 5, LM_LORA_Q)->scale, 8.0f, 0);  /* alpha 32 / r 4 */
  const lm_lora_module *q = lm_lora_find(l, 5, LM_LORA_Q);
  assert_float_equal(q->b_data[7], t[2].b[7] * 8.0f * 3.0f, 1e-6);
  assert_null(lm_lora_find(l, 5, LM_LORA_K));
  lm_lora_free(l);
  for (int i = 0; i < 3; i++)
    free(t[i].a), free(t[i].b);
  char dir[64];
  float w;
  assert_int_equal(lm_lora_parse_arg("ad/one@0.5", dir, sizeof dir, &w), LM_OK);
  assert_string_equal(dir, "ad/one");
  assert_float_equal(w, 0.5f, 0);
  assert_int_equal(lm_lora_parse_arg("a@b/x", dir, sizeof dir, &w), LM_OK);
  assert_string_equal(dir, "a@b/x");
  assert_float_equal(w, 1.0f, 0);
  assert_int_equal(lm_lora_parse_arg("@2", dir, sizeof dir, &w), LM_ERR_INVALID);
}

/* Each refusal names its cause. */
static void t_refusals(void **state) {
  (void)state;
  target t[1], big[1];
  make_target(&t[0], 1, LM_LORA_Q, 4);
  make_target(&big[0], 1, LM_LORA_K, 4);
  static const struct {
    const char *name, *config, *extra;
    int mlx, layer, wrong_shape;
    lm_status want;
    const char *says;
  } C[] = {
      {"dora", "{\"r\": 4, \"lora_alpha\": 8, \"use_dora\": true}", NULL, 0, 0, 0,
       LM_ERR_UNSUPPORTED, "DoRA"},
      {"dora_t", "{\"r\": 4, \"lora_alpha\": 8}",
       "base_model.model.model.language_model.layers.1.self_attn.q_proj.lora_magnitude_vector", 0,
       0, 0, LM_ERR_UNSUPPORTED, "DoRA"},
      {"save", "{\"r\": 4, \"lora_alpha\": 8, \"modules_to_save\": [\"lm_head\"]}", NULL, 0, 0, 0,
       LM_ERR_UNSUPPORTED, "modules_to_save"},
      {"bias", "{\"r\": 4, \"lora_alpha\": 8, \"bias\": \"all\"}", NULL, 0, 0, 0,
       LM_ERR_UNSUPPORTED, "biases"},
      {"bias_t", "{\"r\": 4, \"lora_alpha\": 8}",
       "base_model.model.model.language_model.layers.1.self_attn.q_proj.bias", 0, 0, 0,
       LM_ERR_UNSUPPORTED, "biases"},
      {"embed", "{\"r\": 4, \"lora_alpha\": 8}",
       "base_model.model.model.language_model.embed_tokens.lora_embedding_A", 0, 0, 0,
       LM_ERR_UNSUPPORTED, "embedding"},
      {"expert", "{\"r\": 4, \"lora_alpha\": 8}",
       "base_model.model.model.language_model.layers.1.experts.gate_up_proj.lora_A.weight", 0, 0, 0,
       LM_ERR_UNSUPPORTED, "experts"},
      {"layer", "{\"r\": 4, \"lora_alpha\": 8}", NULL, 0, 40, 0, LM_ERR_INVALID, "10 layers"},
      {"shape", "{\"r\": 4, \"lora_alpha\": 8}", NULL, 0, 0, 1, LM_ERR_INVALID, "do not fit"},
      {"lone", "{\"r\": 4, \"lora_alpha\": 8}",
       "base_model.model.model.language_model.layers.2.self_attn.q_proj.lora_A.weight", 0, 0, 0,
       LM_ERR_CORRUPT, "no lora_B"},
      {"rank", "{\"r\": 8, \"lora_alpha\": 8}", NULL, 0, 0, 0, LM_ERR_CORRUPT, "rank 4"},
      {"full", "{\"fine_tune_type\": \"full\"}", NULL, 1, 0, 0, LM_ERR_UNSUPPORTED, "full"},
      {"mlx_dora", "{\"fine_tune_type\": \"dora\"}", NULL, 1, 0, 0, LM_ERR_UNSUPPORTED, "DoRA"},
  };
  for (size_t i = 0; i < sizeof C / sizeof *C; i++) {
    char dir[256];
    snprintf(dir, sizeof dir, TMP "/bad_%s", C[i].name);
    target u = C[i].wrong_shape ? big[0] : t[0];
    if (C[i].wrong_shape) u.kind = LM_LORA_Q; /* k's shapes under q's name */
    if (C[i].layer) u.layer = C[i].layer;
    write_adapter(dir, C[i].mlx, &u, 1, LM_DT_F32, C[i].config, C[i].extra);
    lm_lora *l = NULL;
    lm_status s = lm_lora_load(g_m, dir, 1.0f, &l);
    printf("  %-9s -> %s\n", C[i].name, s ? lm_errmsg() : "(loaded)");
    assert_int_equal(s, C[i].want);
    assert_non_null(strstr(lm_errmsg(), C[i].says));
    assert_null(l);
  }
  lm_lora *l = NULL;
  assert_int_equal(lm_lora_load(g_m, TMP, 1.0f, &l), LM_ERR_NOT_FOUND);
  assert_non_null(strstr(lm_errmsg(), "adapter_config.json"));
  free(t[0].a), free(t[0].b), free(big[0].a), free(big[0].b);
}

/* merge-lora into the bf16 embedded model and into its 4-bit copy: the merged checkpoint has
 * the base's tensors (names, dtypes, shapes) and loads; the bf16 merge gives the runtime
 * adapter's logits up to bf16 rounding of the merged weights, the 4-bit one up to quantizing
 * them again (far closer to the adapter than the base is). */
static void t_merge(void **state) {
  (void)state;
  static const char *bases[2] = {TINY, LM_SOURCE_DIR "/models/lumen-tiny-kjv-4bit"};
  target t[3];
  make_target(&t[0], 1, LM_LORA_Q, 4);
  make_target(&t[1], 3, LM_LORA_GATE, 4);
  make_target(&t[2], 8, LM_LORA_DOWN, 4);
  write_adapter(TMP "/merge_src", 0, t, 3, LM_DT_F32, peft_cfg, NULL);
  lm_backend *be;
  assert_int_equal(lm_backend_cpu_create(LM_PRECISION_F32, 0, &be), LM_OK);
  for (int q = 0; q < 2; q++) {
    lm_model *m, *mm;
    assert_int_equal(lm_model_load(bases[q], &m), LM_OK);
    lm_lora *l;
    assert_int_equal(lm_lora_load(m, TMP "/merge_src", 1.0f, &l), LM_OK);
    const char *out = q ? TMP "/merged4" : TMP "/merged";
    lm_status s = lm_lora_merge(m, &l, 1, out);
    if (s) fprintf(stderr, "%s\n", lm_errmsg());
    assert_int_equal(s, LM_OK);
    assert_int_equal(lm_model_load(out, &mm), LM_OK);
    assert_int_equal(lm_st_count(mm->st), lm_st_count(m->st));
    for (size_t i = 0; i < lm_st_count(m->st); i++) {
      const lm_st_tensor *a = lm_st_at(m->st, i), *b = lm_st_find(mm->st, a->name);
      assert_non_null(b);
      assert_int_equal(a->dtype, b->dtype);
      assert_memory_equal(a->shape, b->shape, sizeof a->shape);
    }
    assert_int_equal(mm->quant.present, m->quant.present);
    float *rt = run_model(m, be, &l, 1, ids, T, T, T),
          *mg = run_model(mm, be, NULL, 0, ids, T, T, T),
          *bs = run_model(m, be, NULL, 0, ids, T, T, T);
    double k_merged, k_base;
    int64_t agree;
    lm_logits_kl(rt, mg, T, m->cfg.vocab_size, &k_merged, &agree);
    lm_logits_kl(rt, bs, T, m->cfg.vocab_size, &k_base, &agree);
    printf("  merge into %s: KL(adapter || merged) %.3g, KL(adapter || base) %.3g\n",
           q ? "4-bit" : "bf16", k_merged, k_base);
    assert_true(k_base > 0.05);
    assert_true(q ? k_merged < 0.05 * k_base : k_merged < 1e-4);
    free(rt), free(mg), free(bs);
    lm_lora_free(l);
    lm_model_free(mm);
    lm_model_free(m);
  }
  lm_backend_destroy(be);
  for (int i = 0; i < 3; i++)
    free(t[i].a), free(t[i].b);
}

/* The engine with adapters (what run, chat, generate and serve take with --adapter): its
 * logits are the forward's with the adapter attached, bit for bit; KV state files are refused
 * (they are not keyed by adapters), and so is speculative decoding; a missing adapter fails the
 * engine's creation. */
static void t_engine(void **state) {
  (void)state;
  target t[2];
  make_target(&t[0], 2, LM_LORA_Q, 4);
  make_target(&t[1], 5, LM_LORA_UP, 4);
  write_adapter(TMP "/eng", 0, t, 2, LM_DT_F32, peft_cfg, NULL);
  lm_checkpoint *ck;
  assert_int_equal(lm_checkpoint_open(TINY, &ck), LM_OK);
  lm_engine_options eo;
  lm_engine_options_init(&eo);
  eo.backend = "cpu", eo.precision = "f32", eo.kv_budget = -1;
  const char *dirs[2] = {TMP "/eng", TMP "/nope"};
  float w[1] = {0.75f};
  eo.adapters = dirs, eo.adapter_weights = w, eo.n_adapters = 1;
  lm_engine *e;
  assert_int_equal(lm_engine_create(ck, &eo, &e), LM_OK);
  int64_t n = T * g_m->cfg.vocab_size;
  float *got = malloc((size_t)n * sizeof(float));
  assert_int_equal(lm_engine_logits(e, ids, T, T, T, got), LM_OK);
  lm_backend *be;
  assert_int_equal(lm_backend_cpu_create(LM_PRECISION_F32, 0, &be), LM_OK);
  lm_lora *l;
  assert_int_equal(lm_lora_load(g_m, TMP "/eng", 0.75f, &l), LM_OK);
  float *want = run(be, &l, 1, T);
  assert_memory_equal(got, want, (size_t)n * sizeof(float));
  assert_int_equal(lm_engine_save_state(e, ids, T, TMP "/s.lmkv", NULL), LM_ERR_UNSUPPORTED);
  assert_non_null(strstr(lm_errmsg(), "adapters"));
  lm_engine_free(e);
  eo.speculative_tokens = 2; /* verification's exactness is not established through adapters */
  assert_int_equal(lm_engine_create(ck, &eo, &e), LM_ERR_UNSUPPORTED);
  assert_non_null(strstr(lm_errmsg(), "speculative"));
  eo.speculative_tokens = 0;
  eo.n_adapters = 2, eo.adapter_weights = NULL;
  assert_int_equal(lm_engine_create(ck, &eo, &e), LM_ERR_NOT_FOUND);
  lm_checkpoint_free(ck);
  lm_lora_free(l);
  lm_backend_destroy(be);
  free(got), free(want);
  for (int i = 0; i < 2; i++)
    free(t[i].a), free(t[i].b);
}

/* The PEFT-made fixtures (lora_fixture.h), CPU f32. */
static void t_fixtures(void **state) {
  (void)state;
  lm_backend *be;
  assert_int_equal(lm_backend_cpu_create(LM_PRECISION_F32, 0, &be), LM_OK);
  int checked = 0, fails = lm_fx_lora_check_all(FIXTURES, be, &checked);
  lm_backend_destroy(be);
  if (!checked) {
    printf("  no LoRA fixtures under %s: skipped\n", FIXTURES);
    skip();
  }
  assert_int_equal(fails, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(t_residual_equals_merged),
                                     cmocka_unit_test(t_stacked),
                                     cmocka_unit_test(t_patterns),
                                     cmocka_unit_test(t_refusals),
                                     cmocka_unit_test(t_merge),
                                     cmocka_unit_test(t_engine),
                                     cmocka_unit_test(t_fixtures)};
  return cmocka_run_group_tests(tests, setup, teardown);
}
