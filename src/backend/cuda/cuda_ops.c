/* cuda_ops.c — the row-wise ops, attention, the KV append and the quantized caches' staging
 * and conversion of the CUDA backend: argument checks (fail closed, naming the op and the
 * shapes), then one kernel launch each. Positions, token ids and cache descriptors are read
 * from the step's device buffers (begin_step), so a captured graph of these launches replays
 * correctly for later tokens. */
#include <string.h>

#include "backend/cuda/cuda_internal.h"
#include "base/status.h"
#include "kv/kv.h"

lm_cu_t lm_cuda_view(lm_tensor t) { return (lm_cu_t){t.data, t.rows, t.cols, t.ld, (int)t.dtype}; }

static int act_ok(const lm_backend *be, lm_tensor t) { return t.dtype == be->act_dtype; }

static lm_status bad_dtype(const char *op, const char *name, lm_tensor t) {
  return LM_ERRF(LM_ERR_INVALID, "CUDA %s: %s has dtype %s", op, name, lm_dtype_name(t.dtype));
}

static lm_status launched(cudaError_t e, const char *op, const char *file, int line) {
  return e == cudaSuccess ? LM_OK : lm_cuda_fail(e, op, file, line);
}
#define LAUNCH(call, op) launched((call), op, __FILE__, __LINE__)

static lm_status vector_of(const lm_weight *w, int64_t n, const char *op, const float **out) {
  const lm_cuda_weight *h;
  *out = NULL;
  if (!w) return LM_OK;
  LM_TRY(lm_cuda_weight_of(w, op, &h));
  if (h->w.bits || h->w.wdt != LM_DT_F32 || h->w.rows != 1 || h->w.cols != n)
    return LM_ERRF(LM_ERR_INVALID, "CUDA %s: %s must be an f32 vector of %lld values", op, w->name,
                   (long long)n);
  *out = h->w.data;
  return LM_OK;
}

lm_status lm_cuda_embed(lm_backend *be, const lm_embed_args *a) {
  lm_cuda_ctx *c = lm_cuda_of(be);
  const lm_cuda_weight *h;
  LM_TRY(lm_cuda_need_step(c, "embed"));
  LM_TRY(lm_cuda_weight_of(a->table, "embed", &h));
  if (a->out.cols != h->w.cols || a->out.rows < c->st.n_tokens)
    return LM_ERRF(LM_ERR_INVALID, "CUDA embed: output [%lld][%lld] for %d tokens of %s [%lld]",
                   (long long)a->out.rows, (long long)a->out.cols, c->st.n_tokens, a->table->name,
                   (long long)h->w.cols);
  if (!act_ok(be, a->out)) return bad_dtype("embed", "out", a->out);
  lm_cu_t out = lm_cuda_view(a->out);
  out.rows = c->st.n_tokens;
  return LAUNCH(lm_cu_embed(c->ks, out, &h->w, c->st.ids, a->scale), "embed");
}

/* The fused tails: the layer scalar and the next norm after a residual add, or RoPE. */
static lm_status rmsnorm_fused(lm_backend *be, lm_cuda_ctx *c, const lm_rmsnorm_args *a,
                               const float *w) {
  if (a->rope) {
    const float *inv;
    LM_TRY(lm_cuda_need_step(c, "rmsnorm"));
    LM_TRY(vector_of(a->rope, a->x.cols / 2, "rmsnorm (rope)", &inv));
    if (a->residual || a->rope_heads <= 0 || a->x.rows % a->rope_heads || a->x.cols % 2 ||
        a->x.rows / a->rope_heads > c->st.n_tokens)
      return LM_ERRF(
          LM_ERR_INVALID,
          "CUDA rmsnorm: RoPE needs head rows (%d per token of the step), an even head dim "
          "and no residual",
          a->rope_heads);
    return LAUNCH(lm_cu_rmsnorm_rope(c->ks, lm_cuda_view(a->out), lm_cuda_view(a->x), w, a->eps,
                                     a->rope_heads, inv, c->st.pos),
                  "rmsnorm (rope)");
  }
  const float *nw = NULL;
  lm_cu_t next = {0};
  if (a->next_out.data) {
    LM_TRY(vector_of(a->next_w, a->x.cols, "rmsnorm (next)", &nw));
    if (a->next_out.rows != a->x.rows || a->next_out.cols != a->x.cols || !act_ok(be, a->next_out))
      return LM_ERRF(
          LM_ERR_INVALID,
          "CUDA rmsnorm: the next norm's output must be [%lld][%lld] of the activation dtype",
          (long long)a->x.rows, (long long)a->x.cols);
    next = lm_cuda_view(a->next_out);
  }
  return LAUNCH(lm_cu_rmsnorm_res(c->ks, lm_cuda_view(a->x), w, a->eps, lm_cuda_view(*a->residual),
                                  a->scaled, a->scale, next, nw),
                "rmsnorm (residual)");
}

lm_status lm_cuda_rmsnorm(lm_backend *be, const lm_rmsnorm_args *a) {
  lm_cuda_ctx *c = lm_cuda_of(be);
  const float *w;
  LM_TRY(vector_of(a->w, a->x.cols, "rmsnorm", &w));
  lm_tensor o = a->residual ? *a->residual : a->out;
  if (o.rows != a->x.rows || o.cols != a->x.cols)
    return LM_ERRF(LM_ERR_INVALID, "CUDA rmsnorm: [%lld][%lld] into [%lld][%lld]",
                   (long long)a->x.rows, (long long)a->x.cols, (long long)o.rows,
                   (long long)o.cols);
  if (!act_ok(be, a->x) || !act_ok(be, o))
    return bad_dtype("rmsnorm", "a tensor", act_ok(be, a->x) ? o : a->x);
  if (a->rope || (a->residual && (a->scaled || a->next_out.data)))
    return rmsnorm_fused(be, c, a, w);
  lm_cu_t res = lm_cuda_view(o);
  return LAUNCH(lm_cu_rmsnorm(c->ks, lm_cuda_view(a->out), lm_cuda_view(a->x), w, a->eps,
                              a->residual ? &res : NULL),
                "rmsnorm");
}

lm_status lm_cuda_rope(lm_backend *be, const lm_rope_args *a) {
  lm_cuda_ctx *c = lm_cuda_of(be);
  const float *inv;
  LM_TRY(lm_cuda_need_step(c, "rope"));
  if (a->head_dim <= 0 || a->head_dim % 2 || a->x.cols != (int64_t)a->n_heads * a->head_dim ||
      a->x.rows > c->st.n_tokens)
    return LM_ERRF(LM_ERR_INVALID, "CUDA rope: [%lld][%lld] is not %d tokens of %d heads x %d",
                   (long long)a->x.rows, (long long)a->x.cols, c->st.n_tokens, a->n_heads,
                   a->head_dim);
  LM_TRY(vector_of(a->inv_freq, a->head_dim / 2, "rope", &inv));
  if (!inv) return LM_ERRF(LM_ERR_INVALID, "CUDA rope: no inverse frequencies");
  if (!act_ok(be, a->x)) return bad_dtype("rope", "x", a->x);
  return LAUNCH(lm_cu_rope(c->ks, lm_cuda_view(a->x), a->n_heads, a->head_dim, inv, c->st.pos),
                "rope");
}

static int same_shape(lm_tensor a, lm_tensor b) { return a.rows == b.rows && a.cols == b.cols; }

lm_status lm_cuda_geglu(lm_backend *be, const lm_geglu_args *a) {
  lm_cuda_ctx *c = lm_cuda_of(be);
  if (!same_shape(a->out, a->gate) || !same_shape(a->out, a->up))
    return LM_ERRF(LM_ERR_INVALID, "CUDA geglu: shapes differ");
  if (!act_ok(be, a->out) || !act_ok(be, a->gate) || !act_ok(be, a->up))
    return bad_dtype("geglu", "a tensor", a->out);
  return LAUNCH(
      lm_cu_geglu(c->ks, lm_cuda_view(a->out), lm_cuda_view(a->gate), lm_cuda_view(a->up)),
      "geglu");
}

lm_status lm_cuda_add(lm_backend *be, const lm_add_args *a) {
  lm_cuda_ctx *c = lm_cuda_of(be);
  if (!same_shape(a->out, a->a) || (a->b.data && !same_shape(a->out, a->b)))
    return LM_ERRF(LM_ERR_INVALID, "CUDA add: shapes differ");
  if (!act_ok(be, a->out) || !act_ok(be, a->a) || (a->b.data && !act_ok(be, a->b)))
    return bad_dtype("add", "a tensor", a->out);
  return LAUNCH(
      lm_cu_add(c->ks, lm_cuda_view(a->out), lm_cuda_view(a->a), lm_cuda_view(a->b), a->scale),
      "add");
}

static int float_act(lm_tensor t) { return t.dtype == LM_DT_F32 || t.dtype == LM_DT_BF16; }

lm_status lm_cuda_softcap(lm_backend *be, const lm_softcap_args *a) {
  lm_cuda_ctx *c = lm_cuda_of(be);
  if (!float_act(a->x)) return bad_dtype("softcap", "x", a->x);
  if (!(a->cap > 0.0f)) return LM_ERRF(LM_ERR_INVALID, "CUDA softcap: cap %g", (double)a->cap);
  return LAUNCH(lm_cu_softcap(c->ks, lm_cuda_view(a->x), a->cap), "softcap");
}

lm_status lm_cuda_gather_logit_rows(lm_backend *be, const lm_gather_args *a) {
  lm_cuda_ctx *c = lm_cuda_of(be);
  LM_TRY(lm_cuda_need_step(c, "gather_logit_rows"));
  if (a->out.rows < c->st.n_logits || a->out.cols != a->x.cols || a->x.rows < c->st.n_tokens ||
      a->out.dtype != a->x.dtype)
    return LM_ERRF(LM_ERR_INVALID,
                   "CUDA gather_logit_rows: %d rows of [%lld][%lld] into [%lld][%lld]",
                   c->st.n_logits, (long long)a->x.rows, (long long)a->x.cols,
                   (long long)a->out.rows, (long long)a->out.cols);
  if (!float_act(a->x)) return bad_dtype("gather_logit_rows", "x", a->x);
  lm_cu_t out = lm_cuda_view(a->out);
  out.rows = c->st.n_logits;
  return LAUNCH(lm_cu_gather_rows(c->ks, out, lm_cuda_view(a->x), c->st.rows), "gather_logit_rows");
}

lm_status lm_cuda_logits_kl(lm_backend *be, const lm_logits_kl_args *a) {
  lm_cuda_ctx *c = lm_cuda_of(be);
  if (a->x.dtype != LM_DT_F32 || a->ref.dtype != LM_DT_F32 || a->kl.dtype != LM_DT_F32 ||
      a->ref.rows < a->x.rows || a->ref.cols != a->x.cols || a->kl.rows < a->x.rows ||
      a->kl.cols < 1)
    return LM_ERRF(LM_ERR_INVALID,
                   "CUDA logits_kl: f32 rows [%lld][%lld] against [%lld][%lld] into [%lld]",
                   (long long)a->x.rows, (long long)a->x.cols, (long long)a->ref.rows,
                   (long long)a->ref.cols, (long long)a->kl.rows);
  if (c->batch) return LM_ERRF(LM_ERR_STATE, "CUDA logits_kl: called inside a step");
  return LAUNCH(
      lm_cu_logits_kl(c->ks, lm_cuda_view(a->kl), lm_cuda_view(a->x), lm_cuda_view(a->ref)),
      "logits_kl");
}

lm_status lm_cuda_argmax(lm_backend *be, const lm_argmax_args *a) {
  lm_cuda_ctx *c = lm_cuda_of(be);
  if (a->ids.dtype != LM_DT_I32 || a->ids.rows < a->x.rows || !float_act(a->x))
    return LM_ERRF(LM_ERR_INVALID, "CUDA argmax: ids must be int32 [%lld] for an f32/bf16 input",
                   (long long)a->x.rows);
  return LAUNCH(lm_cu_argmax(c->ks, lm_cuda_view(a->ids), lm_cuda_view(a->x)), "argmax");
}

/* ---- attention and the cache append -------------------------------------------------------- */

static lm_status check_attn(lm_backend *be, const lm_cuda_ctx *c, const lm_attn_args *a) {
  int64_t qd = (int64_t)a->n_heads * a->head_dim, kvd = (int64_t)a->n_kv_heads * a->head_dim;
  if (a->n_kv_heads <= 0 || a->n_heads % a->n_kv_heads || a->head_dim <= 0 ||
      a->head_dim > LM_CU_ATTN_MAX_HD)
    return LM_ERRF(LM_ERR_UNSUPPORTED,
                   "CUDA attention: %d heads over %d KV heads of dim %d (dims 1..%d)", a->n_heads,
                   a->n_kv_heads, a->head_dim, LM_CU_ATTN_MAX_HD);
  if (a->cache < 0 || a->cache >= c->st.n_caches)
    return LM_ERRF(LM_ERR_INVALID, "CUDA attention: cache %d of %d", a->cache, c->st.n_caches);
  if (a->q.cols != qd || a->out.cols != qd || a->k_new.cols != kvd || a->v_new.cols != kvd ||
      a->q.rows < c->st.n_tokens || a->out.rows < c->st.n_tokens ||
      a->k_new.rows < c->st.n_tokens || a->v_new.rows < c->st.n_tokens)
    return LM_ERRF(LM_ERR_INVALID,
                   "CUDA attention: shapes do not match %d tokens of %d heads x %d (KV %d)",
                   c->st.n_tokens, a->n_heads, a->head_dim, a->n_kv_heads);
  const lm_kv_cache *kc = c->batch->kv[0]->caches[a->cache];
  if (kc->n_kv_heads != a->n_kv_heads || kc->head_dim != a->head_dim)
    return LM_ERRF(LM_ERR_INVALID,
                   "CUDA attention: cache %d holds %d heads x %d, the layer reads %d x %d",
                   a->cache, kc->n_kv_heads, kc->head_dim, a->n_kv_heads, a->head_dim);
  if (!act_ok(be, a->q) || !act_ok(be, a->out) || !act_ok(be, a->k_new) || !act_ok(be, a->v_new))
    return bad_dtype("attention", "a tensor", a->q);
  return LM_OK;
}

/* Whether any sequence's cache `cache` is quantized: then the k_kvquant.cu kernels run, which
 * follow each sequence's own descriptor (kinds may differ across a batch: --kv-quant-start
 * converts each sequence's caches when that sequence reaches it). The choice follows the
 * cache signatures, which key the plans. */
static int any_kind(const lm_batch *b, int cache, int (*is)(lm_kv_kind)) {
  for (int32_t s = 0; s < b->n_seqs; s++)
    if (is(b->kv[s]->caches[cache]->kind)) return 1;
  return 0;
}
/* Any affine-quantized (k_kvquant.cu's encoder), any TurboQuant (k_tq.cu's), any coded kind
 * at all (the append of staged codes, attention's quantized loaders). */
static int any_quant(const lm_batch *b, int cache) { return any_kind(b, cache, lm_kv_kind_quant); }
static int any_tq(const lm_batch *b, int cache) { return any_kind(b, cache, lm_kv_kind_tq); }
static int any_coded(const lm_batch *b, int cache) { return any_kind(b, cache, lm_kv_kind_coded); }

/* A quantized cache the kernels can read: the layer's row width, kv.c's bits and groups, and
 * the alignment the attention loader's word loads rely on (cudaMalloc gives 256 bytes). */
static lm_status check_quant_cache(const lm_kv_cache *kc, int64_t kvw, const char *op) {
  int ok = (int64_t)kc->n_kv_heads * kc->head_dim == kvw && (kc->bits == 4 || kc->bits == 8) &&
           (kc->group == 32 || kc->group == 64 || kc->group == 128) &&
           kc->head_dim % kc->group == 0 && ((uintptr_t)kc->k | (uintptr_t)kc->v) % 16 == 0 &&
           ((uintptr_t)kc->ks | (uintptr_t)kc->kb | (uintptr_t)kc->vs | (uintptr_t)kc->vb) % 2 == 0;
  if (!ok)
    return LM_ERRF(LM_ERR_UNSUPPORTED,
                   "CUDA %s: a %d-bit group-%d cache of %d heads x %d for rows of %lld", op,
                   kc->bits, kc->group, kc->n_kv_heads, kc->head_dim, (long long)kvw);
  return LM_OK;
}

/* A TurboQuant cache the kernels can read: the codec's widths and head dims (the encoder's
 * per-thread row holds 512 values), the layer's row width, fp16 planes on even addresses
 * (codes are read byte by byte), and the backend's tables. */
static lm_status check_tq_cache(const lm_kv_cache *kc, int64_t kvw, const char *op) {
  const int hd = kc->head_dim;
  int ok = lm_tq_widths_ok(kc->bits, kc->v_bits) &&
           (hd == 64 || hd == 128 || hd == 256 || hd == 512) &&
           (int64_t)kc->n_kv_heads * hd == kvw &&
           ((uintptr_t)kc->ks | (uintptr_t)kc->kb | (uintptr_t)kc->vs) % 2 == 0 &&
           lm_cuda_of(kc->be)->tq_tables;
  if (!ok)
    return LM_ERRF(LM_ERR_UNSUPPORTED,
                   "CUDA %s: a turboquant k%d/v%d cache of %d heads x %d for rows of %lld", op,
                   kc->bits, kc->v_bits, kc->n_kv_heads, hd, (long long)kvw);
  return LM_OK;
}

static lm_status check_quant_caches(const lm_batch *b, int cache, int64_t kvw, const char *op) {
  for (int32_t s = 0; s < b->n_seqs; s++) {
    const lm_kv_cache *kc = b->kv[s]->caches[cache];
    if (lm_kv_kind_quant(kc->kind)) LM_TRY(check_quant_cache(kc, kvw, op));
    if (lm_kv_kind_tq(kc->kind)) LM_TRY(check_tq_cache(kc, kvw, op));
  }
  return LM_OK;
}

lm_status lm_cuda_attention(lm_backend *be, const lm_attn_args *a) {
  lm_cuda_ctx *c = lm_cuda_of(be);
  LM_TRY(lm_cuda_need_step(c, "attention"));
  LM_TRY(check_attn(be, c, a));
  int quant = any_coded(c->batch, a->cache);
  if (quant)
    LM_TRY(
        check_quant_caches(c->batch, a->cache, (int64_t)a->n_kv_heads * a->head_dim, "attention"));
  lm_cu_attn_p p = {
      .out = lm_cuda_view(a->out),
      .q = lm_cuda_view(a->q),
      .k_new = lm_cuda_view(a->k_new),
      .v_new = lm_cuda_view(a->v_new),
      .kv = c->st.kv,
      .n_caches = c->st.n_caches,
      .cache = a->cache,
      .pos = c->st.pos,
      .seq = c->st.seq,
      .tiles = c->st.tiles,
      .n_tiles = c->st.n_tiles,
      .max_tile = c->st.max_tile,
      .n_heads = a->n_heads,
      .n_kv_heads = a->n_kv_heads,
      .head_dim = a->head_dim,
      .window = a->window,
      .scale = a->scale,
      .part = c->attn_part,
      .part_floats = c->attn_part_floats,
  };
  p.out.rows = c->st.n_tokens;
  if (a->q_rope) { /* the decode kernel norms q itself; any other step norms it first */
    LM_TRY(lm_attention_q_norm_check(a)); /* what the separate norm takes, whichever runs */
    LM_TRY(vector_of(a->q_norm, a->head_dim, "attention (q norm)", &p.q_w));
    LM_TRY(vector_of(a->q_rope, a->head_dim / 2, "attention (q rope)", &p.q_inv));
    p.q_eps = a->q_eps;
  }
  const lm_cu_attn_kind kind = lm_cu_pick_attn(&p, quant, c->n_sms, &c->sw);
  if (kind == LM_CU_ATTN_NORM_FIRST) return lm_attention_q_norm(be, a, lm_cuda_attention);
  return LAUNCH(quant ? lm_cu_kvq_attention(c->ks, &p, c->n_sms)
                      : lm_cu_attention(c->ks, &p, c->n_sms, kind),
                "attention");
}

/* The chunk's K/V rows for the cache `cache` of every sequence: [≥ T][KV heads × head_dim]. */
static lm_status check_kv_rows(lm_backend *be, const lm_cuda_ctx *c, int cache, lm_tensor k,
                               lm_tensor v, const char *op, int64_t *kvw) {
  const lm_batch *b = c->batch;
  if (cache < 0 || cache >= c->st.n_caches)
    return LM_ERRF(LM_ERR_INVALID, "CUDA %s: cache %d of %d", op, cache, c->st.n_caches);
  const lm_kv_cache *k0 = b->kv[0]->caches[cache];
  *kvw = (int64_t)k0->n_kv_heads * k0->head_dim;
  if (k.cols != *kvw || v.cols != *kvw || k.rows < b->n_tokens || v.rows < b->n_tokens ||
      !act_ok(be, k) || !act_ok(be, v))
    return LM_ERRF(LM_ERR_INVALID, "CUDA %s: K/V [%lld][%lld] for a cache of rows %lld", op,
                   (long long)k.rows, (long long)k.cols, (long long)*kvw);
  return LM_OK;
}

/* Byte rows [≥ T][≥ lm_kv_stage_row_bytes] for every quantized cache of the index. */
static lm_status check_stage(const lm_batch *b, int cache, lm_tensor st, const char *op) {
  int ok = st.data && lm_dtype_size(st.dtype) == 1 && st.rows >= b->n_tokens && st.ld >= st.cols;
  for (int32_t s = 0; ok && s < b->n_seqs; s++)
    ok = lm_kv_stage_row_bytes(b->kv[s]->caches[cache]) <= st.cols;
  if (!ok)
    return LM_ERRF(
        LM_ERR_INVALID, "CUDA %s: stage [%lld][%lld] of %s is too small for %d tokens of cache %d",
        op, (long long)st.rows, (long long)st.cols, lm_dtype_name(st.dtype), b->n_tokens, cache);
  return LM_OK;
}

static lm_cu_t step_rows(const lm_cuda_ctx *c, lm_tensor t) {
  lm_cu_t v = lm_cuda_view(t);
  v.rows = c->st.n_tokens;
  return v;
}

/* Plain caches store the chunk's K/V as computed: nothing to do unless some sequence's cache
 * of this index is quantized. */
lm_status lm_cuda_kv_stage(lm_backend *be, const lm_kv_stage_args *a) {
  lm_cuda_ctx *c = lm_cuda_of(be);
  int64_t kvw;
  LM_TRY(lm_cuda_need_step(c, "kv_stage"));
  LM_TRY(check_kv_rows(be, c, a->cache, a->k_new, a->v_new, "kv_stage", &kvw));
  if (!any_coded(c->batch, a->cache)) return LM_OK;
  LM_TRY(check_quant_caches(c->batch, a->cache, kvw, "kv_stage"));
  LM_TRY(check_stage(c->batch, a->cache, a->stage, "kv_stage"));
  lm_cu_t kn = step_rows(c, a->k_new), vn = step_rows(c, a->v_new), st = lm_cuda_view(a->stage);
  if (any_quant(c->batch, a->cache))
    LM_TRY(LAUNCH(lm_cu_kvq_stage(c->ks, kn, vn, st, c->st.kv, c->st.n_caches, a->cache, c->st.seq),
                  "kv_stage"));
  if (any_tq(c->batch, a->cache))
    LM_TRY(LAUNCH(lm_cu_tq_stage(c->ks, kn, vn, st, c->st.kv, c->st.n_caches, a->cache, c->st.seq),
                  "kv_stage"));
  return LM_OK;
}

lm_status lm_cuda_kv_convert(lm_backend *be, const lm_kv_convert_args *a) {
  lm_cuda_ctx *c = lm_cuda_of(be);
  const lm_kv_cache *f = a->from, *t = a->to;
  int64_t w = (int64_t)f->n_kv_heads * f->head_dim;
  if (c->batch) return LM_ERRF(LM_ERR_STATE, "CUDA kv_convert: called inside a step");
  if (f->be != be || t->be != be || lm_kv_kind_quant(f->kind) || !lm_kv_kind_quant(t->kind) ||
      f->n_kv_heads != t->n_kv_heads || f->head_dim != t->head_dim || f->window != t->window ||
      f->slots != t->slots || (!f->window && f->n > f->slots) ||
      (f->dtype != LM_DT_F32 && f->dtype != LM_DT_BF16))
    return LM_ERRF(LM_ERR_INVALID,
                   "CUDA kv_convert: a %d x %d cache of %lld slots into a %d x %d one of %lld",
                   f->n_kv_heads, f->head_dim, (long long)f->slots, t->n_kv_heads, t->head_dim,
                   (long long)t->slots);
  LM_TRY(check_quant_cache(t, w, "kv_convert"));
  lm_cu_kvdesc fd = lm_cuda_kvdesc(f), td = lm_cuda_kvdesc(t);
  LM_TRY(LAUNCH(lm_cu_kvq_convert(c->ks, &fd, (int)f->dtype, &td, w, lm_kv_held(f)), "kv_convert"));
  LM_CU(cudaStreamSynchronize(c->stream)); /* the caller frees the plain arrays next */
  return LM_OK;
}

lm_status lm_cuda_kv_append(lm_backend *be, const lm_kv_append_args *a) {
  lm_cuda_ctx *c = lm_cuda_of(be);
  int64_t kvw;
  LM_TRY(lm_cuda_need_step(c, "kv_append"));
  const lm_batch *b = c->batch;
  LM_TRY(check_kv_rows(be, c, a->cache, a->k_new, a->v_new, "kv_append", &kvw));
  lm_cu_t kn = step_rows(c, a->k_new), vn = step_rows(c, a->v_new);
  if (any_coded(b, a->cache)) {
    LM_TRY(check_quant_caches(b, a->cache, kvw, "kv_append"));
    LM_TRY(check_stage(b, a->cache, a->stage, "kv_append"));
    LM_TRY(LAUNCH(lm_cu_kvq_append(c->ks, kn, vn, lm_cuda_view(a->stage), c->st.kv, c->st.n_caches,
                                   a->cache, c->st.pos, c->st.seq),
                  "kv_append"));
  } else {
    LM_TRY(LAUNCH(
        lm_cu_kv_append(c->ks, kn, vn, c->st.kv, c->st.n_caches, a->cache, c->st.pos, c->st.seq),
        "kv_append"));
  }
  if (c->capturing) LM_TRY(lm_cuda_plan_note_append(c, a->cache));
  /* Positions advance once every token is written (attention reads n as "past"). */
  for (int32_t t = 0; t < b->n_tokens; t++) {
    lm_kv_cache *kc = b->kv[b->seq[t]]->caches[a->cache];
    if (b->pos[t] + 1 > kc->n) kc->n = b->pos[t] + 1;
  }
  return LM_OK;
}

/* ---- MoE routing ------------------------------------------------------------------------------
 */

lm_status lm_cuda_moe_route(lm_backend *be, const lm_moe_route_args *a) {
  lm_cuda_ctx *c = lm_cuda_of(be);
  const float *pes;
  LM_TRY(vector_of(a->per_expert_scale, a->logits.cols, "moe_route", &pes));
  if (!pes || a->top_k <= 0 || a->top_k > a->logits.cols || a->ids.dtype != LM_DT_I32 ||
      a->ids.cols < a->top_k || a->weights.dtype != LM_DT_F32 || a->weights.cols < a->top_k ||
      a->logits.dtype != LM_DT_F32 || a->ids.rows < a->logits.rows ||
      a->weights.rows < a->logits.rows || a->logits.cols > 1536)
    return LM_ERRF(LM_ERR_INVALID,
                   "CUDA moe_route: top %d of [%lld][%lld] f32 logits into int32 ids / f32 weights "
                   "(up to 1536 experts)",
                   a->top_k, (long long)a->logits.rows, (long long)a->logits.cols);
  return LAUNCH(lm_cu_moe_route(c->ks, lm_cuda_view(a->ids), lm_cuda_view(a->weights),
                                lm_cuda_view(a->logits), a->top_k, pes),
                "moe_route");
}
