/* cpu_attention.c — attention over a cache read in place plus the chunk being written, and
 * the append that commits the chunk afterwards. Gemma 4 eager attention (modeling_gemma4.py
 * eager_attention_forward): raw dot products (scaling 1.0), causal mask, sliding layers see
 * exactly `window` keys including the query, softmax in f32. The softmax is computed online
 * (one pass, running max and sum), so no [T, S] score matrix exists anywhere. */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"
#include "base/status.h"
#include "tensor/quant.h"

typedef struct attn_acc {
  float m, l; /* running max and sum of exp */
} attn_acc;

static inline void attn_step(attn_acc *st, float *acc, float s, const float *v, int hd) {
  if (s > st->m) {
    float r = expf(st->m - s); /* exp(-inf) = 0 on the first key */
    st->l *= r;
#pragma omp simd
    for (int d = 0; d < hd; d++)
      acc[d] *= r;
    st->m = s;
  }
  float p = expf(s - st->m);
  st->l += p;
#pragma omp simd
  for (int d = 0; d < hd; d++)
    acc[d] += p * v[d];
}

/* The simd reduction lets the compiler keep several partial sums (f32 order changes only). */
static inline float dot(const float *a, const float *b, int n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int i = 0; i < n; i++)
    s += a[i] * b[i];
  return s;
}

/* Row of head g of the key (or value) at `slot`, as f32: in place for plain caches, else
 * dequantized into buf (never a copy of the cache: one row at a time). */
static inline const float *kv_row(const lm_kv_cache *c, int which, int64_t slot, int g,
                                  float *buf) {
  int hd = c->head_dim;
  int64_t w = (int64_t)c->n_kv_heads * hd;
  if (!c->bits) return (const float *)(which ? c->v : c->k) + slot * w + (int64_t)g * hd;
  int64_t cb = lm_kv_row_bytes(c, LM_KV_K), sb = w / c->group;
  const uint8_t *codes =
      (const uint8_t *)(which ? c->v : c->k) + slot * cb + (int64_t)g * hd * c->bits / 8;
  const uint16_t *sc =
      (const uint16_t *)(which ? c->vs : c->ks) + slot * sb + (int64_t)g * hd / c->group;
  const uint16_t *bi =
      (const uint16_t *)(which ? c->vb : c->kb) + slot * sb + (int64_t)g * hd / c->group;
  lm_affine_dequant_row_bf16(codes, sc, bi, hd, c->bits, c->group, buf);
  return buf;
}

/* Query heads [r0, r1) of KV head g's group for token t, which share every key and value:
 * each key row is read (or dequantized) once for all of them. Keys: cache positions [lo, n),
 * then the chunk's tokens [c_lo, t] of the same sequence. */
static void attn_group(const lm_attn_args *a, const lm_kv_cache *c, int64_t t, int64_t t0, int g,
                       int r0, int r1, int32_t pos_t) {
  int hd = a->head_dim, nr = r1 - r0;
  int64_t p = c->n + (t - t0), lo = 0, c_lo = t0;
  if (a->window) {
    lo = p - a->window + 1 > 0 ? p - a->window + 1 : 0;
    c_lo = t - a->window + 1 > t0 ? t - a->window + 1 : t0;
  }
  int64_t first = lm_kv_first_held(c);
  if (lo < first) lo = first; /* cannot happen for a well-formed step; never read evicted slots */
  int group = a->n_heads / a->n_kv_heads;
  float *qw = lm_cpu_row(a->q, t) + ((int64_t)g * group + r0) * hd;
  if (a->q_rope) { /* a team's fused q norm: these heads, as the rmsnorm op with RoPE */
    for (int r = 0; r < nr; r++)
      lm_cpu_rmsnorm_row(qw + r * hd, qw + r * hd, a->q_norm ? a->q_norm->data : NULL, hd, a->q_eps,
                         0);
    lm_cpu_rope_token(qw, hd, nr, hd, pos_t, a->q_rope->data, 0);
  }
  const float *q = qw;
  float acc[nr * hd], kb[hd], vb[hd];
  attn_acc st[nr];
  memset(acc, 0, sizeof acc);
  for (int r = 0; r < nr; r++)
    st[r] = (attn_acc){-INFINITY, 0.0f};
  for (int64_t pos = lo; pos < c->n; pos++) {
    int64_t slot = lm_kv_slot(c, pos);
    const float *k = kv_row(c, 0, slot, g, kb), *v = kv_row(c, 1, slot, g, vb);
    for (int r = 0; r < nr; r++)
      attn_step(&st[r], acc + r * hd, dot(q + r * hd, k, hd) * a->scale, v, hd);
  }
  for (int64_t u = c_lo; u <= t; u++) {
    const float *k = lm_cpu_row(a->k_new, u) + (int64_t)g * hd,
                *v = lm_cpu_row(a->v_new, u) + (int64_t)g * hd;
    for (int r = 0; r < nr; r++)
      attn_step(&st[r], acc + r * hd, dot(q + r * hd, k, hd) * a->scale, v, hd);
  }
  float *o = lm_cpu_row(a->out, t) + ((int64_t)g * group + r0) * hd;
  for (int r = 0; r < nr; r++)
    for (int d = 0; d < hd; d++)
      o[r * hd + d] = acc[r * hd + d] / st[r].l;
}

/* Query head h uses KV head h / (n_heads / n_kv_heads) (repeat_kv), so the heads of one group
 * are contiguous in q and in the output. Work items are (token, KV head, slice of its group):
 * the group is cut into as many slices as it takes to give every thread work when there are few
 * tokens (decode on a model with one KV head), and kept whole when tokens are plenty. */
typedef struct attn_job {
  const lm_attn_args *a;
  const lm_batch *b;
  int group, slices;
} attn_job;

static void attn_item(void *arg, int64_t i) {
  const attn_job *j = arg;
  const lm_attn_args *a = j->a;
  const lm_batch *b = j->b;
  int64_t t = i / ((int64_t)a->n_kv_heads * j->slices);
  int g = (int)(i / j->slices % a->n_kv_heads), sl = (int)(i % j->slices);
  const lm_kv_cache *c = b->kv[b->seq[t]]->caches[a->cache];
  int64_t t0 = t - (b->pos[t] - c->n); /* first token of this sequence in the batch */
  attn_group(a, c, t, t0, g, j->group * sl / j->slices, j->group * (sl + 1) / j->slices, b->pos[t]);
}

lm_status lm_cpu_attention(lm_backend *be, const lm_attn_args *a) {
  int team = lm_cpu_in_team(be);
  if (a->q_rope && !team) return lm_attention_q_norm(be, a, lm_cpu_attention);
  const lm_batch *b = lm_cpu_batch(be);
  if (a->n_kv_heads <= 0 || a->n_heads % a->n_kv_heads)
    return LM_ERRF(LM_ERR_INVALID, "attention: %d heads over %d KV heads", a->n_heads,
                   a->n_kv_heads);
  if (a->q_rope) { /* the team applies the q norm per work item, to the heads it attends with */
    LM_TRY(lm_attention_q_norm_check(a));
    if (a->head_dim % 2 || a->q_rope->cols != a->head_dim / 2 ||
        (a->q_norm && a->q_norm->cols != a->head_dim))
      return LM_ERRF(LM_ERR_INVALID, "attention: q norm or RoPE does not match head dim %d",
                     a->head_dim);
  }
  int threads = team ? lm_cpu_team_of(be)->size : omp_get_max_threads();
  attn_job j = {.a = a, .b = b, .group = a->n_heads / a->n_kv_heads};
  int64_t base = (int64_t)b->n_tokens * a->n_kv_heads;
  j.slices = base >= threads ? 1 : (int)((threads + base - 1) / base);
  if (j.slices > j.group) j.slices = j.group;
  lm_cpu_team_run(lm_cpu_team_of(be), base * j.slices, 1, attn_item, &j);
  return LM_OK;
}

/* Byte offsets of the six arrays' rows inside a token's stage row (kv.h order). */
static void stage_offsets(const lm_kv_cache *c, int64_t off[LM_KV_ARRAYS]) {
  int64_t o = 0;
  for (int i = 0; i < LM_KV_ARRAYS; i++) {
    off[i] = o;
    o += lm_kv_row_bytes(c, i);
  }
}

typedef struct kv_call {
  lm_backend *be;
  const void *a;
} kv_call;

static lm_status kv_stage_here(lm_backend *be, const lm_kv_stage_args *a);
static lm_status kv_append_here(lm_backend *be, const lm_kv_append_args *a);

static lm_status kv_stage_call(void *arg) {
  kv_call *c = arg;
  return kv_stage_here(c->be, c->a);
}

static lm_status kv_append_call(void *arg) {
  kv_call *c = arg;
  return kv_append_here(c->be, c->a);
}

/* In a team, one thread stages and appends (a copy of a few rows) while the others wait. */
lm_status lm_cpu_kv_stage(lm_backend *be, const lm_kv_stage_args *a) {
  kv_call c = {be, a};
  return lm_cpu_team_solo(lm_cpu_team_of(be), 0, kv_stage_call, &c);
}

lm_status lm_cpu_kv_append(lm_backend *be, const lm_kv_append_args *a) {
  kv_call c = {be, a};
  return lm_cpu_team_solo(lm_cpu_team_of(be), 0, kv_append_call, &c);
}

static lm_status kv_stage_here(lm_backend *be, const lm_kv_stage_args *a) {
  const lm_batch *b = lm_cpu_batch(be);
  for (int32_t t = 0; t < b->n_tokens; t++) {
    const lm_kv_cache *c = b->kv[b->seq[t]]->caches[a->cache];
    if (!c->bits) continue;
    int64_t w = (int64_t)c->n_kv_heads * c->head_dim, off[LM_KV_ARRAYS];
    if (lm_kv_stage_row_bytes(c) > a->stage.cols)
      return LM_ERRF(LM_ERR_INVALID, "kv_stage: stage row too small");
    stage_offsets(c, off);
    uint8_t *row = (uint8_t *)a->stage.data + (int64_t)t * a->stage.ld;
    float *k = lm_cpu_row(a->k_new, t), *v = lm_cpu_row(a->v_new, t);
    lm_affine_quantize_row_bf16(k, w, c->bits, c->group, row + off[LM_KV_K],
                                (uint16_t *)(row + off[LM_KV_KS]),
                                (uint16_t *)(row + off[LM_KV_KB]), k);
    lm_affine_quantize_row_bf16(v, w, c->bits, c->group, row + off[LM_KV_V],
                                (uint16_t *)(row + off[LM_KV_VS]),
                                (uint16_t *)(row + off[LM_KV_VB]), v);
  }
  return LM_OK;
}

static lm_status kv_append_here(lm_backend *be, const lm_kv_append_args *a) {
  const lm_batch *b = lm_cpu_batch(be);
  for (int32_t t = 0; t < b->n_tokens; t++) {
    lm_kv_cache *c = b->kv[b->seq[t]]->caches[a->cache];
    int64_t kvw = (int64_t)c->n_kv_heads * c->head_dim, slot = lm_kv_slot(c, b->pos[t]);
    if (slot >= c->slots)
      return LM_ERRF(LM_ERR_STATE, "kv_append: position %d beyond the reserved %lld slots",
                     b->pos[t], (long long)c->slots);
    if (!c->bits) {
      memcpy((float *)c->k + slot * kvw, lm_cpu_row(a->k_new, t), (size_t)kvw * sizeof(float));
      memcpy((float *)c->v + slot * kvw, lm_cpu_row(a->v_new, t), (size_t)kvw * sizeof(float));
      continue;
    }
    int64_t off[LM_KV_ARRAYS];
    stage_offsets(c, off);
    const uint8_t *row = (const uint8_t *)a->stage.data + (int64_t)t * a->stage.ld;
    void *dst[LM_KV_ARRAYS] = {c->k, c->v, c->ks, c->kb, c->vs, c->vb};
    for (int i = 0; i < LM_KV_ARRAYS; i++) {
      int64_t rb = lm_kv_row_bytes(c, i);
      memcpy((uint8_t *)dst[i] + slot * rb, row + off[i], (size_t)rb);
    }
  }
  /* Positions advance only once every token is written (attention reads n as "past"). */
  for (int32_t t = 0; t < b->n_tokens; t++) {
    lm_kv_cache *c = b->kv[b->seq[t]]->caches[a->cache];
    if (b->pos[t] + 1 > c->n) c->n = b->pos[t] + 1;
  }
  return LM_OK;
}

static lm_status kv_convert_here(const lm_kv_convert_args *a);

static lm_status kv_convert_call(void *arg) { return kv_convert_here(arg); }

lm_status lm_cpu_kv_convert(lm_backend *be, const lm_kv_convert_args *a) {
  return lm_cpu_team_solo(lm_cpu_team_of(be), 0, kv_convert_call, (void *)a);
}

static lm_status kv_convert_here(const lm_kv_convert_args *a) {
  const lm_kv_cache *f = a->from;
  lm_kv_cache *t = a->to;
  int64_t w = (int64_t)f->n_kv_heads * f->head_dim, cb = lm_kv_row_bytes(t, LM_KV_K),
          sb = w / t->group;
  float tmp[w];
  for (int64_t pos = lm_kv_first_held(f); pos < f->n; pos++) {
    int64_t slot = lm_kv_slot(f, pos);
    memcpy(tmp, (const float *)f->k + slot * w, (size_t)w * sizeof(float));
    lm_affine_quantize_row_bf16(tmp, w, t->bits, t->group, (uint8_t *)t->k + slot * cb,
                                (uint16_t *)t->ks + slot * sb, (uint16_t *)t->kb + slot * sb, NULL);
    memcpy(tmp, (const float *)f->v + slot * w, (size_t)w * sizeof(float));
    lm_affine_quantize_row_bf16(tmp, w, t->bits, t->group, (uint8_t *)t->v + slot * cb,
                                (uint16_t *)t->vs + slot * sb, (uint16_t *)t->vb + slot * sb, NULL);
  }
  return LM_OK;
}
