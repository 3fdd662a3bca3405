/* grammar_utf8.c — code-point ranges → UTF-8 byte-range sequences.
 *
 * A range of code points with encodings of one length maps to a single sequence of byte ranges
 * when, at every continuation position, it spans whole 6-bit blocks; otherwise it is split at
 * the first block boundary that breaks this and each half is tried again (the classic
 * construction). Sequences with equal continuation ranges are then merged by their lead byte,
 * so "any character but a quote" is eight alternatives. */
#include "grammar/grammar_utf8.h"

#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "text/utf8.h"

lm_status lm_cpset_add(lm_cpset *s, uint32_t lo, uint32_t hi) {
  if (s->n == s->cap) {
    size_t c = s->cap ? s->cap * 2 : 8;
    lm_cprange *q = realloc(s->r, c * sizeof *q);
    if (!q) return LM_ERRF(LM_ERR_NOMEM, "grammar: out of memory");
    s->r = q;
    s->cap = c;
  }
  s->r[s->n++] = (lm_cprange){lo, hi};
  return LM_OK;
}

void lm_cpset_free(lm_cpset *s) {
  free(s->r);
  memset(s, 0, sizeof *s);
}

static int range_cmp(const void *a, const void *b) {
  const lm_cprange *x = a, *y = b;
  return x->lo < y->lo ? -1 : x->lo > y->lo;
}

lm_status lm_cpset_normalize(lm_cpset *s) {
  if (s->n > 1) qsort(s->r, s->n, sizeof *s->r, range_cmp);
  size_t k = 0;
  for (size_t i = 0; i < s->n; i++) {
    lm_cprange r = s->r[i];
    if (r.lo > LM_CP_MAX || r.hi < r.lo) continue;
    if (r.hi > LM_CP_MAX) r.hi = LM_CP_MAX;
    if (k && r.lo <= s->r[k - 1].hi + 1) {
      if (r.hi > s->r[k - 1].hi) s->r[k - 1].hi = r.hi;
    } else {
      s->r[k++] = r;
    }
  }
  s->n = k;
  /* Cut out the surrogates (at most one range holds a part of them after merging... or many
   * small ones: handle each). */
  lm_cpset out = {0};
  for (size_t i = 0; i < s->n; i++) {
    lm_cprange r = s->r[i];
    if (r.hi < 0xD800 || r.lo > 0xDFFF) {
      LM_TRY(lm_cpset_add(&out, r.lo, r.hi));
      continue;
    }
    if (r.lo < 0xD800) LM_TRY(lm_cpset_add(&out, r.lo, 0xD7FF));
    if (r.hi > 0xDFFF) LM_TRY(lm_cpset_add(&out, 0xE000, r.hi));
  }
  free(s->r);
  *s = out;
  return LM_OK;
}

lm_status lm_cpset_negate(lm_cpset *s) {
  LM_TRY(lm_cpset_normalize(s));
  lm_cpset out = {0};
  uint32_t next = 0;
  for (size_t i = 0; i < s->n; i++) {
    if (s->r[i].lo > next) LM_TRY(lm_cpset_add(&out, next, s->r[i].lo - 1));
    next = s->r[i].hi + 1;
  }
  if (next <= LM_CP_MAX) LM_TRY(lm_cpset_add(&out, next, LM_CP_MAX));
  free(s->r);
  *s = out;
  return lm_cpset_normalize(s);
}

/* One sequence: n byte ranges. */
typedef struct bseq {
  uint8_t n, lo[4], hi[4];
  lm_gset lead; /* merged lead bytes */
} bseq;

typedef struct bseqs {
  bseq *a;
  size_t n, cap;
} bseqs;

static lm_status emit(bseqs *o, uint32_t lo, uint32_t hi) {
  if (o->n == o->cap) {
    size_t c = o->cap ? o->cap * 2 : 16;
    bseq *q = realloc(o->a, c * sizeof *q);
    if (!q) return LM_ERRF(LM_ERR_NOMEM, "grammar: out of memory");
    o->a = q;
    o->cap = c;
  }
  char a[4], b[4];
  int n = (int)lm_utf8_encode(lo, a);
  lm_utf8_encode(hi, b);
  bseq *s = &o->a[o->n++];
  memset(s, 0, sizeof *s);
  s->n = (uint8_t)n;
  for (int i = 0; i < n; i++) {
    s->lo[i] = (uint8_t)a[i];
    s->hi[i] = (uint8_t)b[i];
  }
  lm_gset_add_range(&s->lead, s->lo[0], s->hi[0]);
  return LM_OK;
}

static int enc_len(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

static lm_status split(bseqs *o, uint32_t lo, uint32_t hi) {
  static const uint32_t bounds[3] = {0x7F, 0x7FF, 0xFFFF};
  for (int i = 0; i < 3; i++)
    if (lo <= bounds[i] && bounds[i] < hi) {
      LM_TRY(split(o, lo, bounds[i]));
      return split(o, bounds[i] + 1, hi);
    }
  int n = enc_len(lo);
  for (int i = 1; i < n; i++) {
    uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        LM_TRY(split(o, lo, lo | m));
        return split(o, (lo | m) + 1, hi);
      }
      if ((hi & m) != m) {
        LM_TRY(split(o, lo, (hi & ~m) - 1));
        return split(o, hi & ~m, hi);
      }
    }
  }
  return emit(o, lo, hi);
}

static int same_tail(const bseq *x, const bseq *y) {
  if (x->n != y->n) return 0;
  for (int i = 1; i < x->n; i++)
    if (x->lo[i] != y->lo[i] || x->hi[i] != y->hi[i]) return 0;
  return 1;
}

lm_status lm_gutf8_class_alts(lm_gir *b, int32_t rule, const lm_cpset *set) {
  if (set->n == 0)
    return LM_ERRF(LM_ERR_INVALID, "grammar: '%s' matches no character", lm_gir_rule_name(b, rule));
  bseqs o = {0};
  lm_status st = LM_OK;
  for (size_t i = 0; i < set->n && st == LM_OK; i++)
    st = split(&o, set->r[i].lo, set->r[i].hi);
  /* Merge sequences of the same shape after the lead byte. */
  size_t k = 0;
  for (size_t i = 0; i < o.n && st == LM_OK; i++) {
    size_t j = 0;
    while (j < k && !same_tail(&o.a[j], &o.a[i]))
      j++;
    if (j < k)
      lm_gset_or(&o.a[j].lead, &o.a[i].lead);
    else
      o.a[k++] = o.a[i];
  }
  for (size_t i = 0; i < k && st == LM_OK; i++) {
    lm_gseq q = {0};
    st = lm_gseq_set(b, &q, &o.a[i].lead);
    for (int p = 1; p < o.a[i].n && st == LM_OK; p++) {
      lm_gset g = {{0}};
      lm_gset_add_range(&g, o.a[i].lo[p], o.a[i].hi[p]);
      st = lm_gseq_set(b, &q, &g);
    }
    if (st == LM_OK) st = lm_gir_add_alt(b, rule, &q);
    lm_gseq_free(&q);
  }
  free(o.a);
  return st;
}

lm_status lm_gutf8_class(lm_gir *b, lm_gseq *s, const lm_cpset *set, const char *name) {
  if (set->n == 0) return LM_ERRF(LM_ERR_INVALID, "grammar: '%s' matches no character", name);
  if (set->r[set->n - 1].hi < 0x80) { /* ASCII: one byte set */
    lm_gset g = {{0}};
    for (size_t i = 0; i < set->n; i++)
      lm_gset_add_range(&g, set->r[i].lo, set->r[i].hi);
    return lm_gseq_set(b, s, &g);
  }
  int32_t rule;
  LM_TRY(lm_gir_rule(b, name, &rule));
  LM_TRY(lm_gutf8_class_alts(b, rule, set));
  return lm_gseq_ref(b, s, rule);
}
