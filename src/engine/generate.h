/* generate.h — a generation session: one sequence's KV caches, the forward workspaces, a sampler
 * and the stop rules; text in the form of token ids in, tokens and streamed text out.
 *
 * The session keeps the ids of its context (the history). The KV caches hold a prefix of it: the
 * last sampled token stays pending (in the history, not yet fed) until the next step or append
 * feeds it, so a response that ends costs no wasted forward step. A sampled stop id is not added
 * to the history at all (a chat template writes its own turn end).
 *
 * A response starts at each lm_gen_append / lm_gen_sync and runs through lm_gen_step until a stop:
 *   - a stop id (opts.stop_ids: lm_gen_stop_ids gives a model's set);
 *   - a stop string found in the decoded text. Text that might be the start of a stop string is
 *     held back until it is known not to be, so the stream never shows any part of a stop string
 *     nor anything after it, even when the string is split across tokens;
 *   - max_tokens sampled tokens, or the context limit;
 *   - the token callback returning non-zero.
 * Streamed text comes from the streaming detokenizer (never ends inside a UTF-8 sequence).
 *
 * Nothing here knows about chat formats, flags or terminals: the CLI and the server drive it.
 * Thread safety: a session belongs to one thread at a time; the model and tokenizer are shared. */
#ifndef LM_ENGINE_GENERATE_H
#define LM_ENGINE_GENERATE_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "model/kv_plan.h"
#include "model/model.h"
#include "sample/sampler.h"
#include "text/tokenizer.h"

typedef enum lm_gen_stop {
  LM_GEN_RUNNING = 0,      /* the response has not ended */
  LM_GEN_STOP_ID = 1,      /* a stop id was sampled (EOS, end of turn, <|tool_response> ...) */
  LM_GEN_STOP_STRING = 2,  /* a stop string appeared in the text */
  LM_GEN_STOP_LENGTH = 3,  /* max_tokens, or the context is full */
  LM_GEN_STOP_CALLBACK = 4 /* the token callback returned non-zero */
} lm_gen_stop;

/* Called once per sampled token (a stop id included) with the text that became final with it:
 * possibly empty, possibly text held back from earlier tokens. text is valid until the callback
 * returns. A non-zero return ends the response (LM_GEN_STOP_CALLBACK). */
typedef int (*lm_gen_token_fn)(void *user, int32_t id, const char *text, size_t len);

typedef struct lm_gen_opts {
  const lm_kv_options *kv; /* cache plan (--kv-quant ...); NULL: plain caches (fixed at create) */
  int64_t chunk;           /* prefill tokens per forward step; 0: 512 (fixed at create) */
  int64_t max_context;     /* context limit in tokens; 0: 2^31 - 1 (fixed at create) */
  int64_t max_tokens;      /* sampled tokens per response; 0: no limit but the context */
  lm_sampling sampling;
  const int32_t *stop_ids;
  int32_t n_stop_ids;
  const char *const *stop_strings; /* non-empty UTF-8 strings */
  int32_t n_stop_strings;
  int skip_special;            /* the streamed text leaves special tokens out, except: */
  const int32_t *keep_special; /* special ids whose text is streamed anyway (an output parser's */
  int32_t n_keep_special;      /* control tokens) */
  lm_gen_token_fn on_token;
  void *user;
} lm_gen_opts;

/* Neutral options: chunk 512, no limits, lm_sampling_init() sampling, no stops, no callback. */
void lm_gen_opts_init(lm_gen_opts *o);

typedef struct lm_gen_stats {
  int64_t reused_tokens;  /* context tokens kept from before by the last sync */
  int64_t prefill_tokens; /* tokens fed by the last append/sync */
  double prefill_s;
  int64_t decode_tokens; /* tokens sampled in this response */
  int64_t decode_steps;  /* forward steps run by lm_gen_step in this response */
  double decode_s;       /* time in lm_gen_step (forward steps and sampling) */
} lm_gen_stats;

typedef struct lm_gen lm_gen;

/* Creates a session over a model already prepared for `be` (lm_model_prepare). tok may be NULL
 * (ids only: no text, no stop strings). Everything in opts is copied. The model, backend and
 * tokenizer must outlive the session. Errors: LM_ERR_INVALID (bad options, a stop or bias id
 * outside the vocabulary), LM_ERR_NOMEM and the backend's allocation errors. */
/* Saves the context the caches hold (tokens, caches, the model's fingerprint) to a state file;
 * restores one into this session, replacing its context (the file must come from the same
 * model and cache plan). The next sync/append continues from the restored tokens. */
lm_status lm_gen_save_state(const lm_gen *g, const char *path);
lm_status lm_gen_load_state(lm_gen *g, const char *path);

lm_status lm_gen_create(lm_model *m, lm_backend *be, const lm_tokenizer *tok,
                        const lm_gen_opts *opts, lm_gen **out);
void lm_gen_free(lm_gen *g); /* NULL is a no-op */

/* Replaces the per-response options (sampling — the random stream restarts —, max_tokens, stops,
 * skip_special, callback); chunk and max_context are kept. The context is kept. */
lm_status lm_gen_set_opts(lm_gen *g, const lm_gen_opts *opts);

/* Empties the context and the caches, restarts the random stream, zeroes the stats. */
lm_status lm_gen_reset(lm_gen *g);

/* Starts a response after adding ids[0..n) to the context (n may be 0 to continue after a
 * max-tokens stop): prefills what the caches lack in chunks. Errors: LM_ERR_INVALID (an id
 * outside the vocabulary, the context limit), LM_ERR_STATE (nothing to continue from), forward
 * errors. On error the context is unchanged and the caches hold a prefix of it. */
lm_status lm_gen_append(lm_gen *g, const int32_t *ids, int64_t n);

/* Starts a response whose context is exactly ids[0..n) (n >= 1): keeps the longest common prefix
 * of the current context that the caches can roll back to (a ring that has wrapped cannot, then
 * everything is prefilled again) and prefills the rest. *reused (may be NULL) gets the number of
 * context tokens kept. Errors as lm_gen_append. */
lm_status lm_gen_sync(lm_gen *g, const int32_t *ids, int64_t n, int64_t *reused);

/* Samples the next token (feeding the pending one first), applies the stop rules and calls the
 * callback. *id gets the token. Errors: LM_ERR_STATE (the response has ended, or there is no
 * context), sampler and forward errors. */
lm_status lm_gen_step(lm_gen *g, int32_t *id);

/* Steps until the response ends. */
lm_status lm_gen_run(lm_gen *g);

/* Why the response ended (LM_GEN_RUNNING while it goes on). */
lm_gen_stop lm_gen_stop_reason(const lm_gen *g);
/* "stop", "length", "callback" ... (stop id and stop string are both "stop"). */
const char *lm_gen_stop_name(lm_gen_stop s);
/* The id that ended the response with LM_GEN_STOP_ID, else -1. */
int32_t lm_gen_stop_id(const lm_gen *g);
/* The text streamed in this response so far (NUL-terminated; valid until the next call on g). */
const char *lm_gen_text(const lm_gen *g, size_t *len);
/* The context ids (valid until the next call on g) and their number. */
const int32_t *lm_gen_tokens(const lm_gen *g, int64_t *n);
/* Tokens the caches hold (the context minus a pending token). */
int64_t lm_gen_kv_len(const lm_gen *g);
/* Raw logits [vocab] of the last context token: valid right after append/sync (a step consumes
 * them); NULL otherwise. */
const float *lm_gen_logits(const lm_gen *g);
lm_gen_stats lm_gen_get_stats(const lm_gen *g);

#endif
