/* parse_generic.c — the ChatML/Hermes output convention, on text: <think>…</think> reasoning and
 * <tool_call>{"name": …, "arguments": {…}}</tool_call> calls (Qwen, Hermes,
 * lm_chat_template_chatml).
 *
 * The tags are ordinary text here (in most such vocabularies they are added tokens that decode to
 * their text), so a tag can arrive split across pieces: text that might be the start of a tag is
 * held until the next piece decides. Stops are the eos / turn_close ids when the caller gives them.
 */
#include <string.h>

#include "base/status.h"
#include "text/parse_impl.h"

enum { X_CONTENT = 0, X_TOOL = 1, X_THINK = 2 };

static const char THINK_OPEN[] = "<think>", THINK_CLOSE[] = "</think>";
static const char CALL_OPEN[] = "<tool_call>", CALL_CLOSE[] = "</tool_call>";

/* Length of the longest suffix of s[0..n) that is a proper prefix of tag. */
static size_t partial_suffix(const char *s, size_t n, const char *tag) {
  size_t t = strlen(tag);
  for (size_t k = t - 1 < n ? t - 1 : n; k > 0; k--)
    if (memcmp(s + n - k, tag, k) == 0) return k;
  return 0;
}

static const char *find(const char *s, size_t n, const char *tag) {
  return memmem(s, n, tag, strlen(tag));
}

static lm_status finish_call(lm_parser *p, const char *closer) {
  char *name, *args;
  p->state = X_CONTENT;
  if (lm_parse_json_call(p->body.data ? p->body.data : "", p->body.len, &name, &args) == LM_OK) {
    p->opener.len = p->body.len = 0;
    return lm_parser_add_call(p, name, args);
  }
  return lm_parser_call_as_content(p, closer, closer ? strlen(closer) : 0);
}

/* Moves n bytes from the front of pending into the channel (or the call body) of the current state.
 */
static lm_status route(lm_parser *p, size_t n) {
  lm_status s = LM_OK;
  if (n == 0) return LM_OK;
  if (p->state == X_CONTENT)
    s = lm_pchan_put(p, &p->content, p->pending.data, n);
  else if (p->state == X_THINK)
    s = lm_pchan_put(p, &p->reasoning, p->pending.data, n);
  else if (p->body.len + n > LM_PARSE_MAX_CALL) { /* runaway call: give it back as content */
    p->state = X_CONTENT;
    s = lm_parser_call_as_content(p, NULL, 0);
    if (s == LM_OK) s = lm_pchan_put(p, &p->content, p->pending.data, n);
  } else
    s = lm_jbuf_put(&p->body, p->pending.data, n);
  memmove(p->pending.data, p->pending.data + n, p->pending.len - n);
  p->pending.len -= n;
  return s;
}

/* Classifies pending text; with final = 0 keeps a possible partial tag at the end. */
static lm_status process(lm_parser *p, int final) {
  for (;;) {
    const char *s = p->pending.data;
    size_t n = p->pending.len;
    if (n == 0) return LM_OK;
    const char *hit = NULL, *tag = NULL;
    const char *const *tags;
    static const char *const in_content[] = {THINK_OPEN, CALL_OPEN, THINK_CLOSE, NULL};
    static const char *const in_think[] = {THINK_CLOSE, NULL};
    static const char *const in_call[] = {CALL_CLOSE, NULL};
    tags = p->state == X_CONTENT ? in_content : p->state == X_THINK ? in_think : in_call;
    for (int k = 0; tags[k]; k++) {
      const char *h = find(s, n, tags[k]);
      if (h && (!hit || h < hit)) hit = h, tag = tags[k];
    }
    if (!hit) {
      size_t hold = 0;
      for (int k = 0; !final && tags[k]; k++) {
        size_t h = partial_suffix(s, n, tags[k]);
        if (h > hold) hold = h;
      }
      return route(p, n - hold);
    }
    LM_TRY(route(p, (size_t)(hit - s)));
    size_t tl = strlen(tag);
    memmove(p->pending.data, p->pending.data + tl, p->pending.len - tl);
    p->pending.len -= tl;
    if (tag == THINK_OPEN)
      p->state = X_THINK;
    else if (tag == THINK_CLOSE)
      p->state = X_CONTENT; /* from content: a stray closer, dropped */
    else if (tag == CALL_OPEN) {
      p->state = X_TOOL;
      p->body.len = p->opener.len = 0;
      LM_TRY(lm_jbuf_puts(&p->opener, CALL_OPEN));
    } else
      LM_TRY(finish_call(p, CALL_CLOSE));
  }
}

lm_status lm_parse_generic_feed(lm_parser *p, int32_t id, const char *piece, size_t len) {
  const lm_parser_tokens *t = &p->o.tokens;
  if ((id >= 0 && id == t->eos) || (id >= 0 && id == t->turn_close)) {
    p->stopped = 1;
    return lm_parser_finish(p);
  }
  LM_TRY(lm_jbuf_put(&p->pending, piece, len));
  return process(p, 0);
}

lm_status lm_parse_generic_finish(lm_parser *p) {
  LM_TRY(process(p, 1));
  if (p->state == X_TOOL) return finish_call(p, NULL);
  return LM_OK;
}
