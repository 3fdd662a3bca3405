/* cuda_backend.c — the CUDA backend object: device memory with accounting, weights uploaded
 * once (prepare_weight), the step's inputs uploaded to device buffers (begin_step), the op
 * table, and the bandwidth probes `lumen bench` reports against. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_internal.h"
#include "base/status.h"
#include "kv/kv.h"

#define MIB (1024.0 * 1024.0)

static const char *base_name(const char *path) {
  const char *s = strrchr(path, '/');
  return s ? s + 1 : path;
}

lm_status lm_cuda_fail(cudaError_t e, const char *call, const char *file, int line) {
  lm_status s = e == cudaErrorMemoryAllocation ? LM_ERR_NOMEM : LM_ERR_DEVICE;
  return LM_ERRF(s, "CUDA: %s failed at %s:%d: %s (%s)", call, base_name(file), line,
                 cudaGetErrorString(e), cudaGetErrorName(e));
}

lm_status lm_cublas_fail(cublasStatus_t e, const char *call, const char *file, int line) {
  return LM_ERRF(LM_ERR_DEVICE, "cuBLAS: %s failed at %s:%d: %s", call, base_name(file), line,
                 cublasGetStatusString(e));
}

/* ---- memory ---------------------------------------------------------------------------------- */

lm_status lm_cuda_malloc(lm_cuda_ctx *c, size_t bytes, lm_cuda_use use, const char *what,
                         void **out) {
  *out = NULL;
  if (c->n_allocs == c->cap_allocs) {
    int cap = c->cap_allocs ? 2 * c->cap_allocs : 64;
    lm_cuda_alloc *a = realloc(c->allocs, (size_t)cap * sizeof *a);
    if (!a) return LM_ERRF(LM_ERR_NOMEM, "out of memory");
    c->allocs = a;
    c->cap_allocs = cap;
  }
  void *p = NULL;
  cudaError_t e = cudaMalloc(&p, bytes ? bytes : 256);
  if (e != cudaSuccess) {
    (void)cudaGetLastError(); /* an allocation failure is not sticky; clear it */
    size_t fr = 0, tot = 0;
    (void)cudaMemGetInfo(&fr, &tot);
    return LM_ERRF(
        e == cudaErrorMemoryAllocation ? LM_ERR_NOMEM : LM_ERR_DEVICE,
        "CUDA: cannot allocate %.1f MiB for %s on %s: %s; %.1f MiB free of %.1f MiB (this backend "
        "holds weights %.1f MiB, KV %.1f MiB, workspace %.1f MiB)",
        (double)bytes / MIB, what, c->name, cudaGetErrorString(e), (double)fr / MIB,
        (double)tot / MIB, (double)c->used[LM_CUDA_WEIGHTS] / MIB,
        (double)c->used[LM_CUDA_KV] / MIB, (double)c->used[LM_CUDA_WORKSPACE] / MIB);
  }
  c->allocs[c->n_allocs++] = (lm_cuda_alloc){p, bytes, use};
  c->used[use] += (int64_t)bytes;
  *out = p;
  return LM_OK;
}

static int alloc_index(const lm_cuda_ctx *c, const void *p) {
  for (int i = c->n_allocs - 1; i >= 0; i--)
    if (c->allocs[i].p == p) return i;
  return -1;
}

void lm_cuda_release(lm_cuda_ctx *c, void *p) {
  if (!p) return;
  int i = alloc_index(c, p);
  if (i < 0) return; /* not ours: never free what we did not allocate */
  c->used[c->allocs[i].use] -= (int64_t)c->allocs[i].bytes;
  c->allocs[i] = c->allocs[--c->n_allocs];
  (void)cudaFree(p);
}

/* KV buffers come through alloc() like workspaces; begin_step recognizes them by pointer. */
static void mark_kv(lm_cuda_ctx *c, const void *p) {
  int i = alloc_index(c, p);
  if (i < 0 || c->allocs[i].use == LM_CUDA_KV) return;
  c->used[c->allocs[i].use] -= (int64_t)c->allocs[i].bytes;
  c->allocs[i].use = LM_CUDA_KV;
  c->used[LM_CUDA_KV] += (int64_t)c->allocs[i].bytes;
}

static lm_status cuda_alloc(lm_backend *be, size_t bytes, void **ptr) {
  return lm_cuda_malloc(lm_cuda_of(be), bytes, LM_CUDA_WORKSPACE, "a buffer", ptr);
}

static void cuda_free(lm_backend *be, void *ptr) { lm_cuda_release(lm_cuda_of(be), ptr); }

static lm_status cuda_copy_kind(lm_backend *be, void *dst, const void *src, size_t bytes,
                                enum cudaMemcpyKind k) {
  lm_cuda_ctx *c = lm_cuda_of(be);
  if (!bytes) return LM_OK;
  LM_CU(cudaMemcpyAsync(dst, src, bytes, k, c->stream));
  LM_CU(cudaStreamSynchronize(c->stream));
  return LM_OK;
}

static lm_status cuda_upload(lm_backend *be, void *dst, const void *src, size_t bytes) {
  return cuda_copy_kind(be, dst, src, bytes, cudaMemcpyHostToDevice);
}
static lm_status cuda_download(lm_backend *be, void *dst, const void *src, size_t bytes) {
  return cuda_copy_kind(be, dst, src, bytes, cudaMemcpyDeviceToHost);
}
static lm_status cuda_copy(lm_backend *be, void *dst, const void *src, size_t bytes) {
  return cuda_copy_kind(be, dst, src, bytes, cudaMemcpyDeviceToDevice);
}

/* ---- weights ----------------------------------------------------------------------------------
 */

/* Whether w holds a handle this backend made from w. Comparing the handle alone is not
 * enough: w->backend may dangle from a destroyed backend whose handle's address a handle of
 * ours now reuses. */
static int owns_weight(const lm_cuda_ctx *c, const lm_weight *w) {
  for (int i = 0; i < c->n_weights; i++)
    if (c->weights[i] == w->backend && c->weights[i]->host == w) return 1;
  return 0;
}

/* Scale/bias pairs of every (row, group), experts compacted: bf16/f16 as one u32 (scale in
 * the low half), f32 as float2. The same bytes as the checkpoint's two arrays. */
static void *pack_pairs(const lm_weight *w, int *kind, size_t *bytes) {
  int64_t ne = w->n_experts ? w->n_experts : 1, ng = w->cols / w->group, n = ne * w->rows * ng;
  *kind = w->sdtype == LM_DT_F32   ? LM_CU_SB_F32
          : w->sdtype == LM_DT_F16 ? LM_CU_SB_F16
                                   : LM_CU_SB_BF16;
  *bytes = (size_t)n * (*kind == LM_CU_SB_F32 ? 8 : 4);
  void *out = malloc(*bytes ? *bytes : 1);
  if (!out) return NULL;
  for (int64_t e = 0; e < ne; e++)
    for (int64_t r = 0; r < w->rows; r++) {
      const uint8_t *sp = lm_weight_scale_ptr(w, e, r), *bp = lm_weight_bias_ptr(w, e, r);
      int64_t o = (e * w->rows + r) * ng;
      for (int64_t g = 0; g < ng; g++) {
        if (*kind == LM_CU_SB_F32) {
          memcpy((float *)out + 2 * (o + g), sp + 4 * g, 4);
          memcpy((float *)out + 2 * (o + g) + 1, bp + 4 * g, 4);
        } else {
          uint16_t s16, b16;
          memcpy(&s16, sp + 2 * g, 2);
          memcpy(&b16, bp + 2 * g, 2);
          ((uint32_t *)out)[o + g] = (uint32_t)s16 | (uint32_t)b16 << 16;
        }
      }
    }
  return out;
}

static lm_status upload_weight(lm_backend *be, const lm_weight *w, lm_cuda_weight *h) {
  lm_cuda_ctx *c = lm_cuda_of(be);
  int64_t ne = w->n_experts ? w->n_experts : 1, rb = lm_weight_row_bytes(w);
  size_t per_expert = (size_t)(w->rows * rb);
  LM_TRY(lm_cuda_malloc(c, per_expert * (size_t)ne, LM_CUDA_WEIGHTS, w->name, &h->data));
  if (w->expert_rows == w->rows)
    LM_TRY(cuda_upload(be, h->data, lm_weight_row_ptr(w, 0, 0), per_expert * (size_t)ne));
  else
    for (int64_t e = 0; e < ne; e++)
      LM_TRY(cuda_upload(be, (char *)h->data + e * per_expert, lm_weight_row_ptr(w, e, 0),
                         per_expert));
  h->w = (lm_cu_w){.data = h->data,
                   .n_experts = w->n_experts,
                   .rows = w->rows,
                   .cols = w->cols,
                   .row_bytes = rb,
                   .bits = w->bits,
                   .group = w->group,
                   .wdt = (int)w->dtype};
  if (!w->bits) return LM_OK;
  size_t bytes;
  void *pairs = pack_pairs(w, &h->w.sb_kind, &bytes);
  if (!pairs) return LM_ERRF(LM_ERR_NOMEM, "out of memory packing the scales of %s", w->name);
  lm_status s = lm_cuda_malloc(c, bytes, LM_CUDA_WEIGHTS, w->name, &h->sb);
  if (!s) s = cuda_upload(be, h->sb, pairs, bytes);
  free(pairs);
  h->w.sb = h->sb;
  return s;
}

static lm_status cuda_prepare_weight(lm_backend *be, lm_weight *w) {
  lm_cuda_ctx *c = lm_cuda_of(be);
  if (w->backend && owns_weight(c, w)) return LM_OK; /* prepared already */
  if (w->bits && (w->bits < 2 || w->bits > 8 || w->group <= 0 || w->cols % w->group))
    return LM_ERRF(LM_ERR_UNSUPPORTED,
                   "CUDA: weight %s: %d-bit groups of %d do not fit %lld columns", w->name, w->bits,
                   w->group, (long long)w->cols);
  if (!w->bits && w->dtype != LM_DT_F32 && w->dtype != LM_DT_BF16 && w->dtype != LM_DT_F16)
    return LM_ERRF(LM_ERR_UNSUPPORTED, "CUDA: weight %s has dtype %s", w->name,
                   lm_dtype_name(w->dtype));
  if (c->n_weights == c->cap_weights) {
    int cap = c->cap_weights ? 2 * c->cap_weights : 256;
    lm_cuda_weight **a = realloc(c->weights, (size_t)cap * sizeof *a);
    if (!a) return LM_ERRF(LM_ERR_NOMEM, "out of memory");
    c->weights = a;
    c->cap_weights = cap;
  }
  lm_cuda_weight *h = calloc(1, sizeof *h);
  if (!h) return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  lm_status s = upload_weight(be, w, h);
  if (s) {
    lm_cuda_release(c, h->data);
    lm_cuda_release(c, h->sb);
    free(h);
    return lm_err_prefix(s, "uploading %s", w->name);
  }
  h->host = w;
  c->weights[c->n_weights++] = h;
  w->backend = h;
  return LM_OK;
}

/* A new device copy first, then the old one freed, so a failed upload changes nothing. Every
 * plan is dropped: its captured launches hold the old copy's pointers and kinds. */
static lm_status cuda_refresh_weight(lm_backend *be, lm_weight *w) {
  lm_cuda_ctx *c = lm_cuda_of(be);
  if (!w->backend || !owns_weight(c, w)) return cuda_prepare_weight(be, w);
  lm_cuda_weight *h = w->backend, fresh = {.host = w};
  LM_CU(cudaStreamSynchronize(c->stream)); /* no step may still read the old copy */
  lm_status s = upload_weight(be, w, &fresh);
  if (s) {
    lm_cuda_release(c, fresh.data);
    lm_cuda_release(c, fresh.sb);
    return lm_err_prefix(s, "uploading %s", w->name);
  }
  lm_cuda_release(c, h->data);
  lm_cuda_release(c, h->sb);
  *h = fresh;
  lm_cuda_drop_plans(c);
  return LM_OK;
}

lm_status lm_cuda_weight_of(const lm_weight *w, const char *op, const lm_cuda_weight **out) {
  if (!w || !w->backend)
    return LM_ERRF(LM_ERR_STATE,
                   "CUDA %s: weight %s was not prepared for this backend (lm_model_prepare)", op,
                   w && w->name ? w->name : "(null)");
  *out = w->backend;
  return LM_OK;
}

/* ---- steps ------------------------------------------------------------------------------------
 */

/* The quantized kinds take what kv.c allows: 4 or 8 bits, groups of 32, 64 or 128. */
static int quant_sig_ok(const char *rest) {
  static const char *const ok[] = {"4:32", "4:64", "4:128", "8:32", "8:64", "8:128"};
  for (size_t i = 0; i < sizeof ok / sizeof *ok; i++)
    if (!strcmp(rest, ok[i])) return 1;
  return 0;
}

static int cuda_supports_cache(lm_backend *be, const char *sig) {
  (void)be;
  if (!strncmp(sig, "kv:quant:", 9)) return quant_sig_ok(sig + 9);
  if (!strncmp(sig, "kv:rotating-quant:", 18)) return quant_sig_ok(sig + 18);
  return !strcmp(sig, "kv:plain") || !strcmp(sig, "kv:rotating-plain") || lm_kv_tq_sig_ok(sig);
}

/* The device copy of the TurboQuant tables: per value width 2..5 a row of 32 centroids and
 * one of 32 boundaries (floats), then the sign vectors of head dims 64, 128, 256, 512 (int8). */
enum {
  TQ_ROW = 32,
  TQ_WIDTHS = 4,
  TQ_SIGNS_AT = 2 * TQ_WIDTHS * TQ_ROW * 4,
  TQ_BYTES = TQ_SIGNS_AT + 64 + 128 + 256 + 512
};
static const int tq_dims[] = {64, 128, 256, 512};

static lm_status upload_tq_tables(lm_cuda_ctx *c) {
  uint8_t host[TQ_BYTES] = {0};
  float *f = (float *)host;
  for (int v = 2; v <= 5; v++) {
    lm_tq_params p;
    LM_TRY(lm_tq_params_init(&p, 64, 8, v));
    memcpy(f + (v - 2) * TQ_ROW, p.centroids, sizeof(float) << v);
    memcpy(f + (TQ_WIDTHS + v - 2) * TQ_ROW, p.boundaries, sizeof(float) * ((1u << v) - 1));
  }
  size_t at = TQ_SIGNS_AT;
  for (int i = 0; i < 4; i++) {
    lm_tq_params p;
    LM_TRY(lm_tq_params_init(&p, tq_dims[i], 8, 3));
    memcpy(host + at, p.signs, (size_t)tq_dims[i]);
    at += (size_t)tq_dims[i];
  }
  LM_TRY(lm_cuda_malloc(c, TQ_BYTES, LM_CUDA_WORKSPACE, "turboquant tables", &c->tq_tables));
  LM_CU(cudaMemcpy(c->tq_tables, host, TQ_BYTES, cudaMemcpyHostToDevice));
  return LM_OK;
}

/* The descriptor's table pointers for a TurboQuant cache (its widths and head dim are the
 * codec's: kv.c created it). */
static void tq_desc(const lm_cuda_ctx *c, const lm_kv_cache *kc, lm_cu_kvdesc *d) {
  const uint8_t *t = c->tq_tables;
  size_t at = TQ_SIGNS_AT;
  for (int i = 0; i < 4 && tq_dims[i] != kc->head_dim; i++)
    at += (size_t)tq_dims[i];
  d->tq = 1;
  d->v_bits = kc->v_bits;
  d->head_dim = kc->head_dim;
  d->tq_signs = (const int8_t *)(t + at);
  d->tq_cent = (const float *)t + (kc->v_bits - 2) * TQ_ROW;
  d->tq_bnd = (const float *)t + (TQ_WIDTHS + kc->v_bits - 2) * TQ_ROW;
}

lm_cu_kvdesc lm_cuda_kvdesc(const lm_kv_cache *kc) {
  lm_cu_kvdesc d = {.k = kc->k,
                    .v = kc->v,
                    .n = kc->n,
                    .window = kc->window,
                    .slots = kc->slots,
                    .ks = kc->ks,
                    .kb = kc->kb,
                    .vs = kc->vs,
                    .vb = kc->vb,
                    .bits = kc->bits,
                    .group = kc->group,
                    .quant = lm_kv_kind_quant(kc->kind),
                    .head_dim = kc->head_dim};
  if (lm_kv_kind_tq(kc->kind)) tq_desc(lm_cuda_of(kc->be), kc, &d);
  return d;
}

static lm_status grow_step(lm_cuda_ctx *c, size_t need) {
  if (need <= c->step_cap) return LM_OK;
  size_t cap = need > 2 * c->step_cap ? need : 2 * c->step_cap;
  lm_cuda_plans_clear(c); /* plans hold the old buffer's addresses */
  lm_cuda_release(c, c->step_dev);
  c->step_dev = NULL;
  if (c->step_host) (void)cudaFreeHost(c->step_host);
  c->step_host = NULL;
  c->step_cap = 0;
  LM_CU(cudaMallocHost(&c->step_host, cap));
  LM_TRY(lm_cuda_malloc(c, cap, LM_CUDA_WORKSPACE, "step inputs", &c->step_dev));
  c->step_cap = cap;
  return LM_OK;
}

/* Splits the batch into attention tiles of ≤ LM_CUDA_TILE tokens that never cross a
 * sequence; returns the count and the largest tile. */
static int make_tiles(const lm_batch *b, int32_t *tiles, int *max_tile) {
  int n = 0;
  *max_tile = 0;
  for (int32_t t = 0; t < b->n_tokens;) {
    int32_t u = t + 1;
    while (u < b->n_tokens && u - t < LM_CUDA_TILE && b->seq[u] == b->seq[t])
      u++;
    tiles[2 * n] = t;
    tiles[2 * n + 1] = u - t;
    if (u - t > *max_tile) *max_tile = u - t;
    n++;
    t = u;
  }
  return n;
}

static lm_status check_caches(lm_cuda_ctx *c, const lm_batch *b, int nc) {
  for (int32_t s = 0; s < b->n_seqs; s++)
    if (b->kv[s]->n != nc)
      return LM_ERRF(LM_ERR_INVALID, "CUDA step: sequence %d has %d caches, sequence 0 has %d", s,
                     b->kv[s]->n, nc);
  for (int32_t t = 0; t < b->n_tokens; t++)
    for (int i = 0; i < nc; i++) {
      const lm_kv_cache *kc = b->kv[b->seq[t]]->caches[i];
      if (kc->be->ctx != c)
        return LM_ERRF(LM_ERR_INVALID,
                       "CUDA step: cache %d of sequence %d belongs to another backend", i,
                       b->seq[t]);
      if (lm_kv_slot(kc, b->pos[t]) >= kc->slots)
        return LM_ERRF(LM_ERR_STATE,
                       "CUDA step: position %d beyond the %lld reserved slots of cache %d",
                       b->pos[t], (long long)kc->slots, i);
    }
  return LM_OK;
}

static lm_status cuda_begin_step(lm_backend *be, const lm_batch *b) {
  lm_cuda_ctx *c = lm_cuda_of(be);
  int T = b->n_tokens, NL = b->n_logits, S = b->n_seqs, nc = S ? b->kv[0]->n : 0;
  LM_TRY(check_caches(c, b, nc));
  size_t desc = (size_t)S * (size_t)nc * sizeof(lm_cu_kvdesc);
  size_t need = desc + (size_t)(5 * (int64_t)T + NL) * sizeof(int32_t);
  LM_TRY(grow_step(c, need));
  lm_cu_kvdesc *kd = c->step_host;
  for (int32_t s = 0; s < S; s++)
    for (int i = 0; i < nc; i++) {
      const lm_kv_cache *kc = b->kv[s]->caches[i];
      kd[s * nc + i] = lm_cuda_kvdesc(kc);
      const void *arrays[] = {kc->k,  kc->v,  kc->ks,
                              kc->kb, kc->vs, kc->vb}; /* the last four: quantized kinds */
      for (size_t a = 0; a < sizeof arrays / sizeof *arrays; a++)
        mark_kv(c, arrays[a]);
    }
  int32_t *ip = (int32_t *)((char *)c->step_host + desc);
  memcpy(ip, b->ids, (size_t)T * 4);
  memcpy(ip + T, b->pos, (size_t)T * 4);
  memcpy(ip + 2 * T, b->seq, (size_t)T * 4);
  memcpy(ip + 3 * T, b->logit_rows, (size_t)NL * 4);
  int max_tile, n_tiles = make_tiles(b, ip + 3 * T + NL, &max_tile);
  size_t used = desc + (size_t)(3 * (int64_t)T + NL + 2 * (int64_t)n_tiles) * sizeof(int32_t);
  LM_CU(cudaMemcpyAsync(c->step_dev, c->step_host, used, cudaMemcpyHostToDevice, c->stream));
  int32_t *dp = (int32_t *)((char *)c->step_dev + desc);
  c->st = (lm_cuda_step){.kv = c->step_dev,
                         .ids = dp,
                         .pos = dp + T,
                         .seq = dp + 2 * T,
                         .rows = dp + 3 * T,
                         .tiles = dp + 3 * T + NL,
                         .n_tokens = T,
                         .n_logits = NL,
                         .n_seqs = S,
                         .n_caches = nc,
                         .n_tiles = n_tiles,
                         .max_tile = max_tile};
  c->batch = b;
  lm_cuda_range_step(c, 1);
  return LM_OK;
}

static lm_status cuda_end_step(lm_backend *be) {
  lm_cuda_ctx *c = lm_cuda_of(be);
  c->batch = NULL;
  LM_CU(cudaStreamSynchronize(c->stream));
  lm_cuda_range_step(c, 0);
  LM_CU(cudaGetLastError());
  return LM_OK;
}

lm_status lm_cuda_need_step(lm_cuda_ctx *c, const char *op) {
  if (!c->batch) return LM_ERRF(LM_ERR_STATE, "CUDA %s: called outside a step (begin_step)", op);
  return LM_OK;
}

/* ---- the backend ------------------------------------------------------------------------------
 */

static void cuda_destroy(lm_backend *be) {
  if (!be) return;
  lm_cuda_ctx *c = lm_cuda_of(be);
  if (c) {
    lm_cuda_prof_print(c);
    lm_cuda_plans_clear(c);
    if (c->stream) (void)cudaStreamSynchronize(c->stream);
    for (int i = 0; i < c->n_weights; i++)
      free(c->weights[i]);
    free(c->weights);
    for (int i = 0; i < c->n_allocs; i++)
      (void)cudaFree(c->allocs[i].p);
    free(c->allocs);
    if (c->step_host) (void)cudaFreeHost(c->step_host);
    if (c->blas) (void)cublasDestroy(c->blas);
    if (c->stream) (void)cudaStreamDestroy(c->stream);
    free(c);
  }
  free(be);
}

static const lm_backend_ops lm_cuda_ops = {
    .api_version = LM_BACKEND_API_VERSION,
    .name = "cuda",
    .destroy = cuda_destroy,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .upload = cuda_upload,
    .download = cuda_download,
    .copy = cuda_copy,
    .prepare_weight = cuda_prepare_weight,
    .refresh_weight = cuda_refresh_weight,
    .supports_cache = cuda_supports_cache,
    .begin_step = cuda_begin_step,
    .end_step = cuda_end_step,
    .embed = lm_cuda_embed,
    .matmul = lm_cuda_matmul,
    .rmsnorm = lm_cuda_rmsnorm,
    .rope = lm_cuda_rope,
    .geglu = lm_cuda_geglu,
    .add = lm_cuda_add,
    .softcap = lm_cuda_softcap,
    .gather_logit_rows = lm_cuda_gather_logit_rows,
    .attention = lm_cuda_attention,
    .kv_stage = lm_cuda_kv_stage,
    .kv_convert = lm_cuda_kv_convert,
    .kv_append = lm_cuda_kv_append,
    .moe_route = lm_cuda_moe_route,
    .moe_experts = lm_cuda_moe_experts,
    .logits_kl = lm_cuda_logits_kl,
    .lora_shrink = lm_cuda_lora_shrink,
    .argmax = lm_cuda_argmax,
    .run_step = lm_cuda_run_step,
    .release_plans = lm_cuda_release_plans,
};

int lm_cuda_device_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

static int env_on(const char *name) {
  const char *v = getenv(name);
  return v && *v && strcmp(v, "0");
}

/* Everything the backend takes from the environment (cuda_backend.h), read once, when it is
 * created: the side-by-side switches and the profiler's settings. */
static void read_env(lm_cuda_ctx *c) {
  const char *pdl = getenv("LUMEN_CUDA_PDL"), *gemv = getenv("LUMEN_CUDA_GEMV"),
             *unfuse = getenv("LUMEN_CUDA_UNFUSE"), *step = getenv("LUMEN_CUDA_PROFILE_STEP");
  c->sw = (lm_cu_switches){.pdl = !(pdl && !strcmp(pdl, "0")),
                           .tensor_cores = !(gemv && !strcmp(gemv, "cores")),
                           .glu_pair = !(unfuse && strstr(unfuse, "glu_pair")),
                           .q_norm = !(unfuse && strstr(unfuse, "q_norm"))};
  c->profile = env_on("LUMEN_CUDA_PROFILE");
  c->prof_step = step ? atoi(step) : 0;
}

static lm_status cuda_init(lm_cuda_ctx *c, int device) {
  struct cudaDeviceProp pr;
  LM_CU(cudaSetDevice(device));
  LM_CU(cudaGetDeviceProperties(&pr, device));
  c->device = device;
  c->n_sms = pr.multiProcessorCount;
  c->smem_optin = (int)pr.sharedMemPerBlockOptin;
  snprintf(c->name, sizeof c->name, "%.200s (cuda:%d, sm_%d%d)", pr.name, device, pr.major,
           pr.minor);
  if (pr.major < 8)
    return LM_ERRF(LM_ERR_UNSUPPORTED, "CUDA: %s: compute capability %d.%d; this build needs 9.0",
                   c->name, pr.major, pr.minor);
  LM_CU(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
  LM_CUBLAS(cublasCreate(&c->blas));
  LM_CUBLAS(cublasSetStream(c->blas, c->stream));
  c->ks = (lm_cu_stream){.stream = c->stream, .pdl = c->sw.pdl};
  LM_CU(lm_cu_kernels_init(c->smem_optin));
  c->mm_scratch_bytes = (size_t)128 << 20;
  LM_TRY(
      lm_cuda_malloc(c, c->mm_scratch_bytes, LM_CUDA_WORKSPACE, "matmul scratch", &c->mm_scratch));
  c->attn_part_floats = (int64_t)8 << 20;
  LM_TRY(lm_cuda_malloc(c, (size_t)c->attn_part_floats * sizeof(float), LM_CUDA_WORKSPACE,
                        "attention scratch", (void **)&c->attn_part));
  /* its tail holds the decode kernel's split counters, which must start at zero */
  LM_CU(cudaMemset(c->attn_part, 0, (size_t)c->attn_part_floats * sizeof(float)));
  LM_TRY(upload_tq_tables(c));
  c->plans_on = 1;
  if (c->profile) {
    LM_TRY(lm_cuda_prof_begin(c));
    c->plans_on = 0; /* per-op timing needs eager steps */
  }
  return grow_step(c, (size_t)64 << 10);
}

lm_status lm_backend_cuda_create(lm_precision prec, int device, lm_backend **out) {
  *out = NULL;
  int n = lm_cuda_device_count();
  if (device < 0 || device >= n)
    return LM_ERRF(LM_ERR_DEVICE, "CUDA: no device %d (%d visible)", device, n);
  lm_backend *be = calloc(1, sizeof *be);
  lm_cuda_ctx *c = calloc(1, sizeof *c);
  if (!be || !c) {
    free(be);
    free(c);
    return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  }
  be->ops = &lm_cuda_ops;
  read_env(c);
  if (c->profile) {
    lm_cuda_profiled_ops(&c->prof_ops);
    be->ops = &c->prof_ops;
  }
  be->act_dtype = prec == LM_PRECISION_F32 ? LM_DT_F32 : LM_DT_BF16;
  be->precision = prec;
  be->exact_rows = 1; /* the multi-row products and prefill attention reduce in other orders */
  be->ctx = c;
  lm_status s = cuda_init(c, device);
  if (s) {
    cuda_destroy(be);
    return lm_err_prefix(s, "CUDA backend");
  }
  *out = be;
  return LM_OK;
}

/* ---- reports ----------------------------------------------------------------------------------
 */

lm_status lm_cuda_mem_get(lm_backend *be, lm_cuda_mem *out) {
  lm_cuda_ctx *c = lm_cuda_of(be);
  size_t fr = 0, tot = 0;
  LM_CU(cudaMemGetInfo(&fr, &tot));
  *out = (lm_cuda_mem){c->used[LM_CUDA_WEIGHTS], c->used[LM_CUDA_KV], c->used[LM_CUDA_WORKSPACE],
                       (int64_t)fr, (int64_t)tot};
  return LM_OK;
}

void lm_cuda_mem_report(lm_backend *be, char *buf, size_t n) {
  lm_cuda_mem m;
  if (lm_cuda_mem_get(be, &m)) {
    snprintf(buf, n, "device memory: %s", lm_errmsg());
    return;
  }
  snprintf(buf, n,
           "device %s: weights %.1f MiB, KV %.1f MiB, workspace %.1f MiB; free %.1f of %.1f MiB",
           lm_cuda_of(be)->name, (double)m.weights / MIB, (double)m.kv / MIB,
           (double)m.workspace / MIB, (double)m.free_bytes / MIB, (double)m.total_bytes / MIB);
}

void lm_cuda_set_plans(lm_backend *be, int on) {
  lm_cuda_ctx *c = lm_cuda_of(be);
  c->plans_on = on;
  if (!on) lm_cuda_plans_clear(c);
}

void lm_cuda_plan_stats(lm_backend *be, int64_t *uses, int64_t *builds) {
  lm_cuda_ctx *c = lm_cuda_of(be);
  if (uses) *uses = c->plan_uses;
  if (builds) *builds = c->plan_builds;
}

const char *lm_cuda_plan_error(lm_backend *be) { return lm_cuda_of(be)->plan_error; }

const lm_backend_ops *lm_cuda_base_ops(void) { return &lm_cuda_ops; }

static int cmp_f(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return x < y ? -1 : x > y;
}

/* Median over 7 timed passes (after 2 warm-ups) of `kind` (0: read, 1: copy) over 2 GiB. */
static lm_status bandwidth(lm_cuda_ctx *c, int kind, double *gbs) {
  size_t bytes = (size_t)2 << 30, half = bytes / 2;
  void *buf = NULL, *sink = NULL;
  cudaEvent_t e0 = NULL, e1 = NULL;
  float ms[7];
  lm_status s = lm_cuda_malloc(c, bytes, LM_CUDA_WORKSPACE, "bandwidth probe", &buf);
  if (!s)
    s = lm_cuda_malloc(c, (size_t)c->n_sms * 8 * sizeof(unsigned), LM_CUDA_WORKSPACE, "probe sink",
                       &sink);
  cudaError_t e = s ? cudaSuccess : cudaMemsetAsync(buf, 0x5a, bytes, c->stream);
  if (!s && e == cudaSuccess) e = cudaEventCreate(&e0);
  if (!s && e == cudaSuccess) e = cudaEventCreate(&e1);
  for (int i = 0; !s && e == cudaSuccess && i < 9; i++) {
    e = cudaEventRecord(e0, c->stream);
    if (e == cudaSuccess)
      e = kind ? cudaMemcpyAsync((char *)buf + half, buf, half, cudaMemcpyDeviceToDevice, c->stream)
               : lm_cu_read_kernel(c->ks, buf, bytes, sink, c->n_sms * 8);
    if (e == cudaSuccess) e = cudaEventRecord(e1, c->stream);
    if (e == cudaSuccess) e = cudaEventSynchronize(e1);
    if (e == cudaSuccess && i >= 2) e = cudaEventElapsedTime(&ms[i - 2], e0, e1);
  }
  if (!s && e != cudaSuccess) s = lm_cuda_fail(e, "bandwidth probe", __FILE__, __LINE__);
  if (e0) (void)cudaEventDestroy(e0);
  if (e1) (void)cudaEventDestroy(e1);
  lm_cuda_release(c, buf);
  lm_cuda_release(c, sink);
  if (s) return s;
  qsort(ms, 7, sizeof *ms, cmp_f);
  *gbs = (double)(kind ? 2 * half : bytes) / (ms[3] * 1e-3) / 1e9;
  return LM_OK;
}

double lm_cuda_read_bandwidth_gbs(lm_backend *be) {
  double g = 0;
  return bandwidth(lm_cuda_of(be), 0, &g) ? 0.0 : g;
}

double lm_cuda_copy_bandwidth_gbs(lm_backend *be) {
  double g = 0;
  return bandwidth(lm_cuda_of(be), 1, &g) ? 0.0 : g;
}
