/* chat_normalize.c — turning an OpenAI request's messages and tools into what chat templates expect
 * (gemma4-chat.md §5). Rules are documented on lm_chat_normalize() in chat.h. */
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "text/chat.h"

/* Decodes one call's "arguments" in place when it is a JSON string. */
static lm_status decode_arguments(json_t *fn, size_t mi, size_t ci) {
  json_t *args = json_object_get(fn, "arguments");
  if (!json_is_string(args)) return LM_OK;
  const char *text = json_string_value(args);
  size_t len = json_string_length(args), ws = 0;
  while (ws < len && (text[ws] == ' ' || text[ws] == '\t' || text[ws] == '\n' || text[ws] == '\r'))
    ws++;
  json_t *obj;
  if (ws == len) { /* some clients send "" for a call without arguments */
    obj = json_object();
  } else {
    json_error_t err;
    obj = json_loadb(text, len, JSON_DECODE_ANY, &err);
    if (!obj)
      return LM_ERRF(
          LM_ERR_INVALID,
          "messages[%zu].tool_calls[%zu].function.arguments: invalid JSON (%s at column %d)", mi,
          ci, err.text, err.column);
    if (!json_is_object(obj)) {
      json_decref(obj);
      return LM_ERRF(LM_ERR_INVALID,
                     "messages[%zu].tool_calls[%zu].function.arguments: must be a JSON object", mi,
                     ci);
    }
  }
  if (!obj || json_object_set_new(fn, "arguments", obj) != 0)
    return LM_ERRF(LM_ERR_NOMEM, "out of memory (normalizing arguments)");
  return LM_OK;
}

static lm_status normalize_assistant(json_t *m, size_t mi) {
  json_t *calls = json_object_get(m, "tool_calls"), *call;
  size_t ci;
  if (!calls || json_is_null(calls)) return LM_OK;
  if (!json_is_array(calls))
    return LM_ERRF(LM_ERR_INVALID, "messages[%zu].tool_calls: must be an array", mi);
  json_array_foreach(calls, ci, call) {
    json_t *fn = json_object_get(call, "function");
    if (!json_is_object(fn))
      return LM_ERRF(LM_ERR_INVALID, "messages[%zu].tool_calls[%zu]: needs a function object", mi,
                     ci);
    if (!json_is_string(json_object_get(fn, "name")))
      return LM_ERRF(LM_ERR_INVALID,
                     "messages[%zu].tool_calls[%zu].function.name: must be a string", mi, ci);
    LM_TRY(decode_arguments(fn, mi, ci));
  }
  return LM_OK;
}

/* The name of the call with this id in the nearest assistant message before index `mi`. */
static const char *call_name(const json_t *messages, size_t mi, const char *id) {
  for (size_t k = mi; k-- > 0;) {
    const json_t *m = json_array_get(messages, k), *calls = json_object_get(m, "tool_calls"), *call;
    const char *role = json_string_value(json_object_get(m, "role"));
    if (!role || strcmp(role, "assistant") != 0) continue;
    size_t ci;
    json_array_foreach(calls, ci, call) {
      const char *cid = json_string_value(json_object_get(call, "id"));
      if (cid && id && strcmp(cid, id) == 0)
        return json_string_value(json_object_get(json_object_get(call, "function"), "name"));
    }
    return NULL;
  }
  return NULL;
}

static lm_status normalize_tool(json_t *messages, json_t *m, size_t mi) {
  json_t *content = json_object_get(m, "content");
  if (!content || json_is_null(content)) {
    if (json_object_set_new(m, "content", json_string("")) != 0)
      return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  } else if (!json_is_string(content) && !json_is_array(content)) {
    char *text = json_dumps(content, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!text || json_object_set_new(m, "content", json_string(text)) != 0) {
      free(text);
      return LM_ERRF(LM_ERR_NOMEM, "out of memory");
    }
    free(text);
  }
  if (!json_is_string(json_object_get(m, "name"))) {
    const char *name =
        call_name(messages, mi, json_string_value(json_object_get(m, "tool_call_id")));
    if (name && json_object_set_new(m, "name", json_string(name)) != 0)
      return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  }
  return LM_OK;
}

/* Fills in a missing "type" on a schema and on its properties and items, recursively. */
static lm_status infer_types(json_t *schema, int depth) {
  if (!json_is_object(schema)) return LM_OK;
  if (depth > 64) return LM_ERRF(LM_ERR_INVALID, "tools: schema nested deeper than 64 levels");
  json_t *props = json_object_get(schema, "properties"), *items = json_object_get(schema, "items");
  json_t *enm = json_object_get(schema, "enum");
  if (!json_object_get(schema, "type")) {
    const char *type = "string";
    if (props)
      type = "object";
    else if (items)
      type = "array";
    else if (json_is_array(enm) && json_array_size(enm) > 0) {
      const json_t *e0 = json_array_get(enm, 0);
      type = json_is_integer(e0)   ? "integer"
             : json_is_real(e0)    ? "number"
             : json_is_boolean(e0) ? "boolean"
             : json_is_object(e0)  ? "object"
             : json_is_array(e0)   ? "array"
             : json_is_null(e0)    ? "null"
                                   : "string";
    }
    if (json_object_set_new(schema, "type", json_string(type)) != 0)
      return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  }
  if (json_is_object(props)) {
    const char *k;
    json_t *v;
    json_object_foreach(props, k, v) LM_TRY(infer_types(v, depth + 1));
  }
  return infer_types(items, depth + 1);
}

static lm_status normalize_tools(json_t *tools) {
  json_t *tool;
  size_t i;
  if (!json_is_array(tools)) return LM_ERRF(LM_ERR_INVALID, "tools: must be an array");
  json_array_foreach(tools, i, tool) {
    json_t *fn = json_object_get(tool, "function");
    if (!json_is_object(fn))
      return LM_ERRF(LM_ERR_INVALID, "tools[%zu]: needs a function object", i);
    if (!json_is_string(json_object_get(fn, "name")))
      return LM_ERRF(LM_ERR_INVALID, "tools[%zu].function.name: must be a string", i);
    json_t *params = json_object_get(fn, "parameters");
    lm_status s = params ? infer_types(params, 0) : LM_OK;
    if (s != LM_OK) return lm_err_prefix(s, "tools[%zu]", i);
  }
  return LM_OK;
}

lm_status lm_chat_normalize(const json_t *messages, const json_t *tools, json_t **messages_out,
                            json_t **tools_out) {
  *messages_out = NULL;
  *tools_out = NULL;
  if (!json_is_array(messages)) return LM_ERRF(LM_ERR_INVALID, "messages: must be an array");
  json_t *msgs = json_deep_copy(messages), *tl = tools ? json_deep_copy(tools) : NULL, *m;
  if (!msgs || (tools && !tl)) {
    json_decref(msgs);
    json_decref(tl);
    return LM_ERRF(LM_ERR_NOMEM, "out of memory (copying the request)");
  }
  lm_status s = LM_OK;
  size_t i;
  json_array_foreach(msgs, i, m) {
    const char *role = json_string_value(json_object_get(m, "role"));
    if (!json_is_object(m) || !role)
      s = LM_ERRF(LM_ERR_INVALID, "messages[%zu]: needs a string role", i);
    else if (!strcmp(role, "assistant"))
      s = normalize_assistant(m, i);
    else if (!strcmp(role, "tool"))
      s = normalize_tool(msgs, m, i);
    if (s != LM_OK) break;
  }
  if (s == LM_OK && tl && !json_is_null(tl)) s = normalize_tools(tl);
  if (s != LM_OK) {
    json_decref(msgs);
    json_decref(tl);
    return s;
  }
  *messages_out = msgs;
  *tools_out = tl;
  return LM_OK;
}
