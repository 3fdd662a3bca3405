/* test_model_load.c — loading tiny checkpoints, the chunking invariance of the forward
 * (one-pass prefill, chunked prefill and token-by-token decode agree, with a ring that
 * wraps), and a table of bad checkpoints each giving one clear error naming file and tensor. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/status.h"
#include "model/forward.h"
#include "util/tiny_model.h"

#define TMP LM_BUILD_DIR "/tmp/test_model_load"

static float *feed(lm_model *m, lm_backend *be, const int32_t *ids, int64_t T, int64_t prefill,
                   int64_t chunk) {
  int64_t V = m->cfg.vocab_size;
  float *out = malloc((size_t)(T * V) * sizeof(float));
  lm_kv_spec specs[8];
  lm_model_kv_specs(m, specs);
  lm_kv_set *kv;
  lm_forward *f;
  assert_int_equal(lm_kv_set_create(be, specs, m->cfg.n_caches, &kv), LM_OK);
  assert_int_equal(lm_forward_create(m, be, chunk, chunk, &f), LM_OK);
  assert_int_equal(lm_forward_feed(f, kv, ids, prefill, chunk, out), LM_OK);
  assert_int_equal(lm_forward_feed(f, kv, ids + prefill, T - prefill, 1, out + prefill * V), LM_OK);
  lm_forward_free(f);
  lm_kv_set_free(kv);
  return out;
}

static void t_chunking_invariance(void **st) {
  (void)st;
  assert_int_equal(lm_test_write_tiny(lm_test_tiny_config, TMP "/ok"), LM_OK);
  lm_model *m;
  assert_int_equal(lm_model_load(TMP "/ok", &m), LM_OK);
  assert_int_equal(m->cfg.n_caches, 3);
  lm_backend *be;
  assert_int_equal(lm_backend_cpu_create(LM_PRECISION_F32, 0, &be), LM_OK);
  int32_t ids[20];
  for (int i = 0; i < 20; i++)
    ids[i] = (int32_t)((i * 37 + 5) % 64);
  int64_t V = m->cfg.vocab_size;
  float *a = feed(m, be, ids, 20, 20, 20), *b = feed(m, be, ids, 20, 20, 3),
        *c = feed(m, be, ids, 20, 7, 7);
  double d1 = 0, d2 = 0, mx = 0;
  for (int64_t i = 0; i < 20 * V; i++) {
    d1 = fmax(d1, fabs(a[i] - b[i]));
    d2 = fmax(d2, fabs(a[i] - c[i]));
    mx = fmax(mx, fabs(a[i]));
    assert_true(isfinite(a[i]));
  }
  printf("one-pass vs chunked %.3g, vs decode %.3g (max|logit| %.3g)\n", d1, d2, mx);
  assert_true(mx > 0.1);
  assert_true(d1 < 1e-4 * mx && d2 < 1e-4 * mx);
  free(a), free(b), free(c);
  /* ids outside the vocabulary are refused before any work */
  lm_kv_spec specs[8];
  lm_model_kv_specs(m, specs);
  lm_kv_set *kv;
  lm_forward *f;
  assert_int_equal(lm_kv_set_create(be, specs, m->cfg.n_caches, &kv), LM_OK);
  assert_int_equal(lm_forward_create(m, be, 4, 4, &f), LM_OK);
  int32_t bad[2] = {3, 64};
  assert_int_equal(lm_forward_feed(f, kv, bad, 2, 2, NULL), LM_ERR_INVALID);
  assert_non_null(strstr(lm_errmsg(), "outside the vocabulary"));
  lm_forward_free(f);
  lm_kv_set_free(kv);
  lm_backend_destroy(be);
  lm_model_free(m);
}

static void expect_load_error(const char *dir, lm_status want, const char *needle1,
                              const char *needle2) {
  lm_model *m = NULL;
  lm_status s = lm_model_load(dir, &m);
  if (s != want || !strstr(lm_errmsg(), needle1) || (needle2 && !strstr(lm_errmsg(), needle2)))
    fprintf(stderr, "%s: status %d: %s\n", dir, s, lm_errmsg());
  assert_int_equal(s, want);
  assert_null(m);
  assert_non_null(strstr(lm_errmsg(), needle1));
  if (needle2) assert_non_null(strstr(lm_errmsg(), needle2));
  assert_null(strchr(lm_errmsg(), '\n')); /* one line */
}

static void truncate_file(const char *path, long keep) {
  FILE *f = fopen(path, "r+b");
  assert_non_null(f);
  assert_int_equal(ftruncate(fileno(f), keep), 0);
  fclose(f);
}

static void t_bad_checkpoints(void **st) {
  (void)st;
  lm_test_tiny_opts miss = {.skip = "layers.1.mlp.up_proj"};
  assert_int_equal(lm_test_write_tiny_ex(lm_test_tiny_config, TMP "/missing", &miss), LM_OK);
  expect_load_error(TMP "/missing", LM_ERR_NOT_FOUND, "layers.1.mlp.up_proj", TMP "/missing");

  /* a quantized module whose scales disagree with bits/group: expected vs found shape */
  char cfg[4096];
  snprintf(cfg, sizeof cfg, "%.*s,\"quantization\":{\"bits\":4,\"group_size\":32}}",
           (int)strlen(lm_test_tiny_config) - 1, lm_test_tiny_config);
  lm_test_tiny_opts q = {.quant = "layers.0.mlp.gate_proj", .bad_scales = 1};
  assert_int_equal(lm_test_write_tiny_ex(cfg, TMP "/badquant", &q), LM_OK);
  expect_load_error(TMP "/badquant", LM_ERR_CORRUPT, "layers.0.mlp.gate_proj.scales",
                    "expected shape [64, 1], found [64, 0]");
  q.bad_scales = 0; /* the same module with correct shapes loads */
  assert_int_equal(lm_test_write_tiny_ex(cfg, TMP "/goodquant", &q), LM_OK);
  lm_model *m;
  assert_int_equal(lm_model_load(TMP "/goodquant", &m), LM_OK);
  assert_int_equal(m->layers[0].gate.bits, 4);
  lm_model_free(m);
  /* scales present but no quantization block */
  assert_int_equal(lm_test_write_tiny_ex(lm_test_tiny_config, TMP "/noblock", &q), LM_OK);
  expect_load_error(TMP "/noblock", LM_ERR_CORRUPT, "no quantization block", NULL);
  /* an unsupported mode */
  snprintf(cfg, sizeof cfg,
           "%.*s,\"quantization\":{\"bits\":4,\"group_size\":32,\"mode\":\"mxfp4\"}}",
           (int)strlen(lm_test_tiny_config) - 1, lm_test_tiny_config);
  assert_int_equal(lm_test_write_tiny_ex(cfg, TMP "/mxfp4", &q), LM_OK);
  expect_load_error(TMP "/mxfp4", LM_ERR_UNSUPPORTED, "mxfp4", "config.json");

  /* a truncated safetensors file */
  assert_int_equal(lm_test_write_tiny(lm_test_tiny_config, TMP "/trunc"), LM_OK);
  truncate_file(TMP "/trunc/model.safetensors", 4000);
  expect_load_error(TMP "/trunc", LM_ERR_CORRUPT, "model.safetensors", NULL);
  /* a config missing a required field */
  assert_int_equal(lm_test_write_tiny(lm_test_tiny_config, TMP "/nocfg"), LM_OK);
  FILE *f = fopen(TMP "/nocfg/config.json", "wb");
  fputs("{\"model_type\":\"gemma4_text\",\"vocab_size\":64}", f);
  fclose(f);
  expect_load_error(TMP "/nocfg", LM_ERR_NOT_FOUND, "config.json", "hidden_size");
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(t_chunking_invariance),
                                     cmocka_unit_test(t_bad_checkpoints)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
