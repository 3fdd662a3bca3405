/* cuda_profile.c — LUMEN_CUDA_PROFILE: device time per op, for finding where a step goes.
 * Every op of the table is wrapped: an event before, an event after, a wait for the second,
 * and the elapsed time is added to an entry keyed by the op and its shape class (matmuls by
 * weight shape and row count). Steps run eagerly (no plans), so the numbers include the gaps
 * a graph would remove; the "step" entries give the whole step for comparison. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_profiler_api.h>

#include "backend/cuda/cuda_internal.h"
#include "base/status.h"

lm_status lm_cuda_prof_begin(lm_cuda_ctx *c) {
  for (int i = 0; i < 4; i++)
    LM_CU(cudaEventCreate(&c->prof_ev[i]));
  c->prof = calloc(LM_CUDA_PROF_MAX, sizeof *c->prof);
  if (!c->prof) return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  return LM_OK;
}

static void prof_record(lm_cuda_ctx *c, const char *key, int e0, int e1) {
  float ms = 0;
  if (cudaEventRecord(c->prof_ev[e1], c->stream) != cudaSuccess ||
      cudaEventSynchronize(c->prof_ev[e1]) != cudaSuccess ||
      cudaEventElapsedTime(&ms, c->prof_ev[e0], c->prof_ev[e1]) != cudaSuccess) {
    (void)cudaGetLastError();
    return;
  }
  int i = 0;
  while (i < c->n_prof && strcmp(c->prof[i].key, key))
    i++;
  if (i == c->n_prof) {
    if (c->n_prof == LM_CUDA_PROF_MAX)
      i = LM_CUDA_PROF_MAX - 1, snprintf(c->prof[i].key, sizeof c->prof[i].key, "other");
    else
      snprintf(c->prof[c->n_prof++].key, sizeof c->prof[i].key, "%s", key);
  }
  c->prof[i].ms += ms;
  c->prof[i].calls++;
}

void lm_cuda_prof_end(lm_cuda_ctx *c, const char *key) { prof_record(c, key, 0, 1); }

static int by_ms(const void *a, const void *b) {
  double x = ((const lm_cuda_prof_entry *)a)->ms, y = ((const lm_cuda_prof_entry *)b)->ms;
  return x < y ? 1 : x > y ? -1 : 0;
}

void lm_cuda_prof_print(lm_cuda_ctx *c) {
  if (!c->prof) return;
  qsort(c->prof, (size_t)c->n_prof, sizeof *c->prof, by_ms);
  fprintf(stderr, "cuda profile (device ms, eager steps):\n%-56s %10s %8s %10s\n", "op", "total ms",
          "calls", "us/call");
  for (int i = 0; i < c->n_prof; i++)
    fprintf(stderr, "%-56s %10.3f %8lld %10.2f\n", c->prof[i].key, c->prof[i].ms,
            (long long)c->prof[i].calls, 1e3 * c->prof[i].ms / (double)c->prof[i].calls);
  for (int i = 0; i < 4; i++)
    (void)cudaEventDestroy(c->prof_ev[i]);
  free(c->prof);
  c->prof = NULL;
}

static int rows_class(int64_t m) { return m <= 8 ? (int)m : m <= 64 ? 64 : 4096; }

#define PROF_START(be)                                                                             \
  lm_cuda_ctx *c = lm_cuda_of(be);                                                                 \
  (void)cudaEventRecord(c->prof_ev[0], c->stream)

#define PROF_SIMPLE(op, T, rows)                                                                   \
  static lm_status prof_##op(lm_backend *be, const T *a) {                                         \
    PROF_START(be);                                                                                \
    lm_status s = lm_cuda_##op(be, a);                                                             \
    char key[96];                                                                                  \
    snprintf(key, sizeof key, "%s m<=%d", #op, rows_class(rows));                                  \
    lm_cuda_prof_end(c, key);                                                                      \
    return s;                                                                                      \
  }

PROF_SIMPLE(embed, lm_embed_args, a->out.rows)
PROF_SIMPLE(rmsnorm, lm_rmsnorm_args, a->x.rows)
PROF_SIMPLE(rope, lm_rope_args, a->x.rows)
PROF_SIMPLE(geglu, lm_geglu_args, a->out.rows)
PROF_SIMPLE(add, lm_add_args, a->out.rows)
PROF_SIMPLE(softcap, lm_softcap_args, a->x.rows)
PROF_SIMPLE(gather_logit_rows, lm_gather_args, a->out.rows)
PROF_SIMPLE(kv_stage, lm_kv_stage_args, a->k_new.rows)
PROF_SIMPLE(kv_append, lm_kv_append_args, a->k_new.rows)
PROF_SIMPLE(moe_route, lm_moe_route_args, a->logits.rows)
PROF_SIMPLE(moe_experts, lm_moe_experts_args, a->x.rows)
PROF_SIMPLE(argmax, lm_argmax_args, a->x.rows)
PROF_SIMPLE(lora_shrink, lm_lora_shrink_args, a->x.rows)

static lm_status prof_matmul(lm_backend *be, const lm_matmul_args *a) {
  PROF_START(be);
  lm_status s = lm_cuda_matmul(be, a);
  char key[96];
  snprintf(key, sizeof key, "matmul %s%d %lldx%lld%s m<=%d", a->w->bits ? "q" : "dense",
           a->w->bits ? a->w->bits : 16, (long long)a->w->rows, (long long)a->w->cols,
           a->lora || a->lora2 ? " +lora" : "", rows_class(a->x.rows));
  lm_cuda_prof_end(c, key);
  return s;
}

static lm_status prof_attention(lm_backend *be, const lm_attn_args *a) {
  PROF_START(be);
  lm_status s = lm_cuda_attention(be, a);
  char key[96];
  snprintf(key, sizeof key, "attention %d/%d hd%d win%lld m<=%d", a->n_heads, a->n_kv_heads,
           a->head_dim, (long long)a->window, rows_class(a->q.rows));
  lm_cuda_prof_end(c, key);
  return s;
}

static lm_status prof_kv_convert(lm_backend *be, const lm_kv_convert_args *a) {
  return lm_cuda_kv_convert(be, a);
}

static lm_status prof_run_step(lm_backend *be, const lm_step_fn *st) {
  lm_cuda_ctx *c = lm_cuda_of(be);
  (void)cudaEventRecord(c->prof_ev[2], c->stream);
  lm_status s = lm_cuda_run_step(be, st);
  char key[96];
  snprintf(key, sizeof key, "== whole step, tokens<=%d",
           rows_class(st->batch ? st->batch->n_tokens : 0));
  prof_record(c, key, 2, 3);
  return s;
}

void lm_cuda_profiled_ops(lm_backend_ops *t) {
  *t = *lm_cuda_base_ops();
  t->embed = prof_embed;
  t->matmul = prof_matmul;
  t->rmsnorm = prof_rmsnorm;
  t->rope = prof_rope;
  t->geglu = prof_geglu;
  t->add = prof_add;
  t->softcap = prof_softcap;
  t->gather_logit_rows = prof_gather_logit_rows;
  t->attention = prof_attention;
  t->kv_stage = prof_kv_stage;
  t->kv_convert = prof_kv_convert;
  t->kv_append = prof_kv_append;
  t->moe_route = prof_moe_route;
  t->moe_experts = prof_moe_experts;
  t->argmax = prof_argmax;
  t->lora_shrink = prof_lora_shrink;
  t->run_step = prof_run_step;
}

/* Counts decode steps; with LUMEN_CUDA_PROFILE_STEP=k the k-th one (from 1) runs inside the
 * profiler range, so ncu can time every kernel (graph nodes included) of one real step. */
void lm_cuda_range_step(lm_cuda_ctx *c, int begin) {
  if (!c->prof_step) return;
  if (!begin) {
    if (c->prof_range_open) (void)cudaProfilerStop(), c->prof_range_open = 0;
    return;
  }
  if (c->st.n_tokens != c->st.n_seqs || c->st.max_tile != 1) return;
  if (++c->prof_seen == c->prof_step) (void)cudaProfilerStart(), c->prof_range_open = 1;
}
