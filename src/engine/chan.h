/* chan.h — the channel between the engine thread and the consumer of one request (lm_request_next).
 *
 * The engine pushes one event per sampled token (its id, the text that became final with it, and
 * its log-probabilities when asked for) and, once, the end of the response (why it ended, the
 * usage counts, an error message). The consumer takes the pending events in bulk and waits with
 * a timeout, so it can send keep-alive pings and notice a client that went away. Either side may
 * cancel: the consumer sets `cancel` (lm_request_cancel, a client gone), the engine sees it before
 * the next step and frees the sequence.
 *
 * The channel is reference-counted (engine + consumer); the last lm_chan_unref frees it.
 * Every function is thread-safe. */
#ifndef LM_ENGINE_CHAN_H
#define LM_ENGINE_CHAN_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "lumen.h"

/* One sampled token. The channel carries what the engine thread produces to the request's
 * consumer (lm_request_next, request.c). */
typedef struct lm_tok_event {
  int32_t id;
  int is_stop; /* a stop id (not part of the answer; its text is what the stop flushed) */
  char *text;  /* final text released with this token (malloc'ed, may be NULL when len 0) */
  size_t len;
  float logprob; /* log-probability of id under the model (valid when the job asked) */
  int n_top;     /* top alternatives recorded */
  int32_t top_id[LM_TOP_LOGPROBS_MAX];
  float top_lp[LM_TOP_LOGPROBS_MAX];
  /* speculative decoding: set on the first token of a speculating sequence's step */
  int round_start, n_drafted;
  int32_t drafted[LM_SPEC_MAX_TOKENS];
} lm_tok_event;

/* lm_finish_kind (LM_FIN_*) and LM_TOP_LOGPROBS_MAX are public (lumen.h). */

typedef struct lm_finish {
  lm_finish_kind kind;
  int32_t stop_id; /* FIN_STOP */
  int stop_index;  /* FIN_STOP_STR */
  int64_t prompt_tokens, cached_tokens, completion_tokens;
  int64_t decode_steps;                    /* forward steps after the one that ended the prompt */
  int64_t drafted_tokens, accepted_tokens; /* speculative decoding */
  /* queue wait, prefill, first token since submit, decode */
  double queue_s, prefill_s, ttft_s, decode_s;
  char message[256]; /* FIN_ERROR / FIN_TIMEOUT */
} lm_finish;

typedef struct lm_chan lm_chan;

/* A new channel with two references (engine, consumer). NULL when out of memory. */
lm_chan *lm_chan_create(void);
void lm_chan_unref(lm_chan *c); /* NULL is a no-op */

/* Engine side. push takes ownership of t->text. */
lm_status lm_chan_push(lm_chan *c, lm_tok_event *t);
/* Ends the response (once; later calls are ignored). */
void lm_chan_finish(lm_chan *c, const lm_finish *f);
/* The request was cancelled by its consumer. */
int lm_chan_cancelled(lm_chan *c);

/* Consumer side. Asks the engine to drop the request (idempotent). */
void lm_chan_cancel(lm_chan *c);
/* Waits up to timeout_ms for events or the end; moves the pending events to *ev (malloc'ed
 * array of *n events; free each with lm_tok_event_clear and the array with free). Returns 1 when
 * the response has ended and every event has been taken (*fin filled), else 0. */
int lm_chan_take(lm_chan *c, int timeout_ms, lm_tok_event **ev, size_t *n, lm_finish *fin);

void lm_tok_event_clear(lm_tok_event *t);
void lm_tok_events_free(lm_tok_event *ev, size_t n);

#endif
