/* test_lora_batch.c — LoRA adapters per row (lora_bank.h) on the CPU: three sequences with
 * different adapter sets (one adapter; two stacked, one at weight 0.5; none) in one batch give
 * each sequence's logits alone with its set, and unmounting gives the base bit for bit. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cmocka.h>

#include "backend/backend.h"
#include "lumen.h"
#include "model/model.h"
#include "util/lora_batch.h"

#define TINY LM_SOURCE_DIR "/models/lumen-tiny-kjv"

static void run(lm_precision prec, double bound) {
  lm_model *m = NULL;
  lm_backend *be = NULL;
  assert_int_equal(lm_model_load(TINY, &m), LM_OK);
  assert_int_equal(lm_backend_cpu_create(prec, 0, &be), LM_OK);
  lm_lora_batch_report r;
  lm_status st = lm_test_lora_batch(m, be, &r, NULL, NULL);
  if (st) printf("  %s\n", lm_errmsg());
  assert_int_equal(st, LM_OK);
  printf("  %s: mixed vs alone %.2e (base row %.2e), adapted vs base %.3f, base after unmount %s\n",
         prec == LM_PRECISION_F32 ? "f32" : "fast", r.max_rel, r.base_rel, r.adapted,
         r.base_bits ? "bit for bit" : "DIFFERS");
  assert_true(r.max_rel <= bound);
  assert_true(r.adapted > 100 * bound); /* the adapters change the answer */
  assert_true(r.base_bits);
  lm_backend_destroy(be);
  lm_model_free(m);
}

static void t_f32(void **state) {
  (void)state;
  run(LM_PRECISION_F32, 1e-5);
}

/* FAST quantizes activations per row: a row's products do not depend on the others. */
static void t_fast(void **state) {
  (void)state;
  run(LM_PRECISION_FAST, 1e-4);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(t_f32), cmocka_unit_test(t_fast)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
