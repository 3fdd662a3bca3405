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
typedef struct embed_job {
  const lm_embed_args *a;
  const lm_batch *b;
} embed_job;

static void embed_token(void *arg, int64_t t) {
  const embed_job *j = arg;
  float *y = lm_cpu_row(j->a->out, t);
  lm_weight_dequant_row(j->a->table, 0, j->b->ids[t], y);
  for (int64_t c = 0; c < j->a->table->cols; c++)
    y[c] *= j->a->scale;
}

lm_status lm_cpu_embed(lm_backend *be, const lm_embed_args *a) {
  embed_job j = {a, lm_cpu_batch(be)};
  lm_cpu_team_run(lm_cpu_team_of(be), j.b->n_tokens, 1, embed_token, &j);
  return LM_OK;
}

/* The GeGLU of an epilogue over output columns [c0, c1) of every row: what a team's matmul
 * runs on the rows it has just computed, while they are in its cache. */
typedef struct glu_job {
  lm_tensor out, gate, up;
  const lm_cpu_vec *vk;
} glu_job;

static void glu_cols(void *arg, int64_t c0, int64_t c1) {
  const glu_job *j = arg;
  for (int64_t r = 0; r < j->out.rows; r++)
    j->vk->geglu(lm_cpu_row(j->out, r) + c0, lm_cpu_row(j->gate, r) + c0, lm_cpu_row(j->up, r) + c0,
                 c1 - c0);
}

/* The kernel's arguments for one op's product (its team when a step runs as one). */
static lm_cpu_matmul_args mm_args(lm_backend *be, const lm_matmul_args *a) {
  return (lm_cpu_matmul_args){
      .y = a->out.data,
      .ldy = a->out.ld,
      .x = a->x.data,
      .ldx = a->x.ld,
      .m = a->x.rows,
      .w = a->w,
      .expert = a->expert,
      .prec = be->precision == LM_PRECISION_FAST ? LM_CPU_PREC_FAST : LM_CPU_PREC_F32,
      .accumulate = a->accumulate,
      .team = lm_cpu_in_team(be) ? lm_cpu_team_of(be) : NULL,
  };
}

static lm_status matmul_plain(lm_backend *be, const lm_matmul_args *a) {
  lm_cpu_matmul_args m = mm_args(be, a);
  return lm_cpu_matmul(&m);
}

/* In a team: the epilogue runs per chunk of rows; GLU_PAIR computes the gate rows into other
 * and the up rows into out in the same chunk (bit for bit the unfused sequence). */
static lm_status matmul_team(lm_backend *be, const lm_matmul_args *a) {
  glu_job g = {.out = a->out, .gate = a->other, .up = a->out, .vk = lm_cpu_vec_of(be)};
  if (a->epilogue == LM_EPI_GLU_SELF) g.gate = a->out, g.up = a->other;
  lm_cpu_matmul_args m = mm_args(be, a); /* matmul_team runs only inside a team */
  m.epi = a->epilogue ? glu_cols : NULL;
  m.epi_arg = &g;
  if (a->epilogue == LM_EPI_GLU_PAIR) {
    m.y = a->other.data, m.ldy = a->other.ld;
    m.w2 = a->w2, m.y2 = a->out.data, m.ldy2 = a->out.ld;
  }
  return lm_cpu_matmul(&m);
}

lm_status lm_cpu_matmul_op(lm_backend *be, const lm_matmul_args *a) {
  if (a->lora || a->lora2) return lm_matmul_lora_split(be, a, lm_cpu_matmul_op, lm_cpu_lora_expand);
  if (a->epilogue && (a->accumulate || a->other.rows < a->out.rows || a->other.cols != a->out.cols))
    return LM_ERRF(LM_ERR_INVALID,
                   "matmul: an epilogue needs `other` of the output's shape and no accumulate");
  if ((a->epilogue == LM_EPI_GLU_PAIR) != (a->w2 != NULL))
    return LM_ERRF(LM_ERR_INVALID,
                   "matmul: a second weight goes with the GLU-pair epilogue, and only with it");
  if (lm_cpu_in_team(be) && a->x.rows <= LM_CPU_TEAM_MAX_T &&
      (a->epilogue != LM_EPI_GLU_PAIR || lm_mm_same_format(a->w, a->w2)))
    return matmul_team(be, a);
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
void lm_cpu_rope_token(float *data, int64_t head_stride, int heads, int hd, int32_t pos,
                       const float *inv, int bf16) {
  int half = hd / 2;
  float c[half], s[half];
  for (int i = 0; i < half; i++) {
    float ang = (float)pos * inv[i];
    c[i] = round_if(bf16, cosf(ang));
    s[i] = round_if(bf16, sinf(ang));
  }
  for (int h = 0; h < heads; h++) {
    float *y = data + h * head_stride;
    for (int i = 0; i < half; i++) {
      float x0 = y[i], x1 = y[i + half];
      y[i] = round_if(bf16, round_if(bf16, x0 * c[i]) - round_if(bf16, x1 * s[i]));
      y[i + half] = round_if(bf16, round_if(bf16, x1 * c[i]) + round_if(bf16, x0 * s[i]));
    }
  }
}

void lm_cpu_rope_tokens(float *data, int64_t token_stride, int64_t head_stride, int64_t T,
                        int heads, int hd, const int32_t *pos, const float *inv, int bf16) {
#pragma omp parallel for schedule(static) if (T > 8)
  for (int64_t t = 0; t < T; t++)
    lm_cpu_rope_token(data + t * token_stride, head_stride, heads, hd, pos[t], inv, bf16);
}

/* Gemma4RMSNorm: y = x * pow(mean(x²) + eps, -0.5) * w — the weight as is, not (1 + w). */
float lm_cpu_inv_rms(const float *x, int64_t n, float eps) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; i++)
    ss += (double)x[i] * x[i];
  return powf((float)(ss / (double)n) + eps, -0.5f);
}

void lm_cpu_rmsnorm_row(float *y, const float *x, const float *w, int64_t n, float eps,
                        int accumulate) {
  float inv = lm_cpu_inv_rms(x, n, eps);
  for (int64_t i = 0; i < n; i++) {
    float v = w ? x[i] * inv * w[i] : x[i] * inv;
    y[i] = accumulate ? y[i] + v : v;
  }
}

#define NORM_CHUNK 4096 /* team: elements of rows per chunk, at least one row */

typedef struct norm_job {
  const lm_rmsnorm_args *a;
  const float *w, *nw, *inv;
  const int32_t *pos;
  int64_t n, per; /* row length; rows per team chunk */
} norm_job;

/* Row r: the norm, or its residual forms (the residual add, the layer scalar, the next norm). */
static void norm_one(const norm_job *j, int64_t r) {
  const lm_rmsnorm_args *a = j->a;
  if (!a->residual) {
    lm_cpu_rmsnorm_row(lm_cpu_row(a->out, r), lm_cpu_row(a->x, r), j->w, j->n, a->eps, 0);
    return;
  }
  float *res = lm_cpu_row(*a->residual, r);
  lm_cpu_rmsnorm_row(res, lm_cpu_row(a->x, r), j->w, j->n, a->eps, 1);
  if (a->scaled)
    for (int64_t i = 0; i < j->n; i++)
      res[i] *= a->scale;
  if (a->next_out.data) lm_cpu_rmsnorm_row(lm_cpu_row(a->next_out, r), res, j->nw, j->n, a->eps, 0);
}

static void norm_chunk(void *arg, int64_t i) {
  const norm_job *j = arg;
  int64_t r0 = i * j->per, r1 = r0 + j->per < j->a->x.rows ? r0 + j->per : j->a->x.rows;
  for (int64_t r = r0; r < r1; r++)
    norm_one(j, r);
  if (j->inv) /* chunk i is token i's heads */
    lm_cpu_rope_token(lm_cpu_row(j->a->out, r0), j->a->out.ld, (int)j->per, (int)j->n, j->pos[i],
                      j->inv, 0);
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
  norm_job j = {.a = a, .w = w, .nw = nw, .n = n};
  if (a->rope) j.inv = a->rope->data, j.pos = lm_cpu_batch(be)->pos;
  if (lm_cpu_in_team(be)) { /* chunks of whole rows; with RoPE, a token's heads and their RoPE */
    j.per = a->rope ? a->rope_heads : (NORM_CHUNK + n - 1) / n;
    lm_cpu_team_run(lm_cpu_team_of(be), (a->x.rows + j.per - 1) / j.per, 0, norm_chunk, &j);
    return LM_OK;
  }
#pragma omp parallel for schedule(static) if (a->x.rows > 8)
  for (int64_t r = 0; r < a->x.rows; r++)
    norm_one(&j, r);
  if (j.inv)
    lm_cpu_rope_tokens(a->out.data, a->out.ld * a->rope_heads, a->out.ld,
                       a->out.rows / a->rope_heads, a->rope_heads, (int)n, j.pos, j.inv, 0);
  return LM_OK;
}

typedef struct rope_job {
  const lm_rope_args *a;
  const int32_t *pos;
} rope_job;

static void rope_chunk(void *arg, int64_t t) {
  const rope_job *j = arg;
  lm_cpu_rope_token(lm_cpu_row(j->a->x, t), j->a->head_dim, j->a->n_heads, j->a->head_dim,
                    j->pos[t], j->a->inv_freq->data, 0);
}

lm_status lm_cpu_rope(lm_backend *be, const lm_rope_args *a) {
  if (lm_cpu_in_team(be)) {
    rope_job j = {a, lm_cpu_batch(be)->pos};
    lm_cpu_team_run(lm_cpu_team_of(be), a->x.rows, 0, rope_chunk, &j);
    return LM_OK;
  }
  lm_cpu_rope_tokens(a->x.data, a->x.ld, a->head_dim, a->x.rows, a->n_heads, a->head_dim,
                     lm_cpu_batch(be)->pos, a->inv_freq->data, 0);
  return LM_OK;
}

/* Elementwise work over [rows][cols] in a team: chunks of EW_CHUNK elements in row-major
 * order, each a column range of one row. */
#define EW_CHUNK 4096

typedef struct ew_job {
  int64_t rows, cols, per_row; /* chunks per row */
  void (*fn)(const struct ew_job *j, int64_t r, int64_t c0, int64_t c1);
  const void *a;
  const lm_cpu_vec *vk; /* the ops that need vector math */
} ew_job;

static void ew_chunk(void *arg, int64_t i) {
  const ew_job *j = arg;
  int64_t r = i / j->per_row, c0 = i % j->per_row * EW_CHUNK;
  j->fn(j, r, c0, c0 + EW_CHUNK < j->cols ? c0 + EW_CHUNK : j->cols);
}

/* Runs fn over every row (all columns) outside a team, or over the team's chunks inside. */
static void ew_run(lm_backend *be, ew_job *j, int par) {
  if (!lm_cpu_in_team(be)) {
#pragma omp parallel for schedule(static) if (par)
    for (int64_t r = 0; r < j->rows; r++)
      j->fn(j, r, 0, j->cols);
    return;
  }
  j->per_row = (j->cols + EW_CHUNK - 1) / EW_CHUNK;
  lm_cpu_team_run(lm_cpu_team_of(be), j->rows * j->per_row, 0, ew_chunk, j);
}

static void geglu_cols(const ew_job *j, int64_t r, int64_t c0, int64_t c1) {
  const lm_geglu_args *a = j->a;
  j->vk->geglu(lm_cpu_row(a->out, r) + c0, lm_cpu_row(a->gate, r) + c0, lm_cpu_row(a->up, r) + c0,
               c1 - c0);
}

lm_status lm_cpu_geglu(lm_backend *be, const lm_geglu_args *a) {
  ew_job j = {
      .rows = a->out.rows, .cols = a->out.cols, .fn = geglu_cols, .a = a, .vk = lm_cpu_vec_of(be)};
  ew_run(be, &j, a->out.rows * a->out.cols > 4096);
  return LM_OK;
}

static void add_cols(const ew_job *j, int64_t r, int64_t c0, int64_t c1) {
  const lm_add_args *a = j->a;
  float *y = lm_cpu_row(a->out, r);
  const float *x = lm_cpu_row(a->a, r);
  if (a->b.data) {
    const float *z = lm_cpu_row(a->b, r);
    for (int64_t i = c0; i < c1; i++)
      y[i] = (x[i] + z[i]) * a->scale;
  } else {
    for (int64_t i = c0; i < c1; i++)
      y[i] = x[i] * a->scale;
  }
}

lm_status lm_cpu_add(lm_backend *be, const lm_add_args *a) {
  ew_job j = {.rows = a->out.rows, .cols = a->out.cols, .fn = add_cols, .a = a};
  ew_run(be, &j, 0);
  return LM_OK;
}

static void softcap_cols(const ew_job *j, int64_t r, int64_t c0, int64_t c1) {
  const lm_softcap_args *a = j->a;
  j->vk->softcap(lm_cpu_row(a->x, r) + c0, c1 - c0, a->cap);
}

/* final_logit_softcapping: tanh(x / cap) * cap. */
lm_status lm_cpu_softcap(lm_backend *be, const lm_softcap_args *a) {
  ew_job j = {
      .rows = a->x.rows, .cols = a->x.cols, .fn = softcap_cols, .a = a, .vk = lm_cpu_vec_of(be)};
  ew_run(be, &j, 0);
  return LM_OK;
}

typedef struct gather_job {
  const lm_gather_args *a;
  const lm_batch *b;
} gather_job;

static void gather_row(void *arg, int64_t i) {
  const gather_job *j = arg;
  memcpy(lm_cpu_row(j->a->out, i), lm_cpu_row(j->a->x, j->b->logit_rows[i]),
         (size_t)j->a->x.cols * sizeof(float));
}

lm_status lm_cpu_gather_logit_rows(lm_backend *be, const lm_gather_args *a) {
  gather_job j = {a, lm_cpu_batch(be)};
  lm_cpu_team_run(lm_cpu_team_of(be), j.b->n_logits, 0, gather_row, &j);
  return LM_OK;
}

static void argmax_row(void *arg, int64_t r) {
  const lm_argmax_args *a = arg;
  const float *x = lm_cpu_row(a->x, r);
  int64_t best = 0;
  for (int64_t i = 1; i < a->x.cols; i++)
    if (x[i] > x[best]) best = i;
  ((int32_t *)a->ids.data)[r * a->ids.ld] = (int32_t)best;
}

lm_status lm_cpu_argmax(lm_backend *be, const lm_argmax_args *a) {
  lm_cpu_team_run(lm_cpu_team_of(be), a->x.rows, 0, argmax_row, (void *)a);
  return LM_OK;
}
