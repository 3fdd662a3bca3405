/* srv_req.h — parsing and validating request bodies (OpenAI chat completions and completions; the
 * Anthropic endpoint translates into the chat shape first).
 *
 * Every field is type- and range-checked before use; a bad one is a 400 naming it in `param`
 * (srv_error.h). Unknown fields are ignored, as OpenAI-compatible servers do. The sampling fields
 * overlay the server's defaults. */
#ifndef LM_SERVER_SRV_REQ_H
#define LM_SERVER_SRV_REQ_H

#include <jansson.h>
#include <stdint.h>

#include "lumen.h"
#include "server/srv_error.h"

#define LM_SRV_MAX_STOPS 16
#define LM_SRV_MAX_BIAS 1024
#define LM_SRV_MAX_N 16 /* choices per request (n) */

typedef enum lm_srv_tool_choice {
  LM_SRV_TOOLS_AUTO = 0,
  LM_SRV_TOOLS_NONE,     /* the tools are not declared to the model */
  LM_SRV_TOOLS_REQUIRED, /* the response starts with a tool call (forced at the prompt's end) */
  LM_SRV_TOOLS_NAMED     /* the response starts with a call of tool_name */
} lm_srv_tool_choice;

typedef struct lm_srv_params {
  lm_sampling sampling; /* the defaults overlaid with the request's fields (owns its lists) */
  int has_seed;
  int64_t max_tokens; /* 0: not given */
  char **stops;       /* [n_stops] (owned) */
  int n_stops;
  int stream, include_usage, ignore_eos;
  int top_logprobs; /* -1: no logprobs */
  int n;            /* choices (1..LM_SRV_MAX_N) */
  int choice;       /* which of them a generation is being built for (its seed is seed + choice) */
  const char *prompt_param; /* the field a too-long prompt is blamed on (NULL: messages / prompt) */
  /* chat */
  json_t *messages; /* the template's input: validated, normalized (owned) */
  json_t *tools;    /* normalized, NULL when none are declared (owned) */
  json_t *kwargs;   /* template variables (owned, never NULL after a chat parse) */
  lm_srv_tool_choice tool_choice;
  char tool_name[128];
  /* structured output (lm_request_options): at most one of the three */
  char *grammar;         /* GBNF (owned) */
  char *json_schema;     /* the schema's JSON text (owned) */
  int json_object;       /* any JSON object */
  char format_param[32]; /* the field that set the format, for errors ("response_format") */
  /* speculative decoding: the request's "speculative" field (0: absent, the server's default;
   * 1: on, from spec_source ("ngram", "draft"; NULL: the server's), with spec_tokens drafts per
   * step (0: the server's); -1: off) */
  int spec;
  const char *spec_source;
  int spec_tokens;
  /* LoRA adapters: the route's choice (srv_adapters.h; borrowed, NULL: none made) */
  const struct lm_srv_adapters *adapters;
  /* completions */
  char *prompt;        /* text prompt (owned), or: */
  int32_t *prompt_ids; /* token-id prompt (owned) */
  int64_t n_prompt_ids;
} lm_srv_params;

void lm_srv_params_init(lm_srv_params *p);
void lm_srv_params_clear(lm_srv_params *p);

/* Checks that body[0..len) is valid UTF-8 and one JSON object; *out owns it. Returns 0 or the
 * HTTP status of the error in e. */
int lm_srv_parse_body(const char *body, size_t len, json_t **out, lm_srv_err *e);

/* The fields every generation endpoint shares: stream, stream_options, max_tokens /
 * max_completion_tokens, temperature, top_p, top_k, min_p, seed, stop, presence_penalty,
 * frequency_penalty, repetition_penalty, repetition_context_size, presence_context_size,
 * logit_bias, n (1..LM_SRV_MAX_N), ignore_eos, grammar (llama.cpp GBNF). vocab bounds the
 * logit_bias ids. `defaults` is copied into p->sampling first. Returns 0 or the HTTP status. */
int lm_srv_parse_common(const json_t *req, const lm_sampling *defaults, int64_t vocab,
                        lm_srv_params *p, lm_srv_err *e);
/* Chat completions: messages, tools, tool_choice, logprobs / top_logprobs, reasoning_effort,
 * chat_template_kwargs, response_format. */
int lm_srv_parse_chat(const json_t *req, lm_srv_params *p, lm_srv_err *e);
/* A structured-output format object into p (the Responses API's text.format calls this too):
 * {"type": "text"} (nothing), {"type": "json_object"}, or {"type": "json_schema"} with its name,
 * schema and strict either under "json_schema" (chat completions' response_format) or beside the
 * type (the Responses API's text.format). The schema must be an object (true stands for {}); name
 * and strict are checked but constrain nothing more (every schema is enforced, strict or not).
 * param names the field in errors. Refused next to a grammar. Returns 0 or the HTTP status. */
int lm_srv_parse_format(const json_t *fmt, const char *param, lm_srv_params *p, lm_srv_err *e);

/* Completions: prompt (a string, one string in a list, or token ids < vocab), logprobs (an int),
 * echo / suffix (refused when set). */
int lm_srv_parse_completion(const json_t *req, int64_t vocab, lm_srv_params *p, lm_srv_err *e);

/* Anthropic Messages: translates a /v1/messages body into the chat shape the functions above read
 * (system, content blocks, tool_use / tool_result, stop_sequences, thinking, tools, tool_choice,
 * grammar, and output_format {type: json_schema, schema} as response_format).
 * *out owns the new object (may be set on failure too: json_decref it). Returns 0 or the HTTP
 * status. */
int lm_srv_anthropic_request(const json_t *req, json_t **out, lm_srv_err *e);

#endif
