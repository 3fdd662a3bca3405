/* srv_openai.c — the OpenAI protocol: POST /v1/chat/completions, POST /v1/completions (streamed as
 * SSE chunks ending in "data: [DONE]", or one JSON body), GET /v1/models.
 *
 * Chat output comes from the output parser: content and reasoning_content deltas, and a
 * tool_calls delta per call when its closing token arrives (finish_reason "tool_calls").
 * Log-probabilities are of the model's raw distribution (before the sampling processors), in
 * OpenAI's chat shape ({content: [{token, logprob, bytes, top_logprobs}]}) or completions shape
 * ({tokens, token_logprobs, top_logprobs, text_offset}). */
#include <stdlib.h>
#include <string.h>

#include "server/srv_gen.h"
#include "server/srv_route.h"

typedef struct oai {
  lm_srv_stream base; /* when streaming */
  lm_server *srv;
  lm_srv_gen *g;
  int chat, include_usage, sent_role;
  json_t *lp; /* chat: entries not yet sent (stream) or all (body) */
  json_t *lp_tokens, *lp_values, *lp_tops, *lp_offsets; /* completions */
  size_t offset; /* completions: text offset of the next token */
} oai;

/* ---- log-probabilities ----------------------------------------------------------------------- */

static json_t *byte_list(const char *t, size_t n) {
  json_t *a = json_array();
  for (size_t i = 0; i < n; i++)
    json_array_append_new(a, json_integer((unsigned char)t[i]));
  return a;
}

/* A token's text as JSON (a lone byte of a multi-byte character is not valid UTF-8: its bytes
 * are in "bytes", the text shows U+FFFD). */
static json_t *token_json(lm_server *s, int32_t id, json_t **bytes) {
  size_t n;
  char *t = lm_srv_token_text(s, id, &n);
  json_t *j = t ? json_stringn(t, n) : NULL;
  if (bytes) *bytes = byte_list(t ? t : "", t ? n : 0);
  free(t);
  return j ? j : json_string("\xEF\xBF\xBD");
}

static json_t *chat_lp_entry(lm_server *s, int32_t id, float lp) {
  json_t *bytes, *tok = token_json(s, id, &bytes);
  return json_pack("{s:o,s:f,s:o}", "token", tok, "logprob", (double)lp, "bytes", bytes);
}

static lm_status chat_token(oai *o, const lm_event *t) {
  json_t *e = chat_lp_entry(o->srv, t->token, t->logprob), *tops = json_array();
  for (int k = 0; k < t->n_top; k++)
    json_array_append_new(tops, chat_lp_entry(o->srv, t->top_ids[k], t->top_logprobs[k]));
  json_object_set_new(e, "top_logprobs", tops);
  return json_array_append_new(o->lp, e) ? LM_ERRF(LM_ERR_NOMEM, "out of memory") : LM_OK;
}

static lm_status completion_token(oai *o, const lm_event *t) {
  json_t *tops = json_object();
  for (int k = 0; k < t->n_top; k++) {
    size_t n;
    char *txt = lm_srv_token_text(o->srv, t->top_ids[k], &n);
    json_object_setn_new(tops, txt ? txt : "", txt ? n : 0, json_real(t->top_logprobs[k]));
    free(txt);
  }
  json_array_append_new(o->lp_tokens, token_json(o->srv, t->token, NULL));
  json_array_append_new(o->lp_values, json_real(t->logprob));
  json_array_append_new(o->lp_tops, tops);
  json_array_append_new(o->lp_offsets, json_integer((json_int_t)o->offset));
  return LM_OK;
}

static lm_status on_token(void *u, const lm_event *t) {
  oai *o = u;
  lm_status s = o->chat ? chat_token(o, t) : completion_token(o, t);
  o->offset += t->len; /* text_offset: where the next token's text starts */
  return s;
}

/* The logprobs value of a choice (takes what is pending when streaming). NULL: json null. */
static json_t *take_logprobs(oai *o) {
  if (o->chat) {
    if (!o->lp) return json_null();
    json_t *v = json_pack("{s:o}", "content",
                          o->lp); /* the arrays move into the value; new ones collect on */
    o->lp = json_array();
    return v;
  }
  if (!o->lp_tokens) return json_null();
  json_t *v = json_pack("{s:o,s:o,s:o,s:o}", "tokens", o->lp_tokens, "token_logprobs", o->lp_values,
                        "top_logprobs", o->lp_tops, "text_offset", o->lp_offsets);
  o->lp_tokens = json_array();
  o->lp_values = json_array();
  o->lp_tops = json_array();
  o->lp_offsets = json_array();
  return v;
}

/* ---- bodies ---------------------------------------------------------------------------------- */

static json_t *usage_json(const lm_srv_gen *g) {
  const lm_srv_finish *f = &g->fin;
  return json_pack("{s:I,s:I,s:I,s:{s:I}}", "prompt_tokens", (json_int_t)f->prompt_tokens,
                   "completion_tokens", (json_int_t)f->completion_tokens, "total_tokens",
                   (json_int_t)(f->prompt_tokens + f->completion_tokens), "prompt_tokens_details",
                   "cached_tokens", (json_int_t)f->cached_tokens);
}

static json_t *envelope(oai *o, const char *object, json_t *choices) {
  return json_pack("{s:s,s:s,s:I,s:s,s:s,s:o}", "id", o->g->id, "object", object, "created",
                   (json_int_t)o->g->created, "model", o->srv->model_id, "system_fingerprint",
                   "lumen-" LUMEN_VERSION, "choices", choices);
}

static json_t *calls_json(const lm_srv_gen *g) {
  json_t *a = json_array();
  for (int i = 0; i < g->n_calls; i++)
    json_array_append_new(a, json_pack("{s:s,s:s,s:{s:s,s:s}}", "id", g->calls[i].id, "type",
                                       "function", "function", "name", g->calls[i].name,
                                       "arguments", g->calls[i].arguments));
  return a;
}

static json_t *chat_body(oai *o) {
  const lm_srv_gen *g = o->g;
  size_t nc, nr;
  const char *content = lm_srv_gen_content(g, &nc), *reasoning = lm_srv_gen_reasoning(g, &nr);
  json_t *msg = json_pack("{s:s}", "role", "assistant");
  json_object_set_new(msg, "content", nc || !g->n_calls ? json_stringn(content, nc) : json_null());
  if (reasoning) json_object_set_new(msg, "reasoning_content", json_stringn(reasoning, nr));
  if (g->n_calls) json_object_set_new(msg, "tool_calls", calls_json(g));
  json_t *choice = json_pack("{s:i,s:o,s:o,s:s}", "index", 0, "message", msg, "logprobs",
                             take_logprobs(o), "finish_reason", lm_srv_gen_finish_reason(g));
  json_t *body = envelope(o, "chat.completion", json_pack("[o]", choice));
  json_object_set_new(body, "usage", usage_json(g));
  return body;
}

static json_t *completion_body(oai *o) {
  size_t n;
  const char *text = lm_srv_gen_content(o->g, &n);
  json_t *choice =
      json_pack("{s:o,s:i,s:o,s:s}", "text", json_stringn(text, n), "index", 0, "logprobs",
                take_logprobs(o), "finish_reason", lm_srv_gen_finish_reason(o->g));
  json_t *body = envelope(o, "text_completion", json_pack("[o]", choice));
  json_object_set_new(body, "usage", usage_json(o->g));
  return body;
}

/* ---- streaming ------------------------------------------------------------------------------- */

static lm_status send_chunk(oai *o, json_t *delta, const char *finish) {
  json_t *choice,
      *lp = (o->lp && !json_array_size(o->lp)) || (o->lp_tokens && !json_array_size(o->lp_tokens))
                ? json_null()
                : take_logprobs(o);
  if (o->chat) {
    choice = json_pack("{s:i,s:o,s:o,s:o}", "index", 0, "delta", delta, "logprobs", lp,
                       "finish_reason", finish ? json_string(finish) : json_null());
  } else {
    choice = json_pack("{s:o,s:i,s:o,s:o}", "text", delta, "index", 0, "logprobs", lp,
                       "finish_reason", finish ? json_string(finish) : json_null());
  }
  json_t *c =
      envelope(o, o->chat ? "chat.completion.chunk" : "text_completion", json_pack("[o]", choice));
  if (o->include_usage) json_object_set_new(c, "usage", json_null());
  return lm_srv_sse_data(&o->base.out, c);
}

static lm_status on_content(void *u, const char *t, size_t n) {
  oai *o = u;
  if (!n) return LM_OK;
  return send_chunk(
      o, o->chat ? json_pack("{s:o}", "content", json_stringn(t, n)) : json_stringn(t, n), NULL);
}

static lm_status on_reasoning(void *u, const char *t, size_t n) {
  oai *o = u;
  if (!n) return LM_OK;
  return send_chunk(o, json_pack("{s:o}", "reasoning_content", json_stringn(t, n)), NULL);
}

static lm_status on_tool_call(void *u, int index, const char *id, const char *name,
                              const char *args) {
  oai *o = u;
  json_t *call = json_pack("{s:i,s:s,s:s,s:{s:s,s:s}}", "index", index, "id", id, "type",
                           "function", "function", "name", name, "arguments", args);
  return send_chunk(o, json_pack("{s:[o]}", "tool_calls", call), NULL);
}

static lm_status stream_end(oai *o) {
  lm_srv_err e;
  if (lm_srv_gen_error(o->g, &e)) {
    char *s = lm_srv_err_openai_json(&e);
    lm_status st = lm_srv_sse_raw(&o->base.out, "data: ");
    if (!st && s) st = lm_srv_sse_raw(&o->base.out, s);
    free(s);
    if (!st) st = lm_srv_sse_raw(&o->base.out, "\n\ndata: [DONE]\n\n");
    return st;
  }
  LM_TRY(send_chunk(o, o->chat ? json_object() : json_string(""), lm_srv_gen_finish_reason(o->g)));
  if (o->include_usage) {
    json_t *c = envelope(o, o->chat ? "chat.completion.chunk" : "text_completion", json_array());
    json_object_set_new(c, "usage", usage_json(o->g));
    LM_TRY(lm_srv_sse_data(&o->base.out, c));
  }
  return lm_srv_sse_raw(&o->base.out, "data: [DONE]\n\n");
}

static int produce(lm_srv_stream *st, int timeout_ms) {
  oai *o = (oai *)st;
  if (o->chat && !o->sent_role) {
    o->sent_role = 1;
    return send_chunk(o, json_pack("{s:s,s:s}", "role", "assistant", "content", ""), NULL) ? -1 : 0;
  }
  int r = lm_srv_gen_pump(o->g, timeout_ms);
  if (r < 0) return -1;
  if (r == 0) return 0;
  return stream_end(o) ? -1 : 1;
}

static void oai_free(oai *o) {
  if (!o) return;
  lm_srv_gen_free(o->g);
  json_decref(o->lp);
  json_decref(o->lp_tokens);
  json_decref(o->lp_values);
  json_decref(o->lp_tops);
  json_decref(o->lp_offsets);
  lm_srv_buf_free(&o->base.out);
  free(o);
}

static void destroy(lm_srv_stream *st) { oai_free((oai *)st); }

/* ---- the endpoints --------------------------------------------------------------------------- */

static oai *oai_new(lm_server *s, int chat, const lm_srv_params *p) {
  oai *o = calloc(1, sizeof *o);
  if (!o) return NULL;
  o->srv = s;
  o->chat = chat;
  o->include_usage = p->stream && p->include_usage;
  o->base.produce = produce;
  o->base.destroy = destroy;
  if (p->top_logprobs >= 0 && chat) o->lp = json_array();
  if (p->top_logprobs >= 0 && !chat) {
    o->lp_tokens = json_array();
    o->lp_values = json_array();
    o->lp_tops = json_array();
    o->lp_offsets = json_array();
  }
  return o;
}

/* The non-streamed reply, once the generation has ended (lm_srv_later). */
static void answer(void *u, int r, lm_srv_reply *rp) {
  oai *o = u;
  lm_srv_err e;
  if (r < 0)
    lm_srv_reply_error(
        rp, &(lm_srv_err){.http = 500, .type = "server_error", .message = "output failed"}, 0);
  else if (lm_srv_gen_error(o->g, &e))
    lm_srv_reply_error(rp, &e, 0);
  else
    lm_srv_reply_json(rp, 200, o->chat ? chat_body(o) : completion_body(o));
  oai_free(o);
}

static void drop(void *u) { oai_free(u); }

/* Runs a parsed request: starts the generation, then streams it or has the HTTP layer wait for
 * the whole body without holding a thread. */
static void run(const lm_srv_http_req *rq, lm_srv_params *p, int chat, lm_srv_reply *rp) {
  lm_srv_err e;
  oai *o = oai_new(rq->srv, chat, p);
  if (!o) {
    lm_srv_err_set(&e, 500, "server_error", NULL, NULL, "out of memory");
    lm_srv_reply_error(rp, &e, 0);
    return;
  }
  lm_srv_sink sink = {.token = p->top_logprobs >= 0 ? on_token : NULL, .u = o};
  if (p->stream) {
    sink.content = on_content;
    sink.reasoning = on_reasoning;
    sink.tool_call = on_tool_call;
  }
  if (lm_srv_gen_start(rq->srv, p, chat, &sink, chat ? "chatcmpl-" : "cmpl-", "call_", &o->g, &e)) {
    oai_free(o);
    lm_srv_reply_error(rp, &e, 0);
    return;
  }
  if (p->stream) {
    lm_srv_reply_stream(rp, &o->base);
    return;
  }
  lm_srv_reply_later(rp, o->g, o, answer, drop);
}

void lm_srv_openai_chat(const lm_srv_http_req *rq, const json_t *body, lm_srv_reply *rp) {
  lm_server *s = rq->srv;
  lm_srv_params p;
  lm_srv_err e;
  lm_srv_params_init(&p);
  if (lm_srv_parse_common(body, &s->defaults, s->ci.vocab_size, &p, &e) ||
      lm_srv_parse_chat(body, &p, &e))
    lm_srv_reply_error(rp, &e, 0);
  else
    run(rq, &p, 1, rp);
  lm_srv_params_clear(&p);
}

void lm_srv_openai_completions(const lm_srv_http_req *rq, const json_t *body, lm_srv_reply *rp) {
  lm_server *s = rq->srv;
  lm_srv_params p;
  lm_srv_err e;
  lm_srv_params_init(&p);
  if (lm_srv_parse_common(body, &s->defaults, s->ci.vocab_size, &p, &e) ||
      lm_srv_parse_completion(body, s->ci.vocab_size, &p, &e))
    lm_srv_reply_error(rp, &e, 0);
  else
    run(rq, &p, 0, rp);
  lm_srv_params_clear(&p);
}

static json_t *model_json(const lm_server *s) {
  return json_pack("{s:s,s:s,s:I,s:s,s:I}", "id", s->model_id, "object", "model", "created",
                   (json_int_t)s->t_created, "owned_by", "lumen", "context_window",
                   (json_int_t)s->ei.context);
}

void lm_srv_openai_models(const lm_srv_http_req *rq, lm_srv_reply *rp) {
  lm_server *s = rq->srv;
  if (!strncmp(rq->path, "/v1/models/", 11)) {
    if (!strcmp(rq->path + 11, s->model_id)) {
      lm_srv_reply_json(rp, 200, model_json(s));
      return;
    }
    lm_srv_err e;
    lm_srv_err_set(&e, 404, "invalid_request_error", "model_not_found", "model",
                   "the model '%.200s' does not exist", rq->path + 11);
    lm_srv_reply_error(rp, &e, 0);
    return;
  }
  lm_srv_reply_json(rp, 200, json_pack("{s:s,s:[o]}", "object", "list", "data", model_json(s)));
}
