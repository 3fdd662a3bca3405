/* sched.h — the continuous-batching scheduler: one engine thread owns the model and runs
 * every active sequence in one ragged batch per forward step. Every caller's generation goes
 * through it: `lumen serve`'s requests and the command line's single sequence alike (through
 * the public API, request.c), so there is one generation loop.
 *
 * A step holds, in this order: one token for each decoding sequence (its pending token, with a
 * logits row), then prompt tokens of the sequences still prefilling, oldest first, up to `chunk`
 * tokens (a logits row for each prompt that ends in this step). So a step for B decoding
 * sequences is one lm_forward_run over B rows (weights read once for all), and a long prompt is
 * prefilled in chunks between decode steps while the running streams keep flowing. Requests join
 * between steps (admission: a free slot and KV memory for prompt + max_tokens) and leave as soon
 * as they end, are cancelled or time out. A sequence that ended normally leaves its caches in the
 * prefix cache (prompt_cache.h: byte-capped, SWA-correct, namespaced), so a later request that
 * starts with the same tokens — the next chat turn — prefills only the rest.
 *
 * Speculative decoding (a job's spec_tokens): a decoding sequence's pending token goes in with
 * drafts (spec_ngram.h, or a draft model's: spec_draft.h), each with a logits row, and the sequence
 * keeps the drafts the model agrees with, plus the token sampled after them; the caches roll back
 * the rest (kv.h). The drafts are proposals, never samples: row j is sampled exactly as a plain
 * step would sample that token, with the same random draw, so the answer is plain decoding's. That
 * needs rows that do not depend on their step (lm_backend.exact_rows): a step drafts only while it
 * stays within that many tokens and no prompt is being prefilled.
 *
 * Sampling runs on the host from the logits rows the forward returns (sample/sampler.h, one
 * sampler per sequence, rows in parallel; a row's error is kept with its row); text comes from one
 * streaming detokenizer per sequence and stop strings are matched on it with hold-back. Nothing
 * here knows about HTTP or JSON: the results go to each job's channel (chan.h).
 *
 * Commands (save a state, load one, teacher-forced logits) run on the engine thread between
 * steps, so the caches and the backend have one user.
 *
 * Thread safety: submit, check, stats and the commands may be called from any thread. */
#ifndef LM_ENGINE_SCHED_H
#define LM_ENGINE_SCHED_H

#include <stdint.h>

#include "backend/backend.h"
#include "kv/kv.h"
#include "model/model.h"
#include "sample/sampler.h"
#include "engine/admit.h"
#include "engine/chan.h"
#include "text/tokenizer.h"

/* One request as the engine sees it: ids in, tokens out through ch. */
typedef struct lm_job {
  int32_t *ids; /* [n_ids] the prompt (owned) */
  int64_t n_ids;
  lm_sampling sampling; /* owns its lists */
  int64_t max_tokens;   /* >= 0; 0: until a stop or the context limit */
  char **stops;         /* [n_stops] stop strings (owned) */
  int n_stops;
  int ignore_eos;   /* stop ids are ordinary tokens (fixed-length benchmarks) */
  int top_logprobs; /* -1: no logprobs; 0..LM_TOP_LOGPROBS_MAX: the chosen token's and N
                       alternatives */
  int keep_control; /* stream the text of the output parser's control tokens (chat formats) */
  int keep_special; /* stream the text of every special token (raw output) */
  double t_submit;  /* monotonic seconds */
  double deadline;  /* monotonic seconds; 0: none */
  lm_chan *ch;      /* the engine's reference */
  int share_prompt; /* once ids[0..n_ids-1) are in the caches, a copy of them goes into the prefix
                       cache (before the job's first token): jobs with the same prompt submitted
                       after that token prefill only its last token (n choices of one prompt) */
  struct lm_constraint *con; /* constrained decoding (engine/constraint.h; owned), or NULL */
  int spec_tokens;           /* speculative decoding: at most this many drafts a step; 0: off */
  int spec_draft;            /* the drafts come from the scheduler's draft model, not n-grams */
  /* LoRA: the mounted adapters the job runs with (slots and weights, and the mounts' ids, which
   * submit checks are still mounted there); n_lora 0: the scheduler's default set
   * (lm_sched_opts.lora) unless lora_base, which runs the base model */
  lm_lora_pick lora[LM_LORA_PICKS];
  uint64_t lora_id[LM_LORA_PICKS];
  int n_lora, lora_base;
} lm_job;

/* A new job with neutral sampling and its channel (two references: the job's and *consumer). */
lm_status lm_job_create(lm_job **out, lm_chan **consumer);
void lm_job_free(lm_job *j); /* releases the job's channel reference; NULL is a no-op */

typedef struct lm_sched_opts {
  int parallel;            /* sequences in the running batch */
  int64_t chunk;           /* prompt tokens per step */
  int queue_cap;           /* jobs waiting for a slot; submit refuses beyond */
  int64_t kv_budget;       /* bytes for every sequence's caches (active + prefix cache);
                              INT64_MAX: no limit */
  int64_t max_ctx;         /* per-sequence context limit */
  int prompt_cache;        /* finished sequences kept for prefix reuse (entries; 0: off) */
  int threads;             /* OpenMP threads of the engine thread's parallel regions; 0: default */
  const lm_kv_spec *specs; /* [model n_caches] the cache plan */
  const int32_t *stop_ids;
  int32_t n_stop_ids;
  const int32_t *keep_special; /* special ids whose text jobs with keep_control stream */
  int32_t n_keep_special;
  int spec_tokens; /* the most drafts a job may verify per step (0: jobs do not speculate) */
  struct lm_spec_draft *draft; /* the draft model jobs with spec_draft use (borrowed), or NULL */
  /* the default adapters (borrowed; mounted in slots 0..n_lora-1): jobs that pick none run
   * them */
  struct lm_lora *const *lora;
  int n_lora;
} lm_sched_opts;

/* The public counters (lumen.h) are the scheduler's. */
typedef lm_engine_stats lm_sched_stats;

typedef struct lm_sched lm_sched;

/* The model must be prepared for be (lm_model_prepare); model, backend and tokenizer outlive the
 * scheduler. Errors: LM_ERR_INVALID (bad options), LM_ERR_NOMEM, backend allocation errors. */
lm_status lm_sched_create(lm_model *m, lm_backend *be, const lm_tokenizer *tok,
                          const lm_sched_opts *o, lm_sched **out);
/* Starts the engine thread. */
lm_status lm_sched_start(lm_sched *s);
/* Stops the thread; every job still queued or running ends as cancelled and later submits are
 * refused. The object stays valid (stats, check, submit) until free. NULL is a no-op. */
void lm_sched_stop(lm_sched *s);
/* Stops (if needed) and frees. NULL is a no-op. */
void lm_sched_free(lm_sched *s);

/* Whether a request of this shape can ever run; msg gets the reason. */
lm_admission lm_sched_check(const lm_sched *s, int64_t n_prompt, int64_t max_tokens, char *msg,
                            size_t n);
/* Queues a job. On LM_OK the scheduler owns it; otherwise the caller still does: LM_ERR_STATE when
 * the queue is full (answer 429), LM_ERR_CANCELLED when the scheduler is stopping (503),
 * LM_ERR_INVALID for a job that fails lm_sched_check or has bad fields (400). */
lm_status lm_sched_submit(lm_sched *s, lm_job *j);
void lm_sched_stats_get(lm_sched *s, lm_sched_stats *out);
const lm_admit *lm_sched_admit(const lm_sched *s);

/* Adapters mounted while the scheduler runs (commands, between steps). mount: l (loaded for the
 * scheduler's model; the scheduler owns it from LM_OK on) into a free slot: *slot and *id get
 * where, and the mount's id (never reused), which jobs carry. LM_ERR_STATE when every slot is
 * taken. unmount: the mount (slot, id) leaves as soon as no job queued or running picks it (jobs
 * submitted later are refused); *secs: the engine thread's time for the mount. LM_ERR_NOT_FOUND
 * when it is not mounted. users: the jobs queued or running with it (counted between steps). */
lm_status lm_sched_mount(lm_sched *s, struct lm_lora *l, int *slot, uint64_t *id, double *secs);
lm_status lm_sched_unmount(lm_sched *s, int slot, uint64_t id);
int64_t lm_sched_mount_users(lm_sched *s, int slot);

/* Commands, run on the engine thread between steps (inline when the thread is not running).
 * save: the caches of the longest cached prefix of ids[0..n) (the prefix cache holds finished
 * sequences) to a state file with the model's fingerprint; *saved gets its tokens
 * (LM_ERR_NOT_FOUND when none). load: a state file into the prefix cache; *ids and *n (malloc'ed)
 * get its tokens. logits: teacher-forced logits of ids[0..n) in a fresh context (prefill tokens in
 * chunks of `chunk`, the rest one per step), f32 [n][vocab]. */
lm_status lm_sched_save_state(lm_sched *s, const int32_t *ids, int64_t n, const char *path,
                              int64_t *saved);
lm_status lm_sched_load_state(lm_sched *s, const char *path, int32_t **ids, int64_t *n);
lm_status lm_sched_logits(lm_sched *s, const int32_t *ids, int64_t n, int64_t prefill,
                          int64_t chunk, float *out);

#endif
