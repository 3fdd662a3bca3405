/* test_quant_plan.c — measured mixed precision (issue: quantization that measures):
 *  - the knapsack: on random tables its plan is the best plan a brute force finds within the
 *    same budget, its bytes never exceed the budget, and an unreachable target is refused;
 *  - exchangeable payloads: a module quantized by exchange gives the logits of a checkpoint
 *    written with that module quantized, and exchanging it back gives the original logits bit
 *    for bit (the embedded model, CPU f32);
 *  - the sweep: every measured KL is finite and positive, and lower for 8 bits than for 2. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "model/forward.h"
#include "model/quant_plan.h"
#include "model/quant_sweep.h"
#include "model/quantize.h"

#define TINY LM_SOURCE_DIR "/models/lumen-tiny-kjv"

static uint64_t rng_state = 12345;
static double rnd(void) {
  rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
  return (double)(rng_state >> 11) / (double)(1ull << 53);
}

/* A table of n modules and nk kinds whose KL falls with the bytes, as a real one does. */
static void random_table(lm_qsweep *t, int n, int nk) {
  memset(t, 0, sizeof *t);
  t->n_rows = n;
  t->n_kinds = nk;
  t->rows = calloc((size_t)n, sizeof *t->rows);
  for (int k = 0; k < nk; k++)
    t->kinds[k] = (lm_qkind){2 + k, 64};
  for (int i = 0; i < n; i++) {
    lm_qsweep_row *r = &t->rows[i];
    snprintf(r->module, sizeof r->module, "m%d", i);
    r->params = 1000 * (1 + (int64_t)(rnd() * 8));
    double sens = 0.001 + rnd();
    for (int k = 0; k < nk; k++) {
      int bits = 2 + k;
      r->bytes[k] = r->params * bits / 8 + r->params / 16;
      r->kl[k] = sens * pow(4.0, -bits) * (0.5 + rnd());
    }
  }
}

/* The least Σ KL over every assignment within budget bytes (n small). */
static double brute(const lm_qsweep *t, double budget) {
  int n = t->n_rows, nk = t->n_kinds, c[16] = {0};
  double best = DBL_MAX;
  for (;;) {
    double kl = 0, bytes = 0;
    for (int i = 0; i < n; i++)
      kl += t->rows[i].kl[c[i]], bytes += (double)t->rows[i].bytes[c[i]];
    if (bytes <= budget && kl < best) best = kl;
    int i = 0;
    while (i < n && ++c[i] == nk)
      c[i++] = 0;
    if (i == n) return best;
  }
}

static void t_knapsack_is_exact(void **st) {
  (void)st;
  for (int trial = 0; trial < 40; trial++) {
    lm_qsweep t;
    random_table(&t, 6, 4);
    int64_t params = 0;
    for (int i = 0; i < t.n_rows; i++)
      params += t.rows[i].params;
    double target = 2.7 + 3.0 * rnd(), budget = target * (double)params / 8.0;
    lm_qplan p;
    assert_int_equal(lm_quant_plan(&t, target, &p), LM_OK);
    double kl = 0;
    for (int i = 0; i < t.n_rows; i++)
      kl += t.rows[i].kl[p.choice[i]];
    assert_true((double)p.bytes <= budget);
    assert_true(p.bpw <= target + 1e-12);
    assert_true(fabs(kl - p.kl_sum) <= 1e-12 * fmax(1, kl));
    /* byte units of at most budget/65536 can cost only a sliver of the budget */
    double opt = brute(&t, budget), slack = brute(&t, budget - 6.0 * (double)p.unit);
    assert_true(kl >= opt - 1e-15);
    assert_true(kl <= slack + 1e-15);
    lm_qplan_free(&p);
    lm_qsweep_free(&t);
  }
}

static void t_unreachable_target(void **st) {
  (void)st;
  lm_qsweep t;
  random_table(&t, 5, 3);
  lm_qplan p;
  assert_int_equal(lm_quant_plan(&t, 2.0, &p), LM_ERR_INVALID); /* 2 bits + scales > 2.0 */
  assert_non_null(strstr(lm_errmsg(), "below the smallest plan"));
  assert_int_equal(lm_quant_plan(&t, 2.5, &p), LM_OK); /* exactly the 2-bit plan: it fits */
  for (int i = 0; i < t.n_rows; i++)
    assert_int_equal(p.choice[i], 0);
  assert_true(p.bpw <= 2.5 && p.bpw > 2.49);
  lm_qplan_free(&p);
  t.rows[2].kl[0] = t.rows[2].kl[1] = t.rows[2].kl[2] = -1; /* no kind fits that module */
  assert_int_equal(lm_quant_plan(&t, 8.0, &p), LM_ERR_INVALID);
  assert_non_null(strstr(lm_errmsg(), "m2"));
  lm_qsweep_free(&t);
}

static void logits_of(lm_model *m, lm_backend *be, const int32_t *ids, int64_t T, float *out) {
  lm_kv_spec specs[m->cfg.n_caches + 1];
  lm_model_kv_specs(m, specs);
  lm_kv_set *kv = NULL;
  lm_forward *f = NULL;
  assert_int_equal(lm_kv_set_create(be, specs, m->cfg.n_caches, &kv), LM_OK);
  assert_int_equal(lm_forward_create(m, be, T, T, &f), LM_OK);
  assert_int_equal(lm_forward_feed(f, kv, ids, T, T, out), LM_OK);
  lm_forward_free(f);
  lm_kv_set_free(kv);
}

static void t_exchange(void **st) {
  (void)st;
  enum { T = 24 };
  int32_t ids[T];
  for (int i = 0; i < T; i++)
    ids[i] = 2 + (i * 131) % 4000;
  lm_model *m = NULL, *q = NULL;
  lm_backend *be = NULL;
  assert_int_equal(lm_model_load(TINY, &m), LM_OK);
  assert_int_equal(lm_backend_cpu_create(LM_PRECISION_F32, 1, &be), LM_OK);
  size_t n = (size_t)T * (size_t)m->cfg.vocab_size;
  float *base = malloc(n * 4), *got = malloc(n * 4), *want = malloc(n * 4);
  logits_of(m, be, ids, T, base);
  /* a checkpoint with only layers.3.mlp.down_proj at 3 bits, group 32 (the rest kept bf16) */
  char dir[] = "/tmp/lumen_qplan_XXXXXX";
  assert_non_null(mkdtemp(dir));
  lm_quantize_rule rules[2] = {
      {.pattern = "layers.3.mlp.down_proj", .bits = 3, .group = 32, .exact = 1},
      {.pattern = "", .bits = 0}};
  lm_quantize_opts o = {.bits = 4, .group = 64, .rules = rules, .n_rules = 2};
  assert_int_equal(lm_model_quantize(m, dir, &o), LM_OK);
  assert_int_equal(lm_model_load(dir, &q), LM_OK);
  logits_of(q, be, ids, T, want);
  lm_weight_payload p;
  lm_weight *w = &m->layers[3].down;
  assert_int_equal(lm_weight_payload_quantize(w, 3, 32, &p), LM_OK);
  assert_int_equal(lm_exchange_weight(be, w, &p), LM_OK);
  assert_int_equal(w->bits, 3);
  logits_of(m, be, ids, T, got);
  assert_memory_equal(got, want, n * 4);
  assert_int_equal(lm_exchange_weight(be, w, &p), LM_OK); /* back */
  lm_weight_payload_free(&p);
  logits_of(m, be, ids, T, got);
  assert_memory_equal(got, base, n * 4);
  assert_int_equal(lm_weight_payload_quantize(w, 7, 64, &p), LM_ERR_INVALID);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  assert_int_equal(system(cmd), 0);
  free(base), free(got), free(want);
  lm_model_free(q);
  lm_model_free(m);
  lm_backend_destroy(be);
}

static void t_sweep(void **st) {
  (void)st;
  enum { T = 16 };
  int32_t ids[T];
  for (int i = 0; i < T; i++)
    ids[i] = 2 + (i * 97) % 4000;
  lm_model *m = NULL;
  lm_backend *be = NULL;
  assert_int_equal(lm_model_load(TINY, &m), LM_OK);
  assert_int_equal(lm_backend_cpu_create(LM_PRECISION_F32, 1, &be), LM_OK);
  lm_qkind kinds[2] = {{2, 64}, {8, 64}};
  lm_qsweep t;
  lm_qsweep_opts o = {.kinds = kinds, .n_kinds = 2, .ids = ids, .n_ids = T, .chunk = T};
  assert_int_equal(lm_quant_sweep(m, be, &o, &t), LM_OK);
  assert_true(t.n_rows > 50); /* the embedding, PLE tables, every layer's matrices */
  assert_string_equal(t.rows[0].module, "embed_tokens");
  int lower = 0;
  for (int i = 0; i < t.n_rows; i++) {
    assert_true(t.rows[i].kl[0] > 0 && isfinite(t.rows[i].kl[0]));
    assert_true(t.rows[i].kl[1] > 0 && isfinite(t.rows[i].kl[1]));
    lower += t.rows[i].kl[1] < t.rows[i].kl[0];
  }
  assert_int_equal(lower, t.n_rows);
  lm_qsweep_free(&t);
  lm_model_free(m);
  lm_backend_destroy(be);
}

/* The MoE router stays at 8 bits (as the converters write it): a row whose other kinds do not fit,
 * so the plan counts its real bytes, and a kind set without 8 bits is refused naming it. */
static void t_router(void **st) {
  (void)st;
  enum { T = 8 };
  int32_t ids[T] = {2, 17, 300, 45, 9, 120, 77, 5};
  lm_model *m = NULL;
  lm_backend *be = NULL;
  assert_int_equal(lm_model_load(LM_SOURCE_DIR "/tests/fixtures/moe_like", &m), LM_OK);
  assert_int_equal(lm_backend_cpu_create(LM_PRECISION_F32, 1, &be), LM_OK);
  lm_qkind kinds[2] = {{4, 32}, {8, 32}};
  lm_qsweep t;
  lm_qsweep_opts o = {.kinds = kinds, .n_kinds = 2, .ids = ids, .n_ids = T, .chunk = T};
  assert_int_equal(lm_quant_sweep(m, be, &o, &t), LM_OK);
  int routers = 0;
  for (int i = 0; i < t.n_rows; i++) {
    if (!strstr(t.rows[i].module, "router.proj")) {
      assert_int_equal(t.rows[i].kl[0] >= 0, lm_weight_payload_fits(t.rows[i].w, 4, 32));
      assert_true(isfinite(t.rows[i].kl[0])); /* experts of HF's fused gate_up are views */
      continue;
    }
    routers++;
    assert_true(t.rows[i].kl[0] < 0 && t.rows[i].kl[1] >= 0);
  }
  assert_int_equal(routers, m->cfg.n_layers);
  for (int i = 0; i < t.n_rows; i++) /* as if only 4 bits had been asked for */
    t.rows[i].kl[1] = -1;
  lm_qplan p;
  assert_int_equal(lm_quant_plan(&t, 16, &p), LM_ERR_INVALID);
  assert_non_null(strstr(lm_errmsg(), "router.proj"));
  lm_qsweep_free(&t);
  lm_model_free(m);
  lm_backend_destroy(be);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(t_knapsack_is_exact), cmocka_unit_test(t_unreachable_target),
      cmocka_unit_test(t_exchange), cmocka_unit_test(t_sweep), cmocka_unit_test(t_router)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
