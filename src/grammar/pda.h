/* pda.h — the byte-level pushdown recognizer: a parse state is a set of stacks (interned frame
 * ids, gstack.h), stepped one byte at a time.
 *
 * Expansion is lazy: a stack's top may rest on a REF or a REPEAT; a step expands only the
 * alternatives whose FIRST set holds the byte (grammar_impl.h), so a state inside a JSON string
 * is one stack, not one per UTF-8 lead byte. Epsilon moves (returns, empty alternatives, leaving
 * a repetition) happen inside the step; a frame is visited once per step, which both bounds the
 * work on ambiguous grammars and ends loops through repetitions of nullable bodies. Left
 * recursion, the one endless expansion, is refused when the grammar is compiled.
 *
 * States may be truncated (the top frames of each stack over the LM_GF_CTX sentinel): the
 * token-mask walk runs on them to find which tokens are decided by the top of the stack alone,
 * and the flags say where a parse needed what lies below. */
#ifndef LM_GRAMMAR_PDA_H
#define LM_GRAMMAR_PDA_H

#include "grammar/grammar_impl.h"
#include "grammar/gstack.h"

/* Bounds per step, so an ambiguous grammar costs at most this much per byte. Past them a step
 * fails with LM_ERR_UNSUPPORTED; since masks are computed from the stack tops, where fewer parses
 * are told apart, such a failure can reach lm_matcher_accept for a token the mask allowed. Only
 * grammars ambiguous far beyond any JSON schema's get there. */
#define LM_G_MAX_STACKS 4096u
#define LM_G_MAX_WORK (1u << 18)

typedef struct lm_gstate {
  uint32_t *s; /* sorted, distinct frame ids */
  uint32_t n, cap;
  uint8_t accept;    /* after the last byte, a parse completed the root */
  uint8_t ctx_hit;   /* a parse needed what lies below a truncated stack to take the byte */
  uint8_t ctx_after; /* after the byte, a parse returned into what lies below a truncated stack */
} lm_gstate;

/* Expansions one mask computation may spend in all (a hostile, ambiguous grammar would otherwise
 * make a trie walk run for hours); past it the fill fails with LM_ERR_UNSUPPORTED. */
#define LM_G_MASK_BUDGET (1ull << 25)

typedef struct lm_gpda {
  const lm_grammar *g;
  lm_gframes fr;
  uint32_t *work;
  uint32_t cap_work;
  uint64_t budget; /* expansions left to the current mask computation; 0: no limit */
  /* While masks are computed (one token at a time), counts of at least this (the longest piece
   * + 1) are entered as LM_G_INF: no token can exhaust them, and loops over them then step back
   * to the same state. 0 while accepting: a matcher's own state keeps exact counts. */
  uint32_t clamp;
} lm_gpda;

lm_status lm_gpda_init(lm_gpda *p, const lm_grammar *g);
void lm_gpda_free(lm_gpda *p);
void lm_gstate_free(lm_gstate *st);
lm_status lm_gstate_copy(lm_gstate *dst, const lm_gstate *src);

/* The state before any byte. */
lm_status lm_gpda_start(lm_gpda *p, lm_gstate *out);
/* out = the parses of `in` that take byte b (out may not alias in). Errors: LM_ERR_UNSUPPORTED
 * (more than LM_G_MAX_STACKS parses: the grammar is too ambiguous here), LM_ERR_NOMEM. */
lm_status lm_gpda_step(lm_gpda *p, const lm_gstate *in, uint8_t b, lm_gstate *out);

/* The bytes some parse of st can take next; *ctx set when a parse can reach the context below a
 * truncated stack without a byte (any byte may then be possible). */
void lm_gpda_first(const lm_gpda *p, const lm_gstate *st, lm_gset *out, int *ctx);
/* 1 when some parse of st can complete the root without another byte. */
int lm_gpda_complete(const lm_gpda *p, const lm_gstate *st);

/* The cache key of st: per stack its top `depth` frames (pos, rmin, rmax with the counts capped
 * at `clamp`, as LM_G_INF: a token of fewer bytes cannot tell larger counts apart) and whether
 * the stack goes
 * on below; stacks sorted and deduplicated. Written to *buf (grown), *len words. */
lm_status lm_gpda_key(lm_gpda *p, const lm_gstate *st, uint32_t depth, uint32_t clamp,
                      uint32_t **buf, uint32_t *cap, uint32_t *len);
/* out = st truncated to `depth` frames per stack (counts capped at `clamp`), the cut stacks
 * resting on LM_GF_CTX: the state the key above stands for. */
lm_status lm_gpda_truncate(lm_gpda *p, const lm_gstate *st, uint32_t depth, uint32_t clamp,
                           lm_gstate *out);
/* Rebuilds the frame table with only the frames st uses (st is rewritten); bounds the memory of
 * a long generation. */
lm_status lm_gpda_compact(lm_gpda *p, lm_gstate *st);

#endif
