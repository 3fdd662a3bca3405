/* cpu_attention.c — attention over a cache read in place plus the chunk being written, and
 * the append that commits the chunk afterwards. Gemma 4 eager attention (modeling_gemma4.py
 * eager_attention_forward): raw dot products (scaling 1.0), causal mask, sliding layers see
 * exactly `window` keys including the query, softmax in f32. The softmax is computed online
 * over tiles of keys (one pass, running max and sum; cpu_vec.h's loops), so no [T, S] score
 * matrix exists anywhere. A TurboQuant cache (kv:turboquant) is read the same way, a tile of
 * rows at a time: keys dequantized, values decoded only to the rotated domain; since the output
 * is a weighted sum of value rows, it is un-rotated once per query head when it is stored. */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"
#include "base/status.h"
#include "tensor/quant.h"

/* Keys are taken in tiles of this many positions, aligned to multiples of it: a query's tiles
 * depend only on the positions it sees, never on which of them sit in the cache and which
 * in the chunk being written, so a row decoded alone and the same row in a batch agree. */
#define ATTN_TILE 32
/* ... and segments of this many, each an online softmax of its own, merged in order: the unit
 * a team can share among its threads when a step has fewer queries than threads. */
#define ATTN_SEG 256

/* TurboQuant row of head g at `slot` into buf: the key dequantized, the value as
 * centroid * scale, still rotated (attn_store un-rotates the output). */
static const float *tq_row(const lm_kv_cache *c, int which, int64_t slot, int g, float *buf) {
  const lm_tq_params *p = &c->tq;
  int64_t ng = lm_tq_groups(p), sb = (int64_t)c->n_kv_heads * ng;
  const uint16_t *sc = (const uint16_t *)(which ? c->vs : c->ks) + slot * sb + g * ng;
  if (which) {
    const uint8_t *codes =
        (const uint8_t *)c->v + slot * lm_kv_row_bytes(c, LM_KV_V) + g * lm_tq_value_code_bytes(p);
    lm_tq_value_decode_rot(p, codes, sc, buf);
  } else {
    const uint8_t *codes =
        (const uint8_t *)c->k + slot * lm_kv_row_bytes(c, LM_KV_K) + g * lm_tq_key_code_bytes(p);
    lm_tq_key_decode(p, codes, sc, (const uint16_t *)c->kb + slot * sb + g * ng, buf);
  }
  return buf;
}

/* Row of head g of the key (or value) at `slot`, as f32: in place for plain caches, else
 * dequantized into buf (never a copy of the cache: one row at a time). */
static inline const float *kv_row(const lm_kv_cache *c, int which, int64_t slot, int g,
                                  float *buf) {
  int hd = c->head_dim;
  int64_t w = (int64_t)c->n_kv_heads * hd;
  if (lm_kv_kind_tq(c->kind)) return tq_row(c, which, slot, g, buf);
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

/* One (token, KV head) of a call: where its keys come from and which positions it sees. */
typedef struct attn_view {
  const lm_attn_args *a;
  const lm_kv_cache *c;
  int64_t t, t0; /* the token's row, its sequence's first row in the batch */
  int64_t lo, p; /* positions [lo, p] */
  int g;
} attn_view;

static attn_view attn_view_of(const lm_attn_args *a, const lm_batch *b, int64_t t, int g) {
  const lm_kv_cache *c = b->kv[b->seq[t]]->caches[a->cache];
  attn_view w = {.a = a, .c = c, .t = t, .t0 = t - (b->pos[t] - c->n), .g = g};
  w.p = c->n + (t - w.t0);
  w.lo = a->window && w.p - a->window + 1 > 0 ? w.p - a->window + 1 : 0;
  int64_t first = lm_kv_first_held(c);
  if (w.lo < first)
    w.lo = first; /* cannot happen for a well-formed step; never read evicted slots */
  return w;
}

/* Asks for the n key and value rows from position p0 on ahead of their tile: each tile's
 * rows are short streams the hardware prefetchers barely start on. */
static void tile_prefetch(const attn_view *w, int64_t p0, int64_t n) {
  const lm_attn_args *a = w->a;
  const lm_kv_cache *c = w->c;
  int64_t hd = a->head_dim;
  /* bytes of one head's K and V row in the cache (turboquant's widths differ) */
  int64_t kbytes = c->bits ? lm_kv_row_bytes(c, LM_KV_K) / c->n_kv_heads : hd * 4,
          vbytes = c->bits ? lm_kv_row_bytes(c, LM_KV_V) / c->n_kv_heads : hd * 4;
  for (int64_t pos = p0; pos < p0 + n; pos++) {
    const char *k, *v;
    int64_t kb = hd * 4, vb = hd * 4;
    if (pos < c->n) {
      int64_t slot = lm_kv_slot(c, pos);
      kb = kbytes, vb = vbytes;
      k = (const char *)c->k + (slot * c->n_kv_heads + w->g) * kb;
      v = (const char *)c->v + (slot * c->n_kv_heads + w->g) * vb;
    } else {
      k = (const char *)(lm_cpu_row(a->k_new, w->t0 + (pos - c->n)) + w->g * hd);
      v = (const char *)(lm_cpu_row(a->v_new, w->t0 + (pos - c->n)) + w->g * hd);
    }
    for (int64_t o = 0; o < kb; o += 64)
      __builtin_prefetch(k + o);
    for (int64_t o = 0; o < vb; o += 64)
      __builtin_prefetch(v + o);
  }
}

/* Segments of the positions [lo, p]: [ATTN_SEG·i, ATTN_SEG·(i+1)) clipped to them. */
static int64_t attn_seg0(const attn_view *w) { return w->lo / ATTN_SEG; }
static int64_t attn_nseg(const attn_view *w) { return w->p / ATTN_SEG - w->lo / ATTN_SEG + 1; }

/* The normalized, rotated query heads [r0, r1) of the view's group, in place (the team's
 * fused q norm: these heads, as the rmsnorm op with RoPE). */
static float *attn_query(const attn_view *w, int r0, int r1, int prep) {
  const lm_attn_args *a = w->a;
  int hd = a->head_dim, group = a->n_heads / a->n_kv_heads;
  float *q = lm_cpu_row(a->q, w->t) + ((int64_t)w->g * group + r0) * hd;
  if (prep && a->q_rope) {
    for (int r = 0; r < r1 - r0; r++)
      lm_cpu_rmsnorm_row(q + r * hd, q + r * hd, a->q_norm ? a->q_norm->data : NULL, hd, a->q_eps,
                         0);
    lm_cpu_rope_token(q, hd, r1 - r0, hd, (int32_t)w->p, a->q_rope->data, 0);
  }
  return q;
}

/* The online softmax of nr heads (queries q, hd apart) over segment `seg` of the view:
 * part[r] = {max, Σ exp, Σ exp·v} (stride hd + 2), from scratch. */
static void attn_segment(const lm_cpu_vec *vk, const attn_view *w, const float *q, int nr,
                         int64_t seg, float *part) {
  const lm_attn_args *a = w->a;
  const lm_kv_cache *c = w->c;
  int hd = a->head_dim;
  int64_t ps = (hd + 2), s0 = seg * ATTN_SEG, s1 = s0 + ATTN_SEG;
  if (s0 < w->lo) s0 = w->lo;
  if (s1 > w->p + 1) s1 = w->p + 1;
  float s[ATTN_TILE], s2[ATTN_TILE], bufs[c->bits ? 2 * ATTN_TILE * hd : 1];
  const float *k[ATTN_TILE], *v[ATTN_TILE];
  for (int r = 0; r < nr; r++) {
    part[r * ps] = -INFINITY;
    part[r * ps + 1] = 0.0f;
    memset(part + r * ps + 2, 0, (size_t)hd * sizeof(float));
  }
  for (int64_t p0 = s0; p0 < s1;) {
    int64_t p1 = (p0 / ATTN_TILE + 1) * ATTN_TILE;
    if (p1 > s1) p1 = s1;
    int n = (int)(p1 - p0);
    for (int j = 0; j < n; j++) {
      int64_t pos = p0 + j;
      if (pos < c->n) {
        int64_t slot = lm_kv_slot(c, pos);
        k[j] = kv_row(c, 0, slot, w->g, bufs + 2 * j * hd);
        v[j] = kv_row(c, 1, slot, w->g, bufs + (2 * j + 1) * hd);
      } else {
        int64_t u = w->t0 + (pos - c->n);
        k[j] = lm_cpu_row(a->k_new, u) + (int64_t)w->g * hd;
        v[j] = lm_cpu_row(a->v_new, u) + (int64_t)w->g * hd;
      }
    }
    if (p1 <= w->p) tile_prefetch(w, p1, w->p + 1 - p1 < ATTN_TILE ? w->p + 1 - p1 : ATTN_TILE);
    int r = 0;
    if (vk->dots2 && vk->axpys2)
      for (; r + 2 <= nr; r += 2) { /* two heads at a time: each key row read once for both */
        float *st = part + r * ps, *su = st + ps;
        vk->dots2(q + r * hd, q + (r + 1) * hd, k, n, hd, a->scale, s, s2);
        float rf = vk->softmax_tile(s, n, &st[0], &st[1]),
              rg = vk->softmax_tile(s2, n, &su[0], &su[1]);
        vk->axpys2(st + 2, rf, s, su + 2, rg, s2, v, n, hd);
      }
    for (; r < nr; r++) {
      float *st = part + r * ps;
      vk->dots(q + r * hd, k, n, hd, a->scale, s);
      float rf = vk->softmax_tile(s, n, &st[0], &st[1]);
      vk->axpys(st + 2, rf, s, v, n, hd);
    }
    p0 = p1;
  }
}

/* acc ⊕= part for nr heads: both rescaled to the larger max, then added (a running merge,
 * segment after segment; a first merge into {-inf, 0, 0} copies part exactly). */
static void attn_merge(const lm_cpu_vec *vk, float *acc, const float *part, int nr, int hd) {
  int64_t ps = hd + 2;
  for (int r = 0; r < nr; r++) {
    float *x = acc + r * ps;
    const float *y = part + r * ps;
    float m = x[0] > y[0] ? x[0] : y[0], ra = x[0], rb = y[0];
    vk->exps(&ra, 1, m);
    vk->exps(&rb, 1, m);
    x[0] = m;
    x[1] = x[1] * ra + y[1] * rb;
    const float *yv = y + 2;
    vk->axpys(x + 2, ra, &rb, &yv, 1, hd);
  }
}

static void attn_init(float *acc, int nr, int hd) {
  for (int r = 0; r < nr; r++) {
    acc[r * (hd + 2)] = -INFINITY;
    acc[r * (hd + 2) + 1] = 0.0f;
    memset(acc + r * (hd + 2) + 2, 0, (size_t)hd * sizeof(float));
  }
}

/* The normalized output rows; a turboquant cache's values were summed in the rotated domain,
 * so each row is un-rotated here, once (InvFWHT(Σ wᵢ v̂ᵢ) = Σ wᵢ InvFWHT(v̂ᵢ)). */
static void attn_store(const attn_view *w, const float *acc, int r0, int nr) {
  const lm_attn_args *a = w->a;
  int hd = a->head_dim, group = a->n_heads / a->n_kv_heads;
  float *o = lm_cpu_row(a->out, w->t) + ((int64_t)w->g * group + r0) * hd;
  for (int r = 0; r < nr; r++) {
    for (int d = 0; d < hd; d++)
      o[r * hd + d] = acc[r * (hd + 2) + 2 + d] / acc[r * (hd + 2) + 1];
    if (lm_kv_kind_tq(w->c->kind)) lm_tq_unrotate(&w->c->tq, o + r * hd);
  }
}

/* Query heads [r0, r1) of the view's group, segment after segment on this thread. They share
 * every key and value: each key row is read (or dequantized) once for all of them. */
static void attn_heads(const lm_cpu_vec *vk, const attn_view *w, int r0, int r1) {
  int hd = w->a->head_dim, nr = r1 - r0;
  const float *q = attn_query(w, r0, r1, 1);
  float acc[nr * (hd + 2)], part[nr * (hd + 2)];
  attn_init(acc, nr, hd);
  for (int64_t i = 0, s0 = attn_seg0(w), n = attn_nseg(w); i < n; i++) {
    attn_segment(vk, w, q, nr, s0 + i, part);
    attn_merge(vk, acc, part, nr, hd);
  }
  attn_store(w, acc, r0, nr);
}

/* Query head h uses KV head h / (n_heads / n_kv_heads) (repeat_kv), so the heads of one group
 * are contiguous in q and in the output. Work items are (token, KV head, slice of its group):
 * the group is cut into as many slices as it takes to give every thread work when there are
 * few tokens, and kept whole when tokens are plenty. A team with fewer (token, KV head) pairs
 * than threads (decode on a model with few KV heads) splits the keys instead: every segment of
 * every pair is an item writing its part to the backend's scratch, merged in order after, so
 * each key is read by one thread and the result is the bits of the sequential loop. */
typedef struct attn_job {
  const lm_cpu_vec *vk;
  const lm_attn_args *a;
  const lm_batch *b;
  int group, slices;
  int64_t segs; /* split: segment items per (token, KV head) */
  float *parts; /* split: [pair][segs][group][hd + 2] */
} attn_job;

static void attn_item(void *arg, int64_t i) {
  const attn_job *j = arg;
  int64_t pair = i / j->slices;
  int sl = (int)(i % j->slices);
  attn_view w = attn_view_of(j->a, j->b, pair / j->a->n_kv_heads, (int)(pair % j->a->n_kv_heads));
  attn_heads(j->vk, &w, j->group * sl / j->slices, j->group * (sl + 1) / j->slices);
}

static float *split_part(const attn_job *j, int64_t pair, int64_t i) {
  return j->parts + (pair * j->segs + i) * j->group * (j->a->head_dim + 2);
}

static void split_query(void *arg, int64_t pair) {
  const attn_job *j = arg;
  attn_view w = attn_view_of(j->a, j->b, pair / j->a->n_kv_heads, (int)(pair % j->a->n_kv_heads));
  attn_query(&w, 0, j->group, 1);
}

static void split_segment(void *arg, int64_t i) {
  const attn_job *j = arg;
  int64_t pair = i / j->segs, k = i % j->segs;
  attn_view w = attn_view_of(j->a, j->b, pair / j->a->n_kv_heads, (int)(pair % j->a->n_kv_heads));
  if (k >= attn_nseg(&w)) return;
  attn_segment(j->vk, &w, attn_query(&w, 0, j->group, 0), j->group, attn_seg0(&w) + k,
               split_part(j, pair, k));
}

static void split_merge(void *arg, int64_t pair) {
  const attn_job *j = arg;
  int hd = j->a->head_dim;
  attn_view w = attn_view_of(j->a, j->b, pair / j->a->n_kv_heads, (int)(pair % j->a->n_kv_heads));
  float acc[j->group * (hd + 2)];
  attn_init(acc, j->group, hd);
  for (int64_t k = 0, n = attn_nseg(&w); k < n; k++)
    attn_merge(j->vk, acc, split_part(j, pair, k), j->group, hd);
  attn_store(&w, acc, 0, j->group);
}

/* Segments per pair when the team should split the keys and the scratch holds their parts;
 * 0 otherwise. */
static int64_t split_segs(lm_backend *be, const attn_job *j, int64_t pairs, int threads) {
  if (!lm_cpu_in_team(be) || pairs >= threads) return 0;
  int64_t segs = 0;
  for (int64_t t = 0; t < j->b->n_tokens; t++) {
    attn_view w = attn_view_of(j->a, j->b, t, 0);
    if (attn_nseg(&w) > segs) segs = attn_nseg(&w);
  }
  if (segs < 2) return 0;
  size_t need = (size_t)(pairs * segs * j->group) * (size_t)(j->a->head_dim + 2);
  return need <= LM_CPU_ATTN_PARTS ? segs : 0;
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
  attn_job j = {.vk = lm_cpu_vec_of(be), .a = a, .b = b, .group = a->n_heads / a->n_kv_heads};
  int64_t base = (int64_t)b->n_tokens * a->n_kv_heads;
  j.slices = base >= threads ? 1 : (int)((threads + base - 1) / base);
  if (j.slices > j.group) j.slices = j.group;
  int64_t segs = split_segs(be, &j, base, threads);
  if (segs) {
    lm_cpu_team *tm = lm_cpu_team_of(be);
    j.segs = segs;
    j.parts = ((lm_cpu_ctx *)be->ctx)->attn_parts;
    lm_cpu_team_run(tm, base, 0, split_query, &j);
    lm_cpu_team_run(tm, base * segs, 0, split_segment, &j);
    lm_cpu_team_run(tm, base, 0, split_merge, &j);
    return LM_OK;
  }
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

/* A token's turboquant row, head by head: its codes into the stage row, and k / v replaced by
 * what a reader of the cache sees, the keys dequantized and the values still rotated (so the
 * chunk's own queries accumulate them in the domain the cache's values are in). */
static void tq_stage_row(const lm_kv_cache *c, uint8_t *row, const int64_t *off, float *k,
                         float *v) {
  const lm_tq_params *p = &c->tq;
  int64_t ng = lm_tq_groups(p), kc = lm_tq_key_code_bytes(p), vc = lm_tq_value_code_bytes(p);
  for (int g = 0; g < c->n_kv_heads; g++) {
    uint8_t *kcodes = row + off[LM_KV_K] + g * kc, *vcodes = row + off[LM_KV_V] + g * vc;
    uint16_t *ks = (uint16_t *)(row + off[LM_KV_KS]) + g * ng,
             *kz = (uint16_t *)(row + off[LM_KV_KB]) + g * ng,
             *vs = (uint16_t *)(row + off[LM_KV_VS]) + g * ng;
    float *kh = k + (int64_t)g * p->d, *vh = v + (int64_t)g * p->d;
    lm_tq_key_encode(p, kh, kcodes, ks, kz);
    lm_tq_key_decode(p, kcodes, ks, kz, kh);
    lm_tq_value_encode(p, vh, vcodes, vs);
    lm_tq_value_decode_rot(p, vcodes, vs, vh);
  }
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
    if (lm_kv_kind_tq(c->kind)) {
      tq_stage_row(c, row, off, k, v);
      continue;
    }
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
      if (!rb) continue; /* turboquant has no sixth array */
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
  if (!lm_kv_kind_quant(t->kind)) /* only the affine kinds are ever delayed (kv_plan.c) */
    return LM_ERRF(LM_ERR_UNSUPPORTED, "kv_convert: a plain cache converts to an affine kind only");
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
