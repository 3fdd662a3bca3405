/* srv_req.c — request validation (srv_req.h): the shared generation fields, chat messages and
 * tools, and completion prompts. */
#include "server/srv_req.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/chat.h"
#include "text/utf8.h"

void lm_srv_params_init(lm_srv_params *p) {
  memset(p, 0, sizeof *p);
  lm_sampling_init(&p->sampling);
  p->top_logprobs = -1;
  p->n = 1;
}

void lm_srv_params_clear(lm_srv_params *p) {
  lm_sampling_clear(&p->sampling);
  for (int i = 0; i < p->n_stops; i++)
    free(p->stops[i]);
  free(p->stops);
  json_decref(p->messages);
  json_decref(p->tools);
  json_decref(p->kwargs);
  free(p->grammar);
  free(p->json_schema);
  free(p->prompt);
  free(p->prompt_ids);
  lm_srv_params_init(p);
}

int lm_srv_parse_body(const char *body, size_t len, json_t **out, lm_srv_err *e) {
  *out = NULL;
  if (!lm_utf8_valid(body, len)) {
    size_t at = 0;
    for (int32_t cp = 0; at < len; at += lm_utf8_next(body + at, len - at, &cp)) {
      lm_utf8_next(body + at, len - at, &cp);
      if (cp < 0) break;
    }
    return lm_srv_err_set(e, 400, "invalid_request_error", "invalid_utf8", NULL,
                          "the request body is not valid UTF-8 (byte %zu)", at);
  }
  json_error_t je;
  json_t *j = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
  if (!j)
    return lm_srv_err_set(e, 400, "invalid_request_error", "invalid_json", NULL,
                          "the request body is not valid JSON: %s (line %d, column %d)", je.text,
                          je.line, je.column);
  if (!json_is_object(j)) {
    json_decref(j);
    return lm_srv_err_bad(e, NULL, "the request body must be a JSON object");
  }
  *out = j;
  return 0;
}

/* ---- typed field readers: absent or null leaves *out as it is -------------------------------- */

static int get_bool(const json_t *o, const char *k, int *out, lm_srv_err *e) {
  const json_t *v = json_object_get(o, k);
  if (!v || json_is_null(v)) return 0;
  if (!json_is_boolean(v)) return lm_srv_err_bad(e, k, "%s must be a boolean", k);
  *out = json_is_true(v);
  return 0;
}

static int get_num(const json_t *o, const char *k, double lo, double hi, double *out, int *given,
                   lm_srv_err *e) {
  const json_t *v = json_object_get(o, k);
  if (given) *given = 0;
  if (!v || json_is_null(v)) return 0;
  if (!json_is_number(v)) return lm_srv_err_bad(e, k, "%s must be a number", k);
  double x = json_number_value(v);
  if (!(x >= lo && x <= hi))
    return lm_srv_err_bad(e, k, "%s must be between %g and %g (got %g)", k, lo, hi, x);
  *out = x;
  if (given) *given = 1;
  return 0;
}

static int get_int(const json_t *o, const char *k, int64_t lo, int64_t hi, int64_t *out, int *given,
                   lm_srv_err *e) {
  const json_t *v = json_object_get(o, k);
  if (given) *given = 0;
  if (!v || json_is_null(v)) return 0;
  if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) &&
      fabs(json_real_value(v)) < 9e15)
    v = json_integer((json_int_t)json_real_value(v)); /* 5.0 is an integer to JavaScript clients */
  else if (!json_is_integer(v))
    return lm_srv_err_bad(e, k, "%s must be an integer", k);
  else
    json_incref((json_t *)v);
  int64_t x = json_integer_value(v);
  json_decref((json_t *)v);
  if (x < lo || x > hi)
    return lm_srv_err_bad(e, k, "%s must be between %lld and %lld (got %lld)", k, (long long)lo,
                          (long long)hi, (long long)x);
  *out = x;
  if (given) *given = 1;
  return 0;
}

static int get_float(const json_t *o, const char *k, double lo, double hi, float *out,
                     lm_srv_err *e) {
  double x = *out;
  int r = get_num(o, k, lo, hi, &x, NULL, e);
  *out = (float)x;
  return r;
}

static int get_i32(const json_t *o, const char *k, int64_t lo, int64_t hi, int32_t *out,
                   lm_srv_err *e) {
  int64_t x = *out;
  int r = get_int(o, k, lo, hi, &x, NULL, e);
  *out = (int32_t)x;
  return r;
}

/* ---- the shared generation fields ------------------------------------------------------------ */

static int add_stop(lm_srv_params *p, const json_t *v, const char *param, lm_srv_err *e) {
  if (!json_is_string(v))
    return lm_srv_err_bad(e, param, "stop must be a string or an array of strings");
  if (!json_string_length(v)) return lm_srv_err_bad(e, param, "stop strings must not be empty");
  if (p->n_stops == LM_SRV_MAX_STOPS)
    return lm_srv_err_bad(e, param, "at most %d stop strings", LM_SRV_MAX_STOPS);
  char **s = realloc(p->stops, (size_t)(p->n_stops + 1) * sizeof *s);
  if (!s) return lm_srv_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
  p->stops = s;
  if (!(s[p->n_stops] = strdup(json_string_value(v))))
    return lm_srv_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
  p->n_stops++;
  return 0;
}

static int parse_stop(const json_t *req, const char *key, lm_srv_params *p, lm_srv_err *e) {
  const json_t *v = json_object_get(req, key), *x;
  size_t i;
  if (!v || json_is_null(v)) return 0;
  if (!json_is_array(v)) return add_stop(p, v, key, e);
  json_array_foreach(v, i, x) {
    int r = add_stop(p, x, key, e);
    if (r) return r;
  }
  return 0;
}

static int parse_logit_bias(const json_t *req, int64_t vocab, lm_srv_params *p, lm_srv_err *e) {
  const json_t *v = json_object_get(req, "logit_bias"), *x;
  const char *k;
  if (!v || json_is_null(v)) return 0;
  if (!json_is_object(v))
    return lm_srv_err_bad(e, "logit_bias", "logit_bias must be an object of token id -> bias");
  if (json_object_size(v) > LM_SRV_MAX_BIAS)
    return lm_srv_err_bad(e, "logit_bias", "at most %d logit_bias entries", LM_SRV_MAX_BIAS);
  json_object_foreach((json_t *)v, k, x) {
    char *end;
    long long id = strtoll(k, &end, 10);
    if (!*k || *end || id < 0 || id >= vocab)
      return lm_srv_err_bad(e, "logit_bias", "logit_bias key '%.64s' is not a token id (0..%lld)",
                            k, (long long)vocab - 1);
    if (!json_is_number(x) || !(json_number_value(x) >= -100 && json_number_value(x) <= 100))
      return lm_srv_err_bad(e, "logit_bias", "logit_bias values must be numbers in [-100, 100]");
    if (lm_sampling_add_bias(&p->sampling, (int32_t)id, (float)json_number_value(x)))
      return lm_srv_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
  }
  return 0;
}

static int parse_stream(const json_t *req, lm_srv_params *p, lm_srv_err *e) {
  int r = get_bool(req, "stream", &p->stream, e);
  if (r) return r;
  const json_t *so = json_object_get(req, "stream_options");
  if (!so || json_is_null(so)) return 0;
  if (!json_is_object(so))
    return lm_srv_err_bad(e, "stream_options", "stream_options must be an object");
  r = get_bool(so, "include_usage", &p->include_usage, e);
  if (r) snprintf(e->param, sizeof e->param, "stream_options.include_usage");
  return r;
}

static int parse_max_tokens(const json_t *req, lm_srv_params *p, lm_srv_err *e) {
  static const char *const keys[] = {"max_completion_tokens", "max_tokens"};
  for (int i = 0; i < 2; i++) {
    const json_t *v = json_object_get(req, keys[i]);
    if (!v || json_is_null(v)) continue;
    if (json_is_number(v) && json_number_value(v) <= 0)
      return lm_srv_err_bad(e, keys[i], "%s must be at least 1 (got %g)", keys[i],
                            json_number_value(v));
    int given;
    int r = get_int(req, keys[i], 1, INT32_MAX, &p->max_tokens, &given, e);
    if (r || given) return r;
  }
  return 0;
}

static int parse_sampling(const json_t *req, lm_srv_params *p, lm_srv_err *e) {
  lm_sampling *s = &p->sampling;
  int r, given;
  int64_t seed = 0, n = 1;
  if ((r = get_float(req, "temperature", 0, 100, &s->temperature, e))) return r;
  if ((r = get_float(req, "top_p", 1e-9, 1, &s->top_p, e))) return r;
  if ((r = get_i32(req, "top_k", -1, INT32_MAX, &s->top_k, e))) return r;
  if (s->top_k < 0) s->top_k = 0; /* -1 means off, as in vLLM */
  if ((r = get_float(req, "min_p", 0, 1, &s->min_p, e))) return r;
  if ((r = get_float(req, "presence_penalty", -2, 2, &s->presence_penalty, e))) return r;
  if ((r = get_float(req, "frequency_penalty", -2, 2, &s->frequency_penalty, e))) return r;
  if ((r = get_float(req, "repetition_penalty", 1e-3, 100, &s->repeat_penalty, e))) return r;
  if ((r = get_i32(req, "repetition_context_size", -1, INT32_MAX, &s->repeat_last_n, e))) return r;
  if ((r = get_i32(req, "presence_context_size", -1, INT32_MAX, &s->penalty_last_n, e))) return r;
  if ((r = get_i32(req, "frequency_context_size", -1, INT32_MAX, &s->penalty_last_n, e))) return r;
  if ((r = get_int(req, "seed", INT64_MIN, INT64_MAX, &seed, &given, e))) return r;
  if (given) {
    s->seed = (uint64_t)seed;
    p->has_seed = 1;
  }
  if ((r = get_int(req, "n", 1, LM_SRV_MAX_N, &n, NULL, e))) return r;
  p->n = (int)n;
  return 0;
}

/* grammar: a GBNF text (llama.cpp's field), the answer's constraint. */
static int parse_grammar(const json_t *req, lm_srv_params *p, lm_srv_err *e) {
  const json_t *g = json_object_get(req, "grammar");
  if (!g || json_is_null(g)) return 0;
  if (!json_is_string(g) || !json_string_length(g))
    return lm_srv_err_bad(e, "grammar", "grammar must be a non-empty GBNF string");
  if (!(p->grammar = strdup(json_string_value(g))))
    return lm_srv_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
  return 0;
}

/* speculative: false / null (off), true (the server's drafts), "ngram" or "draft", or
 * {"source": ..., "tokens": N} (lumen's field; the server checks N and whether it has a draft
 * model). */
static int parse_speculative(const json_t *req, lm_srv_params *p, lm_srv_err *e) {
  const json_t *v = json_object_get(req, "speculative");
  if (!v) return 0;
  p->spec = json_is_true(v) ? 1 : -1;
  if (json_is_boolean(v) || json_is_null(v)) return 0;
  const json_t *src = json_is_object(v) ? json_object_get(v, "source") : v;
  const char *name = json_string_value(src);
  p->spec_source = !name                    ? NULL
                   : !strcmp(name, "ngram") ? "ngram"
                   : !strcmp(name, "draft") ? "draft"
                                            : NULL;
  if (!p->spec_source)
    return lm_srv_err_bad(e, "speculative",
                          "speculative must be a boolean, \"ngram\", \"draft\", or {\"source\": "
                          "\"ngram\" | \"draft\", \"tokens\": N}");
  p->spec = 1;
  int64_t n = 0;
  int r = json_is_object(v) ? get_int(v, "tokens", 1, LM_SPEC_MAX_TOKENS, &n, NULL, e) : 0;
  if (r) return lm_srv_err_bad(e, "speculative.tokens", "tokens must be 1..%d", LM_SPEC_MAX_TOKENS);
  p->spec_tokens = (int)n;
  return 0;
}

int lm_srv_parse_common(const json_t *req, const lm_sampling *defaults, int64_t vocab,
                        lm_srv_params *p, lm_srv_err *e) {
  lm_sampling_clear(&p->sampling);
  if (lm_sampling_copy(&p->sampling, defaults))
    return lm_srv_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
  const json_t *model = json_object_get(req, "model");
  if (model && !json_is_string(model) && !json_is_null(model))
    return lm_srv_err_bad(e, "model", "model must be a string");
  int r;
  if ((r = parse_stream(req, p, e))) return r;
  if ((r = parse_max_tokens(req, p, e))) return r;
  if ((r = parse_sampling(req, p, e))) return r;
  if ((r = parse_stop(req, "stop", p, e))) return r;
  if ((r = parse_logit_bias(req, vocab, p, e))) return r;
  if ((r = get_bool(req, "ignore_eos", &p->ignore_eos, e))) return r;
  if ((r = parse_grammar(req, p, e))) return r;
  if ((r = parse_speculative(req, p, e))) return r;
  if (lm_sampling_validate(&p->sampling)) return lm_srv_err_bad(e, NULL, "%s", lm_errmsg());
  return 0;
}

/* ---- chat messages --------------------------------------------------------------------------- */

static int check_parts(const json_t *c, size_t mi, lm_srv_err *e) {
  const json_t *part;
  size_t k;
  char param[96];
  json_array_foreach(c, k, part) {
    snprintf(param, sizeof param, "messages[%zu].content[%zu]", mi, k);
    const char *type = json_string_value(json_object_get(part, "type"));
    if (!json_is_object(part) || !type)
      return lm_srv_err_bad(e, param, "content parts must be objects with a type");
    if (!strcmp(type, "text") || !strcmp(type, "input_text")) {
      if (!json_is_string(json_object_get(part, "text")))
        return lm_srv_err_bad(e, param, "a text part needs a text string");
      continue;
    }
    if (!strcmp(type, "image_url") || !strcmp(type, "input_audio") || !strcmp(type, "image") ||
        !strcmp(type, "file"))
      return lm_srv_err_bad(e, param,
                            "%s parts are not supported: this server runs a text-only model", type);
    return lm_srv_err_bad(e, param, "unknown content part type '%.32s'", type);
  }
  return 0;
}

/* The content as the template wants it: a string, or the parts as {type:"text", text}. */
static json_t *content_copy(const json_t *c) {
  if (!json_is_array(c)) return json_deep_copy(c);
  json_t *out = json_array(), *part;
  size_t k;
  json_array_foreach(c, k, part) json_array_append_new(
      out, json_pack("{s:s,s:O}", "type", "text", "text", json_object_get(part, "text")));
  return out;
}

static int check_content(const json_t *m, const char *role, size_t mi, lm_srv_err *e) {
  const json_t *c = json_object_get(m, "content");
  char param[96];
  snprintf(param, sizeof param, "messages[%zu].content", mi);
  int has_calls = json_array_size(json_object_get(m, "tool_calls")) > 0;
  if (!c || json_is_null(c)) {
    if (!strcmp(role, "assistant")) return 0;
    return lm_srv_err_bad(e, param, "a %s message needs content", role);
  }
  if (json_is_string(c)) return 0;
  if (json_is_array(c)) {
    if (!json_array_size(c) && !has_calls && strcmp(role, "assistant"))
      return lm_srv_err_bad(e, param, "content must not be an empty list");
    return check_parts(c, mi, e);
  }
  return lm_srv_err_bad(e, param, "content must be a string or an array of content parts");
}

static const char *known_role(const char *role) {
  static const char *const roles[] = {"system", "developer", "user", "assistant", "tool"};
  for (int i = 0; i < 5; i++)
    if (role && !strcmp(role, roles[i])) return i == 1 ? "system" : roles[i];
  return NULL;
}

/* A clean copy of message mi with the keys templates read. */
static int copy_message(const json_t *m, size_t mi, json_t *out, lm_srv_err *e) {
  char param[96];
  snprintf(param, sizeof param, "messages[%zu]", mi);
  if (!json_is_object(m)) return lm_srv_err_bad(e, param, "messages must be objects");
  const json_t *rv = json_object_get(m, "role");
  snprintf(param, sizeof param, "messages[%zu].role", mi);
  if (!json_is_string(rv)) return lm_srv_err_bad(e, param, "every message needs a role string");
  const char *role = known_role(json_string_value(rv));
  if (!role)
    return lm_srv_err_bad(e, param,
                          "unknown role '%.32s' (system, developer, user, assistant or tool)",
                          json_string_value(rv));
  int r = check_content(m, role, mi, e);
  if (r) return r;
  json_t *c = json_object();
  json_object_set_new(c, "role", json_string(role));
  const json_t *content = json_object_get(m, "content");
  json_object_set_new(c, "content",
                      content && !json_is_null(content) ? content_copy(content) : json_string(""));
  static const char *const keys[] = {"name", "tool_calls", "tool_call_id", "reasoning_content",
                                     "reasoning"};
  for (int k = 0; k < 5; k++) {
    const json_t *v = json_object_get(m, keys[k]);
    if (!v || json_is_null(v)) continue;
    if (k != 1 && !json_is_string(v)) {
      json_decref(c);
      snprintf(param, sizeof param, "messages[%zu].%s", mi, keys[k]);
      return lm_srv_err_bad(e, param, "%s must be a string", keys[k]);
    }
    json_object_set_new(c, keys[k], json_deep_copy(v));
  }
  json_array_append_new(out, c);
  return 0;
}

static int copy_messages(const json_t *req, json_t **out, lm_srv_err *e) {
  const json_t *ms = json_object_get(req, "messages"), *m;
  size_t i;
  if (!json_is_array(ms) || !json_array_size(ms))
    return lm_srv_err_bad(e, "messages", "messages must be a non-empty array");
  *out = json_array();
  json_array_foreach(ms, i, m) {
    int r = copy_message(m, i, *out, e);
    if (r) return r;
  }
  return 0;
}

/* ---- tools ----------------------------------------------------------------------------------- */

static int valid_name(const char *s) {
  if (!s || !*s || strlen(s) > 120) return 0;
  for (; *s; s++)
    if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
          strchr("_.:-", *s)))
      return 0;
  return 1;
}

static int check_tools(const json_t *tools, lm_srv_err *e) {
  const json_t *t;
  size_t i;
  char param[64];
  if (!json_is_array(tools)) return lm_srv_err_bad(e, "tools", "tools must be an array");
  json_array_foreach(tools, i, t) {
    snprintf(param, sizeof param, "tools[%zu]", i);
    const json_t *fn = json_object_get(t, "function");
    const char *type = json_string_value(json_object_get(t, "type"));
    if (!json_is_object(t) || !type || strcmp(type, "function") || !json_is_object(fn))
      return lm_srv_err_bad(e, param,
                            "each tool must be {\"type\": \"function\", \"function\": {...}}");
    if (!valid_name(json_string_value(json_object_get(fn, "name"))))
      return lm_srv_err_bad(e, param, "function.name must be 1-120 characters of [A-Za-z0-9_.:-]");
    const json_t *d = json_object_get(fn, "description"), *ps = json_object_get(fn, "parameters");
    if (d && !json_is_string(d) && !json_is_null(d))
      return lm_srv_err_bad(e, param, "function.description must be a string");
    if (ps && !json_is_object(ps) && !json_is_null(ps))
      return lm_srv_err_bad(e, param, "function.parameters must be an object");
  }
  return 0;
}

static int parse_tool_choice(const json_t *req, lm_srv_params *p, lm_srv_err *e) {
  const json_t *tc = json_object_get(req, "tool_choice");
  if (!tc || json_is_null(tc)) return 0;
  if (json_is_string(tc)) {
    const char *s = json_string_value(tc);
    if (!strcmp(s, "auto"))
      p->tool_choice = LM_SRV_TOOLS_AUTO;
    else if (!strcmp(s, "none"))
      p->tool_choice = LM_SRV_TOOLS_NONE;
    else if (!strcmp(s, "required"))
      p->tool_choice = LM_SRV_TOOLS_REQUIRED;
    else
      return lm_srv_err_bad(e, "tool_choice",
                            "tool_choice must be auto, none, required or a function");
    return 0;
  }
  const char *name = json_string_value(json_object_get(json_object_get(tc, "function"), "name"));
  if (!json_is_object(tc) || !valid_name(name))
    return lm_srv_err_bad(e, "tool_choice",
                          "tool_choice must be auto, none, required or {\"type\": \"function\", "
                          "\"function\": {\"name\": ...}}");
  p->tool_choice = LM_SRV_TOOLS_NAMED;
  snprintf(p->tool_name, sizeof p->tool_name, "%s", name);
  return 0;
}

/* The tools the template declares: none for tool_choice none, only the named one otherwise. */
static int declared_tools(const json_t *tools, lm_srv_params *p, json_t **out, lm_srv_err *e) {
  *out = NULL;
  if (!tools || json_is_null(tools) || !json_array_size(tools) ||
      p->tool_choice == LM_SRV_TOOLS_NONE) {
    if (p->tool_choice == LM_SRV_TOOLS_REQUIRED || p->tool_choice == LM_SRV_TOOLS_NAMED)
      return lm_srv_err_bad(e, "tool_choice",
                            "tool_choice asks for a tool call but no tools are given");
    return 0;
  }
  if (p->tool_choice != LM_SRV_TOOLS_NAMED) {
    *out = json_incref((json_t *)tools);
    return 0;
  }
  const json_t *t;
  size_t i;
  json_array_foreach(tools, i, t) {
    if (!strcmp(json_string_value(json_object_get(json_object_get(t, "function"), "name")),
                p->tool_name)) {
      *out = json_pack("[O]", t);
      return 0;
    }
  }
  return lm_srv_err_bad(e, "tool_choice", "tool_choice names '%s', which is not among the tools",
                        p->tool_name);
}

/* ---- thinking, logprobs ---------------------------------------------------------------------- */

static int parse_kwargs(const json_t *req, lm_srv_params *p, lm_srv_err *e) {
  const json_t *kw = json_object_get(req, "chat_template_kwargs"),
               *effort = json_object_get(req, "reasoning_effort");
  if (kw && !json_is_null(kw) && !json_is_object(kw))
    return lm_srv_err_bad(e, "chat_template_kwargs", "chat_template_kwargs must be an object");
  p->kwargs = kw && json_is_object(kw) ? json_deep_copy(kw) : json_object();
  const char *key;
  json_t *val;
  json_object_foreach(p->kwargs, key, val) {
    if (lm_chat_reserved_var(key))
      return lm_srv_err_bad(e, "chat_template_kwargs",
                            "chat_template_kwargs.%.64s is set by the server, not the request",
                            key);
  }
  const json_t *et = json_object_get(p->kwargs, "enable_thinking");
  if (et && !json_is_boolean(et))
    return lm_srv_err_bad(e, "chat_template_kwargs.enable_thinking",
                          "enable_thinking must be a boolean");
  if (!effort || json_is_null(effort)) return 0;
  static const char *const levels[] = {"none", "minimal", "low", "medium", "high", "xhigh"};
  const char *s = json_string_value(effort);
  int level = -1;
  for (int i = 0; s && i < 6; i++)
    if (!strcmp(s, levels[i])) level = i;
  if (level < 0)
    return lm_srv_err_bad(e, "reasoning_effort",
                          "reasoning_effort must be none, minimal, low, medium or high");
  if (!et) json_object_set_new(p->kwargs, "enable_thinking", json_boolean(level > 0));
  return 0;
}

static int parse_chat_logprobs(const json_t *req, lm_srv_params *p, lm_srv_err *e) {
  int on = 0, r;
  int64_t top = 0;
  if ((r = get_bool(req, "logprobs", &on, e))) return r;
  int given;
  if ((r = get_int(req, "top_logprobs", 0, 20, &top, &given, e))) return r;
  if (given && !on) return lm_srv_err_bad(e, "top_logprobs", "top_logprobs needs logprobs: true");
  p->top_logprobs = on ? (int)top : -1;
  return 0;
}

/* The schema of a json_schema format, as JSON text into p. */
static int format_schema(const json_t *js, const char *param, lm_srv_params *p, lm_srv_err *e) {
  char where[64];
  const json_t *name = json_object_get(js, "name"), *strict = json_object_get(js, "strict"),
               *schema = json_object_get(js, "schema");
  snprintf(where, sizeof where, "%s.name", param);
  if (name && !json_is_null(name) &&
      (!json_is_string(name) || !json_string_length(name) || json_string_length(name) > 64))
    return lm_srv_err_bad(e, where, "the schema's name must be a string of 1-64 characters");
  snprintf(where, sizeof where, "%s.strict", param);
  if (strict && !json_is_null(strict) && !json_is_boolean(strict))
    return lm_srv_err_bad(e, where, "strict must be a boolean");
  snprintf(where, sizeof where, "%s.schema", param);
  if (!schema || json_is_null(schema) || json_is_true(schema)) {
    p->json_object = 1; /* no schema: any JSON; an object is what clients mean by it */
    return 0;
  }
  if (!json_is_object(schema)) return lm_srv_err_bad(e, where, "the schema must be a JSON object");
  if (!(p->json_schema = json_dumps(schema, JSON_COMPACT | JSON_SORT_KEYS)))
    return lm_srv_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
  return 0;
}

int lm_srv_parse_format(const json_t *fmt, const char *param, lm_srv_params *p, lm_srv_err *e) {
  if (!fmt || json_is_null(fmt)) return 0;
  char where[64];
  snprintf(where, sizeof where, "%s.type", param);
  const char *t = json_string_value(json_object_get(fmt, "type"));
  if (!json_is_object(fmt) || !t)
    return lm_srv_err_bad(e, param, "%s must be an object with a type", param);
  snprintf(p->format_param, sizeof p->format_param, "%s", param);
  if (!strcmp(t, "text")) return 0;
  if (p->grammar) return lm_srv_err_bad(e, param, "%s and grammar cannot be used together", param);
  if (!strcmp(t, "json_object")) {
    p->json_object = 1;
    return 0;
  }
  if (strcmp(t, "json_schema"))
    return lm_srv_err_bad(e, where,
                          "%s type '%.32s' is not supported (text, json_object or "
                          "json_schema)",
                          param, t);
  const json_t *js = json_object_get(fmt, "json_schema");
  snprintf(where, sizeof where, "%s.json_schema", param);
  if (js && !json_is_object(js)) return lm_srv_err_bad(e, where, "json_schema must be an object");
  if (js) return format_schema(js, where, p, e);
  if (!json_object_get(fmt, "schema"))
    return lm_srv_err_bad(e, param, "a json_schema format needs a json_schema object");
  return format_schema(fmt, param, p, e);
}

int lm_srv_parse_chat(const json_t *req, lm_srv_params *p, lm_srv_err *e) {
  json_t *msgs = NULL, *tools = NULL;
  const json_t *rt = json_object_get(req, "tools");
  int r = copy_messages(req, &msgs, e);
  if (!r && rt && !json_is_null(rt)) r = check_tools(rt, e);
  if (!r) r = parse_tool_choice(req, p, e);
  if (!r) r = declared_tools(rt, p, &tools, e);
  if (!r) r = parse_kwargs(req, p, e);
  if (!r) r = parse_chat_logprobs(req, p, e);
  if (!r) r = lm_srv_parse_format(json_object_get(req, "response_format"), "response_format", p, e);
  if (!r && lm_chat_normalize(msgs, tools, &p->messages, &p->tools))
    r = lm_srv_err_bad(e, "messages", "%s", lm_errmsg());
  json_decref(msgs);
  json_decref(tools);
  return r;
}

/* ---- completions ----------------------------------------------------------------------------- */

static int prompt_ids(const json_t *v, int64_t vocab, lm_srv_params *p, lm_srv_err *e) {
  size_t n = json_array_size(v), i;
  const json_t *x;
  if (!(p->prompt_ids = malloc(n * sizeof *p->prompt_ids)))
    return lm_srv_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
  json_array_foreach(v, i, x) {
    if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= vocab)
      return lm_srv_err_bad(e, "prompt", "prompt[%zu] is not a token id (0..%lld)", i,
                            (long long)vocab - 1);
    p->prompt_ids[i] = (int32_t)json_integer_value(x);
  }
  p->n_prompt_ids = (int64_t)n;
  return 0;
}

int lm_srv_parse_completion(const json_t *req, int64_t vocab, lm_srv_params *p, lm_srv_err *e) {
  const json_t *v = json_object_get(req, "prompt");
  if (json_is_array(v) && json_array_size(v) == 1 && json_is_string(json_array_get(v, 0)))
    v = json_array_get(v, 0);
  if (json_is_string(v)) {
    if (!json_string_length(v)) return lm_srv_err_bad(e, "prompt", "prompt must not be empty");
    if (!(p->prompt = strdup(json_string_value(v))))
      return lm_srv_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
  } else if (json_is_array(v) && json_array_size(v) && json_is_integer(json_array_get(v, 0))) {
    int r = prompt_ids(v, vocab, p, e);
    if (r) return r;
  } else if (json_is_array(v) && json_array_size(v) > 1) {
    return lm_srv_err_bad(e, "prompt", "only one prompt per request is supported");
  } else {
    return lm_srv_err_bad(e, "prompt",
                          "prompt must be a non-empty string or an array of token ids");
  }
  int echo = 0, r;
  if ((r = get_bool(req, "echo", &echo, e))) return r;
  if (echo) return lm_srv_err_bad(e, "echo", "echo is not supported");
  const json_t *suffix = json_object_get(req, "suffix");
  if (suffix && !json_is_null(suffix))
    return lm_srv_err_bad(e, "suffix", "suffix is not supported");
  int64_t lp = -1;
  int given;
  if ((r = get_int(req, "logprobs", 0, 20, &lp, &given, e))) return r;
  p->top_logprobs = given ? (int)lp : -1;
  return 0;
}
