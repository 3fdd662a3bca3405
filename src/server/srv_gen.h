/* srv_gen.h — one generation as an HTTP thread drives it: the prompt (chat template or raw text),
 * admission, the job handed to the scheduler, and the output parsed back into content, reasoning
 * and tool calls as the tokens arrive. Shared by the OpenAI and Anthropic protocol mappings,
 * which plug in a sink to format what comes out (SSE deltas, or one JSON body at the end). */
#ifndef LM_SERVER_SRV_GEN_H
#define LM_SERVER_SRV_GEN_H

#include "server/srv_ctx.h"
#include "server/srv_req.h"

/* Receives the output as it becomes final. Any callback may be NULL. A non-OK return ends the
 * stream (the client is treated as gone). */
typedef struct lm_srv_sink {
  lm_status (*content)(void *u, const char *t, size_t n);
  lm_status (*reasoning)(void *u, const char *t, size_t n);
  lm_status (*tool_call)(void *u, int index, const char *id, const char *name, const char *args);
  lm_status (*token)(void *u,
                     const lm_tok_event *t); /* every sampled token but a stop id (logprobs) */
  void *u;
} lm_srv_sink;

typedef struct lm_srv_call {
  char id[40];
  char *name, *arguments;
} lm_srv_call;

typedef struct lm_srv_gen {
  lm_server *srv;
  lm_chan *ch;
  lm_parser *parser; /* chat: the output parser; NULL for raw completions */
  lm_srv_sink sink;
  char *text; /* raw mode: the whole text */
  size_t n_text, cap_text;
  lm_srv_call *calls;
  int n_calls;
  int64_t n_prompt;
  int done;
  lm_finish fin;
  double t0;
  char id[48];         /* chatcmpl-… / cmpl-… / msg_… */
  char call_prefix[8]; /* "call_" (OpenAI) or "toolu_" (Anthropic) */
  long long created;   /* unix seconds */
} lm_srv_gen;

/* The prompt of a chat request: p->messages rendered with the checkpoint's template and tokenized
 * (special tokens matched, no extra BOS); with tool_choice required/named on a Gemma 4 vocabulary,
 * the opening of the call is appended (the model continues inside it) and returned in *forced for
 * the parser. *start_reasoning: the prompt ends inside an open reasoning channel. Returns 0 or the
 * HTTP status. */
int lm_srv_gen_chat_prompt(lm_server *s, const lm_srv_params *p, int32_t **ids, int64_t *n,
                           char **forced, int *start_reasoning, lm_srv_err *e);
/* The prompt of a completion: the text tokenized with the tokenizer's BOS, or the ids given. */
int lm_srv_gen_raw_prompt(lm_server *s, lm_srv_params *p, int32_t **ids, int64_t *n, lm_srv_err *e);

/* Checks admission and queues the job (takes ids). chat: parse the output (forced text and
 * start_reasoning as from lm_srv_gen_chat_prompt). On 0, *out runs; else the HTTP status of e
 * (400 context/memory, 429 queue full, 503 stopping). */
int lm_srv_gen_start(lm_server *s, lm_srv_params *p, int32_t *ids, int64_t n, int chat,
                     const char *forced, int start_reasoning, const lm_srv_sink *sink,
                     const char *id_prefix, const char *call_prefix, lm_srv_gen **out,
                     lm_srv_err *e);
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
