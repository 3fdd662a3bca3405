/* cpu_bf16.c — LM_PRECISION_BF16 on the CPU: the f32 ops with every output rounded to bf16
 * where the CUDA fast path stores a bf16 tensor, and with the rounding inside RoPE, GeGLU and
 * the fused residual norm that its kernels (and transformers' bf16 run) do. So the numerics
 * of the GPU fast path can be reproduced, and taken apart, on any machine: on the parity
 * fixtures its mean KL to the reference is within 4% of the CUDA bf16 run's. Differences
 * left: the logits are rounded too (CUDA keeps them f32: a change below 1e-4 in mean KL on
 * the fixtures), and the MoE experts' intermediate tensors are not (their output is). */
#include "backend/cpu/cpu_internal.h"
#include "base/status.h"
#include "tensor/dtype.h"

static float rnd(float v) { return lm_round_bf16(v); }

static void round_rows(lm_tensor t) {
  for (int64_t r = 0; r < t.rows; r++) {
    float *x = lm_cpu_row(t, r);
    for (int64_t c = 0; c < t.cols; c++)
      x[c] = rnd(x[c]);
  }
}

/* gelu(g) * u as k_geglu computes it: the gelu rounded, then the product. */
static float glu(float g, float u) { return rnd(rnd(lm_gelu_tanh(g)) * u); }

static lm_status b_embed(lm_backend *be, const lm_embed_args *a) {
  LM_TRY(lm_cpu_ops.embed(be, a));
  round_rows(lm_tensor_rows(a->out, 0, lm_cpu_batch(be)->n_tokens));
  return LM_OK;
}

static lm_status b_matmul(lm_backend *be, const lm_matmul_args *a) {
  if (a->epilogue == LM_EPI_GLU_PAIR || a->w2) /* the base op rejects a half-formed pair */
    return a->w2 && a->epilogue == LM_EPI_GLU_PAIR ? lm_matmul_glu_pair(be, a, b_matmul)
                                                   : lm_cpu_ops.matmul(be, a);
  lm_matmul_args p = *a;
  p.epilogue = LM_EPI_NONE;
  LM_TRY(lm_cpu_ops.matmul(be, &p));
  round_rows(a->out);
  if (a->epilogue == LM_EPI_NONE) return LM_OK;
  for (int64_t r = 0; r < a->out.rows; r++) {
    float *y = lm_cpu_row(a->out, r);
    const float *o = lm_cpu_row(a->other, r);
    for (int64_t c = 0; c < a->out.cols; c++)
      y[c] = a->epilogue == LM_EPI_GLU_OTHER ? glu(o[c], y[c]) : glu(y[c], o[c]);
  }
  return LM_OK;
}

static lm_status b_rope(lm_backend *be, const lm_rope_args *a) {
  lm_cpu_rope_tokens(a->x.data, a->x.ld, a->head_dim, a->x.rows, a->n_heads, a->head_dim,
                     lm_cpu_batch(be)->pos, a->inv_freq->data, 1);
  return LM_OK;
}

/* The norm and its fused forms, rounded as k_rmsnorm_vec rounds: res = rnd(res + rnd(n)),
 * then rnd(res * scale), then the next norm of the rounded residual. */
static lm_status b_rmsnorm(lm_backend *be, const lm_rmsnorm_args *a) {
  if (!a->residual) { /* the base op validates and computes the norm; RoPE is redone here */
    lm_rmsnorm_args p = *a;
    p.rope = NULL;
    LM_TRY(lm_cpu_ops.rmsnorm(be, &p));
    round_rows(a->out);
    if (a->rope)
      lm_cpu_rope_tokens(a->out.data, a->out.ld * a->rope_heads, a->out.ld,
                         a->out.rows / a->rope_heads, a->rope_heads, (int)a->out.cols,
                         lm_cpu_batch(be)->pos, a->rope->data, 1);
    return LM_OK;
  }
  const float *w = a->w ? a->w->data : NULL, *nw = a->next_w ? a->next_w->data : NULL;
  int64_t n = a->x.cols;
  if ((a->w && a->w->cols != n) || (a->next_w && a->next_w->cols != n))
    return LM_ERRF(LM_ERR_INVALID, "rmsnorm: a weight does not match rows of %lld values",
                   (long long)n);
  for (int64_t r = 0; r < a->x.rows; r++) {
    const float *x = lm_cpu_row(a->x, r);
    float *res = lm_cpu_row(*a->residual, r), inv = lm_cpu_inv_rms(x, n, a->eps);
    for (int64_t i = 0; i < n; i++) {
      res[i] = rnd(res[i] + rnd(w ? x[i] * inv * w[i] : x[i] * inv));
      if (a->scaled) res[i] = rnd(res[i] * a->scale);
    }
    if (!a->next_out.data) continue;
    float *o = lm_cpu_row(a->next_out, r), inv2 = lm_cpu_inv_rms(res, n, a->eps);
    for (int64_t i = 0; i < n; i++)
      o[i] = rnd(nw ? res[i] * inv2 * nw[i] : res[i] * inv2);
  }
  return LM_OK;
}

static lm_status b_geglu(lm_backend *be, const lm_geglu_args *a) {
  (void)be;
  for (int64_t r = 0; r < a->out.rows; r++) {
    float *y = lm_cpu_row(a->out, r);
    const float *g = lm_cpu_row(a->gate, r), *u = lm_cpu_row(a->up, r);
    for (int64_t c = 0; c < a->out.cols; c++)
      y[c] = glu(g[c], u[c]);
  }
  return LM_OK;
}

/* k_add: the sum rounded, then the scaled result. */
static lm_status b_add(lm_backend *be, const lm_add_args *a) {
  (void)be;
  for (int64_t r = 0; r < a->out.rows; r++) {
    float *y = lm_cpu_row(a->out, r);
    const float *x = lm_cpu_row(a->a, r), *z = a->b.data ? lm_cpu_row(a->b, r) : NULL;
    for (int64_t c = 0; c < a->out.cols; c++)
      y[c] = rnd((z ? rnd(x[c] + z[c]) : x[c]) * a->scale);
  }
  return LM_OK;
}

static lm_status b_attention(lm_backend *be, const lm_attn_args *a) {
  LM_TRY(lm_cpu_ops.attention(be, a));
  round_rows(lm_tensor_rows(a->out, 0, lm_cpu_batch(be)->n_tokens));
  return LM_OK;
}

/* Quantized caches: the chunk's own queries read the stored values in bf16. */
static lm_status b_kv_stage(lm_backend *be, const lm_kv_stage_args *a) {
  LM_TRY(lm_cpu_ops.kv_stage(be, a));
  int n = lm_cpu_batch(be)->n_tokens;
  round_rows(lm_tensor_rows(a->k_new, 0, n));
  round_rows(lm_tensor_rows(a->v_new, 0, n));
  return LM_OK;
}

static lm_status b_moe_experts(lm_backend *be, const lm_moe_experts_args *a) {
  LM_TRY(lm_cpu_ops.moe_experts(be, a));
  round_rows(a->out);
  return LM_OK;
}

const lm_backend_ops *lm_cpu_bf16_ops(lm_backend_ops *t) {
  *t = lm_cpu_ops;
  t->embed = b_embed;
  t->matmul = b_matmul;
  t->rope = b_rope;
  t->rmsnorm = b_rmsnorm;
  t->geglu = b_geglu;
  t->add = b_add;
  t->attention = b_attention;
  t->kv_stage = b_kv_stage;
  t->moe_experts = b_moe_experts;
  t->run_step = NULL; /* its rounding passes are not team-shared: steps run as separate ops */
  return t;
}
