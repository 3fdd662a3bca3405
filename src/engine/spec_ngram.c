/* spec_ngram.c — prompt-lookup drafts (spec_ngram.h). */
#include "engine/spec_ngram.h"

#include <string.h>

/* The latest start i < n - k of hist[i..i+k) == hist[n-k..n), or -1. */
static int64_t last_occurrence(const int32_t *hist, int64_t n, int k) {
  const int32_t *suf = hist + n - k;
  for (int64_t i = n - k - 1; i >= 0; i--)
    if (hist[i] == suf[0] && !memcmp(hist + i, suf, (size_t)k * sizeof *hist)) return i;
  return -1;
}

int lm_spec_ngram_propose(const int32_t *hist, int64_t n, int max, int32_t *out) {
  if (max < 1) return 0;
  for (int k = LM_NGRAM_MAX; k >= LM_NGRAM_MIN; k--) {
    if (n < k + 1) continue;
    int64_t i = last_occurrence(hist, n, k);
    if (i < 0) continue;
    int64_t from = i + k, avail = n - from;
    int got = avail < max ? (int)avail : max;
    memcpy(out, hist + from, (size_t)got * sizeof *out);
    return got;
  }
  return 0;
}
