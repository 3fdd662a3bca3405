/* srv_stats.c — GET /stats: sequences, queue, prompt cache, KV use and the cache plan (one
 * signature per cache with its bytes per token and capacity), admission limits, batching
 * counters and recent time-to-first-token percentiles. */
#include <time.h>

#include "server/srv_route.h"

static json_t *caches_json(const lm_server *s) {
  json_t *a = json_array();
  for (int c = 0; c < s->m->cfg.n_caches; c++) {
    char sig[64];
    const lm_kv_spec *k = &s->specs[c];
    int64_t bpt = lm_kv_spec_bytes_per_token(k, s->be->act_dtype);
    json_array_append_new(
        a,
        json_pack("{s:i,s:i,s:s,s:I,s:o}", "cache", c, "layer", s->m->cfg.cache_layer[c],
                  "signature", lm_kv_spec_signature(k, sig, sizeof sig), "bytes_per_token",
                  (json_int_t)bpt, "capacity",
                  lm_kv_kind_ring(k->kind) ? json_integer(k->window) : json_string("unbounded")));
  }
  return a;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

json_t *lm_srv_stats_json(lm_server *s) {
  lm_sched_stats st;
  lm_sched_stats_get(s->sched, &st);
  const lm_admit *ad = lm_sched_admit(s->sched);
  lm_srv_metrics *m = &s->metrics;
  json_t *seq = json_pack("{s:i,s:i,s:i,s:i}", "active", st.active, "prefilling", st.prefilling,
                          "decoding", st.decoding, "parallel", st.parallel);
  json_t *queue = json_pack("{s:i,s:i}", "length", st.queued, "capacity", st.queue_cap);
  json_t *pc =
      json_pack("{s:i,s:I,s:I,s:I,s:I}", "entries", st.pc_entries, "bytes", (json_int_t)st.pc_bytes,
                "hits", (json_int_t)st.pc_hits, "misses", (json_int_t)st.pc_misses, "tokens_reused",
                (json_int_t)st.pc_tokens_reused);
  json_t *kv =
      json_pack("{s:s,s:I,s:I,s:I,s:I,s:o}", "kv_quant", s->o.kv.mode ? s->o.kv.mode : "off",
                "budget_bytes", (json_int_t)st.kv_budget, "reserved_bytes",
                (json_int_t)st.kv_reserved, "held_bytes", (json_int_t)st.kv_held, "bytes_per_token",
                (json_int_t)lm_admit_bytes_per_token(ad), "caches", caches_json(s));
  json_t *adm =
      json_pack("{s:I,s:I,s:I,s:I}", "max_context", (json_int_t)s->max_ctx, "max_safe_context",
                (json_int_t)lm_admit_max_context(ad), "weight_bytes", (json_int_t)s->weight_bytes,
                "workspace_bytes", (json_int_t)s->workspace_bytes);
  json_t *batch =
      json_pack("{s:I,s:I,s:I,s:I,s:I,s:f,s:f}", "steps", (json_int_t)st.steps, "step_tokens",
                (json_int_t)st.step_tokens, "step_rows", (json_int_t)st.step_rows, "prefill_tokens",
                (json_int_t)st.prefill_tokens, "sampled_tokens", (json_int_t)st.decode_tokens,
                "mean_rows_per_step", st.steps ? (double)st.step_rows / (double)st.steps : 0.0,
                "busy_s", st.busy_s);
  json_t *jobs = json_pack("{s:I,s:I,s:I,s:I}", "done", (json_int_t)st.jobs_done, "cancelled",
                           (json_int_t)st.jobs_cancelled, "timeout", (json_int_t)st.jobs_timeout,
                           "failed", (json_int_t)st.jobs_failed);
  json_t *lat =
      json_pack("{s:f,s:f,s:f,s:f}", "ttft_p50_s", lm_srv_metrics_percentile(m, &m->ttft, 50),
                "ttft_p99_s", lm_srv_metrics_percentile(m, &m->ttft, 99), "latency_p50_s",
                lm_srv_metrics_percentile(m, &m->latency, 50), "latency_p99_s",
                lm_srv_metrics_percentile(m, &m->latency, 99));
  return json_pack("{s:s,s:s,s:f,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o}", "model", s->model_id, "backend",
                   s->be->ops->name, "uptime_s", now_s() - s->t_start, "sequences", seq, "queue",
                   queue, "prompt_cache", pc, "kv", kv, "admission", adm, "batch", batch, "jobs",
                   jobs, "latency", lat);
}
