/* spec_draft.c — draft-model proposals (spec_draft.h). */
#include "engine/spec_draft.h"

#include <stdlib.h>

#include "base/status.h"
#include "model/forward.h"

static lm_status warm_up(lm_spec_draft *d);

struct lm_spec_draft {
  lm_model *m;
  lm_backend *be;
  lm_forward *fw;
  lm_kv_spec *specs; /* plain caches and rings of the draft model's own geometry */
  int64_t chunk;
};

lm_status lm_spec_draft_open(const char *dir, lm_backend *be, const lm_model *target, int64_t chunk,
                             lm_spec_draft **out) {
  *out = NULL;
  lm_spec_draft *d = calloc(1, sizeof *d);
  if (!d) return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  d->be = be;
  d->chunk = chunk;
  lm_status s = lm_model_load(dir, &d->m);
  if (!s && d->m->cfg.vocab_size != target->cfg.vocab_size)
    s = LM_ERRF(LM_ERR_INVALID, "its vocabulary has %lld tokens, the model's %lld",
                (long long)d->m->cfg.vocab_size, (long long)target->cfg.vocab_size);
  if (!s) s = lm_model_prepare(d->m, be);
  if (!s && !(d->specs = calloc((size_t)d->m->cfg.n_caches + 1, sizeof *d->specs)))
    s = LM_ERRF(LM_ERR_NOMEM, "out of memory");
  if (!s) {
    lm_model_kv_specs(d->m, d->specs);
    s = lm_forward_create(d->m, be, chunk, 1, &d->fw);
  }
  if (!s) s = warm_up(d);
  if (s) {
    lm_spec_draft_free(d);
    return lm_err_prefix(s, "draft model %s", dir);
  }
  *out = d;
  return LM_OK;
}

void lm_spec_draft_free(lm_spec_draft *d) {
  if (!d) return;
  lm_forward_free(d->fw);
  free(d->specs);
  lm_model_free(d->m);
  free(d);
}

/* Feeds ids[0..n) after kv's tokens, in steps of at most the forward's chunk, and gives the
 * greedy token after the last. */
static lm_status feed(lm_spec_draft *d, lm_kv_set *kv, const int32_t *ids, int64_t n,
                      int32_t *next) {
  int32_t pos[n > d->chunk ? d->chunk : n], seq[n > d->chunk ? d->chunk : n];
  for (int64_t at = 0; at < n;) {
    int64_t k = n - at < d->chunk ? n - at : d->chunk;
    int32_t base = (int32_t)lm_kv_set_len(kv), row = (int32_t)k - 1;
    for (int64_t j = 0; j < k; j++)
      pos[j] = base + (int32_t)j, seq[j] = 0;
    lm_batch b = {.n_tokens = (int32_t)k,
                  .ids = ids + at,
                  .pos = pos,
                  .seq = seq,
                  .n_seqs = 1,
                  .kv = &kv,
                  .n_logits = 1,
                  .logit_rows = &row};
    LM_TRY(lm_forward_run_greedy(d->fw, &b, NULL, next));
    at += k;
  }
  return LM_OK;
}

/* One step of a prompt's size and one of a token, on scratch caches: what a backend does on a
 * matrix's first use (packing, first touches of the workspace) happens here, not in the first
 * request's decode. */
static lm_status warm_up(lm_spec_draft *d) {
  int32_t ids[8] = {0}, next;
  lm_kv_set *kv;
  LM_TRY(lm_kv_set_create(d->be, d->specs, d->m->cfg.n_caches, &kv));
  lm_status s = feed(d, kv, ids, d->chunk < 8 ? d->chunk : 8, &next);
  if (!s) s = feed(d, kv, ids, 1, &next);
  lm_kv_set_free(kv);
  return s;
}

lm_status lm_spec_draft_propose(lm_spec_draft *d, lm_kv_set **kv, const int32_t *hist, int64_t n,
                                int max, int32_t *out, int *got) {
  *got = 0;
  if (max < 1 || n < 1) return LM_OK;
  if (*kv && lm_kv_set_len(*kv) >= n) { /* never (they hold less than the context): start over */
    lm_kv_set_free(*kv);
    *kv = NULL;
  }
  if (!*kv) LM_TRY(lm_kv_set_create(d->be, d->specs, d->m->cfg.n_caches, kv));
  int64_t have = lm_kv_set_len(*kv);
  LM_TRY(feed(d, *kv, hist + have, n - have, &out[0]));
  for (*got = 1; *got < max; ++*got)
    LM_TRY(feed(d, *kv, &out[*got - 1], 1, &out[*got]));
  return LM_OK;
}

lm_status lm_spec_draft_keep(lm_kv_set *kv, int64_t len) {
  int64_t have = kv ? lm_kv_set_len(kv) : 0;
  return have > len ? lm_kv_set_trim(kv, have - len) : LM_OK;
}
