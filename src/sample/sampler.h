/* sampler.h — logits processors and the token sampler.
 *
 * One call turns a row of logits into a token id. The processors run in this order (the order
 * transformers' generate() uses for the ones it has; presence/frequency come from OpenAI):
 *   1. repetition penalty (llama.cpp / CTRL multiplicative rule): every distinct id among the last
 *      repeat_last_n ids of the history has its logit divided by repeat_penalty when positive,
 *      multiplied by it when negative;
 *   2. presence / frequency penalties (OpenAI additive rule): logit -= count * frequency_penalty +
 *      (count > 0) * presence_penalty, with count taken over the last penalty_last_n ids;
 *   3. logit bias: logit += bias (a bias of -inf bans the id);
 *   4. suppress_tokens: logit = -inf;
 *   5. temperature <= 0: greedy, the argmax (the lowest id on ties); the steps below are skipped;
 *   6. temperature: logit /= temperature;
 *   7. top-k: the k highest logits stay (exactly k; ties broken by the lower id);
 *   8. top-p (nucleus): in decreasing order of probability, tokens stay while the probability
 *      mass before them is < top_p (the token that crosses top_p stays; at least one stays);
 *   9. min-p: tokens whose probability is < min_p * (the highest probability) go;
 *  10. a draw from what stays, with probabilities renormalized, using the seeded counter RNG.
 * Windows: -1 is the whole history, 0 turns the processor off, N > 0 the last N ids. The history
 * is whatever the caller passes (a generation session passes every id in the context, prompt
 * included, as llama.cpp and transformers do). NaN logits count as -inf.
 *
 * Determinism: for one seed, the same sequence of (logits, history) calls gives the same ids on
 * every run; lm_sampler_reset restarts the random stream.
 * Thread safety: a sampler belongs to one thread at a time. */
#ifndef LM_SAMPLE_SAMPLER_H
#define LM_SAMPLE_SAMPLER_H

#include <stdint.h>

#include "lumen.h"

/* lm_sampling, lm_logit_bias and their init/clear/copy/add/validate functions are public
 * (lumen.h). */

typedef struct lm_sampler lm_sampler;

/* Validates and copies p. Errors: LM_ERR_INVALID, LM_ERR_NOMEM. */
lm_status lm_sampler_create(const lm_sampling *p, lm_sampler **out);
void lm_sampler_free(lm_sampler *s); /* NULL is a no-op */
/* Restarts the random stream of the seed (the next draws repeat those after create). */
void lm_sampler_reset(lm_sampler *s);
/* The parameters in use. */
const lm_sampling *lm_sampler_params(const lm_sampler *s);

/* Allocates the working memory for a vocabulary of `vocab` up front, so that lm_sampler_sample can
 * then fail only on its input. Errors: LM_ERR_NOMEM. */
lm_status lm_sampler_reserve(lm_sampler *s, int64_t vocab);

/* Samples one id from logits[0..vocab) given the history ids[0..n) (ids outside the vocabulary
 * are ignored there, as are bias / suppress ids >= vocab). logits is overwritten (processed in
 * place). Returns the id, or -1 with lm_errmsg() set: LM_ERR_INVALID when no id has a finite logit
 * after the processors, LM_ERR_NOMEM. */
int32_t lm_sampler_sample(lm_sampler *s, float *logits, int64_t vocab, const int32_t *history,
                          int64_t n);

#endif
