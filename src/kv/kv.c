/* kv.c — plain and rotating caches: layout, growth, trim, accounting. The data movement
 * (append, attention) is the backends' (kv_append / attention ops). */
#include "kv/kv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"

/* TurboQuant rows (tq_codec.h §2.4 sizes): codes of k and v bits, three fp16 planes of one value
 * per 32 elements, and no sixth array. */
static int64_t tq_row_bytes(int64_t w, int k_bits, int v_bits, int a) {
  switch (a) {
  case LM_KV_K: return w * k_bits / 8;
  case LM_KV_V: return w * v_bits / 8;
  case LM_KV_KS:
  case LM_KV_KB:
  case LM_KV_VS: return (w / LM_TQ_BLOCK) * 2;
  default: return 0;
  }
}

int lm_kv_tq_sig_ok(const char *sig) {
  int k, v, end = 0;
  if (sscanf(sig, "kv:turboquant:%d:%d%n", &k, &v, &end) != 2 || sig[end]) return 0;
  return lm_tq_widths_ok(k, v);
}

int64_t lm_kv_row_bytes(const lm_kv_cache *c, int a) {
  int64_t w = (int64_t)c->n_kv_heads * c->head_dim;
  if (lm_kv_kind_tq(c->kind)) return tq_row_bytes(w, c->bits, c->v_bits, a);
  if (!lm_kv_kind_quant(c->kind)) return a <= LM_KV_V ? w * (int64_t)lm_dtype_size(c->dtype) : 0;
  return a <= LM_KV_V ? w * c->bits / 8 : (w / c->group) * 2;
}

int64_t lm_kv_stage_row_bytes(const lm_kv_cache *c) {
  if (!lm_kv_kind_coded(c->kind)) return 0;
  int64_t b = 0;
  for (int a = 0; a < LM_KV_ARRAYS; a++)
    b += lm_kv_row_bytes(c, a);
  return b;
}

static void **kv_array(lm_kv_cache *c, int a) {
  void **arr[LM_KV_ARRAYS] = {&c->k, &c->v, &c->ks, &c->kb, &c->vs, &c->vb};
  return arr[a];
}

/* (Re)allocates every array for `slots` rows, keeping the rows held (a plain cache grows). */
static lm_status kv_alloc_slots(lm_kv_cache *c, int64_t slots) {
  void *fresh[LM_KV_ARRAYS] = {0};
  lm_status s = LM_OK;
  int64_t keep = c->n < c->slots ? c->n : c->slots;
  for (int a = 0; a < LM_KV_ARRAYS && !s; a++) {
    int64_t rb = lm_kv_row_bytes(c, a);
    if (!rb) continue;
    s = c->be->ops->alloc(c->be, (size_t)(slots * rb), &fresh[a]);
    if (!s && keep && *kv_array(c, a))
      s = c->be->ops->copy(c->be, fresh[a], *kv_array(c, a), (size_t)(keep * rb));
  }
  if (s) {
    for (int a = 0; a < LM_KV_ARRAYS; a++)
      c->be->ops->free(c->be, fresh[a]);
    return lm_err_prefix(s, "KV cache of %lld slots", (long long)slots);
  }
  for (int a = 0; a < LM_KV_ARRAYS; a++) {
    c->be->ops->free(c->be, *kv_array(c, a));
    *kv_array(c, a) = fresh[a];
  }
  c->slots = slots;
  return LM_OK;
}

lm_status lm_kv_create(lm_backend *be, const lm_kv_spec *spec_in, lm_kv_cache **out) {
  *out = NULL;
  lm_kv_spec plain = *spec_in;
  const lm_kv_spec *spec = spec_in;
  /* A delayed quantization starts plain and converts itself in lm_kv_reserve. */
  int delayed = lm_kv_kind_quant(spec_in->kind) && spec_in->quant_start > 0;
  if (delayed) {
    plain.kind = lm_kv_kind_ring(spec_in->kind) ? LM_KV_ROTATING_PLAIN : LM_KV_PLAIN;
    spec = &plain;
  }
  if (spec->n_kv_heads <= 0 || spec->head_dim <= 0 ||
      (lm_kv_kind_ring(spec->kind) && spec->window <= 0))
    return LM_ERRF(LM_ERR_INVALID, "KV cache: invalid geometry");
  if (spec->kind < LM_KV_PLAIN || spec->kind > LM_KV_TURBOQUANT)
    return LM_ERRF(LM_ERR_UNSUPPORTED, "KV cache: unknown kind %d", (int)spec->kind);
  lm_tq_params tq = {0};
  lm_status ts = lm_kv_kind_tq(spec->kind)
                     ? lm_tq_params_init(&tq, spec->head_dim, spec->bits, spec->v_bits)
                     : LM_OK;
  if (ts) return lm_err_prefix(ts, "KV cache");
  if (lm_kv_kind_quant(spec->kind) &&
      ((spec->bits != 4 && spec->bits != 8) ||
       (spec->group != 32 && spec->group != 64 && spec->group != 128) ||
       spec->head_dim % spec->group))
    return LM_ERRF(LM_ERR_UNSUPPORTED,
                   "KV cache: %d-bit group-%d quantization of head dim %d is not supported "
                   "(bits 4 or 8, groups 32/64/128 dividing the head dim)",
                   spec->bits, spec->group, spec->head_dim);
  lm_kv_cache *c = calloc(1, sizeof *c);
  if (!c) return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  c->kind = spec->kind;
  c->be = be;
  c->n_kv_heads = spec->n_kv_heads;
  c->head_dim = spec->head_dim;
  c->dtype = be->act_dtype;
  c->window = lm_kv_kind_ring(spec->kind) ? lm_kv_ring_slots(spec->window) : 0;
  c->spec_window = lm_kv_kind_ring(spec->kind) ? spec->window : 0;
  c->bits = lm_kv_kind_coded(spec->kind) ? spec->bits : 0;
  c->group = lm_kv_kind_quant(spec->kind) ? spec->group : 0;
  if (lm_kv_kind_tq(spec->kind)) c->group = LM_TQ_BLOCK; /* fixed by the codec */
  c->v_bits = lm_kv_kind_tq(spec->kind) ? spec->v_bits : 0;
  c->tq = tq;
  /* A ring is allocated whole up front; a plain cache starts small and doubles. */
  lm_status s = kv_alloc_slots(c, c->window ? c->window : 256);
  if (s) {
    free(c);
    return s;
  }
  char sig[64];
  if (!be->ops->supports_cache(be, lm_kv_signature(c, sig, sizeof sig)) ||
      (delayed && !be->ops->supports_cache(be, lm_kv_spec_signature(spec_in, sig, sizeof sig)))) {
    lm_kv_free(c);
    return LM_ERRF(LM_ERR_UNSUPPORTED, "backend %s cannot run a %s cache", be->ops->name, sig);
  }
  if (delayed) {
    c->pending = *spec_in;
    c->has_pending = 1;
    if (lm_kv_kind_quant(spec_in->kind) &&
        ((spec_in->bits != 4 && spec_in->bits != 8) ||
         (spec_in->group != 32 && spec_in->group != 64 && spec_in->group != 128) ||
         spec_in->head_dim % spec_in->group)) {
      lm_kv_free(c);
      return LM_ERRF(LM_ERR_UNSUPPORTED, "KV cache: unsupported quantization %d/%d", spec_in->bits,
                     spec_in->group);
    }
  }
  *out = c;
  return LM_OK;
}

/* Swaps a plain cache for its pending quantized kind, quantizing the rows it holds. */
static lm_status kv_convert(lm_kv_cache *c) {
  lm_kv_spec to = c->pending;
  to.quant_start = 0;
  lm_kv_cache q = *c;
  q.kind = to.kind;
  q.bits = to.bits;
  q.group = to.group;
  q.k = q.v = q.ks = q.kb = q.vs = q.vb = NULL;
  q.slots = 0;
  int64_t n = q.n;
  q.n = 0; /* nothing to copy while allocating */
  LM_TRY(kv_alloc_slots(&q, c->slots));
  q.n = n;
  lm_status s =
      c->be->ops->kv_convert
          ? c->be->ops->kv_convert(c->be, &(lm_kv_convert_args){.from = c, .to = &q})
          : LM_ERRF(LM_ERR_UNSUPPORTED, "backend %s cannot quantize caches", c->be->ops->name);
  if (s) {
    for (int a = 0; a < LM_KV_ARRAYS; a++)
      c->be->ops->free(c->be, *kv_array(&q, a));
    return s;
  }
  for (int a = 0; a < LM_KV_ARRAYS; a++)
    c->be->ops->free(c->be, *kv_array(c, a));
  q.has_pending = 0;
  *c = q;
  return LM_OK;
}

void lm_kv_free(lm_kv_cache *c) {
  if (!c) return;
  for (int a = 0; a < LM_KV_ARRAYS; a++)
    c->be->ops->free(c->be, *kv_array(c, a));
  free(c);
}

static const char *kv_sig(lm_kv_kind kind, int bits, int group, int v_bits, char *buf, size_t n) {
  switch (kind) {
  case LM_KV_PLAIN: snprintf(buf, n, "kv:plain"); break;
  case LM_KV_ROTATING_PLAIN: snprintf(buf, n, "kv:rotating-plain"); break;
  case LM_KV_QUANT: snprintf(buf, n, "kv:quant:%d:%d", bits, group); break;
  case LM_KV_ROTATING_QUANT: snprintf(buf, n, "kv:rotating-quant:%d:%d", bits, group); break;
  case LM_KV_TURBOQUANT: snprintf(buf, n, "kv:turboquant:%d:%d", bits, v_bits); break;
  default: snprintf(buf, n, "kv:unknown:%d", (int)kind); break; /* supported by no backend */
  }
  return buf;
}

const char *lm_kv_signature(const lm_kv_cache *c, char *buf, size_t n) {
  return kv_sig(c->kind, c->bits, c->group, c->v_bits, buf, n);
}

const char *lm_kv_spec_signature(const lm_kv_spec *s, char *buf, size_t n) {
  return kv_sig(s->kind, s->bits, s->group, s->v_bits, buf, n);
}

int64_t lm_kv_spec_bytes_per_token(const lm_kv_spec *s, lm_dtype act) {
  int64_t w = (int64_t)s->n_kv_heads * s->head_dim, b = 0;
  if (lm_kv_kind_tq(s->kind)) { /* per head d·(k + v)/8 + 6·d/32 */
    for (int a = 0; a < LM_KV_ARRAYS; a++)
      b += tq_row_bytes(w, s->bits, s->v_bits, a);
    return b;
  }
  if (!lm_kv_kind_quant(s->kind)) return 2 * w * (int64_t)lm_dtype_size(act);
  return 2 * (w * s->bits / 8 + 2 * (w / s->group) * 2);
}

int64_t lm_kv_bytes_per_token(const lm_kv_cache *c) {
  int64_t b = 0;
  for (int a = 0; a < LM_KV_ARRAYS; a++)
    b += lm_kv_row_bytes(c, a);
  return b;
}

int64_t lm_kv_capacity(const lm_kv_cache *c) { return c->window ? c->window : LM_KV_UNBOUNDED; }

int64_t lm_kv_held(const lm_kv_cache *c) {
  return c->window && c->n > c->window ? c->window : c->n;
}

int64_t lm_kv_bytes(const lm_kv_cache *c) { return lm_kv_held(c) * lm_kv_bytes_per_token(c); }

lm_status lm_kv_reserve(lm_kv_cache *c, int64_t n_new) {
  if (n_new < 0) return LM_ERRF(LM_ERR_INVALID, "KV reserve: negative count");
  if (c->has_pending && c->n >= c->pending.quant_start) LM_TRY(kv_convert(c));
  if (c->window) return LM_OK; /* a ring holds its window whatever comes */
  int64_t need = c->n + n_new, slots = c->slots;
  if (need <= slots) return LM_OK;
  while (slots < need)
    slots *= 2;
  return kv_alloc_slots(c, slots);
}

lm_status lm_kv_fit(lm_kv_cache *c, int64_t slots) {
  if (c->window) return LM_OK; /* a ring is allocated whole */
  if (slots < c->n) slots = c->n;
  if (slots < 1) slots = 1; /* lm_kv_reserve doubles from here */
  return slots == c->slots ? LM_OK : kv_alloc_slots(c, slots);
}

lm_status lm_kv_trim(lm_kv_cache *c, int64_t n) {
  if (n < 0 || n > c->n)
    return LM_ERRF(LM_ERR_INVALID, "KV trim of %lld tokens from %lld", (long long)n,
                   (long long)c->n);
  /* After a wrap the ring's oldest slots hold positions newer than the ones a trim would
   * expose again: past the spare slots, those keys are gone. */
  if (n > 0 && c->n - n < lm_kv_min_len(c))
    return LM_ERRF(LM_ERR_STATE,
                   "KV trim: the %lld-slot ring has wrapped (reached %lld tokens): it can go back "
                   "to %lld, not %lld; re-prefill instead",
                   (long long)c->window, (long long)lm_kv_high(c), (long long)lm_kv_min_len(c),
                   (long long)(c->n - n));
  c->hi = lm_kv_high(c);
  c->n -= n;
  return LM_OK;
}

lm_status lm_kv_set_create(lm_backend *be, const lm_kv_spec *specs, int n, lm_kv_set **out) {
  *out = NULL;
  lm_kv_set *s = calloc(1, sizeof *s);
  if (!s || !(s->caches = calloc((size_t)(n ? n : 1), sizeof *s->caches))) {
    free(s);
    return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  }
  for (int i = 0; i < n; i++) {
    lm_status st = lm_kv_create(be, &specs[i], &s->caches[i]);
    if (st) {
      lm_kv_set_free(s);
      return lm_err_prefix(st, "cache %d", i);
    }
    s->n = i + 1;
  }
  *out = s;
  return LM_OK;
}

void lm_kv_set_free(lm_kv_set *s) {
  if (!s) return;
  for (int i = 0; i < s->n; i++)
    lm_kv_free(s->caches[i]);
  free(s->caches);
  free(s);
}

lm_status lm_kv_set_reserve(lm_kv_set *s, int64_t n_new) {
  for (int i = 0; i < s->n; i++)
    LM_TRY(lm_kv_reserve(s->caches[i], n_new));
  return LM_OK;
}

lm_status lm_kv_set_trim(lm_kv_set *s, int64_t n) {
  for (int i = 0; i < s->n; i++) /* check first, so a refused trim changes nothing */
    if (n > 0 && s->caches[i]->n - n < lm_kv_min_len(s->caches[i]))
      return lm_kv_trim(s->caches[i], n);
  for (int i = 0; i < s->n; i++)
    LM_TRY(lm_kv_trim(s->caches[i], n));
  return LM_OK;
}

int64_t lm_kv_set_min_len(const lm_kv_set *s) {
  int64_t m = 0;
  for (int i = 0; i < s->n; i++)
    if (lm_kv_min_len(s->caches[i]) > m) m = lm_kv_min_len(s->caches[i]);
  return m;
}

int64_t lm_kv_set_len(const lm_kv_set *s) { return s->n ? s->caches[0]->n : 0; }

int64_t lm_kv_set_bytes(const lm_kv_set *s) {
  int64_t b = 0;
  for (int i = 0; i < s->n; i++)
    b += lm_kv_bytes(s->caches[i]);
  return b;
}
