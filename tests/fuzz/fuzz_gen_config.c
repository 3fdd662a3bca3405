/* fuzz_gen_config.c — libFuzzer target: generation_config.json parsing never crashes or leaks on
 * any bytes, and whatever it accepts is a valid sampling configuration. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "sample/gen_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  lm_gen_config g;
  if (lm_gen_config_parse((const char *)data, size, "fuzz.json", &g) == LM_OK) {
    if (lm_sampling_validate(&g.sampling) != LM_OK) abort();
    lm_gen_config_clear(&g);
  }
  return 0;
}
