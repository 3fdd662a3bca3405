/* server.c — creating, starting and stopping the server (server.h): the engine over the
 * checkpoint (lumen.h), the request defaults, then the HTTP daemon. */
#include "server/server.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/status.h"
#include "server/srv_cors.h"
#include "server/srv_ctx.h"
#include "server/srv_store.h"

void lm_server_opts_init(lm_server_opts *o) {
  memset(o, 0, sizeof *o);
  o->prompt_cache = 0;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void apply_defaults(lm_server_opts *o) {
  if (!o->host) o->host = "127.0.0.1";
  if (o->parallel <= 0) o->parallel = 4;
  if (o->chunk <= 0) o->chunk = 512;
  if (o->queue_size <= 0) o->queue_size = 64;
  if (o->prompt_cache == 0) o->prompt_cache = o->parallel;
  if (o->prompt_cache < 0) o->prompt_cache = 0;
  if (o->max_body <= 0) o->max_body = 8 << 20;
  if (o->timeout_s == 0) o->timeout_s = 600;
  if (o->max_tokens <= 0) o->max_tokens = 512;
  if (o->max_connections <= 0) o->max_connections = 256;
  if (o->speculative && o->speculative_tokens <= 0) o->speculative_tokens = LM_SPEC_DEFAULT_TOKENS;
}

/* A default source the engine refuses (a backend without row-exact steps) fails the start, not
 * every request. */
static lm_status check_speculative(lm_server *s) {
  lm_request_options ro;
  lm_request_options_init(&ro);
  int32_t id = 0;
  ro.ids = &id;
  ro.n_ids = 1;
  ro.speculative = s->o.speculative;
  lm_request *r = NULL;
  lm_status st = lm_request_create(s->e, &ro, &r);
  lm_request_free(r);
  return st ? lm_err_prefix(st, "--spec") : LM_OK;
}

static lm_status make_engine(lm_server *s) {
  const lm_server_opts *o = &s->o;
  lm_engine_options eo;
  lm_engine_options_init(&eo);
  eo.backend = o->backend;
  eo.precision = o->precision;
  eo.threads = o->threads;
  eo.parallel = o->parallel;
  eo.chunk = o->chunk;
  eo.context = o->ctx;
  eo.queue_size = o->queue_size;
  eo.kv_budget = o->kv_budget_bytes > 0 ? o->kv_budget_bytes : 0;
  eo.memory_budget_gb = o->memory_budget_gb;
  eo.prefix_cache = o->prompt_cache;
  eo.kv_quant = o->kv_quant;
  eo.kv_group = o->kv_group;
  eo.kv_config = o->kv_config;
  eo.on_load = o->on_load;
  eo.on_load_ctx = o->on_load_ctx;
  eo.speculative_tokens = o->speculative_tokens;
  eo.draft_model = o->draft_model;
  eo.adapters = o->adapters;
  eo.adapter_weights = o->adapter_weights;
  eo.n_adapters = o->n_adapters;
  LM_TRY(lm_engine_create(s->ck, &eo, &s->e));
  lm_engine_describe(s->e, &s->ei);
  return o->speculative ? check_speculative(s) : LM_OK;
}

const char *lm_srv_model_served(const lm_server *s, const char *name) {
  for (int i = 0; name && i < s->n_ids; i++)
    if (!strcmp(s->ids[i], name)) return s->ids[i];
  return NULL;
}

static lm_status add_id(lm_server *s, const char *id) {
  if (!id || !*id || strlen(id) > 256)
    return LM_ERRF(LM_ERR_INVALID, "a served model name must be 1-256 characters (got '%.64s')",
                   id ? id : "");
  for (const char *p = id; *p; p++)
    if ((unsigned char)*p < 0x20 || *p == 0x7f)
      return LM_ERRF(LM_ERR_INVALID, "a served model name has a control character");
  if (lm_srv_model_served(s, id)) return LM_OK; /* named twice: served once */
  char **v = realloc(s->ids, (size_t)(s->n_ids + 1) * sizeof *v);
  if (!v) return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  s->ids = v;
  if (!(v[s->n_ids] = strdup(id))) return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  s->n_ids++;
  return LM_OK;
}

/* The served ids: every alias, then the model's own name (default: the directory's name). */
static lm_status served_ids(lm_server *s, const lm_server_opts *o) {
  if (o->n_aliases < 0 || (o->n_aliases && !o->aliases))
    return LM_ERRF(LM_ERR_INVALID, "lm_server_create: bad alias list");
  for (int i = 0; i < o->n_aliases; i++)
    LM_TRY(add_id(s, o->aliases[i]));
  LM_TRY(add_id(s, o->model_id ? o->model_id : s->ci.name));
  s->model_id = s->ids[0];
  return LM_OK;
}

static lm_status copy_strings(lm_server *s, const lm_server_opts *o) {
  s->model_dir = strdup(o->model_dir);
  s->host = strdup(s->o.host);
  s->api_key = o->api_key ? strdup(o->api_key) : NULL;
  if (!s->model_dir || !s->host || (o->api_key && !s->api_key))
    return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  LM_TRY(served_ids(s, o));
  if (o->cors) LM_TRY(lm_srv_cors_parse(o->cors, &s->cors, &s->n_cors, &s->cors_any));
  s->o.model_dir = s->model_dir;
  s->o.model_id = s->model_id;
  s->o.aliases = NULL; /* the caller's: s->ids has them */
  s->o.n_aliases = 0;
  s->o.cors = NULL; /* parsed into s->cors */
  s->o.host = s->host;
  s->o.api_key = s->api_key;
  s->o.sampling = NULL;
  if (o->speculative && !(s->o.speculative = s->spec = strdup(o->speculative)))
    return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  return LM_OK;
}

static lm_status make_store(lm_server *s) {
  const lm_server_opts *o = &s->o;
  if (o->store_entries < 0) return LM_OK;
  return lm_srv_store_create(o->store_entries ? o->store_entries : 1024,
                             o->store_bytes > 0 ? o->store_bytes : (int64_t)64 << 20,
                             o->store_ttl_s > 0 ? o->store_ttl_s : 3600, &s->store);
}

lm_status lm_server_create(lm_checkpoint *ck, const lm_server_opts *o, lm_server **out) {
  *out = NULL;
  if (!ck || !o || !o->model_dir) return LM_ERRF(LM_ERR_INVALID, "lm_server_create: NULL argument");
  if (o->port < 0 || o->port > 65535)
    return LM_ERRF(LM_ERR_INVALID, "--port must be 0..65535 (got %d)", o->port);
  if (o->api_key && !*o->api_key) return LM_ERRF(LM_ERR_INVALID, "--api-key must not be empty");
  lm_server *s = calloc(1, sizeof *s);
  if (!s) return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  s->ck = ck;
  lm_checkpoint_describe(ck, &s->ci);
  s->o = *o;
  apply_defaults(&s->o);
  lm_sampling_init(&s->defaults);
  lm_srv_metrics_init(&s->metrics);
  atomic_init(&s->seq, 1);
  atomic_init(&s->loads, 0);
  atomic_init(&s->closing, 0);
  s->t_start = now_s();
  s->t_created = (long long)time(NULL);
  lm_status st = s->ci.has_tokenizer ? LM_OK
                                     : LM_ERRF(LM_ERR_NOT_FOUND,
                                               "%s: no tokenizer.json (the "
                                               "server needs one)",
                                               o->model_dir);
  if (!st) st = copy_strings(s, o);
  if (!st) st = make_store(s);
  if (!st) st = lm_sampling_copy(&s->defaults, o->sampling ? o->sampling : s->ci.defaults);
  if (!st) st = make_engine(s);
  if (st) {
    lm_server_free(s);
    return st;
  }
  *out = s;
  return LM_OK;
}

lm_status lm_server_start(lm_server *s) { return lm_srv_http_start(s); }

int lm_server_port(const lm_server *s) { return s->port; }

void lm_server_describe(const lm_server *s, char *buf, size_t n) {
  const lm_checkpoint_info *c = &s->ci;
  const lm_engine_info *e = &s->ei;
  snprintf(buf, n,
           "model %s (%s, %.1fM parameters, %.1f MB of weights) on %s; tokenizer %lld ids, chat "
           "template %s, %s output parser\n"
           "%d parallel sequences, context %lld, prefill chunk %lld, queue %d, prompt cache %d "
           "entries, timeout %.0f s%s\n"
           "KV budget %.1f MiB (%lld bytes/token below the sliding window; at most %lld tokens per "
           "sequence); caches: %s",
           s->model_id, c->model_type, (double)c->n_params / 1e6, (double)c->weight_bytes / 1e6,
           e->backend, (long long)c->vocab_size,
           c->has_chat_template ? "yes" : "none (completions only)",
           c->gemma4_format ? "Gemma 4" : "ChatML/Hermes", e->parallel, (long long)e->context,
           (long long)e->chunk, e->queue_size, e->prefix_cache, s->o.timeout_s,
           s->api_key ? ", API key required" : "", (double)e->kv_budget / 1048576.0,
           (long long)e->kv_bytes_per_token, (long long)e->max_sequence_context, e->cache_plan);
  size_t k = strlen(buf);
  if (s->n_ids > 1 && k < n) { /* the other names it answers to */
    k += (size_t)snprintf(buf + k, n - k, "\nalso served as");
    for (int i = 1; i < s->n_ids && k < n; i++)
      k += (size_t)snprintf(buf + k, n - k, "%s %s", i > 1 ? "," : "", s->ids[i]);
  }
  if (s->cors && k < n) {
    k += (size_t)snprintf(buf + k, n - k, "\nCORS: %s", s->cors_any ? "any origin" : "");
    for (int i = 0; !s->cors_any && i < s->n_cors && k < n; i++)
      k += (size_t)snprintf(buf + k, n - k, "%s%s", i ? ", " : "", s->cors[i]);
  }
}

/* Adapter loads in flight (POST /v1/adapters) finish first, while the engine still runs: the
 * copy to the backend is the engine thread's to make, and the loading thread uses the engine. */
static void wait_loads(lm_server *s) {
  atomic_store(&s->closing, 1);
  while (atomic_load(&s->loads) > 0)
    nanosleep(&(struct timespec){0, 1000000L}, NULL);
}

void lm_server_free(lm_server *s) {
  if (!s) return;
  wait_loads(s);
  lm_engine_stop(s->e); /* running requests end now; new ones get 503 until the daemon stops */
  lm_srv_http_stop(s);
  lm_engine_free(s->e);
  lm_srv_metrics_destroy(&s->metrics);
  lm_sampling_clear(&s->defaults);
  lm_srv_store_free(s->store);
  for (int i = 0; i < s->n_ids; i++)
    free(s->ids[i]);
  free(s->ids);
  for (int i = 0; i < s->n_cors; i++)
    free(s->cors[i]);
  free(s->cors);
  free(s->model_dir);
  free(s->host);
  free(s->api_key);
  free(s->spec);
  free(s);
}
