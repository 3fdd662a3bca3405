/* test_kv_quant.c — quantized KV caches: the quantizer bit-exact against the codes the
 * oracle dumped (tests/fixtures/kv_quant_codes, MLX's CPU rule), and the quantized-KV
 * reference fixtures (e4b_like with K/V quantize→dequantize on append: kv8, kv4, a mixed
 * kv_config.json) in the three feeding modes. Bounds: oracle.md's statistical bound from
 * each fixture's meta.json, and a tighter one for this f32 path (it stores exactly what the
 * reference stores, so only rare last-bit code flips separate them). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "model/forward.h"
#include "model/kv_plan.h"
#include "tensor/quant.h"
#include "util/fixture.h"

#define FX LM_SOURCE_DIR "/tests/fixtures"

static void t_codes_bit_exact(void **st) {
  (void)st;
  json_error_t e;
  json_t *d = json_load_file(FX "/kv_quant_codes/codes.json", 0, &e);
  assert_non_null(d);
  const json_t *vecs = json_object_get(d, "vectors"), *cases = json_object_get(d, "cases");
  size_t i, checked = 0;
  json_t *c;
  json_array_foreach(cases, i, c) {
    if (strcmp(json_string_value(json_object_get(c, "rule")), "mlx_cpu")) continue;
    const json_t *v =
        json_array_get(vecs, (size_t)json_integer_value(json_object_get(c, "vector")));
    int64_t n = json_integer_value(json_object_get(v, "n"));
    int bits = (int)json_integer_value(json_object_get(c, "bits")),
        g = (int)json_integer_value(json_object_get(c, "group_size"));
    float x[1024];
    uint8_t packed[1024];
    uint16_t s[64], b[64];
    assert_true(n <= 1024);
    for (int64_t k = 0; k < n; k++) {
      uint32_t u =
          (uint32_t)json_integer_value(json_array_get(json_object_get(v, "x_f32_bits"), (size_t)k));
      memcpy(&x[k], &u, 4);
    }
    lm_affine_quantize_row_bf16(x, n, bits, g, packed, s, b, NULL);
    const json_t *pw = json_object_get(c, "packed_u32"), *sj = json_object_get(c, "scales_bf16"),
                 *bj = json_object_get(c, "biases_bf16");
    for (size_t w = 0; w < json_array_size(pw); w++) {
      uint32_t got;
      memcpy(&got, packed + 4 * w, 4);
      assert_int_equal(got, (uint32_t)json_integer_value(json_array_get(pw, w)));
    }
    for (int64_t k = 0; k < n / g; k++) {
      assert_int_equal(s[k], (uint16_t)json_integer_value(json_array_get(sj, (size_t)k)));
      assert_int_equal(b[k], (uint16_t)json_integer_value(json_array_get(bj, (size_t)k)));
    }
    checked++;
  }
  printf("quantizer: %zu cases bit-exact\n", checked);
  assert_true(checked >= 100);
  json_decref(d);
}

static void check(const char *name, const lm_kv_options *opt) {
  char p[512];
  lm_model *m;
  assert_int_equal(lm_model_load(FX "/e4b_like", &m), LM_OK);
  lm_backend *be;
  assert_int_equal(lm_backend_cpu_create(LM_PRECISION_F32, 0, &be), LM_OK);
  int32_t *ids;
  float *ref;
  snprintf(p, sizeof p, FX "/%s", name);
  int64_t V = m->cfg.vocab_size, T = lm_fx_load(p, V, &ids, &ref);
  assert_true(T > 0);
  float *got = malloc((size_t)(T * V) * sizeof(float));
  double kl_max, agree_d;
  assert_int_equal(lm_fx_bound(p, "fp32", &kl_max, &agree_d), 0);
  int64_t agree_min = (int64_t)agree_d;
  lm_kv_spec specs[16];
  lm_status ps = lm_model_kv_plan(m, opt, specs);
  if (ps) fprintf(stderr, "%s\n", lm_errmsg());
  assert_int_equal(ps, LM_OK);
  const int64_t plans[3][2] = {{T, T}, {T, 5}, {T / 2, T / 2}};
  for (int k = 0; k < 3; k++) {
    lm_kv_set *kv;
    lm_forward *f;
    assert_int_equal(lm_kv_set_create(be, specs, m->cfg.n_caches, &kv), LM_OK);
    assert_int_equal(lm_forward_create(m, be, plans[k][1], plans[k][1], &f), LM_OK);
    assert_int_equal(lm_forward_feed(f, kv, ids, plans[k][0], plans[k][1], got), LM_OK);
    assert_int_equal(
        lm_forward_feed(f, kv, ids + plans[k][0], T - plans[k][0], 1, got + plans[k][0] * V),
        LM_OK);
    lm_fx_cmp r = lm_fx_compare(ref, got, T, V);
    printf("%-15s plan %d: mean KL %.3g (bound %.3g, tight %.0e), argmax %lld/%lld (min %lld), "
           "max|d| %.3g\n",
           name, k, r.mean_kl, kl_max, 1e-3, (long long)r.argmax_agree, (long long)T,
           (long long)agree_min, r.max_abs_diff);
    assert_true(r.mean_kl <= kl_max);
    assert_true(r.argmax_agree >= agree_min);
    assert_true(r.mean_kl <= 1e-3); /* the tight bound for the f32 path */
    lm_forward_free(f);
    lm_kv_set_free(kv);
  }
  free(ref), free(got), free(ids);
  lm_backend_destroy(be);
  lm_model_free(m);
}

static void t_kv8(void **st) {
  (void)st;
  check("e4b_like_kv8", &(lm_kv_options){.mode = "8", .group = 32});
}
static void t_kv4(void **st) {
  (void)st;
  check("e4b_like_kv4", &(lm_kv_options){.mode = "4", .group = 32});
}
static void t_kvmix(void **st) {
  (void)st;
  check("e4b_like_kvmix",
        &(lm_kv_options){.mode = "config", .config_path = FX "/e4b_like_kvmix/kv_config.json"});
}

/* --kv-quant-start: plain until a cache holds N tokens, then converted in place. */
static void t_quant_start(void **st) {
  (void)st;
  lm_model *m;
  lm_backend *be;
  assert_int_equal(lm_model_load(FX "/e4b_like", &m), LM_OK);
  assert_int_equal(lm_backend_cpu_create(LM_PRECISION_F32, 0, &be), LM_OK);
  int32_t *ids;
  int64_t T = lm_fx_read_ids(FX "/e4b_like/ids.txt", &ids), V = m->cfg.vocab_size;
  float *ref = lm_fx_read_f32(FX "/e4b_like/logits.f32", T * V),
        *got = malloc((size_t)(T * V) * sizeof(float));
  lm_kv_spec specs[16];
  assert_int_equal(
      lm_model_kv_plan(m, &(lm_kv_options){.mode = "8", .group = 32, .quant_start = 20}, specs),
      LM_OK);
  lm_kv_set *kv;
  lm_forward *f;
  assert_int_equal(lm_kv_set_create(be, specs, m->cfg.n_caches, &kv), LM_OK);
  assert_int_equal(lm_forward_create(m, be, 4, 4, &f), LM_OK);
  char sig[64];
  assert_int_equal(lm_forward_feed(f, kv, ids, 20, 4, got), LM_OK);
  assert_string_equal(lm_kv_signature(kv->caches[5], sig, sizeof sig), "kv:plain");
  lm_fx_cmp r =
      lm_fx_compare(ref, got, 20, V); /* before the threshold: the unquantized reference */
  assert_true(r.max_abs_diff <= 1e-3 * r.max_abs_ref);
  assert_int_equal(lm_forward_feed(f, kv, ids + 20, T - 20, 4, got + 20 * V), LM_OK);
  assert_string_equal(lm_kv_signature(kv->caches[5], sig, sizeof sig), "kv:quant:8:32");
  assert_string_equal(lm_kv_signature(kv->caches[0], sig, sizeof sig), "kv:rotating-quant:8:32");
  r = lm_fx_compare(ref, got, T, V);
  printf("kv-quant-start 20: mean KL vs unquantized %.3g, argmax %lld/%lld\n", r.mean_kl,
         (long long)r.argmax_agree, (long long)T);
  assert_true(r.mean_kl > 0 && r.mean_kl < 0.1);
  lm_forward_free(f);
  lm_kv_set_free(kv);
  free(ref), free(got), free(ids);
  lm_backend_destroy(be);
  lm_model_free(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(t_codes_bit_exact), cmocka_unit_test(t_kv8),
                                     cmocka_unit_test(t_kv4), cmocka_unit_test(t_kvmix),
                                     cmocka_unit_test(t_quant_start)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
