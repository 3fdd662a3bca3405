/* cuda_plan.c — decode steps as captured CUDA graphs ("plans").
 *
 * The first step of a given key is captured (every op's launches go into a graph instead of
 * running), instantiated and launched; later steps with the same key only launch the graph.
 * The key is everything that shapes the op sequence and the launches: the issuer (its model
 * and workspace addresses), its flags, the batch's token/logit/sequence/tile counts and every
 * cache's signature. What changes from token to token — ids, positions, cache lengths, ring
 * slots, cache addresses after a plain cache grows — lives in the step buffers begin_step
 * fills, which the kernels read. So a key change means a new capture, never a stale graph.
 * Replays repeat the only host effect of the ops: kv_append's advance of each cache's length.
 * Steps of more than 8 tokens (prefill) always run eagerly. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_internal.h"
#include "base/status.h"
#include "kv/kv.h"

#define PLAN_MAX_TOKENS 8

struct lm_cuda_plan {
  char *key;
  const void *owner;
  cudaGraphExec_t exec;
  int failed;   /* capture was refused: this key runs eagerly */
  int *appends; /* caches appended by the captured step, in order */
  int n_appends, cap_appends;
  int64_t last_use;
};

static void plan_free(lm_cuda_plan *p) {
  if (!p) return;
  if (p->exec) (void)cudaGraphExecDestroy(p->exec);
  free(p->key);
  free(p->appends);
  free(p);
}

void lm_cuda_plans_clear(lm_cuda_ctx *c) {
  for (int i = 0; i < LM_CUDA_MAX_PLANS; i++) {
    plan_free(c->plans[i]);
    c->plans[i] = NULL;
  }
}

void lm_cuda_release_plans(lm_backend *be, const void *owner) {
  lm_cuda_ctx *c = lm_cuda_of(be);
  for (int i = 0; i < LM_CUDA_MAX_PLANS; i++)
    if (c->plans[i] && c->plans[i]->owner == owner) {
      plan_free(c->plans[i]);
      c->plans[i] = NULL;
    }
}

void lm_cuda_drop_plans(lm_cuda_ctx *c) {
  for (int i = 0; i < LM_CUDA_MAX_PLANS; i++)
    if (c->plans[i]) {
      plan_free(c->plans[i]);
      c->plans[i] = NULL;
    }
}

lm_status lm_cuda_plan_note_append(lm_cuda_ctx *c, int cache) {
  lm_cuda_plan *p = c->capturing;
  if (p->n_appends == p->cap_appends) {
    int cap = p->cap_appends ? 2 * p->cap_appends : 32;
    int *a = realloc(p->appends, (size_t)cap * sizeof *a);
    if (!a) return LM_ERRF(LM_ERR_NOMEM, "out of memory");
    p->appends = a;
    p->cap_appends = cap;
  }
  p->appends[p->n_appends++] = cache;
  return LM_OK;
}

/* The key as a string: exact comparison, no hash collisions. NULL when out of memory. Every
 * cache's signature is in it whole (a quantized one, "rotating-quant:8:128", is longer than a
 * plain one), so a cache that kv_convert quantized gets a plan of its own. */
#define PLAN_SIG_MAX 64 /* a signature, its separator and NUL */
static char *plan_key(const lm_cuda_ctx *c, const lm_step_fn *st) {
  const lm_batch *b = st->batch;
  size_t cap = 128 + (size_t)b->n_seqs * (size_t)c->st.n_caches * PLAN_SIG_MAX, n = 0;
  char *k = malloc(cap);
  if (!k) return NULL;
  n += (size_t)snprintf(k, cap, "%p/%d/%llu/T%d/L%d/S%d/t%d/m%d:", st->owner, st->flags,
                        (unsigned long long)st->variant, b->n_tokens, b->n_logits, b->n_seqs,
                        c->st.n_tiles, c->st.max_tile);
  for (int32_t s = 0; s < b->n_seqs; s++)
    for (int i = 0; i < c->st.n_caches; i++) {
      char sig[PLAN_SIG_MAX - 1];
      lm_kv_signature(b->kv[s]->caches[i], sig, sizeof sig);
      n += (size_t)snprintf(k + n, cap - n, "%s,", sig + 3); /* "plain", "quant:8:32", ... */
    }
  return k;
}

static lm_cuda_plan *plan_find(lm_cuda_ctx *c, const char *key) {
  for (int i = 0; i < LM_CUDA_MAX_PLANS; i++)
    if (c->plans[i] && !strcmp(c->plans[i]->key, key)) return c->plans[i];
  return NULL;
}

/* A fresh slot, evicting the least recently used plan when all are taken. */
static lm_cuda_plan **plan_slot(lm_cuda_ctx *c) {
  int best = 0;
  for (int i = 0; i < LM_CUDA_MAX_PLANS; i++) {
    if (!c->plans[i]) return &c->plans[i];
    if (c->plans[i]->last_use < c->plans[best]->last_use) best = i;
  }
  plan_free(c->plans[best]);
  c->plans[best] = NULL;
  return &c->plans[best];
}

static void replay_appends(const lm_cuda_plan *p, const lm_batch *b) {
  for (int i = 0; i < p->n_appends; i++)
    for (int32_t t = 0; t < b->n_tokens; t++) {
      lm_kv_cache *kc = b->kv[b->seq[t]]->caches[p->appends[i]];
      if (b->pos[t] + 1 > kc->n) kc->n = b->pos[t] + 1;
    }
}

/* Cache lengths of the batch's sets, to undo the capture's host effects if it must rerun. */
static int64_t *save_lengths(const lm_batch *b, int nc) {
  int64_t *n = malloc(((size_t)b->n_seqs * (size_t)nc + 1) * sizeof *n);
  for (int32_t s = 0; n && s < b->n_seqs; s++)
    for (int i = 0; i < nc; i++)
      n[s * nc + i] = b->kv[s]->caches[i]->n;
  return n;
}

static void restore_lengths(const lm_batch *b, int nc, const int64_t *n) {
  for (int32_t s = 0; s < b->n_seqs; s++)
    for (int i = 0; i < nc; i++)
      b->kv[s]->caches[i]->n = n[s * nc + i];
}

/* Captures st into p and launches it. On a capture the driver refuses, the step runs eagerly
 * and the key is marked so it is not tried again. */
static lm_status capture(lm_cuda_ctx *c, lm_cuda_plan *p, const lm_step_fn *st) {
  int64_t *lens = save_lengths(st->batch, c->st.n_caches);
  if (!lens) return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  cudaGraph_t g = NULL;
  lm_status s = LM_OK;
  cudaError_t e = cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal);
  if (e == cudaSuccess) {
    c->capturing = p;
    s = st->issue(st->arg);
    c->capturing = NULL;
    e = cudaStreamEndCapture(c->stream, &g);
  }
  if (!s && e == cudaSuccess) e = cudaGraphInstantiate(&p->exec, g, 0);
  if (g) (void)cudaGraphDestroy(g);
  if (s) {
    free(lens);
    (void)cudaGetLastError();
    return s;
  }
  if (e != cudaSuccess) { /* not capturable: undo the host effects and run it eagerly */
    (void)cudaGetLastError();
    snprintf(c->plan_error, sizeof c->plan_error, "%s (%s)", cudaGetErrorString(e),
             cudaGetErrorName(e));
    restore_lengths(st->batch, c->st.n_caches, lens);
    free(lens);
    p->failed = 1;
    p->exec = NULL;
    p->n_appends = 0;
    return st->issue(st->arg);
  }
  free(lens);
  c->plan_builds++;
  LM_CU(cudaGraphLaunch(p->exec, c->stream));
  c->plan_uses++;
  return LM_OK;
}

lm_status lm_cuda_run_step(lm_backend *be, const lm_step_fn *st) {
  lm_cuda_ctx *c = lm_cuda_of(be);
  if (!c->plans_on || !st->batch || st->batch->n_tokens > PLAN_MAX_TOKENS)
    return st->issue(st->arg);
  char *key = plan_key(c, st);
  if (!key) return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  lm_cuda_plan *p = plan_find(c, key);
  if (p) {
    free(key);
    p->last_use = ++c->plan_clock;
    if (p->failed) return st->issue(st->arg);
    LM_CU(cudaGraphLaunch(p->exec, c->stream));
    replay_appends(p, st->batch);
    c->plan_uses++;
    return LM_OK;
  }
  lm_cuda_plan **slot = plan_slot(c);
  if (!(p = calloc(1, sizeof *p))) {
    free(key);
    return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  }
  p->key = key;
  p->owner = st->owner;
  p->last_use = ++c->plan_clock;
  lm_status s = capture(c, p, st);
  if (s) {
    plan_free(p);
    return s;
  }
  *slot = p;
  return LM_OK;
}
