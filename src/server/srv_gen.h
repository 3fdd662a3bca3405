/* srv_gen.h — one generation as an HTTP thread drives it: a request of the engine (lumen.h) built
 * from the parsed parameters, its admission, and its events (content, reasoning, tool calls,
 * tokens with logprobs) handed to a sink as they arrive. Shared by the OpenAI and Anthropic
 * protocol mappings, which plug in a sink to format what comes out (SSE deltas, or one JSON body at
 * the end). */
#ifndef LM_SERVER_SRV_GEN_H
#define LM_SERVER_SRV_GEN_H

#include "server/srv_ctx.h"
#include "server/srv_req.h"
#include "server/srv_tally.h"

/* Receives the output as it becomes final. Any callback may be NULL. A non-OK return ends the
 * stream (the client is treated as gone). */
typedef struct lm_srv_sink {
  lm_status (*content)(void *u, const char *t, size_t n);
  lm_status (*reasoning)(void *u, const char *t, size_t n);
  lm_status (*tool_call)(void *u, int index, const char *id, const char *name, const char *args);
  lm_status (*token)(void *u, const lm_event *t); /* every sampled token but a stop id */
  void *u;
} lm_srv_sink;

typedef struct lm_srv_call {
  char id[40];
  char *name, *arguments;
} lm_srv_call;

/* How a generation ended, as the protocols report it. */
typedef struct lm_srv_finish {
  lm_finish_kind kind;
  int32_t stop_id;
  int stop_index;
  int64_t prompt_tokens, cached_tokens, completion_tokens;
  double ttft_s;
  char message[256]; /* LM_FIN_ERROR, LM_FIN_TIMEOUT, LM_FIN_CANCELLED */
} lm_srv_finish;

typedef struct lm_srv_gen {
  lm_server *srv;
  lm_request *r;
  lm_srv_sink sink;
  lm_srv_call *calls;
  int n_calls;
  int chat;
  int64_t n_prompt;
  int done;
  lm_srv_finish fin;
  double t0;
  char id[48];         /* chatcmpl-… / cmpl-… / msg_… */
  char call_prefix[8]; /* "call_" (OpenAI) or "toolu_" (Anthropic) */
  long long created;   /* unix seconds */
  const char *prompt_param;
  int started;
  lm_srv_tally *tally; /* the request log's counts (a reference; NULL: none) */
} lm_srv_gen;

/* Builds the request (chat: p->messages through the chat template, tools and tool_choice, the
 * output parsed; else p->prompt or p->prompt_ids as they are), picks max_tokens (the request's,
 * else the server default within the context left), checks admission and queues it. On 0, *out
 * runs; else the HTTP status of e (400 prompt/context/memory, 429 queue full, 503 stopping). */
int lm_srv_gen_start(lm_server *s, lm_srv_params *p, int chat, const lm_srv_sink *sink,
                     const char *id_prefix, const char *call_prefix, lm_srv_gen **out,
                     lm_srv_err *e);
/* The two halves of lm_srv_gen_start: create builds the request and picks max_tokens (for
 * choice p->choice of p->n: its seed is offset by the choice, and choice 0 of several shares its
 * prompt's prefill, lm_request_options.share_prompt); begin checks admission and queues it. A
 * created generation that never begins is freed with lm_srv_gen_free. */
int lm_srv_gen_create(lm_server *s, lm_srv_params *p, int chat, const lm_srv_sink *sink,
                      const char *id_prefix, const char *call_prefix, lm_srv_gen **out,
                      lm_srv_err *e);
int lm_srv_gen_begin(lm_srv_gen *g, lm_srv_err *e);
/* The prompt's length in tokens as a generation of p would have it (the chat template, tools and
 * tool_choice applied), without queueing anything. 0 or the HTTP status of e. */
int lm_srv_gen_count(lm_server *s, lm_srv_params *p, int chat, int64_t *n_prompt, lm_srv_err *e);
/* Whether the prompt is prefilled: a token came out, or the generation ended. */
int lm_srv_gen_prefilled(const lm_srv_gen *g);
/* Adds the generation's token counts to t when it ends (takes a reference; NULL: none). */
void lm_srv_gen_track(lm_srv_gen *g, lm_srv_tally *t);
/* Takes what the engine produced (waiting up to timeout_ms) through the parser into the sink.
 * Returns 1 when the response has ended (g->fin is final), 0 when it goes on, -1 when the sink
 * failed (the job is cancelled). */
int lm_srv_gen_pump(lm_srv_gen *g, int timeout_ms);
/* Cancels the job if it is still running (client gone) and frees g. NULL is a no-op. */
void lm_srv_gen_free(lm_srv_gen *g);

/* The collected output (after the end). */
const char *lm_srv_gen_content(const lm_srv_gen *g, size_t *len);
const char *lm_srv_gen_reasoning(const lm_srv_gen *g, size_t *len); /* NULL when none */
/* "stop", "length" or "tool_calls" (OpenAI's finish_reason). */
const char *lm_srv_gen_finish_reason(const lm_srv_gen *g);
/* For an ended generation that failed (timeout, engine error): the HTTP error. Returns 0 when it
 * did not fail. */
int lm_srv_gen_error(const lm_srv_gen *g, lm_srv_err *e);
/* Text of one token as the logprobs report it (malloc'ed). */
char *lm_srv_token_text(const lm_server *s, int32_t id, size_t *len);

#endif
