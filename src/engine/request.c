/* request.c — lm_request of lumen.h: builds the prompt (chat template or text → ids), hands the
 * job to the scheduler, and turns what the engine thread sends back (one token event each, then
 * the end) into the public events, running the output parser (reasoning, tool calls) on the
 * consumer's thread. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/buf.h"
#include "base/rng.h"
#include "base/status.h"
#include "engine/api_impl.h"
#include "engine/constraint.h"
#include "text/call_grammar.h"
#include "text/utf8.h"

typedef struct qevent { /* an event waiting to be taken; its strings are owned */
  lm_event ev;
  char *text, *name, *args;
} qevent;

struct lm_request {
  lm_engine *e;
  lm_job *job; /* built by create, owned until start hands it to the scheduler */
  lm_admission admission;
  double timeout_s;
  lm_chan *ch;
  lm_parser *parser; /* messages without raw_output; NULL: text is content as it comes */
  int32_t *ctx;      /* prompt, then the sampled ids (a stop id excluded) */
  int64_t n_ctx, cap_ctx, n_prompt;
  char *content; /* no parser: the text so far */
  size_t n_content, cap_content;
  lm_tok_event *raw; /* a batch taken from the channel, raw[i_raw..n_raw) not processed yet */
  size_t n_raw, i_raw;
  int ended; /* the channel has ended (fin valid) */
  int done;  /* LM_EVENT_DONE has been produced */
  lm_finish fin;
  qevent *q; /* pending events q[q_head..q_n) */
  size_t q_head, q_n, q_cap;
  qevent cur; /* the event last returned (its strings live until the next call) */
  int n_calls;
  int start_reasoning; /* the prompt ends inside the reasoning channel */
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void lm_request_options_init(lm_request_options *o) {
  memset(o, 0, sizeof *o);
  lm_sampling_init(&o->sampling);
  o->logprobs = -1;
}

/* ---- events ---------------------------------------------------------------------------------- */

static void qevent_free(qevent *q) {
  free(q->text);
  free(q->name);
  free(q->args);
  memset(q, 0, sizeof *q);
}

static char *dup_n(const char *s, size_t n) {
  char *d = malloc(n + 1);
  if (d) {
    if (n) memcpy(d, s, n);
    d[n] = '\0';
  }
  return d;
}

/* Queues an event; text (len bytes), name and args are copied. */
static lm_status push(lm_request *r, const lm_event *ev, const char *text, size_t len,
                      const char *name, const char *args) {
  if (r->q_n == r->q_cap) {
    if (r->q_head > 0) { /* slide the pending events down before growing */
      memmove(r->q, r->q + r->q_head, (r->q_n - r->q_head) * sizeof *r->q);
      r->q_n -= r->q_head;
      r->q_head = 0;
    }
    if (r->q_n == r->q_cap) {
      size_t cap = r->q_cap ? 2 * r->q_cap : 8;
      qevent *nq = realloc(r->q, cap * sizeof *nq);
      if (!nq) return LM_ERRF(LM_ERR_NOMEM, "out of memory (events)");
      r->q = nq;
      r->q_cap = cap;
    }
  }
  qevent *q = &r->q[r->q_n];
  memset(q, 0, sizeof *q);
  q->ev = *ev;
  q->text = dup_n(text ? text : "", text ? len : 0);
  q->name = name ? strdup(name) : NULL;
  q->args = args ? strdup(args) : NULL;
  if (!q->text || (name && !q->name) || (args && !q->args)) {
    qevent_free(q);
    return LM_ERRF(LM_ERR_NOMEM, "out of memory (events)");
  }
  q->ev.text = q->text;
  q->ev.len = text ? len : 0;
  q->ev.tool_name = q->name;
  q->ev.tool_arguments = q->args;
  r->q_n++;
  return LM_OK;
}

static lm_status push_text(lm_request *r, lm_event_kind kind, const char *t, size_t n) {
  if (!n) return LM_OK;
  lm_event ev = {.kind = kind};
  return push(r, &ev, t, n, NULL, NULL);
}

/* The output parser's events become public ones. */
static lm_status on_parse(void *user, const lm_parse_event *pe) {
  lm_request *r = user;
  switch (pe->kind) {
  case LM_PARSE_CONTENT: return push_text(r, LM_EVENT_CONTENT, pe->text, pe->len);
  case LM_PARSE_REASONING: return push_text(r, LM_EVENT_REASONING, pe->text, pe->len);
  case LM_PARSE_TOOL_CALL: {
    lm_event ev = {.kind = LM_EVENT_TOOL_CALL, .tool_index = r->n_calls++};
    return push(r, &ev, NULL, 0, pe->name, pe->arguments);
  }
  }
  return LM_OK;
}

static lm_status ctx_push(lm_request *r, int32_t id) {
  if (r->n_ctx == r->cap_ctx) {
    int64_t cap = r->cap_ctx ? 2 * r->cap_ctx : 256;
    int32_t *c = realloc(r->ctx, (size_t)cap * sizeof *c);
    if (!c) return LM_ERRF(LM_ERR_NOMEM, "out of memory (context)");
    r->ctx = c;
    r->cap_ctx = cap;
  }
  r->ctx[r->n_ctx++] = id;
  return LM_OK;
}

/* One token from the engine: its TOKEN event, then its text as content (or through the parser). */
static lm_status process(lm_request *r, const lm_tok_event *t) {
  lm_event ev = {.kind = LM_EVENT_TOKEN,
                 .token = t->id,
                 .is_stop = t->is_stop,
                 .logprob = t->logprob,
                 .n_top = t->n_top,
                 .round_start = t->round_start,
                 .n_drafted = t->n_drafted};
  memcpy(ev.drafted, t->drafted, sizeof ev.drafted);
  memcpy(ev.top_ids, t->top_id, sizeof ev.top_ids);
  memcpy(ev.top_logprobs, t->top_lp, sizeof ev.top_logprobs);
  LM_TRY(push(r, &ev, t->text, t->len, NULL, NULL));
  if (!t->is_stop) LM_TRY(ctx_push(r, t->id));
  const char *text = t->text ? t->text : "";
  if (r->parser) return lm_parser_feed(r->parser, t->id, text, t->len);
  LM_TRY(lm_buf_append(&r->content, &r->n_content, &r->cap_content, 256, text, t->len));
  return push_text(r, LM_EVENT_CONTENT, text, t->len);
}

static lm_status push_done(lm_request *r) {
  const lm_finish *f = &r->fin;
  lm_event ev = {.kind = LM_EVENT_DONE,
                 .finish = f->kind,
                 .stop_id = f->stop_id,
                 .stop_index = f->stop_index,
                 .usage = {.prompt_tokens = f->prompt_tokens,
                           .cached_tokens = f->cached_tokens,
                           .completion_tokens = f->completion_tokens,
                           .decode_steps = f->decode_steps,
                           .drafted_tokens = f->drafted_tokens,
                           .accepted_tokens = f->accepted_tokens,
                           .queue_s = f->queue_s,
                           .prefill_s = f->prefill_s,
                           .ttft_s = f->ttft_s,
                           .decode_s = f->decode_s}};
  int failed = f->kind == LM_FIN_ERROR || f->kind == LM_FIN_TIMEOUT || f->kind == LM_FIN_CANCELLED;
  LM_TRY(push(r, &ev, failed ? f->message : NULL, failed ? strlen(f->message) : 0, NULL, NULL));
  qevent *q = &r->q[r->q_n - 1];
  q->ev.error = failed ? q->text : NULL;
  q->ev.text = NULL;
  q->ev.len = 0;
  r->done = 1;
  return LM_OK;
}

/* Produces at least one pending event from what has arrived, or nothing when nothing has. */
static lm_status advance(lm_request *r, int timeout_ms) {
  while (r->q_head == r->q_n && !r->done) {
    if (r->i_raw < r->n_raw) {
      LM_TRY(process(r, &r->raw[r->i_raw++]));
      continue;
    }
    lm_tok_events_free(r->raw, r->n_raw);
    r->raw = NULL;
    r->n_raw = r->i_raw = 0;
    if (r->ended) {
      if (r->parser) LM_TRY(lm_parser_finish(r->parser));
      LM_TRY(push_done(r));
      break;
    }
    r->ended = lm_chan_take(r->ch, timeout_ms, &r->raw, &r->n_raw, &r->fin);
    if (!r->ended && !r->n_raw) break; /* timed out */
  }
  return LM_OK;
}

lm_status lm_request_next(lm_request *r, int timeout_ms, lm_event *ev) {
  qevent_free(&r->cur);
  memset(ev, 0, sizeof *ev);
  double until = timeout_ms >= 0 ? now_s() + timeout_ms / 1000.0 : 0;
  for (;;) {
    int wait = timeout_ms < 0 ? 1000 : (int)((until - now_s()) * 1000.0);
    lm_status s = advance(r, wait > 0 ? wait : 0);
    if (s) {
      lm_chan_cancel(r->ch);
      return s;
    }
    if (r->q_head < r->q_n) break;
    if (r->done) { /* after the end: the end again */
      ev->kind = LM_EVENT_DONE;
      ev->finish = r->fin.kind;
      return LM_OK;
    }
    if (timeout_ms >= 0 && now_s() >= until) return LM_OK; /* LM_EVENT_NONE */
  }
  r->cur = r->q[r->q_head++];
  *ev = r->cur.ev;
  return LM_OK;
}

void lm_request_cancel(lm_request *r) {
  if (r) lm_chan_cancel(r->ch);
}

const int32_t *lm_request_tokens(const lm_request *r, int64_t *n, int64_t *n_prompt) {
  if (n) *n = r->n_ctx;
  if (n_prompt) *n_prompt = r->n_prompt;
  return r->ctx;
}

const char *lm_request_content(const lm_request *r, size_t *len) {
  if (r->parser) {
    if (len) *len = lm_parser_content_len(r->parser);
    return lm_parser_content(r->parser);
  }
  if (len) *len = r->n_content;
  return r->content ? r->content : "";
}

const char *lm_request_reasoning(const lm_request *r, size_t *len) {
  if (len) *len = r->parser ? lm_parser_reasoning_len(r->parser) : 0;
  return r->parser ? lm_parser_reasoning(r->parser) : "";
}

int lm_request_tool_calls(const lm_request *r) { return r->n_calls; }

void lm_request_free(lm_request *r) {
  if (!r) return;
  if (r->job) { /* never started: nothing runs */
    lm_job_free(r->job);
    r->ended = 1;
  }
  if (r->ch) {
    if (!r->ended) lm_chan_cancel(r->ch);
    lm_chan_unref(r->ch);
  }
  lm_tok_events_free(r->raw, r->n_raw);
  qevent_free(&r->cur);
  for (size_t i = r->q_head; i < r->q_n; i++)
    qevent_free(&r->q[i]);
  free(r->q);
  lm_parser_free(r->parser);
  free(r->ctx);
  free(r->content);
  free(r);
}

/* ---- the prompt ------------------------------------------------------------------------------ */

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && !memcmp(s + n - k, suffix, k);
}

/* Tool calls are constrained when asked, and whenever the answer is (its grammar and a call opened
 * at the prompt's end could not both hold). */
static int tools_constrained(const lm_request_options *o) {
  return o->constrain_tools || o->grammar || o->json_schema || o->json_object;
}

/* The opening of a forced call: "<|tool_call>call:" (+ "NAME{" for a named tool); NULL when the
 * choice forces nothing or the vocabulary has no call tokens. */
static lm_status forced_call(const lm_checkpoint *ck, const lm_request_options *o, char **out) {
  *out = NULL;
  if (!ck->gemma4 || (o->tool_choice != LM_TOOLS_REQUIRED && o->tool_choice != LM_TOOLS_NAMED))
    return LM_OK;
  if (tools_constrained(o)) return LM_OK; /* the constraint makes the answer a call */
  int named = o->tool_choice == LM_TOOLS_NAMED;
  if (named && (!o->tool_name || !*o->tool_name || strlen(o->tool_name) > 200))
    return LM_ERRF(LM_ERR_INVALID, "tool_choice names no tool (or a name over 200 bytes)");
  size_t n;
  const char *open = lm_tokenizer_piece(ck->tok, ck->ptok.tool_call_open, &n);
  char buf[256];
  snprintf(buf, sizeof buf, "%.*scall:%s%s", (int)n, open ? open : "", named ? o->tool_name : "",
           named ? "{" : "");
  return (*out = strdup(buf)) ? LM_OK : LM_ERRF(LM_ERR_NOMEM, "out of memory");
}

/* The output parser, told about a prompt that opened a call or a reasoning channel. */
static lm_status make_parser(lm_request *r, int start_reasoning, const char *forced) {
  const lm_checkpoint *ck = r->e->ck;
  lm_parser_opts po = {.format = ck->gemma4 ? LM_PARSER_GEMMA4 : LM_PARSER_GENERIC,
                       .tokens = ck->ptok,
                       .start_in_reasoning = start_reasoning,
                       .emit = on_parse,
                       .user = r};
  LM_TRY(lm_parser_create(&po, &r->parser));
  if (!forced) return LM_OK;
  /* the prompt opened the call: the parser sees it as if the model had written it */
  size_t n = strlen(forced), k = 0;
  const char *open = lm_tokenizer_piece(ck->tok, ck->ptok.tool_call_open, &k);
  LM_TRY(lm_parser_feed(r->parser, ck->ptok.tool_call_open, open, k));
  return lm_parser_feed_text(r->parser, forced + k, n - k);
}

/* messages → the rendered prompt (+ a forced call opening) → ids; the parser for the answer. */
static lm_status chat_prompt(lm_request *r, const lm_request_options *o, int32_t **ids,
                             int64_t *n) {
  const lm_checkpoint *ck = r->e->ck;
  char *prompt = NULL, *forced = NULL;
  LM_TRY(lm_checkpoint_render(ck, o->messages_json, o->tools_json, o->template_kwargs_json, 1,
                              &prompt));
  int start_reasoning = ends_with(prompt, "<|channel>thought\n") || ends_with(prompt, "<think>\n");
  lm_status s = forced_call(ck, o, &forced);
  if (!s && forced) {
    char *full = malloc(strlen(prompt) + strlen(forced) + 1);
    if (!full)
      s = LM_ERRF(LM_ERR_NOMEM, "out of memory");
    else {
      strcat(strcpy(full, prompt), forced);
      free(prompt);
      prompt = full;
      start_reasoning = 0;
    }
  }
  if (!s) s = lm_checkpoint_tokenize(ck, prompt, strlen(prompt), 0, ids, n);
  if (!s && !o->raw_output) s = make_parser(r, start_reasoning, forced);
  r->start_reasoning = start_reasoning;
  free(prompt);
  free(forced);
  return s;
}

static lm_status build_prompt(lm_request *r, const lm_request_options *o, int32_t **ids,
                              int64_t *n) {
  *ids = NULL;
  *n = 0;
  int given = (o->messages_json != NULL) + (o->prompt != NULL) + (o->ids != NULL);
  if (given != 1)
    return LM_ERRF(LM_ERR_INVALID, "a request needs exactly one of messages, prompt and ids");
  if (o->messages_json)
    LM_TRY(chat_prompt(r, o, ids, n));
  else if (o->prompt)
    LM_TRY(lm_checkpoint_tokenize(r->e->ck, o->prompt, strlen(o->prompt), 1, ids, n));
  else {
    if (o->n_ids < 1) return LM_ERRF(LM_ERR_INVALID, "the prompt is empty");
    if (!(*ids = malloc((size_t)o->n_ids * sizeof **ids)))
      return LM_ERRF(LM_ERR_NOMEM, "out of memory");
    memcpy(*ids, o->ids, (size_t)o->n_ids * sizeof **ids);
    *n = o->n_ids;
  }
  if (!*n) return LM_ERRF(LM_ERR_INVALID, "the prompt is empty after tokenization");
  if (!o->messages_json && o->parse_output && !o->raw_output) {
    if (!r->e->ck->tok) return LM_ERRF(LM_ERR_STATE, "parsing the answer needs a tokenizer");
    LM_TRY(make_parser(r, o->starts_in_reasoning, NULL));
  }
  if (!o->messages_json) r->start_reasoning = o->starts_in_reasoning;
  return LM_OK;
}

/* ---- constrained decoding -------------------------------------------------------------------- */

/* The answer's grammar (grammar, json_schema or json_object), compiled or from the cache; an
 * error's message starts with the field's name. */
static lm_status answer_grammar(lm_engine *e, const lm_request_options *o, lm_grammar_ref **out) {
  *out = NULL;
  int given = (o->grammar != NULL) + (o->json_schema != NULL) + (o->json_object != 0);
  if (given > 1)
    return LM_ERRF(LM_ERR_INVALID, "a request takes at most one of grammar, json_schema and "
                                   "json_object");
  lm_grammar_kind kind = o->grammar       ? LM_GRAMMAR_GBNF
                         : o->json_schema ? LM_GRAMMAR_JSON_SCHEMA
                                          : LM_GRAMMAR_JSON_OBJECT;
  const char *text = o->grammar ? o->grammar : o->json_schema ? o->json_schema : "";
  const char *field = o->grammar ? "grammar" : o->json_schema ? "json_schema" : "json_object";
  if (!given) return LM_OK;
  lm_status s = lm_grammar_cache_get(e->grammars, kind, text, strlen(text), out);
  return s ? lm_err_prefix(s, "%s", field) : LM_OK;
}

/* The call grammar of the offered tools (Gemma 4 call syntax), compiled or from the cache. */
static lm_status call_grammar(lm_engine *e, const lm_request_options *o, lm_grammar_ref **out) {
  *out = NULL;
  int forcing = o->tool_choice == LM_TOOLS_REQUIRED || o->tool_choice == LM_TOOLS_NAMED;
  if (!o->tools_json || o->tool_choice == LM_TOOLS_NONE) {
    if (forcing)
      return LM_ERRF(LM_ERR_INVALID, "tool_choice asks for a tool call but no tools are given");
    return LM_OK;
  }
  if (o->tool_choice == LM_TOOLS_NAMED && (!o->tool_name || !*o->tool_name))
    return LM_ERRF(LM_ERR_INVALID, "tool_choice names no tool");
  char *gbnf = NULL;
  LM_TRY(lm_call_grammar_gemma4(o->tools_json,
                                o->tool_choice == LM_TOOLS_NAMED ? o->tool_name : NULL, &gbnf));
  lm_status s = lm_grammar_cache_get(e->grammars, LM_GRAMMAR_GBNF, gbnf, strlen(gbnf), out);
  free(gbnf);
  return s ? lm_err_prefix(s, "tools: the call grammar") : LM_OK;
}

/* 1 when the prompt turns thinking on (Gemma 4: a <|think|> token in it). */
static int thinking_on(const lm_checkpoint *ck, const lm_job *j) {
  for (int64_t i = 0; ck->think_id >= 0 && i < j->n_ids; i++)
    if (j->ids[i] == ck->think_id) return 1;
  return 0;
}

/* The job's constraint, when the request asks for one. */
static lm_status make_constraint(lm_request *r, const lm_request_options *o, lm_job *j) {
  lm_engine *e = r->e;
  lm_checkpoint *ck = e->ck;
  int tools = tools_constrained(o) && ck->gemma4 && o->messages_json;
  lm_constraint_opts co = {.choice = tools ? o->tool_choice : LM_TOOLS_AUTO,
                           .n_vocab = ck->m->cfg.vocab_size,
                           .channel_open = ck->ptok.channel_open,
                           .channel_close = ck->ptok.channel_close,
                           .call_open = ck->ptok.tool_call_open,
                           .call_close = ck->ptok.tool_call_close,
                           .stop_ids = e->stop_sorted,
                           .n_stop_ids = e->n_stop,
                           .start_in_reasoning = r->start_reasoning,
                           .may_reason = thinking_on(ck, j)};
  LM_TRY(answer_grammar(e, o, &co.answer));
  lm_status s = tools ? call_grammar(e, o, &co.calls) : LM_OK;
  if (!s && !co.answer && !co.calls && !(tools && o->tool_choice == LM_TOOLS_NONE)) return LM_OK;
  if (!s) s = lm_checkpoint_grammar_vocab(ck, &co.vocab);
  if (s) {
    lm_grammar_ref_release(co.answer);
    lm_grammar_ref_release(co.calls);
    return s;
  }
  return lm_constraint_create(&co, &j->con);
}

/* ---- submitting ------------------------------------------------------------------------------ */

/* Every id the request names (prompt, logit bias, suppressed ids) must be in the vocabulary. */
static lm_status check_ids(const lm_request *r, const lm_job *j) {
  int64_t V = r->e->ck->m->cfg.vocab_size;
  for (int64_t i = 0; i < j->n_ids; i++)
    if (j->ids[i] < 0 || j->ids[i] >= V)
      return LM_ERRF(LM_ERR_INVALID, "prompt token %lld: id %d is outside the vocabulary (%lld)",
                     (long long)i, j->ids[i], (long long)V);
  for (int32_t i = 0; i < j->sampling.n_bias; i++)
    if (j->sampling.bias[i].id >= V)
      return LM_ERRF(LM_ERR_INVALID, "logit bias %d: id %d is outside the vocabulary (%lld)", i,
                     j->sampling.bias[i].id, (long long)V);
  for (int32_t i = 0; i < j->sampling.n_suppress; i++)
    if (j->sampling.suppress[i] >= V)
      return LM_ERRF(LM_ERR_INVALID, "suppressed id %d is outside the vocabulary (%lld)",
                     j->sampling.suppress[i], (long long)V);
  return LM_OK;
}

/* The request's speculative decoding: the drafts per step (0: off) and their source. */
static lm_status spec_options(const lm_engine *e, const lm_request_options *o, int *tokens,
                              int *draft) {
  *tokens = *draft = 0;
  if (!o->speculative) return LM_OK;
  *draft = !strcmp(o->speculative, "draft");
  if (strcmp(o->speculative, "ngram") && !*draft)
    return LM_ERRF(LM_ERR_INVALID, "speculative: unknown draft source '%s' (ngram, draft)",
                   o->speculative);
  if (*draft && !e->draft)
    return LM_ERRF(LM_ERR_INVALID,
                   "speculative: \"draft\" needs an engine with a draft model (draft_model)");
  int most = e->o.speculative_tokens;
  if (most < 1)
    return LM_ERRF(LM_ERR_INVALID,
                   "speculative: this engine was created without room for drafts (its "
                   "speculative_tokens is 0)");
  if (e->be->exact_rows < 2)
    return LM_ERRF(LM_ERR_UNSUPPORTED,
                   "speculative: the %s backend does not yet compute the rows of a multi-token "
                   "step exactly as one-token steps, which verifying drafts needs",
                   e->be->ops->name);
  if (o->speculative_tokens < 0 || o->speculative_tokens > most)
    return LM_ERRF(LM_ERR_INVALID, "speculative_tokens must be 1..%d on this engine (got %d)", most,
                   o->speculative_tokens);
  *tokens = o->speculative_tokens ? o->speculative_tokens : most;
  return LM_OK;
}

static lm_status fill_job(lm_request *r, const lm_request_options *o, lm_job *j) {
  if (o->max_tokens < 0) return LM_ERRF(LM_ERR_INVALID, "max_tokens must be >= 0");
  if (o->logprobs > LM_TOP_LOGPROBS_MAX)
    return LM_ERRF(LM_ERR_INVALID, "logprobs must be <= %d", LM_TOP_LOGPROBS_MAX);
  if (o->n_stop < 0 || (o->n_stop && !o->stop)) return LM_ERRF(LM_ERR_INVALID, "bad stop list");
  lm_sampling_clear(&j->sampling);
  LM_TRY(lm_sampling_copy(&j->sampling, &o->sampling));
  if (!o->has_seed)
    j->sampling.seed = lm_mix64(atomic_fetch_add(&r->e->seq, 1) ^ (uint64_t)(now_s() * 1e9)) >> 1;
  LM_TRY(lm_sampling_validate(&j->sampling));
  LM_TRY(check_ids(r, j));
  if (o->n_stop) {
    if (!r->e->ck->tok) return LM_ERRF(LM_ERR_INVALID, "stop strings need a tokenizer");
    if (!(j->stops = calloc((size_t)o->n_stop, sizeof *j->stops)))
      return LM_ERRF(LM_ERR_NOMEM, "out of memory");
    for (; j->n_stops < o->n_stop; j->n_stops++) {
      const char *st = o->stop[j->n_stops];
      if (!st || !*st) return LM_ERRF(LM_ERR_INVALID, "stop string %d is empty", j->n_stops);
      if (!lm_utf8_valid(st, strlen(st)))
        return LM_ERRF(LM_ERR_INVALID, "stop string %d is not valid UTF-8", j->n_stops);
      if (!(j->stops[j->n_stops] = strdup(st))) return LM_ERRF(LM_ERR_NOMEM, "out of memory");
    }
  }
  j->max_tokens = o->max_tokens;
  j->ignore_eos = o->ignore_eos;
  j->top_logprobs = o->logprobs < 0 ? -1 : o->logprobs;
  j->keep_control = r->parser != NULL;
  j->keep_special = o->raw_output;
  j->share_prompt = o->share_prompt;
  LM_TRY(spec_options(r->e, o, &j->spec_tokens, &j->spec_draft));
  LM_TRY(lm_engine_pick_adapters(r->e, o, j));
  if (j->spec_tokens && j->n_lora)
    return LM_ERRF(LM_ERR_UNSUPPORTED,
                   "speculative decoding does not combine with LoRA adapters yet (its exactness "
                   "is not established through the adapters' products)");
  j->t_submit = now_s();
  r->timeout_s = o->timeout_s > 0 ? o->timeout_s : 0;
  j->deadline = r->timeout_s > 0 ? j->t_submit + r->timeout_s : 0;
  return LM_OK;
}

lm_status lm_request_create(lm_engine *e, const lm_request_options *o, lm_request **out) {
  *out = NULL;
  if (!e || !o) return LM_ERRF(LM_ERR_INVALID, "lm_request_create: NULL argument");
  lm_request *r = calloc(1, sizeof *r);
  if (!r) return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  r->e = e;
  int32_t *ids = NULL;
  int64_t n = 0;
  lm_status s = build_prompt(r, o, &ids, &n);
  if (!s) s = lm_job_create(&r->job, &r->ch);
  if (!s) {
    r->job->ids = ids;
    r->job->n_ids = n;
    ids = NULL;
    s = fill_job(r, o, r->job);
  }
  if (!s) s = make_constraint(r, o, r->job);
  for (int64_t i = 0; !s && i < r->job->n_ids; i++)
    s = ctx_push(r, r->job->ids[i]);
  if (s) {
    free(ids);
    lm_request_free(r);
    return s;
  }
  r->n_prompt = r->job->n_ids;
  *out = r;
  return LM_OK;
}

lm_status lm_request_set_max_tokens(lm_request *r, int64_t max_tokens) {
  if (!r->job) return LM_ERRF(LM_ERR_STATE, "the request has started");
  if (max_tokens < 0) return LM_ERRF(LM_ERR_INVALID, "max_tokens must be >= 0");
  r->job->max_tokens = max_tokens;
  return LM_OK;
}

lm_status lm_request_start(lm_request *r) {
  if (!r->job) return LM_ERRF(LM_ERR_STATE, "the request has started");
  char msg[512];
  r->admission = lm_sched_check(r->e->sched, r->job->n_ids, r->job->max_tokens, msg, sizeof msg);
  if (r->admission) return LM_ERRF(LM_ERR_INVALID, "%s", msg);
  r->job->t_submit = now_s();
  if (r->job->deadline > 0) r->job->deadline = r->job->t_submit + r->timeout_s;
  LM_TRY(lm_sched_submit(r->e->sched, r->job));
  r->job = NULL; /* the scheduler's now */
  return LM_OK;
}

lm_admission lm_request_admission(const lm_request *r) { return r->admission; }

lm_status lm_request_submit(lm_engine *e, const lm_request_options *o, lm_request **out) {
  LM_TRY(lm_request_create(e, o, out));
  lm_status s = lm_request_start(*out);
  if (s) {
    lm_request_free(*out);
    *out = NULL;
  }
  return s;
}
