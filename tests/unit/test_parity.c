/* test_parity.c — every reference fixture (tests/fixtures/NAME, made by
 * tools/oracle/gen_fixtures.py with transformers in f32 eager mode) is reproduced by the CPU
 * f32 path in three feeding modes: prefill in one pass, prefill in chunks, and prefill of the
 * first half followed by token-by-token decode. Tolerance (docs/oracle.md):
 * max|Δlogit| ≤ 1e-3 · max|ref| over [T, V] and the same argmax at every position.
 *
 * The bf16 precision (the CUDA fast path's rounding, emulated on the CPU) is held to each
 * fixture's statistical bf16 bound (meta.json tolerance.bf16: mean KL and argmax agreement
 * relative to transformers' own bf16 run). Every fixture must also show that rounding
 * happened. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/status.h"
#include "model/forward.h"
#include "util/fixture.h"

#define FIXTURES LM_SOURCE_DIR "/tests/fixtures"

/* Feeds ids with the given prefill/chunk plan into a fresh cache set; returns [T][V] logits. */
static float *run_mode(const lm_model *m, lm_backend *be, const int32_t *ids, int64_t T,
                       int64_t prefill, int64_t chunk) {
  int64_t V = m->cfg.vocab_size;
  float *out = malloc((size_t)(T * V) * sizeof(float));
  lm_kv_spec specs[m->cfg.n_caches + 1];
  lm_model_kv_specs(m, specs);
  lm_kv_set *kv = NULL;
  lm_forward *f = NULL;
  assert_int_equal(lm_kv_set_create(be, specs, m->cfg.n_caches, &kv), LM_OK);
  assert_int_equal(lm_forward_create(m, be, chunk, chunk, &f), LM_OK);
  lm_status s = lm_forward_feed(f, kv, ids, prefill, chunk, out);
  if (!s) s = lm_forward_feed(f, kv, ids + prefill, T - prefill, 1, out + prefill * V);
  if (s) fprintf(stderr, "forward failed: %s\n", lm_errmsg());
  assert_int_equal(s, LM_OK);
  assert_int_equal(lm_kv_set_len(kv), T);
  lm_forward_free(f);
  lm_kv_set_free(kv);
  return out;
}

/* A fixture's model with its ids and reference logits (the test fails if any is missing). */
typedef struct fixture {
  lm_model *m;
  int32_t *ids;
  float *ref;
  int64_t T, V;
} fixture;

static fixture fixture_open(const char *dir) {
  fixture x = {0};
  lm_status s = lm_model_load(dir, &x.m);
  if (s) fprintf(stderr, "%s: load failed: %s\n", dir, lm_errmsg());
  assert_int_equal(s, LM_OK);
  x.V = x.m->cfg.vocab_size;
  x.T = lm_fx_load(dir, x.V, &x.ids, &x.ref);
  assert_true(x.T > 0);
  return x;
}

static void fixture_close(fixture *x) {
  free(x->ids);
  free(x->ref);
  lm_model_free(x->m);
}

static void check_fixture(const char *name, const char *dir, lm_backend *be, int *failures) {
  fixture x = fixture_open(dir);
  int64_t T = x.T;
  struct {
    const char *mode;
    int64_t prefill, chunk;
  } modes[] = {{"prefill", T, T}, {"chunked", T, 5}, {"decode", T / 2, T / 2 > 0 ? T / 2 : 1}};
  for (size_t i = 0; i < 3; i++) {
    float *got = run_mode(x.m, be, x.ids, T, modes[i].prefill, modes[i].chunk);
    lm_fx_cmp c = lm_fx_compare(x.ref, got, T, x.V);
    int ok = c.max_abs_diff <= 1e-3 * c.max_abs_ref && c.argmax_agree == T;
    printf("%-16s %-8s T=%-3lld max|d|=%.3g (bound %.3g) argmax %lld/%lld %s\n", name,
           modes[i].mode, (long long)T, c.max_abs_diff, 1e-3 * c.max_abs_ref,
           (long long)c.argmax_agree, (long long)T, ok ? "ok" : "FAIL");
    *failures += !ok;
    free(got);
  }
  fixture_close(&x);
}

/* Runs check on every fixture with weights (and the file `marker`) on a CPU backend of this
 * precision; asserts that at least 6 were checked (e2b, e4b, 12b, moe and two MLX fixtures)
 * and none failed. */
static void each_fixture(const char *marker, lm_precision prec,
                         void (*check)(const char *name, const char *dir, lm_backend *be,
                                       int *failures)) {
  char **names;
  int n = lm_fx_list(FIXTURES, marker, &names), checked = 0, failures = 0;
  lm_backend *be;
  assert_int_equal(lm_backend_cpu_create(prec, 0, &be), LM_OK);
  for (int i = 0; i < n; i++) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", FIXTURES, names[i]);
    if (!lm_fx_has_weights(dir)) continue;
    check(names[i], dir, be, &failures);
    checked++;
  }
  lm_backend_destroy(be);
  lm_fx_free_list(names, n);
  assert_true(checked >= 6);
  assert_int_equal(failures, 0);
}

static void t_fixtures_f32(void **state) {
  (void)state;
  each_fixture("logits.f32", LM_PRECISION_F32, check_fixture);
}

static void check_bf16(const char *name, const char *dir, lm_backend *be, int *failures) {
  double kl_max, am_min;
  if (lm_fx_bound(dir, "bf16", &kl_max, &am_min)) return;
  fixture x = fixture_open(dir);
  float *got = run_mode(x.m, be, x.ids, x.T, x.T, x.T);
  lm_fx_cmp c = lm_fx_compare(x.ref, got, x.T, x.V);
  int ok = c.mean_kl > 1e-6 && c.mean_kl <= kl_max && c.argmax_agree >= am_min;
  printf("%-16s bf16     T=%-3lld mean KL %.4g (bound %.4g) argmax %lld (bound %.0f) %s\n", name,
         (long long)x.T, c.mean_kl, kl_max, (long long)c.argmax_agree, am_min, ok ? "ok" : "FAIL");
  *failures += !ok;
  free(got);
  fixture_close(&x);
}

static void t_fixtures_bf16(void **state) {
  (void)state;
  each_fixture("logits_bf16.f32", LM_PRECISION_BF16, check_bf16);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(t_fixtures_f32),
                                     cmocka_unit_test(t_fixtures_bf16)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
