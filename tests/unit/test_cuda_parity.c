/* test_cuda_parity.c — whole-model parity of the CUDA backend.
 *  - Reference fixtures (tests/fixtures/NAME, tools/oracle/gen_fixtures.py): with f32
 *    activations, prefill / chunked prefill / prefill + decode meet the CPU tolerance
 *    (max|Δlogit| ≤ 1e-3·max|ref|, same argmax everywhere); with bf16 activations, the
 *    fixture's statistical bound for transformers' own bf16 run (meta.json tolerance.bf16:
 *    mean KL to the f32 reference and argmax agreement).
 *  - Synthetic models (small PLE/KV-sharing and MoE/k_eq_v geometries, 4-bit and bf16
 *    weights) and the E4B preset with random 4-bit weights: CUDA against the CPU backend,
 *    with the same f32 bound, and a loose bf16 bound (mean KL ≤ 1e-2, argmax agreement ≥ 75%).
 *  - The planned path: decode with captured graphs is bit-identical to decode without them,
 *    and the plan's use counter shows the graphs ran; with quantized caches too, across a
 *    --kv-quant-start conversion (which must rebuild the plan).
 *  - Quantized caches: the kv fixtures (e4b_like_kv8/kv4/kvmix, test_kv_quant.c's bounds) and
 *    --kv-quant-start against the CPU backend.
 * Skips (exit 0) without a CUDA build or a GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/status.h"
#include "model/forward.h"
#include "model/kv_plan.h"
#include "util/fixture.h"
#include "util/lora_batch.h"
#include "util/lora_fixture.h"
#ifdef LM_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

/* Compiled-in locations, overridable where the binary runs away from its source tree
 * (tools/gpu/check.sh packs it for the GPU machine). */
static const char *env_or(const char *name, const char *dflt) {
  const char *v = getenv(name);
  return v && *v ? v : dflt;
}
#define FIXTURES env_or("LUMEN_FIXTURES", LM_SOURCE_DIR "/tests/fixtures")
#define PRESETS env_or("LUMEN_PRESETS", LM_SHARED_DIR "/presets")

static const char *small_cfg =
    "{\"model_type\":\"gemma4\",\"text_config\":{\"model_type\":\"gemma4_text\",\"vocab_size\":512,"
    "\"hidden_size\":128,\"intermediate_size\":256,\"num_hidden_layers\":6,\"num_attention_heads\":"
    "4,"
    "\"num_key_value_heads\":2,\"head_dim\":64,\"global_head_dim\":128,\"sliding_window\":8,"
    "\"final_logit_softcapping\":30.0,\"hidden_size_per_layer_input\":64,\"vocab_size_per_layer_"
    "input\":512,"
    "\"num_kv_shared_layers\":2,\"layer_types\":[\"sliding_attention\",\"sliding_attention\","
    "\"full_attention\","
    "\"sliding_attention\",\"sliding_attention\",\"full_attention\"]}}";

static const char *moe_cfg =
    "{\"model_type\":\"gemma4\",\"text_config\":{\"model_type\":\"gemma4_text\",\"vocab_size\":512,"
    "\"hidden_size\":128,\"intermediate_size\":128,\"num_hidden_layers\":4,\"num_attention_heads\":"
    "4,"
    "\"num_key_value_heads\":2,\"num_global_key_value_heads\":1,\"head_dim\":64,\"global_head_"
    "dim\":128,"
    "\"attention_k_eq_v\":true,\"sliding_window\":8,\"final_logit_softcapping\":30.0,"
    "\"hidden_size_per_layer_input\":0,\"enable_moe_block\":true,\"num_experts\":8,\"top_k_"
    "experts\":2,"
    "\"moe_intermediate_size\":128,\"layer_types\":[\"sliding_attention\",\"full_attention\","
    "\"sliding_attention\",\"full_attention\"]}}";

static int gpu_present(void) {
#ifdef LM_HAVE_CUDA
  return lm_cuda_device_count() > 0;
#else
  return 0;
#endif
}

#define NEED_GPU()                                                                                 \
  if (!gpu_present()) {                                                                            \
    printf("no CUDA device (or no CUDA build): skipped\n");                                        \
    skip();                                                                                        \
  }

static lm_backend *make_backend(int cuda, lm_precision prec) {
  lm_backend *be = NULL;
  lm_status s = LM_ERR_UNSUPPORTED;
#ifdef LM_HAVE_CUDA
  s = cuda ? lm_backend_cuda_create(prec, 0, &be) : lm_backend_cpu_create(prec, 0, &be);
#else
  if (!cuda) s = lm_backend_cpu_create(prec, 0, &be);
#endif
  if (s) fprintf(stderr, "backend: %s\n", lm_errmsg());
  assert_int_equal(s, LM_OK);
  return be;
}

/* Feeds ids (prefill in chunks, then decode one by one) into a fresh cache set of these kinds:
 * [T][V]. */
static float *run_specs(lm_model *m, lm_backend *be, const lm_kv_spec *specs, const int32_t *ids,
                        int64_t T, int64_t prefill, int64_t chunk) {
  int64_t V = m->cfg.vocab_size;
  float *out = malloc((size_t)(T * V) * sizeof(float));
  lm_kv_set *kv = NULL;
  lm_forward *f = NULL;
  assert_int_equal(lm_model_prepare(m, be), LM_OK);
  assert_int_equal(lm_kv_set_create(be, specs, m->cfg.n_caches, &kv), LM_OK);
  assert_int_equal(lm_forward_create(m, be, chunk, chunk, &f), LM_OK);
  lm_status s = lm_forward_feed(f, kv, ids, prefill, chunk, out);
  if (!s) s = lm_forward_feed(f, kv, ids + prefill, T - prefill, 1, out + prefill * V);
  if (s) fprintf(stderr, "forward failed: %s\n", lm_errmsg());
  assert_int_equal(s, LM_OK);
  lm_forward_free(f);
  lm_kv_set_free(kv);
  return out;
}

/* run_specs with the model's default (plain) caches. */
static float *run_mode(lm_model *m, lm_backend *be, const int32_t *ids, int64_t T, int64_t prefill,
                       int64_t chunk) {
  lm_kv_spec specs[m->cfg.n_caches + 1];
  lm_model_kv_specs(m, specs);
  return run_specs(m, be, specs, ids, T, prefill, chunk);
}

typedef struct bound {
  double mean_kl_max, argmax_min; /* < 0: the f32 bound (max|Δ| and every argmax) */
} bound;

static int check(const char *what, const float *ref, const float *got, int64_t T, int64_t V,
                 bound b) {
  lm_fx_cmp c = lm_fx_compare(ref, got, T, V);
  int ok = b.mean_kl_max < 0 ? c.max_abs_diff <= 1e-3 * c.max_abs_ref && c.argmax_agree == T
                             : isfinite(c.mean_kl) && c.mean_kl <= b.mean_kl_max &&
                                   c.argmax_agree >= b.argmax_min;
  printf("  %-40s T=%-4lld max|d|=%.3g (max|ref| %.3g) kl=%.3g argmax %lld/%lld %s\n", what,
         (long long)T, c.max_abs_diff, c.max_abs_ref, c.mean_kl, (long long)c.argmax_agree,
         (long long)T, ok ? "ok" : "FAIL");
  return ok;
}

static const bound F32 = {-1, -1};

/* The three feeding modes of test_parity.c against one reference. */
static int check_modes(const char *name, lm_model *m, lm_backend *be, const int32_t *ids, int64_t T,
                       const float *ref, bound b) {
  struct {
    const char *mode;
    int64_t prefill, chunk;
  } modes[] = {{"prefill", T, T}, {"chunked", T, 5}, {"decode", T / 2, T / 2 > 0 ? T / 2 : 1}};
  int fails = 0;
  for (size_t i = 0; i < 3; i++) {
    float *got = run_mode(m, be, ids, T, modes[i].prefill, modes[i].chunk);
    char what[128];
    snprintf(what, sizeof what, "%s %s %s", name, be->act_dtype == LM_DT_F32 ? "f32" : "bf16",
             modes[i].mode);
    fails += !check(what, ref, got, T, m->cfg.vocab_size, b);
    free(got);
  }
  return fails;
}

/* meta.json's tolerance.<key> bound ("bf16", "fp32"), or a negative kl when absent. */
static bound meta_bound(const char *dir, const char *key) {
  bound b = {-2, 0};
  (void)lm_fx_bound(dir, key, &b.mean_kl_max, &b.argmax_min); /* sets both or neither */
  return b;
}

static void t_fixtures(void **state) {
  (void)state;
  NEED_GPU();
  char **names;
  int n = lm_fx_list(FIXTURES, "logits.f32", &names), checked = 0, fails = 0;
  for (int i = 0; i < n; i++) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", FIXTURES, names[i]);
    if (!lm_fx_has_weights(dir)) continue;
    lm_model *m = NULL;
    assert_int_equal(lm_model_load(dir, &m), LM_OK);
    int32_t *ids;
    float *ref;
    int64_t T = lm_fx_load(dir, m->cfg.vocab_size, &ids, &ref);
    assert_true(T > 0);
    lm_backend *be = make_backend(1, LM_PRECISION_F32);
    fails += check_modes(names[i], m, be, ids, T, ref, F32);
    lm_backend_destroy(be);
    bound b = meta_bound(dir, "bf16");
    if (b.mean_kl_max >= 0) {
      be = make_backend(1, LM_PRECISION_FAST);
      fails += check_modes(names[i], m, be, ids, T, ref, b);
      lm_backend_destroy(be);
    }
    checked++;
    free(ref);
    free(ids);
    lm_model_free(m);
  }
  lm_fx_free_list(names, n);
  printf("  %d fixtures checked\n", checked);
  if (!checked) printf("  (no fixtures with weights under tests/fixtures)\n");
  assert_int_equal(fails, 0);
}

static lm_model *synth(const char *name, const char *json, int bits, int group) {
  char p[1024];
  snprintf(p, sizeof p, "%s/lumen_cuda_parity_%d_%s.json", env_or("TMPDIR", "/tmp"), (int)getpid(),
           name);
  FILE *f = fopen(p, "wb");
  assert_non_null(f);
  fputs(json, f);
  fclose(f);
  lm_model *m = NULL;
  lm_status s = lm_model_synth(p, bits, group, 5, &m);
  unlink(p);
  if (s) fprintf(stderr, "synth %s: %s\n", name, lm_errmsg());
  assert_int_equal(s, LM_OK);
  return m;
}

static void ids_for(int32_t *ids, int64_t T, int64_t V) {
  for (int64_t i = 0; i < T; i++)
    ids[i] = (int32_t)(3 + (i * 2654435761u) % (uint64_t)(V - 3));
}

static const bound BF16_LOOSE = {1e-2, 0};

static void vs_cpu(const char *name, lm_model *m, int64_t T, int *fails) {
  int32_t ids[T];
  ids_for(ids, T, m->cfg.vocab_size);
  lm_backend *cpu = make_backend(0, LM_PRECISION_F32);
  float *ref = run_mode(m, cpu, ids, T, T, T);
  lm_backend_destroy(cpu);
  lm_backend *be = make_backend(1, LM_PRECISION_F32);
  *fails += check_modes(name, m, be, ids, T, ref, F32);
  lm_backend_destroy(be);
  be = make_backend(1, LM_PRECISION_FAST);
  bound b = BF16_LOOSE;
  b.argmax_min = 0.75 * (double)T;
  *fails += check_modes(name, m, be, ids, T, ref, b);
  lm_backend_destroy(be);
  free(ref);
}

static void t_synthetic(void **state) {
  (void)state;
  NEED_GPU();
  int fails = 0;
  struct {
    const char *name, *json;
    int bits, group;
  } M[] = {{"small-q4", small_cfg, 4, 64},
           {"small-bf16", small_cfg, 0, 0},
           {"moe-q4", moe_cfg, 4, 64},
           {"moe-q8", moe_cfg, 8, 32}};
  for (size_t i = 0; i < sizeof M / sizeof *M; i++) {
    lm_model *m = synth(M[i].name, M[i].json, M[i].bits, M[i].group);
    vs_cpu(M[i].name, m, 23, &fails);
    lm_model_free(m);
  }
  assert_int_equal(fails, 0);
}

/* The E4B geometry with random 4-bit g64 weights: CUDA vs CPU on a short prompt. */
static void t_e4b(void **state) {
  (void)state;
  NEED_GPU();
  char preset[1024];
  snprintf(preset, sizeof preset, "%s/gemma4-e4b.json", PRESETS);
  if (access(preset, R_OK) != 0) {
    printf("  %s not found: skipped\n", preset);
    skip();
  }
  lm_model *m = NULL;
  assert_int_equal(lm_model_synth(preset, 4, 64, 1, &m), LM_OK);
  int fails = 0;
  int64_t T = 6, V = m->cfg.vocab_size;
  int32_t ids[6];
  ids_for(ids, T, V);
  lm_backend *cpu = make_backend(0, LM_PRECISION_F32);
  float *ref = run_mode(m, cpu, ids, T, 4, 4);
  lm_backend_destroy(cpu);
  lm_backend *be = make_backend(1, LM_PRECISION_F32);
  float *got = run_mode(m, be, ids, T, 4, 4);
  fails += !check("e4b q4/g64 f32 (prefill 4 + decode 2)", ref, got, T, V, F32);
  free(got);
  lm_backend_destroy(be);
  be = make_backend(1, LM_PRECISION_FAST);
  got = run_mode(m, be, ids, T, 4, 4);
  bound b = {5e-2, 0.5 * (double)T};
  fails += !check("e4b q4/g64 bf16 (prefill 4 + decode 2)", ref, got, T, V, b);
  free(got);
  lm_backend_destroy(be);
  free(ref);
  lm_model_free(m);
  assert_int_equal(fails, 0);
}

#ifdef LM_HAVE_CUDA
/* Runs ids (prefill 5, then decode) over caches of these kinds with plans off and on: the
 * logits must be bit-identical, the planned run must have replayed every decode step and
 * built at least min_builds plans. */
static void plans_identical(const char *what, lm_model *m, lm_precision prec,
                            const lm_kv_spec *specs, int64_t T, int64_t min_builds) {
  int64_t V = m->cfg.vocab_size, uses[2], builds[2];
  int32_t ids[T];
  ids_for(ids, T, V);
  float *out[2];
  for (int on = 0; on < 2; on++) {
    lm_backend *be = make_backend(1, prec);
    lm_cuda_set_plans(be, on);
    out[on] = run_specs(m, be, specs, ids, T, 5, 5);
    lm_cuda_plan_stats(be, &uses[on], &builds[on]);
    if (on && builds[on] < min_builds)
      printf("  last refused capture: %s\n", lm_cuda_plan_error(be));
    lm_backend_destroy(be);
  }
  printf("  %s: off uses %lld; on uses %lld, builds %lld\n", what, (long long)uses[0],
         (long long)uses[1], (long long)builds[1]);
  assert_int_equal(uses[0], 0);
  assert_true(builds[1] >= min_builds);
  assert_true(uses[1] >= T - 5);
  assert_memory_equal(out[0], out[1], (size_t)(T * V) * sizeof(float));
  free(out[0]);
  free(out[1]);
}
#endif

/* Decode logits with plans on and off must be identical bit for bit; the rings wrap (window
 * 8 < 5 + 12 tokens), so the replayed graphs see new ring slots and cache lengths. */
static void t_plan(void **state) {
  (void)state;
  NEED_GPU();
#ifdef LM_HAVE_CUDA
  for (int pi = 0; pi < 2; pi++) {
    lm_model *m = synth("plan", pi ? moe_cfg : small_cfg, 4, 64);
    lm_kv_spec specs[m->cfg.n_caches + 1];
    lm_model_kv_specs(m, specs);
    plans_identical(pi ? "plan moe bf16" : "plan small f32", m,
                    pi ? LM_PRECISION_FAST : LM_PRECISION_F32, specs, 17, 1);
    lm_model_free(m);
  }
#endif
}

/* ---- quantized caches ------------------------------------------------------------------------ */

/* The quantized-KV fixtures (test_kv_quant.c runs them on the CPU): e4b_like's weights with
 * caches planned by --kv-quant 8 or 4 (groups of 32) or the fixture's kv_config.json, in the
 * three feeding modes. f32: the tight mean KL of the CPU path (≤ 1e-3: the device stores what
 * the reference stores, up to rare last-bit code flips) and meta.json's fp32 argmax bound;
 * bf16: meta.json's bf16 bound. */
static void t_kv_fixtures(void **state) {
  (void)state;
  NEED_GPU();
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/e4b_like", FIXTURES);
  if (!lm_fx_has_weights(dir)) {
    printf("  %s has no weights: skipped\n", dir);
    skip();
  }
  static const struct {
    const char *name, *mode;
    int group;
  } F[] = {{"e4b_like_kv8", "8", 32}, {"e4b_like_kv4", "4", 32}, {"e4b_like_kvmix", "config", 0}};
  lm_model *m = NULL;
  assert_int_equal(lm_model_load(dir, &m), LM_OK);
  int fails = 0;
  for (size_t i = 0; i < sizeof F / sizeof *F; i++) {
    char fx[1024], p[1100];
    snprintf(fx, sizeof fx, "%s/%s", FIXTURES, F[i].name);
    snprintf(p, sizeof p, "%s/kv_config.json", fx);
    lm_kv_spec specs[m->cfg.n_caches + 1];
    lm_kv_options o = {.mode = F[i].mode, .group = F[i].group, .config_path = p};
    lm_status ps = lm_model_kv_plan(m, &o, specs);
    if (ps) fprintf(stderr, "%s\n", lm_errmsg());
    assert_int_equal(ps, LM_OK);
    int32_t *ids;
    float *ref;
    int64_t T = lm_fx_load(fx, m->cfg.vocab_size, &ids, &ref), V = m->cfg.vocab_size;
    assert_true(T > 0);
    bound b32 = meta_bound(fx, "fp32"), b16 = meta_bound(fx, "bf16");
    assert_true(b32.mean_kl_max >= 0 && b16.mean_kl_max >= 0);
    b32.mean_kl_max = fmin(b32.mean_kl_max, 1e-3);
    struct {
      const char *mode;
      int64_t prefill, chunk;
    } modes[] = {{"prefill", T, T}, {"chunked", T, 5}, {"decode", T / 2, T / 2}};
    for (int pi = 0; pi < 2; pi++) {
      lm_backend *be = make_backend(1, pi ? LM_PRECISION_FAST : LM_PRECISION_F32);
      for (size_t k = 0; k < 3; k++) {
        float *got = run_specs(m, be, specs, ids, T, modes[k].prefill, modes[k].chunk);
        char what[128];
        snprintf(what, sizeof what, "%s %s %s", F[i].name, pi ? "bf16" : "f32", modes[k].mode);
        fails += !check(what, ref, got, T, V, pi ? b16 : b32);
        free(got);
      }
      lm_backend_destroy(be);
    }
    free(ref);
    free(ids);
  }
  lm_model_free(m);
  assert_int_equal(fails, 0);
}

/* --kv-quant-start 20 on the device against the CPU: e4b_like, 8-bit groups of 32; the caches
 * convert (kv_convert) between the prefill, in chunks of 4, and the decode that follows. Both
 * paths quantize the same rows at the same moment, so they agree as closely as the f32 paths
 * of the quantized fixtures do (mean KL ≤ 1e-3, at most two argmax flips). */
static void t_kv_quant_start(void **state) {
  (void)state;
  NEED_GPU();
  char dir[1024], p[1100];
  snprintf(dir, sizeof dir, "%s/e4b_like", FIXTURES);
  if (!lm_fx_has_weights(dir)) {
    printf("  %s has no weights: skipped\n", dir);
    skip();
  }
  lm_model *m = NULL;
  assert_int_equal(lm_model_load(dir, &m), LM_OK);
  int32_t *ids;
  snprintf(p, sizeof p, "%s/ids.txt", dir);
  int64_t T = lm_fx_read_ids(p, &ids), V = m->cfg.vocab_size;
  assert_true(T > 24);
  /* 20 tokens before the conversion and 20 after: over more, rare code flips (a last-bit
   * difference in K/V puts a value on the other side of a rounding boundary) add up */
  T = T < 40 ? T : 40;
  lm_kv_spec specs[m->cfg.n_caches + 1];
  assert_int_equal(
      lm_model_kv_plan(m, &(lm_kv_options){.mode = "8", .group = 32, .quant_start = 20}, specs),
      LM_OK);
  lm_backend *cpu = make_backend(0, LM_PRECISION_F32);
  float *ref = run_specs(m, cpu, specs, ids, T, 20, 4);
  lm_backend_destroy(cpu);
  lm_backend *be = make_backend(1, LM_PRECISION_F32);
  float *got = run_specs(m, be, specs, ids, T, 20, 4);
  lm_backend_destroy(be);
  int ok =
      check("e4b_like kv8 start 20 f32 vs cpu", ref, got, T, V, (bound){1e-3, (double)(T - 2)});
  free(ref), free(got), free(ids);
  lm_model_free(m);
  assert_true(ok);
}

/* Decode over quantized caches with plans on and off is bit-identical, also across
 * --kv-quant-start: the caches convert in the middle of the decode, their signatures change,
 * so a new plan is captured (a stale graph would read the codes as plain values). Plans are
 * built for the prefill chunk, the plain decode and the quantized decode: at least 3. */
static void t_kv_plan(void **state) {
  (void)state;
  NEED_GPU();
#ifdef LM_HAVE_CUDA
  for (int pi = 0; pi < 2; pi++) {
    lm_model *m = synth("kvplan", pi ? moe_cfg : small_cfg, 4, 64);
    lm_kv_spec specs[m->cfg.n_caches + 1];
    lm_kv_options o = {.mode = pi ? "4" : "8", .group = pi ? 64 : 32, .quant_start = 9};
    assert_int_equal(lm_model_kv_plan(m, &o, specs), LM_OK);
    char what[64];
    snprintf(what, sizeof what, "kv plan %s q%s start 9", pi ? "moe bf16" : "small f32", o.mode);
    plans_identical(what, m, pi ? LM_PRECISION_FAST : LM_PRECISION_F32, specs, 20, 3);
    lm_model_free(m);
  }
#endif
}

/* TurboQuant caches on the device against the CPU: --kv-quant turboquant (k8v3) on the synthetic
 * small model, turboquant:4:2 on the MoE one (k_eq_v full layers), both of head dim 128 on their
 * full layers, f32 on both backends, in the three
 * feeding modes; both encode the same rows the same way (test_cuda_ops checks the codes bit
 * for bit), so they agree as the quantized fixtures do (mean KL <= 1e-3, at most two argmax
 * flips). Then the decode with plans off and on is bit-identical. */
static void t_kv_turboquant(void **state) {
  (void)state;
  NEED_GPU();
  static const char *const modes[] = {"turboquant", "turboquant:4:2"};
  int fails = 0;
  for (int mi = 0; mi < 2; mi++) {
    lm_model *m = synth(mi ? "kvtq-moe" : "kvtq", mi ? moe_cfg : small_cfg, 4, 64);
    lm_kv_spec specs[m->cfg.n_caches + 1];
    assert_int_equal(lm_model_kv_plan(m, &(lm_kv_options){.mode = modes[mi]}, specs), LM_OK);
    int64_t T = 23, V = m->cfg.vocab_size;
    int32_t ids[23];
    ids_for(ids, T, V);
    struct {
      const char *mode;
      int64_t prefill, chunk;
    } fm[] = {{"prefill", T, T}, {"chunked", T, 5}, {"decode", T / 2, T / 2}};
    for (size_t k = 0; k < 3; k++) {
      lm_backend *cpu = make_backend(0, LM_PRECISION_F32);
      float *ref = run_specs(m, cpu, specs, ids, T, fm[k].prefill, fm[k].chunk);
      lm_backend_destroy(cpu);
      lm_backend *be = make_backend(1, LM_PRECISION_F32);
      float *got = run_specs(m, be, specs, ids, T, fm[k].prefill, fm[k].chunk);
      lm_backend_destroy(be);
      char what[96];
      snprintf(what, sizeof what, "%s %s f32 vs cpu %s", mi ? "moe" : "small", modes[mi],
               fm[k].mode);
      fails += !check(what, ref, got, T, V, (bound){1e-3, (double)(T - 2)});
      free(ref), free(got);
    }
#ifdef LM_HAVE_CUDA
    char what[64];
    snprintf(what, sizeof what, "kv plan %s bf16 %s", mi ? "moe" : "small", modes[mi]);
    plans_identical(what, m, LM_PRECISION_FAST, specs, 20, 2);
#endif
    lm_model_free(m);
  }
  assert_int_equal(fails, 0);
}

/* The PEFT-made LoRA fixtures (lora_fixture.h) on the device, f32. */
static void t_lora_fixtures(void **state) {
  (void)state;
  NEED_GPU();
  lm_backend *be = make_backend(1, LM_PRECISION_F32);
  int checked = 0, fails = lm_fx_lora_check_all(FIXTURES, be, &checked);
  lm_backend_destroy(be);
  if (!checked) {
    printf("  no LoRA fixtures under %s: skipped\n", FIXTURES);
    skip();
  }
  assert_int_equal(fails, 0);
}

/* Rows of one batch with different adapter sets on the device (lora_batch.h): e4b_like's
 * weights, f32 (mixed and alone agree to the summation order) and the fast path, whose
 * mixed-vs-alone difference must stay within what bf16 itself does to the same sequences
 * (the fast run alone against the f32 run alone). */
static void t_lora_batch(void **state) {
  (void)state;
  NEED_GPU();
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/e4b_like", FIXTURES);
  const lm_precision precs[2] = {LM_PRECISION_F32, LM_PRECISION_FAST};
  float *mixed[2] = {0}, *alone[2] = {0};
  int64_t nf = 0, per = 0;
  for (int p = 0; p < 2; p++) {
    lm_model *m = NULL;
    assert_int_equal(lm_model_load(dir, &m), LM_OK); /* a fresh copy per backend */
    nf = lm_test_lora_batch_floats(m), per = nf / 3;
    mixed[p] = malloc((size_t)nf * sizeof(float)), alone[p] = malloc((size_t)nf * sizeof(float));
    lm_backend *be = make_backend(1, precs[p]);
    assert_int_equal(lm_model_prepare(m, be), LM_OK);
    lm_lora_batch_report r;
    lm_status st = lm_test_lora_batch(m, be, &r, mixed[p], alone[p]);
    if (st) printf("  %s\n", lm_errmsg());
    assert_int_equal(st, LM_OK);
    printf("  %s: mixed vs alone %.2e %.2e %.2e (base row last), adapted vs base %.3f, base after "
           "unmount %s\n",
           p ? "fast" : "f32", r.rel[0], r.rel[1], r.rel[2], r.adapted,
           r.base_bits ? "bit for bit" : "DIFFERS");
    if (!p) assert_true(r.max_rel <= 1e-4);
    assert_true(r.adapted > 10 * r.max_rel);
    assert_true(r.base_bits);
    lm_backend_destroy(be);
    lm_model_free(m);
  }
  for (int s = 0; s < 3; s++) {
    lm_fx_cmp mx = lm_fx_compare(alone[0] + s * per, mixed[1] + s * per, 4, per / 4),
              al = lm_fx_compare(alone[0] + s * per, alone[1] + s * per, 4, per / 4);
    printf(
        "  sequence %d, fast vs f32 alone: mixed batch max|d| %.3g, alone %.3g (max|ref| %.3g)\n",
        s, mx.max_abs_diff, al.max_abs_diff, al.max_abs_ref);
    assert_true(mx.max_abs_diff <= 2 * al.max_abs_diff + 1e-3 * al.max_abs_ref);
  }
  for (int p = 0; p < 2; p++)
    free(mixed[p]), free(alone[p]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(t_plan),          cmocka_unit_test(t_synthetic),
      cmocka_unit_test(t_fixtures),      cmocka_unit_test(t_e4b),
      cmocka_unit_test(t_kv_fixtures),   cmocka_unit_test(t_kv_quant_start),
      cmocka_unit_test(t_kv_plan),       cmocka_unit_test(t_kv_turboquant),
      cmocka_unit_test(t_lora_fixtures), cmocka_unit_test(t_lora_batch)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
