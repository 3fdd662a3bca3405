/* cpu_ops.c — the elementwise and row-wise ops of the CPU backend, in f32. They follow the
 * transformers Gemma 4 formulas exactly (gemma4-spec §2); see the comment at each op. */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/cpu_matmul.h"
#include "base/status.h"
#include "tensor/dtype.h"

/* F.gelu(x, approximate="tanh"). */
float lm_gelu_tanh(float x) {
  const float k = 0.7978845608028654f; /* sqrt(2/pi) */
  return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

/* Gemma4TextScaledWordEmbedding: E[id] * scale (the scale is rounded to the weight dtype by
 * the caller when it emulates bf16; in f32 it is sqrt(H) as an f32). */
lm_status lm_cpu_embed(lm_backend *be, const lm_embed_args *a) {
  const lm_batch *b = lm_cpu_batch(be);
  const lm_weight *w = a->table;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < b->n_tokens; t++) {
    float *y = lm_cpu_row(a->out, t);
    lm_weight_dequant_row(w, 0, b->ids[t], y);
    for (int64_t c = 0; c < w->cols; c++)
      y[c] *= a->scale;
  }
  return LM_OK;
}

static lm_status matmul_plain(lm_backend *be, const lm_matmul_args *a) {
  lm_cpu_matmul_args m = {
      .y = a->out.data,
      .ldy = a->out.ld,
      .x = a->x.data,
      .ldx = a->x.ld,
      .m = a->x.rows,
      .w = a->w,
      .expert = a->expert,
      .prec = be->precision == LM_PRECISION_FAST ? LM_CPU_PREC_FAST : LM_CPU_PREC_F32,
      .accumulate = a->accumulate,
  };
  return lm_cpu_matmul(&m);
}

lm_status lm_cpu_matmul_op(lm_backend *be, const lm_matmul_args *a) {
  if (a->epilogue && (a->accumulate || a->other.rows < a->out.rows || a->other.cols != a->out.cols))
    return LM_ERRF(LM_ERR_INVALID,
                   "matmul: an epilogue needs `other` of the output's shape and no accumulate");
  if ((a->epilogue == LM_EPI_GLU_PAIR) != (a->w2 != NULL))
    return LM_ERRF(LM_ERR_INVALID,
                   "matmul: a second weight goes with the GLU-pair epilogue, and only with it");
  if (a->epilogue == LM_EPI_GLU_PAIR) return lm_matmul_glu_pair(be, a, lm_cpu_matmul_op);
  LM_TRY(matmul_plain(be, a));
  if (a->epilogue == LM_EPI_GLU_OTHER)
    return lm_cpu_geglu(be, &(lm_geglu_args){.out = a->out, .gate = a->other, .up = a->out});
  if (a->epilogue == LM_EPI_GLU_SELF)
    return lm_cpu_geglu(be, &(lm_geglu_args){.out = a->out, .gate = a->out, .up = a->other});
  return LM_OK;
}

static float round_if(int bf16, float v) { return bf16 ? lm_round_bf16(v) : v; }

/* apply_rotary_pos_emb with rotate_half: pairs (i, i + hd/2); angle = f32(pos) * inv_freq[i],
 * cos/sin in f32 (Gemma4TextRotaryEmbedding.forward). Token t's heads start at data +
 * t*token_stride, head_stride floats apart, so one loop serves [T][heads*hd] rows (the rope
 * op) and head rows [T*heads][hd] (the norm's RoPE form); the angles are computed once per
 * token for all its heads. bf16: cos/sin, each product and each sum rounded, as the CUDA
 * kernels and transformers' bf16 run round (LM_PRECISION_BF16). */
void lm_cpu_rope_tokens(float *data, int64_t token_stride, int64_t head_stride, int64_t T,
                        int heads, int hd, const int32_t *pos, const float *inv, int bf16) {
  int half = hd / 2;
#pragma omp parallel for schedule(static) if (T > 8)
  for (int64_t t = 0; t < T; t++) {
    float c[half], s[half];
    for (int i = 0; i < half; i++) {
      float ang = (float)pos[t] * inv[i];
      c[i] = round_if(bf16, cosf(ang));
      s[i] = round_if(bf16, sinf(ang));
    }
    for (int h = 0; h < heads; h++) {
      float *y = data + t * token_stride + h * head_stride;
      for (int i = 0; i < half; i++) {
        float x0 = y[i], x1 = y[i + half];
        y[i] = round_if(bf16, round_if(bf16, x0 * c[i]) - round_if(bf16, x1 * s[i]));
        y[i + half] = round_if(bf16, round_if(bf16, x1 * c[i]) + round_if(bf16, x0 * s[i]));
      }
    }
  }
}

/* Gemma4RMSNorm: y = x * pow(mean(x²) + eps, -0.5) * w — the weight as is, not (1 + w). */
float lm_cpu_inv_rms(const float *x, int64_t n, float eps) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; i++)
    ss += (double)x[i] * x[i];
  return powf((float)(ss / (double)n) + eps, -0.5f);
}

static void rmsnorm_row(float *y, const float *x, const float *w, int64_t n, float eps,
                        int accumulate) {
  float inv = lm_cpu_inv_rms(x, n, eps);
  for (int64_t i = 0; i < n; i++) {
    float v = w ? x[i] * inv * w[i] : x[i] * inv;
    y[i] = accumulate ? y[i] + v : v;
  }
}

lm_status lm_cpu_rmsnorm(lm_backend *be, const lm_rmsnorm_args *a) {
  const float *w = a->w ? (const float *)a->w->data : NULL;
  int64_t n = a->x.cols;
  if (a->w && a->w->cols != n)
    return LM_ERRF(LM_ERR_INVALID, "rmsnorm: weight %s has %lld values, rows have %lld", a->w->name,
                   (long long)a->w->cols, (long long)n);
  const float *nw = a->next_w ? (const float *)a->next_w->data : NULL;
  if (a->next_w && a->next_w->cols != n)
    return LM_ERRF(LM_ERR_INVALID, "rmsnorm: next weight %s has %lld values, rows have %lld",
                   a->next_w->name, (long long)a->next_w->cols, (long long)n);
  if (a->rope && (a->residual || a->rope_heads <= 0 || a->x.rows % a->rope_heads || n % 2 ||
                  a->rope->cols != n / 2 || !lm_cpu_batch(be) ||
                  a->x.rows / a->rope_heads > lm_cpu_batch(be)->n_tokens))
    return LM_ERRF(LM_ERR_INVALID,
                   "rmsnorm: RoPE needs a step, head rows (%d per token of it), an even head dim "
                   "with its inverse frequencies, and no residual",
                   a->rope_heads);
  const float *inv = a->rope ? (const float *)a->rope->data : NULL;
  const int32_t *pos = a->rope ? lm_cpu_batch(be)->pos : NULL;
#pragma omp parallel for schedule(static) if (a->x.rows > 8)
  for (int64_t r = 0; r < a->x.rows; r++) {
    if (a->residual) {
      float *res = lm_cpu_row(*a->residual, r);
      rmsnorm_row(res, lm_cpu_row(a->x, r), w, n, a->eps, 1);
      if (a->scaled)
        for (int64_t i = 0; i < n; i++)
          res[i] *= a->scale;
      if (a->next_out.data) rmsnorm_row(lm_cpu_row(a->next_out, r), res, nw, n, a->eps, 0);
    } else {
      rmsnorm_row(lm_cpu_row(a->out, r), lm_cpu_row(a->x, r), w, n, a->eps, 0);
    }
  }
  if (inv)
    lm_cpu_rope_tokens(a->out.data, a->out.ld * a->rope_heads, a->out.ld,
                       a->out.rows / a->rope_heads, a->rope_heads, (int)n, pos, inv, 0);
  return LM_OK;
}

lm_status lm_cpu_rope(lm_backend *be, const lm_rope_args *a) {
  lm_cpu_rope_tokens(a->x.data, a->x.ld, a->head_dim, a->x.rows, a->n_heads, a->head_dim,
                     lm_cpu_batch(be)->pos, a->inv_freq->data, 0);
  return LM_OK;
}

/* Parallel over every element, so a decode step's single wide row (12,288 columns on E2B's
 * shared layers) is split too: tanhf is the cost here, not memory. */
lm_status lm_cpu_geglu(lm_backend *be, const lm_geglu_args *a) {
  (void)be;
  int64_t cols = a->out.cols, n = a->out.rows * cols;
#pragma omp parallel for schedule(static) if (n > 4096)
  for (int64_t i = 0; i < n; i++) {
    int64_t r = i / cols, c = i % cols;
    lm_cpu_row(a->out, r)[c] = lm_gelu_tanh(lm_cpu_row(a->gate, r)[c]) * lm_cpu_row(a->up, r)[c];
  }
  return LM_OK;
}

lm_status lm_cpu_add(lm_backend *be, const lm_add_args *a) {
  (void)be;
  for (int64_t r = 0; r < a->out.rows; r++) {
    float *y = lm_cpu_row(a->out, r);
    const float *x = lm_cpu_row(a->a, r);
    if (a->b.data) {
      const float *z = lm_cpu_row(a->b, r);
      for (int64_t i = 0; i < a->out.cols; i++)
        y[i] = (x[i] + z[i]) * a->scale;
    } else {
      for (int64_t i = 0; i < a->out.cols; i++)
        y[i] = x[i] * a->scale;
    }
  }
  return LM_OK;
}

/* final_logit_softcapping: tanh(x / cap) * cap. */
lm_status lm_cpu_softcap(lm_backend *be, const lm_softcap_args *a) {
  (void)be;
  for (int64_t r = 0; r < a->x.rows; r++) {
    float *y = lm_cpu_row(a->x, r);
    for (int64_t i = 0; i < a->x.cols; i++)
      y[i] = tanhf(y[i] / a->cap) * a->cap;
  }
  return LM_OK;
}

lm_status lm_cpu_gather_logit_rows(lm_backend *be, const lm_gather_args *a) {
  const lm_batch *b = lm_cpu_batch(be);
  for (int32_t i = 0; i < b->n_logits; i++)
    memcpy(lm_cpu_row(a->out, i), lm_cpu_row(a->x, b->logit_rows[i]),
           (size_t)a->x.cols * sizeof(float));
  return LM_OK;
}

lm_status lm_cpu_argmax(lm_backend *be, const lm_argmax_args *a) {
  (void)be;
  for (int64_t r = 0; r < a->x.rows; r++) {
    const float *x = lm_cpu_row(a->x, r);
    int64_t best = 0;
    for (int64_t i = 1; i < a->x.cols; i++)
      if (x[i] > x[best]) best = i;
    ((int32_t *)a->ids.data)[r * a->ids.ld] = (int32_t)best;
  }
  return LM_OK;
}
