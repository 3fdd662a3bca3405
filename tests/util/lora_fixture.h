/* lora_fixture.h — the LoRA fixtures (tests/fixtures/lora_*, made with PEFT by
 * tools/oracle/gen_lora_fixtures.py) checked on a backend. */
#ifndef LM_TEST_LORA_FIXTURE_H
#define LM_TEST_LORA_FIXTURE_H

#include "backend/backend.h"

/* Every lora_* fixture under dir: its base checkpoint with its adapters on be, in one pass and
 * as a prefill of half the ids followed by decode, against the fixture's fp32 logits within the
 * fixtures' fp32 bound (max |d| <= 1e-3 max |ref|, every argmax equal); a line per check.
 * Returns the failures; *checked: the fixtures found. */
int lm_fx_lora_check_all(const char *dir, lm_backend *be, int *checked);

#endif
