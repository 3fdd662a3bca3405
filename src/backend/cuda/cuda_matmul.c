/* cuda_matmul.c — matrix products of the CUDA backend. Decode (≤ 8 activation rows) runs the
 * packed GEMV kernels straight off the device weights; prefill dequantizes row blocks of the
 * weight to the activation dtype (bf16 weights in a bf16 run are used in place) and multiplies
 * them with cuBLAS (f32 accumulation; tensor cores for bf16, plain FP32 SGEMM for the parity
 * path). MoE experts run as grouped GEMVs in decode and as a gathered GEMM over the device-side
 * routing in prefill, so the routing never crosses to the host. */
#include <stddef.h>

#include "backend/cuda/cuda_internal.h"
#include "base/status.h"

_Static_assert(LM_EPI_GLU_OTHER == 1 && LM_EPI_GLU_SELF == 2 && LM_EPI_GLU_PAIR == 3,
               "lm_cu_mm_p.epi codes");

_Static_assert(sizeof(lm_cu_lora_ent) == sizeof(lm_lora_ent) &&
                   offsetof(lm_cu_lora_ent, rank) == offsetof(lm_lora_ent, rank) &&
                   sizeof(lm_cu_lora_pick) == sizeof(lm_lora_pick) &&
                   offsetof(lm_cu_lora_pick, weight) == offsetof(lm_lora_pick, weight) &&
                   LM_CU_LORA_PICKS == LM_LORA_PICKS,
               "the device's LoRA tables have backend.h's layout");

static size_t dt_size(int dt) { return dt == LM_DT_F32 ? 4 : 2; }

/* A product's LoRA path as the kernels take it (tab NULL: none). */
static lm_cu_lora cu_lora(const lm_backend *be, const lm_lora_io *io) {
  if (!io) return (lm_cu_lora){0};
  return (lm_cu_lora){.tab = (const lm_cu_lora_ent *)io->tab,
                      .picks = (const lm_cu_lora_pick *)io->picks,
                      .t = io->t.data,
                      .t_ld = io->t.ld,
                      .rank_stride = io->rank_stride,
                      .wdt = (int)be->act_dtype};
}

lm_status lm_cuda_lora_shrink(lm_backend *be, const lm_lora_shrink_args *a) {
  if (a->n < 1 || a->n > 3 || a->x.dtype != be->act_dtype)
    return LM_ERRF(LM_ERR_INVALID, "CUDA lora_shrink: %d modules of %s rows", a->n,
                   lm_dtype_name(a->x.dtype));
  lm_cu_lora m[3];
  for (int i = 0; i < a->n; i++)
    m[i] = cu_lora(be, &a->io[i]);
  int picks = (int)(a->io[0].t.cols / (a->io[0].rank_stride ? a->io[0].rank_stride : 1));
  LM_CU(lm_cu_lora_shrink(lm_cuda_of(be)->ks, lm_cuda_view(a->x), a->n, m, picks));
  return LM_OK;
}

static lm_cu_mm_p gemv_params(const lm_cuda_ctx *c, const lm_cuda_weight *h, int64_t expert,
                              lm_tensor x, lm_tensor y, int acc) {
  return (lm_cu_mm_p){.w = h->w,
                      .expert = expert,
                      .x = lm_cuda_view(x),
                      .y = lm_cuda_view(y),
                      .accumulate = acc,
                      .grid_cap = 4 * c->n_sms,
                      .smem_optin = c->smem_optin};
}

/* y = x · W_eᵀ (+ y) through cuBLAS, over row blocks of W that fit the scratch. */
static lm_status gemm_blas(lm_cuda_ctx *c, const lm_cuda_weight *h, int64_t e, lm_tensor x,
                           lm_tensor y, int acc) {
  const lm_cu_w *w = &h->w;
  int act = (int)x.dtype;
  cudaDataType tx = act == LM_DT_F32 ? CUDA_R_32F : CUDA_R_16BF,
               ty = y.dtype == LM_DT_F32 ? CUDA_R_32F : CUDA_R_16BF;
  if (act == LM_DT_F32 && ty != CUDA_R_32F)
    return LM_ERRF(LM_ERR_UNSUPPORTED, "CUDA matmul: f32 activations into a bf16 output");
  int direct = !w->bits && w->wdt == act;
  int64_t chunk =
      direct ? w->rows : (int64_t)(c->mm_scratch_bytes / ((size_t)w->cols * dt_size(act)));
  if (chunk > 65535 && !direct) chunk = 65535;
  if (chunk < 1)
    return LM_ERRF(LM_ERR_UNSUPPORTED, "CUDA matmul: a row of %lld columns exceeds the scratch",
                   (long long)w->cols);
  const float one = 1.0f, beta = acc ? 1.0f : 0.0f;
  for (int64_t r0 = 0; r0 < w->rows; r0 += chunk) {
    int64_t nr = w->rows - r0 < chunk ? w->rows - r0 : chunk;
    const void *B = (const char *)w->data + (e * w->rows + r0) * w->row_bytes;
    if (!direct) {
      LM_CU(lm_cu_dequant_rows(c->ks, w, e, r0, nr, c->mm_scratch, act));
      B = c->mm_scratch;
    }
    /* Row-major y[m][n] = x[m][k] · B[n][k]ᵀ is column-major yᵀ = op(B)ᵀ·xᵀ: B transposed. */
    LM_CUBLAS(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)nr, (int)x.rows, (int)w->cols,
                           &one, B, tx, (int)w->cols, x.data, tx, (int)x.ld, &beta,
                           (char *)y.data + (size_t)r0 * dt_size(y.dtype), ty, (int)y.ld,
                           CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  return LM_OK;
}

/* Gate and up of the MLP: one tensor-core launch where lm_cu_pick_pair fuses the pair
 * (decode), else the two products the epilogue is defined by. */
static lm_status glu_pair(lm_backend *be, const lm_matmul_args *a, const lm_cuda_weight *h) {
  lm_cuda_ctx *c = lm_cuda_of(be);
  const lm_cuda_weight *h2;
  LM_TRY(lm_cuda_weight_of(a->w2, "matmul", &h2));
  lm_cu_mm_p p = gemv_params(c, h, a->expert, a->x, a->out, 0);
  p.epi = (int)LM_EPI_GLU_PAIR;
  p.w2 = h2->w;
  p.lora = cu_lora(be, a->lora), p.lora2 = cu_lora(be, a->lora2);
  if (lm_cu_pick_pair(&p, &c->sw) == LM_CU_PAIR_SPLIT)
    return lm_matmul_glu_pair(be, a, lm_cuda_matmul);
  cudaError_t e = lm_cu_gemv(c->ks, &p, LM_CU_GEMV_TC);
  return e == cudaSuccess ? LM_OK : lm_cuda_fail(e, "gemv (gate/up pair)", __FILE__, __LINE__);
}

lm_status lm_cuda_matmul(lm_backend *be, const lm_matmul_args *a) {
  lm_cuda_ctx *c = lm_cuda_of(be);
  const lm_cuda_weight *h;
  LM_TRY(lm_cuda_weight_of(a->w, "matmul", &h));
  int64_t ne = h->w.n_experts ? h->w.n_experts : 1;
  if (a->x.cols != h->w.cols || a->out.cols != h->w.rows || a->out.rows != a->x.rows ||
      a->expert < 0 || a->expert >= ne)
    return LM_ERRF(
        LM_ERR_INVALID,
        "CUDA matmul: [%lld][%lld] x %s [%lld][%lld] (expert %lld of %lld) into [%lld][%lld]",
        (long long)a->x.rows, (long long)a->x.cols, a->w->name, (long long)h->w.rows,
        (long long)h->w.cols, (long long)a->expert, (long long)ne, (long long)a->out.rows,
        (long long)a->out.cols);
  if (a->x.dtype != be->act_dtype || (a->out.dtype != be->act_dtype && a->out.dtype != LM_DT_F32))
    return LM_ERRF(LM_ERR_INVALID, "CUDA matmul: %s into %s with %s activations",
                   lm_dtype_name(a->x.dtype), lm_dtype_name(a->out.dtype),
                   lm_dtype_name(be->act_dtype));
  if (a->epilogue &&
      (a->accumulate || a->other.rows < a->out.rows || a->other.cols != a->out.cols ||
       a->other.dtype != a->out.dtype || a->other.data == a->out.data))
    return LM_ERRF(LM_ERR_INVALID,
                   "CUDA matmul: an epilogue needs `other` of the output's shape and dtype, apart "
                   "from it, and no accumulate");
  if ((a->epilogue == LM_EPI_GLU_PAIR) != (a->w2 != NULL))
    return LM_ERRF(
        LM_ERR_INVALID,
        "CUDA matmul: a second weight goes with the GLU-pair epilogue, and only with it");
  if (a->x.rows <= 0) return LM_OK;
  if (a->epilogue == LM_EPI_GLU_PAIR) return glu_pair(be, a, h);
  if (a->lora2) return LM_ERRF(LM_ERR_INVALID, "CUDA matmul: lora2 without a GLU pair");
  lm_cu_mm_p p = gemv_params(c, h, a->expert, a->x, a->out, a->accumulate);
  p.epi = (int)a->epilogue;
  p.other = lm_cuda_view(a->other);
  p.lora = cu_lora(be, a->lora);
  const lm_cu_gemv_kind kind = lm_cu_pick_gemv(&p, &c->sw);
  if (kind != LM_CU_GEMV_NONE) {
    cudaError_t e = lm_cu_gemv(c->ks, &p, kind);
    return e == cudaSuccess ? LM_OK : lm_cuda_fail(e, "gemv", __FILE__, __LINE__);
  }
  LM_TRY(gemm_blas(c, h, a->expert, a->x, a->out, a->accumulate));
  if (a->lora) LM_CU(lm_cu_lora_expand(c->ks, lm_cuda_view(a->out), &p.lora));
  if (!a->epilogue) return LM_OK;
  lm_cu_t y = lm_cuda_view(a->out), o = lm_cuda_view(a->other);
  o.rows = y.rows;
  LM_CU(a->epilogue == LM_EPI_GLU_OTHER ? lm_cu_geglu(c->ks, y, o, y)
                                        : lm_cu_geglu(c->ks, y, y, o));
  return LM_OK;
}

/* ---- MoE experts ------------------------------------------------------------------------------
 */

typedef struct moe_bufs {
  lm_tensor g, u, y; /* [P][I], [P][I], [P][H] column blocks of the scratch, rows in pair order */
} moe_bufs;

static lm_status moe_check(lm_backend *be, const lm_moe_experts_args *a, const lm_cuda_weight *hg,
                           const lm_cuda_weight *hu, const lm_cuda_weight *hd, moe_bufs *b) {
  int64_t T = a->x.rows, K = a->ids.cols, H = a->x.cols, I = hg->w.rows, E = hg->w.n_experts,
          P = T * K;
  if (!E || hu->w.n_experts != E || hd->w.n_experts != E || hg->w.cols != H || hu->w.rows != I ||
      hu->w.cols != H || hd->w.rows != H || hd->w.cols != I || a->out.cols != H ||
      a->out.rows != T || a->ids.rows < T || a->weights.rows < T || a->weights.cols < K ||
      a->ids.dtype != LM_DT_I32 || a->weights.dtype != LM_DT_F32)
    return LM_ERRF(LM_ERR_INVALID,
                   "CUDA moe_experts: shapes do not match %lld tokens x top %lld of %lld experts",
                   (long long)T, (long long)K, (long long)E);
  if (a->scratch.rows < P || a->scratch.cols < 2 * I + H || a->scratch.dtype != be->act_dtype ||
      a->iscratch.dtype != LM_DT_I32 || a->iscratch.cols < P + E + 1 ||
      a->x.dtype != be->act_dtype || a->out.dtype != be->act_dtype)
    return LM_ERRF(LM_ERR_INVALID, "CUDA moe_experts: workspace too small or of the wrong dtype");
  lm_tensor s = lm_tensor_rows(a->scratch, 0, P);
  b->g = lm_tensor_cols(s, 0, I);
  b->u = lm_tensor_cols(s, I, I);
  b->y = lm_tensor_cols(s, 2 * I, H);
  return LM_OK;
}

/* The grouped gate/up pair of a decode step: every (token, slot) pair is one group. */
static lm_cu_mm_p moe_pair_params(const lm_cuda_ctx *c, const lm_moe_experts_args *a,
                                  const lm_cuda_weight *hg, const lm_cuda_weight *hu,
                                  const moe_bufs *b) {
  lm_cu_mm_p p = gemv_params(c, hg, 0, a->x, b->g, 0);
  p.ids = a->ids.data;
  p.ids_ld = a->ids.ld;
  p.ids_k = (int)a->ids.cols;
  p.x_div = p.ids_k;
  p.epi = (int)LM_EPI_GLU_PAIR;
  p.w2 = hu->w;
  return p;
}

/* One grouped GEMV, with the kernel lm_cu_pick_gemv gives it. No GEMM takes the grouped form,
 * so a product no decode kernel takes is an error (not a fallback). */
static lm_status grouped_gemv(lm_cuda_ctx *c, const lm_cu_mm_p *p, const char *what) {
  const lm_cu_gemv_kind kind = lm_cu_pick_gemv(p, &c->sw);
  if (kind == LM_CU_GEMV_NONE)
    return LM_ERRF(LM_ERR_UNSUPPORTED,
                   "CUDA moe_experts: no grouped GEMV takes the %s projection (%lld x %lld, "
                   "%d-bit, %lld pairs)",
                   what, (long long)p->w.rows, (long long)p->w.cols, p->w.bits,
                   (long long)p->y.rows);
  cudaError_t e = lm_cu_gemv(c->ks, p, kind);
  return e == cudaSuccess ? LM_OK
                          : lm_cuda_fail(e, "moe_experts (grouped gemv)", __FILE__, __LINE__);
}

/* Decode: gate, up and the GeGLU in one launch (GROUPED_PAIR) or three (GROUPED), then down. */
static lm_status moe_decode(lm_cuda_ctx *c, lm_cu_moe_kind route, lm_cu_mm_p pair,
                            const lm_cuda_weight *hd, const moe_bufs *b) {
  lm_cu_mm_p p = pair;
  p.epi = 0;
  p.w2 = (lm_cu_w){0};
  if (route == LM_CU_MOE_GROUPED_PAIR) {
    cudaError_t e = lm_cu_gemv(c->ks, &pair, LM_CU_GEMV_TC);
    if (e != cudaSuccess)
      return lm_cuda_fail(e, "moe_experts (grouped gate/up pair)", __FILE__, __LINE__);
  } else {
    LM_TRY(grouped_gemv(c, &p, "gate"));
    p.w = pair.w2;
    p.y = lm_cuda_view(b->u);
    LM_TRY(grouped_gemv(c, &p, "up"));
    LM_CU(lm_cu_geglu(c->ks, lm_cuda_view(b->g), lm_cuda_view(b->g), lm_cuda_view(b->u)));
  }
  p.w = hd->w;
  p.x = lm_cuda_view(b->g);
  p.y = lm_cuda_view(b->y);
  p.x_div = 1;
  return grouped_gemv(c, &p, "down");
}

/* Prefill: sort the pairs by expert on the device, then one gathered GEMM per projection. */
static lm_status moe_prefill(lm_cuda_ctx *c, const lm_moe_experts_args *a, const lm_cuda_weight *hg,
                             const lm_cuda_weight *hu, const lm_cuda_weight *hd,
                             const moe_bufs *b) {
  int64_t E = hg->w.n_experts, K = a->ids.cols;
  int32_t *start = a->iscratch.data, *order = start + E + 1;
  lm_cu_t ids = lm_cuda_view(a->ids);
  ids.rows = a->x.rows;
  ids.cols = K;
  LM_CU(lm_cu_moe_sort(c->ks, ids, E, start, order));
  lm_cu_gather_mm_p p = {.w = hg->w,
                         .x = lm_cuda_view(a->x),
                         .y = lm_cuda_view(b->g),
                         .start = start,
                         .order = order,
                         .x_div = (int)K,
                         .max_rows = a->x.rows};
  LM_CU(lm_cu_gemm_gathered(c->ks, &p));
  p.w = hu->w;
  p.y = lm_cuda_view(b->u);
  LM_CU(lm_cu_gemm_gathered(c->ks, &p));
  LM_CU(lm_cu_geglu(c->ks, lm_cuda_view(b->g), lm_cuda_view(b->g), lm_cuda_view(b->u)));
  p.w = hd->w;
  p.x = lm_cuda_view(b->g);
  p.y = lm_cuda_view(b->y);
  p.x_div = 1;
  LM_CU(lm_cu_gemm_gathered(c->ks, &p));
  return LM_OK;
}

lm_status lm_cuda_moe_experts(lm_backend *be, const lm_moe_experts_args *a) {
  lm_cuda_ctx *c = lm_cuda_of(be);
  const lm_cuda_weight *hg, *hu, *hd;
  moe_bufs b;
  LM_TRY(lm_cuda_weight_of(a->gate, "moe_experts", &hg));
  LM_TRY(lm_cuda_weight_of(a->up, "moe_experts", &hu));
  LM_TRY(lm_cuda_weight_of(a->down, "moe_experts", &hd));
  LM_TRY(moe_check(be, a, hg, hu, hd, &b));
  if (a->x.rows <= 0) return LM_OK;
  const lm_cu_mm_p pair = moe_pair_params(c, a, hg, hu, &b);
  const lm_cu_moe_kind route = lm_cu_pick_moe(&pair, &c->sw);
  if (route == LM_CU_MOE_GATHERED)
    LM_TRY(moe_prefill(c, a, hg, hu, hd, &b));
  else
    LM_TRY(moe_decode(c, route, pair, hd, &b));
  lm_cu_t w = lm_cuda_view(a->weights);
  w.rows = a->x.rows;
  LM_CU(lm_cu_moe_combine(c->ks, lm_cuda_view(a->out), w, lm_cuda_view(b.y), (int)a->ids.cols));
  return LM_OK;
}
