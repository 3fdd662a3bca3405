/* srv_metrics.c — counters, histograms and the Prometheus text format (srv_metrics.h). */
#include "server/srv_metrics.h"

#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"

static const double bounds[LM_SRV_HIST_BUCKETS] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,
                                                   2.5,   5,    10,    20,   30,  60,   120, 300};
static const char *const ep_names[LM_SRV_EP_N] = {"/v1/chat/completions",
                                                  "/v1/completions",
                                                  "/v1/messages",
                                                  "/v1/models",
                                                  "/health",
                                                  "/stats",
                                                  "/metrics",
                                                  "/",
                                                  "/v1/responses",
                                                  "/v1/messages/count_tokens",
                                                  "/tokenize",
                                                  "/detokenize",
                                                  "/apply-template",
                                                  "other"};
static const char *const class_names[LM_SRV_STATUS_CLASSES] = {"2xx", "400", "401", "404", "405",
                                                               "413", "429", "4xx", "5xx"};

void lm_srv_metrics_init(lm_srv_metrics *m) {
  memset(m, 0, sizeof *m);
  pthread_mutex_init(&m->mu, NULL);
}

void lm_srv_metrics_destroy(lm_srv_metrics *m) { pthread_mutex_destroy(&m->mu); }

lm_srv_ep lm_srv_metrics_endpoint(const char *path) {
  for (int i = 0; i < LM_SRV_EP_OTHER; i++)
    if (!strcmp(path, ep_names[i])) return (lm_srv_ep)i;
  if (!strncmp(path, "/v1/models/", 11)) return LM_SRV_EP_MODELS;
  if (!strncmp(path, "/v1/responses/", 14)) return LM_SRV_EP_RESPONSES;
  if (!strcmp(path, "/index.html")) return LM_SRV_EP_WEB;
  return LM_SRV_EP_OTHER;
}

static int status_class(int status) {
  switch (status) {
  case 400: return 1;
  case 401:
  case 403: return 2;
  case 404: return 3;
  case 405: return 4;
  case 413: return 5;
  case 429: return 6;
  default: return status < 400 ? 0 : status >= 500 ? 8 : 7;
  }
}

void lm_srv_metrics_request(lm_srv_metrics *m, lm_srv_ep ep, int status) {
  pthread_mutex_lock(&m->mu);
  m->requests[ep][status_class(status)]++;
  pthread_mutex_unlock(&m->mu);
}

static void observe(lm_srv_hist *h, double x) {
  int b = 0;
  while (b < LM_SRV_HIST_BUCKETS && x > bounds[b])
    b++;
  h->count[b]++;
  h->recent[h->n % LM_SRV_SAMPLES] = x;
  h->n++;
  h->sum += x;
}

void lm_srv_metrics_generation(lm_srv_metrics *m, int64_t prompt, int64_t cached,
                               int64_t completion, double ttft, double latency) {
  pthread_mutex_lock(&m->mu);
  m->prompt_tokens += (uint64_t)prompt;
  m->cached_tokens += (uint64_t)cached;
  m->completion_tokens += (uint64_t)completion;
  if (ttft > 0) observe(&m->ttft, ttft);
  observe(&m->latency, latency);
  pthread_mutex_unlock(&m->mu);
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

double lm_srv_metrics_percentile(lm_srv_metrics *m, const lm_srv_hist *h, double p) {
  static_assert(LM_SRV_SAMPLES <= 4096, "the copy below lives on the stack");
  double v[LM_SRV_SAMPLES];
  pthread_mutex_lock(&m->mu);
  size_t n = h->n < LM_SRV_SAMPLES ? (size_t)h->n : LM_SRV_SAMPLES;
  memcpy(v, h->recent, n * sizeof *v);
  pthread_mutex_unlock(&m->mu);
  if (!n) return 0;
  qsort(v, n, sizeof *v, cmp_d);
  size_t k = (size_t)(p / 100.0 * (double)(n - 1) + 0.5);
  return v[k < n ? k : n - 1];
}

typedef struct tbuf {
  char *p;
  size_t n, cap;
} tbuf;

static void put(tbuf *b, const char *fmt, ...) LM_PRINTF(2, 3);
static void put(tbuf *b, const char *fmt, ...) {
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int k = b->p ? vsnprintf(b->p + b->n, b->cap - b->n, fmt, ap) : -1;
    va_end(ap);
    if (k >= 0 && (size_t)k < b->cap - b->n) {
      b->n += (size_t)k;
      return;
    }
    size_t cap = b->cap ? 2 * b->cap : 8192;
    char *p = realloc(b->p, cap);
    if (!p) return; /* truncated output rather than a crash */
    b->p = p;
    b->cap = cap;
  }
}

static void put_hist(tbuf *b, const char *name, const char *help, const lm_srv_hist *h) {
  put(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
  uint64_t cum = 0;
  for (int i = 0; i < LM_SRV_HIST_BUCKETS; i++) {
    cum += h->count[i];
    put(b, "%s_bucket{le=\"%g\"} %llu\n", name, bounds[i], (unsigned long long)cum);
  }
  cum += h->count[LM_SRV_HIST_BUCKETS];
  put(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name, (unsigned long long)cum,
      name, h->sum, name, (unsigned long long)h->n);
}

static void put_gauge(tbuf *b, const char *name, const char *type, const char *help, double v) {
  put(b, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
}

static void put_sched(tbuf *b, const lm_engine_stats *st) {
  put_gauge(b, "lumen_sequences_active", "gauge", "Sequences in the running batch.", st->active);
  put_gauge(b, "lumen_sequences_prefilling", "gauge",
            "Active sequences still prefilling their prompt.", st->prefilling);
  put_gauge(b, "lumen_queue_length", "gauge", "Requests waiting for a slot.", st->queued);
  put_gauge(b, "lumen_queue_capacity", "gauge", "Requests the queue holds before answering 429.",
            st->queue_cap);
  put_gauge(b, "lumen_kv_budget_bytes", "gauge", "Bytes the KV caches may use.",
            (double)st->kv_budget);
  put_gauge(b, "lumen_kv_reserved_bytes", "gauge",
            "KV bytes reserved by admitted requests and the prompt cache.",
            (double)st->kv_reserved);
  put_gauge(b, "lumen_kv_held_bytes", "gauge", "KV bytes the caches hold now.",
            (double)st->kv_held);
  put_gauge(b, "lumen_prompt_cache_entries", "gauge", "Finished sequences kept for prefix reuse.",
            st->prefix_entries);
  put_gauge(b, "lumen_prompt_cache_hits_total", "counter", "Requests that reused a cached prefix.",
            (double)st->prefix_hits);
  put_gauge(b, "lumen_prompt_cache_misses_total", "counter",
            "Requests that found no cached prefix.", (double)st->prefix_misses);
  put_gauge(b, "lumen_prompt_cache_reused_tokens_total", "counter",
            "Prompt tokens served from the prompt cache.", (double)st->prefix_tokens_reused);
  put_gauge(b, "lumen_steps_total", "counter", "Forward steps run.", (double)st->steps);
  put_gauge(b, "lumen_step_tokens_total", "counter", "Tokens fed through forward steps.",
            (double)st->step_tokens);
  put_gauge(b, "lumen_prefill_tokens_total", "counter", "Prompt tokens prefilled.",
            (double)st->prefill_tokens);
  put_gauge(b, "lumen_sampled_tokens_total", "counter", "Tokens sampled.",
            (double)st->decode_tokens);
  put_gauge(b, "lumen_engine_busy_seconds_total", "counter", "Time the engine spent in steps.",
            st->busy_s);
  put_gauge(b, "lumen_constraint_seconds_total", "counter",
            "Time the constraints' masks took (part of the busy time).", st->constraint_s);
  put_gauge(b, "lumen_constraint_wait_seconds_total", "counter",
            "Time steps waited for masks filled while their forward ran.", st->constraint_wait_s);
  put_gauge(b, "lumen_constrained_tokens_total", "counter",
            "Tokens sampled under a constraint (grammar, schema, tool calls).",
            (double)st->constrained_tokens);
  put_gauge(b, "lumen_spec_steps_total", "counter",
            "Decode steps of speculating sequences (one per sequence and step).",
            (double)st->spec_steps);
  put_gauge(b, "lumen_spec_drafted_tokens_total", "counter",
            "Draft tokens speculating sequences verified.", (double)st->spec_drafted);
  put_gauge(b, "lumen_spec_accepted_tokens_total", "counter", "Draft tokens the model accepted.",
            (double)st->spec_accepted);
  put_gauge(b, "lumen_spec_tokens_total", "counter",
            "Tokens speculating sequences' decode steps gave (accepted drafts + one per step).",
            (double)st->spec_emitted);
  put(b,
      "# HELP lumen_jobs_total Generations ended, by outcome.\n# TYPE lumen_jobs_total counter\n");
  put(b,
      "lumen_jobs_total{outcome=\"done\"} %lld\nlumen_jobs_total{outcome=\"cancelled\"} %lld\n"
      "lumen_jobs_total{outcome=\"timeout\"} %lld\nlumen_jobs_total{outcome=\"error\"} %lld\n",
      (long long)st->requests_done, (long long)st->requests_cancelled,
      (long long)st->requests_timeout, (long long)st->requests_failed);
}

char *lm_srv_metrics_render(lm_srv_metrics *m, const lm_engine_stats *st) {
  tbuf b = {0};
  pthread_mutex_lock(&m->mu);
  put(&b, "# HELP lumen_requests_total HTTP requests, by endpoint and status class.\n"
          "# TYPE lumen_requests_total counter\n");
  for (int e = 0; e < LM_SRV_EP_N; e++)
    for (int c = 0; c < LM_SRV_STATUS_CLASSES; c++)
      if (m->requests[e][c])
        put(&b, "lumen_requests_total{endpoint=\"%s\",status=\"%s\"} %llu\n", ep_names[e],
            class_names[c], (unsigned long long)m->requests[e][c]);
  put_gauge(&b, "lumen_prompt_tokens_total", "counter", "Prompt tokens of finished generations.",
            (double)m->prompt_tokens);
  put_gauge(&b, "lumen_cached_prompt_tokens_total", "counter",
            "Prompt tokens that came from the prompt cache.", (double)m->cached_tokens);
  put_gauge(&b, "lumen_completion_tokens_total", "counter", "Tokens generated.",
            (double)m->completion_tokens);
  put_hist(&b, "lumen_time_to_first_token_seconds", "Time from the request to its first token.",
           &m->ttft);
  put_hist(&b, "lumen_request_latency_seconds", "Time from the request to its last token.",
           &m->latency);
  pthread_mutex_unlock(&m->mu);
  put_sched(&b, st);
  return b.p;
}
