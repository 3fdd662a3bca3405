/* kv_snapshot.c — deep copies and prefix states of caches (see kv_snapshot.h). */
#include "kv/kv_snapshot.h"

#include <stdlib.h>
#include <string.h>

#include "base/status.h"

static void **array_ptr(lm_kv_cache *c, int a) {
  void **arr[LM_KV_ARRAYS] = {&c->k, &c->v, &c->ks, &c->kb, &c->vs, &c->vb};
  return arr[a];
}

static const void *array_of(const lm_kv_cache *c, int a) {
  const void *arr[LM_KV_ARRAYS] = {c->k, c->v, c->ks, c->kb, c->vs, c->vb};
  return arr[a];
}

/* Zeroes the fields a kind does not use, so specs compare field by field. */
static lm_kv_spec spec_norm(lm_kv_spec s) {
  if (!lm_kv_kind_ring(s.kind)) s.window = 0;
  if (!lm_kv_kind_coded(s.kind)) s.bits = s.group = 0;
  if (lm_kv_kind_tq(s.kind)) s.group = LM_TQ_BLOCK; /* fixed by the codec, whatever was asked */
  if (!lm_kv_kind_tq(s.kind)) s.v_bits = 0;
  if (!lm_kv_kind_quant(s.kind) || s.quant_start < 0) s.quant_start = 0;
  return s;
}

static lm_kv_kind plain_of(lm_kv_kind k) {
  return lm_kv_kind_ring(k) ? LM_KV_ROTATING_PLAIN : LM_KV_PLAIN;
}

lm_kv_spec lm_kv_layout_spec(const lm_kv_cache *c) {
  return spec_norm((lm_kv_spec){.kind = c->kind,
                                .n_kv_heads = c->n_kv_heads,
                                .head_dim = c->head_dim,
                                .window = c->spec_window,
                                .bits = c->bits,
                                .group = c->group,
                                .v_bits = c->v_bits});
}

lm_kv_spec lm_kv_plan_spec(const lm_kv_cache *c) {
  /* lm_kv_create records a delayed quantization's spec in `pending`, and the conversion keeps
   * it there (has_pending cleared): a quantized pending kind means "created delayed". */
  if (lm_kv_kind_quant(c->pending.kind)) return spec_norm(c->pending);
  return lm_kv_layout_spec(c);
}

int lm_kv_spec_equal(const lm_kv_spec *a, const lm_kv_spec *b) {
  lm_kv_spec x = spec_norm(*a), y = spec_norm(*b);
  return x.kind == y.kind && x.n_kv_heads == y.n_kv_heads && x.head_dim == y.head_dim &&
         x.window == y.window && x.bits == y.bits && x.group == y.group && x.v_bits == y.v_bits &&
         x.quant_start == y.quant_start;
}

int64_t lm_kv_alloc_bytes(const lm_kv_cache *c) { return c->slots * lm_kv_bytes_per_token(c); }

int64_t lm_kv_set_alloc_bytes(const lm_kv_set *s) {
  int64_t b = 0;
  for (int i = 0; i < s->n; i++)
    b += lm_kv_alloc_bytes(s->caches[i]);
  return b;
}

int lm_kv_can_truncate(const lm_kv_cache *c, int64_t m) {
  if (m < 0 || m > c->n) return 0;
  return m == c->n || m >= lm_kv_min_len(c);
}

int lm_kv_set_can_truncate(const lm_kv_set *s, int64_t m) {
  for (int i = 0; i < s->n; i++)
    if (!lm_kv_can_truncate(s->caches[i], m)) return 0;
  return 1;
}

/* Rows (slots from 0) that hold the state after m tokens: positions 0..m-1 for a plain cache
 * and a ring below its slot count (what m's next tokens read lies there, wrapped before or
 * not), the whole ring past it. */
static int64_t prefix_rows(const lm_kv_cache *c, int64_t m) {
  return c->window && m > c->window ? c->window : m;
}

/* The high-water mark of a copy of c's first m tokens: c's own once its ring has wrapped. */
static int64_t prefix_high(const lm_kv_cache *c, int64_t m) {
  return c->window && lm_kv_high(c) > c->window ? lm_kv_high(c) : m;
}

static lm_status check_prefix(const lm_kv_cache *c, int64_t m) {
  if (m < 0 || m > c->n)
    return LM_ERRF(LM_ERR_INVALID, "KV snapshot: prefix of %lld tokens of a cache holding %lld",
                   (long long)m, (long long)c->n);
  if (!lm_kv_can_truncate(c, m))
    return LM_ERRF(
        LM_ERR_STATE,
        "KV snapshot: the %lld-slot ring has wrapped (reached %lld tokens): the state after "
        "%lld tokens is gone",
        (long long)c->window, (long long)lm_kv_high(c), (long long)m);
  return LM_OK;
}

/* Copies the first `rows` rows of every array of src into dst (same layout, enough slots). */
static lm_status copy_rows(lm_kv_cache *dst, const lm_kv_cache *src, int64_t rows) {
  for (int a = 0; a < LM_KV_ARRAYS; a++) {
    int64_t bytes = rows * lm_kv_row_bytes(src, a);
    if (bytes)
      LM_TRY(src->be->ops->copy(src->be, *array_ptr(dst, a), array_of(src, a), (size_t)bytes));
  }
  return LM_OK;
}

lm_status lm_kv_create_restored(lm_backend *be, const lm_kv_spec *plan_in,
                                const lm_kv_spec *layout_in, int has_pending, lm_kv_cache **out) {
  *out = NULL;
  lm_kv_spec plan = spec_norm(*plan_in), layout = spec_norm(*layout_in);
  layout.quant_start = 0;
  int delayed = lm_kv_kind_quant(plan.kind) && plan.quant_start > 0;
  if (plan.n_kv_heads != layout.n_kv_heads || plan.head_dim != layout.head_dim ||
      plan.window != layout.window || lm_kv_kind_ring(plan.kind) != lm_kv_kind_ring(layout.kind))
    return LM_ERRF(LM_ERR_INVALID, "KV restore: the layout's geometry differs from the plan's");
  lm_kv_spec conv = plan;
  conv.quant_start = 0;
  if (has_pending) { /* still plain, converting later: exactly what lm_kv_create makes of the plan
                      */
    if (!delayed || layout.kind != plain_of(plan.kind))
      return LM_ERRF(
          LM_ERR_INVALID,
          "KV restore: a pending conversion needs a delayed quantized plan and a plain layout");
    return lm_kv_create(be, &plan, out);
  }
  if (!lm_kv_spec_equal(&layout, &conv))
    return LM_ERRF(LM_ERR_INVALID,
                   "KV restore: the layout is neither the plan nor its pending plain form");
  LM_TRY(lm_kv_create(be, &conv, out));
  if (delayed)
    (*out)->pending = plan; /* converted already: remember the plan as the conversion does */
  return LM_OK;
}

lm_status lm_kv_clone_prefix(const lm_kv_cache *src, int64_t m, lm_kv_cache **out) {
  *out = NULL;
  LM_TRY(check_prefix(src, m));
  lm_kv_spec plan = lm_kv_plan_spec(src), layout = lm_kv_layout_spec(src);
  lm_kv_cache *c;
  LM_TRY(lm_kv_create_restored(src->be, &plan, &layout, src->has_pending, &c));
  lm_status s = c->dtype == src->dtype
                    ? LM_OK
                    : LM_ERRF(LM_ERR_INVALID, "KV snapshot: element dtype differs");
  if (!s) s = lm_kv_fit(c, m); /* plain: exactly m rows; a ring keeps its window */
  if (!s) s = copy_rows(c, src, prefix_rows(src, m));
  if (s) {
    lm_kv_free(c);
    return lm_err_prefix(s, "KV snapshot of %lld tokens", (long long)m);
  }
  c->n = m;
  c->hi = prefix_high(src, m);
  *out = c;
  return LM_OK;
}

lm_status lm_kv_clone(const lm_kv_cache *src, lm_kv_cache **out) {
  return lm_kv_clone_prefix(src, src->n, out);
}

lm_status lm_kv_set_clone_prefix(const lm_kv_set *src, int64_t m, lm_kv_set **out) {
  *out = NULL;
  lm_kv_set *s = calloc(1, sizeof *s);
  if (!s || !(s->caches = calloc((size_t)(src->n ? src->n : 1), sizeof *s->caches))) {
    free(s);
    return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  }
  for (int i = 0; i < src->n; i++) {
    lm_status st = lm_kv_clone_prefix(src->caches[i], m, &s->caches[i]);
    if (st) {
      lm_kv_set_free(s);
      return lm_err_prefix(st, "cache %d", i);
    }
    s->n = i + 1;
  }
  *out = s;
  return LM_OK;
}

lm_status lm_kv_set_clone(const lm_kv_set *src, lm_kv_set **out) {
  return lm_kv_set_clone_prefix(src, lm_kv_set_len(src), out);
}

static lm_status check_compatible(const lm_kv_cache *dst, const lm_kv_cache *src, int64_t m) {
  if (dst == src)
    return LM_ERRF(LM_ERR_INVALID, "KV copy: source and destination are the same cache");
  lm_kv_spec a = lm_kv_plan_spec(dst), b = lm_kv_plan_spec(src);
  char sa[64], sb[64];
  if (dst->be != src->be)
    return LM_ERRF(LM_ERR_INVALID, "KV copy: the caches live on different backends");
  if (!lm_kv_spec_equal(&a, &b))
    return LM_ERRF(LM_ERR_INVALID, "KV copy: destination plan %s differs from the source's %s",
                   lm_kv_spec_signature(&a, sa, sizeof sa),
                   lm_kv_spec_signature(&b, sb, sizeof sb));
  if (dst->dtype != src->dtype) return LM_ERRF(LM_ERR_INVALID, "KV copy: element dtypes differ");
  return check_prefix(src, m);
}

lm_status lm_kv_copy_prefix(lm_kv_cache *dst, const lm_kv_cache *src, int64_t m) {
  LM_TRY(check_compatible(dst, src, m));
  lm_kv_spec ld = lm_kv_layout_spec(dst), ls = lm_kv_layout_spec(src);
  if (lm_kv_spec_equal(&ld, &ls) && dst->has_pending == src->has_pending) {
    int64_t old_n = dst->n;
    dst->n = 0; /* its rows are being replaced: reserve room for m without keeping any */
    lm_status s = lm_kv_reserve(dst, m);
    if (s) {
      dst->n = old_n;
      return s;
    }
    s = copy_rows(dst, src, prefix_rows(src, m));
    dst->n = s ? 0 : m; /* a failed copy leaves rows of both: the cache is emptied */
    dst->hi = s ? 0 : prefix_high(src, m);
    return s;
  }
  /* Different layouts (one converted, the other not yet): swap in a fresh copy, keeping dst's
   * address. */
  lm_kv_cache *t;
  LM_TRY(lm_kv_clone_prefix(src, m, &t));
  lm_kv_cache old = *dst;
  *dst = *t;
  *t = old;
  lm_kv_free(t);
  return LM_OK;
}

lm_status lm_kv_set_copy_prefix(lm_kv_set *dst, const lm_kv_set *src, int64_t m) {
  if (dst->n != src->n)
    return LM_ERRF(LM_ERR_INVALID, "KV copy: destination has %d caches, source %d", dst->n, src->n);
  for (int i = 0; i < src->n; i++) {
    lm_status s = check_compatible(dst->caches[i], src->caches[i], m);
    if (s) return lm_err_prefix(s, "cache %d", i);
  }
  for (int i = 0; i < src->n; i++) {
    lm_status s = lm_kv_copy_prefix(dst->caches[i], src->caches[i], m);
    if (s) {
      for (int j = 0; j < dst->n; j++)
        dst->caches[j]->n = dst->caches[j]->hi = 0; /* never a set whose caches disagree */
      return lm_err_prefix(s, "cache %d", i);
    }
  }
  return LM_OK;
}
