/* engine.c — lm_engine of lumen.h: a checkpoint on a backend, its cache plan and memory budget,
 * and the scheduler (sched.h) that runs every request; state files and teacher-forced logits go
 * through the scheduler's thread too. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/status.h"
#include "engine/api_impl.h"
#include "engine/spec_draft.h"
#include "model/forward.h"
#include "model/kv_plan.h"
#include "model/lora.h"
#ifdef LM_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

void lm_engine_options_init(lm_engine_options *o) {
  memset(o, 0, sizeof *o);
  o->parallel = 1;
  o->chunk = 512;
  o->queue_size = 64;
  o->prefix_cache = 4;
}

static lm_status parse_precision(const char *p, lm_precision *out) {
  if (!p || !strcmp(p, "fast"))
    *out = LM_PRECISION_FAST;
  else if (!strcmp(p, "f32"))
    *out = LM_PRECISION_F32;
  else if (!strcmp(p, "bf16"))
    *out = LM_PRECISION_BF16;
  else
    return LM_ERRF(LM_ERR_INVALID, "precision must be f32, fast or bf16 (got '%s')", p);
  return LM_OK;
}

static lm_status make_backend(lm_engine *e) {
  lm_precision prec;
  LM_TRY(parse_precision(e->o.precision, &prec));
  const char *name = e->o.backend;
#ifdef LM_HAVE_CUDA
  if (!name) name = lm_cuda_device_count() > 0 ? "cuda" : "cpu"; /* the GPU when there is one */
#endif
  if (!name || !strcmp(name, "cpu")) {
    e->o.backend = "cpu";
    return lm_err_prefix(lm_backend_cpu_create(prec, e->o.threads, &e->be), "cpu backend");
  }
  if (!strcmp(name, "cuda")) {
    e->o.backend = "cuda";
#ifdef LM_HAVE_CUDA
    return lm_err_prefix(lm_backend_cuda_create(prec, 0, &e->be), "cuda backend");
#else
    return LM_ERRF(LM_ERR_UNSUPPORTED,
                   "backend cuda: this build has no CUDA backend (configure with -DLUMEN_CUDA=ON)");
#endif
  }
  return LM_ERRF(LM_ERR_INVALID, "backend must be cpu or cuda (got '%s')", name);
}

static lm_status check_options(const lm_engine_options *o) {
  if (o->parallel < 1 || o->parallel > 4096)
    return LM_ERRF(LM_ERR_INVALID, "parallel must be 1..4096 (got %d)", o->parallel);
  if (o->chunk < 1 || o->chunk > (1 << 20))
    return LM_ERRF(LM_ERR_INVALID, "chunk must be 1..1048576 (got %lld)", (long long)o->chunk);
  if (o->context < 0 || o->queue_size < 1 || o->prefix_cache < 0 || o->kv_budget < -1 ||
      o->memory_budget_gb < 0 || o->threads < 0 || o->kv_quant_start < 0)
    return LM_ERRF(LM_ERR_INVALID, "engine options out of range");
  if (o->speculative_tokens < 0 || o->speculative_tokens > LM_SPEC_MAX_TOKENS)
    return LM_ERRF(LM_ERR_INVALID, "speculative tokens must be 0..%d (got %d)", LM_SPEC_MAX_TOKENS,
                   o->speculative_tokens);
  if (o->n_adapters < 0 || o->n_adapters > 8 || (o->n_adapters && !o->adapters))
    return LM_ERRF(LM_ERR_INVALID, "adapters: 0..8 directories (got %d)", o->n_adapters);
  for (int i = 0; i < o->n_adapters; i++)
    if (!o->adapters[i]) return LM_ERRF(LM_ERR_INVALID, "adapter %d: no directory", i);
  /* verification promises every row as a one-token step computes it; the adapters' products
   * are not held to that yet */
  if (o->n_adapters && o->speculative_tokens > 0)
    return LM_ERRF(LM_ERR_UNSUPPORTED,
                   "speculative decoding does not combine with LoRA adapters yet (its exactness is "
                   "not established through the adapters' products)");
  return LM_OK;
}

/* The context limit: the option, else max_position_embeddings, else 8192. */
static lm_status size_context(lm_engine *e) {
  int64_t mp = e->ck->max_positions;
  int64_t ctx = e->o.context > 0 ? e->o.context : mp > 0 ? mp : 8192;
  if (mp > 0 && ctx > mp)
    return LM_ERRF(LM_ERR_INVALID,
                   "context %lld exceeds the model's max_position_embeddings (%lld)",
                   (long long)ctx, (long long)mp);
  if (ctx < 2) return LM_ERRF(LM_ERR_INVALID, "context must be at least 2 tokens");
  e->o.context = ctx;
  return LM_OK;
}

/* The KV budget: given, unlimited (-1), or the memory budget less the weights and workspace. */
static lm_status size_budget(lm_engine *e, int64_t *budget) {
  const lm_engine_options *o = &e->o;
  const lm_model *m = e->ck->m;
  int64_t rows = (int64_t)o->parallel * (1 + o->speculative_tokens); /* as the scheduler sizes */
  e->info.workspace_bytes = lm_forward_workspace_bytes(m, o->chunk + rows, rows, e->be->act_dtype) +
                            rows * m->cfg.vocab_size * 4;
  if (o->kv_budget != 0) {
    *budget = o->kv_budget > 0 ? o->kv_budget : INT64_MAX;
    return LM_OK;
  }
  double total = o->memory_budget_gb > 0
                     ? o->memory_budget_gb * 1e9
                     : 0.75 * (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
  *budget = (int64_t)total - m->weight_bytes - e->info.workspace_bytes;
  if (*budget <= 0)
    return LM_ERRF(LM_ERR_INVALID,
                   "a memory budget of %.2f GB does not cover the weights (%.2f GB) and the step "
                   "workspace (%.2f GB): raise the memory budget or lower parallel/chunk",
                   total / 1e9, (double)m->weight_bytes / 1e9,
                   (double)e->info.workspace_bytes / 1e9);
  return LM_OK;
}

static lm_status plan_caches(lm_engine *e) {
  const lm_model *m = e->ck->m;
  e->specs = calloc((size_t)m->cfg.n_caches + 1, sizeof *e->specs);
  if (!e->specs) return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  lm_kv_options kv = {.mode = e->o.kv_quant,
                      .group = e->o.kv_group,
                      .config_path = e->o.kv_config,
                      .quant_start = e->o.kv_quant_start};
  return lm_model_kv_plan(m, &kv, e->specs);
}

/* "kv:rotating-plain x5, kv:plain x1" */
static void plan_summary(const lm_engine *e, char *buf, size_t n) {
  size_t at = 0;
  int nc = e->ck->m->cfg.n_caches;
  buf[0] = '\0';
  for (int c = 0; c < nc;) {
    char sig[64], nx[64];
    lm_kv_spec_signature(&e->specs[c], sig, sizeof sig);
    int k = 1;
    while (c + k < nc && !strcmp(lm_kv_spec_signature(&e->specs[c + k], nx, sizeof nx), sig))
      k++;
    at += (size_t)snprintf(buf + at, at < n ? n - at : 0, "%s%s x%d", at ? ", " : "", sig, k);
    if (at >= n) break;
    c += k;
  }
}

/* The adapters of the options, loaded onto the checkpoint's model (the scheduler's forward
 * prepares them for the backend when it attaches them). */
static lm_status load_adapters(lm_engine *e, const lm_engine_options *o) {
  for (int i = 0; i < o->n_adapters; i++) {
    float w = o->adapter_weights ? o->adapter_weights[i] : 1.0f;
    LM_TRY(lm_lora_load(e->ck->m, o->adapters[i], w, &e->lora[i]));
    e->n_lora = i + 1;
  }
  e->o.adapters = NULL, e->o.adapter_weights = NULL; /* the caller's strings are not kept */
  return LM_OK;
}

static lm_status start_sched(lm_engine *e, int64_t budget) {
  const lm_checkpoint *ck = e->ck;
  lm_sched_opts so = {.parallel = e->o.parallel,
                      .chunk = e->o.chunk,
                      .queue_cap = e->o.queue_size,
                      .kv_budget = budget,
                      .max_ctx = e->o.context,
                      .prompt_cache = e->o.prefix_cache,
                      .threads = e->o.threads,
                      .specs = e->specs,
                      .stop_ids = ck->stop_ids,
                      .n_stop_ids = ck->n_stop_ids,
                      .keep_special = ck->keep,
                      .n_keep_special = ck->n_keep,
                      .spec_tokens = e->o.speculative_tokens,
                      .draft = e->draft,
                      .lora = e->lora,
                      .n_lora = e->n_lora};
  LM_TRY(lm_sched_create(ck->m, e->be, ck->tok, &so, &e->sched));
  return lm_sched_start(e->sched);
}

/* The grammar cache (64 schemas: a server's few response formats and tool sets, with room) and
 * the sorted stop ids the constraints allow once an answer is complete. */
static lm_status make_constraints(lm_engine *e) {
  const lm_checkpoint *ck = e->ck;
  e->n_stop = ck->n_stop_ids;
  e->stop_sorted = malloc((size_t)(e->n_stop ? e->n_stop : 1) * sizeof *e->stop_sorted);
  if (!e->stop_sorted) return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  if (e->n_stop) memcpy(e->stop_sorted, ck->stop_ids, (size_t)e->n_stop * sizeof *e->stop_sorted);
  for (int32_t i = 1; i < e->n_stop; i++) /* a handful of ids: insertion sort */
    for (int32_t k = i; k > 0 && e->stop_sorted[k - 1] > e->stop_sorted[k]; k--) {
      int32_t t = e->stop_sorted[k];
      e->stop_sorted[k] = e->stop_sorted[k - 1];
      e->stop_sorted[k - 1] = t;
    }
  return lm_grammar_cache_create(64, &e->grammars);
}

static void fill_info(lm_engine *e, int64_t budget) {
  lm_engine_info *i = &e->info;
  const lm_admit *a = lm_sched_admit(e->sched);
  i->backend = e->be->ops->name;
  i->precision = e->o.precision ? e->o.precision : "fast";
  i->parallel = e->o.parallel;
  i->queue_size = e->o.queue_size;
  i->prefix_cache = e->o.prefix_cache;
  i->chunk = e->o.chunk;
  i->context = e->o.context;
  i->kv_budget = budget;
  i->kv_bytes_per_token = lm_admit_bytes_per_token(a);
  i->max_sequence_context = lm_admit_max_context(a);
  i->n_caches = e->ck->m->cfg.n_caches;
  plan_summary(e, i->cache_plan, sizeof i->cache_plan);
}

/* Copies the option strings the engine keeps. */
static lm_status own_strings(lm_engine *e) {
  e->kv_quant = e->o.kv_quant ? strdup(e->o.kv_quant) : NULL;
  e->kv_config = e->o.kv_config ? strdup(e->o.kv_config) : NULL;
  if ((e->o.kv_quant && !e->kv_quant) || (e->o.kv_config && !e->kv_config))
    return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  e->o.kv_quant = e->kv_quant;
  e->o.kv_config = e->kv_config;
  if (e->o.precision) { /* one of three literals after the check */
    lm_precision p;
    LM_TRY(parse_precision(e->o.precision, &p));
    e->o.precision = p == LM_PRECISION_F32 ? "f32" : p == LM_PRECISION_BF16 ? "bf16" : "fast";
  }
  return LM_OK;
}

lm_status lm_engine_create(lm_checkpoint *ck, const lm_engine_options *o, lm_engine **out) {
  *out = NULL;
  if (!ck || !o) return LM_ERRF(LM_ERR_INVALID, "lm_engine_create: NULL argument");
  LM_TRY(check_options(o));
  int none = 0;
  if (!atomic_compare_exchange_strong(&ck->engines, &none, 1))
    return LM_ERRF(LM_ERR_STATE, "%s already has an engine (one per checkpoint)", ck->name);
  lm_engine *e = calloc(1, sizeof *e);
  if (!e) {
    atomic_store(&ck->engines, 0);
    return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  }
  e->ck = ck;
  e->o = *o;
  atomic_init(&e->seq, 1);
  pthread_mutex_init(&e->mounts_mu, NULL);
  int64_t budget = 0;
  lm_status s = own_strings(e);
  if (!s) s = make_backend(e);
  if (!s)
    s = lm_err_prefix(lm_model_prepare_progress(ck->m, e->be, o->on_load, o->on_load_ctx),
                      "preparing the weights");
  if (!s) s = size_context(e);
  if (!s) s = plan_caches(e);
  if (!s) s = size_budget(e, &budget);
  if (!s) s = make_constraints(e);
  if (!s && o->draft_model)
    s = lm_spec_draft_open(o->draft_model, e->be, ck->m, e->o.chunk, &e->draft);
  if (!s) s = load_adapters(e, o);
  if (!s) s = start_sched(e, budget);
  if (s) {
    lm_engine_free(e);
    return s;
  }
  fill_info(e, budget);
  *out = e;
  return LM_OK;
}

void lm_engine_free(lm_engine *e) {
  if (!e) return;
  lm_sched_free(e->sched); /* (it frees the adapters mounted by name) */
  lm_spec_draft_free(e->draft);
  lm_grammar_cache_free(e->grammars); /* grammars still held by requests live on */
  free(e->stop_sorted);
  for (int i = 0; i < e->n_lora; i++) /* before the backend: their copies are its memory */
    lm_lora_free(e->lora[i]);
  lm_backend_destroy(e->be);
  free(e->mounts);
  pthread_mutex_destroy(&e->mounts_mu);
  free(e->specs);
  free(e->kv_quant);
  free(e->kv_config);
  atomic_store(&e->ck->engines, 0);
  free(e);
}

void lm_engine_stop(lm_engine *e) {
  if (e) lm_sched_stop(e->sched);
}

void lm_engine_describe(const lm_engine *e, lm_engine_info *info) { *info = e->info; }

lm_status lm_engine_cache(const lm_engine *e, int i, int *layer, char *signature, size_t n,
                          int64_t *bytes_per_token, int64_t *capacity) {
  const lm_model *m = e->ck->m;
  if (i < 0 || i >= m->cfg.n_caches)
    return LM_ERRF(LM_ERR_INVALID, "cache %d: the plan has %d caches", i, m->cfg.n_caches);
  const lm_kv_spec *k = &e->specs[i];
  if (layer) *layer = m->cfg.cache_layer[i];
  if (signature) lm_kv_spec_signature(k, signature, n);
  if (bytes_per_token) *bytes_per_token = lm_kv_spec_bytes_per_token(k, e->be->act_dtype);
  if (capacity) *capacity = lm_kv_spec_capacity(k);
  return LM_OK;
}

lm_admission lm_engine_check(const lm_engine *e, int64_t n_prompt, int64_t max_tokens, char *msg,
                             size_t n) {
  return lm_sched_check(e->sched, n_prompt, max_tokens, msg, n);
}

void lm_engine_get_stats(lm_engine *e, lm_engine_stats *st) { lm_sched_stats_get(e->sched, st); }

lm_status lm_engine_save_state(lm_engine *e, const int32_t *ids, int64_t n, const char *path,
                               int64_t *saved) {
  return lm_sched_save_state(e->sched, ids, n, path, saved);
}

lm_status lm_engine_load_state(lm_engine *e, const char *path, int32_t **ids, int64_t *n) {
  return lm_sched_load_state(e->sched, path, ids, n);
}

lm_status lm_engine_logits(lm_engine *e, const int32_t *ids, int64_t n, int64_t prefill,
                           int64_t chunk, float *out) {
  return lm_sched_logits(e->sched, ids, n, prefill, chunk, out);
}
