/* srv_tokens.c — llama.cpp's tokenizer endpoints, for tools written against llama-server:
 *   POST /tokenize        {content, add_special?, with_pieces?} -> {tokens: [id] | [{id, piece}]}
 *   POST /detokenize      {tokens: [id]} -> {content}
 *   POST /apply-template  a chat completions body -> {prompt}: the chat template's rendering, with
 *                         the generation prompt, as a generation would start from it.
 * Special-token strings in content are always matched (llama.cpp's parse_special default); a
 * piece that is not valid UTF-8 on its own (a part of a character) is given as its bytes. */
#include <stdlib.h>
#include <string.h>

#include "server/srv_req.h"
#include "server/srv_route.h"
#include "text/utf8.h"

static int get_flag(const json_t *body, const char *key, int dflt, int *out, lm_srv_err *e) {
  const json_t *v = json_object_get(body, key);
  *out = dflt;
  if (!v || json_is_null(v)) return 0;
  if (!json_is_boolean(v)) return lm_srv_err_bad(e, key, "%s must be a boolean", key);
  *out = json_is_true(v);
  return 0;
}

/* A token's piece: a string, or its bytes when they are not valid UTF-8 by themselves. */
static json_t *piece_json(const lm_server *s, int32_t id) {
  char *t = NULL;
  size_t n = 0;
  if (lm_checkpoint_detokenize(s->ck, &id, 1, 0, &t, &n)) return json_string("");
  json_t *j = lm_utf8_valid(t, n) ? json_stringn(t, n) : NULL;
  if (!j) {
    j = json_array();
    for (size_t i = 0; i < n; i++)
      json_array_append_new(j, json_integer((unsigned char)t[i]));
  }
  lm_free(t);
  return j;
}

static json_t *tokens_json(const lm_server *s, const int32_t *ids, int64_t n, int pieces) {
  json_t *a = json_array();
  for (int64_t i = 0; i < n; i++)
    json_array_append_new(
        a, pieces ? json_pack("{s:i,s:o}", "id", ids[i], "piece", piece_json(s, ids[i]))
                  : json_integer(ids[i]));
  return a;
}

void lm_srv_tokenize(const lm_srv_http_req *rq, const json_t *body, lm_srv_reply *rp) {
  lm_srv_err e;
  const json_t *c = json_object_get(body, "content");
  int add_special = 0, pieces = 0, parse_special = 1;
  int r = json_is_string(c) ? 0 : lm_srv_err_bad(&e, "content", "content must be a string");
  if (!r) r = get_flag(body, "add_special", 0, &add_special, &e);
  if (!r) r = get_flag(body, "with_pieces", 0, &pieces, &e);
  if (!r) r = get_flag(body, "parse_special", 1, &parse_special, &e);
  if (!r && !parse_special)
    r = lm_srv_err_bad(&e, "parse_special",
                       "parse_special false is not supported: special-token strings are matched");
  int32_t *ids = NULL;
  int64_t n = 0;
  if (!r && lm_checkpoint_tokenize(rq->srv->ck, json_string_value(c), json_string_length(c),
                                   add_special, &ids, &n))
    r = lm_srv_err_bad(&e, "content", "%s", lm_errmsg());
  if (r)
    lm_srv_reply_error(rp, &e, 0);
  else
    lm_srv_reply_json(rp, 200, json_pack("{s:o}", "tokens", tokens_json(rq->srv, ids, n, pieces)));
  lm_free(ids);
}

void lm_srv_detokenize(const lm_srv_http_req *rq, const json_t *body, lm_srv_reply *rp) {
  lm_srv_err e;
  const json_t *t = json_object_get(body, "tokens"), *x;
  int64_t vocab = rq->srv->ci.vocab_size;
  size_t n = json_array_size(t), i;
  int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
  int r = json_is_array(t) ? 0 : lm_srv_err_bad(&e, "tokens", "tokens must be an array of ids");
  if (!r && !ids) r = lm_srv_err_set(&e, 500, "server_error", NULL, NULL, "out of memory");
  json_array_foreach(t, i, x) {
    if (r) break;
    if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= vocab)
      r = lm_srv_err_bad(&e, "tokens", "tokens[%zu] is not a token id (0..%lld)", i,
                         (long long)vocab - 1);
    else
      ids[i] = (int32_t)json_integer_value(x);
  }
  char *text = NULL, *clean = NULL;
  size_t len = 0, clen = 0;
  if (!r && n && lm_checkpoint_detokenize(rq->srv->ck, ids, (int64_t)n, 0, &text, &len))
    r = lm_srv_err_bad(&e, "tokens", "%s", lm_errmsg());
  /* ids may end inside a character: its bytes become U+FFFD rather than invalid JSON */
  if (!r && lm_utf8_sanitize(text ? text : "", len, &clean, &clen))
    r = lm_srv_err_set(&e, 500, "server_error", NULL, NULL, "out of memory");
  if (r)
    lm_srv_reply_error(rp, &e, 0);
  else
    lm_srv_reply_json(rp, 200, json_pack("{s:s%}", "content", clean, clen));
  free(clean);
  lm_free(text);
  free(ids);
}

void lm_srv_apply_template(const lm_srv_http_req *rq, const json_t *body, lm_srv_reply *rp) {
  lm_server *s = rq->srv;
  lm_srv_params p;
  lm_srv_err e;
  lm_srv_params_init(&p);
  char *msgs = NULL, *tools = NULL, *kwargs = NULL, *prompt = NULL;
  int r = s->ci.has_chat_template
              ? 0
              : lm_srv_err_bad(&e, "messages", "this checkpoint has no chat template");
  if (!r) r = lm_srv_parse_chat(body, &p, &e);
  if (!r) {
    msgs = json_dumps(p.messages, JSON_COMPACT);
    tools = p.tools ? json_dumps(p.tools, JSON_COMPACT) : NULL;
    kwargs = json_dumps(p.kwargs, JSON_COMPACT);
    if (!msgs || !kwargs || (p.tools && !tools))
      r = lm_srv_err_set(&e, 500, "server_error", NULL, NULL, "out of memory");
  }
  if (!r && lm_checkpoint_render(s->ck, msgs, tools, kwargs, 1, &prompt))
    r = lm_srv_err_bad(&e, "messages", "chat template: %s", lm_errmsg());
  if (r)
    lm_srv_reply_error(rp, &e, 0);
  else
    lm_srv_reply_json(rp, 200, json_pack("{s:s}", "prompt", prompt));
  lm_free(prompt);
  free(msgs);
  free(tools);
  free(kwargs);
  lm_srv_params_clear(&p);
}
