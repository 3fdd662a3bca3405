/* backend.h — the op contract every backend implements (CPU: the readable reference; CUDA:
 * the fast path). The model forward is written once against these ops.
 *
 * Rules (they let a CUDA graph, or later a fused persistent kernel, replay a step):
 *  - Ops never allocate: every buffer comes from a workspace allocated before the step.
 *  - Ops never read backend memory back to the host: routing, positions and sampling stay in
 *    backend memory. Host-visible inputs of a step are uploaded once by begin_step().
 *  - The activation dtype is a backend property (lm_backend.act_dtype); the model code only
 *    passes tensors around.
 *  - Every op takes a typed parameter struct and returns lm_status; an op or cache kind a
 *    backend does not support fails closed with LM_ERR_UNSUPPORTED.
 * All tensors are 2-D row-major views [rows][cols] with a row stride `ld` (in elements). */
#ifndef LM_BACKEND_H
#define LM_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "lumen.h"
#include "tensor/dtype.h"
#include "tensor/weight.h"

#define LM_BACKEND_API_VERSION 1

typedef struct lm_backend lm_backend;
typedef struct lm_kv_cache lm_kv_cache;
typedef struct lm_batch lm_batch;

typedef struct lm_tensor {
  void *data; /* backend memory */
  int64_t rows, cols, ld;
  lm_dtype dtype;
} lm_tensor;

/* A view of columns [c0, c0+n) of every row. */
static inline lm_tensor lm_tensor_cols(lm_tensor t, int64_t c0, int64_t n) {
  t.data = (char *)t.data + c0 * (int64_t)lm_dtype_size(t.dtype);
  t.cols = n;
  return t;
}
/* A view of rows [r0, r0+n). */
static inline lm_tensor lm_tensor_rows(lm_tensor t, int64_t r0, int64_t n) {
  t.data = (char *)t.data + r0 * t.ld * (int64_t)lm_dtype_size(t.dtype);
  t.rows = n;
  return t;
}
/* Reinterprets a contiguous [rows][cols] tensor as [rows*cols/c][c] (per-head views). */
static inline lm_tensor lm_tensor_reshape(lm_tensor t, int64_t c) {
  t.rows = t.rows * t.cols / c;
  t.cols = c;
  t.ld = c;
  return t;
}

/* ---- op parameter structs --------------------------------------------------------------- */

/* out[t] = row ids[t] of `table` (dequantized) * scale. ids are the step's token ids
 * (begin_step) unless `ids` is given (backend memory, int32). */
typedef struct lm_embed_args {
  lm_tensor out;
  const lm_weight *table;
  float scale;
} lm_embed_args;

/* Elementwise epilogues a matmul may fuse. The product is rounded to out's dtype first, so
 * the result equals the matmul followed by the geglu op. */
typedef enum lm_mm_epilogue {
  LM_EPI_NONE = 0,
  LM_EPI_GLU_OTHER, /* out = gelu_tanh(other) * (x · Wᵀ): the MLP's up projection, gate in other */
  LM_EPI_GLU_SELF, /* out = gelu_tanh(x · Wᵀ) * other: the per-layer-input gate */
  LM_EPI_GLU_PAIR, /* out = gelu_tanh(x · Wᵀ) * (x · W2ᵀ): gate and up projections of the MLP in one
                    * op; other is scratch the backend may overwrite with x · Wᵀ. The result equals
                    * other = x · Wᵀ followed by out = x · W2ᵀ with LM_EPI_GLU_OTHER, bit for bit.
                    */
} lm_mm_epilogue;

/* LoRA (model/lora_bank.h): each row of a step adds the low-rank products of up to
 * LM_LORA_PICKS mounted adapters, its own list. A module's table has an entry per mount slot
 * (rank 0: that adapter does not adapt the module); a row's picks name slots (-1 ends the list).
 * Tables, picks and the matrices are backend memory, read when the op runs (a replayed plan
 * sees what is mounted now); a and b are in the activation dtype. */
#define LM_LORA_PICKS 8
typedef struct lm_lora_ent {
  const void *a, *b; /* a [rank][in], b [out][rank] (the adapter's scale folded into b) */
  int32_t rank, pad;
} lm_lora_ent;
typedef struct lm_lora_pick {
  int32_t slot; /* -1: no more picks */
  float weight; /* folded into the module's t */
} lm_lora_pick;
/* One module's low-rank path in a step: t [T][LM_LORA_PICKS * rank_stride] f32 holds pick j's
 * weight · A x at column j * rank_stride (lm_lora_shrink_args), and the module's product adds
 * Σ_j B_j t_j to its rows before any epilogue (lm_matmul_args.lora). */
typedef struct lm_lora_io {
  const lm_lora_ent *tab;    /* [mount slots] */
  const lm_lora_pick *picks; /* [T][LM_LORA_PICKS], the step's rows */
  lm_tensor t;
  int rank_stride;
} lm_lora_io;

/* t = weight · A x of every row's picks for n (1..3) modules that read the same x. */
typedef struct lm_lora_shrink_args {
  lm_tensor x;
  int n;
  lm_lora_io io[3];
} lm_lora_shrink_args;

/* out = x · Wᵀ (+ out if accumulate), plus the rows' LoRA terms (lora), then the epilogue.
 * `expert` selects a matrix of a stacked weight. With an epilogue (never with accumulate),
 * `other` is [rows][out.cols] and must not alias out; w2 (LM_EPI_GLU_PAIR only) has W's shape
 * and format, and lora2 is its LoRA path. */
typedef struct lm_matmul_args {
  lm_tensor out, x;
  const lm_weight *w, *w2;
  int64_t expert;
  int accumulate;
  lm_mm_epilogue epilogue;
  lm_tensor other;
  const lm_lora_io *lora, *lora2; /* NULL: none */
} lm_matmul_args;

/* out = RMSNorm(x) * w (w NULL: no learned scale), per row over cols; in place allowed.
 * With `residual` set: residual += that result (out ignored): the sandwich-norm + residual add;
 * then, fused (each step rounds as the separate ops would):
 *   `scaled`: residual *= scale (the layer scalar);
 *   next_out.data set: next_out = RMSNorm(residual) * next_w (the next block's input norm).
 * Without a residual, `rope` set: the rows are heads (rope_heads per token) and RoPE is applied
 * to them after the norm, as lm_rope_args would (the q/k norms). */
typedef struct lm_rmsnorm_args {
  lm_tensor out, x;
  const lm_weight *w; /* dense f32 vector [cols], or NULL */
  float eps;
  lm_tensor *residual;
  int scaled;
  float scale;
  lm_tensor next_out;
  const lm_weight *next_w;
  const lm_weight *rope; /* dense f32 inverse frequencies [cols/2] */
  int rope_heads;
} lm_rmsnorm_args;

/* In-place rotary embedding of x viewed as [T][n_heads][head_dim] (NeoX pairing i, i+d/2),
 * angle = f32(pos[t]) * inv_freq[i] with the step's positions (begin_step). */
typedef struct lm_rope_args {
  lm_tensor x; /* [T][n_heads*head_dim] */
  int n_heads, head_dim;
  const lm_weight *inv_freq; /* dense f32 [head_dim/2] */
} lm_rope_args;

/* out = gelu_tanh(gate) * up (elementwise; up may be a strided view). */
typedef struct lm_geglu_args {
  lm_tensor out, gate, up;
} lm_geglu_args;

/* out = (a + b) * scale, or out = a * scale when b.data is NULL. In place allowed. */
typedef struct lm_add_args {
  lm_tensor out, a, b;
  float scale;
} lm_add_args;

/* x = tanh(x / cap) * cap. */
typedef struct lm_softcap_args {
  lm_tensor x;
  float cap;
} lm_softcap_args;

/* out[i] = x[rows[i]] for the step's logit rows (begin_step). */
typedef struct lm_gather_args {
  lm_tensor out, x;
} lm_gather_args;

/* Attention of the step's queries over one cache (read in place) plus the chunk being
 * written (k_new/v_new, not yet in the cache). Scores are raw dot products (Gemma 4:
 * scaling 1.0), causal, and limited to `window` keys (0: unbounded) including the query. */
typedef struct lm_attn_args {
  lm_tensor out;          /* [T][n_heads*head_dim] */
  lm_tensor q;            /* [T][n_heads*head_dim] */
  lm_tensor k_new, v_new; /* [T][n_kv_heads*head_dim]: this step's keys/values for the cache */
  int cache;              /* index of the cache in each sequence's set */
  int n_heads, n_kv_heads, head_dim;
  int64_t window;
  float scale;
  /* q_rope set: q is the raw projection, and the op first applies the q norm, RMSNorm(q) *
   * q_norm (q_norm NULL: no scale) with q_eps, and RoPE (q_rope: inverse frequencies) to each
   * head, as lm_rmsnorm_args with .rope rounds them; q may be left overwritten with that. */
  const lm_weight *q_norm, *q_rope;
  float q_eps;
} lm_attn_args;

/* Prepares the chunk's K/V for a quantized cache before anyone attends over it: quantizes
 * each token's row into `stage` (codes, bf16 scales and biases of K, then of V) and replaces
 * k_new/v_new by what the cache will store, so the chunk's own queries read stored values.
 * For a turboquant cache, v_new becomes the values in the rotated domain (centroid * scale),
 * the domain its attention sums values in before un-rotating the output.
 * A no-op for tokens whose cache is plain. stage: bytes [T][lm_kv_stage_row_bytes]. */
typedef struct lm_kv_stage_args {
  lm_tensor k_new, v_new, stage;
  int cache;
} lm_kv_stage_args;

/* Converts the held rows of a plain cache into `to` (a quantized cache of the same
 * geometry and slot count, freshly allocated): quantizes every held slot's K and V rows.
 * Outside steps (it runs when a cache reaches --kv-quant-start tokens). */
typedef struct lm_kv_convert_args {
  const lm_kv_cache *from;
  lm_kv_cache *to;
} lm_kv_convert_args;

/* Appends the chunk's K/V (plain caches) or its staged codes (quantized caches) to the cache
 * `cache` of each sequence of the step. */
typedef struct lm_kv_append_args {
  lm_tensor k_new, v_new, stage;
  int cache;
} lm_kv_append_args;

/* MoE routing: probs = softmax(logits) over all experts (f32); the top_k are chosen,
 * renormalized to sum 1 and multiplied by per_expert_scale[e]. ids int32 [T][k], weights f32. */
typedef struct lm_moe_route_args {
  lm_tensor ids, weights, logits;
  int top_k;
  const lm_weight *per_expert_scale; /* dense f32 [E] */
} lm_moe_route_args;

/* out = Σ_k weights[t,k] * down_e(gelu_tanh(gate_e(x)) * up_e(x)), e = ids[t,k]. */
typedef struct lm_moe_experts_args {
  lm_tensor out, x, ids, weights;
  const lm_weight *gate, *up, *down; /* stacked [E] */
  lm_tensor scratch;                 /* f32 workspace, at least [T*top_k][2*moe_dim + 2*hidden] */
  lm_tensor iscratch;                /* int32 workspace, at least [1][T*top_k + E + 1] */
} lm_moe_experts_args;

/* ids[i] = argmax over row i of x (lowest index on ties). ids int32 [rows][1]. */
typedef struct lm_argmax_args {
  lm_tensor ids, x;
} lm_argmax_args;

/* kl[i] = KL(softmax(ref row i) ‖ softmax(x row i)) over f32 logit rows [rows][V] (each row's
 * max taken out, sums and logarithms in f64), stored as f32 [rows][1]. Outside steps. */
typedef struct lm_logits_kl_args {
  lm_tensor kl, x, ref;
} lm_logits_kl_args;

/* One step's op sequence as the forward issues it. A backend's run_step may call issue(), or
 * replay a plan (e.g. a CUDA graph) it captured from an earlier issue() with the same key:
 * owner, flags, the batch's shape and every cache's signature. So issue() must enqueue the
 * same ops for the same key and have no host side effects besides its ops' own. */
typedef struct lm_step_fn {
  lm_status (*issue)(void *arg);
  void *arg;
  const void *owner;     /* the issuer (model + workspace); its plans die with release_plans */
  const lm_batch *batch; /* the step's batch, as given to begin_step */
  int flags;             /* issuer bits that change the op sequence (part of the key) */
  uint64_t variant;      /* what else selects the ops and their weights (the forward's adapter
                          * set: a new value for every set attached); part of the key */
} lm_step_fn;

/* ---- the backend -------------------------------------------------------------------------- */

typedef struct lm_backend_ops {
  int api_version; /* LM_BACKEND_API_VERSION */
  const char *name;
  void (*destroy)(lm_backend *be);
  /* memory (outside steps) */
  lm_status (*alloc)(lm_backend *be, size_t bytes, void **ptr);
  void (*free)(lm_backend *be, void *ptr);
  lm_status (*upload)(lm_backend *be, void *dst, const void *src, size_t bytes);
  lm_status (*download)(lm_backend *be, void *dst, const void *src, size_t bytes);
  lm_status (*copy)(lm_backend *be, void *dst, const void *src,
                    size_t bytes); /* within the backend */
  /* makes a weight usable by this backend (copy, repack); sets w->backend; (optional) */
  lm_status (*prepare_weight)(lm_backend *be, lm_weight *w);
  /* w's payload was exchanged (lm_exchange_weight): replace this backend's copy, so that
   * every later step reads the new payload; on an error the old copy stays. (optional: NULL
   * for a backend without prepare_weight, which reads weights in place) */
  lm_status (*refresh_weight)(lm_backend *be, lm_weight *w);
  /* whether attention/append can read/write a cache of this signature */
  int (*supports_cache)(lm_backend *be, const char *signature);
  /* uploads the host-side inputs of a step (ids, positions, sequences, logit rows) */
  lm_status (*begin_step)(lm_backend *be, const lm_batch *b);
  lm_status (*end_step)(lm_backend *be); /* waits for the step's work */
  /* ops */
  lm_status (*embed)(lm_backend *be, const lm_embed_args *a);
  lm_status (*matmul)(lm_backend *be, const lm_matmul_args *a);
  lm_status (*rmsnorm)(lm_backend *be, const lm_rmsnorm_args *a);
  lm_status (*rope)(lm_backend *be, const lm_rope_args *a);
  lm_status (*geglu)(lm_backend *be, const lm_geglu_args *a);
  lm_status (*add)(lm_backend *be, const lm_add_args *a);
  lm_status (*softcap)(lm_backend *be, const lm_softcap_args *a);
  lm_status (*gather_logit_rows)(lm_backend *be, const lm_gather_args *a);
  lm_status (*attention)(lm_backend *be, const lm_attn_args *a);
  /* (optional) both NULL for a backend whose supports_cache accepts no quantized kind */
  lm_status (*kv_stage)(lm_backend *be, const lm_kv_stage_args *a);
  lm_status (*kv_convert)(lm_backend *be, const lm_kv_convert_args *a);
  lm_status (*kv_append)(lm_backend *be, const lm_kv_append_args *a);
  lm_status (*moe_route)(lm_backend *be, const lm_moe_route_args *a);
  lm_status (*moe_experts)(lm_backend *be, const lm_moe_experts_args *a);
  lm_status (*argmax)(lm_backend *be, const lm_argmax_args *a);
  /* (optional) where the logits stay in device memory, so a measurement against a reference
   * (lumen quantize's sweep) brings back a float per row instead of the rows; NULL: the
   * caller downloads the rows and compares them on the host */
  lm_status (*logits_kl)(lm_backend *be, const lm_logits_kl_args *a);
  /* (optional: NULL for a backend without LoRA; matmul then refuses lora) */
  lm_status (*lora_shrink)(lm_backend *be, const lm_lora_shrink_args *a);
  /* steps (optional, between begin_step and end_step): NULL means the forward calls
   * st->issue itself. release_plans drops every plan of `owner` before it is freed. */
  lm_status (*run_step)(lm_backend *be, const lm_step_fn *st);
  void (*release_plans)(lm_backend *be, const void *owner);
} lm_backend_ops;

/* F32: the parity path. FAST: the speed path (CPU: int8 activations in quantized matmuls;
 * CUDA: bf16 activations). BF16 (CPU only): f32 math with every op's output rounded to bf16
 * where the CUDA fast path stores bf16 — that path's numerics, reproducible without a GPU. */
typedef enum lm_precision {
  LM_PRECISION_F32 = 0,
  LM_PRECISION_FAST = 1,
  LM_PRECISION_BF16 = 2
} lm_precision;

struct lm_backend {
  const lm_backend_ops *ops;
  lm_dtype act_dtype;     /* activation dtype of this backend */
  lm_precision precision; /* F32: the parity path */
  int threads;
  /* Steps of up to this many tokens compute every row as a step of that token alone would, bit
   * for bit (what verifying speculative drafts needs); 1: no such promise. */
  int exact_rows;
  void *ctx; /* the backend's private state */
};

lm_status lm_backend_cpu_create(lm_precision prec, int threads, lm_backend **out);
void lm_backend_destroy(lm_backend *be);

/* What the q norm of lm_attn_args needs, whichever kernel applies it: q rows of n_heads
 * heads, contiguous (it works on per-head rows). */
static inline lm_status lm_attention_q_norm_check(const lm_attn_args *a) {
  if (a->q.ld != a->q.cols || a->head_dim <= 0 || a->q.cols != (int64_t)a->n_heads * a->head_dim)
    return LM_ERRF(LM_ERR_INVALID, "attention: the q norm needs contiguous q rows of %d heads x %d",
                   a->n_heads, a->head_dim);
  return LM_OK;
}

/* The q norm of lm_attn_args as the op it is defined by (the backend's rmsnorm with RoPE, in
 * place on q), then `attn` without it: what a backend runs where it has no fused kernel. */
static inline lm_status lm_attention_q_norm(lm_backend *be, const lm_attn_args *a,
                                            lm_status (*attn)(lm_backend *, const lm_attn_args *)) {
  LM_TRY(lm_attention_q_norm_check(a));
  lm_tensor qh = lm_tensor_reshape(a->q, a->head_dim);
  LM_TRY(be->ops->rmsnorm(be, &(lm_rmsnorm_args){.out = qh,
                                                 .x = qh,
                                                 .w = a->q_norm,
                                                 .eps = a->q_eps,
                                                 .rope = a->q_rope,
                                                 .rope_heads = a->n_heads}));
  lm_attn_args b = *a;
  b.q_norm = b.q_rope = NULL;
  return attn(be, &b);
}

/* LM_EPI_GLU_PAIR as the two products it is defined by (other = x · Wᵀ, then out = x · W2ᵀ
 * with LM_EPI_GLU_OTHER), through `mm`: what a backend runs where it has no fused kernel. */
static inline lm_status lm_matmul_glu_pair(lm_backend *be, const lm_matmul_args *a,
                                           lm_status (*mm)(lm_backend *, const lm_matmul_args *)) {
  lm_matmul_args g = *a, u = *a;
  g.out = lm_tensor_rows(a->other, 0, a->out.rows);
  g.w2 = NULL;
  g.epilogue = LM_EPI_NONE;
  g.other = (lm_tensor){0};
  g.lora2 = NULL;
  lm_status s = mm(be, &g);
  if (s != LM_OK) return s;
  u.w = a->w2;
  u.w2 = NULL;
  u.epilogue = LM_EPI_GLU_OTHER;
  u.lora = a->lora2;
  u.lora2 = NULL;
  return mm(be, &u);
}

/* A product with a LoRA path as the ops it is defined by: the plain product through `mm`, the
 * LoRA terms added by `expand` (out += Σ_j B_j t_j per row), then the epilogue through `geglu`
 * (a pair: each half so, as lm_matmul_glu_pair). What a backend runs where its kernels do not
 * take the LoRA terms. */
static inline lm_status lm_matmul_lora_split(lm_backend *be, const lm_matmul_args *a,
                                             lm_status (*mm)(lm_backend *, const lm_matmul_args *),
                                             lm_status (*expand)(lm_backend *, lm_tensor out,
                                                                 const lm_lora_io *io)) {
  if (a->epilogue == LM_EPI_GLU_PAIR) return lm_matmul_glu_pair(be, a, be->ops->matmul);
  lm_matmul_args p = *a;
  p.epilogue = LM_EPI_NONE;
  p.other = (lm_tensor){0};
  p.lora = p.lora2 = NULL;
  lm_status s = mm(be, &p);
  if (s == LM_OK && a->lora) s = expand(be, a->out, a->lora);
  if (s != LM_OK || a->epilogue == LM_EPI_NONE) return s;
  lm_geglu_args g = {.out = a->out, .gate = a->other, .up = a->out};
  if (a->epilogue == LM_EPI_GLU_SELF) g.gate = a->out, g.up = a->other;
  return be->ops->geglu(be, &g);
}

#endif
