/* srv_resp_input.c — the Responses API's request as a chat completions request (srv_resp.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "server/srv_resp.h"

/* ---- content --------------------------------------------------------------------------------- */

/* A message's content as chat text parts: a string stays a string; input_text, output_text and
 * text parts become {type: "text"}; anything else is refused. NULL: e is set. */
static json_t *content_parts(const json_t *c, const char *param, lm_srv_err *e) {
  if (json_is_string(c)) return json_incref((json_t *)c);
  if (!json_is_array(c)) {
    lm_srv_err_bad(e, param, "content must be a string or an array of content parts");
    return NULL;
  }
  json_t *out = json_array(), *part;
  size_t k;
  json_array_foreach(c, k, part) {
    const char *type = json_string_value(json_object_get(part, "type"));
    const json_t *text = json_object_get(part, "text");
    char pp[160];
    snprintf(pp, sizeof pp, "%s[%zu]", param, k);
    if (type &&
        (!strcmp(type, "input_text") || !strcmp(type, "output_text") || !strcmp(type, "text")) &&
        json_is_string(text)) {
      json_array_append_new(out, json_pack("{s:s,s:O}", "type", "text", "text", text));
      continue;
    }
    if (type && !strcmp(type, "refusal") && json_is_string(json_object_get(part, "refusal"))) {
      json_array_append_new(
          out, json_pack("{s:s,s:O}", "type", "text", "text", json_object_get(part, "refusal")));
      continue;
    }
    json_decref(out);
    if (type && (!strcmp(type, "input_image") || !strcmp(type, "input_file") ||
                 !strcmp(type, "input_audio")))
      lm_srv_err_bad(e, pp, "%s parts are not supported: this server runs a text-only model", type);
    else
      lm_srv_err_bad(e, pp, "a content part must be input_text or output_text with a text string");
    return NULL;
  }
  return out;
}

/* The text of a reasoning item (its reasoning_text content, else its summary, parts joined by
 * new lines), or NULL when it has none. */
static json_t *reasoning_text(const json_t *item) {
  static const char *const keys[] = {"content", "summary"};
  for (int i = 0; i < 2; i++) {
    const json_t *a = json_object_get(item, keys[i]), *x;
    size_t k, n = 0, cap = 0;
    char *buf = NULL;
    int bad = 0;
    json_array_foreach(a, k, x) {
      const json_t *t = json_object_get(x, "text");
      if (!json_is_string(t)) continue;
      if (n) bad |= lm_buf_append(&buf, &n, &cap, 256, "\n", 1) != LM_OK;
      bad |=
          lm_buf_append(&buf, &n, &cap, 256, json_string_value(t), json_string_length(t)) != LM_OK;
    }
    json_t *s = buf && !bad ? json_stringn(buf, n) : NULL;
    free(buf);
    if (s) return s;
  }
  return NULL;
}

/* ---- items ----------------------------------------------------------------------------------- */

typedef struct items {
  json_t *out;       /* chat messages */
  json_t *reasoning; /* a reasoning item's text waiting for the next assistant message */
} items;

/* The assistant message function calls join: the last message, when it is one. */
static json_t *assistant_for_call(items *it) {
  json_t *last = json_array_get(it->out, json_array_size(it->out) - 1);
  const char *role = json_string_value(json_object_get(last, "role"));
  if (last && role && !strcmp(role, "assistant")) return last;
  json_t *m = json_pack("{s:s,s:n}", "role", "assistant", "content");
  json_array_append_new(it->out, m);
  return m;
}

static void take_reasoning(items *it, json_t *m) {
  if (!it->reasoning) return;
  json_object_set_new(m, "reasoning_content", it->reasoning);
  it->reasoning = NULL;
}

static int message_item(items *it, const json_t *item, const char *param, lm_srv_err *e) {
  const char *role = json_string_value(json_object_get(item, "role"));
  char pp[128];
  snprintf(pp, sizeof pp, "%s.role", param);
  if (!role || (strcmp(role, "user") && strcmp(role, "system") && strcmp(role, "developer") &&
                strcmp(role, "assistant")))
    return lm_srv_err_bad(e, pp, "a message's role must be user, system, developer or assistant");
  snprintf(pp, sizeof pp, "%s.content", param);
  json_t *c = content_parts(json_object_get(item, "content"), pp, e);
  if (!c) return e->http;
  json_t *m = json_pack("{s:s,s:o}", "role", role, "content", c);
  if (!strcmp(role, "assistant")) take_reasoning(it, m);
  json_array_append_new(it->out, m);
  return 0;
}

static int call_item(items *it, const json_t *item, const char *param, lm_srv_err *e) {
  const json_t *id = json_object_get(item, "call_id"), *name = json_object_get(item, "name"),
               *args = json_object_get(item, "arguments");
  if (!json_is_string(id) || !json_is_string(name) || !json_is_string(args))
    return lm_srv_err_bad(e, param,
                          "a function_call item needs call_id, name and arguments strings");
  json_t *m = assistant_for_call(it);
  take_reasoning(it, m);
  json_t *calls = json_object_get(m, "tool_calls");
  if (!calls) {
    calls = json_array();
    json_object_set_new(m, "tool_calls", calls);
  }
  json_array_append_new(calls, json_pack("{s:O,s:s,s:{s:O,s:O}}", "id", id, "type", "function",
                                         "function", "name", name, "arguments", args));
  return 0;
}

static int output_item(items *it, const json_t *item, const char *param, lm_srv_err *e) {
  const json_t *id = json_object_get(item, "call_id"), *o = json_object_get(item, "output");
  char pp[128];
  snprintf(pp, sizeof pp, "%s.output", param);
  if (!json_is_string(id))
    return lm_srv_err_bad(e, param, "a function_call_output item needs a call_id string");
  json_t *c = content_parts(o, pp, e);
  if (!c) return e->http;
  json_array_append_new(
      it->out, json_pack("{s:s,s:O,s:o}", "role", "tool", "tool_call_id", id, "content", c));
  return 0;
}

static int one_item(items *it, const json_t *item, size_t i, lm_srv_err *e) {
  char param[64];
  snprintf(param, sizeof param, "input[%zu]", i);
  if (!json_is_object(item)) return lm_srv_err_bad(e, param, "input items must be objects");
  const char *type = json_string_value(json_object_get(item, "type"));
  if (!type && json_object_get(item, "role")) type = "message"; /* the easy input message */
  if (!type) return lm_srv_err_bad(e, param, "an input item needs a type");
  if (!strcmp(type, "message")) return message_item(it, item, param, e);
  if (!strcmp(type, "function_call")) return call_item(it, item, param, e);
  if (!strcmp(type, "function_call_output")) return output_item(it, item, param, e);
  if (!strcmp(type, "reasoning")) {
    json_decref(it->reasoning);
    it->reasoning = reasoning_text(item);
    return 0;
  }
  if (!strcmp(type, "item_reference"))
    return lm_srv_err_bad(e, param,
                          "item_reference is not supported: send the items, or continue a "
                          "response with previous_response_id");
  return lm_srv_err_bad(e, param, "input items of type '%.40s' are not supported", type);
}

static int input_messages(const json_t *input, json_t **out, lm_srv_err *e) {
  *out = json_array();
  if (json_is_string(input)) {
    json_array_append_new(*out, json_pack("{s:s,s:O}", "role", "user", "content", input));
    return 0;
  }
  if (!json_is_array(input) || !json_array_size(input))
    return lm_srv_err_bad(e, "input", "input must be a string or a non-empty array of items");
  items it = {.out = *out};
  const json_t *item;
  size_t i;
  int r = 0;
  json_array_foreach(input, i, item) {
    if ((r = one_item(&it, item, i, e))) break;
  }
  json_decref(it.reasoning);
  if (!r && !json_array_size(*out))
    r = lm_srv_err_bad(e, "input", "input has no message or function call");
  return r;
}

/* ---- tools ----------------------------------------------------------------------------------- */

static int tools_json(const json_t *tools, json_t **out, lm_srv_err *e) {
  *out = NULL;
  if (!tools || json_is_null(tools)) return 0;
  if (!json_is_array(tools)) return lm_srv_err_bad(e, "tools", "tools must be an array");
  *out = json_array();
  const json_t *t;
  size_t i;
  json_array_foreach(tools, i, t) {
    char param[64];
    snprintf(param, sizeof param, "tools[%zu]", i);
    const char *type = json_string_value(json_object_get(t, "type"));
    if (!json_is_object(t) || !type)
      return lm_srv_err_bad(e, param, "each tool must be an object with a type");
    if (strcmp(type, "function"))
      return lm_srv_err_bad(e, param, "tools of type '%.40s' are not supported (only function)",
                            type);
    if (json_is_object(json_object_get(t, "function"))) { /* the chat shape, accepted as well */
      json_array_append(*out, (json_t *)t);
      continue;
    }
    json_t *fn = json_object();
    static const char *const keys[] = {"name", "description", "parameters"};
    for (int k = 0; k < 3; k++)
      if (json_object_get(t, keys[k])) json_object_set(fn, keys[k], json_object_get(t, keys[k]));
    json_array_append_new(*out, json_pack("{s:s,s:o}", "type", "function", "function", fn));
  }
  return 0;
}

static int tool_choice_json(const json_t *tc, json_t **out, lm_srv_err *e) {
  *out = NULL;
  if (!tc || json_is_null(tc)) return 0;
  if (json_is_string(tc)) {
    *out = json_incref((json_t *)tc); /* auto / none / required: the chat parser checks */
    return 0;
  }
  const char *type = json_string_value(json_object_get(tc, "type"));
  const json_t *name = json_object_get(tc, "name");
  if (type && !strcmp(type, "function") && json_is_string(name)) {
    *out = json_pack("{s:s,s:{s:O}}", "type", "function", "function", "name", name);
    return 0;
  }
  return lm_srv_err_bad(e, "tool_choice",
                        "tool_choice must be auto, none, required or {\"type\": \"function\", "
                        "\"name\": ...}");
}

/* ---- the request ----------------------------------------------------------------------------- */

/* Fields the server does not implement, refused rather than ignored: the answer would not be
 * what the client asked for. */
static int refuse_unsupported(const json_t *req, lm_srv_err *e) {
  if (json_is_true(json_object_get(req, "background")))
    return lm_srv_err_bad(e, "background", "background responses are not supported");
  const json_t *conv = json_object_get(req, "conversation"), *pr = json_object_get(req, "prompt");
  if (conv && !json_is_null(conv))
    return lm_srv_err_bad(e, "conversation",
                          "conversations are not supported: use previous_response_id");
  if (pr && !json_is_null(pr))
    return lm_srv_err_bad(e, "prompt", "prompt templates are not supported");
  const json_t *text = json_object_get(req, "text"), *fmt = json_object_get(text, "format");
  if (text && !json_is_null(text) && !json_is_object(text))
    return lm_srv_err_bad(e, "text", "text must be an object");
  if (fmt && !json_is_null(fmt) && !json_is_object(fmt))
    return lm_srv_err_bad(e, "text.format", "text.format must be an object");
  const json_t *rs = json_object_get(req, "reasoning");
  if (rs && !json_is_null(rs) && !json_is_object(rs))
    return lm_srv_err_bad(e, "reasoning", "reasoning must be an object");
  const json_t *ins = json_object_get(req, "instructions");
  if (ins && !json_is_null(ins) && !json_is_string(ins))
    return lm_srv_err_bad(e, "instructions", "instructions must be a string");
  return 0;
}

/* The sampling and limit fields, under their chat names. */
static void copy_fields(const json_t *req, json_t *chat) {
  static const char *const same[] = {"temperature",
                                     "top_p",
                                     "top_k",
                                     "min_p",
                                     "seed",
                                     "presence_penalty",
                                     "frequency_penalty",
                                     "repetition_penalty",
                                     "ignore_eos",
                                     "speculative",
                                     "stream",
                                     "chat_template_kwargs"};
  for (size_t i = 0; i < sizeof same / sizeof *same; i++)
    if (json_object_get(req, same[i]))
      json_object_set(chat, same[i], json_object_get(req, same[i]));
  const json_t *mt = json_object_get(req, "max_output_tokens");
  if (mt && !json_is_null(mt)) json_object_set(chat, "max_tokens", (json_t *)mt);
  const json_t *effort = json_object_get(json_object_get(req, "reasoning"), "effort");
  if (effort && !json_is_null(effort)) json_object_set(chat, "reasoning_effort", (json_t *)effort);
}

int lm_srv_resp_request(const json_t *req, const json_t *history, json_t **turn, json_t **chat,
                        lm_srv_err *e) {
  *chat = NULL;
  *turn = NULL;
  int r = refuse_unsupported(req, e);
  if (r) return r;
  const json_t *input = json_object_get(req, "input");
  if (!input || json_is_null(input)) return lm_srv_err_bad(e, "input", "input is required");
  if ((r = input_messages(input, turn, e))) return r;
  json_t *msgs = json_array(), *tools = NULL, *tc = NULL;
  const json_t *ins = json_object_get(req, "instructions");
  if (json_is_string(ins))
    json_array_append_new(msgs, json_pack("{s:s,s:O}", "role", "system", "content", ins));
  if (history) json_array_extend(msgs, (json_t *)history);
  json_array_extend(msgs, *turn);
  *chat = json_pack("{s:o}", "messages", msgs);
  copy_fields(req, *chat);
  if ((r = tools_json(json_object_get(req, "tools"), &tools, e)) ||
      (r = tool_choice_json(json_object_get(req, "tool_choice"), &tc, e))) {
    json_decref(tools);
    return r;
  }
  if (tools) json_object_set_new(*chat, "tools", tools);
  if (tc) json_object_set_new(*chat, "tool_choice", tc);
  return 0;
}

void lm_srv_resp_param(lm_srv_err *e) {
  char tmp[sizeof e->param];
  if (!strncmp(e->param, "messages", 8)) {
    snprintf(tmp, sizeof tmp, "input%s", e->param + 8);
    memcpy(e->param, tmp, sizeof tmp);
  } else if (!strcmp(e->param, "max_tokens") || !strcmp(e->param, "max_completion_tokens")) {
    snprintf(e->param, sizeof e->param, "max_output_tokens");
  } else if (!strcmp(e->param, "reasoning_effort")) {
    snprintf(e->param, sizeof e->param, "reasoning.effort");
  }
}
