/* sched.h — the continuous-batching scheduler: one engine thread owns the model and runs
 * every active sequence in one ragged batch per forward step.
 *
 * A step holds, in this order: one token for each decoding sequence (its pending token, with a
 * logits row), then prompt tokens of the sequences still prefilling, oldest first, up to `chunk`
 * tokens (a logits row for each prompt that ends in this step). So a step for B decoding
 * sequences is one lm_forward_run over B rows (weights read once for all), and a long prompt is
 * prefilled in chunks between decode steps while the running streams keep flowing. Requests join
 * between steps (admission: a free slot and KV memory for prompt + max_tokens) and leave as soon
 * as they end, are cancelled or time out; their caches are freed at once, or kept as a prompt
 * cache entry when the response ended normally (a later request that starts with the same tokens
 * reuses them: usage.prompt_tokens_details.cached_tokens).
 *
 * Sampling runs on the host from the logits rows the forward returns (sample/sampler.h, one
 * sampler per sequence, rows in parallel); text comes from one streaming detokenizer per sequence
 * and stop strings are matched on it with hold-back. Nothing here knows about HTTP or JSON: the
 * results go to each job's channel (chan.h).
 *
 * Thread safety: submit, check and stats may be called from any thread. */
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
  int64_t max_tokens;   /* >= 1 */
  char **stops;         /* [n_stops] stop strings (owned) */
  int n_stops;
  int ignore_eos;   /* stop ids are ordinary tokens (fixed-length benchmarks) */
  int top_logprobs; /* -1: no logprobs; 0..LM_TOP_LOGPROBS_MAX: the chosen token's and N
                       alternatives */
  int keep_control; /* stream the text of the output parser's control tokens (chat formats) */
  double t_submit;  /* monotonic seconds */
  double deadline;  /* monotonic seconds; 0: none */
  lm_chan *ch;      /* the engine's reference */
} lm_job;

/* A new job with neutral sampling and its channel (two references: the job's and *http_ref). */
lm_status lm_job_create(lm_job **out, lm_chan **http_ref);
void lm_job_free(lm_job *j); /* releases the job's channel reference; NULL is a no-op */

typedef struct lm_sched_opts {
  int parallel;            /* sequences in the running batch */
  int64_t chunk;           /* prompt tokens per step */
  int queue_cap;           /* jobs waiting for a slot; submit refuses beyond */
  int64_t kv_budget;       /* bytes for every sequence's caches (active + prompt cache) */
  int64_t max_ctx;         /* per-sequence context limit */
  int prompt_cache;        /* finished sequences kept for prefix reuse (0: off) */
  const lm_kv_spec *specs; /* [model n_caches] the cache plan */
  const int32_t *stop_ids;
  int32_t n_stop_ids;
  const int32_t *keep_special; /* special ids whose text jobs with keep_control stream */
  int32_t n_keep_special;
} lm_sched_opts;

typedef struct lm_sched_stats {
  int active, prefilling, decoding, queued, queue_cap, parallel;
  int64_t kv_budget, kv_reserved,
      kv_held; /* bytes: budget, reserved by admission, held by caches */
  int pc_entries;
  int64_t pc_bytes, pc_hits, pc_misses, pc_tokens_reused;
  int64_t steps, step_tokens, step_rows, prefill_tokens, decode_tokens;
  int64_t jobs_done, jobs_cancelled, jobs_timeout, jobs_failed;
  double busy_s; /* time spent in forward steps and sampling */
} lm_sched_stats;

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

#endif
