/* quant.h — MLX affine quantization (mx.quantize, mode "affine"; gemma4-spec §8.1), the
 * CPU kernel's rule, in f32 exactly as MLX computes it, per group of `group` values:
 *   scale = max((max - min) / (2^bits - 1), 1e-7), signed so the larger-magnitude edge maps
 *   exactly: side = |min| > |max|, edge = side ? min : max, scale = side ? scale : -scale;
 *   q0 = rint(edge / scale); if q0 != 0 { scale = edge / q0; bias = edge } else bias = 0;
 *   q = clamp(rint((w - bias) / scale), 0, 2^bits - 1).
 * Codes are computed with the f32 scale; callers store scale/bias in their storage dtype
 * (bf16 for checkpoints), and dequantization is w' = scale * q + bias. */
#ifndef LM_TENSOR_QUANT_H
#define LM_TENSOR_QUANT_H

#include <stdint.h>

/* Quantizes one row of n values (n % group == 0, (n * bits) % 32 == 0): packed codes as a
 * little-endian bit stream (n*bits/8 bytes), and n/group f32 scales and biases. */
void lm_affine_quantize_row(const float *w, int64_t n, int bits, int group, uint8_t *packed,
                            float *scales, float *biases);

/* One group's scale and bias (the rule above), and its codes as bytes. */
void lm_affine_quantize_group(const float *w, int group, int bits, uint8_t *codes, float *scale,
                              float *bias);

/* The KV-cache form: one row of n values quantized along it; scales and biases stored as bf16
 * bits; deq (may alias x) receives what a reader of the stored row sees:
 * f32(bf16 scale) * q + f32(bf16 bias). */
void lm_affine_quantize_row_bf16(const float *x, int64_t n, int bits, int group, uint8_t *packed,
                                 uint16_t *scales, uint16_t *biases, float *deq);
/* Reads a row stored that way. */
void lm_affine_dequant_row_bf16(const uint8_t *packed, const uint16_t *scales,
                                const uint16_t *biases, int64_t n, int bits, int group, float *out);

#endif
