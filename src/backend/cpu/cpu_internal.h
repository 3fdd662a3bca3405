/* cpu_internal.h — state and op entry points of the CPU backend, shared by its files. */
#ifndef LM_BACKEND_CPU_INTERNAL_H
#define LM_BACKEND_CPU_INTERNAL_H

#include "backend/backend.h"
#include "backend/cpu/cpu_team.h"
#include "backend/cpu/cpu_vec.h"
#include "kv/batch.h"

/* Floats of the scratch where a team's attention keeps the parts of keys it split among its
 * threads (cpu_attention.c): E2B's decode at 512 keys needs 8·514·3 of them. */
#define LM_CPU_ATTN_PARTS (1 << 18)

typedef struct lm_cpu_ctx {
  lm_cpu_team team;        /* the decode step's threads (first: it is 64-byte aligned) */
  const lm_batch *batch;   /* the step's inputs; host memory is backend memory here */
  lm_backend_ops bf16_ops; /* LM_PRECISION_BF16: the rounding ops around the f32 ones */
  const lm_cpu_vec *vec;   /* the vector math of this CPU, chosen once */
  float attn_parts[LM_CPU_ATTN_PARTS];
} lm_cpu_ctx;

/* The f32 op table (cpu_backend.c). */
extern const lm_backend_ops lm_cpu_ops;
/* Fills t with lm_cpu_ops wrapped to round like the CUDA bf16 path (cpu_bf16.c), returns t. */
const lm_backend_ops *lm_cpu_bf16_ops(lm_backend_ops *t);
/* pow(mean(x²) + eps, -0.5) of one row, the sum in double (Gemma4RMSNorm). */
float lm_cpu_inv_rms(const float *x, int64_t n, float eps);
/* RoPE over T tokens whose heads start at data + t*token_stride, head_stride apart (cpu_ops.c);
 * bf16: rounded as the CUDA bf16 kernels round. */
void lm_cpu_rope_tokens(float *data, int64_t token_stride, int64_t head_stride, int64_t T,
                        int heads, int hd, const int32_t *pos, const float *inv, int bf16);

static inline const lm_batch *lm_cpu_batch(lm_backend *be) {
  return ((lm_cpu_ctx *)be->ctx)->batch;
}
static inline const lm_cpu_vec *lm_cpu_vec_of(lm_backend *be) {
  return ((lm_cpu_ctx *)be->ctx)->vec;
}
static inline lm_cpu_team *lm_cpu_team_of(lm_backend *be) { return &((lm_cpu_ctx *)be->ctx)->team; }
/* 1 while the caller is one of the threads of a step's team (all of them call each op). */
static inline int lm_cpu_in_team(lm_backend *be) { return lm_cpu_team_active(lm_cpu_team_of(be)); }
/* RoPE of `heads` heads of one token at position pos, head_stride floats apart (cpu_ops.c). */
void lm_cpu_rope_token(float *data, int64_t head_stride, int heads, int hd, int32_t pos,
                       const float *inv, int bf16);
/* One row of RMSNorm: y = x * inv_rms(x) * w (w NULL: no scale), or y += that (cpu_ops.c). */
void lm_cpu_rmsnorm_row(float *y, const float *x, const float *w, int64_t n, float eps,
                        int accumulate);

/* Row r of a f32 tensor. */
static inline float *lm_cpu_row(lm_tensor t, int64_t r) { return (float *)t.data + r * t.ld; }

lm_status lm_cpu_embed(lm_backend *be, const lm_embed_args *a);
lm_status lm_cpu_matmul_op(lm_backend *be, const lm_matmul_args *a);
lm_status lm_cpu_rmsnorm(lm_backend *be, const lm_rmsnorm_args *a);
lm_status lm_cpu_rope(lm_backend *be, const lm_rope_args *a);
lm_status lm_cpu_geglu(lm_backend *be, const lm_geglu_args *a);
lm_status lm_cpu_add(lm_backend *be, const lm_add_args *a);
lm_status lm_cpu_softcap(lm_backend *be, const lm_softcap_args *a);
lm_status lm_cpu_gather_logit_rows(lm_backend *be, const lm_gather_args *a);
lm_status lm_cpu_argmax(lm_backend *be, const lm_argmax_args *a);
lm_status lm_cpu_lora_shrink(lm_backend *be, const lm_lora_shrink_args *a);
/* out += the rows' LoRA terms (cpu_lora.c). */
lm_status lm_cpu_lora_expand(lm_backend *be, lm_tensor out, const lm_lora_io *io);
lm_status lm_cpu_attention(lm_backend *be, const lm_attn_args *a);
lm_status lm_cpu_kv_convert(lm_backend *be, const lm_kv_convert_args *a);
lm_status lm_cpu_kv_stage(lm_backend *be, const lm_kv_stage_args *a);
lm_status lm_cpu_kv_append(lm_backend *be, const lm_kv_append_args *a);
lm_status lm_cpu_moe_route(lm_backend *be, const lm_moe_route_args *a);
lm_status lm_cpu_moe_experts(lm_backend *be, const lm_moe_experts_args *a);

/* gelu with the tanh approximation, as torch's F.gelu(approximate="tanh"). */
float lm_gelu_tanh(float x);

#endif
