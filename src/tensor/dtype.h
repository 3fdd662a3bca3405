/* dtype.h — element types of stored tensors and activations, and bf16/f16 conversion. */
#ifndef LM_TENSOR_DTYPE_H
#define LM_TENSOR_DTYPE_H

#include <stdint.h>
#include <string.h>
#include <stddef.h>

typedef enum lm_dtype {
  LM_DT_F32 = 0,
  LM_DT_F16,
  LM_DT_BF16,
  LM_DT_F64,
  LM_DT_U8,
  LM_DT_I8,
  LM_DT_U16,
  LM_DT_I16,
  LM_DT_U32,
  LM_DT_I32,
  LM_DT_U64,
  LM_DT_I64,
  LM_DT_BOOL,
  LM_DT_COUNT /* sentinel */
} lm_dtype;

/* Bytes per element. */
size_t lm_dtype_size(lm_dtype t);
/* safetensors spelling ("F32", "BF16", ...). */
const char *lm_dtype_name(lm_dtype t);
/* Parses a safetensors dtype string; returns LM_DT_COUNT if unknown. */
lm_dtype lm_dtype_parse(const char *s);

/* bf16 -> f32 is exact: the bf16 bits are the top half of the f32. */
static inline float lm_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* f32 -> bf16 with round-to-nearest-even (torch's rule); NaN stays NaN. */
static inline uint16_t lm_f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

/* Rounds an f32 to the nearest bf16 value, returned as f32. */
static inline float lm_round_bf16(float f) { return lm_bf16_to_f32(lm_f32_to_bf16(f)); }

float lm_f16_to_f32(uint16_t h);
uint16_t lm_f32_to_f16(float f);

#endif
