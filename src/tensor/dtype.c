/* dtype.c — dtype table and IEEE half conversions. */
#include "tensor/dtype.h"

static const struct {
  const char *name;
  size_t size;
} lm_dtypes[LM_DT_COUNT] = {
    [LM_DT_F32] = {"F32", 4},   [LM_DT_F16] = {"F16", 2}, [LM_DT_BF16] = {"BF16", 2},
    [LM_DT_F64] = {"F64", 8},   [LM_DT_U8] = {"U8", 1},   [LM_DT_I8] = {"I8", 1},
    [LM_DT_U16] = {"U16", 2},   [LM_DT_I16] = {"I16", 2}, [LM_DT_U32] = {"U32", 4},
    [LM_DT_I32] = {"I32", 4},   [LM_DT_U64] = {"U64", 8}, [LM_DT_I64] = {"I64", 8},
    [LM_DT_BOOL] = {"BOOL", 1},
};

size_t lm_dtype_size(lm_dtype t) { return t < LM_DT_COUNT ? lm_dtypes[t].size : 0; }

const char *lm_dtype_name(lm_dtype t) { return t < LM_DT_COUNT ? lm_dtypes[t].name : "?"; }

lm_dtype lm_dtype_parse(const char *s) {
  for (int i = 0; i < LM_DT_COUNT; i++)
    if (!strcmp(s, lm_dtypes[i].name)) return (lm_dtype)i;
  return LM_DT_COUNT;
}

float lm_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else { /* subnormal: renormalize */
      exp = 127 - 15 + 1;
      while (!(man & 0x400)) {
        man <<= 1;
        exp--;
      }
      u = sign | (exp << 23) | ((man & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  memcpy(&f, &u, 4);
  return f;
}

uint16_t lm_f32_to_f16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  int32_t exp = (int32_t)((u >> 23) & 0xff) - 127 + 15;
  uint32_t man = u & 0x7fffffu;
  if (((u >> 23) & 0xff) == 0xff) return (uint16_t)(sign | 0x7c00u | (man ? 0x200u : 0));
  if (exp >= 31) return (uint16_t)(sign | 0x7c00u);
  if (exp <= 0) {
    if (exp < -10) return (uint16_t)sign;
    man |= 0x800000u;
    uint32_t shift = (uint32_t)(14 - exp);
    uint32_t half = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) half++;
    return (uint16_t)(sign | half);
  }
  uint32_t half = sign | ((uint32_t)exp << 10) | (man >> 13), rem = man & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1))) half++;
  return (uint16_t)half;
}
