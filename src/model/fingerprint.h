/* fingerprint.h — lumen's 256-bit streaming hash, its 64-bit data checksum, and the model
 * fingerprint that KV state files carry.
 *
 * The hash (lm_hasher) is a non-cryptographic 4-lane construction written for lumen:
 *   - state: four 64-bit lanes, seeded by the SplitMix64 finalizer of seed + i·φ (φ = 2^64/golden
 * ratio);
 *   - input is taken in 32-byte blocks of four little-endian words; word i of a block goes to lane
 * i: lane = rotl(lane ^ rotl(w · K1, 31), 27) · K2 + K3 (an odd multiply and rotations: every input
 * bit reaches every lane bit within two blocks, and the lanes run independently, so a block costs
 * four parallel multiply chains);
 *   - the tail (< 32 bytes) is zero-padded into one last block; the total length goes into the
 *     finalizer, so padding cannot collide with real zeros;
 *   - finalization chains the lanes through the SplitMix64 finalizer (h = mix(h ^ lane_i), with the
 *     length and the seed first), then output word j = mix(h ^ mix(lane_j + j·φ)): every output
 *     word depends on every input bit.
 * It detects accidental corruption (flipped bits, truncation, stale files); it is NOT a defence
 * against someone crafting a file on purpose. The loaders' bounds checks do not rely on it.
 *
 * The model fingerprint identifies "the same weights and graph":
 *   checkpoint: config.json's bytes, the parsed quantization map (defaults + every per-module
 *               override in order), and for every safetensors file (in the set's order) its size,
 *               header length, header bytes and the digest of its data section. The data digest
 *               reads every weight byte once per file version, then is kept under
 *               $LUMEN_CACHE_DIR (else $XDG_CACHE_HOME/lumen, else ~/.cache/lumen) keyed by the
 *               file's device, inode, size, mtime and ctime. File names and directories do not
 *               enter, so a moved or copied checkpoint keeps its fingerprint.
 *   synthetic:  the preset file's bytes, bits, group and seed.
 * Every field is length-prefixed and the two forms are domain-separated. */
#ifndef LM_MODEL_FINGERPRINT_H
#define LM_MODEL_FINGERPRINT_H

#include <stddef.h>
#include <stdint.h>

#include "model/model.h"

#define LM_FINGERPRINT_BYTES 32

typedef struct lm_hasher {
  uint64_t lane[4];
  uint8_t buf[32];
  size_t nbuf;    /* bytes waiting in buf (< 32) */
  uint64_t total; /* bytes absorbed */
  uint64_t seed;
} lm_hasher;

void lm_hasher_init(lm_hasher *h, uint64_t seed);
void lm_hasher_update(lm_hasher *h, const void *data, size_t n);
/* Absorbs v as 8 little-endian bytes. */
void lm_hasher_u64(lm_hasher *h, uint64_t v);
/* Absorbs n, then n bytes: a length-prefixed field (so "ab"+"c" differs from "a"+"bc"). */
void lm_hasher_field(lm_hasher *h, const void *data, size_t n);
/* Writes the 256-bit digest; h is not changed (more input may follow). */
void lm_hasher_final(const lm_hasher *h, uint8_t out[32]);
/* The first 64 bits of the digest of data[0..n) with seed: the checksum of a data block. */
uint64_t lm_hash64(const void *data, size_t n, uint64_t seed);

/* out gets the model's fingerprint (see above). Errors: LM_ERR_IO / LM_ERR_NOT_FOUND when
 * config.json (or a synthetic model's preset) or a weights file cannot be read. */
lm_status lm_model_fingerprint(const lm_model *m, uint8_t out[LM_FINGERPRINT_BYTES]);

/* The first 8 bytes as 16 lowercase hex digits (for messages): buf needs 17 bytes. */
const char *lm_fingerprint_short(const uint8_t fp[LM_FINGERPRINT_BYTES], char buf[17]);

#endif
