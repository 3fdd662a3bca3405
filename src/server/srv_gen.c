/* srv_gen.c — the HTTP side of one generation (srv_gen.h). */
#include "server/srv_gen.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/rng.h"
#include "base/status.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- prompts --------------------------------------------------------------------------------- */

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && !memcmp(s + n - k, suffix, k);
}

/* The opening of a forced call: "<|tool_call>call:" (+ "NAME{" for a named tool). */
static char *forced_call(const lm_server *s, const lm_srv_params *p) {
  if (!s->gemma4 ||
      (p->tool_choice != LM_SRV_TOOLS_REQUIRED && p->tool_choice != LM_SRV_TOOLS_NAMED))
    return NULL;
  size_t n;
  const char *open = lm_tokenizer_piece(s->tok, s->ptok.tool_call_open, &n);
  char buf[256];
  snprintf(buf, sizeof buf, "%.*scall:%s%s", (int)n, open ? open : "",
           p->tool_choice == LM_SRV_TOOLS_NAMED ? p->tool_name : "",
           p->tool_choice == LM_SRV_TOOLS_NAMED ? "{" : "");
  return strdup(buf);
}

static int tokenize(lm_server *s, const char *text, int bos, int32_t **ids, int64_t *n,
                    lm_srv_err *e) {
  size_t k = 0;
  if (lm_tokenizer_encode(s->tok, text, strlen(text), bos, ids, &k))
    return lm_srv_err_set(e, 500, "server_error", NULL, NULL, "tokenizer: %s", lm_errmsg());
  *n = (int64_t)k;
  if (!k) return lm_srv_err_bad(e, NULL, "the prompt is empty after tokenization");
  return 0;
}

int lm_srv_gen_chat_prompt(lm_server *s, const lm_srv_params *p, int32_t **ids, int64_t *n,
                           char **forced, int *start_reasoning, lm_srv_err *e) {
  *ids = NULL;
  *forced = NULL;
  *start_reasoning = 0;
  if (!s->tmpl)
    return lm_srv_err_bad(e, "messages",
                          "this checkpoint has no chat template: use /v1/completions");
  char *prompt = NULL;
  if (lm_chat_render(s->tmpl, p->messages, p->tools, p->kwargs, 1, s->bos, s->eos, &prompt))
    return lm_srv_err_bad(e, "messages", "chat template: %s", lm_errmsg());
  *start_reasoning = ends_with(prompt, "<|channel>thought\n") || ends_with(prompt, "<think>\n");
  if ((*forced = forced_call(s, p))) {
    char *full = malloc(strlen(prompt) + strlen(*forced) + 1);
    if (!full) {
      free(prompt);
      return lm_srv_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    strcat(strcpy(full, prompt), *forced);
    free(prompt);
    prompt = full;
    *start_reasoning = 0;
  }
  int r = tokenize(s, prompt, 0, ids, n, e);
  free(prompt);
  return r;
}

int lm_srv_gen_raw_prompt(lm_server *s, lm_srv_params *p, int32_t **ids, int64_t *n,
                          lm_srv_err *e) {
  if (p->prompt_ids) {
    *ids = p->prompt_ids;
    *n = p->n_prompt_ids;
    p->prompt_ids = NULL;
    p->n_prompt_ids = 0;
    return 0;
  }
  return tokenize(s, p->prompt, 1, ids, n, e);
}

/* ---- starting -------------------------------------------------------------------------------- */

/* max_tokens: the request's, else the server default clamped to the context left. */
static int pick_max_tokens(lm_server *s, const lm_srv_params *p, int64_t n, int64_t *out,
                           lm_srv_err *e) {
  if (p->max_tokens > 0) {
    *out = p->max_tokens;
    return 0;
  }
  int64_t left = s->max_ctx - n;
  if (left < 1)
    return lm_srv_err_set(e, 400, "invalid_request_error", "context_length_exceeded", "messages",
                          "the prompt has %lld tokens; the context limit is %lld", (long long)n,
                          (long long)s->max_ctx);
  *out = s->o.max_tokens < left ? s->o.max_tokens : left;
  return 0;
}

static int admission(lm_server *s, int64_t n, int64_t max_tokens, lm_srv_err *e) {
  char msg[512];
  lm_admission a = lm_sched_check(s->sched, n, max_tokens, msg, sizeof msg);
  if (a == LM_ADMIT_CONTEXT)
    return lm_srv_err_set(e, 400, "invalid_request_error", "context_length_exceeded", "max_tokens",
                          "%s", msg);
  if (a == LM_ADMIT_MEMORY)
    return lm_srv_err_set(e, 400, "memory_admission", "context_over_budget", NULL, "%s", msg);
  return 0;
}

static lm_status sink_parse_event(void *user, const lm_parse_event *ev);

static int make_parser(lm_srv_gen *g, int start_reasoning, const char *forced, lm_srv_err *e) {
  lm_server *s = g->srv;
  lm_parser_opts po = {.format = s->gemma4 ? LM_PARSER_GEMMA4 : LM_PARSER_GENERIC,
                       .tokens = s->ptok,
                       .start_in_reasoning = start_reasoning,
                       .emit = sink_parse_event,
                       .user = g};
  if (lm_parser_create(&po, &g->parser))
    return lm_srv_err_set(e, 500, "server_error", NULL, NULL, "%s", lm_errmsg());
  if (!forced) return 0;
  /* the prompt opened the call: the parser sees it as if the model had written it */
  size_t n = strlen(forced), k = 0;
  const char *open = lm_tokenizer_piece(s->tok, s->ptok.tool_call_open, &k);
  lm_status st = lm_parser_feed(g->parser, s->ptok.tool_call_open, open, k);
  if (!st) st = lm_parser_feed_text(g->parser, forced + k, n - k);
  return st ? lm_srv_err_set(e, 500, "server_error", NULL, NULL, "%s", lm_errmsg()) : 0;
}

static int fill_job(lm_server *s, lm_srv_params *p, lm_job *j, int chat, lm_srv_err *e) {
  lm_sampling_clear(&j->sampling);
  if (lm_sampling_copy(&j->sampling, &p->sampling))
    return lm_srv_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
  if (!p->has_seed && !s->o.has_seed)
    j->sampling.seed = lm_mix64(atomic_fetch_add(&s->seq, 1) ^ (uint64_t)(now_s() * 1e9)) >> 1;
  j->stops = p->stops;
  j->n_stops = p->n_stops;
  p->stops = NULL;
  p->n_stops = 0;
  j->ignore_eos = p->ignore_eos;
  j->top_logprobs = p->top_logprobs;
  j->keep_control = chat;
  j->t_submit = now_s();
  j->deadline = s->o.timeout_s > 0 ? j->t_submit + s->o.timeout_s : 0;
  return 0;
}

static int submit(lm_server *s, lm_job *j, lm_srv_err *e) {
  lm_status st = lm_sched_submit(s->sched, j);
  if (st == LM_OK) return 0;
  if (st == LM_ERR_STATE)
    return lm_srv_err_set(e, 429, "rate_limit_error", "queue_full", NULL, "%s; retry later",
                          lm_errmsg());
  if (st == LM_ERR_CANCELLED)
    return lm_srv_err_set(e, 503, "server_error", NULL, NULL, "%s", lm_errmsg());
  return lm_srv_err_bad(e, NULL, "%s", lm_errmsg());
}

static void make_id(lm_server *s, const char *prefix, char *out, size_t n) {
  uint64_t a = lm_mix64(atomic_fetch_add(&s->seq, 1) + (uint64_t)(now_s() * 1e9));
  snprintf(out, n, "%s%016llx", prefix, (unsigned long long)a);
}

int lm_srv_gen_start(lm_server *s, lm_srv_params *p, int32_t *ids, int64_t n, int chat,
                     const char *forced, int start_reasoning, const lm_srv_sink *sink,
                     const char *id_prefix, const char *call_prefix, lm_srv_gen **out,
                     lm_srv_err *e) {
  *out = NULL;
  int64_t max_tokens = 0;
  int r = pick_max_tokens(s, p, n, &max_tokens, e);
  if (!r) r = admission(s, n, max_tokens, e);
  lm_srv_gen *g = r ? NULL : calloc(1, sizeof *g);
  if (!r && !g) r = lm_srv_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
  lm_job *j = NULL;
  if (!r && lm_job_create(&j, &g->ch))
    r = lm_srv_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
  if (r) {
    free(ids);
    free(g);
    return r;
  }
  g->srv = s;
  g->sink = *sink;
  g->n_prompt = n;
  g->t0 = now_s();
  g->created = (long long)time(NULL);
  make_id(s, id_prefix, g->id, sizeof g->id);
  snprintf(g->call_prefix, sizeof g->call_prefix, "%s", call_prefix);
  j->ids = ids;
  j->n_ids = n;
  j->max_tokens = max_tokens;
  r = fill_job(s, p, j, chat, e);
  if (!r && chat) r = make_parser(g, start_reasoning, forced, e);
  if (!r) r = submit(s, j, e);
  if (r) {
    lm_job_free(j);
    lm_srv_gen_free(g);
    return r;
  }
  *out = g;
  return 0;
}

/* ---- output ---------------------------------------------------------------------------------- */

static lm_status add_call(lm_srv_gen *g, const lm_parse_event *ev) {
  lm_srv_call *c = realloc(g->calls, (size_t)(g->n_calls + 1) * sizeof *c);
  if (!c) return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  g->calls = c;
  c = &g->calls[g->n_calls];
  make_id(g->srv, g->call_prefix, c->id, sizeof c->id);
  c->name = strdup(ev->name);
  c->arguments = strdup(ev->arguments);
  if (!c->name || !c->arguments) {
    free(c->name);
    free(c->arguments);
    return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  }
  g->n_calls++;
  return LM_OK;
}

static lm_status sink_parse_event(void *user, const lm_parse_event *ev) {
  lm_srv_gen *g = user;
  const lm_srv_sink *k = &g->sink;
  switch (ev->kind) {
  case LM_PARSE_CONTENT: return k->content ? k->content(k->u, ev->text, ev->len) : LM_OK;
  case LM_PARSE_REASONING: return k->reasoning ? k->reasoning(k->u, ev->text, ev->len) : LM_OK;
  case LM_PARSE_TOOL_CALL:
    LM_TRY(add_call(g, ev));
    return k->tool_call ? k->tool_call(k->u, g->n_calls - 1, g->calls[g->n_calls - 1].id, ev->name,
                                       ev->arguments)
                        : LM_OK;
  }
  return LM_OK;
}

static lm_status raw_text(lm_srv_gen *g, const char *t, size_t n) {
  if (!n) return LM_OK;
  if (g->n_text + n + 1 > g->cap_text) {
    size_t cap = g->cap_text ? g->cap_text : 256;
    while (cap < g->n_text + n + 1)
      cap *= 2;
    char *p = realloc(g->text, cap);
    if (!p) return LM_ERRF(LM_ERR_NOMEM, "out of memory");
    g->text = p;
    g->cap_text = cap;
  }
  memcpy(g->text + g->n_text, t, n);
  g->n_text += n;
  g->text[g->n_text] = '\0';
  return g->sink.content ? g->sink.content(g->sink.u, t, n) : LM_OK;
}

static lm_status feed(lm_srv_gen *g, const lm_tok_event *t) {
  if (!t->is_stop && g->sink.token) LM_TRY(g->sink.token(g->sink.u, t));
  if (!g->parser) return raw_text(g, t->text, t->len);
  return lm_parser_feed(g->parser, t->id, t->text ? t->text : "", t->len);
}

static void finish_metrics(lm_srv_gen *g) {
  const lm_finish *f = &g->fin;
  lm_srv_metrics_generation(&g->srv->metrics, f->prompt_tokens, f->cached_tokens,
                            f->completion_tokens, f->ttft_s, now_s() - g->t0);
}

int lm_srv_gen_pump(lm_srv_gen *g, int timeout_ms) {
  if (g->done) return 1;
  lm_tok_event *ev;
  size_t n;
  lm_finish fin;
  int done = lm_chan_take(g->ch, timeout_ms, &ev, &n, &fin);
  lm_status st = LM_OK;
  for (size_t i = 0; i < n && !st; i++)
    st = feed(g, &ev[i]);
  lm_tok_events_free(ev, n);
  if (!st && done && g->parser) st = lm_parser_finish(g->parser);
  if (st) {
    lm_chan_cancel(g->ch);
    return -1;
  }
  if (done) {
    g->done = 1;
    g->fin = fin;
    finish_metrics(g);
  }
  return done;
}

void lm_srv_gen_free(lm_srv_gen *g) {
  if (!g) return;
  if (g->ch) {
    if (!g->done) lm_chan_cancel(g->ch);
    lm_chan_unref(g->ch);
  }
  lm_parser_free(g->parser);
  for (int i = 0; i < g->n_calls; i++) {
    free(g->calls[i].name);
    free(g->calls[i].arguments);
  }
  free(g->calls);
  free(g->text);
  free(g);
}

const char *lm_srv_gen_content(const lm_srv_gen *g, size_t *len) {
  if (g->parser) {
    *len = lm_parser_content_len(g->parser);
    return lm_parser_content(g->parser);
  }
  *len = g->n_text;
  return g->text ? g->text : "";
}

const char *lm_srv_gen_reasoning(const lm_srv_gen *g, size_t *len) {
  *len = g->parser ? lm_parser_reasoning_len(g->parser) : 0;
  return g->parser ? lm_parser_reasoning(g->parser) : NULL;
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
  if (lm_tokenizer_decode(s->tok, &id, 1, 0, &t, len)) {
    *len = 0;
    return strdup("");
  }
  return t;
}
