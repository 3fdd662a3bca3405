/* parse_gemma4.c — the Gemma 4 output state machine (gemma4-chat.md §6), driven by control-token
 * ids.
 *
 *   CONTENT   text is content.  <|channel> → NAME.  <|tool_call> → TOOL.  <turn|> <eos>
 * <|tool_response> stop. NAME      the channel-name line ("thought\n"), held until its newline,
 * then dropped → REASONING. (Entered from the prompt, the channel has no name line:
 * start_in_reasoning starts here in REASONING.) REASONING text is reasoning, up to <channel|> →
 * CONTENT. Every channel block counts, not just the first; an empty block gives no reasoning. TOOL
 * text is collected up to <tool_call|> (or <turn|>, which some outputs use instead), then parsed as
 * call:NAME{…}; a body that does not parse returns to the content verbatim. Quirks tolerated: a
 * stray <tool_call|> or <channel|> outside its construct is dropped; <eos> right after a call ends
 * the output like <|tool_response>; a name line without a newline is given up on after 256 bytes
 * and read as reasoning. */
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "text/parse_impl.h"

enum { G_CONTENT = 0, G_NAME = 1, G_REASONING = 2, G_TOOL = 3 };

#define LM_PARSE_MAX_NAME 256

static int is(int32_t id, int32_t tok) { return id >= 0 && id == tok; }

/* Ends a call: parse the body, or give it back as content (with the text of its closing token). */
static lm_status finish_call(lm_parser *p, const char *closer, size_t closer_len) {
  char *name, *args;
  p->state = G_CONTENT;
  if (lm_parse_gemma4_call(p->body.data ? p->body.data : "", p->body.len, &name, &args) == LM_OK) {
    p->opener.len = p->body.len = 0;
    return lm_parser_add_call(p, name, args);
  }
  return lm_parser_call_as_content(p, closer, closer_len);
}

static lm_status name_text(lm_parser *p, const char *piece, size_t len) {
  LM_TRY(lm_jbuf_put(&p->name, piece, len));
  const char *nl = memchr(p->name.data, '\n', p->name.len);
  if (!nl && p->name.len <= LM_PARSE_MAX_NAME) return LM_OK;
  size_t rest =
      nl ? (size_t)(nl + 1 - p->name.data) : 0; /* no newline: the whole buffer is reasoning */
  p->state = G_REASONING;
  lm_status s = lm_pchan_put(p, &p->reasoning, p->name.data + rest, p->name.len - rest);
  p->name.len = 0;
  return s;
}

static lm_status tool_text(lm_parser *p, const char *piece, size_t len) {
  if (p->body.len + len > LM_PARSE_MAX_CALL) { /* runaway call: give up on it */
    p->state = G_CONTENT;
    LM_TRY(lm_parser_call_as_content(p, NULL, 0));
    return lm_pchan_put(p, &p->content, piece, len);
  }
  return lm_jbuf_put(&p->body, piece, len);
}

static lm_status text(lm_parser *p, const char *piece, size_t len) {
  switch (p->state) {
  case G_CONTENT: return lm_pchan_put(p, &p->content, piece, len);
  case G_NAME: return name_text(p, piece, len);
  case G_REASONING: return lm_pchan_put(p, &p->reasoning, piece, len);
  default: return tool_text(p, piece, len);
  }
}

lm_status lm_parse_gemma4_feed(lm_parser *p, int32_t id, const char *piece, size_t len) {
  const lm_parser_tokens *t = &p->o.tokens;
  if (is(id, t->turn_close) || is(id, t->eos) || is(id, t->tool_response_open)) {
    p->stopped = 1;
    return lm_parser_finish(p);
  }
  if (p->state == G_TOOL) {
    if (is(id, t->tool_call_close)) return finish_call(p, piece, len);
    return tool_text(p, piece,
                     len); /* <|"|> and any other token inside a call are part of its text */
  }
  if (is(id, t->tool_call_open)) { /* also from inside reasoning: a call ends the channel */
    p->name.len = p->body.len = p->opener.len = 0;
    p->state = G_TOOL;
    return lm_jbuf_put(&p->opener, piece, len);
  }
  if (is(id, t->channel_open)) {
    if (p->state == G_CONTENT) {
      p->state = G_NAME;
      p->name.len = 0;
    }
    return LM_OK;
  }
  if (is(id, t->channel_close)) {
    p->state = G_CONTENT;
    p->name.len = 0;
    return LM_OK;
  }
  if (is(id, t->tool_call_close)) return LM_OK; /* stray closer after a call */
  return text(p, piece, len);
}

lm_status lm_parse_gemma4_finish(lm_parser *p) {
  if (p->state == G_TOOL) return finish_call(p, NULL, 0); /* parse what is there, as ollama does */
  p->name.len = 0; /* a name line cut off before its newline carries no reasoning */
  return LM_OK;
}
