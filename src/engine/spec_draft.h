/* spec_draft.h — the draft-model source of speculative decoding: a smaller checkpoint of the
 * same vocabulary proposes the next tokens greedily, with caches of its own per sequence.
 *
 * A sequence's draft caches hold a prefix of its context (what the draft model has read); a
 * proposal first feeds the rest of the context (the prompt on the first round, the tokens the
 * last round accepted later), then drafts one token per step, each fed back but the last. After
 * the round, lm_spec_draft_keep trims the drafts the target rejected, so the caches again hold
 * a prefix of the context. The draft model's numbers never reach the answer: its tokens are
 * proposals the target verifies (sched.h), so any precision or quantization of it is exact. */
#ifndef LM_ENGINE_SPEC_DRAFT_H
#define LM_ENGINE_SPEC_DRAFT_H

#include <stdint.h>

#include "backend/backend.h"
#include "kv/kv.h"
#include "model/model.h"

typedef struct lm_spec_draft lm_spec_draft;

/* Loads the checkpoint at dir onto be for drafting for `target` (the vocabularies must agree),
 * with steps of up to `chunk` tokens. Errors: the loader's; LM_ERR_INVALID (another vocabulary),
 * the message naming dir. */
lm_status lm_spec_draft_open(const char *dir, lm_backend *be, const lm_model *target, int64_t chunk,
                             lm_spec_draft **out);
void lm_spec_draft_free(lm_spec_draft *d);

/* Up to `max` greedy drafts to follow hist[0..n) into out (*got: how many). *kv (created on first
 * use) holds a prefix of hist, and holds hist[0..n) and all drafts but the last afterwards. */
lm_status lm_spec_draft_propose(lm_spec_draft *d, lm_kv_set **kv, const int32_t *hist, int64_t n,
                                int max, int32_t *out, int *got);
/* After a round: keeps the first `len` tokens of kv (those the context and the caches still
 * share), when it holds more. */
lm_status lm_spec_draft_keep(lm_kv_set *kv, int64_t len);

#endif
