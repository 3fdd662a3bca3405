/* lora_save.h — writes an adapter in PEFT's layout (adapter_config.json and
 * adapter_model.safetensors, lora_A [r][in] and lora_B [out][r] per module, in f32 or bf16),
 * with its scale and weight folded into lora_B and lora_alpha = r, so that loading the
 * directory gives the same adapter (bf16: rounded). One rank for every module. `lumen bench
 * --save-adapter` writes its random adapter with it, for measuring loads. */
#ifndef LM_MODEL_LORA_SAVE_H
#define LM_MODEL_LORA_SAVE_H

#include "model/lora.h"

lm_status lm_lora_save_peft(const lm_lora *l, const char *dir, lm_dtype dt);

#endif
