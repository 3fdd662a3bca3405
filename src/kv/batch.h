/* batch.h — the batch descriptor of one forward step (ragged from day one).
 * Per token: its id, its sequence and its position. Per sequence: its cache set. Which
 * token rows need logits. Rules the forward checks before a step:
 *   - a sequence's tokens are contiguous in the batch, at consecutive positions that start
 *     at the length of its cache set (what the caches already hold);
 *   - logit rows are distinct token indices. */
#ifndef LM_KV_BATCH_H
#define LM_KV_BATCH_H

#include <stdint.h>

#include "kv/kv.h"

struct lm_batch {
  int32_t n_tokens;
  const int32_t *ids; /* [n_tokens] token ids */
  const int32_t *pos; /* [n_tokens] absolute positions */
  const int32_t *seq; /* [n_tokens] index into kv */
  int32_t n_seqs;
  lm_kv_set *const *kv; /* [n_seqs] */
  int32_t n_logits;
  const int32_t *logit_rows; /* [n_logits] token indices whose logits are wanted */
  /* [n_seqs][LM_LORA_PICKS] each sequence's LoRA adapters (mount slots; slot -1 ends a list),
   * or NULL: every sequence runs the forward's default adapters (model/lora_bank.h) */
  const struct lm_lora_pick *lora;
};

#endif
