/* lora_batch.c — see lora_batch.h. */
#include "util/lora_batch.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "kv/batch.h"
#include "model/forward.h"
#include "model/lora.h"

#define NSEQ 3
#define PROMPT 6
#define DECODE 3
#define STEPS (1 + DECODE)

static const int32_t toks[NSEQ][PROMPT + DECODE] = {{2, 40, 300, 17, 98, 5, 77, 120, 64},
                                                    {2, 3, 451, 9, 220, 18, 60, 31, 7},
                                                    {2, 11, 12, 13, 14, 15, 16, 17, 18}};

/* Logits [STEPS][V] of sequence `s` alone on f with its adapters attached (set_adapters). */
static lm_status alone(lm_forward *f, lm_backend *be, const lm_model *m, int s, float *out) {
  lm_kv_spec specs[m->cfg.n_caches > 0 ? m->cfg.n_caches : 1];
  lm_model_kv_specs(m, specs);
  lm_kv_set *kv = NULL;
  LM_TRY(lm_kv_set_create(be, specs, m->cfg.n_caches, &kv));
  int64_t V = m->cfg.vocab_size;
  float *all = malloc((size_t)((PROMPT + DECODE) * V) * sizeof(float));
  lm_status st = all ? lm_forward_feed(f, kv, toks[s], PROMPT, PROMPT, all)
                     : LM_ERRF(LM_ERR_NOMEM, "out of memory");
  if (!st) st = lm_forward_feed(f, kv, toks[s] + PROMPT, DECODE, 1, all + PROMPT * V);
  if (!st) /* the prompt's last row, then each decoded token's */
    for (int k = 0; k < STEPS; k++)
      memcpy(out + k * V, all + (PROMPT - 1 + k) * V, (size_t)V * sizeof(float));
  free(all);
  lm_kv_set_free(kv);
  return st;
}

/* Every sequence in each step: the prompts together, then one token each. */
static lm_status run_mixed(lm_forward *f, lm_backend *be, const lm_model *m,
                           const lm_lora_pick (*picks)[LM_LORA_PICKS], float *out) {
  lm_kv_spec specs[m->cfg.n_caches > 0 ? m->cfg.n_caches : 1];
  lm_model_kv_specs(m, specs);
  lm_kv_set *kv[NSEQ] = {0};
  int64_t V = m->cfg.vocab_size;
  float *lg = malloc((size_t)(NSEQ * V) * sizeof(float));
  lm_status st = lg ? LM_OK : LM_ERRF(LM_ERR_NOMEM, "out of memory");
  for (int s = 0; s < NSEQ && !st; s++)
    st = lm_kv_set_create(be, specs, m->cfg.n_caches, &kv[s]);
  for (int step = 0; step < STEPS && !st; step++) {
    int32_t ids[NSEQ * PROMPT], pos[NSEQ * PROMPT], seq[NSEQ * PROMPT], rows[NSEQ];
    int32_t n = 0;
    for (int s = 0; s < NSEQ; s++) {
      int from = step ? PROMPT + step - 1 : 0, len = step ? 1 : PROMPT;
      for (int k = 0; k < len; k++, n++)
        ids[n] = toks[s][from + k], pos[n] = from + k, seq[n] = s;
      rows[s] = n - 1;
    }
    lm_batch b = {.n_tokens = n,
                  .ids = ids,
                  .pos = pos,
                  .seq = seq,
                  .n_seqs = NSEQ,
                  .kv = kv,
                  .n_logits = NSEQ,
                  .logit_rows = rows,
                  .lora = &picks[0][0]};
    st = lm_forward_run(f, &b, lg);
    for (int s = 0; s < NSEQ && !st; s++)
      memcpy(out + ((size_t)s * STEPS + step) * V, lg + s * V, (size_t)V * sizeof(float));
  }
  for (int s = 0; s < NSEQ; s++)
    lm_kv_set_free(kv[s]);
  free(lg);
  return st;
}

static double rel(const float *a, const float *ref, int64_t n) {
  double d = 0, mx = 0;
  for (int64_t i = 0; i < n; i++) {
    d = fmax(d, fabs((double)a[i] - ref[i]));
    mx = fmax(mx, fabs((double)ref[i]));
  }
  return mx > 0 ? d / mx : d;
}

/* A and B (ranks 4 and 8), and A with B scaled by 0.5 (the reference of weight 0.5). */
static lm_status adapters(const lm_model *m, lm_lora **a, lm_lora **b, lm_lora **ah) {
  LM_TRY(lm_lora_synth(m, 4, 11, a));
  LM_TRY(lm_lora_synth(m, 8, 12, b));
  LM_TRY(lm_lora_synth(m, 4, 11, ah));
  for (int i = 0; i < (*ah)->n_mods; i++) {
    lm_lora_module *md = &(*ah)->mods[i];
    for (int64_t k = 0; k < md->out * md->rank; k++)
      md->b_data[k] *= 0.5f;
  }
  return LM_OK;
}

static lm_status check(const lm_model *m, lm_backend *be, lm_lora *const *l, float *got,
                       float *want, lm_lora_batch_report *r, float *mixed, float *alone_out) {
  int64_t V = m->cfg.vocab_size, n = (int64_t)STEPS * V;
  lm_forward *fm = NULL, *fr = NULL;
  LM_TRY(lm_forward_create(m, be, NSEQ * PROMPT, NSEQ, &fm));
  lm_status st = lm_forward_create(m, be, PROMPT, PROMPT, &fr);
  /* slots far apart, the stacked row's picks in the other order than their slots */
  if (!st) st = lm_forward_mount_adapter(fm, 3, l[0]);
  if (!st) st = lm_forward_mount_adapter(fm, 40, l[1]);
  const lm_lora_pick picks[NSEQ][LM_LORA_PICKS] = {
      {{3, 1.0f}, {-1, 0}}, {{40, 1.0f}, {3, 0.5f}, {-1, 0}}, {{-1, 0}}};
  if (!st) st = run_mixed(fm, be, m, picks, got);
  lm_lora *const sets[NSEQ][2] = {{l[0], NULL}, {l[1], l[2]}, {NULL, NULL}};
  const int nset[NSEQ] = {1, 2, 0};
  for (int s = 0; s < NSEQ && !st; s++) {
    st = lm_forward_set_adapters(fr, sets[s], nset[s]);
    if (!st) st = alone(fr, be, m, s, want + s * n);
    double d = rel(got + s * n, want + s * n, n);
    r->rel[s] = d;
    r->max_rel = fmax(r->max_rel, d);
    if (s == NSEQ - 1) r->base_rel = d;
  }
  if (!st) r->adapted = rel(got, want + 2 * n, n);
  if (!st && mixed) memcpy(mixed, got, (size_t)(NSEQ * n) * sizeof(float));
  if (!st && alone_out) memcpy(alone_out, want, (size_t)(NSEQ * n) * sizeof(float));
  for (int k = 0; k < LM_ADAPTER_MOUNT_MAX && !st; k++)
    st = lm_forward_mount_adapter(fm, k, NULL);
  const lm_lora_pick none[NSEQ][LM_LORA_PICKS] = {{{-1, 0}}, {{-1, 0}}, {{-1, 0}}};
  if (!st) st = run_mixed(fm, be, m, none, got);
  lm_forward_free(fr), fr = NULL;
  if (!st) st = lm_forward_create(m, be, NSEQ * PROMPT, NSEQ, &fr);
  if (!st) st = run_mixed(fr, be, m, none, want);
  if (!st) r->base_bits = !memcmp(got, want, (size_t)(NSEQ * n) * sizeof(float));
  lm_forward_free(fm);
  lm_forward_free(fr);
  return st;
}

int64_t lm_test_lora_batch_floats(const lm_model *m) {
  return (int64_t)NSEQ * STEPS * m->cfg.vocab_size;
}

lm_status lm_test_lora_batch(const lm_model *m, lm_backend *be, lm_lora_batch_report *r,
                             float *mixed, float *alone_out) {
  *r = (lm_lora_batch_report){0};
  int64_t n = (int64_t)NSEQ * STEPS * m->cfg.vocab_size;
  lm_lora *l[3] = {0};
  float *got = malloc((size_t)n * sizeof(float)), *want = malloc((size_t)n * sizeof(float));
  lm_status st =
      got && want ? adapters(m, &l[0], &l[1], &l[2]) : LM_ERRF(LM_ERR_NOMEM, "out of memory");
  if (!st) st = check(m, be, l, got, want, r, mixed, alone_out);
  for (int i = 0; i < 3; i++) /* before the backend: their copies are its memory */
    lm_lora_free(l[i]);
  free(got);
  free(want);
  return st;
}
