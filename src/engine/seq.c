/* seq.c — one running sequence (seq.h): sampling with log-probabilities, the stop rules
 * and the text of each token. */
#include "engine/seq.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/status.h"
#include "engine/constraint.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_i32(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

static int in_sorted(const int32_t *v, int32_t n, int32_t id) {
  return n > 0 && bsearch(&id, v, (size_t)n, sizeof id, cmp_i32) != NULL;
}

lm_status lm_seq_init(lm_seq *q, const lm_seq_env *env, lm_job *job, lm_kv_set *kv,
                      int64_t cached) {
  memset(q, 0, sizeof *q);
  q->job = job;
  q->kv = kv;
  q->cached = cached;
  q->n_prompt = job->n_ids;
  /* room for the whole response when it is bounded; else it grows (hist_push) */
  q->cap_hist = job->n_ids + (job->max_tokens > 0 ? job->max_tokens : 256) + 1;
  q->hist = malloc((size_t)q->cap_hist * sizeof *q->hist);
  lm_status s = q->hist ? LM_OK
                        : LM_ERRF(LM_ERR_NOMEM, "engine: out of memory (context of %lld tokens)",
                                  (long long)q->cap_hist);
  if (!s) {
    memcpy(q->hist, job->ids, (size_t)job->n_ids * sizeof *q->hist);
    q->n_hist = job->n_ids;
    s = lm_sampler_create(&job->sampling, &q->smp);
  }
  if (!s) s = lm_sampler_reserve(q->smp, env->vocab);
  if (!s && env->tok) s = lm_detok_create(env->tok, 0, &q->dt); /* no tokenizer: ids only */
  if (s) {
    lm_seq_clear(q);
    lm_kv_set_free(kv);
    q->kv = NULL;
    return s;
  }
  lm_stop_hold_init(&q->stop, job->stops, job->n_stops);
  return LM_OK;
}

void lm_seq_clear(lm_seq *q) {
  free(q->hist);
  q->hist = NULL;
  lm_sampler_free(q->smp);
  q->smp = NULL;
  lm_detok_free(q->dt);
  q->dt = NULL;
  lm_stop_hold_clear(&q->stop);
  free(q->scratch);
  q->scratch = NULL;
}

int lm_seq_plain_greedy(const lm_seq *q) {
  const lm_sampling *p = lm_sampler_params(q->smp);
  return p->temperature <= 0 && p->repeat_penalty == 1.0f && p->presence_penalty == 0 &&
         p->frequency_penalty == 0 && p->n_bias == 0 && p->n_suppress == 0 &&
         q->job->top_logprobs < 0 && !q->job->con; /* a constraint masks the logits */
}

/* log-sum-exp of row[0..V) (NaN and -inf count as -inf). */
static double log_sum_exp(const float *row, int64_t V) {
  float mx = -INFINITY;
  for (int64_t i = 0; i < V; i++)
    if (row[i] > mx) mx = row[i];
  if (!isfinite(mx)) return mx;
  double s = 0;
  for (int64_t i = 0; i < V; i++)
    if (row[i] > -INFINITY) s += exp((double)row[i] - mx);
  return mx + log(s);
}

/* The n highest entries of row (ties: lower id first), as log-probabilities. */
static void top_n(const float *row, int64_t V, double lse, int n, lm_tok_event *tok) {
  tok->n_top = 0;
  for (int64_t i = 0; i < V; i++) {
    float x = row[i];
    if (!(x > -INFINITY)) continue;
    int k = tok->n_top;
    if (k == n && !(x > tok->top_lp[n - 1])) continue;
    if (k < n)
      tok->n_top++;
    else
      k = n - 1;
    while (k > 0 && x > tok->top_lp[k - 1]) {
      tok->top_lp[k] = tok->top_lp[k - 1];
      tok->top_id[k] = tok->top_id[k - 1];
      k--;
    }
    tok->top_lp[k] = x;
    tok->top_id[k] = (int32_t)i;
  }
  for (int k = 0; k < tok->n_top; k++)
    tok->top_lp[k] = (float)(tok->top_lp[k] - lse);
}

int32_t lm_seq_sample(lm_seq *q, const lm_seq_env *env, float *row, lm_tok_event *tok) {
  int want = q->job->top_logprobs;
  if (q->job->con) { /* before every processor: top-k, top-p, min-p see what may come */
    double t0 = now_s();
    lm_status s = lm_constraint_apply(q->job->con, row);
    q->con_s += now_s() - t0;
    if (s) return -1;
  }
  const float *raw = row;
  if (want >= 0) {
    if (!q->scratch && !(q->scratch = malloc((size_t)env->vocab * sizeof *q->scratch))) {
      (void)LM_ERRF(LM_ERR_NOMEM, "engine: out of memory (logprobs)");
      return -1;
    }
    memcpy(q->scratch, row, (size_t)env->vocab * sizeof *row);
    raw = q->scratch;
  }
  int32_t id = lm_sampler_sample(q->smp, row, env->vocab, q->hist, q->n_hist);
  if (id < 0 || want < 0) return id;
  double lse = log_sum_exp(raw, env->vocab);
  tok->logprob = (float)(raw[id] - lse);
  if (want > 0) top_n(raw, env->vocab, lse, want, tok);
  return id;
}

static lm_status hist_push(lm_seq *q, int32_t id) {
  if (q->n_hist == q->cap_hist) {
    int64_t cap = 2 * q->cap_hist;
    int32_t *h = realloc(q->hist, (size_t)cap * sizeof *h);
    if (!h)
      return LM_ERRF(LM_ERR_NOMEM, "engine: out of memory (context of %lld tokens)",
                     (long long)cap);
    q->hist = h;
    q->cap_hist = cap;
  }
  q->hist[q->n_hist++] = id;
  return LM_OK;
}

static void fill_usage(lm_seq *q, double now) {
  lm_finish *f = &q->fin;
  f->prompt_tokens = q->n_prompt;
  f->cached_tokens = q->cached;
  f->completion_tokens = q->n_gen;
  f->decode_steps = q->steps;
  f->drafted_tokens = q->drafted;
  f->accepted_tokens = q->accepted;
  f->queue_s = q->t_admit > 0 ? q->t_admit - q->job->t_submit : now - q->job->t_submit;
  f->prefill_s = q->t_prefilled > 0 ? q->t_prefilled - q->t_admit : 0;
  f->ttft_s = q->t_first > 0 ? q->t_first - q->job->t_submit : 0;
  f->decode_s = q->t_first > 0 ? now - q->t_first : 0;
}

void lm_seq_end(lm_seq *q, lm_finish_kind kind, const char *message, double now) {
  if (q->fin.kind) return;
  q->fin.kind = kind;
  q->fin.stop_id = -1;
  q->fin.stop_index = -1;
  if (message) snprintf(q->fin.message, sizeof q->fin.message, "%s", message);
  fill_usage(q, now);
}

/* Text of id through the detokenizer (special tokens only when the job streams them all, or
 * streams control tokens and id is one of them; no text without a tokenizer), then the stop
 * matcher. final: flush both. */
static lm_status token_text(lm_seq *q, const lm_seq_env *env, int32_t id, int final,
                            lm_tok_event *tok) {
  const char *t = "";
  size_t n = 0;
  int skip = id < 0 || !q->dt ||
             (lm_tokenizer_is_special(env->tok, id) && !q->job->keep_special &&
              !(q->job->keep_control && in_sorted(env->keep_special, env->n_keep_special, id)));
  if (!skip) LM_TRY(lm_detok_push(q->dt, id, &t, &n));
  char *a = NULL, *b = NULL;
  size_t na = 0, nb = 0;
  LM_TRY(lm_stop_hold_push(&q->stop, t, n, 0, &a, &na));
  if (final && q->stop.matched < 0) {
    lm_status s = q->dt ? lm_detok_flush(q->dt, &t, &n) : LM_OK;
    if (!s) s = lm_stop_hold_push(&q->stop, t, n, 1, &b, &nb);
    if (s) {
      free(a);
      return s;
    }
  }
  if (nb) {
    char *c = realloc(a, na + nb + 1);
    if (!c) {
      free(a);
      free(b);
      return LM_ERRF(LM_ERR_NOMEM, "engine: out of memory");
    }
    memcpy(c + na, b, nb + 1);
    a = c;
    na += nb;
    free(b);
  }
  tok->text = a;
  tok->len = na;
  return LM_OK;
}

lm_status lm_seq_accept(lm_seq *q, const lm_seq_env *env, int32_t id, lm_tok_event *tok,
                        double now) {
  tok->id = id;
  q->n_gen++;
  if (q->n_gen == 1) q->t_first = now;
  lm_finish_kind end = LM_FIN_NONE;
  int done = 0; /* the constraint's grammar is finished: nothing may follow */
  if (q->job->con) {
    double t0 = now_s();
    lm_status s = lm_constraint_accept(q->job->con, id);
    done = !s && lm_constraint_finished(q->job->con);
    q->con_s += now_s() - t0;
    LM_TRY(s);
  }
  if (!q->job->ignore_eos && in_sorted(env->stop_ids, env->n_stop_ids, id)) {
    tok->is_stop = 1;
    end = LM_FIN_STOP;
    LM_TRY(token_text(q, env, -1, 1, tok));
  } else {
    LM_TRY(hist_push(q, id)); /* pending: fed by the next step */
    int length =
        (q->job->max_tokens > 0 && q->n_gen >= q->job->max_tokens) || q->n_hist >= env->max_ctx;
    LM_TRY(token_text(q, env, id, length || done, tok));
    if (q->stop.matched >= 0)
      end = LM_FIN_STOP_STR;
    else if (done)
      end = LM_FIN_STOP; /* a stop, without a stop id */
    else if (length)
      end = LM_FIN_LENGTH;
  }
  lm_status s = lm_chan_push(q->job->ch, tok);
  if (end) {
    lm_seq_end(q, end, NULL, now);
    if (end == LM_FIN_STOP && !done) q->fin.stop_id = id;
    if (end == LM_FIN_STOP_STR) q->fin.stop_index = q->stop.matched;
  }
  return s;
}
