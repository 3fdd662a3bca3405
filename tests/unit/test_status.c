/* test_status.c — error values carry messages, per thread. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <string.h>

#include "base/status.h"

static void t_set_and_prefix(void **state) {
  (void)state;
  lm_status s = LM_ERRF(LM_ERR_CORRUPT, "tensor %s: bad", "x");
  assert_int_equal(s, LM_ERR_CORRUPT);
  assert_string_equal(lm_errmsg(), "tensor x: bad");
  lm_err_prefix(s, "file %s", "a.safetensors");
  assert_string_equal(lm_errmsg(), "file a.safetensors: tensor x: bad");
  lm_err_clear();
  assert_string_equal(lm_errmsg(), "");
  assert_string_equal(lm_status_name(LM_ERR_IO), "LM_ERR_IO");
  assert_int_equal(lm_version_number(), LUMEN_VERSION_NUMBER);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(t_set_and_prefix)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
