/* test_tiny_model.c — parity of the embedded model (models/lumen-tiny-kjv) with transformers:
 * teacher-forced logits on a held-out passage (f32 tolerance of docs/oracle.md, in the three
 * feeding modes) and 32-token greedy continuations identical token for token. A difference
 * is allowed only at a near-tie the reference logged (top-2 margin < 1e-4). The reference
 * material comes from tools/train_tiny (tests/fixtures/lumen-tiny-kjv). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/status.h"
#include "model/forward.h"
#include "util/fixture.h"

#define MODEL LM_SOURCE_DIR "/models/lumen-tiny-kjv"
#define FX LM_SOURCE_DIR "/tests/fixtures/lumen-tiny-kjv"

typedef struct ctx {
  lm_model *m;
  lm_backend *be;
} ctx;

static int setup(void **st) {
  ctx *c = calloc(1, sizeof *c);
  if (lm_model_load(MODEL, &c->m) || lm_backend_cpu_create(LM_PRECISION_F32, 0, &c->be)) {
    fprintf(stderr, "%s\n", lm_errmsg());
    return -1;
  }
  *st = c;
  return 0;
}

static int teardown(void **st) {
  ctx *c = *st;
  lm_backend_destroy(c->be);
  lm_model_free(c->m);
  free(c);
  return 0;
}

static lm_kv_set *new_kv(ctx *c) {
  lm_kv_spec specs[c->m->cfg.n_caches];
  lm_model_kv_specs(c->m, specs);
  lm_kv_set *kv;
  assert_int_equal(lm_kv_set_create(c->be, specs, c->m->cfg.n_caches, &kv), LM_OK);
  return kv;
}

static void t_passage(void **st) {
  ctx *c = *st;
  int32_t *ids;
  int64_t T = lm_fx_read_ids(FX "/ids.txt", &ids), V = c->m->cfg.vocab_size;
  float *ref = lm_fx_read_f32(FX "/logits.f32", T * V),
        *got = malloc((size_t)(T * V) * sizeof(float));
  assert_true(T > c->m->cfg.sliding_window / 2);
  assert_non_null(ref);
  const int64_t plans[3][2] = {
      {T, T}, {T, 7}, {T / 2, T / 2}}; /* prefill, chunk; the rest decodes */
  for (int p = 0; p < 3; p++) {
    lm_kv_set *kv = new_kv(c);
    lm_forward *f;
    assert_int_equal(lm_forward_create(c->m, c->be, plans[p][1], plans[p][1], &f), LM_OK);
    assert_int_equal(lm_forward_feed(f, kv, ids, plans[p][0], plans[p][1], got), LM_OK);
    assert_int_equal(
        lm_forward_feed(f, kv, ids + plans[p][0], T - plans[p][0], 1, got + plans[p][0] * V),
        LM_OK);
    lm_fx_cmp r = lm_fx_compare(ref, got, T, V);
    printf("passage plan %d: max|d| %.3g (bound %.3g), argmax %lld/%lld\n", p, r.max_abs_diff,
           1e-3 * r.max_abs_ref, (long long)r.argmax_agree, (long long)T);
    assert_true(r.max_abs_diff <= 1e-3 * r.max_abs_ref);
    assert_int_equal(r.argmax_agree, T);
    lm_forward_free(f);
    lm_kv_set_free(kv);
  }
  free(ids);
  free(ref);
  free(got);
}

static int32_t argmax(const float *x, int64_t n) {
  int64_t b = 0;
  for (int64_t i = 1; i < n; i++)
    b = x[i] > x[b] ? i : b;
  return (int32_t)b;
}

/* Greedy decode of one prompt through the caches; compares with the reference ids. */
static void check_greedy(ctx *c, const json_t *g) {
  const json_t *pj = json_object_get(g, "prompt_ids"), *gj = json_object_get(g, "greedy_ids"),
               *steps = json_object_get(g, "steps");
  int64_t n = (int64_t)json_array_size(pj), V = c->m->cfg.vocab_size,
          N = (int64_t)json_array_size(gj);
  int32_t *ids = malloc((size_t)n * sizeof *ids);
  for (int64_t i = 0; i < n; i++)
    ids[i] = (int32_t)json_integer_value(json_array_get(pj, (size_t)i));
  float *logits = malloc((size_t)(n * V) * sizeof(float));
  lm_kv_set *kv = new_kv(c);
  lm_forward *fp, *fd;
  assert_int_equal(lm_forward_create(c->m, c->be, n, n, &fp), LM_OK);
  assert_int_equal(lm_forward_create(c->m, c->be, 1, 1, &fd), LM_OK);
  assert_int_equal(lm_forward_feed(fp, kv, ids, n, n, logits), LM_OK);
  int32_t next = argmax(logits + (n - 1) * V, V);
  int64_t same = 0;
  for (int64_t i = 0; i < N; i++) {
    int32_t want = (int32_t)json_integer_value(json_array_get(gj, (size_t)i));
    if (next != want) {
      double margin =
          json_number_value(json_object_get(json_array_get(steps, (size_t)i), "margin"));
      printf("  %s: step %lld differs (%d vs %d), reference margin %.3g\n",
             json_string_value(json_object_get(g, "name")), (long long)i, next, want, margin);
      assert_true(margin < 1e-4); /* only a logged near-tie may differ */
      break;
    }
    same++;
    assert_int_equal(lm_forward_feed(fd, kv, &next, 1, 1, logits), LM_OK);
    next = argmax(logits, V);
  }
  printf("greedy %-12s %lld/%lld tokens identical\n", json_string_value(json_object_get(g, "name")),
         (long long)same, (long long)N);
  lm_forward_free(fp);
  lm_forward_free(fd);
  lm_kv_set_free(kv);
  free(logits);
  free(ids);
}

static void t_greedy(void **st) {
  json_error_t e;
  json_t *all = json_load_file(FX "/greedy.json", 0, &e);
  assert_non_null(all);
  assert_true(json_array_size(all) >= 4);
  size_t i;
  json_t *g;
  json_array_foreach(all, i, g) check_greedy(*st, g);
  json_decref(all);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(t_passage), cmocka_unit_test(t_greedy)};
  return cmocka_run_group_tests(tests, setup, teardown);
}
