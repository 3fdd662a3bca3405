/* cuda_internal.h — state of the CUDA backend shared by its C files (cuda_backend.c: memory,
 * weights, steps; cuda_ops.c / cuda_matmul.c: the ops; cuda_plan.c: captured plans). */
#ifndef LM_BACKEND_CUDA_INTERNAL_H
#define LM_BACKEND_CUDA_INTERNAL_H

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_kernels.h"
#include "kv/batch.h"

/* What an allocation is for (device memory accounting). */
typedef enum lm_cuda_use {
  LM_CUDA_WORKSPACE = 0,
  LM_CUDA_KV = 1,
  LM_CUDA_WEIGHTS = 2,
  LM_CUDA_USES
} lm_cuda_use;

typedef struct lm_cuda_alloc {
  void *p;
  size_t bytes;
  lm_cuda_use use;
} lm_cuda_alloc;

/* A prepared weight: the kernels' view plus what it owns. */
typedef struct lm_cuda_weight {
  lm_cu_w w;
  void *data, *sb;
  const lm_weight *host; /* the weight it was prepared from */
} lm_cuda_weight;

/* Per-op device time when LUMEN_CUDA_PROFILE is set (eager steps, one sync per op). */
typedef struct lm_cuda_prof_entry {
  char key[96];
  double ms;
  int64_t calls;
} lm_cuda_prof_entry;
#define LM_CUDA_PROF_MAX 96

/* The step's inputs in device memory (begin_step): per-(sequence, cache) descriptors, token
 * ids, positions, sequences, logit rows, and attention tiles (≤ 16 tokens of one sequence). */
typedef struct lm_cuda_step {
  lm_cu_kvdesc *kv;
  int32_t *ids, *pos, *seq, *rows, *tiles;
  int n_tokens, n_logits, n_seqs, n_caches, n_tiles, max_tile;
} lm_cuda_step;

#define LM_CUDA_TILE 16     /* tokens per attention tile */
#define LM_CUDA_MAX_PLANS 8 /* plans kept (least recently used one goes) */

typedef struct lm_cuda_plan lm_cuda_plan;

typedef struct lm_cuda_ctx {
  int device, n_sms, smem_optin;
  lm_cu_switches sw; /* read from the environment once, when the backend is created */
  char name[256];
  cudaStream_t stream;
  lm_cu_stream ks; /* the stream as the launchers take it: with sw.pdl */
  cublasHandle_t blas;
  lm_cuda_alloc *allocs;
  int n_allocs, cap_allocs;
  int64_t used[LM_CUDA_USES];
  lm_cuda_weight **weights; /* every prepared weight, freed with the backend */
  int n_weights, cap_weights;
  void *mm_scratch; /* dequantized weight tiles for cuBLAS */
  size_t mm_scratch_bytes;
  float *attn_part; /* split-K attention partials */
  int64_t attn_part_floats;
  void *tq_tables;            /* the TurboQuant codec's tables (lm_cuda_kvdesc points into them) */
  void *step_host, *step_dev; /* pinned staging and device copy of the step inputs */
  size_t step_cap;
  lm_cuda_step st;
  const lm_batch *batch; /* the step in flight (host), NULL outside steps */
  lm_cuda_plan *plans[LM_CUDA_MAX_PLANS];
  lm_cuda_plan *capturing; /* the plan being captured, or NULL */
  int plans_on;
  int64_t plan_uses, plan_builds, plan_clock;
  char plan_error[256];   /* why the last capture was refused ("" if none was) */
  int profile;            /* LUMEN_CUDA_PROFILE set: every op timed, steps eager */
  cudaEvent_t prof_ev[4]; /* profiling: op start/end, step start/end (NULL when off) */
  lm_cuda_prof_entry *prof;
  int n_prof;
  int prof_step; /* LUMEN_CUDA_PROFILE_STEP: the decode step in the profiler range (0: none) */
  int prof_seen; /* decode steps begun so far (counted only when prof_step is set) */
  int prof_range_open;     /* cudaProfilerStart was called and its Stop is due */
  lm_backend_ops prof_ops; /* the wrapped table a profiled backend uses */
} lm_cuda_ctx;

static inline lm_cuda_ctx *lm_cuda_of(lm_backend *be) { return (lm_cuda_ctx *)be->ctx; }

/* A failed CUDA call as an lm_status (LM_ERR_DEVICE, or LM_ERR_NOMEM for allocations), naming
 * the call and file:line. */
lm_status lm_cuda_fail(cudaError_t e, const char *call, const char *file, int line);
lm_status lm_cublas_fail(cublasStatus_t e, const char *call, const char *file, int line);
#define LM_CU(call)                                                                                \
  do {                                                                                             \
    cudaError_t lm_cu_e_ = (call);                                                                 \
    if (lm_cu_e_ != cudaSuccess) return lm_cuda_fail(lm_cu_e_, #call, __FILE__, __LINE__);         \
  } while (0)
#define LM_CUBLAS(call)                                                                            \
  do {                                                                                             \
    cublasStatus_t lm_cb_e_ = (call);                                                              \
    if (lm_cb_e_ != CUBLAS_STATUS_SUCCESS)                                                         \
      return lm_cublas_fail(lm_cb_e_, #call, __FILE__, __LINE__);                                  \
  } while (0)

/* Device memory with accounting; the error names `what`, the size and the free memory. */
lm_status lm_cuda_malloc(lm_cuda_ctx *c, size_t bytes, lm_cuda_use use, const char *what,
                         void **out);
void lm_cuda_release(lm_cuda_ctx *c, void *p);

/* Helpers for the ops. */
lm_cu_t lm_cuda_view(lm_tensor t);
lm_status lm_cuda_weight_of(const lm_weight *w, const char *op, const lm_cuda_weight **out);
lm_status lm_cuda_need_step(lm_cuda_ctx *c, const char *op);
/* The kernels' descriptor of a cache as it is now. */
lm_cu_kvdesc lm_cuda_kvdesc(const lm_kv_cache *kc);

lm_status lm_cuda_embed(lm_backend *be, const lm_embed_args *a);
lm_status lm_cuda_matmul(lm_backend *be, const lm_matmul_args *a);
lm_status lm_cuda_lora_shrink(lm_backend *be, const lm_lora_shrink_args *a);
lm_status lm_cuda_rmsnorm(lm_backend *be, const lm_rmsnorm_args *a);
lm_status lm_cuda_rope(lm_backend *be, const lm_rope_args *a);
lm_status lm_cuda_geglu(lm_backend *be, const lm_geglu_args *a);
lm_status lm_cuda_add(lm_backend *be, const lm_add_args *a);
lm_status lm_cuda_softcap(lm_backend *be, const lm_softcap_args *a);
lm_status lm_cuda_gather_logit_rows(lm_backend *be, const lm_gather_args *a);
lm_status lm_cuda_attention(lm_backend *be, const lm_attn_args *a);
lm_status lm_cuda_kv_stage(lm_backend *be, const lm_kv_stage_args *a);
lm_status lm_cuda_kv_convert(lm_backend *be, const lm_kv_convert_args *a);
lm_status lm_cuda_kv_append(lm_backend *be, const lm_kv_append_args *a);
lm_status lm_cuda_moe_route(lm_backend *be, const lm_moe_route_args *a);
lm_status lm_cuda_moe_experts(lm_backend *be, const lm_moe_experts_args *a);
lm_status lm_cuda_argmax(lm_backend *be, const lm_argmax_args *a);
lm_status lm_cuda_logits_kl(lm_backend *be, const lm_logits_kl_args *a);

/* Profiling (cuda_profile.c): fills t with the op table, every op wrapped in timing. */
void lm_cuda_profiled_ops(lm_backend_ops *t);
const lm_backend_ops *lm_cuda_base_ops(void); /* the unwrapped table */
lm_status lm_cuda_prof_begin(lm_cuda_ctx *c);
void lm_cuda_prof_end(lm_cuda_ctx *c, const char *key);
void lm_cuda_prof_print(lm_cuda_ctx *c);
/* LUMEN_CUDA_PROFILE_STEP=k: the profiler range (cudaProfilerStart/Stop, for ncu
 * --profile-from-start off) covers exactly the k-th decode step (one token per sequence). */
void lm_cuda_range_step(lm_cuda_ctx *c, int begin);

/* Plans (cuda_plan.c). */
lm_status lm_cuda_run_step(lm_backend *be, const lm_step_fn *st);
void lm_cuda_release_plans(lm_backend *be, const void *owner);
/* Drops every plan (a weight's device copy changed under them). */
void lm_cuda_drop_plans(lm_cuda_ctx *c);
void lm_cuda_plans_clear(lm_cuda_ctx *c);
/* Called by kv_append while a plan is captured: the host effect to repeat on each replay. */
lm_status lm_cuda_plan_note_append(lm_cuda_ctx *c, int cache);

#endif
