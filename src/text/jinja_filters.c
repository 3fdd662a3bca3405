/* jinja_filters.c — jinja2's builtin filters and tests, with Python semantics.
 *
 * Each filter takes the value and the evaluated call arguments (positional or by keyword, with the
 * defaults jinja2 documents). Differences from jinja2 that a chat template cannot observe: filters
 * that return generators in jinja2 (map, select, reject, items, …) return lists here, and `tojson`
 * is transformers' version (json.dumps with ensure_ascii=False, unsorted keys, no HTML escaping).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "text/jinja_eval.h"

/* clang-format off */
#define LM_JFILTERS(X) \
  X(abs) X(attr) X(capitalize) X(center) X(count) X(d) X(default) X(dictsort) X(e) X(escape) \
  X(first) X(float) X(format) X(indent) X(int) X(items) X(join) X(last) X(length) X(list) \
  X(lower) X(map) X(max) X(min) X(reject) X(rejectattr) X(replace) X(reverse) X(round) X(safe) \
  X(select) X(selectattr) X(sort) X(string) X(sum) X(title) X(tojson) X(trim) X(truncate) \
  X(unique) X(upper) X(wordcount)

#define LM_JTESTS(X) \
  X(boolean) X(callable) X(defined) X(divisibleby) X(eq) X(equalto) X(escaped) X(even) X(false) \
  X(float) X(ge) X(greaterthan) X(gt) X(in) X(integer) X(iterable) X(le) X(lessthan) X(lower) \
  X(lt) X(mapping) X(ne) X(none) X(number) X(odd) X(sameas) X(sequence) X(string) X(true) \
  X(undefined) X(upper)
/* clang-format on */

#define LM_JENUM_F(n) LM_JF_##n,
#define LM_JENUM_T(n) LM_JT_##n,
#define LM_JNAME(n) #n,
enum { LM_JFILTERS(LM_JENUM_F) LM_JF_COUNT };
enum { LM_JTESTS(LM_JENUM_T) LM_JT_COUNT };
static const char *const filter_names[] = {LM_JFILTERS(LM_JNAME)};
static const char *const test_names[] = {LM_JTESTS(LM_JNAME)};

static int find_name(const char *const *names, int n, const char *name) {
  for (int i = 0; i < n; i++)
    if (strcmp(names[i], name) == 0) return i;
  return -1;
}

int lm_jinja_filter_id(const char *name) { return find_name(filter_names, LM_JF_COUNT, name); }

int lm_jinja_test_id(const char *name) {
  /* the operator spellings of comparison tests, as jinja2 registers them */
  static const char *const alias[][2] = {{"==", "eq"}, {"!=", "ne"}, {"<", "lt"},
                                         {"<=", "le"}, {">", "gt"},  {">=", "ge"}};
  for (size_t i = 0; i < sizeof alias / sizeof *alias; i++)
    if (strcmp(name, alias[i][0]) == 0) name = alias[i][1];
  return find_name(test_names, LM_JT_COUNT, name);
}

/* ---- helpers -------------------------------------------------------------------------------- */

static lm_status arg_err(const char *filter, const char *what) {
  return LM_ERRF(LM_ERR_INVALID, "filter '%s': %s", filter, what);
}

/* soft_str(): str() of anything, "" for Undefined. */
static lm_status text_of(lm_jctx *x, lm_jv v, const lm_jstr **out) {
  lm_jv s;
  LM_TRY(lm_jv_to_str(x->a, v, &s));
  *out = s.u.s;
  return LM_OK;
}

static int64_t ival(lm_jv v) { return v.kind == LM_JV_BOOL ? v.u.b : v.u.i; }
static int is_int(lm_jv v) { return v.kind == LM_JV_INT || v.kind == LM_JV_BOOL; }

static int opt_bool(const lm_jcall *c, size_t pos, const char *name, int def) {
  lm_jv v;
  return lm_jcall_arg(c, pos, name, &v) ? lm_jv_truthy(v) : def;
}

lm_status lm_jinja_len(lm_jv v, int64_t *n) {
  switch (v.kind) {
  case LM_JV_UNDEF: *n = 0; return LM_OK;
  case LM_JV_STR: *n = (int64_t)lm_jutf8_count(v.u.s->s, v.u.s->len); return LM_OK;
  case LM_JV_LIST: *n = (int64_t)v.u.l->n; return LM_OK;
  case LM_JV_DICT:
  case LM_JV_NS: *n = (int64_t)v.u.d->n; return LM_OK;
  default: return LM_ERRF(LM_ERR_INVALID, "object of type '%s' has no len()", lm_jv_type_name(v));
  }
}

static lm_status lower_copy(lm_jctx *x, lm_jv v, lm_jv *out) {
  if (v.kind != LM_JV_STR) {
    *out = v;
    return LM_OK;
  }
  lm_jbuf b = {0};
  lm_status s = lm_jbuf_put_case(&b, v.u.s->s, v.u.s->len, 0);
  if (s == LM_OK) s = lm_jv_str(x->a, b.data ? b.data : "", b.len, out);
  lm_jbuf_free(&b);
  return s;
}

/* Attribute path "a.b.0" as jinja2's make_attrgetter walks it (item lookups, digits as indices). */
static lm_status attr_path(lm_jctx *x, lm_jv v, lm_jv path, lm_jv *out) {
  if (path.kind != LM_JV_STR) return lm_jinja_getitem(x, v, path, out);
  const char *p = path.u.s->s, *end = p + path.u.s->len;
  while (p <= end) {
    const char *dot = memchr(p, '.', (size_t)(end - p));
    size_t n = dot ? (size_t)(dot - p) : (size_t)(end - p);
    lm_jv key;
    int digits = n > 0;
    for (size_t i = 0; i < n; i++)
      digits &= p[i] >= '0' && p[i] <= '9';
    if (digits && n < 18)
      key = lm_jv_int(strtoll(p, NULL, 10));
    else
      LM_TRY(lm_jv_str(x->a, p, n, &key));
    LM_TRY(lm_jinja_getitem(x, v, key, &v));
    if (!dot) break;
    p = dot + 1;
  }
  *out = v;
  return LM_OK;
}

/* Stable merge sort of idx[0..n) by keys (Python's sorted() is stable, also with reverse=True). */
static lm_status merge_sort(const lm_jv *keys, size_t *idx, size_t *tmp, size_t n, int reverse) {
  if (n < 2) return LM_OK;
  size_t h = n / 2;
  LM_TRY(merge_sort(keys, idx, tmp, h, reverse));
  LM_TRY(merge_sort(keys, idx + h, tmp, n - h, reverse));
  size_t i = 0, j = h, o = 0;
  while (i < h && j < n) {
    int c;
    LM_TRY(lm_jv_compare(keys[idx[j]], keys[idx[i]], &c));
    if (reverse) c = -c;
    tmp[o++] = c < 0 ? idx[j++] : idx[i++];
  }
  while (i < h)
    tmp[o++] = idx[i++];
  while (j < n)
    tmp[o++] = idx[j++];
  memcpy(idx, tmp, n * sizeof *idx);
  return LM_OK;
}

/* Sorts `items` (a list) by keys[i]; writes the sorted list to *out. */
static lm_status sort_by_keys(lm_jctx *x, lm_jv items, const lm_jv *keys, int reverse, lm_jv *out) {
  size_t n = items.u.l->n, *idx, *tmp;
  LM_TRY(lm_jarena_alloc(x->a, (n + 1) * sizeof *idx, (void **)&idx));
  LM_TRY(lm_jarena_alloc(x->a, (n + 1) * sizeof *tmp, (void **)&tmp));
  for (size_t i = 0; i < n; i++)
    idx[i] = i;
  LM_TRY(merge_sort(keys, idx, tmp, n, reverse));
  LM_TRY(lm_jv_list(x->a, n, out));
  for (size_t i = 0; i < n; i++)
    LM_TRY(lm_jv_list_push(x->a, *out, items.u.l->v[idx[i]]));
  return LM_OK;
}

static lm_status pair(lm_jctx *x, lm_jv a, lm_jv b, lm_jv *out) {
  LM_TRY(lm_jv_list(x->a, 2, out));
  out->u.l->tuple = 1;
  LM_TRY(lm_jv_list_push(x->a, *out, a));
  return lm_jv_list_push(x->a, *out, b);
}

static lm_status dict_items(lm_jctx *x, lm_jv d, lm_jv *out) {
  if (d.kind == LM_JV_UNDEF) return lm_jv_list(x->a, 0, out);
  if (d.kind != LM_JV_DICT && d.kind != LM_JV_NS)
    return LM_ERRF(LM_ERR_INVALID, "can only get item pairs from a mapping");
  LM_TRY(lm_jv_list(x->a, d.u.d->n, out));
  for (size_t i = 0; i < d.u.d->n; i++) {
    lm_jv p;
    LM_TRY(pair(x, d.u.d->k[i], d.u.d->v[i], &p));
    LM_TRY(lm_jv_list_push(x->a, *out, p));
  }
  return LM_OK;
}

/* ---- individual filters --------------------------------------------------------------------- */

static lm_status f_dictsort(lm_jctx *x, lm_jv in, const lm_jcall *c, lm_jv *out) {
  int cs = opt_bool(c, 0, "case_sensitive", 0), reverse = opt_bool(c, 2, "reverse", 0);
  lm_jv by = lm_jv_undef(), items;
  int by_value = 0;
  if (lm_jcall_arg(c, 1, "by", &by)) {
    if (by.kind != LM_JV_STR || (strcmp(by.u.s->s, "key") && strcmp(by.u.s->s, "value")))
      return arg_err("dictsort", "You can only sort by either \"key\" or \"value\"");
    by_value = strcmp(by.u.s->s, "value") == 0;
  }
  if (in.kind != LM_JV_DICT && in.kind != LM_JV_NS)
    return arg_err("dictsort", "value is not a mapping");
  LM_TRY(dict_items(x, in, &items));
  lm_jv *keys;
  LM_TRY(lm_jarena_alloc(x->a, (items.u.l->n + 1) * sizeof *keys, (void **)&keys));
  for (size_t i = 0; i < items.u.l->n; i++) {
    keys[i] = items.u.l->v[i].u.l->v[by_value];
    if (!cs) LM_TRY(lower_copy(x, keys[i], &keys[i]));
  }
  return sort_by_keys(x, items, keys, reverse, out);
}

static lm_status f_sort_like(lm_jctx *x, int id, lm_jv in, const lm_jcall *c, lm_jv *out) {
  /* sort(reverse, case_sensitive, attribute); unique/min/max(case_sensitive, attribute) */
  int sort = id == LM_JF_sort;
  int reverse = sort ? opt_bool(c, 0, "reverse", 0) : 0;
  int cs = opt_bool(c, sort ? 1 : 0, "case_sensitive", 0);
  lm_jv attr = lm_jv_undef(), items;
  lm_jcall_arg(c, sort ? 2 : 1, "attribute", &attr);
  LM_TRY(lm_jinja_iterate(x, in, &items));
  size_t n = items.u.l->n;
  lm_jv *keys;
  LM_TRY(lm_jarena_alloc(x->a, (n + 1) * sizeof *keys, (void **)&keys));
  for (size_t i = 0; i < n; i++) {
    keys[i] = items.u.l->v[i];
    if (attr.kind != LM_JV_UNDEF) LM_TRY(attr_path(x, keys[i], attr, &keys[i]));
    if (!cs) LM_TRY(lower_copy(x, keys[i], &keys[i]));
  }
  if (id == LM_JF_unique) {
    LM_TRY(lm_jv_list(x->a, n, out));
    for (size_t i = 0; i < n; i++) {
      int seen = 0;
      for (size_t j = 0; j < i && !seen; j++)
        seen = lm_jv_equal(keys[i], keys[j]);
      if (!seen) LM_TRY(lm_jv_list_push(x->a, *out, items.u.l->v[i]));
    }
    return LM_OK;
  }
  if (id == LM_JF_min || id == LM_JF_max) {
    if (n == 0) {
      *out = lm_jv_undef();
      return LM_OK;
    }
    size_t best = 0;
    for (size_t i = 1; i < n; i++) {
      int cmp;
      LM_TRY(lm_jv_compare(keys[i], keys[best], &cmp));
      if (id == LM_JF_min ? cmp < 0 : cmp > 0) best = i;
    }
    *out = items.u.l->v[best];
    return LM_OK;
  }
  return sort_by_keys(x, items, keys, reverse, out);
}

static lm_status f_join(lm_jctx *x, lm_jv in, const lm_jcall *c, lm_jv *out) {
  lm_jv sep = lm_jv_undef(), attr = lm_jv_undef(), items;
  lm_jcall_arg(c, 0, "d", &sep);
  lm_jcall_arg(c, 1, "attribute", &attr);
  const lm_jstr *sep_s;
  LM_TRY(text_of(x, sep, &sep_s));
  LM_TRY(lm_jinja_iterate(x, in, &items));
  lm_jbuf b = {0};
  lm_status s = LM_OK;
  for (size_t i = 0; i < items.u.l->n && s == LM_OK; i++) {
    lm_jv v = items.u.l->v[i];
    if (i) s = lm_jbuf_put(&b, sep_s->s, sep_s->len);
    if (s == LM_OK && attr.kind != LM_JV_UNDEF) s = attr_path(x, v, attr, &v);
    if (s == LM_OK) s = lm_jv_put_str(&b, v);
  }
  if (s == LM_OK) s = lm_jv_str(x->a, b.data ? b.data : "", b.len, out);
  lm_jbuf_free(&b);
  return s;
}

/* Python str.replace(old, new[, count]). */
static lm_status str_replace(lm_jctx *x, const lm_jstr *s, const lm_jstr *old, const lm_jstr *new_,
                             int64_t count, lm_jv *out) {
  lm_jbuf b = {0};
  lm_status st = LM_OK;
  size_t i = 0;
  int64_t done = 0;
  if (old->len == 0) { /* Python inserts `new` between every character and at both ends */
    while (st == LM_OK && i <= s->len) {
      if (count < 0 || done < count) st = lm_jbuf_put(&b, new_->s, new_->len), done++;
      if (i == s->len) break;
      uint32_t cp;
      size_t k = lm_jutf8_next(s->s + i, s->len - i, &cp);
      if (st == LM_OK) st = lm_jbuf_put(&b, s->s + i, k);
      i += k;
    }
  } else {
    while (st == LM_OK && i < s->len) {
      const char *hit =
          (count < 0 || done < count) ? memmem(s->s + i, s->len - i, old->s, old->len) : NULL;
      if (!hit) {
        st = lm_jbuf_put(&b, s->s + i, s->len - i);
        break;
      }
      st = lm_jbuf_put(&b, s->s + i, (size_t)(hit - (s->s + i)));
      if (st == LM_OK) st = lm_jbuf_put(&b, new_->s, new_->len);
      i = (size_t)(hit - s->s) + old->len;
      done++;
    }
  }
  if (st == LM_OK) st = lm_jv_str(x->a, b.data ? b.data : "", b.len, out);
  lm_jbuf_free(&b);
  return st;
}

lm_status lm_jinja_str_replace(lm_jctx *x, const lm_jstr *s, const lm_jstr *old,
                               const lm_jstr *new_, int64_t count, lm_jv *out) {
  return str_replace(x, s, old, new_, count, out);
}

static lm_status f_replace(lm_jctx *x, lm_jv in, const lm_jcall *c, lm_jv *out) {
  lm_jv old, new_, count = lm_jv_int(-1);
  if (!lm_jcall_arg(c, 0, "old", &old) || !lm_jcall_arg(c, 1, "new", &new_))
    return arg_err("replace", "needs old and new");
  lm_jcall_arg(c, 2, "count", &count);
  const lm_jstr *s, *o, *n;
  LM_TRY(text_of(x, in, &s));
  LM_TRY(text_of(x, old, &o));
  LM_TRY(text_of(x, new_, &n));
  return str_replace(x, s, o, n,
                     count.kind == LM_JV_NONE ? -1
                     : is_int(count)          ? ival(count)
                                              : -1,
                     out);
}

/* Python str.splitlines() boundaries. */
static size_t line_break_len(const char *s, size_t n) {
  uint32_t cp;
  size_t k = lm_jutf8_next(s, n, &cp);
  if (cp == '\r') return n > 1 && s[1] == '\n' ? 2 : 1;
  if (cp == '\n' || cp == 0x0B || cp == 0x0C || (cp >= 0x1C && cp <= 0x1E) || cp == 0x85 ||
      cp == 0x2028 || cp == 0x2029)
    return k;
  return 0;
}

lm_status lm_jinja_splitlines(lm_jctx *x, const lm_jstr *s, int keepends, lm_jv *out) {
  LM_TRY(lm_jv_list(x->a, 0, out));
  size_t start = 0, i = 0;
  while (i < s->len) {
    size_t br = line_break_len(s->s + i, s->len - i);
    if (!br) {
      uint32_t cp;
      i += lm_jutf8_next(s->s + i, s->len - i, &cp);
      continue;
    }
    lm_jv line;
    LM_TRY(lm_jv_str(x->a, s->s + start, (keepends ? i + br : i) - start, &line));
    LM_TRY(lm_jv_list_push(x->a, *out, line));
    i += br;
    start = i;
  }
  if (start < s->len) {
    lm_jv line;
    LM_TRY(lm_jv_str(x->a, s->s + start, s->len - start, &line));
    LM_TRY(lm_jv_list_push(x->a, *out, line));
  }
  return LM_OK;
}

static lm_status f_indent(lm_jctx *x, lm_jv in, const lm_jcall *c, lm_jv *out) {
  lm_jv width = lm_jv_int(4), lines;
  lm_jcall_arg(c, 0, "width", &width);
  int first = opt_bool(c, 1, "first", 0), blank = opt_bool(c, 2, "blank", 0);
  const lm_jstr *s, *ind;
  lm_jbuf pad = {0}, b = {0};
  lm_status st = LM_OK;
  if (width.kind == LM_JV_STR)
    st = lm_jbuf_put(&pad, width.u.s->s, width.u.s->len);
  else if (is_int(width))
    for (int64_t i = 0; i < ival(width) && i < 4096 && st == LM_OK; i++)
      st = lm_jbuf_putc(&pad, ' ');
  else
    st = arg_err("indent", "width must be an int or a string");
  lm_jv padv;
  if (st == LM_OK) st = lm_jv_str(x->a, pad.data ? pad.data : "", pad.len, &padv);
  lm_jbuf_free(&pad);
  LM_TRY(st);
  ind = padv.u.s;
  LM_TRY(text_of(x, in, &s));
  /* jinja2 appends "\n" before splitlines() so a trailing newline survives */
  lm_jv withnl, nl;
  LM_TRY(lm_jv_cstr(x->a, "\n", &nl));
  {
    lm_jbuf t = {0};
    st = lm_jbuf_put(&t, s->s, s->len);
    if (st == LM_OK) st = lm_jbuf_putc(&t, '\n');
    if (st == LM_OK) st = lm_jv_str(x->a, t.data, t.len, &withnl);
    lm_jbuf_free(&t);
    LM_TRY(st);
  }
  LM_TRY(lm_jinja_splitlines(x, withnl.u.s, 0, &lines));
  for (size_t i = 0; i < lines.u.l->n && st == LM_OK; i++) {
    const lm_jstr *line = lines.u.l->v[i].u.s;
    if (i) st = lm_jbuf_putc(&b, '\n');
    if (st == LM_OK && ((i == 0 && first) || (i > 0 && (blank || line->len > 0))))
      st = lm_jbuf_put(&b, ind->s, ind->len);
    if (st == LM_OK) st = lm_jbuf_put(&b, line->s, line->len);
  }
  if (st == LM_OK) st = lm_jv_str(x->a, b.data ? b.data : "", b.len, out);
  lm_jbuf_free(&b);
  return st;
}

/* Python int(str, base) for the int filter: whitespace and underscores allowed, else fails. */
static int parse_int_text(const char *s, size_t n, int base, int64_t *out) {
  size_t i = lm_py_lspace(s, n), end = n - lm_py_rspace(s, n);
  int neg = 0;
  if (i < end && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
  if (end - i >= 2 && s[i] == '0' &&
      ((base == 16 && (s[i + 1] | 32) == 'x') || (base == 8 && (s[i + 1] | 32) == 'o') ||
       (base == 2 && (s[i + 1] | 32) == 'b')))
    i += 2;
  if (i >= end) return 0;
  uint64_t v = 0;
  for (; i < end; i++) {
    char ch = s[i];
    if (ch == '_') continue;
    int d = ch >= '0' && ch <= '9'                 ? ch - '0'
            : (ch | 32) >= 'a' && (ch | 32) <= 'z' ? (ch | 32) - 'a' + 10
                                                   : 99;
    if (d >= base || v > (UINT64_MAX - (uint64_t)d) / (uint64_t)base) return 0;
    v = v * (uint64_t)base + (uint64_t)d;
  }
  if (v > (uint64_t)INT64_MAX + (uint64_t)neg) return 0;
  *out = neg ? (int64_t)(0 - v) : (int64_t)v;
  return 1;
}

static int parse_float_text(const char *s, size_t n, double *out) {
  char buf[128];
  size_t i = lm_py_lspace(s, n), end = n - lm_py_rspace(s, n), m = 0;
  if (end <= i || end - i >= sizeof buf) return 0;
  for (size_t k = i; k < end; k++)
    if (s[k] != '_') buf[m++] = s[k];
  buf[m] = '\0';
  char *e;
  *out = strtod(buf, &e);
  return *e == '\0';
}

static lm_status f_int_float(lm_jctx *x, int is_int_filter, lm_jv in, const lm_jcall *c,
                             lm_jv *out) {
  lm_jv def = is_int_filter ? lm_jv_int(0) : lm_jv_float(0.0), base = lm_jv_int(10);
  lm_jcall_arg(c, 0, "default", &def);
  lm_jcall_arg(c, 1, "base", &base);
  (void)x;
  double f;
  int64_t i;
  if (is_int_filter) {
    if (is_int(in))
      *out = lm_jv_int(ival(in));
    else if (in.kind == LM_JV_BIGINT)
      *out = in;
    else if (in.kind == LM_JV_FLOAT && isfinite(in.u.f) && fabs(in.u.f) < 9.2e18)
      *out = lm_jv_int((int64_t)in.u.f);
    else if (in.kind == LM_JV_STR && is_int(base) && ival(base) >= 2 && ival(base) <= 36 &&
             parse_int_text(in.u.s->s, in.u.s->len, (int)ival(base), &i))
      *out = lm_jv_int(i);
    else if (in.kind == LM_JV_STR && parse_float_text(in.u.s->s, in.u.s->len, &f) && isfinite(f) &&
             fabs(f) < 9.2e18)
      *out = lm_jv_int((int64_t)f);
    else
      *out = def;
    return LM_OK;
  }
  if (is_int(in))
    *out = lm_jv_float((double)ival(in));
  else if (in.kind == LM_JV_FLOAT)
    *out = in;
  else if (in.kind == LM_JV_STR && parse_float_text(in.u.s->s, in.u.s->len, &f))
    *out = lm_jv_float(f);
  else
    *out = def;
  return LM_OK;
}

static lm_status f_round(lm_jctx *x, lm_jv in, const lm_jcall *c, lm_jv *out) {
  lm_jv prec = lm_jv_int(0), method = lm_jv_undef();
  lm_jcall_arg(c, 0, "precision", &prec);
  lm_jcall_arg(c, 1, "method", &method);
  (void)x;
  if (!is_int(prec)) return arg_err("round", "precision must be an int");
  const char *m = method.kind == LM_JV_STR ? method.u.s->s : "common";
  if (strcmp(m, "common") && strcmp(m, "ceil") && strcmp(m, "floor"))
    return arg_err("round", "method must be common, ceil or floor");
  if (is_int(in) && !strcmp(m, "common")) { /* round(int, n) stays an int */
    *out = lm_jv_int(ival(in));
    return LM_OK;
  }
  if (!is_int(in) && in.kind != LM_JV_FLOAT) return arg_err("round", "value must be a number");
  double v = in.kind == LM_JV_FLOAT ? in.u.f : (double)ival(in);
  int64_t p = ival(prec);
  if (!strcmp(m, "common")) {
    if (p >= 0 && p < 300 &&
        isfinite(v)) { /* correctly rounded, half to even: what Python's round() gives */
      char buf[400];
      snprintf(buf, sizeof buf, "%.*f", (int)p, v);
      v = strtod(buf, NULL);
    } else if (p < 0 && isfinite(v)) {
      double sc = pow(10.0, (double)-p);
      v = nearbyint(v / sc) * sc;
    }
  } else {
    double sc = pow(10.0, (double)p);
    v = (!strcmp(m, "ceil") ? ceil(v * sc) : floor(v * sc)) / sc;
  }
  *out = lm_jv_float(v);
  return LM_OK;
}

static lm_status f_trim(lm_jctx *x, lm_jv in, const lm_jcall *c, lm_jv *out);

/* map / select / reject / selectattr / rejectattr */
static lm_status f_map_select(lm_jctx *x, int id, lm_jv in, const lm_jcall *c, lm_jv *out) {
  lm_jv items, attr = lm_jv_undef(), name = lm_jv_undef();
  LM_TRY(lm_jinja_iterate(x, in, &items));
  LM_TRY(lm_jv_list(x->a, items.u.l->n, out));
  int by_attr = id == LM_JF_selectattr || id == LM_JF_rejectattr;
  size_t first_arg = 0;
  if (id == LM_JF_map) {
    if (!lm_jcall_arg(c, 0, NULL, &name) && !lm_jcall_arg(c, 99, "attribute", &attr))
      return arg_err("map", "needs a filter name or attribute=");
    first_arg = 1;
  } else if (by_attr) {
    if (!lm_jcall_arg(c, 0, NULL, &attr))
      return arg_err(filter_names[id], "needs an attribute name");
    lm_jcall_arg(c, 1, NULL, &name);
    first_arg = 2;
  } else {
    lm_jcall_arg(c, 0, NULL, &name);
    first_arg = 1;
  }
  int fid = -1;
  if (name.kind != LM_JV_UNDEF) {
    if (name.kind != LM_JV_STR)
      return arg_err(filter_names[id], "the filter/test name must be a string");
    fid = id == LM_JF_map ? lm_jinja_filter_id(name.u.s->s) : lm_jinja_test_id(name.u.s->s);
    if (fid < 0)
      return LM_ERRF(LM_ERR_UNSUPPORTED, "%s: unknown %s '%s'", filter_names[id],
                     id == LM_JF_map ? "filter" : "test", name.u.s->s);
  }
  lm_jcall rest = {c->args + (c->nargs > first_arg ? first_arg : c->nargs),
                   c->nargs > first_arg ? c->nargs - first_arg : 0, NULL, NULL, 0};
  if (id == LM_JF_map && fid >= 0)
    rest.kwnames = c->kwnames, rest.kwvals = c->kwvals, rest.nkw = c->nkw;
  for (size_t i = 0; i < items.u.l->n; i++) {
    lm_jv item = items.u.l->v[i], v = item;
    if (attr.kind != LM_JV_UNDEF) LM_TRY(attr_path(x, item, attr, &v));
    if (id == LM_JF_map) {
      if (fid >= 0)
        LM_TRY(lm_jinja_apply_filter(x, fid, v, &rest, &v));
      else if (v.kind == LM_JV_UNDEF)
        lm_jcall_arg(c, 99, "default", &v);
      LM_TRY(lm_jv_list_push(x->a, *out, v));
      continue;
    }
    int keep;
    if (fid >= 0)
      LM_TRY(lm_jinja_apply_test(x, fid, v, &rest, &keep));
    else
      keep = lm_jv_truthy(v);
    if (id == LM_JF_reject || id == LM_JF_rejectattr) keep = !keep;
    if (keep) LM_TRY(lm_jv_list_push(x->a, *out, item));
  }
  return LM_OK;
}

static lm_status f_tojson(lm_jctx *x, lm_jv in, const lm_jcall *c, lm_jv *out) {
  lm_jv indent = lm_jv_none(), seps = lm_jv_none();
  lm_jv_json_opts o = {-1, opt_bool(c, 99, "sort_keys", 0), opt_bool(c, 99, "ensure_ascii", 0),
                       NULL, NULL};
  lm_jcall_arg(c, 0, "indent", &indent);
  lm_jcall_arg(c, 99, "separators", &seps);
  if (is_int(indent))
    o.indent = ival(indent) < 0 ? 0 : ival(indent) > 64 ? 64 : (int)ival(indent);
  else if (indent.kind != LM_JV_NONE)
    return arg_err("tojson", "indent must be an int");
  if (seps.kind == LM_JV_LIST && seps.u.l->n == 2 && seps.u.l->v[0].kind == LM_JV_STR &&
      seps.u.l->v[1].kind == LM_JV_STR) {
    o.item_sep = seps.u.l->v[0].u.s->s;
    o.key_sep = seps.u.l->v[1].u.s->s;
  } else if (seps.kind != LM_JV_NONE) {
    return arg_err("tojson", "separators must be a pair of strings");
  }
  lm_jbuf b = {0};
  b.cap_limit = x->lim.max_output;
  lm_status s = lm_jv_put_json(&b, in, &o);
  if (s == LM_OK) s = lm_jv_str(x->a, b.data ? b.data : "", b.len, out);
  lm_jbuf_free(&b);
  return s;
}

static lm_status f_trim(lm_jctx *x, lm_jv in, const lm_jcall *c, lm_jv *out) {
  lm_jv chars = lm_jv_none();
  lm_jcall_arg(c, 0, "chars", &chars);
  const lm_jstr *s;
  LM_TRY(text_of(x, in, &s));
  lm_jv sv = {LM_JV_STR, {.s = s}};
  lm_jv argv[1] = {chars};
  lm_jcall strip = {argv, 1, NULL, NULL, 0};
  int found;
  return lm_jinja_call_method(x, sv, "strip", &strip, out, &found);
}

static lm_status f_case(lm_jctx *x, int id, lm_jv in, lm_jv *out) {
  const lm_jstr *s;
  LM_TRY(text_of(x, in, &s));
  lm_jbuf b = {0};
  lm_status st = LM_OK;
  if (id == LM_JF_upper || id == LM_JF_lower) {
    st = lm_jbuf_put_case(&b, s->s, s->len, id == LM_JF_upper);
  } else { /* capitalize: first upper, rest lower; title: each word's first letter upper */
    int start = 1;
    for (size_t i = 0; i < s->len && st == LM_OK;) {
      uint32_t cp;
      size_t k = lm_jutf8_next(s->s + i, s->len - i, &cp);
      int boundary = id == LM_JF_title && (lm_py_isspace(cp) || cp == '-' || cp == '(' ||
                                           cp == '{' || cp == '[' || cp == '<');
      st = lm_jbuf_put_case(&b, s->s + i, k, start && !boundary);
      start = id == LM_JF_title ? boundary : 0;
      i += k;
    }
  }
  if (st == LM_OK) st = lm_jv_str(x->a, b.data ? b.data : "", b.len, out);
  lm_jbuf_free(&b);
  return st;
}

static lm_status f_escape(lm_jctx *x, lm_jv in, lm_jv *out) {
  const lm_jstr *s;
  LM_TRY(text_of(x, in, &s));
  lm_jbuf b = {0};
  lm_status st = LM_OK;
  for (size_t i = 0; i < s->len && st == LM_OK; i++) {
    switch (s->s[i]) {
    case '&': st = lm_jbuf_puts(&b, "&amp;"); break;
    case '<': st = lm_jbuf_puts(&b, "&lt;"); break;
    case '>': st = lm_jbuf_puts(&b, "&gt;"); break;
    case '"': st = lm_jbuf_puts(&b, "&#34;"); break;
    case '\'': st = lm_jbuf_puts(&b, "&#39;"); break;
    default: st = lm_jbuf_putc(&b, s->s[i]);
    }
  }
  if (st == LM_OK) st = lm_jv_str(x->a, b.data ? b.data : "", b.len, out);
  lm_jbuf_free(&b);
  return st;
}

static lm_status f_first_last(lm_jctx *x, int last, lm_jv in, lm_jv *out) {
  lm_jv items;
  LM_TRY(lm_jinja_iterate(x, in, &items));
  if (items.u.l->n == 0) {
    *out = lm_jv_undef();
    return LM_OK;
  }
  *out = items.u.l->v[last ? items.u.l->n - 1 : 0];
  return LM_OK;
}

static lm_status f_reverse(lm_jctx *x, lm_jv in, lm_jv *out) {
  lm_jv items, rev;
  LM_TRY(lm_jinja_iterate(x, in, &items));
  LM_TRY(lm_jv_list(x->a, items.u.l->n, &rev));
  for (size_t i = items.u.l->n; i-- > 0;)
    LM_TRY(lm_jv_list_push(x->a, rev, items.u.l->v[i]));
  if (in.kind != LM_JV_STR) {
    *out = rev;
    return LM_OK;
  }
  lm_jcall none = {0};
  lm_jv empty;
  LM_TRY(lm_jv_str(x->a, "", 0, &empty));
  lm_jv argv[1] = {empty};
  none.args = argv, none.nargs = 1;
  return f_join(x, rev, &none, out);
}

static lm_status f_sum(lm_jctx *x, lm_jv in, const lm_jcall *c, lm_jv *out) {
  lm_jv attr = lm_jv_undef(), acc = lm_jv_int(0), items;
  lm_jcall_arg(c, 0, "attribute", &attr);
  lm_jcall_arg(c, 1, "start", &acc);
  LM_TRY(lm_jinja_iterate(x, in, &items));
  for (size_t i = 0; i < items.u.l->n; i++) {
    lm_jv v = items.u.l->v[i];
    if (attr.kind != LM_JV_UNDEF) LM_TRY(attr_path(x, v, attr, &v));
    if ((!is_int(v) && v.kind != LM_JV_FLOAT) || (!is_int(acc) && acc.kind != LM_JV_FLOAT))
      return arg_err("sum", "values must be numbers");
    if (is_int(v) && is_int(acc)) {
      int64_t r;
      if (__builtin_add_overflow(ival(acc), ival(v), &r)) return arg_err("sum", "integer overflow");
      acc = lm_jv_int(r);
    } else {
      acc = lm_jv_float((acc.kind == LM_JV_FLOAT ? acc.u.f : (double)ival(acc)) +
                        (v.kind == LM_JV_FLOAT ? v.u.f : (double)ival(v)));
    }
  }
  *out = acc;
  return LM_OK;
}

static lm_status f_truncate(lm_jctx *x, lm_jv in, const lm_jcall *c, lm_jv *out) {
  lm_jv length = lm_jv_int(255), end = lm_jv_undef(), leeway = lm_jv_int(5);
  lm_jcall_arg(c, 0, "length", &length);
  int killwords = opt_bool(c, 1, "killwords", 0);
  lm_jcall_arg(c, 2, "end", &end);
  lm_jcall_arg(c, 3, "leeway", &leeway);
  const lm_jstr *s, *e;
  LM_TRY(text_of(x, in, &s));
  if (end.kind == LM_JV_UNDEF) LM_TRY(lm_jv_cstr(x->a, "...", &end));
  LM_TRY(text_of(x, end, &e));
  if (!is_int(length) || !is_int(leeway))
    return arg_err("truncate", "length and leeway must be ints");
  int64_t n = (int64_t)lm_jutf8_count(s->s, s->len), el = (int64_t)lm_jutf8_count(e->s, e->len);
  if (n <= ival(length) + ival(leeway)) {
    *out = (lm_jv){LM_JV_STR, {.s = s}};
    return LM_OK;
  }
  int64_t keep = ival(length) - el;
  if (keep < 0) keep = 0;
  size_t cut = lm_jutf8_offset(s->s, s->len, (size_t)keep);
  if (!killwords) {
    size_t sp = cut;
    while (sp > 0 && s->s[sp - 1] != ' ')
      sp--;
    if (sp > 0) cut = sp - 1;
  }
  lm_jbuf b = {0};
  lm_status st = lm_jbuf_put(&b, s->s, cut);
  if (st == LM_OK) st = lm_jbuf_put(&b, e->s, e->len);
  if (st == LM_OK) st = lm_jv_str(x->a, b.data, b.len, out);
  lm_jbuf_free(&b);
  return st;
}

static lm_status f_wordcount(lm_jctx *x, lm_jv in, lm_jv *out) {
  const lm_jstr *s;
  LM_TRY(text_of(x, in, &s));
  int64_t words = 0;
  int inword = 0;
  for (size_t i = 0; i < s->len;) {
    uint32_t cp;
    size_t k = lm_jutf8_next(s->s + i, s->len - i, &cp);
    int w = cp >= 0x80
                ? !lm_py_isspace(cp)
                : ((cp | 32) >= 'a' && (cp | 32) <= 'z') || (cp >= '0' && cp <= '9') || cp == '_';
    if (w && !inword) words++;
    inword = w;
    i += k;
  }
  *out = lm_jv_int(words);
  return LM_OK;
}

static lm_status f_center(lm_jctx *x, lm_jv in, const lm_jcall *c, lm_jv *out) {
  lm_jv width = lm_jv_int(80);
  lm_jcall_arg(c, 0, "width", &width);
  const lm_jstr *s;
  LM_TRY(text_of(x, in, &s));
  int64_t n = (int64_t)lm_jutf8_count(s->s, s->len), w = is_int(width) ? ival(width) : 80;
  if (w > 65536) w = 65536;
  if (n >= w) {
    *out = (lm_jv){LM_JV_STR, {.s = s}};
    return LM_OK;
  }
  int64_t pad = w - n, left = pad / 2 + (pad & w & 1); /* CPython's str.center rounding */
  lm_jbuf b = {0};
  lm_status st = LM_OK;
  for (int64_t i = 0; i < left && st == LM_OK; i++)
    st = lm_jbuf_putc(&b, ' ');
  if (st == LM_OK) st = lm_jbuf_put(&b, s->s, s->len);
  for (int64_t i = 0; i < pad - left && st == LM_OK; i++)
    st = lm_jbuf_putc(&b, ' ');
  if (st == LM_OK) st = lm_jv_str(x->a, b.data, b.len, out);
  lm_jbuf_free(&b);
  return st;
}

lm_status lm_jinja_apply_filter(lm_jctx *x, int id, lm_jv in, const lm_jcall *c, lm_jv *out) {
  lm_jv v;
  int64_t n;
  switch (id) {
  case LM_JF_abs:
    if (in.kind == LM_JV_FLOAT)
      *out = lm_jv_float(fabs(in.u.f));
    else if (is_int(in) && ival(in) != INT64_MIN)
      *out = lm_jv_int(ival(in) < 0 ? -ival(in) : ival(in));
    else
      return arg_err("abs", "bad operand type");
    return LM_OK;
  case LM_JF_attr:
    if (!lm_jcall_arg(c, 0, "name", &v) || v.kind != LM_JV_STR)
      return arg_err("attr", "needs a name");
    if (in.kind != LM_JV_NS &&
        in.kind != LM_JV_LOOP) { /* Python getattr(): dict keys are not attributes */
      *out = lm_jv_undef();
      return LM_OK;
    }
    return lm_jinja_getattr(x, in, v.u.s->s, out);
  case LM_JF_capitalize:
  case LM_JF_title:
  case LM_JF_upper:
  case LM_JF_lower: return f_case(x, id, in, out);
  case LM_JF_center: return f_center(x, in, c, out);
  case LM_JF_count:
  case LM_JF_length:
    LM_TRY(lm_jinja_len(in, &n));
    *out = lm_jv_int(n);
    return LM_OK;
  case LM_JF_d:
  case LM_JF_default: {
    lm_jv def;
    if (!lm_jcall_arg(c, 0, "default_value", &def)) LM_TRY(lm_jv_str(x->a, "", 0, &def));
    int use = in.kind == LM_JV_UNDEF || (opt_bool(c, 1, "boolean", 0) && !lm_jv_truthy(in));
    *out = use ? def : in;
    return LM_OK;
  }
  case LM_JF_dictsort: return f_dictsort(x, in, c, out);
  case LM_JF_e:
  case LM_JF_escape: return f_escape(x, in, out);
  case LM_JF_first:
  case LM_JF_last: return f_first_last(x, id == LM_JF_last, in, out);
  case LM_JF_float:
  case LM_JF_int: return f_int_float(x, id == LM_JF_int, in, c, out);
  case LM_JF_format: {
    lm_jv args;
    LM_TRY(lm_jv_list(x->a, c->nargs, &args));
    args.u.l->tuple = 1;
    for (size_t i = 0; i < c->nargs; i++)
      LM_TRY(lm_jv_list_push(x->a, args, c->args[i]));
    if (c->nkw) {
      LM_TRY(lm_jv_dict(x->a, c->nkw, &args));
      for (size_t i = 0; i < c->nkw; i++) {
        lm_jv k;
        LM_TRY(lm_jv_cstr(x->a, c->kwnames[i], &k));
        LM_TRY(lm_jv_dict_set(x->a, args, k, c->kwvals[i]));
      }
    }
    LM_TRY(lm_jv_to_str(x->a, in, &v));
    return lm_jinja_percent_format(x, v, args, out);
  }
  case LM_JF_indent: return f_indent(x, in, c, out);
  case LM_JF_items: return dict_items(x, in, out);
  case LM_JF_join: return f_join(x, in, c, out);
  case LM_JF_list: return lm_jinja_iterate(x, in, out);
  case LM_JF_map:
  case LM_JF_select:
  case LM_JF_reject:
  case LM_JF_selectattr:
  case LM_JF_rejectattr: return f_map_select(x, id, in, c, out);
  case LM_JF_max:
  case LM_JF_min:
  case LM_JF_sort:
  case LM_JF_unique: return f_sort_like(x, id, in, c, out);
  case LM_JF_replace: return f_replace(x, in, c, out);
  case LM_JF_reverse: return f_reverse(x, in, out);
  case LM_JF_round: return f_round(x, in, c, out);
  case LM_JF_safe: *out = in; return LM_OK;
  case LM_JF_string: return lm_jv_to_str(x->a, in, out);
  case LM_JF_sum: return f_sum(x, in, c, out);
  case LM_JF_tojson: return f_tojson(x, in, c, out);
  case LM_JF_trim: return f_trim(x, in, c, out);
  case LM_JF_truncate: return f_truncate(x, in, c, out);
  case LM_JF_wordcount: return f_wordcount(x, in, out);
  }
  return LM_ERRF(LM_ERR_UNSUPPORTED, "unknown filter id %d", id);
}

/* ---- tests ---------------------------------------------------------------------------------- */

static int is_callable(lm_jv v) { return v.kind == LM_JV_MACRO || v.kind == LM_JV_FUNC; }

static lm_status case_test(lm_jctx *x, lm_jv in, int upper, int *r) {
  const lm_jstr *s;
  LM_TRY(text_of(x, in, &s));
  lm_jbuf b = {0};
  lm_status st = lm_jbuf_put_case(&b, s->s, s->len, upper);
  lm_jbuf o = {0};
  if (st == LM_OK) st = lm_jbuf_put_case(&o, s->s, s->len, !upper);
  /* str.islower(): no uppercase letters and at least one cased letter */
  *r = st == LM_OK && b.len == s->len && memcmp(b.data ? b.data : "", s->s, s->len) == 0 &&
       !(o.len == s->len && memcmp(o.data ? o.data : "", s->s, s->len) == 0);
  lm_jbuf_free(&b);
  lm_jbuf_free(&o);
  return st;
}

lm_status lm_jinja_apply_test(lm_jctx *x, int id, lm_jv in, const lm_jcall *c, int *r) {
  lm_jv arg = lm_jv_undef();
  int have = lm_jcall_arg(c, 0, NULL, &arg), cmp;
  switch (id) {
  case LM_JT_boolean: *r = in.kind == LM_JV_BOOL; return LM_OK;
  case LM_JT_callable:
    *r = is_callable(in) || in.kind == LM_JV_UNDEF;
    return LM_OK; /* Undefined has __call__ */
  case LM_JT_defined: *r = in.kind != LM_JV_UNDEF; return LM_OK;
  case LM_JT_undefined: *r = in.kind == LM_JV_UNDEF; return LM_OK;
  case LM_JT_divisibleby:
    if (!have || !is_int(arg) || !is_int(in) || ival(arg) == 0)
      return LM_ERRF(LM_ERR_INVALID, "divisibleby needs ints");
    *r = ival(arg) == -1 || ival(in) % ival(arg) == 0;
    return LM_OK;
  case LM_JT_eq:
  case LM_JT_equalto: *r = lm_jv_equal(in, arg); return LM_OK;
  case LM_JT_ne: *r = !lm_jv_equal(in, arg); return LM_OK;
  case LM_JT_lt:
  case LM_JT_lessthan:
  case LM_JT_le:
  case LM_JT_gt:
  case LM_JT_greaterthan:
  case LM_JT_ge:
    LM_TRY(lm_jv_compare(in, arg, &cmp));
    *r = id == LM_JT_lt || id == LM_JT_lessthan ? cmp < 0
         : id == LM_JT_le                       ? cmp <= 0
         : id == LM_JT_ge                       ? cmp >= 0
                                                : cmp > 0;
    return LM_OK;
  case LM_JT_escaped: *r = 0; return LM_OK;
  case LM_JT_even:
  case LM_JT_odd:
    if (!is_int(in)) return LM_ERRF(LM_ERR_INVALID, "'%s' is not an integer", lm_jv_type_name(in));
    *r = (ival(in) % 2 != 0) == (id == LM_JT_odd);
    return LM_OK;
  case LM_JT_false: *r = in.kind == LM_JV_BOOL && !in.u.b; return LM_OK;
  case LM_JT_true: *r = in.kind == LM_JV_BOOL && in.u.b; return LM_OK;
  case LM_JT_float: *r = in.kind == LM_JV_FLOAT; return LM_OK;
  case LM_JT_integer: *r = in.kind == LM_JV_INT || in.kind == LM_JV_BIGINT; return LM_OK;
  case LM_JT_number: *r = lm_jv_is_num(in); return LM_OK;
  case LM_JT_in: {
    lm_jv items;
    if (arg.kind == LM_JV_STR) {
      if (in.kind != LM_JV_STR)
        return LM_ERRF(LM_ERR_INVALID, "'in <string>' requires string as left operand");
      *r = memmem(arg.u.s->s, arg.u.s->len, in.u.s->s, in.u.s->len) != NULL || in.u.s->len == 0;
      return LM_OK;
    }
    if (arg.kind == LM_JV_DICT) {
      lm_jv d;
      *r = lm_jv_dict_get(arg, in, &d);
      return LM_OK;
    }
    LM_TRY(lm_jinja_iterate(x, arg, &items));
    *r = 0;
    for (size_t i = 0; i < items.u.l->n && !*r; i++)
      *r = lm_jv_equal(in, items.u.l->v[i]);
    return LM_OK;
  }
  case LM_JT_iterable:
    *r = in.kind == LM_JV_UNDEF || in.kind == LM_JV_STR || in.kind == LM_JV_LIST ||
         in.kind == LM_JV_DICT;
    return LM_OK;
  case LM_JT_sequence: /* len() and __getitem__: str, list, tuple, dict (and Undefined) */
    *r = in.kind == LM_JV_UNDEF || in.kind == LM_JV_STR || in.kind == LM_JV_LIST ||
         in.kind == LM_JV_DICT;
    return LM_OK;
  case LM_JT_mapping: *r = in.kind == LM_JV_DICT; return LM_OK;
  case LM_JT_none: *r = in.kind == LM_JV_NONE; return LM_OK;
  case LM_JT_string: *r = in.kind == LM_JV_STR; return LM_OK;
  case LM_JT_lower:
  case LM_JT_upper: return case_test(x, in, id == LM_JT_upper, r);
  case LM_JT_sameas:
    if (in.kind != arg.kind)
      *r = 0;
    else if (in.kind == LM_JV_STR || in.kind == LM_JV_LIST || in.kind == LM_JV_DICT ||
             in.kind == LM_JV_NS)
      *r = in.u.p == arg.u.p;
    else
      *r = lm_jv_equal(in, arg);
    return LM_OK;
  }
  return LM_ERRF(LM_ERR_UNSUPPORTED, "unknown test id %d", id);
}
