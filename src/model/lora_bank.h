/* lora_bank.h — the LoRA adapters a forward has mounted, and which of them each row of a step
 * runs with. Up to LM_ADAPTER_MOUNT_MAX adapters sit in slots; every adapted module (layer,
 * kind) has a table in backend memory with an entry per slot (lm_lora_ent: the adapter's
 * matrices there, or rank 0), and every step uploads each row's picks (lm_lora_pick: slots and
 * weights, its sequence's). The ops read tables and picks when they run, so rows of one batch
 * may run different adapter sets, or none, and a captured plan replays whatever is mounted:
 * only mounting or unmounting (a new generation) and the most picks a row has change the ops a
 * step issues.
 *
 * A module's path is two ops: lm_lora_shrink_args computes t = weight · A x for every row and
 * pick (for up to three modules reading the same x at once), and the module's product adds
 * Σ_j B_j t_j before its epilogue (lm_matmul_args.lora), so the base weights are never
 * rewritten and a fused epilogue (the GeGLU pair) keeps its fusion. */
#ifndef LM_MODEL_LORA_BANK_H
#define LM_MODEL_LORA_BANK_H

#include "backend/backend.h"
#include "kv/batch.h"
#include "model/lora.h"

typedef struct lm_lora_bank lm_lora_bank;

/* An empty bank for steps of up to max_tokens rows of model m on be. */
lm_status lm_lora_bank_create(const lm_model *m, lm_backend *be, int64_t max_tokens,
                              lm_lora_bank **out);
void lm_lora_bank_free(lm_lora_bank *b);

/* Mounts l (prepared for the bank's backend here; borrowed: it must outlive the mount) in slot
 * 0 <= slot < LM_ADAPTER_MOUNT_MAX, replacing what was there; l NULL empties the slot. */
lm_status lm_lora_bank_mount(lm_lora_bank *b, int slot, lm_lora *l);

/* The picks of rows whose batch gives none (lm_batch.lora NULL): n slots, weight 1 each. */
void lm_lora_bank_set_default(lm_lora_bank *b, const int *slots, int n);

/* Before a step: each row's picks from its sequence's (b->lora, or the default), uploaded.
 * *variant gets what selects the step's ops (part of a plan's key); 0 when no row picks any. */
lm_status lm_lora_bank_begin(lm_lora_bank *b, const lm_batch *batch, uint64_t *variant);

/* Whether the step adds a LoRA term to (layer, kind): some row picks, and a mounted adapter
 * adapts it. */
int lm_lora_bank_at(const lm_lora_bank *b, int layer, lm_lora_kind kind);

/* The shrink of the n (1..3) modules kinds[] of layer that read x (the step's rows): io[i] gets
 * module i's path for its product (valid until the next shrink), or NULL where the step adds
 * nothing to it. */
lm_status lm_lora_bank_shrink(lm_lora_bank *b, int layer, const lm_lora_kind *kinds, int n,
                              lm_tensor x, const lm_lora_io **io);

#endif
