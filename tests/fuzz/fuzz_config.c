/* fuzz_config.c — libFuzzer target: config.json parsing never crashes or leaks on any bytes. */
#include <stddef.h>
#include <stdint.h>

#include "model/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  lm_model_config c;
  if (lm_config_parse((const char *)data, size, "fuzz.json", &c) == LM_OK) lm_config_free(&c);
  return 0;
}
