/* jinja_value.c — arena, value constructors, Python equality/ordering/printing, JSON in and out. */
#include "text/jinja_value.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"

/* ---- arena ---------------------------------------------------------------------------------- */

typedef struct lm_jblock {
  struct lm_jblock *next;
  size_t used, cap;
  _Alignas(16) unsigned char data[];
} lm_jblock;

struct lm_jarena {
  lm_jblock *head;
  size_t total, max_bytes;
};

#define LM_JARENA_BLOCK (64u * 1024u)

lm_status lm_jarena_create(size_t max_bytes, lm_jarena **out) {
  *out = calloc(1, sizeof **out);
  if (!*out) return LM_ERRF(LM_ERR_NOMEM, "out of memory (arena)");
  (*out)->max_bytes = max_bytes;
  return LM_OK;
}

void lm_jarena_free(lm_jarena *a) {
  if (!a) return;
  for (lm_jblock *b = a->head, *n; b; b = n) {
    n = b->next;
    free(b);
  }
  free(a);
}

size_t lm_jarena_used(const lm_jarena *a) { return a->total; }

lm_status lm_jarena_alloc(lm_jarena *a, size_t size, void **out) {
  if (size > SIZE_MAX / 2) return LM_ERRF(LM_ERR_NOMEM, "allocation of %zu bytes", size);
  size = (size + 15) & ~(size_t)15;
  if (size == 0) size = 16;
  lm_jblock *b = a->head;
  if (!b || b->cap - b->used < size) {
    size_t cap = size > LM_JARENA_BLOCK / 4 ? size : LM_JARENA_BLOCK;
    if (a->max_bytes && a->total + cap > a->max_bytes)
      return LM_ERRF(LM_ERR_NOMEM, "template used more than its memory limit of %zu bytes",
                     a->max_bytes);
    lm_jblock *nb = malloc(sizeof *nb + cap);
    if (!nb) return LM_ERRF(LM_ERR_NOMEM, "out of memory (%zu bytes)", cap);
    nb->used = 0;
    nb->cap = cap;
    a->total += cap;
    if (b &&
        cap == size) { /* a big one-off block goes behind the current one, which keeps filling */
      nb->next = b->next;
      b->next = nb;
      b = nb;
    } else {
      nb->next = b;
      a->head = b = nb;
    }
  }
  void *p = b->data + b->used;
  b->used += size;
  memset(p, 0, size);
  *out = p;
  return LM_OK;
}

/* ---- constructors --------------------------------------------------------------------------- */

lm_status lm_jv_str(lm_jarena *a, const char *s, size_t n, lm_jv *out) {
  lm_jstr *js;
  LM_TRY(lm_jarena_alloc(a, sizeof *js + n + 1, (void **)&js));
  js->len = n;
  if (n) memcpy(js->s, s, n);
  js->s[n] = '\0';
  out->kind = LM_JV_STR;
  out->u.s = js;
  return LM_OK;
}

lm_status lm_jv_cstr(lm_jarena *a, const char *s, lm_jv *out) {
  return lm_jv_str(a, s, strlen(s), out);
}

lm_status lm_jv_list(lm_jarena *a, size_t cap, lm_jv *out) {
  lm_jlist *l;
  LM_TRY(lm_jarena_alloc(a, sizeof *l, (void **)&l));
  if (cap) {
    LM_TRY(lm_jarena_alloc(a, cap * sizeof *l->v, (void **)&l->v));
    l->cap = cap;
  }
  out->kind = LM_JV_LIST;
  out->u.l = l;
  return LM_OK;
}

lm_status lm_jv_dict(lm_jarena *a, size_t cap, lm_jv *out) {
  lm_jdict *d;
  LM_TRY(lm_jarena_alloc(a, sizeof *d, (void **)&d));
  if (cap) {
    LM_TRY(lm_jarena_alloc(a, cap * sizeof *d->k, (void **)&d->k));
    LM_TRY(lm_jarena_alloc(a, cap * sizeof *d->v, (void **)&d->v));
    d->cap = cap;
  }
  out->kind = LM_JV_DICT;
  out->u.d = d;
  return LM_OK;
}

static lm_status grow(lm_jarena *a, lm_jv **arr, size_t n, size_t *cap) {
  if (n < *cap) return LM_OK;
  size_t nc = *cap ? *cap * 2 : 4;
  lm_jv *p;
  LM_TRY(lm_jarena_alloc(a, nc * sizeof *p, (void **)&p));
  if (n) memcpy(p, *arr, n * sizeof *p);
  *arr = p;
  *cap = nc;
  return LM_OK;
}

lm_status lm_jv_list_push(lm_jarena *a, lm_jv list, lm_jv item) {
  lm_jlist *l = list.u.l;
  LM_TRY(grow(a, &l->v, l->n, &l->cap));
  l->v[l->n++] = item;
  return LM_OK;
}

static lm_status dict_append(lm_jarena *a, lm_jdict *d, lm_jv key, lm_jv val) {
  if (d->n == d->cap) {
    size_t cap = d->cap ? d->cap * 2 : 4;
    lm_jv *k, *v;
    LM_TRY(lm_jarena_alloc(a, cap * sizeof *k, (void **)&k));
    LM_TRY(lm_jarena_alloc(a, cap * sizeof *v, (void **)&v));
    if (d->n) {
      memcpy(k, d->k, d->n * sizeof *k);
      memcpy(v, d->v, d->n * sizeof *v);
    }
    d->k = k, d->v = v, d->cap = cap;
  }
  d->k[d->n] = key;
  d->v[d->n++] = val;
  return LM_OK;
}

lm_status lm_jv_dict_set(lm_jarena *a, lm_jv dict, lm_jv key, lm_jv val) {
  lm_jdict *d = dict.u.d;
  for (size_t i = 0; i < d->n; i++)
    if (lm_jv_equal(d->k[i], key)) {
      d->v[i] = val;
      return LM_OK;
    }
  return dict_append(a, d, key, val);
}

int lm_jv_dict_get(lm_jv dict, lm_jv key, lm_jv *out) {
  const lm_jdict *d = dict.u.d;
  for (size_t i = 0; i < d->n; i++)
    if (lm_jv_equal(d->k[i], key)) {
      *out = d->v[i];
      return 1;
    }
  return 0;
}

int lm_jv_dict_gets(lm_jv dict, const char *key, lm_jv *out) {
  const lm_jdict *d = dict.u.d;
  size_t n = strlen(key);
  for (size_t i = 0; i < d->n; i++)
    if (d->k[i].kind == LM_JV_STR && d->k[i].u.s->len == n && memcmp(d->k[i].u.s->s, key, n) == 0) {
      *out = d->v[i];
      return 1;
    }
  return 0;
}

/* ---- truthiness, equality, ordering --------------------------------------------------------- */

int lm_jv_truthy(lm_jv v) {
  switch (v.kind) {
  case LM_JV_UNDEF:
  case LM_JV_NONE: return 0;
  case LM_JV_BOOL: return v.u.b;
  case LM_JV_INT: return v.u.i != 0;
  case LM_JV_BIGINT: return 1;
  case LM_JV_FLOAT: return v.u.f != 0;
  case LM_JV_STR: return v.u.s->len != 0;
  case LM_JV_LIST: return v.u.l->n != 0;
  case LM_JV_DICT: return v.u.d->n != 0;
  default: return 1;
  }
}

static int is_intlike(lm_jv v) { return v.kind == LM_JV_INT || v.kind == LM_JV_BOOL; }
static int64_t intval(lm_jv v) { return v.kind == LM_JV_BOOL ? v.u.b : v.u.i; }
static double numval(lm_jv v) {
  if (v.kind == LM_JV_FLOAT) return v.u.f;
  if (v.kind == LM_JV_BIGINT) return strtod(v.u.s->s, NULL);
  return (double)intval(v);
}

static int str_eq(const lm_jstr *a, const lm_jstr *b) {
  return a->len == b->len && memcmp(a->s, b->s, a->len) == 0;
}

int lm_jv_equal(lm_jv a, lm_jv b) {
  if (is_intlike(a) && is_intlike(b)) return intval(a) == intval(b);
  if (a.kind == LM_JV_BIGINT && b.kind == LM_JV_BIGINT) return str_eq(a.u.s, b.u.s);
  if (a.kind == LM_JV_BIGINT || b.kind == LM_JV_BIGINT) {
    if (!lm_jv_is_num(a) || !lm_jv_is_num(b) || is_intlike(a) || is_intlike(b)) return 0;
    return numval(a) == numval(b);
  }
  if (lm_jv_is_num(a) && lm_jv_is_num(b)) return numval(a) == numval(b);
  if (a.kind != b.kind) return 0;
  switch (a.kind) {
  case LM_JV_UNDEF:
  case LM_JV_NONE: return 1;
  case LM_JV_STR: return str_eq(a.u.s, b.u.s);
  case LM_JV_LIST:
    if (a.u.l->tuple != b.u.l->tuple || a.u.l->n != b.u.l->n) return 0;
    for (size_t i = 0; i < a.u.l->n; i++)
      if (!lm_jv_equal(a.u.l->v[i], b.u.l->v[i])) return 0;
    return 1;
  case LM_JV_DICT:
    if (a.u.d->n != b.u.d->n) return 0;
    for (size_t i = 0; i < a.u.d->n; i++) {
      lm_jv other;
      if (!lm_jv_dict_get(b, a.u.d->k[i], &other) || !lm_jv_equal(a.u.d->v[i], other)) return 0;
    }
    return 1;
  case LM_JV_FUNC: return a.u.i == b.u.i;
  default: return a.u.p == b.u.p;
  }
}

static int cmp_bytes(const lm_jstr *a, const lm_jstr *b) {
  /* UTF-8 byte order is code point order, which is how Python orders str. */
  size_t n = a->len < b->len ? a->len : b->len;
  int c = memcmp(a->s, b->s, n);
  if (c) return c < 0 ? -1 : 1;
  return a->len < b->len ? -1 : a->len > b->len ? 1 : 0;
}

static int bigint_sign(lm_jv v) { return v.u.s->s[0] == '-' ? -1 : 1; }

lm_status lm_jv_compare(lm_jv a, lm_jv b, int *cmp) {
  if (is_intlike(a) && is_intlike(b)) {
    int64_t x = intval(a), y = intval(b);
    *cmp = x < y ? -1 : x > y;
    return LM_OK;
  }
  if (lm_jv_is_num(a) && lm_jv_is_num(b)) {
    if (a.kind == LM_JV_BIGINT && is_intlike(b)) {
      *cmp = bigint_sign(a);
      return LM_OK;
    }
    if (b.kind == LM_JV_BIGINT && is_intlike(a)) {
      *cmp = -bigint_sign(b);
      return LM_OK;
    }
    double x = numval(a), y = numval(b);
    *cmp = x < y ? -1 : x > y;
    return LM_OK;
  }
  if (a.kind == LM_JV_STR && b.kind == LM_JV_STR) {
    *cmp = cmp_bytes(a.u.s, b.u.s);
    return LM_OK;
  }
  if (a.kind == LM_JV_LIST && b.kind == LM_JV_LIST && a.u.l->tuple == b.u.l->tuple) {
    size_t n = a.u.l->n < b.u.l->n ? a.u.l->n : b.u.l->n;
    for (size_t i = 0; i < n; i++) {
      if (lm_jv_equal(a.u.l->v[i], b.u.l->v[i])) continue;
      return lm_jv_compare(a.u.l->v[i], b.u.l->v[i], cmp);
    }
    *cmp = a.u.l->n < b.u.l->n ? -1 : a.u.l->n > b.u.l->n;
    return LM_OK;
  }
  return LM_ERRF(LM_ERR_INVALID, "'<' not supported between instances of '%s' and '%s'",
                 lm_jv_type_name(a), lm_jv_type_name(b));
}

const char *lm_jv_type_name(lm_jv v) {
  switch (v.kind) {
  case LM_JV_UNDEF: return "Undefined";
  case LM_JV_NONE: return "NoneType";
  case LM_JV_BOOL: return "bool";
  case LM_JV_INT:
  case LM_JV_BIGINT: return "int";
  case LM_JV_FLOAT: return "float";
  case LM_JV_STR: return "str";
  case LM_JV_LIST: return v.u.l->tuple ? "tuple" : "list";
  case LM_JV_DICT: return "dict";
  case LM_JV_NS: return "Namespace";
  case LM_JV_MACRO: return "Macro";
  case LM_JV_FUNC: return "function";
  case LM_JV_LOOP: return "LoopContext";
  }
  return "object";
}

/* ---- printing ------------------------------------------------------------------------------- */

static lm_status put_seq_repr(lm_jbuf *b, const lm_jlist *l) {
  LM_TRY(lm_jbuf_putc(b, l->tuple ? '(' : '['));
  for (size_t i = 0; i < l->n; i++) {
    if (i) LM_TRY(lm_jbuf_puts(b, ", "));
    LM_TRY(lm_jv_put_repr(b, l->v[i]));
  }
  if (l->tuple && l->n == 1) LM_TRY(lm_jbuf_putc(b, ','));
  return lm_jbuf_putc(b, l->tuple ? ')' : ']');
}

static lm_status put_dict_repr(lm_jbuf *b, const lm_jdict *d) {
  LM_TRY(lm_jbuf_putc(b, '{'));
  for (size_t i = 0; i < d->n; i++) {
    if (i) LM_TRY(lm_jbuf_puts(b, ", "));
    LM_TRY(lm_jv_put_repr(b, d->k[i]));
    LM_TRY(lm_jbuf_puts(b, ": "));
    LM_TRY(lm_jv_put_repr(b, d->v[i]));
  }
  return lm_jbuf_putc(b, '}');
}

lm_status lm_jv_put_str(lm_jbuf *b, lm_jv v) {
  char num[32];
  switch (v.kind) {
  case LM_JV_UNDEF: return LM_OK;
  case LM_JV_NONE: return lm_jbuf_puts(b, "None");
  case LM_JV_BOOL: return lm_jbuf_puts(b, v.u.b ? "True" : "False");
  case LM_JV_INT: return lm_jbuf_printf(b, "%lld", (long long)v.u.i);
  case LM_JV_BIGINT:
  case LM_JV_STR: return lm_jbuf_put(b, v.u.s->s, v.u.s->len);
  case LM_JV_FLOAT: return lm_jbuf_put(b, num, lm_py_float_repr(v.u.f, num));
  case LM_JV_LIST: return put_seq_repr(b, v.u.l);
  case LM_JV_DICT: return put_dict_repr(b, v.u.d);
  case LM_JV_NS:
    LM_TRY(lm_jbuf_puts(b, "<Namespace "));
    LM_TRY(put_dict_repr(b, v.u.d));
    return lm_jbuf_putc(b, '>');
  case LM_JV_MACRO: return lm_jbuf_puts(b, "<Macro>");
  case LM_JV_FUNC: return lm_jbuf_puts(b, "<built-in function>");
  case LM_JV_LOOP: return lm_jbuf_puts(b, "<LoopContext>");
  }
  return LM_OK;
}

lm_status lm_jv_put_repr(lm_jbuf *b, lm_jv v) {
  if (v.kind == LM_JV_STR) return lm_jbuf_put_pyrepr(b, v.u.s->s, v.u.s->len);
  if (v.kind == LM_JV_UNDEF) return lm_jbuf_puts(b, "Undefined");
  return lm_jv_put_str(b, v);
}

lm_status lm_jv_to_str(lm_jarena *a, lm_jv v, lm_jv *out) {
  if (v.kind == LM_JV_STR) {
    *out = v;
    return LM_OK;
  }
  lm_jbuf b = {0};
  lm_status s = lm_jv_put_str(&b, v);
  if (s == LM_OK) s = lm_jv_str(a, b.data ? b.data : "", b.len, out);
  lm_jbuf_free(&b);
  return s;
}

/* ---- JSON out (json.dumps) ------------------------------------------------------------------- */

static lm_status json_newline(lm_jbuf *b, const lm_jv_json_opts *o, int level) {
  if (o->indent < 0) return LM_OK;
  LM_TRY(lm_jbuf_putc(b, '\n'));
  for (int i = 0; i < o->indent * level; i++)
    LM_TRY(lm_jbuf_putc(b, ' '));
  return LM_OK;
}

static lm_status json_key(lm_jbuf *b, lm_jv k, const lm_jv_json_opts *o) {
  /* json.dumps turns non-str keys into strings: 1 -> "1", True -> "true", None -> "null". */
  char num[32];
  LM_TRY(lm_jbuf_putc(b, '"'));
  switch (k.kind) {
  case LM_JV_STR: LM_TRY(lm_jbuf_put_json_str(b, k.u.s->s, k.u.s->len, o->ensure_ascii)); break;
  case LM_JV_INT: LM_TRY(lm_jbuf_printf(b, "%lld", (long long)k.u.i)); break;
  case LM_JV_BIGINT: LM_TRY(lm_jbuf_put(b, k.u.s->s, k.u.s->len)); break;
  case LM_JV_FLOAT: LM_TRY(lm_jbuf_put(b, num, lm_py_float_repr(k.u.f, num))); break;
  case LM_JV_BOOL: LM_TRY(lm_jbuf_puts(b, k.u.b ? "true" : "false")); break;
  case LM_JV_NONE: LM_TRY(lm_jbuf_puts(b, "null")); break;
  default:
    return LM_ERRF(LM_ERR_INVALID, "keys must be str, int, float, bool or None, not %s",
                   lm_jv_type_name(k));
  }
  return lm_jbuf_putc(b, '"');
}

static lm_status json_value(lm_jbuf *b, lm_jv v, const lm_jv_json_opts *o, int level);

static lm_status json_dict(lm_jbuf *b, const lm_jdict *d, const lm_jv_json_opts *o, int level) {
  if (d->n == 0) return lm_jbuf_puts(b, "{}");
  size_t order_small[32], *order = order_small;
  if (d->n > 32 && !(order = malloc(d->n * sizeof *order)))
    return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  for (size_t i = 0; i < d->n; i++)
    order[i] = i;
  if (o->sort_keys) /* insertion sort: stable, and dicts printed this way are small */
    for (size_t i = 1; i < d->n; i++)
      for (size_t j = i; j > 0; j--) {
        int c = 0;
        if (lm_jv_compare(d->k[order[j - 1]], d->k[order[j]], &c) != LM_OK || c <= 0) break;
        size_t t = order[j];
        order[j] = order[j - 1], order[j - 1] = t;
      }
  lm_status s = lm_jbuf_putc(b, '{');
  for (size_t i = 0; s == LM_OK && i < d->n; i++) {
    if (i) s = lm_jbuf_puts(b, o->item_sep);
    if (s == LM_OK) s = json_newline(b, o, level + 1);
    if (s == LM_OK) s = json_key(b, d->k[order[i]], o);
    if (s == LM_OK) s = lm_jbuf_puts(b, o->key_sep);
    if (s == LM_OK) s = json_value(b, d->v[order[i]], o, level + 1);
  }
  if (order != order_small) free(order);
  if (s == LM_OK) s = json_newline(b, o, level);
  return s == LM_OK ? lm_jbuf_putc(b, '}') : s;
}

static lm_status json_value(lm_jbuf *b, lm_jv v, const lm_jv_json_opts *o, int level) {
  char num[32];
  if (level > 512) return LM_ERRF(LM_ERR_INVALID, "tojson: nesting deeper than 512");
  switch (v.kind) {
  case LM_JV_NONE: return lm_jbuf_puts(b, "null");
  case LM_JV_BOOL: return lm_jbuf_puts(b, v.u.b ? "true" : "false");
  case LM_JV_INT:
  case LM_JV_BIGINT: return lm_jv_put_str(b, v);
  case LM_JV_FLOAT:
    if (isnan(v.u.f)) return lm_jbuf_puts(b, "NaN");
    if (isinf(v.u.f)) return lm_jbuf_puts(b, v.u.f < 0 ? "-Infinity" : "Infinity");
    return lm_jbuf_put(b, num, lm_py_float_repr(v.u.f, num));
  case LM_JV_STR:
    LM_TRY(lm_jbuf_putc(b, '"'));
    LM_TRY(lm_jbuf_put_json_str(b, v.u.s->s, v.u.s->len, o->ensure_ascii));
    return lm_jbuf_putc(b, '"');
  case LM_JV_LIST:
    if (v.u.l->n == 0) return lm_jbuf_puts(b, "[]");
    LM_TRY(lm_jbuf_putc(b, '['));
    for (size_t i = 0; i < v.u.l->n; i++) {
      if (i) LM_TRY(lm_jbuf_puts(b, o->item_sep));
      LM_TRY(json_newline(b, o, level + 1));
      LM_TRY(json_value(b, v.u.l->v[i], o, level + 1));
    }
    LM_TRY(json_newline(b, o, level));
    return lm_jbuf_putc(b, ']');
  case LM_JV_DICT: return json_dict(b, v.u.d, o, level);
  default:
    return LM_ERRF(LM_ERR_INVALID, "Object of type %s is not JSON serializable",
                   lm_jv_type_name(v));
  }
}

lm_status lm_jv_put_json(lm_jbuf *b, lm_jv v, const lm_jv_json_opts *opts) {
  lm_jv_json_opts o = *opts;
  if (!o.item_sep) o.item_sep = o.indent >= 0 ? "," : ", ";
  if (!o.key_sep) o.key_sep = ": ";
  return json_value(b, v, &o, 0);
}

/* ---- JSON in: jansson ----------------------------------------------------------------------- */

lm_status lm_jv_from_json(lm_jarena *a, const json_t *j, lm_jv *out) {
  if (!j) {
    *out = lm_jv_none();
    return LM_OK;
  }
  switch (json_typeof(j)) {
  case JSON_NULL: *out = lm_jv_none(); return LM_OK;
  case JSON_TRUE: *out = lm_jv_bool(1); return LM_OK;
  case JSON_FALSE: *out = lm_jv_bool(0); return LM_OK;
  case JSON_INTEGER: *out = lm_jv_int((int64_t)json_integer_value(j)); return LM_OK;
  case JSON_REAL: *out = lm_jv_float(json_real_value(j)); return LM_OK;
  case JSON_STRING: return lm_jv_str(a, json_string_value(j), json_string_length(j), out);
  case JSON_ARRAY: {
    LM_TRY(lm_jv_list(a, json_array_size(j), out));
    for (size_t i = 0; i < json_array_size(j); i++) {
      lm_jv item;
      LM_TRY(lm_jv_from_json(a, json_array_get(j, i), &item));
      LM_TRY(lm_jv_list_push(a, *out, item));
    }
    return LM_OK;
  }
  case JSON_OBJECT: {
    LM_TRY(lm_jv_dict(a, json_object_size(j), out));
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)j, key,
                        val) { /* jansson keeps insertion order; keys are unique */
      lm_jv k, v;
      LM_TRY(lm_jv_cstr(a, key, &k));
      LM_TRY(lm_jv_from_json(a, val, &v));
      LM_TRY(dict_append(a, out->u.d, k, v));
    }
    return LM_OK;
  }
  }
  return LM_ERRF(LM_ERR_INVALID, "unknown JSON type");
}

/* ---- JSON in: exact text reader ------------------------------------------------------------- */

typedef struct jreader {
  lm_jarena *a;
  const char *s;
  size_t n, i;
  int depth;
} jreader;

static void jr_ws(jreader *r) {
  while (r->i < r->n &&
         (r->s[r->i] == ' ' || r->s[r->i] == '\t' || r->s[r->i] == '\n' || r->s[r->i] == '\r'))
    r->i++;
}

static lm_status jr_err(jreader *r, const char *what) {
  return LM_ERRF(LM_ERR_INVALID, "JSON: %s at byte %zu", what, r->i);
}

static int jr_hex4(jreader *r, uint32_t *v) {
  if (r->n - r->i < 4) return 0;
  *v = 0;
  for (int k = 0; k < 4; k++) {
    char c = r->s[r->i + (size_t)k];
    int d = c >= '0' && c <= '9'   ? c - '0'
            : c >= 'a' && c <= 'f' ? c - 'a' + 10
            : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                   : -1;
    if (d < 0) return 0;
    *v = *v * 16 + (uint32_t)d;
  }
  r->i += 4;
  return 1;
}

static lm_status jr_string(jreader *r, lm_jv *out) {
  lm_jbuf b = {0};
  lm_status s = LM_OK;
  r->i++; /* opening quote */
  for (;;) {
    if (r->i >= r->n) {
      s = jr_err(r, "unterminated string");
      break;
    }
    unsigned char c = (unsigned char)r->s[r->i];
    if (c == '"') {
      r->i++;
      break;
    }
    if (c < 0x20) {
      s = jr_err(r, "control character in string");
      break;
    }
    if (c != '\\') {
      size_t j = r->i;
      while (j < r->n && r->s[j] != '"' && r->s[j] != '\\' && (unsigned char)r->s[j] >= 0x20)
        j++;
      if ((s = lm_jbuf_put(&b, r->s + r->i, j - r->i)) != LM_OK) break;
      r->i = j;
      continue;
    }
    if (++r->i >= r->n) {
      s = jr_err(r, "unterminated escape");
      break;
    }
    char e = r->s[r->i++], lit = 0;
    switch (e) {
    case '"': lit = '"'; break;
    case '\\': lit = '\\'; break;
    case '/': lit = '/'; break;
    case 'b': lit = '\b'; break;
    case 'f': lit = '\f'; break;
    case 'n': lit = '\n'; break;
    case 'r': lit = '\r'; break;
    case 't': lit = '\t'; break;
    case 'u': {
      uint32_t cp, lo;
      if (!jr_hex4(r, &cp)) {
        s = jr_err(r, "bad \\u escape");
        break;
      }
      if (cp >= 0xD800 && cp <= 0xDBFF && r->n - r->i >= 6 && r->s[r->i] == '\\' &&
          r->s[r->i + 1] == 'u') {
        size_t save = r->i;
        r->i += 2;
        if (jr_hex4(r, &lo) && lo >= 0xDC00 && lo <= 0xDFFF)
          cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        else
          r->i = save;
      }
      if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD; /* a lone surrogate has no UTF-8 form */
      char enc[4];
      s = lm_jbuf_put(&b, enc, lm_jutf8_put(cp, enc));
      break;
    }
    default: s = jr_err(r, "bad escape");
    }
    if (s != LM_OK) break;
    if (lit && (s = lm_jbuf_putc(&b, lit)) != LM_OK) break;
  }
  if (s == LM_OK) s = lm_jv_str(r->a, b.data ? b.data : "", b.len, out);
  lm_jbuf_free(&b);
  return s;
}

static lm_status jr_number(jreader *r, lm_jv *out) {
  size_t start = r->i, j = r->i;
  int is_float = 0;
  if (j < r->n && r->s[j] == '-') j++;
  if (j < r->n && r->s[j] == '0')
    j++;
  else if (j < r->n && r->s[j] >= '1' && r->s[j] <= '9')
    while (j < r->n && r->s[j] >= '0' && r->s[j] <= '9')
      j++;
  else
    return jr_err(r, "bad number");
  if (j < r->n && r->s[j] == '.') {
    is_float = 1;
    if (++j >= r->n || r->s[j] < '0' || r->s[j] > '9') return jr_err(r, "bad number");
    while (j < r->n && r->s[j] >= '0' && r->s[j] <= '9')
      j++;
  }
  if (j < r->n && (r->s[j] == 'e' || r->s[j] == 'E')) {
    is_float = 1;
    j++;
    if (j < r->n && (r->s[j] == '+' || r->s[j] == '-')) j++;
    if (j >= r->n || r->s[j] < '0' || r->s[j] > '9') return jr_err(r, "bad number");
    while (j < r->n && r->s[j] >= '0' && r->s[j] <= '9')
      j++;
  }
  char small[64];
  char *txt = small;
  size_t len = j - start;
  if (len >= sizeof small && !(txt = malloc(len + 1)))
    return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  memcpy(txt, r->s + start, len);
  txt[len] = '\0';
  r->i = j;
  lm_status s = LM_OK;
  if (is_float) {
    *out = lm_jv_float(strtod(txt, NULL));
  } else {
    errno = 0;
    long long v = strtoll(txt, NULL, 10);
    if (errno == ERANGE) {
      s = lm_jv_str(r->a, txt, len, out);
      out->kind = LM_JV_BIGINT;
    } else {
      *out = lm_jv_int(v);
    }
  }
  if (txt != small) free(txt);
  return s;
}

static int jr_word(jreader *r, const char *w) {
  size_t n = strlen(w);
  if (r->n - r->i < n || memcmp(r->s + r->i, w, n) != 0) return 0;
  r->i += n;
  return 1;
}

static lm_status jr_value(jreader *r, lm_jv *out);

static lm_status jr_container(jreader *r, int is_obj, lm_jv *out) {
  if (++r->depth > 512) return jr_err(r, "nesting deeper than 512");
  r->i++;
  LM_TRY(is_obj ? lm_jv_dict(r->a, 0, out) : lm_jv_list(r->a, 0, out));
  jr_ws(r);
  char close = is_obj ? '}' : ']';
  if (r->i < r->n && r->s[r->i] == close) {
    r->i++;
    r->depth--;
    return LM_OK;
  }
  for (;;) {
    jr_ws(r);
    lm_jv key = lm_jv_none(), val;
    if (is_obj) {
      if (r->i >= r->n || r->s[r->i] != '"') return jr_err(r, "expected a string key");
      LM_TRY(jr_string(r, &key));
      jr_ws(r);
      if (r->i >= r->n || r->s[r->i] != ':') return jr_err(r, "expected ':'");
      r->i++;
    }
    LM_TRY(jr_value(r, &val));
    LM_TRY(is_obj ? lm_jv_dict_set(r->a, *out, key, val) : lm_jv_list_push(r->a, *out, val));
    jr_ws(r);
    if (r->i < r->n && r->s[r->i] == ',') {
      r->i++;
      continue;
    }
    if (r->i < r->n && r->s[r->i] == close) {
      r->i++;
      r->depth--;
      return LM_OK;
    }
    return jr_err(r, is_obj ? "expected ',' or '}'" : "expected ',' or ']'");
  }
}

static lm_status jr_value(jreader *r, lm_jv *out) {
  jr_ws(r);
  if (r->i >= r->n) return jr_err(r, "unexpected end");
  char c = r->s[r->i];
  if (c == '{' || c == '[') return jr_container(r, c == '{', out);
  if (c == '"') return jr_string(r, out);
  if (c == '-' || (c >= '0' && c <= '9')) {
    if (jr_word(r, "-Infinity")) {
      *out = lm_jv_float(-INFINITY);
      return LM_OK;
    }
    return jr_number(r, out);
  }
  if (jr_word(r, "true"))
    *out = lm_jv_bool(1);
  else if (jr_word(r, "false"))
    *out = lm_jv_bool(0);
  else if (jr_word(r, "null"))
    *out = lm_jv_none();
  else if (jr_word(r, "NaN"))
    *out = lm_jv_float(NAN); /* Python's json.loads accepts these */
  else if (jr_word(r, "Infinity"))
    *out = lm_jv_float(INFINITY);
  else
    return jr_err(r, "unexpected character");
  return LM_OK;
}

lm_status lm_jv_parse_json(lm_jarena *a, const char *text, size_t len, lm_jv *out) {
  jreader r = {a, text, len, 0, 0};
  LM_TRY(jr_value(&r, out));
  jr_ws(&r);
  if (r.i != r.n) return jr_err(&r, "trailing characters");
  return LM_OK;
}
