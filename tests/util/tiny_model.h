/* tiny_model.h — writes small random Gemma 4 checkpoints for tests (HF layout, bf16 matrices,
 * f32 vectors) from a config.json-shaped file, through the synthetic model builder. */
#ifndef LM_TEST_TINY_MODEL_H
#define LM_TEST_TINY_MODEL_H

#include "lumen.h"

/* Writes dir/config.json (a copy of config_json) and dir/model.safetensors. */
lm_status lm_test_write_tiny(const char *config_json, const char *dir);

/* Variants for bad-input tests: leave out the tensors whose name contains `skip`; write the
 * matrix whose name contains `quant` as 4-bit group-32 codes (U32 weight + bf16 scales/biases),
 * with its scales one column short when `bad_scales`. */
typedef struct lm_test_tiny_opts {
  const char *skip, *quant;
  int bad_scales;
} lm_test_tiny_opts;
lm_status lm_test_write_tiny_ex(const char *config_json, const char *dir,
                                const lm_test_tiny_opts *o);

/* A tiny E2B-like config (PLE, KV sharing, double-wide MLP, 4:1 layers); vocab 64, hidden 32. */
extern const char *lm_test_tiny_config;
/* The same geometry with head dims 32/64, so 32-wide quantization groups (KV, weights) fit. */
extern const char *lm_test_tiny_quant_config;

#endif
