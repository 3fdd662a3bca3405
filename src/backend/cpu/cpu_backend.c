/* cpu_backend.c — the CPU backend: host memory, f32 activations, and the op table. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"
#include "base/status.h"
#include "kv/kv.h"

static lm_status cpu_alloc(lm_backend *be, size_t bytes, void **ptr) {
  (void)be;
  /* 64-byte alignment for SIMD; round up so aligned_alloc's size rule holds. */
  size_t n = (bytes + 63) & ~(size_t)63;
  *ptr = aligned_alloc(64, n ? n : 64);
  if (!*ptr) return LM_ERRF(LM_ERR_NOMEM, "CPU backend: cannot allocate %zu bytes", bytes);
  return LM_OK;
}

static void cpu_free(lm_backend *be, void *ptr) {
  (void)be;
  free(ptr);
}

static lm_status cpu_memcpy(lm_backend *be, void *dst, const void *src, size_t bytes) {
  (void)be;
  if (bytes) memcpy(dst, src, bytes);
  return LM_OK;
}

static int cpu_supports_cache(lm_backend *be, const char *sig) {
  (void)be;
  return !strcmp(sig, "kv:plain") || !strcmp(sig, "kv:rotating-plain") ||
         !strncmp(sig, "kv:quant:", 9) || !strncmp(sig, "kv:rotating-quant:", 18) ||
         lm_kv_tq_sig_ok(sig);
}

static lm_status cpu_begin_step(lm_backend *be, const lm_batch *b) {
  ((lm_cpu_ctx *)be->ctx)->batch = b;
  return LM_OK;
}

static lm_status cpu_end_step(lm_backend *be) {
  ((lm_cpu_ctx *)be->ctx)->batch = NULL;
  return LM_OK;
}

static lm_status cpu_run_step(lm_backend *be, const lm_step_fn *st) {
  return lm_cpu_team_step(lm_cpu_team_of(be), st->batch->n_tokens, st->issue, st->arg);
}

void lm_cpu_team_config(lm_backend *be, int enable, int adapt) {
  lm_cpu_team *t = lm_cpu_team_of(be);
  t->enable = enable;
  t->adapt = adapt;
}

lm_cpu_team_stats lm_cpu_team_stats_of(const lm_backend *be) {
  const lm_cpu_team_adapt *a = &((const lm_cpu_ctx *)be->ctx)->team.ad;
  return (lm_cpu_team_stats){a->steps, a->one_steps, a->sec[0], a->sec[1]};
}

static void cpu_destroy(lm_backend *be) {
  if (!be) return;
  free(be->ctx);
  free(be);
}

const lm_backend_ops lm_cpu_ops = {
    .api_version = LM_BACKEND_API_VERSION,
    .name = "cpu",
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_memcpy,
    .download = cpu_memcpy,
    .copy = cpu_memcpy,
    .prepare_weight = NULL, /* weights are used in place, from the mmap */
    .supports_cache = cpu_supports_cache,
    .begin_step = cpu_begin_step,
    .end_step = cpu_end_step,
    .embed = lm_cpu_embed,
    .matmul = lm_cpu_matmul_op,
    .rmsnorm = lm_cpu_rmsnorm,
    .rope = lm_cpu_rope,
    .geglu = lm_cpu_geglu,
    .add = lm_cpu_add,
    .softcap = lm_cpu_softcap,
    .gather_logit_rows = lm_cpu_gather_logit_rows,
    .attention = lm_cpu_attention,
    .kv_stage = lm_cpu_kv_stage,
    .kv_convert = lm_cpu_kv_convert,
    .kv_append = lm_cpu_kv_append,
    .moe_route = lm_cpu_moe_route,
    .moe_experts = lm_cpu_moe_experts,
    .argmax = lm_cpu_argmax,
    .lora_shrink = lm_cpu_lora_shrink,
    .run_step = cpu_run_step,
};

lm_status lm_backend_cpu_create(lm_precision prec, int threads, lm_backend **out) {
  *out = NULL;
  lm_backend *be = calloc(1, sizeof *be);
  lm_cpu_ctx *ctx = aligned_alloc(64, (sizeof *ctx + 63) & ~(size_t)63);
  if (ctx) {
    memset(ctx, 0, sizeof *ctx);
    ctx->team.enable = ctx->team.adapt = 1;
    ctx->vec = lm_cpu_vec_best();
  }
  if (!be || !ctx) {
    free(be);
    free(ctx);
    return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  }
  if (prec != LM_PRECISION_F32 && prec != LM_PRECISION_FAST && prec != LM_PRECISION_BF16) {
    free(be);
    free(ctx);
    return LM_ERRF(LM_ERR_INVALID, "cpu backend: unknown precision %d", (int)prec);
  }
  be->ops = prec == LM_PRECISION_BF16 ? lm_cpu_bf16_ops(&ctx->bf16_ops) : &lm_cpu_ops;
  be->act_dtype = LM_DT_F32;
  be->precision = prec;
  be->threads = threads;
  /* the gemv kernels and the position-tiled attention make a row of a step of up to
   * LM_CPU_TEAM_MAX_T tokens independent of the others (test_cpu_team); the bf16 wrappers are
   * not checked for it */
  be->exact_rows = prec == LM_PRECISION_BF16 ? 1 : LM_CPU_TEAM_MAX_T;
  be->ctx = ctx;
  *out = be;
  return LM_OK;
}

void lm_backend_destroy(lm_backend *be) {
  if (be) be->ops->destroy(be);
}
