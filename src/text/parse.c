/* parse.c — the output parser object: channels that strip their ends while streaming, event
 * delivery, collected results. The per-format state machines are parse_gemma4.c and
 * parse_generic.c. */
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "text/parse_impl.h"

static lm_status emit_text(lm_parser *p, lm_parse_kind kind, const char *s, size_t n) {
  if (!p->o.emit || n == 0) return LM_OK;
  lm_parse_event ev = {kind, s, n, 0, NULL, NULL};
  return p->o.emit(p->o.user, &ev);
}

static void drop_front(lm_jbuf *b, size_t n) {
  memmove(b->data, b->data + n, b->len - n);
  b->len -= n;
  b->data[b->len] = '\0';
}

/* Adds text to a channel. Emits everything except leading whitespace (before the first emitted
 * byte), trailing whitespace (until something follows it) and an incomplete UTF-8 tail. Whitespace
 * is Python's (str.strip() semantics), decided on complete code points only, so any split of the
 * same text gives the same deltas in total. */
lm_status lm_pchan_put(lm_parser *p, lm_pchan *ch, const char *s, size_t n) {
  if (n == 0) return LM_OK;
  LM_TRY(lm_jbuf_put(&ch->held, s, n));
  lm_jbuf *h = &ch->held;
  if (!ch->started) drop_front(h, lm_py_lspace(h->data, h->len));
  size_t tail = lm_jutf8_incomplete_tail(h->data, h->len);
  size_t body = h->len - tail;
  size_t out = body - lm_py_rspace(h->data, body);
  if (out == 0) return LM_OK;
  LM_TRY(lm_jbuf_put(&ch->all, h->data, out));
  ch->started = 1;
  lm_status s2 = emit_text(p, ch->kind, h->data, out);
  drop_front(h, out);
  return s2;
}

/* End of output: held whitespace was trailing and is dropped; an incomplete UTF-8 tail is not
 * whitespace, so it (and the whitespace before it) goes out as is. */
static lm_status pchan_finish(lm_parser *p, lm_pchan *ch) {
  lm_jbuf *h = &ch->held;
  lm_status s = LM_OK;
  if (h->len && lm_jutf8_incomplete_tail(h->data, h->len)) {
    s = lm_jbuf_put(&ch->all, h->data, h->len);
    if (s == LM_OK) s = emit_text(p, ch->kind, h->data, h->len);
  }
  h->len = 0;
  return s;
}

lm_status lm_parser_add_call(lm_parser *p, char *name, char *arguments) {
  if (p->ncalls == p->cap_calls) {
    size_t cap = p->cap_calls ? p->cap_calls * 2 : 4;
    lm_pcall *c = realloc(p->calls, cap * sizeof *c);
    if (!c) {
      free(name);
      free(arguments);
      return LM_ERRF(LM_ERR_NOMEM, "out of memory (tool calls)");
    }
    p->calls = c;
    p->cap_calls = cap;
  }
  p->calls[p->ncalls].name = name;
  p->calls[p->ncalls].arguments = arguments;
  if (!p->o.emit) {
    p->ncalls++;
    return LM_OK;
  }
  lm_parse_event ev = {LM_PARSE_TOOL_CALL, NULL, 0, (int)p->ncalls, name, arguments};
  p->ncalls++;
  return p->o.emit(p->o.user, &ev);
}

lm_status lm_parser_call_as_content(lm_parser *p, const char *closer, size_t closer_len) {
  LM_TRY(lm_pchan_put(p, &p->content, p->opener.data, p->opener.len));
  LM_TRY(lm_pchan_put(p, &p->content, p->body.data, p->body.len));
  LM_TRY(lm_pchan_put(p, &p->content, closer, closer_len));
  p->opener.len = p->body.len = 0;
  return LM_OK;
}

/* ---- public API ----------------------------------------------------------------------------- */

lm_status lm_parser_tokens_gemma4(lm_token_find_fn find, const void *ctx, lm_parser_tokens *out) {
  static const char *const names[] = {"<|channel>",   "<channel|>",       "<|tool_call>",
                                      "<tool_call|>", "<|tool_response>", "<turn|>",
                                      "<eos>"};
  int32_t ids[7];
  for (int i = 0; i < 7; i++) {
    ids[i] = find(ctx, names[i], strlen(names[i]));
    if (ids[i] < 0 && i < 4)
      return LM_ERRF(LM_ERR_NOT_FOUND, "vocabulary has no %s token (not a Gemma 4 chat model)",
                     names[i]);
  }
  *out = (lm_parser_tokens){ids[0], ids[1], ids[2], ids[3], ids[4], ids[5], ids[6]};
  return LM_OK;
}

lm_status lm_parser_create(const lm_parser_opts *opts, lm_parser **out) {
  *out = NULL;
  if (opts->format != LM_PARSER_GEMMA4 && opts->format != LM_PARSER_GENERIC)
    return LM_ERRF(LM_ERR_INVALID, "parser: unknown format %d", (int)opts->format);
  const lm_parser_tokens *t = &opts->tokens;
  if (opts->format == LM_PARSER_GEMMA4 && (t->channel_open < 0 || t->channel_close < 0 ||
                                           t->tool_call_open < 0 || t->tool_call_close < 0))
    return LM_ERRF(LM_ERR_INVALID,
                   "parser: the Gemma 4 format needs the channel and tool-call token ids");
  lm_parser *p = calloc(1, sizeof *p);
  if (!p) return LM_ERRF(LM_ERR_NOMEM, "out of memory (parser)");
  p->o = *opts;
  p->content.kind = LM_PARSE_CONTENT;
  p->reasoning.kind = LM_PARSE_REASONING;
  p->body.cap_limit = LM_PARSE_MAX_CALL + 64;
  /* state 0 is content in both formats, 2 is reasoning (see parse_gemma4.c / parse_generic.c) */
  p->state = opts->start_in_reasoning ? 2 : 0;
  *out = p;
  return LM_OK;
}

void lm_parser_free(lm_parser *p) {
  if (!p) return;
  lm_jbuf *bufs[] = {&p->content.held, &p->content.all, &p->reasoning.held, &p->reasoning.all,
                     &p->name,         &p->body,        &p->opener,         &p->pending};
  for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
    lm_jbuf_free(bufs[i]);
  for (size_t i = 0; i < p->ncalls; i++) {
    free(p->calls[i].name);
    free(p->calls[i].arguments);
  }
  free(p->calls);
  free(p);
}

lm_status lm_parser_feed(lm_parser *p, int32_t id, const char *piece, size_t len) {
  if (p->stopped || p->finished) return LM_OK;
  if (!piece) len = 0;
  return p->o.format == LM_PARSER_GEMMA4 ? lm_parse_gemma4_feed(p, id, piece, len)
                                         : lm_parse_generic_feed(p, id, piece, len);
}

lm_status lm_parser_feed_text(lm_parser *p, const char *text, size_t len) {
  return lm_parser_feed(p, -1, text, len);
}

lm_status lm_parser_finish(lm_parser *p) {
  if (p->finished) return LM_OK;
  p->finished = 1;
  LM_TRY(p->o.format == LM_PARSER_GEMMA4 ? lm_parse_gemma4_finish(p) : lm_parse_generic_finish(p));
  LM_TRY(pchan_finish(p, &p->reasoning));
  return pchan_finish(p, &p->content);
}

const char *lm_parser_content(const lm_parser *p) {
  return p->content.all.data ? p->content.all.data : "";
}

const char *lm_parser_reasoning(const lm_parser *p) {
  return p->reasoning.all.len ? p->reasoning.all.data : NULL;
}

size_t lm_parser_content_len(const lm_parser *p) { return p->content.all.len; }

size_t lm_parser_reasoning_len(const lm_parser *p) { return p->reasoning.all.len; }

size_t lm_parser_tool_call_count(const lm_parser *p) { return p->ncalls; }

const char *lm_parser_tool_call_name(const lm_parser *p, size_t i) {
  return i < p->ncalls ? p->calls[i].name : NULL;
}

const char *lm_parser_tool_call_arguments(const lm_parser *p, size_t i) {
  return i < p->ncalls ? p->calls[i].arguments : NULL;
}

int lm_parser_stopped(const lm_parser *p) { return p->stopped; }
