/* lora_config.h — an adapter's adapter_config.json, PEFT's or mlx-lm's: which file holds the
 * tensors, what the format refuses (DoRA, modules_to_save, biases, full fine-tunes), and the
 * scale of each module (PEFT: lora_alpha / r or / sqrt(r) with rsLoRA, rank_pattern and
 * alpha_pattern matched as PEFT matches them; mlx-lm: one scale). Internal to lora.c. */
#ifndef LM_MODEL_LORA_CONFIG_H
#define LM_MODEL_LORA_CONFIG_H

#include <jansson.h>
#include <stddef.h>

#include "base/status.h"

typedef struct lm_lora_cfg {
  int peft;                                   /* 1: PEFT, 0: mlx-lm */
  json_t *root;                               /* the parsed file */
  double alpha;                               /* PEFT lora_alpha */
  int64_t r;                                  /* PEFT r */
  int rslora;                                 /* PEFT use_rslora */
  double scale;                               /* mlx-lm lora_parameters.scale */
  const json_t *rank_pattern, *alpha_pattern; /* PEFT; borrowed from root, may be NULL */
} lm_lora_cfg;

/* Reads dir/adapter_config.json and finds the tensor file next to it (path into weights). */
lm_status lm_lora_cfg_load(const char *dir, lm_lora_cfg *c, char *weights, size_t n);
void lm_lora_cfg_free(lm_lora_cfg *c);

/* The scale of the module named `module` (PEFT: the base model's module path, e.g.
 * "model.language_model.layers.3.self_attn.o_proj") whose tensors have rank `rank`; a rank the
 * config gives otherwise is LM_ERR_CORRUPT. */
lm_status lm_lora_cfg_scale(const lm_lora_cfg *c, const char *module, int rank, float *scale);

#endif
