/* cuda_kernels.h — the kernel launchers of the CUDA backend: C parameter structs and
 * extern "C" functions, so the C op layer (cuda_ops.c) never sees a template. Each launcher
 * enqueues on `s` and returns the launch's cudaError_t (cudaGetLastError after the launch).
 * Tensors are 2-D row-major device views; `dt` is an lm_dtype (activations: F32 or BF16).
 * All index math is 64-bit. No launcher keeps state between calls: what a backend chose
 * (lm_cu_switches) reaches them as arguments, so two backends never see each other's choices. */
#ifndef LM_BACKEND_CUDA_KERNELS_H
#define LM_BACKEND_CUDA_KERNELS_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The kernel choices a side-by-side run can switch off (cuda_backend.h: the environment
 * variables behind them); 1 = on, the default. The backend reads them once, when it is created
 * (lm_cuda_ctx.sw), and passes them on: pdl in every lm_cu_stream, the rest to the pick
 * functions below and the op layer. */
typedef struct lm_cu_switches {
  int pdl;          /* programmatic dependent launch (LUMEN_CUDA_PDL=0) */
  int tensor_cores; /* 4-bit decode products on the tensor cores (LUMEN_CUDA_GEMV=cores) */
  int glu_pair;     /* gate/up pairs in one launch (LUMEN_CUDA_UNFUSE=glu_pair) */
  int q_norm; /* the q norm inside the decode attention (LUMEN_CUDA_UNFUSE=q_norm; the op layer) */
} lm_cu_switches;

/* Where and how a launcher enqueues: the stream, and whether its kernels are launched with
 * programmatic dependent launch (lm_cu_switches.pdl; k_common.cuh's launch()). */
typedef struct lm_cu_stream {
  cudaStream_t stream;
  int pdl;
} lm_cu_stream;

/* A device tensor view [rows][cols] with row stride ld (elements). */
typedef struct lm_cu_t {
  void *p;
  int64_t rows, cols, ld;
  int dt; /* lm_dtype */
} lm_cu_t;

/* Scale/bias pair layouts of a quantized device weight (one pair per group). */
enum { LM_CU_SB_BF16 = 0, LM_CU_SB_F16 = 1, LM_CU_SB_F32 = 2 };

/* A device-resident weight: [E][rows][row_bytes] codes or elements (experts compacted), and
 * for affine weights [E][rows][cols/group] scale/bias pairs (u32 bf16x2 or f16x2: scale in the
 * low half; float2 for f32). w = scale*q + bias, as the stored MLX format defines. */
typedef struct lm_cu_w {
  const void *data, *sb;
  int64_t n_experts, rows, cols, row_bytes;
  int bits, group; /* 0, 0: dense */
  int wdt;         /* dense element lm_dtype */
  int sb_kind;     /* LM_CU_SB_* */
} lm_cu_w;

/* The per-(sequence, cache) descriptor begin_step uploads: where the cache lives and how
 * many tokens it held when the step began. window > 0 marks a ring (slot = pos % window).
 * quant != 0 marks an MLX affine kind: k/v hold packed codes [slots][w*bits/8] (w = KV heads ×
 * head_dim) and ks, kb, vs, vb the bf16 scales and biases [slots][w/group]. tq != 0 marks a
 * TurboQuant cache (kv/tq_codec.h): k holds key codes [slots][w*bits/8], v value codes
 * [slots][w*v_bits/8], ks / kb / vs the fp16 key scales, key zeros and value scales
 * [slots][w/32]; its codec tables (device memory, the backend's) are tq_signs [head_dim],
 * tq_cent [2^v_bits] and tq_bnd [2^v_bits - 1]. */
typedef struct lm_cu_kvdesc {
  void *k, *v;
  int64_t n, window, slots;
  void *ks, *kb, *vs, *vb;
  int bits, group, quant;
  int tq, v_bits, head_dim;
  const int8_t *tq_signs;
  const float *tq_cent, *tq_bnd;
} lm_cu_kvdesc;

/* ---- elementwise / row ops (k_rows.cu) ---- */
cudaError_t lm_cu_embed(lm_cu_stream s, lm_cu_t out, const lm_cu_w *w, const int32_t *ids,
                        float scale);
/* residual == NULL: out = norm(x)*w; else residual += norm(x)*w. w may be NULL. */
cudaError_t lm_cu_rmsnorm(lm_cu_stream s, lm_cu_t out, lm_cu_t x, const float *w, float eps,
                          const lm_cu_t *residual);
/* The fused forms (lm_rmsnorm_args): residual += norm(x)*w; residual *= scale when scaled;
 * next (when next.p) = norm(residual)*next_w. One kernel for aligned bf16/f32 rows up to 8192
 * columns, else the separate kernels. */
cudaError_t lm_cu_rmsnorm_res(lm_cu_stream s, lm_cu_t x, const float *w, float eps,
                              lm_cu_t residual, int scaled, float scale, lm_cu_t next,
                              const float *next_w);
/* out = RoPE(norm(x)*w) for rows that are heads of head_dim = x.cols, heads per token; one
 * warp per head for power-of-two head dims 32..512 (aligned), else the separate kernels. */
cudaError_t lm_cu_rmsnorm_rope(lm_cu_stream s, lm_cu_t out, lm_cu_t x, const float *w, float eps,
                               int heads, const float *inv_freq, const int32_t *pos);
cudaError_t lm_cu_rope(lm_cu_stream s, lm_cu_t x, int n_heads, int head_dim, const float *inv_freq,
                       const int32_t *pos);
cudaError_t lm_cu_geglu(lm_cu_stream s, lm_cu_t out, lm_cu_t gate, lm_cu_t up);
/* out = (a + b) * scale, or a * scale when b.p == NULL. */
cudaError_t lm_cu_add(lm_cu_stream s, lm_cu_t out, lm_cu_t a, lm_cu_t b, float scale);
cudaError_t lm_cu_softcap(lm_cu_stream s, lm_cu_t x, float cap);
/* out[i] = x[rows[i]] for i < out.rows. */
cudaError_t lm_cu_gather_rows(lm_cu_stream s, lm_cu_t out, lm_cu_t x, const int32_t *rows);
/* kl[r*kl.ld] = KL(softmax(ref row r) ‖ softmax(x row r)) of f32 rows, in f64 (k_rows.cu). */
cudaError_t lm_cu_logits_kl(lm_cu_stream s, lm_cu_t kl, lm_cu_t x, lm_cu_t ref);
/* ids[r*ids.ld] = argmax of row r (lowest index on ties); ids is int32. */
cudaError_t lm_cu_argmax(lm_cu_stream s, lm_cu_t ids, lm_cu_t x);
/* Writes token t's K/V row into the cache of its sequence (kv[seq[t]*n_caches + cache]). */
cudaError_t lm_cu_kv_append(lm_cu_stream s, lm_cu_t k_new, lm_cu_t v_new, const lm_cu_kvdesc *kv,
                            int n_caches, int cache, const int32_t *pos, const int32_t *seq);

/* ---- attention (k_attention.cu) ---- */
typedef struct lm_cu_attn_p {
  lm_cu_t out, q, k_new, v_new;
  const lm_cu_kvdesc *kv;
  int n_caches, cache;
  const int32_t *pos, *seq,
      *tiles;            /* tiles: [n_tiles][2] (first token, count) within one sequence */
  int n_tiles, max_tile; /* max_tile: largest token count of a tile */
  int n_heads, n_kv_heads, head_dim;
  int64_t window;
  float scale;
  float *part;         /* split partials scratch */
  int64_t part_floats; /* its capacity */
  /* q_inv set: q is the raw projection; the q norm (weight q_w or none, q_eps) and RoPE
   * (inverse frequencies q_inv) are applied to it first. Only the decode kernel does that
   * (lm_cu_pick_attn says whether it takes the step). */
  const float *q_w, *q_inv;
  float q_eps;
} lm_cu_attn_p;
/* Largest head dim the kernels take. */
#define LM_CU_ATTN_MAX_HD 512
/* Which kernel takes an attention step (host logic only, like the GEMV picks below): DECODE,
 * the one-launch split-K kernel (one token per sequence, power-of-two head dims up to 512,
 * 16-byte aligned rows; plain caches), which also applies the q norm when p->q_inv is set;
 * TILED, the general kernel; NORM_FIRST, for a raw q (p->q_inv) the decode kernel does not
 * take or with LUMEN_CUDA_UNFUSE=q_norm (sw->q_norm 0): the caller applies the q norm + RoPE
 * as its own op and picks again for the normed q. quant: a quantized cache is in the batch
 * (lm_cu_kvq_attention's steps, never DECODE). */
typedef enum lm_cu_attn_kind {
  LM_CU_ATTN_TILED = 0,
  LM_CU_ATTN_DECODE = 1,
  LM_CU_ATTN_NORM_FIRST = 2
} lm_cu_attn_kind;
lm_cu_attn_kind lm_cu_pick_attn(const lm_cu_attn_p *p, int quant, int n_sms,
                                const lm_cu_switches *sw);
/* Plain caches, with the kernel `kind` (DECODE or TILED); cudaErrorInvalidValue, launching
 * nothing, when that kernel does not take the step. */
cudaError_t lm_cu_attention(lm_cu_stream s, const lm_cu_attn_p *p, int n_sms, lm_cu_attn_kind kind);

/* ---- matrix products (k_gemv.cu, k_gemm.cu) ---- */
/* A product's LoRA terms (backend.h lm_lora_io, the same memory): output row r (of the
 * launch: row0 + r of the step) adds Σ_j Σ_k B_j[c][k] · t[r][j * rank_stride + k] over its
 * picks, before any epilogue. tab NULL: none. Entries and picks have backend.h's layouts
 * (lm_cu_lora_ent, lm_cu_lora_pick; cuda_matmul.c checks them). */
typedef struct lm_cu_lora_ent {
  const void *a, *b;
  int32_t rank, pad;
} lm_cu_lora_ent;
typedef struct lm_cu_lora_pick {
  int32_t slot;
  float weight;
} lm_cu_lora_pick;
#define LM_CU_LORA_PICKS 8
typedef struct lm_cu_lora {
  const lm_cu_lora_ent *tab;
  const lm_cu_lora_pick *picks;
  float *t;
  int64_t t_ld, row0;
  int rank_stride;
  int wdt; /* dtype of a and b: the activations' */
} lm_cu_lora;

/* t = weight · A x of every row's picks, for n (1..3) modules reading x (k_lora.cu); picks: the
 * most any row has (the grid covers that many). */
cudaError_t lm_cu_lora_shrink(lm_cu_stream s, lm_cu_t x, int n, const lm_cu_lora *mods, int picks);
/* y += the rows' LoRA terms, rounded to y's dtype once (the products' path through cuBLAS). */
cudaError_t lm_cu_lora_expand(lm_cu_stream s, lm_cu_t y, const lm_cu_lora *l);

typedef struct lm_cu_mm_p {
  lm_cu_w w;
  int64_t expert; /* the matrix of a stack (ignored when ids is set) */
  lm_cu_t x, y;   /* y[m][rows] = x[m][cols] · Wᵀ (+ y) */
  int accumulate;
  /* grouped (MoE decode): when ids is set, output row g (g < y.rows) uses expert
   * ids[(g / ids_k) * ids_ld + g % ids_k] and input row g / x_div. */
  const int32_t *ids;
  int64_t ids_ld;
  int ids_k, x_div;
  int grid_cap;   /* most blocks one launch starts (a multiple of the SM count) */
  int smem_optin; /* the device's opt-in shared memory per block */
  /* epilogue (lm_mm_epilogue): 1: y = gelu(other) * y, 2: y = gelu(y) * other, after y is
   * rounded to its dtype (plain launches only); 3: y = gelu(x · Wᵀ) * (x · W2ᵀ), each product
   * rounded to y's dtype first (w2: W's geometry and format; the tensor-core kernel only) */
  int epi;
  lm_cu_t other;
  lm_cu_w w2;
  lm_cu_lora lora, lora2; /* LoRA terms of W's product and of W2's (plain launches only) */
} lm_cu_mm_p;

/* The decode products (k_gemv.cu, k_gemv_tc.cu) and what picks among them. Each pick is host
 * logic only (no CUDA call, no device needed): the op layer (cuda_matmul.c) asks it which
 * kernel runs, and tests/unit/test_cuda_ops.c asks the same function what to expect. */
#define LM_CU_GEMV_MAX_ROWS 8 /* activation rows a plain (ungrouped) decode product takes */
typedef enum lm_cu_gemv_kind {
  LM_CU_GEMV_NONE = 0, /* no decode kernel takes it: the caller dequantizes and uses cuBLAS */
  LM_CU_GEMV_TC,       /* tensor cores (k_gemv_tc.cu): 4-bit affine, bf16 activations */
  LM_CU_GEMV_PACKED,   /* CUDA cores, packed 2/4/8-bit codes with bf16 scale/bias pairs */
  LM_CU_GEMV_DENSE,    /* CUDA cores, f32/bf16/f16 rows a multiple of 16 bytes */
  LM_CU_GEMV_GENERIC,  /* CUDA cores, any layout, element by element */
  LM_CU_GEMV_KINDS
} lm_cu_gemv_kind;
/* The kernel of a single product p (epi 0..2; NONE for epi 3, which lm_cu_pick_pair
 * decides): plain with 1..LM_CU_GEMV_MAX_ROWS activation rows, or grouped (p->ids). */
lm_cu_gemv_kind lm_cu_pick_gemv(const lm_cu_mm_p *p, const lm_cu_switches *sw);
/* Runs product p with the kernel `kind` (from lm_cu_pick_gemv or, for a fused pair,
 * LM_CU_GEMV_TC from lm_cu_pick_pair); cudaErrorInvalidValue, launching nothing, when that
 * kernel does not take the shape. */
cudaError_t lm_cu_gemv(lm_cu_stream s, const lm_cu_mm_p *p, lm_cu_gemv_kind kind);
/* Whether the tensor-core kernel takes p's shape and layout (any epi; the switches are the
 * picks' business, not this). */
int lm_cu_gemv_tc_takes(const lm_cu_mm_p *p);
/* The tensor-core launch behind lm_cu_gemv(.., LM_CU_GEMV_TC). */
cudaError_t lm_cu_gemv_tc(lm_cu_stream s, const lm_cu_mm_p *p);
/* Raises the shared-memory limit of the tensor-core instances that need it (lm_cu_gemv_init
 * calls it). */
cudaError_t lm_cu_gemv_tc_init(int max_smem_optin);

/* A gate/up pair (p->epi 3, p->w2 the up projection): FUSED is one tensor-core launch with
 * the GeGLU applied, SPLIT the two products (each through lm_cu_pick_gemv) and a GeGLU. */
typedef enum lm_cu_pair_kind { LM_CU_PAIR_SPLIT = 0, LM_CU_PAIR_FUSED = 1 } lm_cu_pair_kind;
lm_cu_pair_kind lm_cu_pick_pair(const lm_cu_mm_p *p, const lm_cu_switches *sw);

/* The route of an MoE expert block, from its grouped gate/up pair `pair` (x: the tokens,
 * ids_k: top k, y: the tokens × k pair rows, w2: the up projection): GROUPED_PAIR: grouped
 * GEMVs with gate and up fused (decode); GROUPED: grouped GEMVs, gate and up apart (decode);
 * GATHERED: the pairs sorted by expert and gathered GEMMs (prefill). */
typedef enum lm_cu_moe_kind {
  LM_CU_MOE_GATHERED = 0,
  LM_CU_MOE_GROUPED = 1,
  LM_CU_MOE_GROUPED_PAIR = 2
} lm_cu_moe_kind;
lm_cu_moe_kind lm_cu_pick_moe(const lm_cu_mm_p *pair, const lm_cu_switches *sw);

/* Dequantizes/converts rows [r0, r0+n) of expert e to dst [n][cols] of dtype dt (F32/BF16). */
cudaError_t lm_cu_dequant_rows(lm_cu_stream s, const lm_cu_w *w, int64_t e, int64_t r0, int64_t n,
                               void *dst, int dt);
/* MoE prefill: for every expert e and sorted pair j in [start[e], start[e+1]):
 * y[order[j]] = x[order[j] / x_div] · W_eᵀ (rows). max_rows bounds any expert's count. */
typedef struct lm_cu_gather_mm_p {
  lm_cu_w w;
  lm_cu_t x, y;
  const int32_t *start, *order;
  int x_div;
  int64_t max_rows;
} lm_cu_gather_mm_p;
cudaError_t lm_cu_gemm_gathered(lm_cu_stream s, const lm_cu_gather_mm_p *p);

/* ---- MoE (k_moe.cu) ---- */
cudaError_t lm_cu_moe_route(lm_cu_stream s, lm_cu_t ids, lm_cu_t weights, lm_cu_t logits, int top_k,
                            const float *per_expert_scale);
/* Stable counting sort of the T*K (token, slot) pairs by expert: start[E+1], order[T*K]. */
cudaError_t lm_cu_moe_sort(lm_cu_stream s, lm_cu_t ids, int64_t n_experts, int32_t *start,
                           int32_t *order);
/* out[t] = Σ_k weights[t][k] · y[t*K + k] (y rows in pair order). */
cudaError_t lm_cu_moe_combine(lm_cu_stream s, lm_cu_t out, lm_cu_t weights, lm_cu_t y, int top_k);

/* ---- misc (k_rows.cu) ---- */
/* Streams `bytes` (a multiple of 16) through the SMs and writes one word per block to sink. */
cudaError_t lm_cu_read_kernel(lm_cu_stream s, const void *buf, size_t bytes, unsigned *sink,
                              int blocks);
/* Raises the dynamic shared-memory limit of every kernel instance that needs more than
 * 48 KiB. */
cudaError_t lm_cu_kernels_init(int max_smem_optin);

/* ---- quantized KV caches (k_kvquant.cu) ----
 * For a cache index where any sequence's cache is quantized; each token follows its own
 * descriptor kv[seq[t]*n_caches + cache], so plain caches in the same batch are served too.
 * Stage rows: [T][stage.ld] bytes in kv.h's layout (lm_kv_stage_row_bytes), any alignment. */
/* Quantizes the K/V row of each token whose cache is quantized into its stage row and
 * replaces the row in k_new/v_new by the values the cache will store (rounded to their dtype). */
cudaError_t lm_cu_kvq_stage(lm_cu_stream s, lm_cu_t k_new, lm_cu_t v_new, lm_cu_t stage,
                            const lm_cu_kvdesc *kv, int n_caches, int cache, const int32_t *seq);
/* Writes each token's staged bytes (quantized caches) or K/V row (plain ones) into its slot
 * (pos % window for rings; of a chunk longer than a ring only the last window tokens write). */
cudaError_t lm_cu_kvq_append(lm_cu_stream s, lm_cu_t k_new, lm_cu_t v_new, lm_cu_t stage,
                             const lm_cu_kvdesc *kv, int n_caches, int cache, const int32_t *pos,
                             const int32_t *seq);
/* Quantizes slots [0, held) of the plain cache `from` (elements of lm_dtype dt, rows of w
 * values) into the quantized cache `to` (bits 4/8, group dividing w). */
cudaError_t lm_cu_kvq_convert(lm_cu_stream s, const lm_cu_kvdesc *from, int dt,
                              const lm_cu_kvdesc *to, int64_t w, int64_t held);
/* ---- TurboQuant KV caches (k_tq.cu) ----
 * Encodes the K/V row of each token whose cache is TurboQuant (descriptor tq) into its stage
 * row (kv.h's order: key codes, value codes, key scales, key zeros, value scales) exactly as
 * kv/tq_codec.c does, and replaces the row in k_new/v_new by what a reader of the cache sees:
 * the keys dequantized, the values still rotated (centroid × scale), rounded to their dtype.
 * Appending the staged rows is lm_cu_kvq_append's; attention is lm_cu_kvq_attention's, which
 * un-rotates the output rows of TurboQuant sequences. */
cudaError_t lm_cu_tq_stage(lm_cu_stream s, lm_cu_t k_new, lm_cu_t v_new, lm_cu_t stage,
                           const lm_cu_kvdesc *kv, int n_caches, int cache, const int32_t *seq);

/* lm_cu_attention's semantics, reading quantized caches in place (their head dim is a
 * multiple of the group, as kv.c requires; k/v 16-byte aligned): k_attention.cu. */
cudaError_t lm_cu_kvq_attention(lm_cu_stream s, const lm_cu_attn_p *p, int n_sms);

#ifdef __cplusplus
}
#endif

#endif
