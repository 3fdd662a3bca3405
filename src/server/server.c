/* server.c — creating, starting and stopping the server (server.h): the text side of the
 * checkpoint (tokenizer, chat template, generation defaults, stop ids, parser tokens), the cache
 * plan and the KV budget, then the scheduler and the HTTP daemon. */
#include "server/server.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/status.h"
#include "model/forward.h"
#include "server/srv_ctx.h"

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
}

static char *base_name(const char *dir) {
  size_t n = strlen(dir);
  while (n > 1 && dir[n - 1] == '/')
    n--;
  size_t b = n;
  while (b > 0 && dir[b - 1] != '/')
    b--;
  return strndup(dir + b, n - b);
}

static char *token_string(const lm_tokenizer *tok, int32_t id) {
  size_t n = 0;
  const char *s = id >= 0 ? lm_tokenizer_piece(tok, id, &n) : NULL;
  return s ? strndup(s, n) : strdup("");
}

/* max_position_embeddings of config.json (text_config first); 0 when absent. */
static int64_t max_positions(const char *dir) {
  char path[4096];
  snprintf(path, sizeof path, "%s/config.json", dir);
  json_t *j = json_load_file(path, 0, NULL);
  json_t *tc = json_object_get(j, "text_config");
  json_t *v = json_object_get(tc ? tc : j, "max_position_embeddings");
  if (!v) v = json_object_get(j, "max_position_embeddings");
  int64_t n = json_is_integer(v) && json_integer_value(v) > 1 ? json_integer_value(v) : 0;
  json_decref(j);
  return n;
}

static lm_status load_text(lm_server *s) {
  const char *dir = s->model_dir;
  LM_TRY(lm_tokenizer_load(dir, &s->tok));
  if (lm_chat_template_load(dir, &s->tmpl)) return lm_err_prefix(LM_ERR_CORRUPT, "chat template");
  LM_TRY(lm_gen_config_load(dir, &s->gc));
  LM_TRY(lm_gen_stop_ids(s->m->cfg.eos_ids, s->m->cfg.n_eos, &s->gc, lm_tokenizer_eos(s->tok),
                         &s->stop_ids, &s->n_stop_ids));
  if (!(s->bos = token_string(s->tok, lm_tokenizer_bos(s->tok))) ||
      !(s->eos = token_string(s->tok, lm_tokenizer_eos(s->tok))))
    return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  s->gemma4 = lm_parser_tokens_from_tokenizer(s->tok, &s->ptok) == LM_OK;
  if (!s->gemma4) {
    memset(&s->ptok, 0xff, sizeof s->ptok); /* every id -1 */
    s->ptok.eos = lm_tokenizer_eos(s->tok);
  }
  if (lm_tokenizer_vocab_size(s->tok) > s->m->cfg.vocab_size)
    return LM_ERRF(LM_ERR_INVALID, "%s: the tokenizer has %d ids, the model %lld", dir,
                   lm_tokenizer_vocab_size(s->tok), (long long)s->m->cfg.vocab_size);
  LM_TRY(lm_sampling_copy(&s->defaults, s->o.sampling ? s->o.sampling : &s->gc.sampling));
  return LM_OK;
}

/* The KV budget: given, or the memory budget less the weights and the step workspace. */
static lm_status size_budget(lm_server *s) {
  const lm_server_opts *o = &s->o;
  s->weight_bytes = s->m->weight_bytes;
  s->workspace_bytes =
      lm_forward_workspace_bytes(s->m, o->chunk + o->parallel, o->parallel, s->be->act_dtype) +
      (int64_t)o->parallel * s->m->cfg.vocab_size * 4;
  if (o->kv_budget_bytes > 0) {
    s->kv_budget = o->kv_budget_bytes;
    return LM_OK;
  }
  double total = o->memory_budget_gb > 0
                     ? o->memory_budget_gb * 1e9
                     : 0.75 * (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
  s->kv_budget = (int64_t)total - s->weight_bytes - s->workspace_bytes;
  if (s->kv_budget <= 0)
    return LM_ERRF(LM_ERR_INVALID,
                   "a memory budget of %.2f GB does not cover the weights (%.2f GB) and the step "
                   "workspace (%.2f GB): raise --memory-budget or lower --parallel/--chunk",
                   total / 1e9, (double)s->weight_bytes / 1e9, (double)s->workspace_bytes / 1e9);
  return LM_OK;
}

static lm_status plan(lm_server *s) {
  const lm_model_config *c = &s->m->cfg;
  s->specs = calloc((size_t)c->n_caches + 1, sizeof *s->specs);
  if (!s->specs) return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  LM_TRY(lm_model_kv_plan(s->m, &s->o.kv, s->specs));
  int64_t mp = max_positions(s->model_dir);
  s->max_ctx = s->o.ctx > 0 ? s->o.ctx : mp > 0 ? mp : 8192;
  if (mp > 0 && s->max_ctx > mp)
    return LM_ERRF(LM_ERR_INVALID, "--ctx %lld exceeds the model's max_position_embeddings (%lld)",
                   (long long)s->max_ctx, (long long)mp);
  return size_budget(s);
}

static lm_status make_sched(lm_server *s) {
  int32_t keep[8];
  int32_t nk = 0;
  const int32_t ct[] = {s->ptok.channel_open,       s->ptok.channel_close,
                        s->ptok.tool_call_open,     s->ptok.tool_call_close,
                        s->ptok.tool_response_open, lm_tokenizer_find(s->tok, "<|\"|>", 5)};
  for (int i = 0; i < 6; i++)
    if (ct[i] >= 0) keep[nk++] = ct[i];
  lm_sched_opts so = {.parallel = s->o.parallel,
                      .chunk = s->o.chunk,
                      .queue_cap = s->o.queue_size,
                      .kv_budget = s->kv_budget,
                      .max_ctx = s->max_ctx,
                      .prompt_cache = s->o.prompt_cache,
                      .specs = s->specs,
                      .stop_ids = s->stop_ids,
                      .n_stop_ids = s->n_stop_ids,
                      .keep_special = keep,
                      .n_keep_special = nk};
  return lm_sched_create(s->m, s->be, s->tok, &so, &s->sched);
}

static lm_status copy_strings(lm_server *s, const lm_server_opts *o) {
  s->model_dir = strdup(o->model_dir);
  s->model_id = o->model_id ? strdup(o->model_id) : base_name(o->model_dir);
  s->host = strdup(s->o.host);
  s->api_key = o->api_key ? strdup(o->api_key) : NULL;
  if (!s->model_dir || !s->model_id || !s->host || (o->api_key && !s->api_key))
    return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  s->o.model_dir = s->model_dir;
  s->o.model_id = s->model_id;
  s->o.host = s->host;
  s->o.api_key = s->api_key;
  s->o.sampling = NULL;
  return LM_OK;
}

lm_status lm_server_create(lm_model *m, lm_backend *be, const lm_server_opts *o, lm_server **out) {
  *out = NULL;
  if (!m || !be || !o || !o->model_dir)
    return LM_ERRF(LM_ERR_INVALID, "lm_server_create: NULL argument");
  if (o->port < 0 || o->port > 65535)
    return LM_ERRF(LM_ERR_INVALID, "--port must be 0..65535 (got %d)", o->port);
  if (o->api_key && !*o->api_key) return LM_ERRF(LM_ERR_INVALID, "--api-key must not be empty");
  lm_server *s = calloc(1, sizeof *s);
  if (!s) return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  s->m = m;
  s->be = be;
  s->o = *o;
  apply_defaults(&s->o);
  lm_sampling_init(&s->defaults);
  lm_srv_metrics_init(&s->metrics);
  atomic_init(&s->seq, 1);
  s->t_start = now_s();
  s->t_created = (long long)time(NULL);
  lm_status st = copy_strings(s, o);
  if (!st) st = load_text(s);
  if (!st && o->sampling) s->o.has_seed = o->has_seed;
  if (!st) st = plan(s);
  if (!st) st = make_sched(s);
  if (st) {
    lm_server_free(s);
    return st;
  }
  *out = s;
  return LM_OK;
}

lm_status lm_server_start(lm_server *s) {
  LM_TRY(lm_sched_start(s->sched));
  return lm_srv_http_start(s);
}

int lm_server_port(const lm_server *s) { return s->port; }

/* "kv:rotating-plain x5, kv:plain x1" */
static void plan_summary(const lm_server *s, char *buf, size_t n) {
  size_t at = 0;
  buf[0] = '\0';
  for (int c = 0; c < s->m->cfg.n_caches; c++) {
    char sig[64], prev[64] = "";
    lm_kv_spec_signature(&s->specs[c], sig, sizeof sig);
    if (c) lm_kv_spec_signature(&s->specs[c - 1], prev, sizeof prev);
    if (c && !strcmp(sig, prev)) continue;
    int k = 1;
    for (int d = c + 1; d < s->m->cfg.n_caches; d++) {
      char nx[64];
      if (strcmp(lm_kv_spec_signature(&s->specs[d], nx, sizeof nx), sig)) break;
      k++;
    }
    at += (size_t)snprintf(buf + at, at < n ? n - at : 0, "%s%s x%d", at ? ", " : "", sig, k);
    if (at >= n) break;
  }
}

void lm_server_describe(const lm_server *s, char *buf, size_t n) {
  char caches[512];
  plan_summary(s, caches, sizeof caches);
  const lm_admit *a = lm_sched_admit(s->sched);
  snprintf(buf, n,
           "model %s (%s, %.1fM parameters, %.1f MB of weights) on %s; tokenizer %d ids, chat "
           "template %s, "
           "%s output parser\n"
           "%d parallel sequences, context %lld, prefill chunk %lld, queue %d, prompt cache %d "
           "entries, timeout %.0f s%s\n"
           "KV budget %.1f MiB (%lld bytes/token below the sliding window; at most %lld tokens per "
           "sequence); caches: %s",
           s->model_id, s->m->cfg.model_type, (double)s->m->n_params / 1e6,
           (double)s->weight_bytes / 1e6, s->be->ops->name, lm_tokenizer_vocab_size(s->tok),
           s->tmpl ? "yes" : "none (completions only)", s->gemma4 ? "Gemma 4" : "ChatML/Hermes",
           s->o.parallel, (long long)s->max_ctx, (long long)s->o.chunk, s->o.queue_size,
           s->o.prompt_cache, s->o.timeout_s, s->api_key ? ", API key required" : "",
           (double)s->kv_budget / 1048576.0, (long long)lm_admit_bytes_per_token(a),
           (long long)lm_admit_max_context(a), caches);
}

void lm_server_free(lm_server *s) {
  if (!s) return;
  lm_sched_stop(s->sched); /* running requests end now; new ones get 503 until the daemon stops */
  lm_srv_http_stop(s);
  lm_sched_free(s->sched);
  lm_srv_metrics_destroy(&s->metrics);
  lm_sampling_clear(&s->defaults);
  free(s->specs);
  free(s->bos);
  free(s->eos);
  free(s->stop_ids);
  lm_gen_config_clear(&s->gc);
  lm_chat_template_free(s->tmpl);
  lm_tokenizer_free(s->tok);
  free(s->model_dir);
  free(s->model_id);
  free(s->host);
  free(s->api_key);
  free(s);
}
