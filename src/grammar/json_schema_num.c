/* json_schema_num.c — integers and numbers, with minimum / maximum / exclusive bounds.
 *
 * An integer range becomes decimal-digit alternatives exactly (no leading zeros): per digit
 * count, the classic split of [lo, hi] into "same prefix, then one digit range, then any digits"
 * pieces, O(digits²) alternatives; an unbounded side is "more digits than the bound". Numbers
 * with integer-valued bounds are exact too: for v = I + f (f the fraction), v >= a holds for any
 * fraction when I > a (or I >= a inclusive), v <= b for any fraction when I < b, and I == b only
 * with a zero fraction; negative numbers are the same on the magnitude. Bounded numbers are
 * written without an exponent. Where the schema leaves a side open, the integer part has at most
 * 18 digits and an exponent at most 2 (INT_DIGITS_MAX): every parser then reads the value
 * exactly or as a finite double, and a model cannot run on in digits. Bounds beyond ±9.2e18
 * count as unbounded where that is the outside, and are refused where they would exclude
 * everything practical; non-integer bounds on "number" are refused (LM_ERR_UNSUPPORTED). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "grammar/json_schema_impl.h"

#define MAX_DIGITS 24
/* An integer part has at most this many digits where the schema sets no bound, so every JSON
 * parser reads it exactly (an int64), and a model cannot run on in digits; exponents at most
 * two digits, so no double overflows. */
#define INT_DIGITS_MAX 18
#define INT_MAG_MAX 999999999999999999ull

typedef struct bound {
  int set, excl;
  int64_t v;
} bound;

static lm_status digit_set(lm_js *c, lm_gseq *s, char lo, char hi) {
  lm_gset g = {{0}};
  lm_gset_add_range(&g, (uint8_t)lo, (uint8_t)hi);
  return lm_gseq_set(c->b, s, &g);
}

static int all_of(const char *s, int i, int n, char ch) {
  for (; i < n; i++)
    if (s[i] != ch) return 0;
  return 1;
}

/* Alternatives for the digit strings of length n between lo and hi (same length, lo <= hi),
 * each after `prefix`. */
static lm_status digits(lm_js *c, int32_t rule, const lm_gseq *prefix, const char *lo,
                        const char *hi, int i, int n) {
  lm_gseq s = {0};
  lm_status st = lm_gseq_cat(c->b, &s, prefix);
  for (; st == LM_OK && i < n && lo[i] == hi[i]; i++)
    st = digit_set(c, &s, lo[i], lo[i]);
  if (st == LM_OK && i < n) {
    char nines[MAX_DIGITS + 1], zeros[MAX_DIGITS + 1];
    memset(nines, '9', (size_t)n);
    memset(zeros, '0', (size_t)n);
    int lo_full = all_of(lo, i + 1, n, '0'), hi_full = all_of(hi, i + 1, n, '9');
    char mid_lo = (char)(lo_full ? lo[i] : lo[i] + 1), mid_hi = (char)(hi_full ? hi[i] : hi[i] - 1);
    if (!lo_full) {
      lm_gseq t = {0};
      st = lm_gseq_cat(c->b, &t, &s);
      if (st == LM_OK) st = digit_set(c, &t, lo[i], lo[i]);
      if (st == LM_OK) st = digits(c, rule, &t, lo, nines, i + 1, n);
      lm_gseq_free(&t);
    }
    if (st == LM_OK && mid_lo <= mid_hi) {
      lm_gseq t = {0};
      st = lm_gseq_cat(c->b, &t, &s);
      if (st == LM_OK) st = digit_set(c, &t, mid_lo, mid_hi);
      for (int k = i + 1; k < n && st == LM_OK; k++)
        st = digit_set(c, &t, '0', '9');
      if (st == LM_OK) st = lm_gir_add_alt(c->b, rule, &t);
      lm_gseq_free(&t);
    }
    if (st == LM_OK && !hi_full) {
      lm_gseq t = {0};
      st = lm_gseq_cat(c->b, &t, &s);
      if (st == LM_OK) st = digit_set(c, &t, hi[i], hi[i]);
      if (st == LM_OK) st = digits(c, rule, &t, zeros, hi, i + 1, n);
      lm_gseq_free(&t);
    }
  } else if (st == LM_OK) {
    st = lm_gir_add_alt(c->b, rule, &s);
  }
  lm_gseq_free(&s);
  return st;
}

static lm_status digit_rule(lm_js *c, int32_t *rule) {
  if (c->r_digit < 0) {
    lm_gset g = {{0}};
    lm_gset_add_range(&g, '0', '9');
    LM_TRY(lm_gir_set_rule(c->b, "digit", &g, &c->r_digit));
  }
  *rule = c->r_digit;
  return LM_OK;
}

/* A rule for the decimal integers in [a, b] (b_inf: no upper bound), no sign. */
static lm_status nonneg(lm_js *c, uint64_t a, uint64_t b, int b_inf, int32_t *rule) {
  char as[MAX_DIGITS], bs[MAX_DIGITS], lo[MAX_DIGITS + 1], hi[MAX_DIGITS + 1], name[80];
  int la = snprintf(as, sizeof as, "%llu", (unsigned long long)a);
  int lb = b_inf ? la : snprintf(bs, sizeof bs, "%llu", (unsigned long long)b);
  if (b_inf)
    snprintf(name, sizeof name, "int[%llu,)", (unsigned long long)a);
  else
    snprintf(name, sizeof name, "int[%llu,%llu]", (unsigned long long)a, (unsigned long long)b);
  LM_TRY(lm_gir_rule(c->b, name, rule));
  lm_gseq none = {0};
  for (int n = la; n <= lb; n++) {
    if (n == la)
      memcpy(lo, as, (size_t)n);
    else
      lo[0] = '1', memset(lo + 1, '0', (size_t)n - 1);
    if (n == lb && !b_inf)
      memcpy(hi, bs, (size_t)n);
    else
      memset(hi, '9', (size_t)n);
    LM_TRY(digits(c, *rule, &none, lo, hi, 0, n));
  }
  if (b_inf) { /* more digits than a has */
    int32_t d;
    LM_TRY(digit_rule(c, &d));
    lm_gseq s = {0};
    lm_status st = digit_set(c, &s, '1', '9');
    if (st == LM_OK) st = lm_gseq_repeat(c->b, &s, d, (uint32_t)la, LM_G_INF);
    if (st == LM_OK) st = lm_gir_add_alt(c->b, *rule, &s);
    lm_gseq_free(&s);
    LM_TRY(st);
  }
  return LM_OK;
}

static uint64_t mag(int64_t x) { return x < 0 ? (uint64_t)(-(x + 1)) + 1 : (uint64_t)x; }

static lm_status read_bound(const json_t *node, const char *key, const char *ptr, int lower,
                            int integer, bound *b) {
  const json_t *v = json_object_get(node, key);
  if (!v || json_is_boolean(v)) return LM_OK;
  if (!json_is_number(v)) return lm_js_err(LM_ERR_INVALID, ptr, "'%s' must be a number", key);
  int excl = key[0] == 'e';
  /* draft 4: "exclusiveMinimum": true makes "minimum" exclusive */
  if (!excl)
    excl = json_is_true(json_object_get(node, lower ? "exclusiveMinimum" : "exclusiveMaximum"));
  int64_t x;
  if (json_is_integer(v)) {
    x = json_integer_value(v);
  } else {
    double d = json_real_value(v);
    if (lower ? d < -9.2e18 : d > 9.2e18) return LM_OK; /* no bound in practice */
    if (lower ? d > 9.2e18 : d < -9.2e18)
      return lm_js_err(LM_ERR_UNSUPPORTED, ptr, "'%s' %g is out of the supported range", key, d);
    if (d != floor(d)) {
      if (!integer)
        return lm_js_err(LM_ERR_UNSUPPORTED, ptr,
                         "'%s' %g: only integer bounds are supported on a number", key, d);
      d = lower ? ceil(d) : floor(d); /* the nearest integers inside */
      excl = 0;
    }
    x = (int64_t)d;
  }
  if (integer && excl) { /* integers: make it inclusive */
    if (lower ? x == INT64_MAX : x == INT64_MIN)
      return lm_js_err(LM_ERR_INVALID, ptr, "no integer fits '%s'", key);
    x += lower ? 1 : -1;
    excl = 0;
  }
  /* The stricter of minimum and exclusiveMinimum. */
  if (b->set) {
    int tighter = lower ? (x > b->v || (x == b->v && excl)) : (x < b->v || (x == b->v && excl));
    if (!tighter) return LM_OK;
  }
  b->set = 1;
  b->v = x;
  b->excl = excl;
  return LM_OK;
}

static lm_status bounds(const json_t *node, const char *ptr, int integer, bound *lo, bound *hi) {
  memset(lo, 0, sizeof *lo);
  memset(hi, 0, sizeof *hi);
  if (!node) return LM_OK;
  LM_TRY(read_bound(node, "minimum", ptr, 1, integer, lo));
  LM_TRY(read_bound(node, "exclusiveMinimum", ptr, 1, integer, lo));
  LM_TRY(read_bound(node, "maximum", ptr, 0, integer, hi));
  LM_TRY(read_bound(node, "exclusiveMaximum", ptr, 0, integer, hi));
  if (lo->set && hi->set && (lo->v > hi->v || (lo->v == hi->v && (lo->excl || hi->excl))))
    return lm_js_err(LM_ERR_INVALID, ptr, "no number fits the bounds");
  if (integer && (lo->set || hi->set)) { /* the open side: at most INT_DIGITS_MAX digits */
    if (!lo->set) *lo = (bound){1, 0, -(int64_t)INT_MAG_MAX};
    if (!hi->set) *hi = (bound){1, 0, (int64_t)INT_MAG_MAX};
    if (lo->v > hi->v) return lm_js_err(LM_ERR_UNSUPPORTED, ptr, "the bounds are out of range");
  }
  return LM_OK;
}

static lm_status alt_refs(lm_js *c, int32_t rule, const char *prefix, int32_t r) {
  lm_gseq s = {0};
  lm_status st = lm_gseq_lit(c->b, &s, prefix, strlen(prefix));
  if (st == LM_OK) st = lm_gseq_ref(c->b, &s, r);
  if (st == LM_OK) st = lm_gir_add_alt(c->b, rule, &s);
  lm_gseq_free(&s);
  return st;
}

/* -?(0|[1-9][0-9]*), or its range. */
lm_status lm_js_integer(lm_js *c, const json_t *node, const char *ptr, int32_t *rule) {
  bound lo, hi;
  LM_TRY(bounds(node, ptr, 1, &lo, &hi));
  int open = !lo.set && !hi.set;
  if (open && c->r_integer >= 0) {
    *rule = c->r_integer;
    return LM_OK;
  }
  if (open) {
    lo = (bound){1, 0, -(int64_t)INT_MAG_MAX};
    hi = (bound){1, 0, (int64_t)INT_MAG_MAX};
  }
  char name[LM_JS_PTR_MAX + 16];
  snprintf(name, sizeof name, "%s-integer", ptr);
  LM_TRY(lm_gir_rule(c->b, name, rule));
  int32_t r;
  if (!lo.set || lo.v < 0) { /* negative part: magnitudes [m_lo, m_hi] */
    uint64_t m_lo = (!hi.set || hi.v >= 0) ? 1 : mag(hi.v);
    LM_TRY(nonneg(c, m_lo, lo.set ? mag(lo.v) : 0, !lo.set, &r));
    LM_TRY(alt_refs(c, *rule, "-", r));
  }
  if (!hi.set || hi.v >= 0) {
    LM_TRY(nonneg(c, lo.set && lo.v > 0 ? (uint64_t)lo.v : 0, hi.set ? (uint64_t)hi.v : 0, !hi.set,
                  &r));
    LM_TRY(alt_refs(c, *rule, "", r));
  }
  if (open) c->r_integer = *rule;
  return LM_OK;
}

/* The fraction rules: "." [0-9]+, "." 0* [1-9] [0-9]* (not zero), "." 0+ (zero). */
static lm_status frac_rules(lm_js *c) {
  if (c->r_frac >= 0) return LM_OK;
  int32_t d, z;
  LM_TRY(digit_rule(c, &d));
  lm_gset zero = {{0}};
  lm_gset_add(&zero, '0');
  LM_TRY(lm_gir_set_rule(c->b, "zero", &zero, &z));
  lm_gseq s = {0};
  lm_status st = lm_gseq_byte(c->b, &s, '.');
  if (st == LM_OK) st = lm_gseq_repeat(c->b, &s, d, 1, LM_G_INF);
  if (st == LM_OK) st = lm_gir_wrap(c->b, "frac", &s, &c->r_frac);
  if (st == LM_OK) st = lm_gseq_byte(c->b, &s, '.');
  if (st == LM_OK) st = lm_gseq_repeat(c->b, &s, z, 0, LM_G_INF);
  if (st == LM_OK) st = digit_set(c, &s, '1', '9');
  if (st == LM_OK) st = lm_gseq_repeat(c->b, &s, d, 0, LM_G_INF);
  if (st == LM_OK) st = lm_gir_wrap(c->b, "frac-nonzero", &s, &c->r_frac_nz);
  if (st == LM_OK) st = lm_gseq_byte(c->b, &s, '.');
  if (st == LM_OK) st = lm_gseq_repeat(c->b, &s, z, 1, LM_G_INF);
  if (st == LM_OK) st = lm_gir_wrap(c->b, "frac-zero", &s, &c->r_frac_zero);
  lm_gseq_free(&s);
  return st;
}

static lm_status any_number(lm_js *c, int32_t *rule) {
  if (c->r_number >= 0) {
    *rule = c->r_number;
    return LM_OK;
  }
  int32_t i, d, e, sign;
  LM_TRY(frac_rules(c));
  LM_TRY(digit_rule(c, &d));
  LM_TRY(nonneg(c, 0, INT_MAG_MAX, 0, &i));
  lm_gseq s = {0};
  lm_gset pm = {{0}};
  lm_gset_add(&pm, '+');
  lm_gset_add(&pm, '-');
  LM_TRY(lm_gir_set_rule(c->b, "exp-sign", &pm, &sign));
  lm_gset ee = {{0}};
  lm_gset_add(&ee, 'e');
  lm_gset_add(&ee, 'E');
  lm_status st = lm_gseq_set(c->b, &s, &ee);
  if (st == LM_OK) st = lm_gseq_repeat(c->b, &s, sign, 0, 1);
  if (st == LM_OK) st = lm_gseq_repeat(c->b, &s, d, 1, 2);
  if (st == LM_OK) st = lm_gir_wrap(c->b, "exp", &s, &e);
  int32_t minus;
  lm_gset m = {{0}};
  lm_gset_add(&m, '-');
  if (st == LM_OK) st = lm_gir_set_rule(c->b, "minus", &m, &minus);
  if (st == LM_OK) st = lm_gseq_repeat(c->b, &s, minus, 0, 1);
  if (st == LM_OK) st = lm_gseq_ref(c->b, &s, i);
  if (st == LM_OK) st = lm_gseq_repeat(c->b, &s, c->r_frac, 0, 1);
  if (st == LM_OK) st = lm_gseq_repeat(c->b, &s, e, 0, 1);
  if (st == LM_OK) st = lm_gir_wrap(c->b, "number", &s, &c->r_number);
  lm_gseq_free(&s);
  LM_TRY(st);
  *rule = c->r_number;
  return LM_OK;
}

/* Alternatives (after `prefix`) for the magnitudes w in [a, b] (a_excl / b_excl: exclusive;
 * b_inf: no upper bound), a and b integers, no exponent. */
static lm_status real_nonneg(lm_js *c, int32_t rule, const char *prefix, uint64_t a, int a_excl,
                             uint64_t b, int b_excl, int b_inf) {
  LM_TRY(frac_rules(c));
  if (b_inf) b = INT_MAG_MAX + 1, b_excl = 1, b_inf = 0; /* open: INT_DIGITS_MAX digits */
  uint64_t ilo = a + (a_excl ? 1 : 0);
  if (b_inf || (b > 0 && ilo <= b - 1)) { /* I in [ilo, b-1]: any fraction */
    int32_t r;
    LM_TRY(nonneg(c, ilo, b_inf ? 0 : b - 1, b_inf, &r));
    lm_gseq s = {0};
    lm_status st = lm_gseq_lit(c->b, &s, prefix, strlen(prefix));
    if (st == LM_OK) st = lm_gseq_ref(c->b, &s, r);
    if (st == LM_OK) st = lm_gseq_repeat(c->b, &s, c->r_frac, 0, 1);
    if (st == LM_OK) st = lm_gir_add_alt(c->b, rule, &s);
    lm_gseq_free(&s);
    LM_TRY(st);
  }
  char t[MAX_DIGITS];
  if (a_excl && (b_inf || b > a)) { /* I == a: only above it */
    lm_gseq s = {0};
    snprintf(t, sizeof t, "%llu", (unsigned long long)a);
    lm_status st = lm_gseq_lit(c->b, &s, prefix, strlen(prefix));
    if (st == LM_OK) st = lm_gseq_lit(c->b, &s, t, strlen(t));
    if (st == LM_OK) st = lm_gseq_ref(c->b, &s, c->r_frac_nz);
    if (st == LM_OK) st = lm_gir_add_alt(c->b, rule, &s);
    lm_gseq_free(&s);
    LM_TRY(st);
  }
  if (!b_inf && !b_excl && (b > a || !a_excl)) { /* I == b: only b itself */
    lm_gseq s = {0};
    snprintf(t, sizeof t, "%llu", (unsigned long long)b);
    lm_status st = lm_gseq_lit(c->b, &s, prefix, strlen(prefix));
    if (st == LM_OK) st = lm_gseq_lit(c->b, &s, t, strlen(t));
    if (st == LM_OK) st = lm_gseq_repeat(c->b, &s, c->r_frac_zero, 0, 1);
    if (st == LM_OK) st = lm_gir_add_alt(c->b, rule, &s);
    lm_gseq_free(&s);
    LM_TRY(st);
  }
  return LM_OK;
}

lm_status lm_js_number(lm_js *c, const json_t *node, const char *ptr, int32_t *rule) {
  bound lo, hi;
  LM_TRY(bounds(node, ptr, 0, &lo, &hi));
  if (!lo.set && !hi.set) return any_number(c, rule);
  char name[LM_JS_PTR_MAX + 16];
  snprintf(name, sizeof name, "%s-number", ptr);
  LM_TRY(lm_gir_rule(c->b, name, rule));
  if (!hi.set || hi.v > 0 || (hi.v == 0 && !hi.excl)) { /* v >= 0 */
    int from_lo = lo.set && lo.v >= 0;
    LM_TRY(real_nonneg(c, *rule, "", from_lo ? (uint64_t)lo.v : 0, from_lo ? lo.excl : 0,
                       hi.set ? (uint64_t)(hi.v > 0 ? hi.v : 0) : 0, hi.excl, !hi.set));
  }
  if (!lo.set || lo.v < 0) { /* v < 0: its magnitude, bounds swapped */
    int from_hi = hi.set && hi.v < 0;
    LM_TRY(real_nonneg(c, *rule, "-", from_hi ? mag(hi.v) : 0, from_hi ? hi.excl : 1,
                       lo.set ? mag(lo.v) : 0, lo.excl, !lo.set));
  }
  return LM_OK;
}
