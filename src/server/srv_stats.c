/* srv_stats.c — GET /stats: sequences, queue, prompt cache, KV use and the cache plan (one
 * signature per cache with its bytes per token and capacity), admission limits, batching
 * counters (with the constraints' share) and recent time-to-first-token percentiles. */
#include <time.h>

#include "server/srv_route.h"

static json_t *caches_json(const lm_server *s) {
  json_t *a = json_array();
  for (int c = 0; c < s->ei.n_caches; c++) {
    char sig[64];
    int layer = 0;
    int64_t bpt = 0, cap = 0;
    lm_engine_cache(s->e, c, &layer, sig, sizeof sig, &bpt, &cap);
    json_array_append_new(
        a, json_pack("{s:i,s:i,s:s,s:I,s:o}", "cache", c, "layer", layer, "signature", sig,
                     "bytes_per_token", (json_int_t)bpt, "capacity",
                     cap < INT64_MAX ? json_integer(cap) : json_string("unbounded")));
  }
  return a;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

json_t *lm_srv_stats_json(lm_server *s) {
  lm_engine_stats st;
  lm_engine_get_stats(s->e, &st);
  lm_srv_metrics *m = &s->metrics;
  json_t *seq = json_pack("{s:i,s:i,s:i,s:i}", "active", st.active, "prefilling", st.prefilling,
                          "decoding", st.decoding, "parallel", st.parallel);
  json_t *queue = json_pack("{s:i,s:i}", "length", st.queued, "capacity", st.queue_cap);
  json_t *pc =
      json_pack("{s:i,s:I,s:I,s:I,s:I}", "entries", st.prefix_entries, "bytes",
                (json_int_t)st.prefix_bytes, "hits", (json_int_t)st.prefix_hits, "misses",
                (json_int_t)st.prefix_misses, "tokens_reused", (json_int_t)st.prefix_tokens_reused);
  json_t *kv =
      json_pack("{s:s,s:I,s:I,s:I,s:I,s:o}", "kv_quant", s->o.kv_quant ? s->o.kv_quant : "off",
                "budget_bytes", (json_int_t)st.kv_budget, "reserved_bytes",
                (json_int_t)st.kv_reserved, "held_bytes", (json_int_t)st.kv_held, "bytes_per_token",
                (json_int_t)s->ei.kv_bytes_per_token, "caches", caches_json(s));
  json_t *adm = json_pack("{s:I,s:I,s:I,s:I}", "max_context", (json_int_t)s->ei.context,
                          "max_safe_context", (json_int_t)s->ei.max_sequence_context,
                          "weight_bytes", (json_int_t)s->ci.weight_bytes, "workspace_bytes",
                          (json_int_t)s->ei.workspace_bytes);
  json_t *batch =
      json_pack("{s:I,s:I,s:I,s:I,s:I,s:f,s:f}", "steps", (json_int_t)st.steps, "step_tokens",
                (json_int_t)st.step_tokens, "step_rows", (json_int_t)st.step_rows, "prefill_tokens",
                (json_int_t)st.prefill_tokens, "sampled_tokens", (json_int_t)st.decode_tokens,
                "mean_rows_per_step", st.steps ? (double)st.step_rows / (double)st.steps : 0.0,
                "busy_s", st.busy_s);
  /* constrained decoding: the host time of the masks, per constrained token and of the busy time,
   * and how long steps waited for masks filled during their forward */
  json_object_set_new(
      batch, "constraint",
      json_pack("{s:I,s:f,s:f,s:f,s:f,s:f}", "tokens", (json_int_t)st.constrained_tokens, "seconds",
                st.constraint_s, "us_per_token",
                st.constrained_tokens ? 1e6 * st.constraint_s / (double)st.constrained_tokens : 0.0,
                "share_of_busy", st.busy_s > 0 ? st.constraint_s / st.busy_s : 0.0, "wait_seconds",
                st.constraint_wait_s, "wait_share_of_busy",
                st.busy_s > 0 ? st.constraint_wait_s / st.busy_s : 0.0));
  /* speculative decoding: the share of drafts accepted, and the tokens a speculating sequence's
   * step gave on average */
  json_object_set_new(
      batch, "speculative",
      json_pack("{s:s?,s:I,s:I,s:I,s:I,s:I,s:f,s:f}", "default", s->o.speculative, "steps",
                (json_int_t)st.spec_steps, "rounds", (json_int_t)st.spec_rounds, "drafted_tokens",
                (json_int_t)st.spec_drafted, "accepted_tokens", (json_int_t)st.spec_accepted,
                "tokens", (json_int_t)st.spec_emitted, "acceptance",
                st.spec_drafted ? (double)st.spec_accepted / (double)st.spec_drafted : 0.0,
                "tokens_per_step",
                st.spec_steps ? (double)st.spec_emitted / (double)st.spec_steps : 0.0));
  json_t *jobs =
      json_pack("{s:I,s:I,s:I,s:I}", "done", (json_int_t)st.requests_done, "cancelled",
                (json_int_t)st.requests_cancelled, "timeout", (json_int_t)st.requests_timeout,
                "failed", (json_int_t)st.requests_failed);
  json_t *lat =
      json_pack("{s:f,s:f,s:f,s:f}", "ttft_p50_s", lm_srv_metrics_percentile(m, &m->ttft, 50),
                "ttft_p99_s", lm_srv_metrics_percentile(m, &m->ttft, 99), "latency_p50_s",
                lm_srv_metrics_percentile(m, &m->latency, 50), "latency_p99_s",
                lm_srv_metrics_percentile(m, &m->latency, 99));
  return json_pack("{s:s,s:s,s:f,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o}", "model", s->model_id, "backend",
                   s->ei.backend, "uptime_s", now_s() - s->t_start, "sequences", seq, "queue",
                   queue, "prompt_cache", pc, "kv", kv, "admission", adm, "batch", batch, "jobs",
                   jobs, "latency", lat);
}
