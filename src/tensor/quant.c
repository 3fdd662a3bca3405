/* quant.c — MLX affine quantization of rows (see quant.h for the rule). */
#include "tensor/quant.h"

#include <math.h>
#include <string.h>

#include "tensor/dtype.h"

void lm_affine_quantize_group(const float *w, int group, int bits, uint8_t *codes, float *scale,
                              float *bias) {
  float mx = w[0], mn = w[0];
  for (int i = 1; i < group; i++) {
    mx = w[i] > mx ? w[i] : mx;
    mn = w[i] < mn ? w[i] : mn;
  }
  const float n_bins = (float)((1 << bits) - 1), eps = 1e-7f;
  int side = fabsf(mn) > fabsf(mx);
  float s = (mx - mn) / n_bins;
  s = s > eps ? s : eps;
  s = side ? s : -s;
  float edge = side ? mn : mx, q0 = rintf(edge / s), b = 0.0f;
  if (q0 != 0.0f) {
    s = edge / q0;
    b = edge;
  }
  for (int i = 0; i < group; i++) {
    float q = rintf((w[i] - b) / s);
    q = q < 0.0f ? 0.0f : (q > n_bins ? n_bins : q);
    codes[i] = (uint8_t)q;
  }
  *scale = s;
  *bias = b;
}

void lm_affine_quantize_row(const float *w, int64_t n, int bits, int group, uint8_t *packed,
                            float *scales, float *biases) {
  memset(packed, 0, (size_t)(n * bits / 8));
  uint8_t codes[128];
  for (int64_t g = 0; g < n / group; g++) {
    lm_affine_quantize_group(w + g * group, group, bits, codes, &scales[g], &biases[g]);
    for (int i = 0; i < group; i++) { /* LSB-first bit stream, codes may straddle bytes */
      uint64_t bit = (uint64_t)(g * group + i) * (uint64_t)bits;
      uint32_t v = (uint32_t)codes[i] << (bit & 7);
      packed[bit >> 3] |= (uint8_t)v;
      if ((bit & 7) + (uint64_t)bits > 8) packed[(bit >> 3) + 1] |= (uint8_t)(v >> 8);
    }
  }
}

void lm_affine_quantize_row_bf16(const float *x, int64_t n, int bits, int group, uint8_t *packed,
                                 uint16_t *scales, uint16_t *biases, float *deq) {
  memset(packed, 0, (size_t)(n * bits / 8));
  uint8_t codes[128];
  for (int64_t g = 0; g < n / group; g++) {
    float s, b;
    lm_affine_quantize_group(x + g * group, group, bits, codes, &s, &b);
    scales[g] = lm_f32_to_bf16(s);
    biases[g] = lm_f32_to_bf16(b);
    float sf = lm_bf16_to_f32(scales[g]), bf = lm_bf16_to_f32(biases[g]);
    for (int i = 0; i < group; i++) {
      uint64_t bit = (uint64_t)(g * group + i) * (uint64_t)bits;
      uint32_t v = (uint32_t)codes[i] << (bit & 7);
      packed[bit >> 3] |= (uint8_t)v;
      if ((bit & 7) + (uint64_t)bits > 8) packed[(bit >> 3) + 1] |= (uint8_t)(v >> 8);
      if (deq) deq[g * group + i] = sf * (float)codes[i] + bf;
    }
  }
}

void lm_affine_dequant_row_bf16(const uint8_t *packed, const uint16_t *scales,
                                const uint16_t *biases, int64_t n, int bits, int group,
                                float *out) {
  if (bits == 8 || bits == 4) { /* the KV widths: whole bytes or nibbles, no straddling */
    for (int64_t g = 0; g < n / group; g++) {
      float sf = lm_bf16_to_f32(scales[g]), bf = lm_bf16_to_f32(biases[g]);
      const uint8_t *p = packed + g * group * bits / 8;
      float *o = out + g * group;
      if (bits == 8)
        for (int i = 0; i < group; i++)
          o[i] = sf * (float)p[i] + bf;
      else
        for (int i = 0; i < group; i += 2) {
          o[i] = sf * (float)(p[i / 2] & 15) + bf;
          o[i + 1] = sf * (float)(p[i / 2] >> 4) + bf;
        }
    }
    return;
  }
  uint32_t mask = (1u << bits) - 1u;
  for (int64_t g = 0; g < n / group; g++) {
    float sf = lm_bf16_to_f32(scales[g]), bf = lm_bf16_to_f32(biases[g]);
    for (int i = 0; i < group; i++) {
      int64_t k = g * group + i;
      uint64_t bit = (uint64_t)k * (uint64_t)bits;
      uint32_t v = packed[bit >> 3] >> (bit & 7);
      if ((bit & 7) + (uint64_t)bits > 8) v |= (uint32_t)packed[(bit >> 3) + 1] << (8 - (bit & 7));
      out[k] = sf * (float)(v & mask) + bf;
    }
  }
}
