/* cpu_bw.c — measured read bandwidth of this machine: the yardstick for the decode kernels
 * (a memory-bound gemv cannot beat it), reported by `lumen bench` and `lumen bench-kernels`.
 * The best of many passes: on a machine whose cores and memory others share, a median swings
 * with their load (28.6, 54.1 and 31.6 GB/s in three runs of one day), while the best pass
 * is what the memory gives when it is ours; the spread shows how far the rest fell. */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_matmul.h"

#define LM_BW_BYTES ((size_t)256 << 20) /* far past any last-level cache */
#define LM_BW_RUNS 15

#if defined(__x86_64__)
#include <immintrin.h>
/* Sums n 32-byte vectors with four independent chains: the loads dominate. */
__attribute__((target("avx2"))) static uint64_t lm_bw_sum_avx2(const uint8_t *p, size_t n) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i + 4 <= n; i += 4) {
    a0 = _mm256_add_epi64(a0, _mm256_load_si256((const __m256i *)(const void *)(p + 32 * i)));
    a1 = _mm256_add_epi64(a1, _mm256_load_si256((const __m256i *)(const void *)(p + 32 * i + 32)));
    a2 = _mm256_add_epi64(a2, _mm256_load_si256((const __m256i *)(const void *)(p + 32 * i + 64)));
    a3 = _mm256_add_epi64(a3, _mm256_load_si256((const __m256i *)(const void *)(p + 32 * i + 96)));
  }
  __m256i s = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
  uint64_t v[4];
  _mm256_storeu_si256((__m256i *)(void *)v, s);
  return v[0] + v[1] + v[2] + v[3];
}
#endif

static uint64_t lm_bw_sum(const uint8_t *p, size_t bytes) {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx2")) return lm_bw_sum_avx2(p, bytes / 32);
#endif
  const uint64_t *q = (const uint64_t *)(const void *)p;
  uint64_t s0 = 0, s1 = 0;
  for (size_t i = 0; i + 2 <= bytes / 8; i += 2) {
    s0 += q[i];
    s1 += q[i + 1];
  }
  return s0 + s1;
}

static int lm_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

lm_cpu_bw lm_cpu_read_bandwidth_passes(int threads, int passes) {
  lm_cpu_bw r = {0};
  if (threads <= 0) threads = omp_get_max_threads();
  if (passes < 1) passes = 1;
  if (passes > LM_BW_RUNS) passes = LM_BW_RUNS;
  uint8_t *buf = aligned_alloc(4096, LM_BW_BYTES);
  if (!buf) return r;
  size_t per = LM_BW_BYTES / (size_t)threads / 4096 * 4096;
  /* first touch by the thread that will read each part (NUMA placement) */
#pragma omp parallel num_threads(threads)
  memset(buf + per * (size_t)omp_get_thread_num(), 1, per);
  double t[LM_BW_RUNS];
  volatile uint64_t sink = 0;
  for (int i = 0; i < passes; i++) {
    uint64_t total = 0;
    double t0 = omp_get_wtime();
#pragma omp parallel num_threads(threads) reduction(+ : total)
    total += lm_bw_sum(buf + per * (size_t)omp_get_thread_num(), per);
    t[i] = omp_get_wtime() - t0;
    sink += total;
  }
  (void)sink;
  free(buf);
  qsort(t, (size_t)passes, sizeof t[0], lm_cmp_double);
  double bytes = (double)(per * (size_t)threads) / 1e9;
  r.best = bytes / t[0];
  r.median = bytes / t[passes / 2];
  r.worst = bytes / t[passes - 1];
  r.passes = passes;
  return r;
}

lm_cpu_bw lm_cpu_read_bandwidth(int threads) {
  return lm_cpu_read_bandwidth_passes(threads, LM_BW_RUNS);
}

double lm_cpu_read_bandwidth_gbs(int threads) { return lm_cpu_read_bandwidth(threads).best; }
