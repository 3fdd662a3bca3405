/* forward.c — the Gemma 4 forward pass, written once against the backend op contract
 * (transformers 5.17 modeling_gemma4.py: Gemma4TextModel.forward and
 * Gemma4TextDecoderLayer.forward; gemma4-spec §2). Shapes in comments: T tokens of the step,
 * H hidden, nh heads, hd the layer's head dim, kvd = n_kv_heads*hd, I the layer's MLP width. */
#include "model/forward.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "model/lora.h"
#include "model/lora_bank.h"

typedef struct lm_forward_ws {
  lm_tensor x;            /* [T][H] residual stream */
  lm_tensor h;            /* [T][H] normed input of a block */
  lm_tensor a;            /* [T][H] block output before its post-norm */
  lm_tensor d;            /* [T][H] MLP output */
  lm_tensor q, o;         /* [T][nh*hd_max] queries, attention output */
  lm_tensor k, v;         /* [T][kvd_max] this layer's new keys/values */
  lm_tensor g, u;         /* [T][I_max] MLP gate/up */
  lm_tensor ple, ple_tok; /* [T][NL*Pd] per-layer inputs */
  lm_tensor pg;           /* [T][Pd] per-layer gate */
  lm_tensor z, moe_logits, moe_ids, moe_w, moe_out, moe_scratch, moe_iscratch;
  lm_tensor hl, logits; /* [n_logits][H], [n_logits][V] */
  lm_tensor next;       /* [n_logits][1] int32: greedy token of each logit row */
  lm_tensor *dk, *dv;   /* [n_caches]: persistent K/V of donors read by later (shared) layers */
  lm_tensor kst;        /* [T][stage bytes]: quantized-cache staging of k/v */
  lm_tensor *dst;       /* [n_caches]: staging of the donors' persistent K/V */
} lm_forward_ws;

struct lm_forward {
  const lm_model *m;
  lm_backend *be;
  int64_t max_tokens, max_logits;
  lm_forward_ws ws;
  void *arena;
  int64_t arena_bytes;
  int *has_sharers;      /* [n_caches] */
  lm_lora_bank *lora;    /* mounted adapters (created with the first), or NULL */
  uint64_t lora_variant; /* the step's (lm_lora_bank_begin): part of a captured plan's key */
};

typedef struct prep {
  lm_backend *be;
  void (*on_load)(void *ctx, int64_t done, int64_t total);
  void *ctx;
  int64_t done, total;
} prep;

static lm_status prepare_one(lm_weight *w, void *arg) {
  prep *p = arg;
  LM_TRY(p->be->ops->prepare_weight(p->be, w));
  p->done += lm_weight_bytes(w);
  if (p->on_load) p->on_load(p->ctx, p->done < p->total ? p->done : p->total, p->total);
  return LM_OK;
}

lm_status lm_model_prepare_progress(lm_model *m, lm_backend *be,
                                    void (*on_load)(void *ctx, int64_t done, int64_t total),
                                    void *ctx) {
  if (!be->ops->prepare_weight) return LM_OK; /* the backend reads weights in place */
  prep p = {.be = be, .on_load = on_load, .ctx = ctx, .total = m->weight_bytes};
  return lm_model_foreach_weight(m, prepare_one, &p);
}

lm_status lm_exchange_weight(lm_backend *be, lm_weight *w, lm_weight_payload *p) {
  if (be && be->ops->prepare_weight && !be->ops->refresh_weight)
    return LM_ERRF(LM_ERR_UNSUPPORTED,
                   "the %s backend keeps its own copy of the weights and cannot exchange one",
                   be->ops->name);
  lm_weight_payload_swap(w, p);
  lm_status s = be && be->ops->refresh_weight ? be->ops->refresh_weight(be, w) : LM_OK;
  if (s) lm_weight_payload_swap(w, p); /* the backend kept the old copy: so does w */
  return s;
}

lm_status lm_model_prepare(lm_model *m, lm_backend *be) {
  return lm_model_prepare_progress(m, be, NULL, NULL);
}

/* ---- workspace ---------------------------------------------------------------------------- */

typedef struct ws_plan {
  int64_t off; /* bytes carved so far */
  char *base;  /* NULL while sizing */
} ws_plan;

static lm_tensor ws_take(ws_plan *p, int64_t rows, int64_t cols, lm_dtype dt) {
  lm_tensor t = {.rows = rows, .cols = cols, .ld = cols, .dtype = dt};
  int64_t bytes = (rows * cols * (int64_t)lm_dtype_size(dt) + 63) & ~(int64_t)63;
  t.data = p->base ? p->base + p->off : NULL;
  p->off += bytes;
  return t;
}

static void ws_layout(const lm_model *m, int64_t T, int64_t NLg, lm_dtype act, ws_plan *p,
                      lm_forward_ws *w, const int *has_sharers) {
  const lm_model_config *c = &m->cfg;
  int64_t qd = 0, kvd = 0, I = 0;
  for (int64_t l = 0; l < c->n_layers; l++) {
    const lm_layer_config *L = &c->layers[l];
    qd = c->n_heads * L->head_dim > qd ? c->n_heads * L->head_dim : qd;
    kvd = (int64_t)L->n_kv_heads * L->head_dim > kvd ? (int64_t)L->n_kv_heads * L->head_dim : kvd;
    I = L->ffn_dim > I ? L->ffn_dim : I;
  }
  int64_t H = c->hidden, PL = c->n_layers * c->ple_dim;
  w->x = ws_take(p, T, H, act);
  w->h = ws_take(p, T, H, act);
  w->a = ws_take(p, T, H, act);
  w->d = ws_take(p, T, H, act);
  w->q = ws_take(p, T, qd, act);
  w->o = ws_take(p, T, qd, act);
  w->k = ws_take(p, T, kvd, act);
  w->v = ws_take(p, T, kvd, act);
  w->kst = ws_take(p, T, lm_kv_stage_row_bound(kvd), LM_DT_U8);
  w->g = ws_take(p, T, I, act);
  w->u = ws_take(p, T, I, act);
  if (PL) {
    w->ple = ws_take(p, T, PL, act);
    w->ple_tok = ws_take(p, T, PL, act);
    w->pg = ws_take(p, T, c->ple_dim, act);
  }
  if (c->moe) {
    int64_t E = c->n_experts, K = c->top_k;
    w->z = ws_take(p, T, H, act);
    w->moe_logits = ws_take(p, T, E, LM_DT_F32);
    w->moe_ids = ws_take(p, T, K, LM_DT_I32);
    w->moe_w = ws_take(p, T, K, LM_DT_F32);
    w->moe_out = ws_take(p, T, H, act);
    w->moe_scratch = ws_take(p, T * K, 2 * c->moe_dim + 2 * H, act);
    w->moe_iscratch = ws_take(p, 1, T * K + E + 1, LM_DT_I32);
  }
  w->hl = ws_take(p, NLg, H, act);
  w->logits = ws_take(p, NLg, c->vocab_size, LM_DT_F32);
  w->next = ws_take(p, NLg, 1, LM_DT_I32);
  for (int i = 0; i < c->n_caches; i++) {
    if (!has_sharers[i]) continue;
    const lm_layer_config *L = &c->layers[c->cache_layer[i]];
    w->dk[i] = ws_take(p, T, (int64_t)L->n_kv_heads * L->head_dim, act);
    w->dv[i] = ws_take(p, T, (int64_t)L->n_kv_heads * L->head_dim, act);
    w->dst[i] =
        ws_take(p, T, lm_kv_stage_row_bound((int64_t)L->n_kv_heads * L->head_dim), LM_DT_U8);
  }
}

static int *sharers_of(const lm_model *m) {
  int *hs = calloc((size_t)m->cfg.n_caches + 1, sizeof *hs);
  if (!hs) return NULL;
  for (int i = 0; i < m->cfg.n_caches; i++)
    hs[i] = m->last_reader[i] != m->cfg.cache_layer[i];
  return hs;
}

int64_t lm_forward_workspace_bytes(const lm_model *m, int64_t max_tokens, int64_t max_logits,
                                   lm_dtype act) {
  int *hs = sharers_of(m);
  if (!hs) return -1;
  lm_forward_ws w = {0};
  lm_tensor dk[m->cfg.n_caches + 1], dv[m->cfg.n_caches + 1], dst[m->cfg.n_caches + 1];
  w.dk = dk;
  w.dv = dv;
  w.dst = dst;
  ws_plan p = {0, NULL};
  ws_layout(m, max_tokens, max_logits, act, &p, &w, hs);
  free(hs);
  return p.off;
}

lm_status lm_forward_create(const lm_model *m, lm_backend *be, int64_t max_tokens,
                            int64_t max_logits, lm_forward **out) {
  *out = NULL;
  if (max_tokens <= 0 || max_logits <= 0 || max_logits > max_tokens)
    return LM_ERRF(LM_ERR_INVALID, "forward: need 0 < max_logits <= max_tokens (got %lld, %lld)",
                   (long long)max_logits, (long long)max_tokens);
  lm_forward *f = calloc(1, sizeof *f);
  if (!f) return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  f->m = m;
  f->be = be;
  f->max_tokens = max_tokens;
  f->max_logits = max_logits;
  int nc = m->cfg.n_caches;
  f->has_sharers = sharers_of(m);
  f->ws.dk = calloc((size_t)nc + 1, sizeof(lm_tensor));
  f->ws.dv = calloc((size_t)nc + 1, sizeof(lm_tensor));
  f->ws.dst = calloc((size_t)nc + 1, sizeof(lm_tensor));
  if (!f->has_sharers || !f->ws.dk || !f->ws.dv || !f->ws.dst) {
    lm_forward_free(f);
    return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  }
  ws_plan p = {0, NULL};
  ws_layout(m, max_tokens, max_logits, be->act_dtype, &p, &f->ws, f->has_sharers);
  f->arena_bytes = p.off;
  lm_status s = be->ops->alloc(be, (size_t)p.off, &f->arena);
  if (s) {
    lm_forward_free(f);
    return lm_err_prefix(s, "forward workspace for %lld tokens", (long long)max_tokens);
  }
  p = (ws_plan){0, f->arena};
  ws_layout(m, max_tokens, max_logits, be->act_dtype, &p, &f->ws, f->has_sharers);
  *out = f;
  return LM_OK;
}

static lm_status lora_bank(lm_forward *f) {
  return f->lora ? LM_OK : lm_lora_bank_create(f->m, f->be, f->max_tokens, &f->lora);
}

lm_status lm_forward_mount_adapter(lm_forward *f, int slot, lm_lora *l) {
  if (!l && !f->lora) return LM_OK;
  LM_TRY(lora_bank(f));
  return lm_lora_bank_mount(f->lora, slot, l);
}

lm_status lm_forward_default_adapters(lm_forward *f, const int *slots, int n) {
  if (n > LM_LORA_PICKS)
    return LM_ERRF(LM_ERR_INVALID, "%d adapters stacked (at most %d)", n, LM_LORA_PICKS);
  if (!n && !f->lora) return LM_OK;
  LM_TRY(lora_bank(f));
  lm_lora_bank_set_default(f->lora, slots, n);
  return LM_OK;
}

lm_status lm_forward_set_adapters(lm_forward *f, lm_lora *const *set, int n) {
  if (n > LM_LORA_PICKS)
    return LM_ERRF(LM_ERR_INVALID, "%d adapters stacked (at most %d)", n, LM_LORA_PICKS);
  int slots[LM_LORA_PICKS];
  for (int i = 0; f->lora && i < LM_ADAPTER_MOUNT_MAX; i++)
    LM_TRY(lm_lora_bank_mount(f->lora, i, NULL));
  for (int i = 0; i < n; i++) {
    LM_TRY(lm_forward_mount_adapter(f, i, set[i]));
    slots[i] = i;
  }
  return lm_forward_default_adapters(f, slots, n);
}

void lm_forward_free(lm_forward *f) {
  if (!f) return;
  if (f->be->ops->release_plans) f->be->ops->release_plans(f->be, f);
  lm_lora_bank_free(f->lora);
  if (f->arena) f->be->ops->free(f->be, f->arena);
  free(f->has_sharers);
  free(f->ws.dk);
  free(f->ws.dv);
  free(f->ws.dst);
  free(f);
}

void lm_model_kv_specs(const lm_model *m, lm_kv_spec *specs) {
  for (int i = 0; i < m->cfg.n_caches; i++) {
    const lm_layer_config *L = &m->cfg.layers[m->cfg.cache_layer[i]];
    specs[i] = (lm_kv_spec){
        .kind = L->type == LM_LAYER_SLIDING ? LM_KV_ROTATING_PLAIN : LM_KV_PLAIN,
        .n_kv_heads = L->n_kv_heads,
        .head_dim = L->head_dim,
        .window = L->type == LM_LAYER_SLIDING ? m->cfg.sliding_window : 0,
    };
  }
}

/* ---- batch validation (host side, before the step) ------------------------------------------- */

static lm_status check_batch(const lm_forward *f, const lm_batch *b) {
  const lm_model_config *c = &f->m->cfg;
  if (b->n_tokens <= 0 || b->n_tokens > f->max_tokens)
    return LM_ERRF(LM_ERR_INVALID, "batch of %d tokens (this forward takes 1..%lld)", b->n_tokens,
                   (long long)f->max_tokens);
  if (b->n_logits < 0 || b->n_logits > f->max_logits)
    return LM_ERRF(LM_ERR_INVALID, "batch asks for %d logit rows (max %lld)", b->n_logits,
                   (long long)f->max_logits);
  for (int32_t s = 0; s < b->n_seqs; s++)
    if (!b->kv[s] || b->kv[s]->n != c->n_caches)
      return LM_ERRF(LM_ERR_INVALID, "sequence %d: cache set does not match the model", s);
  for (int32_t t = 0; t < b->n_tokens; t++) {
    if (b->ids[t] < 0 || b->ids[t] >= c->vocab_size || (c->ple_dim && b->ids[t] >= c->ple_vocab))
      return LM_ERRF(LM_ERR_INVALID, "token %d: id %d is outside the vocabulary (%lld)", t,
                     b->ids[t], (long long)c->vocab_size);
    if (b->seq[t] < 0 || b->seq[t] >= b->n_seqs)
      return LM_ERRF(LM_ERR_INVALID, "token %d: sequence %d out of range", t, b->seq[t]);
    int cont = t > 0 && b->seq[t] == b->seq[t - 1];
    int64_t want = cont ? b->pos[t - 1] + 1 : lm_kv_set_len(b->kv[b->seq[t]]);
    if (b->pos[t] != want)
      return LM_ERRF(LM_ERR_INVALID,
                     "token %d: position %d, expected %lld (a sequence's tokens are contiguous and "
                     "continue its cache)",
                     t, b->pos[t], (long long)want);
    for (int32_t u = 0; !cont && u < t; u++)
      if (b->seq[u] == b->seq[t])
        return LM_ERRF(LM_ERR_INVALID, "sequence %d is split in the batch", b->seq[t]);
  }
  for (int32_t i = 0; i < b->n_logits; i++)
    if (b->logit_rows[i] < 0 || b->logit_rows[i] >= b->n_tokens)
      return LM_ERRF(LM_ERR_INVALID, "logit row %d out of range", b->logit_rows[i]);
  return LM_OK;
}

/* ---- the layers ------------------------------------------------------------------------------ */

static lm_tensor rows_of(lm_tensor t, int64_t n) { return lm_tensor_rows(t, 0, n); }

static lm_tensor stage_of(const lm_forward *f, int cache, int64_t T) {
  return rows_of(f->has_sharers[cache] ? f->ws.dst[cache] : f->ws.kst, T);
}

/* The LoRA paths of the n modules kinds[] of layer l reading x (io[i] NULL: none this step). */
static lm_status lora_shrink(lm_forward *f, int l, const lm_lora_kind *kinds, int n, lm_tensor x,
                             const lm_lora_io **io) {
  for (int i = 0; i < n; i++)
    io[i] = NULL;
  return f->lora ? lm_lora_bank_shrink(f->lora, l, kinds, n, x, io) : LM_OK;
}

/* h_ready: h already holds input_layernorm(x) (fused into the previous layer's last norm). */
static lm_status attention_block(lm_forward *f, int l, int64_t T, int h_ready) {
  const lm_model *m = f->m;
  const lm_layer_config *c = &m->cfg.layers[l];
  const lm_layer_weights *L = &m->layers[l];
  const lm_backend_ops *op = f->be->ops;
  lm_backend *be = f->be;
  lm_forward_ws *w = &f->ws;
  float eps = (float)m->cfg.rms_eps;
  int hd = c->head_dim, nh = (int)m->cfg.n_heads, nkv = c->n_kv_heads;
  lm_tensor x = rows_of(w->x, T), h = rows_of(w->h, T);
  lm_tensor q = lm_tensor_cols(rows_of(w->q, T), 0, (int64_t)nh * hd);
  lm_tensor o = lm_tensor_cols(rows_of(w->o, T), 0, (int64_t)nh * hd);
  q.ld = o.ld = (int64_t)nh * hd; /* contiguous, so per-head views reshape */
  const lm_weight *rope = &m->rope_inv[c->type];
  /* input_layernorm, then q_proj; q_norm (per head) and RoPE are the attention op's first step */
  if (!h_ready)
    LM_TRY(op->rmsnorm(be, &(lm_rmsnorm_args){.out = h, .x = x, .w = &L->ln_in, .eps = eps}));
  const lm_lora_io *lq[3];
  LM_TRY(lora_shrink(f, l, (const lm_lora_kind[]){LM_LORA_Q, LM_LORA_K, LM_LORA_V}, 3, h, lq));
  LM_TRY(op->matmul(be, &(lm_matmul_args){.out = q, .x = h, .w = &L->q, .lora = lq[0]}));
  int64_t kvd = (int64_t)nkv * hd;
  lm_tensor k = f->has_sharers[c->cache] ? w->dk[c->cache] : w->k;
  lm_tensor v = f->has_sharers[c->cache] ? w->dv[c->cache] : w->v;
  k = lm_tensor_cols(rows_of(k, T), 0, kvd);
  v = lm_tensor_cols(rows_of(v, T), 0, kvd);
  k.ld = v.ld = kvd;
  if (!c->kv_shared) { /* a KV-shared layer reuses its donor's K/V of this step */
    LM_TRY(op->matmul(be, &(lm_matmul_args){.out = k, .x = h, .w = &L->k, .lora = lq[1]}));
    if (c->k_eq_v) /* attention_k_eq_v: V is the RAW k_proj output, before k_norm and RoPE */
      LM_TRY(op->rmsnorm(be, &(lm_rmsnorm_args){.out = lm_tensor_reshape(v, hd),
                                                .x = lm_tensor_reshape(k, hd),
                                                .eps = eps}));
    else {
      LM_TRY(op->matmul(be, &(lm_matmul_args){.out = v, .x = h, .w = &L->v, .lora = lq[2]}));
      LM_TRY(op->rmsnorm(be, &(lm_rmsnorm_args){.out = lm_tensor_reshape(v, hd),
                                                .x = lm_tensor_reshape(v, hd),
                                                .eps = eps})); /* v_norm has no learned scale */
    }
    LM_TRY(op->rmsnorm(be, &(lm_rmsnorm_args){.out = lm_tensor_reshape(k, hd),
                                              .x = lm_tensor_reshape(k, hd),
                                              .w = &L->k_norm,
                                              .eps = eps,
                                              .rope = rope,
                                              .rope_heads = nkv}));
    /* a quantized cache: attention must read what the cache will store, chunk included */
    if (op->kv_stage)
      LM_TRY(op->kv_stage(
          be, &(lm_kv_stage_args){
                  .k_new = k, .v_new = v, .stage = stage_of(f, c->cache, T), .cache = c->cache}));
  }
  int64_t window = c->type == LM_LAYER_SLIDING ? m->cfg.sliding_window : 0;
  LM_TRY(op->attention(be, &(lm_attn_args){.out = o,
                                           .q = q,
                                           .k_new = k,
                                           .v_new = v,
                                           .cache = c->cache,
                                           .n_heads = nh,
                                           .n_kv_heads = nkv,
                                           .head_dim = hd,
                                           .window = window,
                                           .scale = 1.0f, /* Gemma 4: scaling = 1.0 */
                                           .q_norm = &L->q_norm,
                                           .q_rope = rope,
                                           .q_eps = eps}));
  lm_tensor a = rows_of(w->a, T);
  const lm_lora_io *lo;
  LM_TRY(lora_shrink(f, l, (const lm_lora_kind[]){LM_LORA_O}, 1, o, &lo));
  LM_TRY(op->matmul(be, &(lm_matmul_args){.out = a, .x = o, .w = &L->o, .lora = lo}));
  /* x = x + post_attention_layernorm(o_proj(...)); h = pre_feedforward_layernorm(x), fused */
  return op->rmsnorm(be, &(lm_rmsnorm_args){.x = a,
                                            .w = &L->ln_post_attn,
                                            .eps = eps,
                                            .residual = &x,
                                            .next_out = h,
                                            .next_w = &L->ln_pre_ff});
}

/* The routed experts, in parallel with the dense MLP; both read the same residual x. */
static lm_status moe_block(lm_forward *f, int l, int64_t T, lm_tensor d) {
  const lm_model *m = f->m;
  const lm_layer_weights *L = &m->layers[l];
  const lm_backend_ops *op = f->be->ops;
  lm_backend *be = f->be;
  lm_forward_ws *w = &f->ws;
  float eps = (float)m->cfg.rms_eps;
  lm_tensor x = rows_of(w->x, T), z = rows_of(w->z, T), h = rows_of(w->h, T),
            lg = rows_of(w->moe_logits, T);
  lm_tensor ids = rows_of(w->moe_ids, T), wt = rows_of(w->moe_w, T), mo = rows_of(w->moe_out, T);
  LM_TRY(op->rmsnorm(be, &(lm_rmsnorm_args){.out = d, .x = d, .w = &L->ln_post_ff1, .eps = eps}));
  /* Gemma4TextRouter reads the un-normed residual: norm(x) * scale * H^-0.5 → proj */
  LM_TRY(op->rmsnorm(be, &(lm_rmsnorm_args){.out = z, .x = x, .w = &L->router_scale, .eps = eps}));
  LM_TRY(op->matmul(be, &(lm_matmul_args){.out = lg, .x = z, .w = &L->router}));
  LM_TRY(op->moe_route(be, &(lm_moe_route_args){.ids = ids,
                                                .weights = wt,
                                                .logits = lg,
                                                .top_k = (int)m->cfg.top_k,
                                                .per_expert_scale = &L->expert_scale}));
  LM_TRY(op->rmsnorm(be, &(lm_rmsnorm_args){.out = h, .x = x, .w = &L->ln_pre_ff2, .eps = eps}));
  LM_TRY(op->moe_experts(be, &(lm_moe_experts_args){.out = mo,
                                                    .x = h,
                                                    .ids = ids,
                                                    .weights = wt,
                                                    .gate = &L->ex_gate,
                                                    .up = &L->ex_up,
                                                    .down = &L->ex_down,
                                                    .scratch = w->moe_scratch,
                                                    .iscratch = w->moe_iscratch}));
  /* hidden = post_feedforward_layernorm_1(mlp) + post_feedforward_layernorm_2(experts) */
  return op->rmsnorm(be,
                     &(lm_rmsnorm_args){.x = mo, .w = &L->ln_post_ff2, .eps = eps, .residual = &d});
}

/* The residual norm that ends a layer: x += norm(a) * w; then, fused, the layer scalar and the
 * next layer's input norm into h (when there is a next layer). */
static lm_status end_of_layer(lm_forward *f, int l, int64_t T, lm_tensor a, const lm_weight *w) {
  const lm_model *m = f->m;
  lm_tensor x = rows_of(f->ws.x, T), h = rows_of(f->ws.h, T);
  int last = l + 1 == m->cfg.n_layers;
  return f->be->ops->rmsnorm(f->be,
                             &(lm_rmsnorm_args){.x = a,
                                                .w = w,
                                                .eps = (float)m->cfg.rms_eps,
                                                .residual = &x,
                                                .scaled = 1,
                                                .scale = m->layers[l].layer_scalar,
                                                .next_out = last ? (lm_tensor){0} : h,
                                                .next_w = last ? NULL : &m->layers[l + 1].ln_in});
}

/* h holds pre_feedforward_layernorm(x) (fused into the attention block's last norm). */
static lm_status ffn_block(lm_forward *f, int l, int64_t T) {
  const lm_model *m = f->m;
  const lm_layer_weights *L = &m->layers[l];
  const lm_backend_ops *op = f->be->ops;
  lm_backend *be = f->be;
  lm_forward_ws *w = &f->ws;
  float eps = (float)m->cfg.rms_eps;
  int64_t I = m->cfg.layers[l].ffn_dim;
  lm_tensor x = rows_of(w->x, T), h = rows_of(w->h, T), d = rows_of(w->d, T);
  lm_tensor g = lm_tensor_cols(rows_of(w->g, T), 0, I), u = lm_tensor_cols(rows_of(w->u, T), 0, I);
  /* down(gelu_tanh(gate(h)) * up(h)): gate, up and the GeGLU are one op (g: its scratch) */
  const lm_lora_io *lg[2], *ld;
  LM_TRY(lora_shrink(f, l, (const lm_lora_kind[]){LM_LORA_GATE, LM_LORA_UP}, 2, h, lg));
  LM_TRY(op->matmul(be, &(lm_matmul_args){.out = u,
                                          .x = h,
                                          .w = &L->gate,
                                          .w2 = &L->up,
                                          .epilogue = LM_EPI_GLU_PAIR,
                                          .other = g,
                                          .lora = lg[0],
                                          .lora2 = lg[1]}));
  LM_TRY(lora_shrink(f, l, (const lm_lora_kind[]){LM_LORA_DOWN}, 1, u, &ld));
  LM_TRY(op->matmul(be, &(lm_matmul_args){.out = d, .x = u, .w = &L->down, .lora = ld}));
  if (m->cfg.moe) LM_TRY(moe_block(f, l, T, d));
  if (!m->cfg.ple_dim) return end_of_layer(f, l, T, d, &L->ln_post_ff);
  return op->rmsnorm(be,
                     &(lm_rmsnorm_args){.x = d, .w = &L->ln_post_ff, .eps = eps, .residual = &x});
}

/* Per-layer input: x += norm(proj(gelu(gate(x)) * ple[:, l])). */
static lm_status ple_block(lm_forward *f, int l, int64_t T) {
  const lm_model *m = f->m;
  const lm_layer_weights *L = &m->layers[l];
  const lm_backend_ops *op = f->be->ops;
  lm_backend *be = f->be;
  lm_forward_ws *w = &f->ws;
  int64_t P = m->cfg.ple_dim;
  lm_tensor x = rows_of(w->x, T), pg = rows_of(w->pg, T), a = rows_of(w->a, T);
  lm_tensor pl = lm_tensor_cols(rows_of(w->ple, T), (int64_t)l * P, P);
  const lm_lora_io *lpg, *lpp;
  LM_TRY(lora_shrink(f, l, (const lm_lora_kind[]){LM_LORA_PLE_GATE}, 1, x, &lpg));
  LM_TRY(op->matmul(be, &(lm_matmul_args){.out = pg,
                                          .x = x,
                                          .w = &L->ple_gate,
                                          .epilogue = LM_EPI_GLU_SELF,
                                          .other = pl,
                                          .lora = lpg}));
  LM_TRY(lora_shrink(f, l, (const lm_lora_kind[]){LM_LORA_PLE_PROJ}, 1, pg, &lpp));
  LM_TRY(op->matmul(be, &(lm_matmul_args){.out = a, .x = pg, .w = &L->ple_proj, .lora = lpp}));
  return end_of_layer(f, l, T, a, &L->ln_post_ple);
}

/* Gemma4TextModel.get_per_layer_inputs + project_per_layer_inputs, once per step:
 * ple = (norm(x0 · W_plmp * H^-0.5) + E_ple[ids] * sqrt(Pd)) * 2^-0.5, x0 the SCALED embedding. */
static lm_status ple_inputs(lm_forward *f, int64_t T, float emb_round) {
  const lm_model *m = f->m;
  const lm_backend_ops *op = f->be->ops;
  lm_backend *be = f->be;
  lm_forward_ws *w = &f->ws;
  lm_tensor x = rows_of(w->x, T), ple = rows_of(w->ple, T), tok = rows_of(w->ple_tok, T);
  float s_ple = (float)sqrt((double)m->cfg.ple_dim);
  if (emb_round) s_ple = lm_round_bf16(s_ple);
  LM_TRY(op->embed(be, &(lm_embed_args){.out = tok, .table = &m->embed_ple, .scale = s_ple}));
  LM_TRY(op->matmul(be, &(lm_matmul_args){.out = ple, .x = x, .w = &m->ple_model_proj}));
  LM_TRY(op->add(
      be,
      &(lm_add_args){.out = ple, .a = ple, .scale = (float)(1.0 / sqrt((double)m->cfg.hidden))}));
  lm_tensor pv = lm_tensor_reshape(ple, m->cfg.ple_dim);
  LM_TRY(op->rmsnorm(
      be, &(lm_rmsnorm_args){.out = pv, .x = pv, .w = &m->ple_norm, .eps = (float)m->cfg.rms_eps}));
  return op->add(be,
                 &(lm_add_args){.out = ple, .a = ple, .b = tok, .scale = (float)(1.0 / sqrt(2.0))});
}

static lm_status commit_caches(lm_forward *f, int l, int64_t T) {
  const lm_model *m = f->m;
  for (int c = 0; c < m->cfg.n_caches; c++) {
    if (m->last_reader[c] != l) continue;
    const lm_layer_config *L = &m->cfg.layers[m->cfg.cache_layer[c]];
    int64_t kvd = (int64_t)L->n_kv_heads * L->head_dim;
    lm_tensor k = f->has_sharers[c] ? f->ws.dk[c] : f->ws.k,
              v = f->has_sharers[c] ? f->ws.dv[c] : f->ws.v;
    k = lm_tensor_cols(rows_of(k, T), 0, kvd);
    v = lm_tensor_cols(rows_of(v, T), 0, kvd);
    k.ld = v.ld = kvd;
    LM_TRY(f->be->ops->kv_append(
        f->be,
        &(lm_kv_append_args){.k_new = k, .v_new = v, .stage = stage_of(f, c, T), .cache = c}));
  }
  return LM_OK;
}

static lm_status run_layers(lm_forward *f, const lm_batch *b, int greedy) {
  const lm_model *m = f->m;
  const lm_backend_ops *op = f->be->ops;
  lm_backend *be = f->be;
  int64_t T = b->n_tokens;
  int bf16 = be->act_dtype == LM_DT_BF16 || be->precision == LM_PRECISION_BF16;
  lm_tensor x = rows_of(f->ws.x, T);
  /* embed_tokens * sqrt(H): the scale is cast to the weight dtype first (bf16(sqrt(H)) in a
   * bf16 model); the f32 parity path uses the f32 value, as the f32 reference does. */
  float s_emb = (float)sqrt((double)m->cfg.hidden);
  LM_TRY(op->embed(be, &(lm_embed_args){.out = x,
                                        .table = &m->embed,
                                        .scale = bf16 ? lm_round_bf16(s_emb) : s_emb}));
  if (m->cfg.ple_dim) LM_TRY(ple_inputs(f, T, bf16));
  for (int l = 0; l < m->cfg.n_layers; l++) {
    /* every layer but the first finds h = input_layernorm(x) made by its predecessor's last
     * norm, which also applied the layer_scalar (it multiplies the whole residual stream) */
    LM_TRY(attention_block(f, l, T, l > 0));
    LM_TRY(ffn_block(f, l, T));
    if (m->cfg.ple_dim) LM_TRY(ple_block(f, l, T));
    LM_TRY(commit_caches(f, l, T));
  }
  if (!b->n_logits) return LM_OK;
  /* final norm on the wanted rows, tied LM head, softcap */
  lm_tensor hl = rows_of(f->ws.hl, b->n_logits), lg = rows_of(f->ws.logits, b->n_logits);
  LM_TRY(op->gather_logit_rows(be, &(lm_gather_args){.out = hl, .x = x}));
  LM_TRY(op->rmsnorm(
      be,
      &(lm_rmsnorm_args){.out = hl, .x = hl, .w = &m->final_norm, .eps = (float)m->cfg.rms_eps}));
  LM_TRY(op->matmul(be, &(lm_matmul_args){.out = lg, .x = hl, .w = &m->embed}));
  if (m->cfg.final_softcap > 0)
    LM_TRY(op->softcap(be, &(lm_softcap_args){.x = lg, .cap = (float)m->cfg.final_softcap}));
  if (greedy)
    LM_TRY(op->argmax(be, &(lm_argmax_args){.ids = rows_of(f->ws.next, b->n_logits), .x = lg}));
  return LM_OK;
}

typedef struct step_call {
  lm_forward *f;
  const lm_batch *b;
  int greedy;
} step_call;

static lm_status issue_step(void *arg) {
  step_call *c = arg;
  return run_layers(c->f, c->b, c->greedy);
}

/* One step; the backend may replay a captured plan of it (run_step). */
static lm_status forward_step(lm_forward *f, const lm_batch *b, float *logits_out,
                              int32_t *ids_out) {
  LM_TRY(check_batch(f, b));
  for (int32_t s = 0; s < b->n_seqs; s++) {
    int32_t n = 0;
    for (int32_t t = 0; t < b->n_tokens; t++)
      n += b->seq[t] == s;
    LM_TRY(lm_kv_set_reserve(b->kv[s], n));
  }
  lm_backend *be = f->be;
  f->lora_variant = 0;
  if (f->lora) LM_TRY(lm_lora_bank_begin(f->lora, b, &f->lora_variant));
  LM_TRY(be->ops->begin_step(be, b));
  step_call call = {f, b, ids_out != NULL && b->n_logits > 0};
  lm_status s = be->ops->run_step ? be->ops->run_step(be, &(lm_step_fn){.issue = issue_step,
                                                                        .arg = &call,
                                                                        .owner = f,
                                                                        .batch = b,
                                                                        .flags = call.greedy,
                                                                        .variant = f->lora_variant})
                                  : issue_step(&call);
  lm_status e = be->ops->end_step(be);
  if (s) return s;
  if (e) return e;
  if (logits_out && b->n_logits)
    LM_TRY(be->ops->download(be, logits_out, f->ws.logits.data,
                             (size_t)b->n_logits * (size_t)f->m->cfg.vocab_size * sizeof(float)));
  if (call.greedy)
    LM_TRY(be->ops->download(be, ids_out, f->ws.next.data, (size_t)b->n_logits * sizeof(int32_t)));
  return LM_OK;
}

lm_status lm_forward_run(lm_forward *f, const lm_batch *b, float *logits_out) {
  return forward_step(f, b, logits_out, NULL);
}

lm_status lm_forward_run_greedy(lm_forward *f, const lm_batch *b, float *logits_out,
                                int32_t *ids_out) {
  return forward_step(f, b, logits_out, ids_out);
}

/* Feeds ids[0..n) in steps; each step's logits (when out or fn wants them) go to out, or stay
 * on the backend for fn. */
static lm_status feed(lm_forward *f, lm_kv_set *kv, const int32_t *ids, int64_t n, int64_t step,
                      float *out, lm_forward_rows_fn fn, void *ctx) {
  int logits = out || fn;
  if (step < 1 || step > f->max_tokens || (logits && step > f->max_logits))
    return LM_ERRF(LM_ERR_INVALID, "feed: step %lld does not fit this forward (max %lld tokens)",
                   (long long)step, (long long)f->max_tokens);
  int32_t pos[step], seq[step], rows[step];
  int64_t V = f->m->cfg.vocab_size;
  for (int64_t i = 0; i < n; i += step) {
    int32_t m = (int32_t)(n - i < step ? n - i : step);
    for (int32_t j = 0; j < m; j++) {
      pos[j] = (int32_t)(lm_kv_set_len(kv) + j);
      seq[j] = 0;
      rows[j] = j;
    }
    lm_batch b = {.n_tokens = m,
                  .ids = ids + i,
                  .pos = pos,
                  .seq = seq,
                  .n_seqs = 1,
                  .kv = &kv,
                  .n_logits = logits ? m : 0,
                  .logit_rows = rows};
    LM_TRY(lm_forward_run(f, &b, out ? out + i * V : NULL));
    if (fn) LM_TRY(fn(ctx, i, rows_of(f->ws.logits, m)));
  }
  return LM_OK;
}

lm_status lm_forward_feed(lm_forward *f, lm_kv_set *kv, const int32_t *ids, int64_t n, int64_t step,
                          float *out) {
  return feed(f, kv, ids, n, step, out, NULL, NULL);
}

lm_status lm_forward_feed_rows(lm_forward *f, lm_kv_set *kv, const int32_t *ids, int64_t n,
                               int64_t step, lm_forward_rows_fn fn, void *ctx) {
  return feed(f, kv, ids, n, step, NULL, fn, ctx);
}
