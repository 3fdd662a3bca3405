/* gdfa.h — a lazily built DFA over parse states, for one mask walk: states (sets of frame ids
 * plus the step's flags) are interned, and the transition of a state by a byte is computed once
 * (lm_gpda_step) and then read from a row of 256. Walking the vocabulary trie then costs a table
 * lookup per node wherever states repeat, which they do: inside a JSON string every character
 * leads back to the same state.
 *
 * Valid while the frames it refers to live: the walk does not roll frames back until it is done.
 * Bounded: past max_states states (or the frame budget) lm_gdfa_next says LM_ERR_STATE, and the
 * caller falls back to stepping without memo (token_mask.c). */
#ifndef LM_GRAMMAR_GDFA_H
#define LM_GRAMMAR_GDFA_H

#include "grammar/pda.h"

#define LM_GDFA_MAX_STATES 4096u
/* Frames a walk may add before it falls back (the fallback rolls back per trie node). */
#define LM_GDFA_MAX_NEW_FRAMES (1u << 19)
#define LM_GDFA_DEAD 0u /* state 0: no parse, no flag */

enum {
  LM_GDFA_ACCEPT = 1,    /* lm_gstate.accept */
  LM_GDFA_CTX_HIT = 2,   /* lm_gstate.ctx_hit */
  LM_GDFA_CTX_AFTER = 4, /* lm_gstate.ctx_after */
  LM_GDFA_CTX_ANY = 8,   /* a parse reaches the cut without a byte (lm_gpda_first's ctx) */
  LM_GDFA_ALIVE = 16     /* some parse remains */
};

typedef struct lm_gdfa {
  uint32_t n, cap;
  uint32_t *off; /* n + 1 offsets into ids */
  uint32_t *ids;
  uint32_t n_ids, cap_ids;
  uint8_t *flags;
  lm_gset *first;
  uint32_t **rows;     /* 256 transitions per state, UINT32_MAX unknown; NULL until needed */
  uint64_t (*loop)[2]; /* per state: the ASCII bytes that lead back to it (when loop_done) */
  uint8_t *loop_done;
  uint32_t *slot; /* interning: state id + 1 */
  uint32_t slot_mask;
  uint32_t max_states, frames_base, max_new_frames;
  lm_gstate tmp_in, tmp_out;
} lm_gdfa;

void lm_gdfa_free(lm_gdfa *d);
/* Empties d for a walk that starts with the frames as they are now. */
lm_status lm_gdfa_reset(lm_gdfa *d, const lm_gpda *p);
/* The id of state st (copied in). Errors: LM_ERR_STATE (too many states), LM_ERR_NOMEM. */
lm_status lm_gdfa_intern(lm_gdfa *d, const lm_gpda *p, const lm_gstate *st, uint32_t *id);
/* The state after byte b from state s. Errors: LM_ERR_STATE (the memo is full: fall back), the
 * step's errors. */
lm_status lm_gdfa_next(lm_gdfa *d, lm_gpda *p, uint32_t s, uint8_t b, uint32_t *t);

#endif
