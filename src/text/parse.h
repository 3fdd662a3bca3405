/* parse.h — incremental parsing of model output into content, reasoning and tool calls.
 *
 * The parser is fed what the model produces, one (token id, decoded text piece) pair at a time, and
 * reports deltas as they become certain, so a server can stream them as SSE:
 *   - LM_PARSE_CONTENT / LM_PARSE_REASONING: text deltas of the answer and of the reasoning
 * channel;
 *   - LM_PARSE_TOOL_CALL: one complete call (name + arguments as a JSON object text), sent when the
 * call's closing token arrives (OpenAI streams send tool_calls deltas then). What is held back: the
 * reasoning channel's name line ("thought\n"), the text of a call in progress, whitespace at the
 * ends of each channel (content and reasoning come out stripped, as the reference parsers strip
 * them), and an incomplete UTF-8 sequence at the end of a piece. The result never depends on how
 * the text is split into pieces.
 *
 * Formats:
 *   - LM_PARSER_GEMMA4: <|channel>thought\n…<channel|> reasoning and
 * <|tool_call>call:NAME{…}<tool_call|> calls in Gemma 4's value syntax (<|"|> quoted strings, bare
 * keys), decided on control-token ids (looked up by their text, never hard-coded:
 * lm_parser_tokens_gemma4); text is parsed as text. <turn|>, <eos> and <|tool_response> end the
 * output.
 *   - LM_PARSER_GENERIC: the ChatML/Hermes convention, on text: <think>…</think> reasoning and
 *     <tool_call>{"name": …, "arguments": {…}}</tool_call> calls (what lm_chat_template_chatml
 * renders). A call that does not parse comes back as content, verbatim (markers included): nothing
 * is dropped. End of stream inside an unfinished construct flushes it: an open call is parsed if it
 * can be, else returned as content; open reasoning is returned as reasoning.
 *
 * Not thread-safe: one parser per generated sequence. */
#ifndef LM_TEXT_PARSE_H
#define LM_TEXT_PARSE_H

#include <stddef.h>
#include <stdint.h>

#include "lumen.h"

typedef enum lm_parse_kind {
  LM_PARSE_CONTENT = 0,
  LM_PARSE_REASONING,
  LM_PARSE_TOOL_CALL
} lm_parse_kind;

typedef struct lm_parse_event {
  lm_parse_kind kind;
  const char *text; /* CONTENT / REASONING: the delta (not NUL-terminated) */
  size_t len;
  int index;        /* TOOL_CALL: 0 for the first call of the output, 1, … */
  const char *name; /* TOOL_CALL: NUL-terminated */
  const char
      *arguments; /* TOOL_CALL: a JSON object, NUL-terminated, e.g. {"city": "Paris", "n": 3} */
} lm_parse_event;

/* Receives each event; pointers are valid during the call only. A non-OK return aborts the feed. */
typedef lm_status (*lm_parse_emit_fn)(void *user, const lm_parse_event *ev);

typedef enum lm_parser_format { LM_PARSER_GEMMA4 = 0, LM_PARSER_GENERIC } lm_parser_format;

/* Control-token ids the Gemma 4 parser decides on (-1: the vocabulary has no such token). */
typedef struct lm_parser_tokens {
  int32_t channel_open;       /* <|channel> */
  int32_t channel_close;      /* <channel|> */
  int32_t tool_call_open;     /* <|tool_call> */
  int32_t tool_call_close;    /* <tool_call|> */
  int32_t tool_response_open; /* <|tool_response>: the model hands over to the tools (a stop) */
  int32_t turn_close;         /* <turn|> (a stop) */
  int32_t eos;                /* <eos> (a stop) */
} lm_parser_tokens;

/* Looks a token up by its exact text; returns its id or -1 (lm_tokenizer_find has this shape). */
typedef int32_t (*lm_token_find_fn)(const void *ctx, const char *text, size_t len);

/* Fills *out for Gemma 4 by looking each control token up with find(ctx, …). LM_ERR_NOT_FOUND when
 * the vocabulary lacks one of <|channel> <channel|> <|tool_call> <tool_call|> (then the checkpoint
 * is not a Gemma 4 chat model: use LM_PARSER_GENERIC). The stop tokens may be absent (-1). */
lm_status lm_parser_tokens_gemma4(lm_token_find_fn find, const void *ctx, lm_parser_tokens *out);

struct lm_tokenizer;
/* lm_parser_tokens_gemma4 over a loaded tokenizer (text/tokenizer.h, lm_tokenizer_find). */
lm_status lm_parser_tokens_from_tokenizer(const struct lm_tokenizer *t, lm_parser_tokens *out);

typedef struct lm_parser_opts {
  lm_parser_format format;
  lm_parser_tokens
      tokens; /* GEMMA4: required; GENERIC: only eos / turn_close are used (stops), may be -1 */
  int start_in_reasoning; /* the prompt already opened the reasoning channel (e.g. it ends in
                             "<|channel>thought\n" or "<think>\n"): output starts as reasoning */
  lm_parse_emit_fn emit;  /* may be NULL: results are still collected (lm_parser_content() …) */
  void *user;
} lm_parser_opts;

typedef struct lm_parser lm_parser;

lm_status lm_parser_create(const lm_parser_opts *opts, lm_parser **out);
void lm_parser_free(lm_parser *p);

/* Feeds one generated token: its id and its decoded text (control tokens decoded as their text,
 * e.g.
 * "<|tool_call>"; an empty piece is fine). After a stop token, further feeds are ignored. */
lm_status lm_parser_feed(lm_parser *p, int32_t id, const char *piece, size_t len);
/* Feeds text without token ids (the GENERIC format, or a model whose output is only text). */
lm_status lm_parser_feed_text(lm_parser *p, const char *text, size_t len);
/* End of output (a stop token, the length cap, or cancellation): flushes what is held. Idempotent.
 */
lm_status lm_parser_finish(lm_parser *p);

/* Collected results. Content and reasoning are the concatenation of all deltas (stripped at the
 * ends); reasoning is NULL when the output had none. finish_reason "tool_calls" iff tool_call_count
 * > 0. */
const char *lm_parser_content(const lm_parser *p);
const char *lm_parser_reasoning(const lm_parser *p);
/* Byte lengths of the two (the text may hold NUL bytes, e.g. from byte-fallback tokens). */
size_t lm_parser_content_len(const lm_parser *p);
size_t lm_parser_reasoning_len(const lm_parser *p);
size_t lm_parser_tool_call_count(const lm_parser *p);
const char *lm_parser_tool_call_name(const lm_parser *p, size_t i);
const char *lm_parser_tool_call_arguments(const lm_parser *p, size_t i);
/* 1 when a stop token (<turn|>, <eos>, <|tool_response>) ended the output. */
int lm_parser_stopped(const lm_parser *p);

/* One Gemma 4 call body, the text between <|tool_call> and <tool_call|>: "call:NAME{ARGS}". On
 * LM_OK *name and *arguments_json are malloc'd (free() them); a body that does not parse is
 * LM_ERR_INVALID with the reason and byte offset. Keeps int vs float and integers of any size;
 * strings are re-escaped as JSON. Accepts True/False/None, keys quoted with <|"|>, and whitespace
 * between tokens. */
lm_status lm_parse_gemma4_call(const char *body, size_t len, char **name, char **arguments_json);
/* One generic call body (the text inside <tool_call>…</tool_call>): {"name": …, "arguments": {…}}
 * ("parameters" is accepted for "arguments"; arguments given as a JSON string are decoded). */
lm_status lm_parse_json_call(const char *body, size_t len, char **name, char **arguments_json);

#endif
