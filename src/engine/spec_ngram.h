/* spec_ngram.h — the n-gram draft source of speculative decoding (prompt lookup).
 *
 * The drafts for a context are what followed the most recent earlier occurrence of its longest
 * suffix: suffixes of LM_NGRAM_MAX down to LM_NGRAM_MIN tokens are tried, the first that
 * occurred before proposes the tokens after that occurrence. Text that repeats (code edited in
 * place, a passage quoted back, a list continued) is drafted well; elsewhere nothing is found and
 * the step decodes one token as usual. Cost: one backward scan of the context per length tried,
 * a few microseconds per thousand tokens. */
#ifndef LM_ENGINE_SPEC_NGRAM_H
#define LM_ENGINE_SPEC_NGRAM_H

#include <stdint.h>

#define LM_NGRAM_MAX 4
#define LM_NGRAM_MIN 1

/* Up to `max` drafts to follow hist[0..n) into out; returns how many (0: no suffix recurs). */
int lm_spec_ngram_propose(const int32_t *hist, int64_t n, int max, int32_t *out);

#endif
