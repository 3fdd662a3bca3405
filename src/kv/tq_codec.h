/* tq_codec.h — the TurboQuant KV codec, one (token, KV head) row of head_dim d at a time
 * (../shared/docs/turboquant-kvstore.md §2, the variant vllm-metal and mlx-bun ship, not the
 * paper's).
 *
 * Keys: affine per 32-group, no rotation. kBits 8 is signed (int8 codes, unpacked); 2, 4 and 5
 * are unsigned and bit-packed. Scale and zero are computed in fp32 and stored as fp16; a reader
 * sees (idx + zero) * scale.
 * Values: rotated by y = H_d (x ⊙ s) / √d (s the fixed sign vector of d, H_d the natural-order
 * Walsh–Hadamard matrix), then per 32-group of y an RMS scale (fp16) and the Lloyd-Max index of
 * y / (scale + eps) with a strict `>` boundary search, bit-packed. A reader sees the rotated row
 * centroid[idx] * scale; attention, being linear in V, accumulates those and un-rotates its
 * output once (lm_tq_unrotate: H_d / √d first, then the signs).
 *
 * Packing (§2.3): one little-endian bit stream per row, element i at stream bits
 * [i·b, i·b + b), bit 0 the LSB of byte 0; a row of d elements is d·b/8 bytes.
 *
 * Arithmetic is fp32 throughout, round is rintf (ties to even, the default rounding mode), and
 * sums run left to right, so the codes match the reference bit for bit; the decoders return
 * the fp32 values before the reference's final bf16 cast. Everything here is pure and
 * thread-safe; the row functions trust a params struct that lm_tq_params_init accepted. */
#ifndef LM_KV_TQ_CODEC_H
#define LM_KV_TQ_CODEC_H

#include <stdint.h>

#include "base/status.h"

/* Elements per scale group, for keys and values alike. */
#define LM_TQ_BLOCK 32
/* Added to every scale before dividing by it, in fp32. */
#define LM_TQ_EPS 1e-8f
/* The largest head_dim (bounds the scratch row of the value encoder). */
#define LM_TQ_MAX_DIM 512

/* A validated geometry: the head_dim, the widths, and the tables they select. */
typedef struct lm_tq_params {
  int d, k_bits, v_bits;
  const int8_t *signs;     /* [d], ±1 */
  const float *centroids;  /* [2^v_bits] */
  const float *boundaries; /* [2^v_bits - 1], strictly rising */
} lm_tq_params;

/* Fills p for head_dim d (64, 128, 256 or 512), key width k_bits (2, 4, 5 or 8) and value width
 * v_bits (2, 3, 4 or 5; 8 is not offered: its table was never transcribed, and the spec measures
 * its quality as affine kv8's). Anything else is LM_ERR_UNSUPPORTED naming the value. */
lm_status lm_tq_params_init(lm_tq_params *p, int d, int k_bits, int v_bits);
/* 1 if the codec has key width k_bits and value width v_bits (a predicate: no message). */
int lm_tq_widths_ok(int k_bits, int v_bits);

/* Bytes of one row's planes (§2.4): key codes d·k/8, key scales and zeros d/32 fp16 each, value
 * codes d·v/8, value scales d/32 fp16. */
static inline int64_t lm_tq_key_code_bytes(const lm_tq_params *p) {
  return (int64_t)p->d * p->k_bits / 8;
}
static inline int64_t lm_tq_value_code_bytes(const lm_tq_params *p) {
  return (int64_t)p->d * p->v_bits / 8;
}
static inline int64_t lm_tq_groups(const lm_tq_params *p) { return p->d / LM_TQ_BLOCK; }
/* d·(k + v)/8 + 6·d/32: what one (token, head) costs in the cache. */
static inline int64_t lm_tq_row_bytes(const lm_tq_params *p) {
  return lm_tq_key_code_bytes(p) + lm_tq_value_code_bytes(p) + 6 * lm_tq_groups(p);
}

/* Element i of a packed stream of b-bit codes (b <= 8). Reads the second byte only when the
 * element straddles it, so the last element of a row never reads past the row. */
static inline unsigned lm_tq_unpack(const uint8_t *p, int64_t i, int b) {
  int64_t bit = i * b;
  unsigned w = p[bit >> 3];
  if ((bit & 7) + b > 8) w |= (unsigned)p[(bit >> 3) + 1] << 8;
  return (w >> (bit & 7)) & ((1u << b) - 1);
}
/* Packs n codes (each < 2^b) into n·b/8 bytes; n·b must be a multiple of 8. */
void lm_tq_pack(const uint8_t *idx, int64_t n, int b, uint8_t *out);

/* Keys. x: [d] fp32. codes: d·k/8 bytes (for k = 8, int8 codes as bytes); scales, zeros: [d/32]
 * fp16 bits. */
void lm_tq_key_encode(const lm_tq_params *p, const float *x, uint8_t *codes, uint16_t *scales,
                      uint16_t *zeros);
/* out[d] = (idx + zero) * scale in fp32, the add first. */
void lm_tq_key_decode(const lm_tq_params *p, const uint8_t *codes, const uint16_t *scales,
                      const uint16_t *zeros, float *out);

/* Values. x: [d] fp32 (not modified). codes: d·v/8 bytes; scales: [d/32] fp16 bits. */
void lm_tq_value_encode(const lm_tq_params *p, const float *x, uint8_t *codes, uint16_t *scales);
/* out[d] = centroid[idx] * scale: the row in the rotated domain. */
void lm_tq_value_decode_rot(const lm_tq_params *p, const uint8_t *codes, const uint16_t *scales,
                            float *out);

/* The rotation and its inverse, in place on one row of p->d values: rotate is x ⊙ s then
 * H_d / √d; unrotate is H_d / √d then ⊙ s (H_d / √d is its own inverse). */
void lm_tq_rotate(const lm_tq_params *p, float *x);
void lm_tq_unrotate(const lm_tq_params *p, float *x);
/* The normalized Walsh–Hadamard transform of n = 2^m values in place: butterflies
 * (a, b) -> (a + b, a - b) for h = 1, 2, 4, ..., then one multiply by fp32(1/√n). */
void lm_tq_fwht(float *x, int n);

#endif
