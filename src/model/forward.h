/* forward.h — one forward step of a Gemma 4 model over a ragged batch, on any backend.
 * The workspace is sized once for (max_tokens, max_logits); a step never allocates. */
#ifndef LM_MODEL_FORWARD_H
#define LM_MODEL_FORWARD_H

#include "backend/backend.h"
#include "kv/batch.h"
#include "model/model.h"
#include "tensor/weight_payload.h"

typedef struct lm_forward lm_forward;

/* Makes the model's weights usable by `be` (uploads/repacks through prepare_weight, once).
 * A model is bound to one device backend at a time (lm_weight.backend holds one handle). */
lm_status lm_model_prepare(lm_model *m, lm_backend *be);
/* The same, calling on_load(ctx, bytes done, total) after each weight (may be NULL). */
lm_status lm_model_prepare_progress(lm_model *m, lm_backend *be,
                                    void (*on_load)(void *ctx, int64_t done, int64_t total),
                                    void *ctx);

/* Exchanges p into w (and w's payload out into p) where the backend reads it (refresh_weight
 * for a backend with its own copy): afterwards every forward on be sees the new payload. Errors
 * leave w as it was. */
lm_status lm_exchange_weight(lm_backend *be, lm_weight *w, lm_weight_payload *p);

lm_status lm_forward_create(const lm_model *m, lm_backend *be, int64_t max_tokens,
                            int64_t max_logits, lm_forward **out);
void lm_forward_free(lm_forward *f);

/* LoRA adapters (model/lora_bank.h). set_adapters: the adapters set[0..n) (stacked: their
 * deltas add) on every row of every step from now on, or none when n is 0: it empties every
 * slot, mounts set[i] in slot i and makes them the rows' default. mount_adapter: l in slot
 * (NULL: the slot emptied), for rows whose batch picks it (lm_batch.lora); default_adapters:
 * the slots rows of batches without picks run. Each adapter is prepared for the forward's
 * backend, and must outlive its mount (another call, or lm_forward_free). */
typedef struct lm_lora lm_lora;
lm_status lm_forward_set_adapters(lm_forward *f, lm_lora *const *set, int n);
lm_status lm_forward_mount_adapter(lm_forward *f, int slot, lm_lora *l);
lm_status lm_forward_default_adapters(lm_forward *f, const int *slots, int n);

/* Runs the batch: validates it, reserves cache room, runs every layer, and copies the logits
 * of the batch's logit rows to logits_out [n_logits][vocab] (host, f32; may be NULL). */
lm_status lm_forward_run(lm_forward *f, const lm_batch *b, float *logits_out);
/* The same, and also the greedy token (argmax, lowest id on ties) of every logit row, computed
 * on the backend: ids_out [n_logits] (host). Only the ids cross to the host when logits_out
 * is NULL. */
lm_status lm_forward_run_greedy(lm_forward *f, const lm_batch *b, float *logits_out,
                                int32_t *ids_out);

/* Teacher-forces one sequence: feeds ids[0..n) into kv in steps of `step` tokens and writes
 * every position's logits to out[n][vocab] (host; may be NULL). step <= the forward's max_tokens.
 */
lm_status lm_forward_feed(lm_forward *f, lm_kv_set *kv, const int32_t *ids, int64_t n, int64_t step,
                          float *out);
/* The same, keeping the logits in backend memory: after each step's `rows` positions (from
 * `first`) fn gets their logits, a [rows][vocab] f32 tensor of the backend's that the next step
 * overwrites (lumen quantize's sweep compares them there with logits_kl). */
typedef lm_status (*lm_forward_rows_fn)(void *ctx, int64_t first, lm_tensor logits);
lm_status lm_forward_feed_rows(lm_forward *f, lm_kv_set *kv, const int32_t *ids, int64_t n,
                               int64_t step, lm_forward_rows_fn fn, void *ctx);

/* Cache specs of a session for this model: one per donor layer (plain for full layers, a
 * ring of sliding_window for sliding layers). specs must hold m->cfg.n_caches entries. */
void lm_model_kv_specs(const lm_model *m, lm_kv_spec *specs);

/* Bytes of workspace the forward allocates for these limits on a backend whose activations
 * are `act` (the backend's act_dtype). */
int64_t lm_forward_workspace_bytes(const lm_model *m, int64_t max_tokens, int64_t max_logits,
                                   lm_dtype act);

#endif
