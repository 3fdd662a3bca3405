/* lora_merge.h — adapters merged into a checkpoint (`lumen merge-lora`). */
#ifndef LM_MODEL_LORA_MERGE_H
#define LM_MODEL_LORA_MERGE_H

#include "model/lora.h"

/* Writes into out_dir (created if absent) the checkpoint m with the adapters set[0..n) merged
 * into their modules, in m's layout: dense modules rounded to their dtype, MLX-quantized ones
 * quantized again with their own bits and group; every other tensor and the config, tokenizer
 * and template files as they are. m must have been loaded from disk; at most 8 adapters. */
lm_status lm_lora_merge(const lm_model *m, lm_lora *const *set, int n, const char *out_dir);

#endif
