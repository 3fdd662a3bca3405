/* tq_codec.c — the TurboQuant KV codec (tq_codec.h; ../shared/docs/turboquant-kvstore.md §2).
 *
 * Every formula mirrors the reference operation by operation, in fp32: the compiler contracts
 * nothing (ISO C mode, -ffp-contract=off) and no x87 excess precision exists on x86-64, so each
 * `+ - * /` rounds once to fp32 as the reference's f32() does. */
#include "kv/tq_codec.h"

#include <math.h>
#include <string.h>

#include "kv/tq_tables.h"
#include "tensor/dtype.h"

int lm_tq_widths_ok(int k_bits, int v_bits) {
  return (k_bits == 2 || k_bits == 4 || k_bits == 5 || k_bits == 8) && v_bits >= 2 && v_bits <= 5;
}

lm_status lm_tq_params_init(lm_tq_params *p, int d, int k_bits, int v_bits) {
  memset(p, 0, sizeof *p);
  switch (d) {
  case 64: p->signs = lm_tq_signs_64; break;
  case 128: p->signs = lm_tq_signs_128; break;
  case 256: p->signs = lm_tq_signs_256; break;
  case 512: p->signs = lm_tq_signs_512; break;
  default:
    return LM_ERRF(LM_ERR_UNSUPPORTED, "turboquant: head_dim %d (supported: 64, 128, 256, 512)", d);
  }
  if (k_bits != 2 && k_bits != 4 && k_bits != 5 && k_bits != 8)
    return LM_ERRF(LM_ERR_UNSUPPORTED, "turboquant: key bits %d (supported: 2, 4, 5, 8)", k_bits);
  switch (v_bits) {
  case 2: p->centroids = lm_tq_centroids_2, p->boundaries = lm_tq_boundaries_2; break;
  case 3: p->centroids = lm_tq_centroids_3, p->boundaries = lm_tq_boundaries_3; break;
  case 4: p->centroids = lm_tq_centroids_4, p->boundaries = lm_tq_boundaries_4; break;
  case 5: p->centroids = lm_tq_centroids_5, p->boundaries = lm_tq_boundaries_5; break;
  default:
    return LM_ERRF(LM_ERR_UNSUPPORTED, "turboquant: value bits %d (supported: 2, 3, 4, 5)", v_bits);
  }
  p->d = d, p->k_bits = k_bits, p->v_bits = v_bits;
  return LM_OK;
}

void lm_tq_pack(const uint8_t *idx, int64_t n, int b, uint8_t *out) {
  memset(out, 0, (size_t)(n * b / 8));
  for (int64_t i = 0; i < n; i++) {
    int64_t bit = i * b;
    unsigned v = idx[i] & ((1u << b) - 1), sh = (unsigned)(bit & 7);
    out[bit >> 3] |= (uint8_t)(v << sh);
    if (sh + (unsigned)b > 8) out[(bit >> 3) + 1] |= (uint8_t)(v >> (8 - sh));
  }
}

/* ---- keys ------------------------------------------------------------------------------------ */

/* Clamps a rounded code into [lo, hi]; NaN (a NaN input) becomes lo rather than an undefined
 * float-to-int conversion. */
static int clamp_code(float q, int lo, int hi) {
  if (q > (float)hi) return hi;
  if (!(q >= (float)lo)) return lo;
  return (int)q;
}

/* One 32-group: codes as bytes (int8 two's complement when signed), fp32 scale and zero.
 * signed (8 bits, M = 127): scale = (hi - lo) / 2M, zero = round((hi + lo) / (2 (scale + eps))),
 * idx in [-M, M]; unsigned (M = 2^k - 1): scale = (hi - lo) / M, zero = round(lo / (scale + eps)),
 * idx in [0, M]; both idx = round(x / (scale + eps) - zero).
 * A constant group has scale 0, so zero = c / eps (times 1 or 2/2) and overflows fp16 to ±Inf
 * for any |c| >= ~6.6e-4; the stored row then decodes to NaN ((idx + Inf) * 0). The reference
 * does exactly this and mlx-bun's golden test asserts it, so it is reproduced, not repaired. */
static void key_group(const float *x, int bits, uint8_t *codes, float *scale_out, float *zero_out) {
  float lo = x[0], hi = x[0];
  for (int i = 1; i < LM_TQ_BLOCK; i++) {
    lo = x[i] < lo ? x[i] : lo;
    hi = x[i] > hi ? x[i] : hi;
  }
  int sgn = bits == 8, m = sgn ? 127 : (1 << bits) - 1;
  float scale, zero;
  if (sgn) {
    scale = (hi - lo) / (2.0f * (float)m);
    zero = rintf((hi + lo) / (2.0f * (scale + LM_TQ_EPS)));
  } else {
    scale = (hi - lo) / (float)m;
    zero = rintf(lo / (scale + LM_TQ_EPS));
  }
  for (int i = 0; i < LM_TQ_BLOCK; i++) {
    int q = clamp_code(rintf(x[i] / (scale + LM_TQ_EPS) - zero), sgn ? -m : 0, m);
    codes[i] = (uint8_t)(q & 0xff);
  }
  *scale_out = scale, *zero_out = zero;
}

void lm_tq_key_encode(const lm_tq_params *p, const float *x, uint8_t *codes, uint16_t *scales,
                      uint16_t *zeros) {
  uint8_t idx[LM_TQ_MAX_DIM];
  for (int g = 0; g < p->d / LM_TQ_BLOCK; g++) {
    float scale, zero;
    key_group(x + g * LM_TQ_BLOCK, p->k_bits, idx + g * LM_TQ_BLOCK, &scale, &zero);
    /* cast after the fp32 arithmetic: the codes above used the unrounded scale and zero */
    scales[g] = lm_f32_to_f16(scale);
    zeros[g] = lm_f32_to_f16(zero);
  }
  if (p->k_bits == 8)
    memcpy(codes, idx, (size_t)p->d); /* int8, unpacked */
  else
    lm_tq_pack(idx, p->d, p->k_bits, codes);
}

void lm_tq_key_decode(const lm_tq_params *p, const uint8_t *codes, const uint16_t *scales,
                      const uint16_t *zeros, float *out) {
  for (int g = 0; g < p->d / LM_TQ_BLOCK; g++) {
    float s = lm_f16_to_f32(scales[g]), z = lm_f16_to_f32(zeros[g]);
    for (int i = g * LM_TQ_BLOCK; i < (g + 1) * LM_TQ_BLOCK; i++) {
      float q = p->k_bits == 8 ? (float)(int8_t)codes[i] : (float)lm_tq_unpack(codes, i, p->k_bits);
      out[i] = (q + z) * s;
    }
  }
}

/* ---- the rotation ---------------------------------------------------------------------------- */

void lm_tq_fwht(float *x, int n) {
  for (int h = 1; h < n; h *= 2)
    for (int i = 0; i < n; i += 2 * h)
      for (int j = i; j < i + h; j++) {
        float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
  /* 1/√n rounded once from double, as the reference computes it (1/sqrtf(n) can differ by an
   * ulp for n = 128 and 512) */
  float s = (float)(1.0 / sqrt((double)n));
  for (int i = 0; i < n; i++)
    x[i] *= s;
}

/* Multiplying by ±1 is exact; a negation is the same operation (0 * -1 is -0 either way). */
static void apply_signs(const lm_tq_params *p, float *x) {
  for (int i = 0; i < p->d; i++)
    if (p->signs[i] < 0) x[i] = -x[i];
}

void lm_tq_rotate(const lm_tq_params *p, float *x) {
  apply_signs(p, x);
  lm_tq_fwht(x, p->d);
}

void lm_tq_unrotate(const lm_tq_params *p, float *x) {
  lm_tq_fwht(x, p->d);
  apply_signs(p, x);
}

/* ---- values ---------------------------------------------------------------------------------- */

/* #{j : y > boundary[j]}: searchsorted with a strict `>`, so a value equal to a boundary takes
 * the lower code (y = 0 at 3 bits, whose middle boundary is 0, is code 3); NaN is code 0. */
static uint8_t lloyd_max_index(const lm_tq_params *p, float y) {
  int n = (1 << p->v_bits) - 1, c = 0;
  for (int j = 0; j < n; j++)
    c += y > p->boundaries[j];
  return (uint8_t)c;
}

void lm_tq_value_encode(const lm_tq_params *p, const float *x, uint8_t *codes, uint16_t *scales) {
  float y[LM_TQ_MAX_DIM];
  uint8_t idx[LM_TQ_MAX_DIM];
  memcpy(y, x, (size_t)p->d * sizeof(float));
  lm_tq_rotate(p, y);
  for (int g = 0; g < p->d / LM_TQ_BLOCK; g++) {
    const float *yg = y + g * LM_TQ_BLOCK;
    /* RMS, summed left to right: another order can move the fp16 scale by an ulp */
    float acc = 0.0f;
    for (int i = 0; i < LM_TQ_BLOCK; i++)
      acc += yg[i] * yg[i];
    float scale = sqrtf(acc / (float)LM_TQ_BLOCK);
    for (int i = 0; i < LM_TQ_BLOCK; i++)
      idx[g * LM_TQ_BLOCK + i] = lloyd_max_index(p, yg[i] / (scale + LM_TQ_EPS));
    scales[g] = lm_f32_to_f16(scale);
  }
  lm_tq_pack(idx, p->d, p->v_bits, codes);
}

void lm_tq_value_decode_rot(const lm_tq_params *p, const uint8_t *codes, const uint16_t *scales,
                            float *out) {
  for (int g = 0; g < p->d / LM_TQ_BLOCK; g++) {
    float s = lm_f16_to_f32(scales[g]);
    for (int i = g * LM_TQ_BLOCK; i < (g + 1) * LM_TQ_BLOCK; i++)
      out[i] = p->centroids[lm_tq_unpack(codes, i, p->v_bits)] * s;
  }
}
