/* matcher_impl.h — one sequence's matcher: the current parse state, its frames, and the scratch
 * the mask walk uses (so a fill allocates nothing once warm). */
#ifndef LM_GRAMMAR_MATCHER_IMPL_H
#define LM_GRAMMAR_MATCHER_IMPL_H

#include "grammar/gdfa.h"
#include "grammar/mask_cache.h"
#include "grammar/pda.h"
#include "grammar/vocab.h"

/* How many top frames of each stack a LOCAL cache key keeps. Deeper keys are more specific (fewer
 * tokens left to check per call, more distinct keys to walk the trie for). */
#define LM_G_KEY_DEPTH 2u
/* A LOCAL entry leaving more tokens than this to check against the whole state per call is
 * replaced by one of twice the depth (token_mask.c). */
#define LM_G_MAX_UNCERTAIN 2048u

typedef struct lm_gwalk_level {
  uint32_t node, child, mark, sid; /* sid: the DFA state (walk_dfa) */
  uint8_t inh; /* a parse above reached the cut: tokens here not accepted are uncertain */
  int ctx_any;
  lm_gset first;
} lm_gwalk_level;

struct lm_matcher {
  const lm_grammar *g;
  const lm_grammar_vocab *v;
  lm_gcache *cache;
  lm_gpda pda;
  lm_gstate cur, nxt;
  lm_gstate *lv; /* v->max_len + 2 states, one per trie depth */
  lm_gwalk_level *lev;
  uint32_t *marks;
  uint32_t *key;
  uint32_t key_cap;
  uint32_t *key2;
  uint32_t key2_cap;
  uint32_t key_depth;
  uint32_t max_uncertain; /* LM_G_MAX_UNCERTAIN (tests lower it) */
  uint32_t live_frames;   /* frames after the last compaction */
  lm_gdfa dfa;
  int no_dfa; /* tests: always take the plain (unmemoized) walk and check */
  /* counters for benchmarks and tests */
  uint64_t n_full_hits, n_local_hits, n_walks, n_checked, n_fallbacks;
};

/* The cache of (g, v), made on first use. Errors: LM_ERR_NOMEM. */
lm_status lm_grammar_cache_for(const lm_grammar *g, const lm_grammar_vocab *v, lm_gcache **out);

/* Fills a LOCAL entry for truncated state st: accepted tokens into bits (cleared first), the
 * uncertain ones appended to *unc (trie order). */
lm_status lm_gmask_walk(lm_matcher *m, const lm_gstate *st, uint32_t *bits, int32_t **unc,
                        uint32_t *n_unc);
/* Sets the bits of the tokens in unc that the current (whole) state accepts. */
lm_status lm_gmask_check(lm_matcher *m, const int32_t *unc, uint32_t n_unc, uint32_t *mask);

/* For benchmarks: the depth of LOCAL keys (1..64). */
void lm_matcher_set_key_depth(lm_matcher *m, uint32_t depth);

#endif
