/* rng.h — counter-based random numbers: value = f(seed, stream, index), no state.
 * Synthetic benchmark weights are generated with it, so every backend (and the device
 * generator on CUDA) builds bit-identical weights from (seed, tensor id, element index). */
#ifndef LM_BASE_RNG_H
#define LM_BASE_RNG_H

#include <stdint.h>

/* SplitMix64 finalizer: a bijective 64-bit mix with good avalanche. */
static inline uint64_t lm_mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* 64 random bits for (seed, stream, index). */
static inline uint64_t lm_rng_u64(uint64_t seed, uint64_t stream, uint64_t index) {
  return lm_mix64(lm_mix64(seed ^ lm_mix64(stream + 0x9e3779b97f4a7c15ull)) + index);
}

/* Uniform in [0, 1) with 24 random bits (exact in f32). */
static inline float lm_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
  return (float)(lm_rng_u64(seed, stream, index) >> 40) * (1.0f / 16777216.0f);
}

/* Sequential generator for code that wants a stream (sampling): state is one counter. */
typedef struct lm_rng {
  uint64_t seed, counter;
} lm_rng;

static inline uint64_t lm_rng_next(lm_rng *r) { return lm_rng_u64(r->seed, 0, r->counter++); }
static inline float lm_rng_next_uniform(lm_rng *r) {
  return lm_rng_uniform(r->seed, 0, r->counter++);
}

#endif
