/* test_quantize.c — the MLX affine quantizer (tensor/quant.c) and `lumen quantize`'s model
 * conversion: exact codes on hand-computed groups, the packer against the reader for every
 * width, the error bound of a round trip, and a converted tiny model that loads. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/rng.h"
#include "model/quantize.h"
#include "tensor/quant.h"
#include "util/tiny_model.h"

/* Group [0, 1, ..., 31] at 4 bits: |min| = 0 < |max| → scale = -31/15, edge = max, q0 = -15,
 * scale = 31/-15, bias = 31; codes q = rint((w - 31) / scale). */
static void t_exact_group(void **st) {
  (void)st;
  float w[32], s, b;
  uint8_t q[32];
  for (int i = 0; i < 32; i++)
    w[i] = (float)i;
  lm_affine_quantize_group(w, 32, 4, q, &s, &b);
  assert_true(s == 31.0f / -15.0f);
  assert_true(b == 31.0f);
  for (int i = 0; i < 32; i++)
    assert_int_equal(q[i], (uint8_t)rintf((w[i] - 31.0f) / s));
  assert_int_equal(q[31], 0);
  assert_int_equal(q[0], 15);
  /* a constant group: max - min = 0 → scale = eps, edge maps exactly */
  for (int i = 0; i < 32; i++)
    w[i] = -2.5f;
  lm_affine_quantize_group(w, 32, 8, q, &s, &b);
  for (int i = 0; i < 32; i++)
    assert_true(fabsf(s * q[i] + b - w[i]) < 1e-6f);
}

static void t_pack_and_bound(void **st) {
  (void)st;
  static const int bits[] = {2, 3, 4, 5, 6, 8};
  float w[256], s[8], b[8], back[256];
  uint8_t packed[256];
  for (size_t k = 0; k < sizeof bits / sizeof *bits; k++) {
    for (int i = 0; i < 256; i++)
      w[i] = 2.0f * lm_rng_uniform(3, k, (uint64_t)i) - 1.0f;
    lm_affine_quantize_row(w, 256, bits[k], 32, packed, s, b);
    lm_weight wt = {.rows = 1,
                    .cols = 256,
                    .expert_rows = 1,
                    .dtype = LM_DT_U32,
                    .bits = bits[k],
                    .group = 32,
                    .sdtype = LM_DT_F32,
                    .data = packed,
                    .scales = s,
                    .biases = b};
    lm_weight_dequant_row(&wt, 0, 0, back);
    for (int g = 0; g < 8; g++) { /* the reader sees exactly the group's codes */
      uint8_t codes[32];
      float gs, gb;
      lm_affine_quantize_group(w + 32 * g, 32, bits[k], codes, &gs, &gb);
      for (int i = 0; i < 32; i++)
        assert_true(back[32 * g + i] == gs * codes[i] + gb);
    }
    /* MLX's edge-exact scale may leave the far edge up to ~1 step away (then clamped) */
    for (int i = 0; i < 256; i++)
      assert_true(fabsf(back[i] - w[i]) <= 1.5f * fabsf(s[i / 32]));
  }
}

static void t_convert_tiny(void **st) {
  (void)st;
  const char *src = LM_BUILD_DIR "/tmp/test_quantize/src",
             *dst = LM_BUILD_DIR "/tmp/test_quantize/q";
  assert_int_equal(lm_test_write_tiny(lm_test_tiny_config, src), LM_OK);
  lm_model *m, *q;
  assert_int_equal(lm_model_load(src, &m), LM_OK);
  lm_quantize_rule rules[] = {{.pattern = "layers.1.mlp.down_proj", .bits = 8, .group = 32},
                              {.pattern = "layers.0.self_attn.o_proj"}};
  lm_quantize_opts o = {.bits = 4, .group = 32, .rules = rules, .n_rules = 2};
  assert_int_equal(lm_model_quantize(m, dst, &o), LM_OK);
  assert_int_equal(lm_model_load(dst, &q), LM_OK);
  assert_true(q->mlx_naming);
  assert_int_equal(q->layers[0].q.bits, 4);
  assert_int_equal(q->layers[1].down.bits, 8);
  assert_int_equal(q->layers[0].o.bits, 0); /* kept in bf16 */
  assert_int_equal(q->embed.bits, 4);       /* the tied head too */
  assert_true(q->layers[0].layer_scalar == m->layers[0].layer_scalar);
  float a[64], b[64];
  lm_weight_dequant_row(&m->layers[1].down, 0, 3, a);
  lm_weight_dequant_row(&q->layers[1].down, 0, 3, b);
  for (int i = 0; i < 32; i++)
    assert_true(fabsf(a[i] - b[i]) < 0.02f);
  lm_model_free(q);
  lm_model_free(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(t_exact_group),
                                     cmocka_unit_test(t_pack_and_bound),
                                     cmocka_unit_test(t_convert_tiny)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
