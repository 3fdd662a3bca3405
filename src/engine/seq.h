/* seq.h — one running sequence of the scheduler: its caches, its context (prompt + sampled
 * ids), its sampler, detokenizer and stop-string matcher, and the rules that end it.
 *
 * Invariant: the caches hold hist[0 .. kv_len) and kv_len <= n_hist;
 * what lies between is fed by the next step — prompt chunks while prefilling, then the single
 * pending token (the last one sampled) while decoding. A sampled stop id is not added to hist. */
#ifndef LM_ENGINE_SEQ_H
#define LM_ENGINE_SEQ_H

#include "engine/sched.h"
#include "engine/stop_hold.h"

typedef struct lm_seq_env {
  const lm_tokenizer *tok;
  int64_t vocab, max_ctx;
  const int32_t *stop_ids; /* sorted */
  int32_t n_stop_ids;
  const int32_t *keep_special; /* sorted */
  int32_t n_keep_special;
} lm_seq_env;

typedef struct lm_seq {
  lm_job *job;
  lm_kv_set *kv;
  int32_t *hist;
  int64_t n_hist, cap_hist, n_prompt;
  int64_t n_gen;    /* tokens sampled (a stop id included) */
  int64_t cached;   /* prompt tokens the caches already held at admission */
  int64_t reserved; /* bytes reserved at admission */
  lm_sampler *smp;
  lm_detok *dt;
  lm_stop_hold stop;
  float *scratch; /* [vocab] raw logits copy for log-probabilities (lazily) */
  double con_s;   /* seconds in the job's constraint since the scheduler last took them */
  int64_t steps;  /* decode steps (after the one that ended the prompt) */
  /* speculative decoding: this step's drafts (after the pending token), and the totals */
  int32_t draft[LM_SPEC_MAX_TOKENS];
  int n_draft;
  int64_t drafted, accepted;
  lm_kv_set *dkv; /* the draft model's caches (a prefix of hist), or NULL */
  lm_finish fin;  /* kind != NONE once the sequence has ended */
  double t_admit, t_prefilled, t_first;
} lm_seq;

/* Sets up a sequence for job over kv (which already holds `cached` tokens of the job's prompt).
 * Takes ownership of kv on success and failure alike. */
lm_status lm_seq_init(lm_seq *q, const lm_seq_env *env, lm_job *job, lm_kv_set *kv, int64_t cached);
/* Frees what the sequence owns except the job and kv (the scheduler decides their fate). */
void lm_seq_clear(lm_seq *q);

static inline int64_t lm_seq_kv_len(const lm_seq *q) { return lm_kv_set_len(q->kv); }
/* 1 while the prompt is not fully in the caches. */
static inline int lm_seq_prefilling(const lm_seq *q) { return q->n_gen == 0; }

/* 1 when this sequence's sampler is plain greedy (the argmax of the raw logits) and it needs no
 * log-probabilities: the step may then take the backend's argmax instead of the logits. */
int lm_seq_plain_greedy(const lm_seq *q);

/* Samples from one raw logits row (overwritten). Returns the id or -1 (message set). */
int32_t lm_seq_sample(lm_seq *q, const lm_seq_env *env, float *row, lm_tok_event *tok);
/* Applies the stop rules to id and pushes its event (tok: the log-probabilities filled by
 * sample). Sets q->fin when the sequence ends. */
lm_status lm_seq_accept(lm_seq *q, const lm_seq_env *env, int32_t id, lm_tok_event *tok,
                        double now);
/* Ends the sequence with kind (cancel, timeout, error): flushes nothing, fills the usage. */
void lm_seq_end(lm_seq *q, lm_finish_kind kind, const char *message, double now);

#endif
