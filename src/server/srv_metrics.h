/* srv_metrics.h — request counters and latency histograms, rendered as Prometheus text (GET
 * /metrics) together with the scheduler's counters. Thread-safe (one mutex). */
#ifndef LM_SERVER_SRV_METRICS_H
#define LM_SERVER_SRV_METRICS_H

#include <pthread.h>
#include <stdint.h>

#include "lumen.h"

typedef enum lm_srv_ep {
  LM_SRV_EP_CHAT = 0,
  LM_SRV_EP_COMPLETIONS,
  LM_SRV_EP_MESSAGES,
  LM_SRV_EP_MODELS,
  LM_SRV_EP_HEALTH,
  LM_SRV_EP_STATS,
  LM_SRV_EP_METRICS,
  LM_SRV_EP_WEB,       /* the chat page: / and /index.html */
  LM_SRV_EP_RESPONSES, /* /v1/responses and /v1/responses/ID */
  LM_SRV_EP_COUNT_TOKENS,
  LM_SRV_EP_TOKENIZE,
  LM_SRV_EP_DETOKENIZE,
  LM_SRV_EP_APPLY_TEMPLATE,
  LM_SRV_EP_OTHER,
  LM_SRV_EP_N
} lm_srv_ep;

#define LM_SRV_HIST_BUCKETS 16
#define LM_SRV_SAMPLES 1024

typedef struct lm_srv_hist {
  uint64_t count[LM_SRV_HIST_BUCKETS + 1]; /* per bucket (not cumulative); the last is +Inf */
  double sum;
  uint64_t n;
  double recent[LM_SRV_SAMPLES]; /* ring of the latest samples (percentiles in /stats) */
} lm_srv_hist;

enum { LM_SRV_STATUS_CLASSES = 9 };

typedef struct lm_srv_metrics {
  pthread_mutex_t mu;
  /* by status class: 2xx, 400, 401/403, 404, 405, 413, 429, other 4xx (499: the client left), 5xx
   */
  uint64_t requests[LM_SRV_EP_N][LM_SRV_STATUS_CLASSES];
  uint64_t prompt_tokens, cached_tokens, completion_tokens;
  lm_srv_hist ttft, latency;
} lm_srv_metrics;

void lm_srv_metrics_init(lm_srv_metrics *m);
void lm_srv_metrics_destroy(lm_srv_metrics *m);
lm_srv_ep lm_srv_metrics_endpoint(const char *path);
void lm_srv_metrics_request(lm_srv_metrics *m, lm_srv_ep ep, int status);
/* A finished generation: its token counts, time to first token and whole latency (seconds). */
void lm_srv_metrics_generation(lm_srv_metrics *m, int64_t prompt, int64_t cached,
                               int64_t completion, double ttft, double latency);
/* The p-th percentile (0..100) of the recent samples of h (0 when none). Takes m->mu. */
double lm_srv_metrics_percentile(lm_srv_metrics *m, const lm_srv_hist *h, double p);
/* The Prometheus text exposition (malloc'ed). */
char *lm_srv_metrics_render(lm_srv_metrics *m, const lm_engine_stats *st);

#endif
