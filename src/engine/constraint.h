/* constraint.h — one sequence's constrained decoding: which ids may come next, given the grammar
 * of the answer (a response format, a GBNF) and of tool calls, and the rules around them that are
 * about control tokens rather than text:
 *
 *   - reasoning first: while the reasoning channel is open (the prompt opened it, or the model
 *     did: <|channel> as the first token when the prompt turned thinking on), nothing but the
 *     answer's end is constrained; the constraint starts when <channel|> closes it;
 *   - the answer: its text follows the answer grammar; the stop ids are allowed only when the text
 *     so far is complete, and a finished grammar (nothing may follow) ends the sequence;
 *   - tool calls (Gemma 4): <|tool_call> may open a call only when tool_choice allows one (never
 *     with none; as the only way to answer with required or a named tool; with auto instead of
 *     answer text); a call's text follows the call grammar and <tool_call|> closes it when it is
 *     complete; after a call, another call or the end.
 *
 * The masks come from the grammar library's matchers (precomputed per grammar state); the tokens
 * this file adds or removes are a handful of ids. One constraint per sequence, used by one thread
 * at a time (the engine's: its sampling loop, or its mask helper while a forward runs); created
 * on the request's thread. */
#ifndef LM_ENGINE_CONSTRAINT_H
#define LM_ENGINE_CONSTRAINT_H

#include <stdint.h>

#include "engine/grammar_cache.h"
#include "grammar/grammar.h"
#include "lumen.h"

typedef struct lm_constraint_opts {
  lm_grammar_ref *answer; /* the answer's grammar, or NULL: free text (taken over by create) */
  lm_grammar_ref *calls;  /* the call grammar ("call:NAME{...}"), or NULL: no calls (taken over) */
  const lm_grammar_vocab *vocab;
  int64_t n_vocab;       /* ids of a logits row (the model's vocabulary) */
  lm_tool_choice choice; /* NONE: <|tool_call> never; REQUIRED / NAMED: the answer is calls */
  int32_t channel_open;  /* <|channel>, <channel|>, <|tool_call>, <tool_call|>; -1: none */
  int32_t channel_close;
  int32_t call_open;
  int32_t call_close;
  const int32_t *stop_ids; /* sorted; borrowed (they outlive the constraint) */
  int32_t n_stop_ids;
  int start_in_reasoning; /* the prompt ends inside the reasoning channel */
  int may_reason;         /* the model may open the channel first (thinking is on) */
} lm_constraint_opts;

typedef struct lm_constraint lm_constraint;

/* Takes over o->answer and o->calls on success and failure alike. Errors: LM_ERR_NOMEM, the
 * matcher's. */
lm_status lm_constraint_create(const lm_constraint_opts *o, lm_constraint **out);
void lm_constraint_free(lm_constraint *c); /* NULL is a no-op */

/* Decides which ids may come next (the grammar library's mask for the current state): the part of
 * apply that needs no logits, so that it can run while the forward computes them. Idempotent
 * until the next accept. Errors: the matcher's. */
lm_status lm_constraint_prepare(lm_constraint *c);
/* Sets row[id] = -inf for every id that may not come next (preparing first where needed).
 * Errors: the matcher's. */
lm_status lm_constraint_apply(lm_constraint *c, float *row);
/* Advances by the sampled id. Errors: LM_ERR_INVALID when the id was not allowed. */
lm_status lm_constraint_accept(lm_constraint *c, int32_t id);
/* 1 when the answer's grammar is finished: nothing may follow, the sequence ends. */
int lm_constraint_finished(const lm_constraint *c);

#endif
