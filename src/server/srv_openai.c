/* srv_openai.c — the OpenAI protocol: POST /v1/chat/completions, POST /v1/completions (streamed as
 * SSE chunks ending in "data: [DONE]", or one JSON body), GET /v1/models (every served id).
 *
 * n > 1 choices are n generations of one prompt with one prefill: the first is queued with
 * share_prompt, and the others once its prompt is prefilled (they find it in the prefix cache and
 * prefill one token each). Streamed chunks carry each choice's index; usage counts the prompt once.
 *
 * Chat output comes from the output parser: content and reasoning_content deltas, and a
 * tool_calls delta per call when its closing token arrives (finish_reason "tool_calls").
 * Log-probabilities are of the model's distribution before the sampling processors (after a
 * request's constraint, which removes the tokens its grammar forbids), in
 * OpenAI's chat shape ({content: [{token, logprob, bytes, top_logprobs}]}) or completions shape
 * ({tokens, token_logprobs, top_logprobs, text_offset}). */
#include <stdlib.h>
#include <string.h>

#include "server/srv_adapters.h"
#include "server/srv_gen.h"
#include "server/srv_route.h"

typedef struct oai oai;

/* One of the n choices: its generation and what it has not yet sent. */
typedef struct choice {
  oai *o;
  int index;
  lm_srv_gen *g;
  int ended;  /* streamed: its last chunk is out */
  json_t *lp; /* chat: entries not yet sent (stream) or all (body) */
  json_t *lp_tokens, *lp_values, *lp_tops, *lp_offsets; /* completions */
  size_t offset; /* completions: text offset of the next token */
} choice;

struct oai {
  lm_srv_stream base; /* when streaming */
  lm_server *srv;
  const char *model; /* the id the response reports */
  int chat, include_usage, sent_role;
  int n, begun;    /* choices, and how many have been queued */
  choice *ch;      /* [n] */
  lm_srv_err fail; /* http != 0: a choice could not be queued */
};

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

static lm_status chat_token(choice *c, const lm_event *t) {
  lm_server *s = c->o->srv;
  json_t *e = chat_lp_entry(s, t->token, t->logprob), *tops = json_array();
  for (int k = 0; k < t->n_top; k++)
    json_array_append_new(tops, chat_lp_entry(s, t->top_ids[k], t->top_logprobs[k]));
  json_object_set_new(e, "top_logprobs", tops);
  return json_array_append_new(c->lp, e) ? LM_ERRF(LM_ERR_NOMEM, "out of memory") : LM_OK;
}

static lm_status completion_token(choice *c, const lm_event *t) {
  lm_server *s = c->o->srv;
  json_t *tops = json_object();
  for (int k = 0; k < t->n_top; k++) {
    size_t n;
    char *txt = lm_srv_token_text(s, t->top_ids[k], &n);
    json_object_setn_new(tops, txt ? txt : "", txt ? n : 0, json_real(t->top_logprobs[k]));
    free(txt);
  }
  json_array_append_new(c->lp_tokens, token_json(s, t->token, NULL));
  json_array_append_new(c->lp_values, json_real(t->logprob));
  json_array_append_new(c->lp_tops, tops);
  json_array_append_new(c->lp_offsets, json_integer((json_int_t)c->offset));
  return LM_OK;
}

static lm_status on_token(void *u, const lm_event *t) {
  choice *c = u;
  lm_status s = c->o->chat ? chat_token(c, t) : completion_token(c, t);
  c->offset += t->len; /* text_offset: where the next token's text starts */
  return s;
}

/* The logprobs value of a choice (takes what is pending when streaming). NULL: json null. */
static json_t *take_logprobs(choice *c) {
  if (c->o->chat) {
    if (!c->lp) return json_null();
    json_t *v = json_pack("{s:o}", "content",
                          c->lp); /* the arrays move into the value; new ones collect on */
    c->lp = json_array();
    return v;
  }
  if (!c->lp_tokens) return json_null();
  json_t *v = json_pack("{s:o,s:o,s:o,s:o}", "tokens", c->lp_tokens, "token_logprobs", c->lp_values,
                        "top_logprobs", c->lp_tops, "text_offset", c->lp_offsets);
  c->lp_tokens = json_array();
  c->lp_values = json_array();
  c->lp_tops = json_array();
  c->lp_offsets = json_array();
  return v;
}

/* ---- bodies ---------------------------------------------------------------------------------- */

/* The prompt is counted once (every choice has the same), the completions summed. */
static json_t *usage_json(const oai *o) {
  const lm_srv_finish *f = &o->ch[0].g->fin;
  int64_t completion = 0;
  for (int i = 0; i < o->n; i++)
    completion += o->ch[i].g->fin.completion_tokens;
  return json_pack("{s:I,s:I,s:I,s:{s:I}}", "prompt_tokens", (json_int_t)f->prompt_tokens,
                   "completion_tokens", (json_int_t)completion, "total_tokens",
                   (json_int_t)(f->prompt_tokens + completion), "prompt_tokens_details",
                   "cached_tokens", (json_int_t)f->cached_tokens);
}

static json_t *envelope(const oai *o, const char *object, json_t *choices) {
  const lm_srv_gen *g = o->ch[0].g;
  return json_pack("{s:s,s:s,s:I,s:s,s:s,s:o}", "id", g->id, "object", object, "created",
                   (json_int_t)g->created, "model", o->model, "system_fingerprint",
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

static json_t *chat_choice(choice *c) {
  const lm_srv_gen *g = c->g;
  size_t nc, nr;
  const char *content = lm_srv_gen_content(g, &nc), *reasoning = lm_srv_gen_reasoning(g, &nr);
  json_t *msg = json_pack("{s:s}", "role", "assistant");
  json_object_set_new(msg, "content", nc || !g->n_calls ? json_stringn(content, nc) : json_null());
  if (reasoning) json_object_set_new(msg, "reasoning_content", json_stringn(reasoning, nr));
  if (g->n_calls) json_object_set_new(msg, "tool_calls", calls_json(g));
  return json_pack("{s:i,s:o,s:o,s:s}", "index", c->index, "message", msg, "logprobs",
                   take_logprobs(c), "finish_reason", lm_srv_gen_finish_reason(g));
}

static json_t *completion_choice(choice *c) {
  size_t n;
  const char *text = lm_srv_gen_content(c->g, &n);
  return json_pack("{s:o,s:i,s:o,s:s}", "text", json_stringn(text, n), "index", c->index,
                   "logprobs", take_logprobs(c), "finish_reason", lm_srv_gen_finish_reason(c->g));
}

static json_t *body_json(oai *o) {
  json_t *choices = json_array();
  for (int i = 0; i < o->n; i++)
    json_array_append_new(choices, o->chat ? chat_choice(&o->ch[i]) : completion_choice(&o->ch[i]));
  json_t *body = envelope(o, o->chat ? "chat.completion" : "text_completion", choices);
  json_object_set_new(body, "usage", usage_json(o));
  return body;
}

/* ---- the choices ----------------------------------------------------------------------------- */

/* Queues the other choices once the first one's prompt is prefilled: its caches are then in the
 * prefix cache (share_prompt), so each of them prefills one token. Returns 1 when the answer is
 * an error now (the first failed, or another could not be queued: o->fail says why), else 0. */
static int begin_rest(oai *o) {
  if (o->begun == o->n || !lm_srv_gen_prefilled(o->ch[0].g)) return 0;
  lm_srv_err e;
  if (lm_srv_gen_error(o->ch[0].g, &e)) return 1;
  for (; o->begun < o->n; o->begun++)
    if (lm_srv_gen_begin(o->ch[o->begun].g, &o->fail)) return 1;
  return 0;
}

/* The first failed choice's error (0: none failed). */
static int choices_error(const oai *o, lm_srv_err *e) {
  if (o->fail.http) {
    *e = o->fail;
    return e->http;
  }
  for (int i = 0; i < o->begun; i++)
    if (o->ch[i].g->done && lm_srv_gen_error(o->ch[i].g, e)) return e->http;
  return 0;
}

/* ---- streaming ------------------------------------------------------------------------------- */

static lm_status send_chunk(choice *c, json_t *delta, const char *finish) {
  oai *o = c->o;
  json_t *ch,
      *lp = (c->lp && !json_array_size(c->lp)) || (c->lp_tokens && !json_array_size(c->lp_tokens))
                ? json_null()
                : take_logprobs(c);
  if (o->chat) {
    ch = json_pack("{s:i,s:o,s:o,s:o}", "index", c->index, "delta", delta, "logprobs", lp,
                   "finish_reason", finish ? json_string(finish) : json_null());
  } else {
    ch = json_pack("{s:o,s:i,s:o,s:o}", "text", delta, "index", c->index, "logprobs", lp,
                   "finish_reason", finish ? json_string(finish) : json_null());
  }
  json_t *chunk =
      envelope(o, o->chat ? "chat.completion.chunk" : "text_completion", json_pack("[o]", ch));
  if (o->include_usage) json_object_set_new(chunk, "usage", json_null());
  return lm_srv_sse_data(&o->base.out, chunk);
}

static lm_status on_content(void *u, const char *t, size_t n) {
  choice *c = u;
  if (!n) return LM_OK;
  return send_chunk(
      c, c->o->chat ? json_pack("{s:o}", "content", json_stringn(t, n)) : json_stringn(t, n), NULL);
}

static lm_status on_reasoning(void *u, const char *t, size_t n) {
  choice *c = u;
  if (!n) return LM_OK;
  return send_chunk(c, json_pack("{s:o}", "reasoning_content", json_stringn(t, n)), NULL);
}

static lm_status on_tool_call(void *u, int index, const char *id, const char *name,
                              const char *args) {
  choice *c = u;
  json_t *call = json_pack("{s:i,s:s,s:s,s:{s:s,s:s}}", "index", index, "id", id, "type",
                           "function", "function", "name", name, "arguments", args);
  return send_chunk(c, json_pack("{s:[o]}", "tool_calls", call), NULL);
}

/* A failed stream ends with the error as its last data, then [DONE]. */
static lm_status stream_error(oai *o, const lm_srv_err *e) {
  char *s = lm_srv_err_openai_json(e);
  lm_status st = lm_srv_sse_raw(&o->base.out, "data: ");
  if (!st && s) st = lm_srv_sse_raw(&o->base.out, s);
  free(s);
  if (!st) st = lm_srv_sse_raw(&o->base.out, "\n\ndata: [DONE]\n\n");
  return st;
}

static lm_status stream_end(oai *o) {
  if (o->include_usage) {
    json_t *c = envelope(o, o->chat ? "chat.completion.chunk" : "text_completion", json_array());
    json_object_set_new(c, "usage", usage_json(o));
    LM_TRY(lm_srv_sse_data(&o->base.out, c));
  }
  return lm_srv_sse_raw(&o->base.out, "data: [DONE]\n\n");
}

/* Pumps every queued choice that has not ended; the ones that end send their last chunk. Returns
 * 1 when all have ended, 0 when some go on, -1 on a sink failure. */
static int pump_choices(oai *o, int timeout_ms, int stream) {
  for (int i = 0; i < o->begun; i++) {
    choice *c = &o->ch[i];
    if (c->ended) continue;
    int r = lm_srv_gen_pump(c->g, i ? 0 : timeout_ms);
    if (r < 0) return -1;
    if (r == 0) continue;
    c->ended = 1;
    lm_srv_err e;
    if (stream && !lm_srv_gen_error(c->g, &e) &&
        send_chunk(c, o->chat ? json_object() : json_string(""), lm_srv_gen_finish_reason(c->g)))
      return -1;
  }
  if (begin_rest(o)) return 1; /* that error is the answer */
  for (int i = 0; i < o->n; i++)
    if (i >= o->begun || !o->ch[i].ended) return 0;
  return 1;
}

static int produce(lm_srv_stream *st, int timeout_ms) {
  oai *o = (oai *)st;
  if (o->chat && !o->sent_role) {
    o->sent_role = 1;
    for (int i = 0; i < o->n; i++)
      if (send_chunk(&o->ch[i], json_pack("{s:s,s:s}", "role", "assistant", "content", ""), NULL))
        return -1;
    return 0;
  }
  int r = pump_choices(o, timeout_ms, 1);
  if (r <= 0) return r;
  lm_srv_err e;
  if (choices_error(o, &e)) return stream_error(o, &e) ? -1 : 1;
  return stream_end(o) ? -1 : 1;
}

static void choice_clear(choice *c) {
  lm_srv_gen_free(c->g);
  json_decref(c->lp);
  json_decref(c->lp_tokens);
  json_decref(c->lp_values);
  json_decref(c->lp_tops);
  json_decref(c->lp_offsets);
}

static void oai_free(oai *o) {
  if (!o) return;
  for (int i = 0; o->ch && i < o->n; i++)
    choice_clear(&o->ch[i]);
  free(o->ch);
  lm_srv_buf_free(&o->base.out);
  free(o);
}

static void destroy(lm_srv_stream *st) { oai_free((oai *)st); }

/* ---- the endpoints --------------------------------------------------------------------------- */

static oai *oai_new(const lm_srv_http_req *rq, int chat, const lm_srv_params *p) {
  oai *o = calloc(1, sizeof *o);
  if (!o || !(o->ch = calloc((size_t)p->n, sizeof *o->ch))) {
    free(o);
    return NULL;
  }
  o->srv = rq->srv;
  o->model = rq->model ? rq->model : rq->srv->model_id;
  o->chat = chat;
  o->n = p->n;
  o->include_usage = p->stream && p->include_usage;
  o->base.produce = produce;
  o->base.destroy = destroy;
  for (int i = 0; i < o->n; i++) {
    choice *c = &o->ch[i];
    c->o = o;
    c->index = i;
    if (p->top_logprobs >= 0 && chat) c->lp = json_array();
    if (p->top_logprobs >= 0 && !chat) {
      c->lp_tokens = json_array();
      c->lp_values = json_array();
      c->lp_tops = json_array();
      c->lp_offsets = json_array();
    }
  }
  return o;
}

/* The non-streamed reply, once every choice has ended (lm_srv_later). */
static void answer(void *u, int r, lm_srv_reply *rp) {
  oai *o = u;
  lm_srv_err e;
  if (r < 0)
    lm_srv_reply_error(
        rp, &(lm_srv_err){.http = 500, .type = "server_error", .message = "output failed"}, 0);
  else if (choices_error(o, &e))
    lm_srv_reply_error(rp, &e, 0);
  else
    lm_srv_reply_json(rp, 200, body_json(o));
  oai_free(o);
}

static int pump_later(void *u) { return pump_choices(u, 0, 0); }

static void drop(void *u) { oai_free(u); }

/* Builds every choice's generation and queues the first (the others follow once its prompt is
 * prefilled). 0 or the HTTP status of e. */
static int start_choices(const lm_srv_http_req *rq, lm_srv_params *p, oai *o, lm_srv_err *e) {
  lm_srv_sink sink = {.token = p->top_logprobs >= 0 ? on_token : NULL};
  if (p->stream) {
    sink.content = on_content;
    sink.reasoning = on_reasoning;
    sink.tool_call = on_tool_call;
  }
  for (int i = 0; i < o->n; i++) {
    sink.u = &o->ch[i];
    p->choice = i;
    int r = lm_srv_gen_create(rq->srv, p, o->chat, &sink, o->chat ? "chatcmpl-" : "cmpl-", "call_",
                              &o->ch[i].g, e);
    if (r) return r;
    lm_srv_gen_track(o->ch[i].g, rq->tally);
  }
  p->choice = 0;
  int r = lm_srv_gen_begin(o->ch[0].g, e);
  if (!r) o->begun = 1;
  return r;
}

/* Runs a parsed request: starts the generations, then streams them or has the HTTP layer wait
 * for the whole body without holding a thread. */
static void run(const lm_srv_http_req *rq, lm_srv_params *p, int chat, lm_srv_reply *rp) {
  lm_srv_err e;
  oai *o = oai_new(rq, chat, p);
  if (!o) {
    lm_srv_err_set(&e, 500, "server_error", NULL, NULL, "out of memory");
    lm_srv_reply_error(rp, &e, 0);
    return;
  }
  if (start_choices(rq, p, o, &e)) {
    oai_free(o);
    lm_srv_reply_error(rp, &e, 0);
    return;
  }
  if (p->stream) {
    lm_srv_reply_stream(rp, &o->base);
    return;
  }
  if (o->n == 1)
    lm_srv_reply_later(rp, o->ch[0].g, o, answer, drop);
  else
    lm_srv_reply_later_n(rp, o, pump_later, answer, drop);
}

void lm_srv_openai_chat(const lm_srv_http_req *rq, const json_t *body, lm_srv_reply *rp) {
  lm_server *s = rq->srv;
  lm_srv_params p;
  lm_srv_err e;
  lm_srv_params_init(&p);
  p.adapters = rq->adapters;
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
  p.adapters = rq->adapters;
  if (lm_srv_parse_common(body, &s->defaults, s->ci.vocab_size, &p, &e) ||
      lm_srv_parse_completion(body, s->ci.vocab_size, &p, &e))
    lm_srv_reply_error(rp, &e, 0);
  else
    run(rq, &p, 0, rp);
  lm_srv_params_clear(&p);
}

static json_t *model_json(const lm_server *s, const char *id) {
  return json_pack("{s:s,s:s,s:I,s:s,s:I}", "id", id, "object", "model", "created",
                   (json_int_t)s->t_created, "owned_by", "lumen", "context_window",
                   (json_int_t)s->ei.context);
}

/* BASE:ADAPTER, the model id of the served model with mounted adapters (parent: BASE). */
static json_t *adapter_model_json(const lm_server *s, const char *base, const char *id) {
  json_t *m = model_json(s, id);
  if (m) json_object_set_new(m, "parent", json_string(base));
  return m;
}

/* Whether id is BASE:ADAPTER with every adapter of it mounted (the parent into *base). */
static int adapter_model(lm_server *s, const char *id, const char **base) {
  lm_srv_adapters a;
  lm_srv_err e;
  memset(&a, 0, sizeof a);
  if (lm_srv_adapters_from_model(s, id, base, &a, &e)) return 0;
  lm_adapter_info *v;
  int n = lm_srv_adapters_mounted(s, &v), found = 0;
  for (int i = 0; i < a.n; i++)
    for (int j = 0; j < n; j++)
      if (!strcmp(a.name[i], v[j].name)) {
        found++;
        break;
      }
  free(v);
  return a.n > 0 && found == a.n;
}

/* The served ids, then BASE:NAME (BASE the first served id) for each mounted adapter. */
static json_t *models_json(lm_server *s) {
  json_t *data = json_array();
  for (int i = 0; i < s->n_ids; i++)
    json_array_append_new(data, model_json(s, s->ids[i]));
  lm_adapter_info *v;
  int n = lm_srv_adapters_mounted(s, &v);
  for (int i = 0; i < n; i++) {
    char id[LM_ADAPTER_NAME_MAX + 260];
    snprintf(id, sizeof id, "%s:%s", s->model_id, v[i].name);
    json_array_append_new(data, adapter_model_json(s, s->model_id, id));
  }
  free(v);
  return json_pack("{s:s,s:o}", "object", "list", "data", data);
}

void lm_srv_openai_models(const lm_srv_http_req *rq, lm_srv_reply *rp) {
  lm_server *s = rq->srv;
  if (!strncmp(rq->path, "/v1/models/", 11)) {
    const char *id = lm_srv_model_served(s, rq->path + 11), *base = NULL;
    if (id) {
      lm_srv_reply_json(rp, 200, model_json(s, id));
      return;
    }
    if (adapter_model(s, rq->path + 11, &base)) {
      lm_srv_reply_json(rp, 200, adapter_model_json(s, base, rq->path + 11));
      return;
    }
    lm_srv_err e;
    lm_srv_err_set(&e, 404, "invalid_request_error", "model_not_found", "model",
                   "the model '%.200s' does not exist", rq->path + 11);
    lm_srv_reply_error(rp, &e, 0);
    return;
  }
  lm_srv_reply_json(rp, 200, models_json(s));
}
