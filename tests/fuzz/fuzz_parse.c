/* fuzz_parse.c — libFuzzer target for model-output parsing: the Gemma 4 call syntax on any bytes,
 * and the streaming parsers (Gemma 4 and generic) on any sequence of pieces and control tokens.
 * Checks the contract too: what comes out of a call is a JSON object, and the streamed deltas add
 * up to the collected results. */
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text/parse.h"

typedef struct sink {
  size_t content, reasoning, calls;
} sink;

static lm_status on_event(void *user, const lm_parse_event *ev) {
  sink *s = user;
  if (ev->kind == LM_PARSE_CONTENT)
    s->content += ev->len;
  else if (ev->kind == LM_PARSE_REASONING)
    s->reasoning += ev->len;
  else
    s->calls++;
  return LM_OK;
}

static void check_object(const char *args) {
  json_t *j = json_loads(args, JSON_DECODE_INT_AS_REAL | JSON_ALLOW_NUL, NULL);
  if (!json_is_object(j)) abort();
  json_decref(j);
}

/* Input layout: byte 0 picks the format and start state; then records of (tag byte, length byte,
 * bytes): tag < 8 feeds one of the control tokens, anything else feeds the bytes as a text piece.
 */
static void run_stream(const uint8_t *data, size_t size) {
  static const char *const ctl[] = {
      "<|channel>",       "<channel|>", "<|tool_call>", "<tool_call|>",
      "<|tool_response>", "<turn|>",    "<eos>",        "<|\"|>"};
  sink s = {0, 0, 0};
  lm_parser_opts o = {0};
  o.format = data[0] & 1 ? LM_PARSER_GENERIC : LM_PARSER_GEMMA4;
  o.tokens = (lm_parser_tokens){100, 101, 48, 49, 50, 106, 1};
  o.start_in_reasoning = (data[0] >> 1) & 1;
  o.emit = on_event;
  o.user = &s;
  lm_parser *p;
  if (lm_parser_create(&o, &p) != LM_OK) abort();
  static const int32_t ids[] = {100, 101, 48, 49, 50, 106, 1, 52};
  for (size_t i = 1; i + 1 < size;) {
    uint8_t tag = data[i], len = data[i + 1];
    i += 2;
    if (tag < 8) {
      lm_parser_feed(p, ids[tag], ctl[tag], strlen(ctl[tag]));
      continue;
    }
    if (len > size - i) len = (uint8_t)(size - i);
    lm_parser_feed(p, -1, (const char *)data + i, len);
    i += len;
  }
  lm_parser_finish(p);
  if (s.content != lm_parser_content_len(p) || s.reasoning != lm_parser_reasoning_len(p) ||
      s.calls != lm_parser_tool_call_count(p) ||
      (lm_parser_reasoning(p) == NULL) != (s.reasoning == 0))
    abort();
  for (size_t k = 0; k < lm_parser_tool_call_count(p); k++)
    check_object(lm_parser_tool_call_arguments(p, k));
  lm_parser_free(p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *name, *args;
  if (lm_parse_gemma4_call((const char *)data, size, &name, &args) == LM_OK) {
    check_object(args);
    free(name);
    free(args);
  }
  if (lm_parse_json_call((const char *)data, size, &name, &args) == LM_OK) {
    check_object(args);
    free(name);
    free(args);
  }
  if (size > 0) run_stream(data, size);
  return 0;
}
