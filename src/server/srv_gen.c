/* srv_gen.c — the HTTP side of one generation (srv_gen.h), over lm_request (lumen.h). */
#include "server/srv_gen.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/rng.h"
#include "base/status.h"
#include "server/srv_adapters.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void make_id(lm_server *s, const char *prefix, char *out, size_t n) {
  uint64_t a = lm_mix64(atomic_fetch_add(&s->seq, 1) + (uint64_t)(now_s() * 1e9));
  snprintf(out, n, "%s%016llx", prefix, (unsigned long long)a);
}

/* ---- the request ----------------------------------------------------------------------------- */

static lm_tool_choice tool_choice(lm_srv_tool_choice c) {
  switch (c) {
  case LM_SRV_TOOLS_NONE: return LM_TOOLS_NONE;
  case LM_SRV_TOOLS_REQUIRED: return LM_TOOLS_REQUIRED;
  case LM_SRV_TOOLS_NAMED: return LM_TOOLS_NAMED;
  default: return LM_TOOLS_AUTO;
  }
}

/* The JSON texts of a chat request's template inputs (owned by the caller). */
static int chat_json(const lm_srv_params *p, char **msgs, char **tools, char **kwargs,
                     lm_srv_err *e) {
  *msgs = json_dumps(p->messages, JSON_COMPACT);
  *tools = p->tools ? json_dumps(p->tools, JSON_COMPACT) : NULL;
  *kwargs = p->kwargs ? json_dumps(p->kwargs, JSON_COMPACT) : NULL;
  if (!*msgs || (p->tools && !*tools) || (p->kwargs && !*kwargs))
    return lm_srv_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
  return 0;
}

static int starts(const char *s, const char *prefix) { return !strncmp(s, prefix, strlen(prefix)); }

/* A request's adapters refused: one not mounted is a 404 (model_not_found when the model id
 * named it), anything else a 400 naming the field that chose them. */
static int adapter_error(lm_status st, const lm_srv_adapters *a, const char *m, lm_srv_err *e) {
  int model = a->param && !strcmp(a->param, "model");
  const char *param = model ? "model" : "adapter";
  if (st != LM_ERR_NOT_FOUND) return lm_srv_err_bad(e, param, "%s", m);
  return lm_srv_err_set(e, 404, "invalid_request_error",
                        model ? "model_not_found" : "adapter_not_found", param,
                        "%s (GET /v1/adapters lists those mounted)", m);
}

/* The HTTP error of a request that could not be built. A constraint's message starts with the
 * option that carried it (lumen.h): it names the request field that did. */
static int create_error(lm_status st, int chat, const lm_srv_params *p, lm_srv_err *e) {
  const char *m = lm_errmsg();
  if (st == LM_ERR_NOMEM)
    return lm_srv_err_set(e, 500, "server_error", NULL, NULL, "%s", lm_errmsg());
  if (starts(m, "json_schema: ") || starts(m, "json_object: "))
    return lm_srv_err_set(e, 400, "invalid_request_error",
                          st == LM_ERR_UNSUPPORTED ? "unsupported_schema" : "invalid_schema",
                          p->format_param[0] ? p->format_param : "response_format", "%s", m);
  if (starts(m, "grammar: "))
    return lm_srv_err_set(e, 400, "invalid_request_error", "invalid_grammar", "grammar", "%s", m);
  if (starts(m, "tools"))
    return lm_srv_err_set(e, 400, "invalid_request_error",
                          st == LM_ERR_UNSUPPORTED ? "unsupported_schema" : NULL, "tools", "%s", m);
  if (starts(m, "tool_choice")) return lm_srv_err_bad(e, "tool_choice", "%s", m);
  if (starts(m, "speculative")) return lm_srv_err_bad(e, "speculative", "%s", m);
  if (p->adapters && p->adapters->n && (st == LM_ERR_NOT_FOUND || starts(m, "adapter")))
    return adapter_error(st, p->adapters, m, e);
  if (chat) return lm_srv_err_bad(e, "messages", "chat template: %s", lm_errmsg());
  return lm_srv_err_bad(e, "prompt", "%s", lm_errmsg());
}

/* The draft source of a request: its own, else the server's; "speculative": true on a server
 * without one means n-grams; false (or nothing on such a server) means none. The server's default
 * stays off for a request with adapters, which the engine does not draft for. */
static const char *spec_source(const lm_server *s, const lm_srv_params *p) {
  if (p->spec < 0) return NULL;
  if (p->spec_source) return p->spec_source;
  if (p->spec == 0 && p->adapters && p->adapters->n) return NULL;
  if (s->o.speculative) return s->o.speculative;
  return p->spec > 0 ? "ngram" : NULL;
}

static int create(lm_server *s, lm_srv_params *p, int chat, lm_srv_gen *g, lm_srv_err *e) {
  if (chat && !s->ci.has_chat_template)
    return lm_srv_err_bad(e, "messages",
                          "this checkpoint has no chat template: use /v1/completions");
  lm_request_options ro;
  lm_request_options_init(&ro);
  char *msgs = NULL, *tools = NULL, *kwargs = NULL;
  int r = chat ? chat_json(p, &msgs, &tools, &kwargs, e) : 0;
  if (r) goto done;
  ro.messages_json = msgs;
  ro.tools_json = tools;
  ro.template_kwargs_json = kwargs;
  ro.tool_choice = tool_choice(p->tool_choice);
  ro.tool_name = p->tool_name;
  if (!chat) {
    ro.prompt = p->prompt_ids ? NULL : p->prompt;
    ro.ids = p->prompt_ids;
    ro.n_ids = p->n_prompt_ids;
  }
  ro.sampling = p->sampling; /* a shallow copy: borrowed, and copied by lm_request_create */
  ro.sampling.seed += (uint64_t)p->choice; /* n choices of one seed still differ */
  ro.has_seed = p->has_seed || s->o.has_seed;
  ro.share_prompt = p->n > 1 && p->choice == 0;
  ro.max_tokens = p->max_tokens;
  ro.stop = (const char *const *)p->stops;
  ro.n_stop = p->n_stops;
  ro.ignore_eos = p->ignore_eos;
  ro.logprobs = p->top_logprobs;
  ro.timeout_s = s->o.timeout_s > 0 ? s->o.timeout_s : 0;
  ro.grammar = p->grammar;
  ro.json_schema = p->json_schema;
  ro.json_object = p->json_object;
  ro.constrain_tools = chat; /* tool names and arguments are held to the offered tools */
  ro.speculative = spec_source(s, p);
  ro.speculative_tokens = p->spec > 0 ? p->spec_tokens : 0;
  if (p->adapters) { /* names and weights are borrowed: lm_request_create copies them */
    ro.adapters = p->adapters->names;
    ro.adapter_weights = p->adapters->weights;
    ro.n_adapters = p->adapters->n;
    ro.no_adapters = p->adapters->none;
  }
  lm_status st = lm_request_create(s->e, &ro, &g->r);
  if (st) r = create_error(st, chat, p, e);
done:
  free(msgs);
  free(tools);
  free(kwargs);
  return r;
}

/* A prompt that leaves no room for one generated token: the prompt is at fault, not max_tokens. */
static int prompt_too_long(const lm_srv_gen *g, lm_srv_err *e) {
  return lm_srv_err_set(e, 400, "invalid_request_error", "context_length_exceeded", g->prompt_param,
                        "the prompt has %lld tokens; the context limit is %lld",
                        (long long)g->n_prompt, (long long)g->srv->ei.context);
}

/* max_tokens: the request's, else the server default clamped to the context left. */
static int pick_max_tokens(lm_server *s, const lm_srv_params *p, lm_srv_gen *g, lm_srv_err *e) {
  int64_t left = s->ei.context - g->n_prompt;
  if (left < 1) return prompt_too_long(g, e);
  if (p->max_tokens > 0) return 0;
  lm_request_set_max_tokens(g->r, s->o.max_tokens < left ? s->o.max_tokens : left);
  return 0;
}

static int start(lm_srv_gen *g, lm_srv_err *e) {
  lm_status st = lm_request_start(g->r);
  if (st == LM_OK) return 0;
  lm_admission a = lm_request_admission(g->r);
  if (a == LM_ADMIT_CONTEXT && g->n_prompt >= g->srv->ei.context) return prompt_too_long(g, e);
  if (a == LM_ADMIT_CONTEXT)
    return lm_srv_err_set(e, 400, "invalid_request_error", "context_length_exceeded", "max_tokens",
                          "%s", lm_errmsg());
  if (a == LM_ADMIT_MEMORY)
    return lm_srv_err_set(e, 400, "memory_admission", "context_over_budget", NULL, "%s",
                          lm_errmsg());
  if (st == LM_ERR_STATE)
    return lm_srv_err_set(e, 429, "rate_limit_error", "queue_full", NULL, "%s; retry later",
                          lm_errmsg());
  if (st == LM_ERR_CANCELLED)
    return lm_srv_err_set(e, 503, "server_error", NULL, NULL, "%s", lm_errmsg());
  return lm_srv_err_bad(e, NULL, "%s", lm_errmsg());
}

int lm_srv_gen_create(lm_server *s, lm_srv_params *p, int chat, const lm_srv_sink *sink,
                      const char *id_prefix, const char *call_prefix, lm_srv_gen **out,
                      lm_srv_err *e) {
  *out = NULL;
  lm_srv_gen *g = calloc(1, sizeof *g);
  if (!g) return lm_srv_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
  g->srv = s;
  g->sink = *sink;
  g->chat = chat;
  g->t0 = now_s();
  g->created = (long long)time(NULL);
  g->prompt_param = p->prompt_param ? p->prompt_param : chat ? "messages" : "prompt";
  make_id(s, id_prefix, g->id, sizeof g->id);
  snprintf(g->call_prefix, sizeof g->call_prefix, "%s", call_prefix);
  int r = create(s, p, chat, g, e);
  if (!r) {
    lm_request_tokens(g->r, NULL, &g->n_prompt);
    r = pick_max_tokens(s, p, g, e);
  }
  if (r) {
    lm_srv_gen_free(g);
    return r;
  }
  *out = g;
  return 0;
}

int lm_srv_gen_begin(lm_srv_gen *g, lm_srv_err *e) {
  int r = start(g, e);
  if (!r) {
    g->started = 1;
    g->t0 = now_s();
  }
  return r;
}

int lm_srv_gen_start(lm_server *s, lm_srv_params *p, int chat, const lm_srv_sink *sink,
                     const char *id_prefix, const char *call_prefix, lm_srv_gen **out,
                     lm_srv_err *e) {
  int r = lm_srv_gen_create(s, p, chat, sink, id_prefix, call_prefix, out, e);
  if (!r && (r = lm_srv_gen_begin(*out, e))) {
    lm_srv_gen_free(*out);
    *out = NULL;
  }
  return r;
}

int lm_srv_gen_count(lm_server *s, lm_srv_params *p, int chat, int64_t *n_prompt, lm_srv_err *e) {
  lm_srv_gen g = {.srv = s, .chat = chat};
  *n_prompt = 0;
  int r = create(s, p, chat, &g, e);
  if (!r) lm_request_tokens(g.r, NULL, n_prompt);
  lm_request_free(g.r);
  return r;
}

int lm_srv_gen_prefilled(const lm_srv_gen *g) {
  int64_t n = 0, np = 0;
  lm_request_tokens(g->r, &n, &np);
  return g->done || n > np;
}

void lm_srv_gen_track(lm_srv_gen *g, lm_srv_tally *t) {
  lm_srv_tally_unref(g->tally);
  g->tally = lm_srv_tally_ref(t);
}

/* ---- output ---------------------------------------------------------------------------------- */

static lm_status add_call(lm_srv_gen *g, const lm_event *ev) {
  lm_srv_call *c = realloc(g->calls, (size_t)(g->n_calls + 1) * sizeof *c);
  if (!c) return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  g->calls = c;
  c = &g->calls[g->n_calls];
  make_id(g->srv, g->call_prefix, c->id, sizeof c->id);
  c->name = strdup(ev->tool_name);
  c->arguments = strdup(ev->tool_arguments);
  if (!c->name || !c->arguments) {
    free(c->name);
    free(c->arguments);
    return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  }
  g->n_calls++;
  return LM_OK;
}

static void finish(lm_srv_gen *g, const lm_event *ev) {
  lm_srv_finish *f = &g->fin;
  *f = (lm_srv_finish){.kind = ev->finish,
                       .stop_id = ev->stop_id,
                       .stop_index = ev->stop_index,
                       .prompt_tokens = ev->usage.prompt_tokens,
                       .cached_tokens = ev->usage.cached_tokens,
                       .completion_tokens = ev->usage.completion_tokens,
                       .ttft_s = ev->usage.ttft_s};
  snprintf(f->message, sizeof f->message, "%s", ev->error ? ev->error : "");
  g->done = 1;
  lm_srv_tally_add(g->tally, f->prompt_tokens, f->cached_tokens, f->completion_tokens);
  lm_srv_metrics_generation(&g->srv->metrics, f->prompt_tokens, f->cached_tokens,
                            f->completion_tokens, f->ttft_s, now_s() - g->t0);
}

/* One event into the sink. */
static lm_status deliver(lm_srv_gen *g, const lm_event *ev) {
  const lm_srv_sink *k = &g->sink;
  switch (ev->kind) {
  case LM_EVENT_TOKEN: return !ev->is_stop && k->token ? k->token(k->u, ev) : LM_OK;
  case LM_EVENT_CONTENT: return k->content ? k->content(k->u, ev->text, ev->len) : LM_OK;
  case LM_EVENT_REASONING: return k->reasoning ? k->reasoning(k->u, ev->text, ev->len) : LM_OK;
  case LM_EVENT_TOOL_CALL:
    LM_TRY(add_call(g, ev));
    return k->tool_call ? k->tool_call(k->u, g->n_calls - 1, g->calls[g->n_calls - 1].id,
                                       ev->tool_name, ev->tool_arguments)
                        : LM_OK;
  case LM_EVENT_DONE: finish(g, ev); return LM_OK;
  case LM_EVENT_NONE: return LM_OK;
  }
  return LM_OK;
}

int lm_srv_gen_pump(lm_srv_gen *g, int timeout_ms) {
  double until = now_s() + timeout_ms / 1000.0;
  while (!g->done) {
    int left = (int)((until - now_s()) * 1000.0);
    lm_event ev;
    lm_status st = lm_request_next(g->r, left > 0 ? left : 0, &ev);
    if (!st) st = deliver(g, &ev);
    if (st) {
      lm_request_cancel(g->r);
      return -1;
    }
    if (ev.kind == LM_EVENT_NONE) break; /* nothing more within the timeout */
  }
  return g->done;
}

void lm_srv_gen_free(lm_srv_gen *g) {
  if (!g) return;
  lm_request_free(g->r); /* cancels it when it still runs */
  lm_srv_tally_unref(g->tally);
  for (int i = 0; i < g->n_calls; i++) {
    free(g->calls[i].name);
    free(g->calls[i].arguments);
  }
  free(g->calls);
  free(g);
}

const char *lm_srv_gen_content(const lm_srv_gen *g, size_t *len) {
  return lm_request_content(g->r, len);
}

const char *lm_srv_gen_reasoning(const lm_srv_gen *g, size_t *len) {
  const char *r = lm_request_reasoning(g->r, len);
  return g->chat ? r : NULL;
}

const char *lm_srv_gen_finish_reason(const lm_srv_gen *g) {
  if (g->n_calls > 0) return "tool_calls";
  return g->fin.kind == LM_FIN_LENGTH ? "length" : "stop";
}

int lm_srv_gen_error(const lm_srv_gen *g, lm_srv_err *e) {
  switch (g->fin.kind) {
  case LM_FIN_TIMEOUT:
    return lm_srv_err_set(e, 504, "timeout", "timeout", NULL, "%s", g->fin.message);
  case LM_FIN_ERROR:
    return lm_srv_err_set(e, 500, "server_error", NULL, NULL, "%s", g->fin.message);
  case LM_FIN_CANCELLED:
    return lm_srv_err_set(e, 503, "server_error", NULL, NULL, "%s", g->fin.message);
  default: return 0;
  }
}

char *lm_srv_token_text(const lm_server *s, int32_t id, size_t *len) {
  char *t = NULL;
  if (lm_checkpoint_detokenize(s->ck, &id, 1, 0, &t, len)) {
    *len = 0;
    return strdup("");
  }
  return t;
}
