/* srv_anthropic.c — POST /v1/messages, the Anthropic Messages API, as a translation layer over the
 * chat path: the request becomes OpenAI-shaped messages (system; text, tool_use and thinking
 * blocks; tool_result blocks as role "tool" messages right after the assistant message holding
 * the matching tool_use), and the output becomes content blocks — "thinking", "text", "tool_use"
 * — with stop_reason end_turn / max_tokens / stop_sequence / tool_use.
 *
 * Streaming follows Anthropic's event grammar: message_start, then per block content_block_start,
 * its deltas (text_delta, thinking_delta, input_json_delta) and content_block_stop, then
 * message_delta (stop_reason, usage) and message_stop. Errors use Anthropic's error shape.
 *
 * POST /v1/messages/count_tokens takes the same body and answers {input_tokens}. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/srv_gen.h"
#include "server/srv_route.h"

/* ---- request translation --------------------------------------------------------------------- */

static int bad(lm_srv_err *e, const char *param, const char *msg) {
  return lm_srv_err_bad(e, param, "%s", msg);
}

/* Text of a string or a list of text blocks; NULL when it is neither. */
static json_t *block_text(const json_t *c) {
  if (json_is_string(c)) return json_incref((json_t *)c);
  if (!json_is_array(c)) return NULL;
  json_t *parts = json_array(), *b;
  size_t i;
  json_array_foreach(c, i, b) {
    const char *type = json_string_value(json_object_get(b, "type"));
    const json_t *t = json_object_get(b, "text");
    if (!type || strcmp(type, "text") || !json_is_string(t)) {
      json_decref(parts);
      return NULL;
    }
    json_array_append_new(parts, json_pack("{s:s,s:O}", "type", "text", "text", t));
  }
  return parts;
}

static int user_blocks(const json_t *blocks, size_t mi, json_t *out, lm_srv_err *e) {
  json_t *text = json_array(), *b;
  size_t i;
  char param[96];
  json_array_foreach(blocks, i, b) {
    snprintf(param, sizeof param, "messages[%zu].content[%zu]", mi, i);
    const char *type = json_string_value(json_object_get(b, "type"));
    if (type && !strcmp(type, "text") && json_is_string(json_object_get(b, "text"))) {
      json_array_append_new(
          text, json_pack("{s:s,s:O}", "type", "text", "text", json_object_get(b, "text")));
    } else if (type && !strcmp(type, "tool_result")) {
      const json_t *id = json_object_get(b, "tool_use_id"), *c = json_object_get(b, "content");
      json_t *body = c ? block_text(c) : json_string("");
      if (!json_is_string(id) || !body) {
        json_decref(body);
        json_decref(text);
        return bad(e, param, "a tool_result needs a tool_use_id and text content");
      }
      if (json_is_true(json_object_get(b, "is_error")) && json_is_string(body)) {
        char *s = malloc(json_string_length(body) + 8);
        if (s) {
          sprintf(s, "Error: %s", json_string_value(body));
          json_decref(body);
          body = json_string(s);
          free(s);
        }
      }
      json_array_append_new(
          out, json_pack("{s:s,s:O,s:o}", "role", "tool", "tool_call_id", id, "content", body));
    } else {
      json_decref(text);
      return lm_srv_err_bad(e, param, "unsupported content block type '%.32s' in a user message",
                            type ? type : "?");
    }
  }
  if (json_array_size(text))
    json_array_append_new(out, json_pack("{s:s,s:o}", "role", "user", "content", text));
  else
    json_decref(text);
  return 0;
}

static int assistant_blocks(const json_t *blocks, size_t mi, json_t *out, lm_srv_err *e) {
  json_t *m = json_pack("{s:s}", "role", "assistant"), *text = json_array(), *calls = json_array(),
         *b;
  size_t i;
  char param[96];
  json_array_foreach(blocks, i, b) {
    snprintf(param, sizeof param, "messages[%zu].content[%zu]", mi, i);
    const char *type = json_string_value(json_object_get(b, "type"));
    const json_t *t = json_object_get(b, "text"), *th = json_object_get(b, "thinking");
    if (type && !strcmp(type, "text") && json_is_string(t)) {
      json_array_append_new(text, json_pack("{s:s,s:O}", "type", "text", "text", t));
    } else if (type && !strcmp(type, "thinking") && json_is_string(th)) {
      json_object_set(m, "reasoning_content", (json_t *)th);
    } else if (type && !strcmp(type, "redacted_thinking")) {
      continue;
    } else if (type && !strcmp(type, "tool_use") && json_is_string(json_object_get(b, "id")) &&
               json_is_string(json_object_get(b, "name")) &&
               json_is_object(json_object_get(b, "input"))) {
      json_array_append_new(calls, json_pack("{s:O,s:s,s:{s:O,s:O}}", "id",
                                             json_object_get(b, "id"), "type", "function",
                                             "function", "name", json_object_get(b, "name"),
                                             "arguments", json_object_get(b, "input")));
    } else {
      json_decref(m);
      json_decref(text);
      json_decref(calls);
      return lm_srv_err_bad(
          e, param, "unsupported or malformed content block '%.32s' in an assistant message",
          type ? type : "?");
    }
  }
  json_object_set_new(m, "content", text);
  if (json_array_size(calls))
    json_object_set_new(m, "tool_calls", calls);
  else
    json_decref(calls);
  json_array_append_new(out, m);
  return 0;
}

static int translate_messages(const json_t *req, json_t *out, lm_srv_err *e) {
  const json_t *sys = json_object_get(req, "system"), *ms = json_object_get(req, "messages"), *m;
  if (sys && !json_is_null(sys)) {
    json_t *t = block_text(sys);
    if (!t) return bad(e, "system", "system must be a string or a list of text blocks");
    json_array_append_new(out, json_pack("{s:s,s:o}", "role", "system", "content", t));
  }
  if (!json_is_array(ms) || !json_array_size(ms))
    return bad(e, "messages", "messages must be a non-empty array");
  size_t i;
  char param[64];
  json_array_foreach(ms, i, m) {
    const char *role = json_string_value(json_object_get(m, "role"));
    const json_t *c = json_object_get(m, "content");
    snprintf(param, sizeof param, "messages[%zu].role", i);
    if (!json_is_object(m) || !role || (strcmp(role, "user") && strcmp(role, "assistant")))
      return bad(e, param, "each message needs role user or assistant");
    snprintf(param, sizeof param, "messages[%zu].content", i);
    if (json_is_string(c)) {
      json_array_append_new(out, json_pack("{s:s,s:O}", "role", role, "content", c));
      continue;
    }
    if (!json_is_array(c))
      return bad(e, param, "content must be a string or a list of content blocks");
    int r = !strcmp(role, "user") ? user_blocks(c, i, out, e) : assistant_blocks(c, i, out, e);
    if (r) return r;
  }
  return 0;
}

static int translate_tools(const json_t *req, json_t *out, lm_srv_err *e) {
  const json_t *tools = json_object_get(req, "tools"), *t,
               *tc = json_object_get(req, "tool_choice");
  if (tools && !json_is_null(tools)) {
    if (!json_is_array(tools)) return bad(e, "tools", "tools must be an array");
    json_t *a = json_array();
    size_t i;
    json_array_foreach(tools, i, t) {
      const json_t *name = json_object_get(t, "name"), *schema = json_object_get(t, "input_schema");
      if (!json_is_string(name) || (schema && !json_is_object(schema))) {
        json_decref(a);
        return bad(
            e, "tools",
            "each tool needs a name and an input_schema object (server tools are not supported)");
      }
      json_t *fn = json_pack("{s:O}", "name", name);
      if (json_is_string(json_object_get(t, "description")))
        json_object_set(fn, "description", json_object_get(t, "description"));
      if (schema) json_object_set(fn, "parameters", (json_t *)schema);
      json_array_append_new(a, json_pack("{s:s,s:o}", "type", "function", "function", fn));
    }
    json_object_set_new(out, "tools", a);
  }
  if (!tc || json_is_null(tc)) return 0;
  const char *type = json_string_value(json_object_get(tc, "type"));
  if (type && !strcmp(type, "auto"))
    json_object_set_new(out, "tool_choice", json_string("auto"));
  else if (type && !strcmp(type, "any"))
    json_object_set_new(out, "tool_choice", json_string("required"));
  else if (type && !strcmp(type, "none"))
    json_object_set_new(out, "tool_choice", json_string("none"));
  else if (type && !strcmp(type, "tool") && json_is_string(json_object_get(tc, "name")))
    json_object_set_new(out, "tool_choice",
                        json_pack("{s:s,s:{s:O}}", "type", "function", "function", "name",
                                  json_object_get(tc, "name")));
  else
    return bad(e, "tool_choice", "tool_choice type must be auto, any, tool or none");
  return 0;
}

int lm_srv_anthropic_request(const json_t *req, json_t **out, lm_srv_err *e) {
  *out = NULL;
  const json_t *mt = json_object_get(req, "max_tokens");
  if (!mt || json_is_null(mt)) return bad(e, "max_tokens", "max_tokens is required");
  json_t *o = json_object(), *msgs = json_array();
  *out = o;
  static const char *const pass[] = {"model", "max_tokens", "temperature", "top_p",
                                     "top_k", "stream",     "ignore_eos",  "grammar"};
  for (int i = 0; i < 8; i++)
    if (json_object_get(req, pass[i])) json_object_set(o, pass[i], json_object_get(req, pass[i]));
  if (json_object_get(req, "stop_sequences"))
    json_object_set(o, "stop", json_object_get(req, "stop_sequences"));
  /* structured outputs: output_format {type: json_schema, schema} is response_format's shape */
  const json_t *of = json_object_get(req, "output_format");
  if (of && !json_is_null(of)) json_object_set(o, "response_format", (json_t *)of);
  const json_t *th = json_object_get(req, "thinking");
  if (th && !json_is_null(th)) {
    const char *type = json_string_value(json_object_get(th, "type"));
    if (!type || (strcmp(type, "enabled") && strcmp(type, "disabled"))) {
      json_decref(msgs);
      return bad(e, "thinking", "thinking.type must be enabled or disabled");
    }
    json_object_set_new(o, "chat_template_kwargs",
                        json_pack("{s:b}", "enable_thinking", !strcmp(type, "enabled")));
  }
  json_object_set_new(o, "messages", msgs);
  int r = translate_messages(req, msgs, e);
  return r ? r : translate_tools(req, o, e);
}

/* ---- output ---------------------------------------------------------------------------------- */

enum { BLOCK_NONE = 0, BLOCK_TEXT, BLOCK_THINKING };

typedef struct ant {
  lm_srv_stream base;
  lm_server *srv;
  const char *model; /* the id the response reports */
  lm_srv_gen *g;
  int started, open, index; /* open: the kind of the block being streamed */
  char **stops;             /* copies, to name the stop_sequence */
  int n_stops;
} ant;

static const char *stop_reason(const ant *a) {
  if (a->g->n_calls) return "tool_use";
  if (a->g->fin.kind == LM_FIN_LENGTH) return "max_tokens";
  if (a->g->fin.kind == LM_FIN_STOP_STR) return "stop_sequence";
  return "end_turn";
}

static json_t *stop_sequence(const ant *a) {
  int i = a->g->fin.stop_index;
  return a->g->fin.kind == LM_FIN_STOP_STR && i >= 0 && i < a->n_stops ? json_string(a->stops[i])
                                                                       : json_null();
}

static json_t *usage_json(const ant *a, int final) {
  const lm_srv_finish *f = &a->g->fin;
  int64_t cached = final ? f->cached_tokens : 0, prompt = final ? f->prompt_tokens : a->g->n_prompt;
  return json_pack("{s:I,s:I,s:I,s:i}", "input_tokens", (json_int_t)(prompt - cached),
                   "output_tokens", (json_int_t)(final ? f->completion_tokens : 0),
                   "cache_read_input_tokens", (json_int_t)cached, "cache_creation_input_tokens", 0);
}

static json_t *tool_use_json(const lm_srv_call *c) {
  json_t *input = json_loads(c->arguments, 0, NULL);
  return json_pack("{s:s,s:s,s:s,s:o}", "type", "tool_use", "id", c->id, "name", c->name, "input",
                   input ? input : json_object());
}

static json_t *message_body(const ant *a) {
  const lm_srv_gen *g = a->g;
  size_t nc, nr;
  const char *content = lm_srv_gen_content(g, &nc), *reasoning = lm_srv_gen_reasoning(g, &nr);
  json_t *blocks = json_array();
  if (reasoning)
    json_array_append_new(blocks, json_pack("{s:s,s:o,s:s}", "type", "thinking", "thinking",
                                            json_stringn(reasoning, nr), "signature", ""));
  if (nc || (!reasoning && !g->n_calls))
    json_array_append_new(
        blocks, json_pack("{s:s,s:o}", "type", "text", "text", json_stringn(content, nc)));
  for (int i = 0; i < g->n_calls; i++)
    json_array_append_new(blocks, tool_use_json(&g->calls[i]));
  return json_pack("{s:s,s:s,s:s,s:s,s:o,s:s,s:o,s:o}", "id", g->id, "type", "message", "role",
                   "assistant", "model", a->model, "content", blocks, "stop_reason", stop_reason(a),
                   "stop_sequence", stop_sequence(a), "usage", usage_json(a, 1));
}

/* ---- streaming ------------------------------------------------------------------------------- */

static lm_status ev(ant *a, const char *name, json_t *obj) {
  return lm_srv_sse_event(&a->base.out, name, obj);
}

static lm_status close_block(ant *a) {
  if (!a->open) return LM_OK;
  a->open = BLOCK_NONE;
  return ev(a, "content_block_stop",
            json_pack("{s:s,s:i}", "type", "content_block_stop", "index", a->index++));
}

static lm_status open_block(ant *a, int kind) {
  if (a->open == kind) return LM_OK;
  LM_TRY(close_block(a));
  a->open = kind;
  json_t *b = kind == BLOCK_TEXT
                  ? json_pack("{s:s,s:s}", "type", "text", "text", "")
                  : json_pack("{s:s,s:s,s:s}", "type", "thinking", "thinking", "", "signature", "");
  return ev(a, "content_block_start",
            json_pack("{s:s,s:i,s:o}", "type", "content_block_start", "index", a->index,
                      "content_block", b));
}

static lm_status on_content(void *u, const char *t, size_t n) {
  ant *a = u;
  if (!n) return LM_OK;
  LM_TRY(open_block(a, BLOCK_TEXT));
  return ev(a, "content_block_delta",
            json_pack("{s:s,s:i,s:{s:s,s:o}}", "type", "content_block_delta", "index", a->index,
                      "delta", "type", "text_delta", "text", json_stringn(t, n)));
}

static lm_status on_reasoning(void *u, const char *t, size_t n) {
  ant *a = u;
  if (!n) return LM_OK;
  LM_TRY(open_block(a, BLOCK_THINKING));
  return ev(a, "content_block_delta",
            json_pack("{s:s,s:i,s:{s:s,s:o}}", "type", "content_block_delta", "index", a->index,
                      "delta", "type", "thinking_delta", "thinking", json_stringn(t, n)));
}

static lm_status on_tool_call(void *u, int index, const char *id, const char *name,
                              const char *args) {
  ant *a = u;
  (void)index;
  LM_TRY(close_block(a));
  LM_TRY(ev(a, "content_block_start",
            json_pack("{s:s,s:i,s:{s:s,s:s,s:s,s:{}}}", "type", "content_block_start", "index",
                      a->index, "content_block", "type", "tool_use", "id", id, "name", name,
                      "input")));
  LM_TRY(ev(a, "content_block_delta",
            json_pack("{s:s,s:i,s:{s:s,s:s}}", "type", "content_block_delta", "index", a->index,
                      "delta", "type", "input_json_delta", "partial_json", args)));
  return ev(a, "content_block_stop",
            json_pack("{s:s,s:i}", "type", "content_block_stop", "index", a->index++));
}

static lm_status stream_start(ant *a) {
  json_t *msg = json_pack("{s:s,s:s,s:s,s:s,s:[],s:n,s:n,s:o}", "id", a->g->id, "type", "message",
                          "role", "assistant", "model", a->model, "content", "stop_reason",
                          "stop_sequence", "usage", usage_json(a, 0));
  LM_TRY(ev(a, "message_start", json_pack("{s:s,s:o}", "type", "message_start", "message", msg)));
  return ev(a, "ping", json_pack("{s:s}", "type", "ping"));
}

static lm_status stream_end(ant *a) {
  lm_srv_err e;
  if (lm_srv_gen_error(a->g, &e))
    return ev(a, "error",
              json_pack("{s:s,s:{s:s,s:s}}", "type", "error", "error", "type",
                        lm_srv_err_anthropic_type(e.http), "message", e.message));
  LM_TRY(close_block(a));
  const lm_srv_finish *f = &a->g->fin;
  LM_TRY(ev(a, "message_delta",
            json_pack("{s:s,s:{s:s,s:o},s:{s:I}}", "type", "message_delta", "delta", "stop_reason",
                      stop_reason(a), "stop_sequence", stop_sequence(a), "usage", "output_tokens",
                      (json_int_t)f->completion_tokens)));
  return ev(a, "message_stop", json_pack("{s:s}", "type", "message_stop"));
}

static int produce(lm_srv_stream *st, int timeout_ms) {
  ant *a = (ant *)st;
  if (!a->started) {
    a->started = 1;
    return stream_start(a) ? -1 : 0;
  }
  int r = lm_srv_gen_pump(a->g, timeout_ms);
  if (r <= 0) return r;
  return stream_end(a) ? -1 : 1;
}

static void ant_free(ant *a) {
  if (!a) return;
  lm_srv_gen_free(a->g);
  for (int i = 0; i < a->n_stops; i++)
    free(a->stops[i]);
  free(a->stops);
  lm_srv_buf_free(&a->base.out);
  free(a);
}

static void destroy(lm_srv_stream *st) { ant_free((ant *)st); }

static ant *ant_new(const lm_srv_http_req *rq, const lm_srv_params *p) {
  ant *a = calloc(1, sizeof *a);
  if (!a) return NULL;
  a->srv = rq->srv;
  a->model = rq->model ? rq->model : rq->srv->model_id;
  a->base.produce = produce;
  a->base.destroy = destroy;
  a->stops = calloc((size_t)(p->n_stops ? p->n_stops : 1), sizeof *a->stops);
  for (int i = 0; a->stops && i < p->n_stops; i++)
    if ((a->stops[i] = strdup(p->stops[i]))) a->n_stops++;
  return a;
}

/* The non-streamed reply, once the generation has ended (lm_srv_later). */
static void answer(void *u, int r, lm_srv_reply *rp) {
  ant *a = u;
  lm_srv_err e;
  if (r < 0)
    lm_srv_reply_error(rp, &(lm_srv_err){.http = 500, .message = "output failed"}, 1);
  else if (lm_srv_gen_error(a->g, &e))
    lm_srv_reply_error(rp, &e, 1);
  else
    lm_srv_reply_json(rp, 200, message_body(a));
  ant_free(a);
}

static void drop(void *u) { ant_free(u); }

static void run(const lm_srv_http_req *rq, lm_srv_params *p, lm_srv_reply *rp) {
  lm_srv_err e;
  ant *a = ant_new(rq, p);
  if (!a) {
    lm_srv_err_set(&e, 500, "server_error", NULL, NULL, "out of memory");
    lm_srv_reply_error(rp, &e, 1);
    return;
  }
  lm_srv_sink sink = {.u = a};
  if (p->stream) {
    sink.content = on_content;
    sink.reasoning = on_reasoning;
    sink.tool_call = on_tool_call;
  }
  if (lm_srv_gen_start(rq->srv, p, 1, &sink, "msg_", "toolu_", &a->g, &e)) {
    ant_free(a);
    lm_srv_reply_error(rp, &e, 1);
    return;
  }
  lm_srv_gen_track(a->g, rq->tally);
  if (p->stream) {
    lm_srv_reply_stream(rp, &a->base);
    return;
  }
  lm_srv_reply_later(rp, a->g, a, answer, drop);
}

void lm_srv_anthropic_messages(const lm_srv_http_req *rq, const json_t *body, lm_srv_reply *rp) {
  lm_server *s = rq->srv;
  lm_srv_params p;
  lm_srv_err e;
  lm_srv_params_init(&p);
  p.adapters = rq->adapters;
  json_t *req = NULL;
  if (lm_srv_anthropic_request(body, &req, &e) ||
      lm_srv_parse_common(req, &s->defaults, s->ci.vocab_size, &p, &e) ||
      lm_srv_parse_chat(req, &p, &e))
    lm_srv_reply_error(rp, &e, 1);
  else
    run(rq, &p, rp);
  json_decref(req);
  lm_srv_params_clear(&p);
}

/* POST /v1/messages/count_tokens: the body of a /v1/messages request (max_tokens optional), the
 * prompt it would have counted as the generation would render it. */
void lm_srv_anthropic_count_tokens(const lm_srv_http_req *rq, const json_t *body,
                                   lm_srv_reply *rp) {
  lm_server *s = rq->srv;
  lm_srv_params p;
  lm_srv_err e;
  lm_srv_params_init(&p);
  p.adapters = rq->adapters;
  json_t *copy = json_copy((json_t *)body), *req = NULL;
  int64_t n = 0;
  if (copy && !json_object_get(copy, "max_tokens"))
    json_object_set_new(copy, "max_tokens", json_integer(1)); /* not needed to count */
  int r = copy ? 0 : lm_srv_err_set(&e, 500, "server_error", NULL, NULL, "out of memory");
  if (!r) r = lm_srv_anthropic_request(copy, &req, &e);
  if (!r) r = lm_srv_parse_common(req, &s->defaults, s->ci.vocab_size, &p, &e);
  if (!r) r = lm_srv_parse_chat(req, &p, &e);
  if (!r) r = lm_srv_gen_count(s, &p, 1, &n, &e);
  if (r)
    lm_srv_reply_error(rp, &e, 1);
  else
    lm_srv_reply_json(rp, 200, json_pack("{s:I}", "input_tokens", (json_int_t)n));
  json_decref(req);
  json_decref(copy);
  lm_srv_params_clear(&p);
}
