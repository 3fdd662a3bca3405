/* srv_responses.c — the OpenAI Responses API: POST /v1/responses, GET and DELETE
 * /v1/responses/ID.
 *
 * A request is translated into the chat shape (srv_resp.h) and generated like a chat completion;
 * its output becomes items: `reasoning` (reasoning_text content), `message` (one output_text
 * part) and one `function_call` per tool call (call_id, name, arguments). The response is
 * "completed", or "incomplete" with incomplete_details.reason "max_output_tokens" when it hit its
 * token limit.
 *
 * Streaming follows OpenAI's event grammar, every event with its type and a sequence_number from
 * 0: response.created, response.in_progress, then per item response.output_item.added, for text
 * response.content_part.added, its deltas (response.output_text.delta or
 * response.reasoning_text.delta), the matching .done and response.content_part.done, for calls
 * response.function_call_arguments.delta and .done, then response.output_item.done; at the end
 * response.completed or response.incomplete (or response.failed), carrying the whole response.
 *
 * Unless the request says store: false, the response and the conversation it ended are kept in
 * the server's bounded store (srv_store.h), so that a later request can continue it with
 * previous_response_id; an id the store does not hold (never seen, evicted, expired) is a 404. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "server/srv_gen.h"
#include "server/srv_resp.h"
#include "server/srv_route.h"
#include "server/srv_store.h"

enum { OPEN_NONE = 0, OPEN_MESSAGE, OPEN_REASONING };

typedef struct resp {
  lm_srv_stream base; /* when streaming */
  lm_server *srv;
  lm_srv_gen *g;
  const char *model;
  json_t *echo;    /* the request's fields the response repeats */
  json_t *context; /* the conversation before the output: history, then this input */
  int store;
  int started;
  int64_t seq;    /* the next event's sequence_number */
  json_t *output; /* streamed: the items closed so far */
  int open;       /* the kind of the item being streamed */
  char item_id[80];
  char *text; /* the open item's text so far */
  size_t n, cap;
} resp;

/* ---- the response object --------------------------------------------------------------------- */

static void item_id(const resp *r, const char *prefix, size_t index, char *out, size_t n) {
  snprintf(out, n, "%s_%s_%zu", prefix, r->g->id + 5, index); /* g->id is resp_<hex> */
}

static int64_t count_tokens(const lm_server *s, const char *t, size_t n) {
  int32_t *ids = NULL;
  int64_t k = 0;
  if (lm_checkpoint_tokenize(s->ck, t, n, 0, &ids, &k)) k = 0;
  lm_free(ids);
  return k;
}

static json_t *usage_json(const resp *r) {
  const lm_srv_finish *f = &r->g->fin;
  size_t nr = 0;
  const char *reasoning = lm_srv_gen_reasoning(r->g, &nr);
  /* the engine does not tell reasoning tokens apart: the reasoning text's own token count */
  int64_t rt = reasoning ? count_tokens(r->srv, reasoning, nr) : 0;
  if (rt > f->completion_tokens) rt = f->completion_tokens;
  return json_pack("{s:I,s:{s:I},s:I,s:{s:I},s:I}", "input_tokens", (json_int_t)f->prompt_tokens,
                   "input_tokens_details", "cached_tokens", (json_int_t)f->cached_tokens,
                   "output_tokens", (json_int_t)f->completion_tokens, "output_tokens_details",
                   "reasoning_tokens", (json_int_t)rt, "total_tokens",
                   (json_int_t)(f->prompt_tokens + f->completion_tokens));
}

static int incomplete(const resp *r) { return r->g->done && r->g->fin.kind == LM_FIN_LENGTH; }

/* The response with its status and output (taken); usage once it has ended. */
static json_t *response_json(const resp *r, const char *status, json_t *output) {
  json_t *o = json_pack(
      "{s:s,s:s,s:I,s:s,s:b,s:n,s:o}", "id", r->g->id, "object", "response", "created_at",
      (json_int_t)r->g->created, "status", status, "background", 0, "error", "incomplete_details",
      !strcmp(status, "incomplete") ? json_pack("{s:s}", "reason", "max_output_tokens")
                                    : json_null());
  json_object_update(o, r->echo);
  json_object_set_new(o, "model", json_string(r->model));
  json_object_set_new(o, "output", output);
  json_object_set_new(o, "usage", r->g->done ? usage_json(r) : json_null());
  return o;
}

static const char *final_status(const resp *r) {
  return incomplete(r) ? "incomplete" : "completed";
}

static json_t *message_item(const char *id, const char *text, size_t n, const char *status) {
  return json_pack("{s:s,s:s,s:s,s:s,s:[{s:s,s:s%,s:[],s:[]}]}", "id", id, "type", "message",
                   "status", status, "role", "assistant", "content", "type", "output_text", "text",
                   text, n, "annotations", "logprobs");
}

static json_t *reasoning_item(const char *id, const char *text, size_t n) {
  return json_pack("{s:s,s:s,s:[],s:[{s:s,s:s%}],s:s}", "id", id, "type", "reasoning", "summary",
                   "content", "type", "reasoning_text", "text", text, n, "status", "completed");
}

static json_t *call_item(const char *id, const lm_srv_call *c, const char *status,
                         const char *args) {
  return json_pack("{s:s,s:s,s:s,s:s,s:s,s:s}", "id", id, "type", "function_call", "status", status,
                   "call_id", c->id, "name", c->name, "arguments", args);
}

/* The output of an ended generation: reasoning, the message, the calls. */
static json_t *output_json(const resp *r) {
  const lm_srv_gen *g = r->g;
  size_t nc, nr;
  const char *content = lm_srv_gen_content(g, &nc), *reasoning = lm_srv_gen_reasoning(g, &nr);
  json_t *out = json_array();
  char id[80];
  if (reasoning) {
    item_id(r, "rs", json_array_size(out), id, sizeof id);
    json_array_append_new(out, reasoning_item(id, reasoning, nr));
  }
  if (nc || !g->n_calls) {
    item_id(r, "msg", json_array_size(out), id, sizeof id);
    json_array_append_new(out, message_item(id, content, nc, final_status(r)));
  }
  for (int i = 0; i < g->n_calls; i++) {
    item_id(r, "fc", json_array_size(out), id, sizeof id);
    json_array_append_new(out, call_item(id, &g->calls[i], "completed", g->calls[i].arguments));
  }
  return out;
}

/* Keeps the response and its conversation (the context, then the answer as an assistant
 * message) for previous_response_id. */
static void store_response(const resp *r, const json_t *response) {
  if (!r->store || !r->srv->store) return;
  const lm_srv_gen *g = r->g;
  size_t nc, nr;
  const char *content = lm_srv_gen_content(g, &nc), *reasoning = lm_srv_gen_reasoning(g, &nr);
  json_t *m = json_pack("{s:s,s:s%}", "role", "assistant", "content", content, nc);
  if (reasoning) json_object_set_new(m, "reasoning_content", json_stringn(reasoning, nr));
  if (g->n_calls) {
    json_t *calls = json_array();
    for (int i = 0; i < g->n_calls; i++)
      json_array_append_new(calls, json_pack("{s:s,s:s,s:{s:s,s:s}}", "id", g->calls[i].id, "type",
                                             "function", "function", "name", g->calls[i].name,
                                             "arguments", g->calls[i].arguments));
    json_object_set_new(m, "tool_calls", calls);
  }
  json_t *conv = json_copy(r->context);
  if (conv && m) {
    json_array_append(conv, m);
    lm_srv_store_put(r->srv->store, g->id, response, conv); /* too big or no memory: not kept */
  }
  json_decref(m);
  json_decref(conv);
}

/* ---- streaming ------------------------------------------------------------------------------- */

/* One event: {type, sequence_number, ...fields} (fields taken). */
static lm_status event(resp *r, const char *type, json_t *fields) {
  json_t *o = json_pack("{s:s,s:I}", "type", type, "sequence_number", (json_int_t)r->seq++);
  if (o && fields) json_object_update(o, fields);
  json_decref(fields);
  return lm_srv_sse_event(&r->base.out, type, o);
}

static json_t *part_ref(const resp *r, size_t index) {
  return json_pack("{s:s,s:I,s:i}", "item_id", r->item_id, "output_index", (json_int_t)index,
                   "content_index", 0);
}

static lm_status open_item(resp *r, int kind) {
  if (r->open == kind) return LM_OK;
  size_t k = json_array_size(r->output);
  item_id(r, kind == OPEN_MESSAGE ? "msg" : "rs", k, r->item_id, sizeof r->item_id);
  json_t *item = kind == OPEN_MESSAGE
                     ? json_pack("{s:s,s:s,s:s,s:s,s:[]}", "id", r->item_id, "type", "message",
                                 "status", "in_progress", "role", "assistant", "content")
                     : json_pack("{s:s,s:s,s:[],s:[],s:s}", "id", r->item_id, "type", "reasoning",
                                 "summary", "content", "status", "in_progress");
  LM_TRY(event(r, "response.output_item.added",
               json_pack("{s:I,s:o}", "output_index", (json_int_t)k, "item", item)));
  json_t *part = kind == OPEN_MESSAGE
                     ? json_pack("{s:s,s:s,s:[],s:[]}", "type", "output_text", "text", "",
                                 "annotations", "logprobs")
                     : json_pack("{s:s,s:s}", "type", "reasoning_text", "text", "");
  json_t *f = part_ref(r, k);
  json_object_set_new(f, "part", part);
  LM_TRY(event(r, "response.content_part.added", f));
  r->open = kind;
  r->n = 0;
  return LM_OK;
}

static lm_status close_item(resp *r, const char *status) {
  if (!r->open) return LM_OK;
  int msg = r->open == OPEN_MESSAGE;
  r->open = OPEN_NONE;
  size_t k = json_array_size(r->output);
  const char *t = r->text ? r->text : "";
  json_t *f = part_ref(r, k);
  json_object_set_new(f, "text", json_stringn(t, r->n));
  if (msg) json_object_set_new(f, "logprobs", json_array());
  LM_TRY(event(r, msg ? "response.output_text.done" : "response.reasoning_text.done", f));
  json_t *item =
      msg ? message_item(r->item_id, t, r->n, status) : reasoning_item(r->item_id, t, r->n);
  f = part_ref(r, k);
  json_object_set(f, "part", json_array_get(json_object_get(item, "content"), 0));
  LM_TRY(event(r, "response.content_part.done", f));
  LM_TRY(event(r, "response.output_item.done",
               json_pack("{s:I,s:O}", "output_index", (json_int_t)k, "item", item)));
  return json_array_append_new(r->output, item) ? LM_ERRF(LM_ERR_NOMEM, "out of memory") : LM_OK;
}

static lm_status text_delta(resp *r, int kind, const char *t, size_t n) {
  if (!n) return LM_OK;
  LM_TRY(open_item(r, kind));
  LM_TRY(lm_buf_append(&r->text, &r->n, &r->cap, 1024, t, n));
  json_t *f = part_ref(r, json_array_size(r->output));
  json_object_set_new(f, "delta", json_stringn(t, n));
  if (kind == OPEN_MESSAGE) json_object_set_new(f, "logprobs", json_array());
  return event(
      r, kind == OPEN_MESSAGE ? "response.output_text.delta" : "response.reasoning_text.delta", f);
}

static lm_status on_content(void *u, const char *t, size_t n) {
  return text_delta(u, OPEN_MESSAGE, t, n);
}

static lm_status on_reasoning(void *u, const char *t, size_t n) {
  return text_delta(u, OPEN_REASONING, t, n);
}

static lm_status on_tool_call(void *u, int index, const char *id, const char *name,
                              const char *args) {
  resp *r = u;
  (void)id;
  (void)name;
  LM_TRY(close_item(r, "completed"));
  const lm_srv_call *c = &r->g->calls[index];
  size_t k = json_array_size(r->output);
  item_id(r, "fc", k, r->item_id, sizeof r->item_id);
  LM_TRY(event(r, "response.output_item.added",
               json_pack("{s:I,s:o}", "output_index", (json_int_t)k, "item",
                         call_item(r->item_id, c, "in_progress", ""))));
  LM_TRY(event(r, "response.function_call_arguments.delta",
               json_pack("{s:s,s:I,s:s}", "item_id", r->item_id, "output_index", (json_int_t)k,
                         "delta", args)));
  LM_TRY(event(r, "response.function_call_arguments.done",
               json_pack("{s:s,s:I,s:s,s:s}", "item_id", r->item_id, "output_index", (json_int_t)k,
                         "name", c->name, "arguments", args)));
  json_t *item = call_item(r->item_id, c, "completed", args);
  LM_TRY(event(r, "response.output_item.done",
               json_pack("{s:I,s:O}", "output_index", (json_int_t)k, "item", item)));
  return json_array_append_new(r->output, item) ? LM_ERRF(LM_ERR_NOMEM, "out of memory") : LM_OK;
}

static int has_answer(const resp *r) {
  const json_t *it;
  size_t i;
  json_array_foreach(r->output, i, it) {
    const char *t = json_string_value(json_object_get(it, "type"));
    if (t && (!strcmp(t, "message") || !strcmp(t, "function_call"))) return 1;
  }
  return 0;
}

static lm_status stream_end(resp *r) {
  lm_srv_err e;
  if (lm_srv_gen_error(r->g, &e)) {
    LM_TRY(close_item(r, "incomplete"));
    json_t *o = response_json(r, "failed", json_deep_copy(r->output));
    json_object_set_new(
        o, "error",
        json_pack("{s:s,s:s}", "code", e.code ? e.code : "server_error", "message", e.message));
    return event(r, "response.failed", json_pack("{s:o}", "response", o));
  }
  const char *status = final_status(r);
  LM_TRY(close_item(r, status));
  if (!has_answer(r)) { /* an empty answer is still a message */
    LM_TRY(open_item(r, OPEN_MESSAGE));
    LM_TRY(close_item(r, status));
  }
  json_t *o = response_json(r, status, json_deep_copy(r->output));
  store_response(r, o);
  return event(r, incomplete(r) ? "response.incomplete" : "response.completed",
               json_pack("{s:o}", "response", o));
}

static int produce(lm_srv_stream *st, int timeout_ms) {
  resp *r = (resp *)st;
  if (!r->started) {
    r->started = 1;
    lm_status s =
        event(r, "response.created",
              json_pack("{s:o}", "response", response_json(r, "in_progress", json_array())));
    if (!s)
      s = event(r, "response.in_progress",
                json_pack("{s:o}", "response", response_json(r, "in_progress", json_array())));
    return s ? -1 : 0;
  }
  int k = lm_srv_gen_pump(r->g, timeout_ms);
  if (k <= 0) return k;
  return stream_end(r) ? -1 : 1;
}

static void resp_free(resp *r) {
  if (!r) return;
  lm_srv_gen_free(r->g);
  json_decref(r->echo);
  json_decref(r->context);
  json_decref(r->output);
  free(r->text);
  lm_srv_buf_free(&r->base.out);
  free(r);
}

static void destroy(lm_srv_stream *st) { resp_free((resp *)st); }

/* ---- the request ----------------------------------------------------------------------------- */

static json_t *field_or(const json_t *req, const char *k, json_t *dflt) {
  const json_t *v = json_object_get(req, k);
  if (!v || json_is_null(v)) return dflt;
  json_decref(dflt);
  return json_incref((json_t *)v);
}

/* A float parameter as the client wrote it (0.95, not 0.94999998807907104). */
static double round6(float x) { return round((double)x * 1e6) / 1e6; }

/* What the response repeats of its request, with the values the generation used. */
static json_t *echo_json(const json_t *req, const lm_srv_params *p, int store) {
  const json_t *effort = json_object_get(json_object_get(req, "reasoning"), "effort");
  const json_t *fmt = json_object_get(json_object_get(req, "text"), "format");
  json_t *o = json_pack(
      "{s:o,s:o,s:o,s:o,s:o,s:{s:O,s:n},s:b,s:f,s:f,s:{s:o},s:o,s:o,s:o,s:o}", "instructions",
      field_or(req, "instructions", json_null()), "max_output_tokens",
      field_or(req, "max_output_tokens", json_null()), "metadata",
      field_or(req, "metadata", json_object()), "parallel_tool_calls",
      field_or(req, "parallel_tool_calls", json_true()), "previous_response_id",
      field_or(req, "previous_response_id", json_null()), "reasoning", "effort",
      effort ? effort : json_null(), "summary", "store", store, "temperature",
      round6(p->sampling.temperature), "top_p", round6(p->sampling.top_p), "text", "format",
      fmt && json_is_object(fmt) ? json_incref((json_t *)fmt) : json_pack("{s:s}", "type", "text"),
      "tool_choice", field_or(req, "tool_choice", json_string("auto")), "tools",
      field_or(req, "tools", json_array()), "truncation",
      field_or(req, "truncation", json_string("disabled")), "user",
      field_or(req, "user", json_null()));
  return o;
}

/* The conversation previous_response_id names (*out NULL when none is named). */
static int previous(lm_server *s, const json_t *req, json_t **out, lm_srv_err *e) {
  *out = NULL;
  const json_t *v = json_object_get(req, "previous_response_id");
  if (!v || json_is_null(v)) return 0;
  if (!json_is_string(v))
    return lm_srv_err_bad(e, "previous_response_id", "previous_response_id must be a string");
  int got = s->store ? lm_srv_store_get(s->store, json_string_value(v), NULL, out) : 0;
  if (got < 0) return lm_srv_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
  if (!got)
    return lm_srv_err_set(
        e, 404, "invalid_request_error", "previous_response_not_found", "previous_response_id",
        "Previous response with id '%.100s' not found (responses are kept %s)",
        json_string_value(v), s->store ? "for a while, in memory" : "only when the store is on");
  return 0;
}

/* The non-streamed reply, once the generation has ended (lm_srv_later). */
static void answer(void *u, int k, lm_srv_reply *rp) {
  resp *r = u;
  lm_srv_err e;
  if (k < 0)
    lm_srv_reply_error(
        rp, &(lm_srv_err){.http = 500, .type = "server_error", .message = "output failed"}, 0);
  else if (lm_srv_gen_error(r->g, &e))
    lm_srv_reply_error(rp, &e, 0);
  else {
    json_t *o = response_json(r, final_status(r), output_json(r));
    store_response(r, o);
    lm_srv_reply_json(rp, 200, o);
  }
  resp_free(r);
}

static void drop(void *u) { resp_free(u); }

static void run(const lm_srv_http_req *rq, lm_srv_params *p, resp *r, lm_srv_reply *rp) {
  lm_srv_err e;
  lm_srv_sink sink = {.u = r};
  if (p->stream) {
    sink.content = on_content;
    sink.reasoning = on_reasoning;
    sink.tool_call = on_tool_call;
  }
  p->prompt_param = "input";
  if (lm_srv_gen_start(rq->srv, p, 1, &sink, "resp_", "call_", &r->g, &e)) {
    resp_free(r);
    lm_srv_resp_param(&e);
    lm_srv_reply_error(rp, &e, 0);
    return;
  }
  lm_srv_gen_track(r->g, rq->tally);
  if (p->stream) {
    lm_srv_reply_stream(rp, &r->base);
    return;
  }
  lm_srv_reply_later(rp, r->g, r, answer, drop);
}

static resp *resp_new(const lm_srv_http_req *rq, const json_t *req, const lm_srv_params *p,
                      int store, json_t *history, json_t *turn) {
  resp *r = calloc(1, sizeof *r);
  if (!r) return NULL;
  r->srv = rq->srv;
  r->model = rq->model ? rq->model : rq->srv->model_id;
  r->store = store;
  r->base.produce = produce;
  r->base.destroy = destroy;
  r->echo = echo_json(req, p, store);
  r->output = json_array();
  r->context = history ? json_copy(history) : json_array();
  if (!r->echo || !r->output || !r->context || json_array_extend(r->context, turn)) {
    resp_free(r);
    return NULL;
  }
  return r;
}

void lm_srv_responses_create(const lm_srv_http_req *rq, const json_t *body, lm_srv_reply *rp) {
  lm_server *s = rq->srv;
  lm_srv_params p;
  lm_srv_err e;
  lm_srv_params_init(&p);
  p.adapters = rq->adapters;
  json_t *history = NULL, *turn = NULL, *chat = NULL;
  int store = 1;
  const json_t *sv = json_object_get(body, "store");
  int r = sv && !json_is_null(sv) && !json_is_boolean(sv)
              ? lm_srv_err_bad(&e, "store", "store must be a boolean")
              : 0;
  if (json_is_false(sv)) store = 0;
  if (!r) r = previous(s, body, &history, &e);
  if (!r) r = lm_srv_resp_request(body, history, &turn, &chat, &e);
  if (!r && (lm_srv_parse_common(chat, &s->defaults, s->ci.vocab_size, &p, &e) ||
             lm_srv_parse_chat(chat, &p, &e))) {
    lm_srv_resp_param(&e);
    r = e.http;
  }
  /* text.format: structured output, as chat's response_format (the flat Responses shape) */
  const json_t *fmt = json_object_get(json_object_get(body, "text"), "format");
  if (!r && fmt && !json_is_null(fmt) && lm_srv_parse_format(fmt, "text.format", &p, &e))
    r = e.http;
  resp *o = r ? NULL : resp_new(rq, body, &p, store, history, turn);
  if (!r && !o) r = lm_srv_err_set(&e, 500, "server_error", NULL, NULL, "out of memory");
  if (r)
    lm_srv_reply_error(rp, &e, 0);
  else
    run(rq, &p, o, rp);
  json_decref(history);
  json_decref(turn);
  json_decref(chat);
  lm_srv_params_clear(&p);
}

/* ---- stored responses ------------------------------------------------------------------------ */

static int not_found(const char *id, lm_srv_reply *rp) {
  lm_srv_err e;
  lm_srv_err_set(&e, 404, "invalid_request_error", "not_found", NULL,
                 "Response with id '%.100s' not found.", id);
  lm_srv_reply_error(rp, &e, 0);
  return 404;
}

void lm_srv_responses_get(const lm_srv_http_req *rq, lm_srv_reply *rp) {
  const char *id = rq->path + strlen("/v1/responses/");
  json_t *o = NULL;
  int got = rq->srv->store ? lm_srv_store_get(rq->srv->store, id, &o, NULL) : 0;
  if (got > 0)
    lm_srv_reply_json(rp, 200, o);
  else if (got < 0)
    lm_srv_reply_text(rp, 500, "application/json", NULL);
  else
    not_found(id, rp);
}

void lm_srv_responses_delete(const lm_srv_http_req *rq, lm_srv_reply *rp) {
  const char *id = rq->path + strlen("/v1/responses/");
  if (!rq->srv->store || !lm_srv_store_delete(rq->srv->store, id)) {
    not_found(id, rp);
    return;
  }
  lm_srv_reply_json(rp, 200,
                    json_pack("{s:s,s:s,s:b}", "id", id, "object", "response", "deleted", 1));
}
