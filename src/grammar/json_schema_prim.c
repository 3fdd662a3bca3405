/* json_schema_prim.c — the JSON pieces every schema grammar is built from: bounded whitespace,
 * strings (characters, escapes, lengths, patterns, formats), literals for enum / const and
 * property names, and "any JSON value".
 *
 * A string character is any Unicode scalar value but '"', '\' and the controls (raw UTF-8), or
 * an escape; \u escapes of surrogates are left out, so every character of the written string is
 * exactly one code point and minLength / maxLength count what JSON Schema counts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "grammar/grammar_utf8.h"
#include "grammar/json_schema_impl.h"

static lm_status set_elem(lm_js *c, lm_gseq *s, const char *chars) {
  lm_gset g = {{0}};
  for (const char *p = chars; *p; p++) {
    if (p[1] == '-' && p[2]) {
      lm_gset_add_range(&g, (uint8_t)p[0], (uint8_t)p[2]);
      p += 2;
    } else {
      lm_gset_add(&g, (uint8_t)*p);
    }
  }
  return lm_gseq_set(c->b, s, &g);
}

static lm_status alt_done(lm_js *c, int32_t rule, lm_gseq *s, lm_status st) {
  if (st == LM_OK) st = lm_gir_add_alt(c->b, rule, s);
  lm_gseq_free(s);
  return st;
}

lm_status lm_js_ws(lm_js *c, int32_t *rule) {
  if (c->r_ws >= 0) {
    *rule = c->r_ws;
    return LM_OK;
  }
  int32_t ws, indent;
  lm_gseq s = {0};
  LM_TRY(lm_gir_rule(c->b, "ws", &ws));
  LM_TRY(alt_done(c, ws, &s, LM_OK));
  LM_TRY(alt_done(c, ws, &s, lm_gseq_byte(c->b, &s, ' ')));
  LM_TRY(set_elem(c, &s, " \t"));
  LM_TRY(lm_gir_wrap(c->b, "ws-indent", &s, &indent));
  lm_status st = lm_gseq_byte(c->b, &s, '\n');
  if (st == LM_OK) st = lm_gseq_repeat(c->b, &s, indent, 0, LM_JS_WS_MAX);
  LM_TRY(alt_done(c, ws, &s, st));
  c->r_ws = ws;
  *rule = ws;
  return LM_OK;
}

lm_status lm_js_seq_ws(lm_js *c, lm_gseq *s) {
  int32_t ws;
  LM_TRY(lm_js_ws(c, &ws));
  return lm_gseq_ref(c->b, s, ws);
}

/* \uXXXX without the surrogates D800-DFFF. */
static lm_status hex4_rule(lm_js *c, int32_t *rule) {
  static const char *const first[3] = {"0-9a-cA-C", "dD", "e-fE-F"};
  LM_TRY(lm_gir_rule(c->b, "hex4", rule));
  for (int k = 0; k < 3; k++) {
    lm_gseq s = {0};
    lm_status st = set_elem(c, &s, first[k]);
    if (st == LM_OK) st = set_elem(c, &s, k == 1 ? "0-7" : "0-9a-fA-F");
    for (int i = 0; i < 2 && st == LM_OK; i++)
      st = set_elem(c, &s, "0-9a-fA-F");
    LM_TRY(alt_done(c, *rule, &s, st));
  }
  return LM_OK;
}

static lm_status char_rule(lm_js *c, int32_t *rule) {
  if (c->r_char >= 0) {
    *rule = c->r_char;
    return LM_OK;
  }
  int32_t ch, esc, hex4;
  LM_TRY(lm_gir_rule(c->b, "char", &ch));
  lm_cpset raw = {0};
  lm_status st = lm_cpset_add(&raw, 0x20, 0x21);
  if (st == LM_OK) st = lm_cpset_add(&raw, 0x23, 0x5b);
  if (st == LM_OK) st = lm_cpset_add(&raw, 0x5d, LM_CP_MAX);
  if (st == LM_OK) st = lm_cpset_normalize(&raw);
  if (st == LM_OK) st = lm_gutf8_class_alts(c->b, ch, &raw);
  lm_cpset_free(&raw);
  LM_TRY(st);
  LM_TRY(hex4_rule(c, &hex4));
  LM_TRY(lm_gir_rule(c->b, "escape", &esc));
  lm_gseq s = {0};
  LM_TRY(alt_done(c, esc, &s, set_elem(c, &s, "\"\\/bfnrt")));
  st = lm_gseq_byte(c->b, &s, 'u');
  if (st == LM_OK) st = lm_gseq_ref(c->b, &s, hex4);
  LM_TRY(alt_done(c, esc, &s, st));
  st = lm_gseq_byte(c->b, &s, '\\');
  if (st == LM_OK) st = lm_gseq_ref(c->b, &s, esc);
  LM_TRY(alt_done(c, ch, &s, st));
  c->r_char = ch;
  *rule = ch;
  return LM_OK;
}

lm_status lm_js_plain_string(lm_js *c, uint32_t min, uint32_t max, int32_t *rule) {
  for (uint32_t i = 0; i < c->n_strs; i++)
    if (c->strs[i].min == min && c->strs[i].max == max) {
      *rule = c->strs[i].rule;
      return LM_OK;
    }
  int32_t ch, r;
  LM_TRY(char_rule(c, &ch));
  char name[64];
  if (max == LM_G_INF)
    snprintf(name, sizeof name, "string{%u,}", min);
  else
    snprintf(name, sizeof name, "string{%u,%u}", min, max);
  lm_gseq s = {0};
  lm_status st = lm_gseq_byte(c->b, &s, '"');
  if (st == LM_OK) st = lm_gseq_repeat(c->b, &s, ch, min, max);
  if (st == LM_OK) st = lm_gseq_byte(c->b, &s, '"');
  if (st == LM_OK) st = lm_gir_wrap(c->b, name, &s, &r);
  lm_gseq_free(&s);
  LM_TRY(st);
  if (c->n_strs == c->cap_strs) {
    uint32_t cap = c->cap_strs ? c->cap_strs * 2 : 8;
    js_strrule *q = realloc(c->strs, cap * sizeof *q);
    if (!q) return LM_ERRF(LM_ERR_NOMEM, "json schema: out of memory");
    c->strs = q;
    c->cap_strs = cap;
  }
  c->strs[c->n_strs++] = (js_strrule){min, max, r};
  *rule = r;
  return LM_OK;
}

/* Formats as anchored patterns (what is practical: the syntax, with ranges for months, hours). */
#define RX_DATE "[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
#define RX_TIME                                                                                    \
  "([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\\.[0-9]{1,9})?([Zz]|[+-]([01][0-9]|2[0-3]):[0-"  \
  "5]"                                                                                             \
  "[0-9])"
#define RX_LABEL "[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
#define RX_OCTET "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"

static const struct {
  const char *name, *rx;
} k_formats[] = {
    {"date", "^" RX_DATE "$"},
    {"time", "^" RX_TIME "$"},
    {"date-time", "^" RX_DATE "[Tt]" RX_TIME "$"},
    {"uuid", "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"},
    {"email", "^[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(\\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*@" RX_LABEL
              "(\\." RX_LABEL ")+$"},
    {"ipv4", "^(" RX_OCTET "\\.){3}" RX_OCTET "$"},
    {"hostname", "^" RX_LABEL "(\\." RX_LABEL ")*$"},
    /* the characters RFC 3986 allows, after a scheme */
    {"uri", "^[A-Za-z][A-Za-z0-9+.-]*:[A-Za-z0-9._~:/?#@!$&'()*+,;=%\\[\\]-]+$"},
};

/* "\"" body "\"" as a rule. */
static lm_status quoted(lm_js *c, int32_t body, const char *name, int32_t *rule) {
  lm_gseq s = {0};
  lm_status st = lm_gseq_byte(c->b, &s, '"');
  if (st == LM_OK) st = lm_gseq_ref(c->b, &s, body);
  if (st == LM_OK) st = lm_gseq_byte(c->b, &s, '"');
  if (st == LM_OK) st = lm_gir_wrap(c->b, name, &s, rule);
  lm_gseq_free(&s);
  return st;
}

static lm_status format_rule(lm_js *c, const char *fmt, const char *ptr, int32_t *rule) {
  for (size_t i = 0; i < sizeof k_formats / sizeof *k_formats; i++) {
    if (strcmp(fmt, k_formats[i].name)) continue;
    if (c->r_fmt[i] < 0) {
      int32_t body;
      char name[64];
      snprintf(name, sizeof name, "format-%s", fmt);
      LM_TRY(lm_regex_to_gir(c->b, k_formats[i].rx, strlen(k_formats[i].rx), name, &body));
      LM_TRY(quoted(c, body, name, &c->r_fmt[i]));
    }
    *rule = c->r_fmt[i];
    return LM_OK;
  }
  return lm_js_err(LM_ERR_UNSUPPORTED, ptr, "format '%.60s' is not supported", fmt);
}

static lm_status length(const json_t *node, const char *key, const char *ptr, uint32_t dflt,
                        uint32_t *out) {
  const json_t *v = json_object_get(node, key);
  *out = dflt;
  if (!v) return LM_OK;
  double d = json_number_value(v);
  if (!json_is_number(v) || d < 0 || d != (double)(int64_t)d)
    return lm_js_err(LM_ERR_INVALID, ptr, "'%s' must be a non-negative integer", key);
  *out = d >= 4e9 ? LM_G_INF - 1 : (uint32_t)d;
  return LM_OK;
}

lm_status lm_js_string(lm_js *c, const json_t *node, const char *ptr, int32_t *rule) {
  const json_t *pat = json_object_get(node, "pattern"), *fmt = json_object_get(node, "format");
  int lens = json_object_get(node, "minLength") || json_object_get(node, "maxLength");
  if ((pat != NULL) + (fmt != NULL) + lens > 1)
    return lm_js_err(LM_ERR_UNSUPPORTED, ptr,
                     "only one of pattern, format and minLength / maxLength is supported on a "
                     "string");
  if (fmt) {
    if (!json_is_string(fmt)) return lm_js_err(LM_ERR_INVALID, ptr, "'format' must be a string");
    return format_rule(c, json_string_value(fmt), ptr, rule);
  }
  if (pat) {
    if (!json_is_string(pat)) return lm_js_err(LM_ERR_INVALID, ptr, "'pattern' must be a string");
    int32_t body;
    char name[LM_JS_PTR_MAX + 16];
    snprintf(name, sizeof name, "%s-pattern", ptr);
    lm_status st =
        lm_regex_to_gir(c->b, json_string_value(pat), json_string_length(pat), name, &body);
    if (st != LM_OK) return lm_err_prefix(st, "json schema: %s", ptr);
    return quoted(c, body, name, rule);
  }
  uint32_t min, max;
  LM_TRY(length(node, "minLength", ptr, 0, &min));
  LM_TRY(length(node, "maxLength", ptr, LM_G_INF, &max));
  if (min > max)
    return lm_js_err(LM_ERR_INVALID, ptr, "minLength %u is more than maxLength %u", min, max);
  return lm_js_plain_string(c, min, max, rule);
}

/* ---- literals ------------------------------------------------------------------------------- */

typedef struct sbuf {
  char *p;
  size_t n, cap;
  int fail;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
  if (b->fail) return;
  if (b->n + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap * 2 : 64;
    while (cap < b->n + n + 1)
      cap *= 2;
    char *q = realloc(b->p, cap);
    if (!q) {
      b->fail = 1;
      return;
    }
    b->p = q;
    b->cap = cap;
  }
  memcpy(b->p + b->n, s, n);
  b->n += n;
}

static void sb_str(sbuf *b, const char *s, size_t n) {
  sb_put(b, "\"", 1);
  for (size_t i = 0; i < n; i++) {
    unsigned char ch = (unsigned char)s[i];
    char e[8];
    switch (ch) {
    case '"': sb_put(b, "\\\"", 2); break;
    case '\\': sb_put(b, "\\\\", 2); break;
    case '\n': sb_put(b, "\\n", 2); break;
    case '\r': sb_put(b, "\\r", 2); break;
    case '\t': sb_put(b, "\\t", 2); break;
    case '\b': sb_put(b, "\\b", 2); break;
    case '\f': sb_put(b, "\\f", 2); break;
    default:
      if (ch < 0x20) {
        snprintf(e, sizeof e, "\\u%04x", ch);
        sb_put(b, e, 6);
      } else {
        sb_put(b, (const char *)&s[i], 1);
      }
    }
  }
  sb_put(b, "\"", 1);
}

/* The shortest %g that reads back as d. */
static void sb_real(sbuf *b, double d) {
  char t[40];
  for (int prec = 1; prec <= 17; prec++) {
    snprintf(t, sizeof t, "%.*g", prec, d);
    if (strtod(t, NULL) == d) break;
  }
  sb_put(b, t, strlen(t));
}

static void sb_value(sbuf *b, const json_t *v) {
  char t[32];
  switch (json_typeof(v)) {
  case JSON_NULL: sb_put(b, "null", 4); break;
  case JSON_TRUE: sb_put(b, "true", 4); break;
  case JSON_FALSE: sb_put(b, "false", 5); break;
  case JSON_INTEGER:
    snprintf(t, sizeof t, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
    sb_put(b, t, strlen(t));
    break;
  case JSON_REAL: sb_real(b, json_real_value(v)); break;
  case JSON_STRING: sb_str(b, json_string_value(v), json_string_length(v)); break;
  case JSON_ARRAY: {
    sb_put(b, "[", 1);
    size_t i;
    json_t *x;
    json_array_foreach(v, i, x) {
      if (i) sb_put(b, ",", 1);
      sb_value(b, x);
    }
    sb_put(b, "]", 1);
    break;
  }
  case JSON_OBJECT: {
    sb_put(b, "{", 1);
    const char *k;
    json_t *x;
    int first = 1;
    json_object_foreach((json_t *)v, k, x) {
      if (!first) sb_put(b, ",", 1);
      first = 0;
      sb_str(b, k, strlen(k));
      sb_put(b, ":", 1);
      sb_value(b, x);
    }
    sb_put(b, "}", 1);
    break;
  }
  }
}

lm_status lm_js_literal(lm_js *c, lm_gseq *s, const json_t *v, const char *ptr) {
  sbuf b = {0};
  sb_value(&b, v);
  lm_status st = b.fail ? LM_ERRF(LM_ERR_NOMEM, "json schema: %s: out of memory", ptr)
                        : lm_gseq_lit(c->b, s, b.p, b.n);
  free(b.p);
  return st;
}

lm_status lm_js_string_lit(lm_js *c, lm_gseq *s, const char *text, size_t len) {
  sbuf b = {0};
  sb_str(&b, text, len);
  lm_status st =
      b.fail ? LM_ERRF(LM_ERR_NOMEM, "json schema: out of memory") : lm_gseq_lit(c->b, s, b.p, b.n);
  free(b.p);
  return st;
}

lm_status lm_js_comma_list(lm_js *c, lm_gseq *item, const char *name, const char *word,
                           int32_t *list) {
  /* name is a JSON pointer (up to LM_JS_PTR_MAX) or a short fixed name; word is short */
  char nm[LM_JS_PTR_MAX + 16];
  int32_t one, more;
  snprintf(nm, sizeof nm, "%s-%s", name, word);
  lm_status st = lm_gir_wrap(c->b, nm, item, &one);
  if (st == LM_OK) st = lm_gseq_byte(c->b, item, ',');
  if (st == LM_OK) st = lm_js_seq_ws(c, item);
  if (st == LM_OK) st = lm_gseq_ref(c->b, item, one);
  snprintf(nm, sizeof nm, "%s-more", name);
  if (st == LM_OK) st = lm_gir_wrap(c->b, nm, item, &more);
  if (st == LM_OK) st = lm_gseq_ref(c->b, item, one);
  if (st == LM_OK) st = lm_gseq_repeat(c->b, item, more, 0, LM_G_INF);
  snprintf(nm, sizeof nm, "%s-%ss", name, word);
  if (st == LM_OK) st = lm_gir_wrap(c->b, nm, item, list);
  return st;
}

/* ---- any value ---------------------------------------------------------------------------- */

/* OPEN ws (ITEM ws ("," ws ITEM ws)*)? CLOSE, where ITEM is `item` (a rule) or, for objects,
 * string ws ":" ws value. */
static lm_status container(lm_js *c, int32_t rule, char open, char close, int32_t key,
                           int32_t value, const char *name) {
  lm_gseq s = {0};
  lm_status st = LM_OK;
  if (key >= 0) {
    st = lm_gseq_ref(c->b, &s, key);
    if (st == LM_OK) st = lm_js_seq_ws(c, &s);
    if (st == LM_OK) st = lm_gseq_byte(c->b, &s, ':');
    if (st == LM_OK) st = lm_js_seq_ws(c, &s);
  }
  if (st == LM_OK) st = lm_gseq_ref(c->b, &s, value);
  if (st == LM_OK) st = lm_js_seq_ws(c, &s);
  int32_t items;
  if (st == LM_OK) st = lm_js_comma_list(c, &s, name, "item", &items);
  if (st == LM_OK) st = lm_gseq_byte(c->b, &s, (uint8_t)open);
  if (st == LM_OK) st = lm_js_seq_ws(c, &s);
  if (st == LM_OK) st = lm_gseq_repeat(c->b, &s, items, 0, 1);
  if (st == LM_OK) st = lm_gseq_byte(c->b, &s, (uint8_t)close);
  return alt_done(c, rule, &s, st);
}

lm_status lm_js_value(lm_js *c, int32_t *rule) {
  if (c->r_value >= 0) {
    *rule = c->r_value;
    return LM_OK;
  }
  int32_t v, obj, arr, str, num;
  LM_TRY(lm_gir_rule(c->b, "value", &v));
  c->r_value = v; /* before the parts: they refer to it */
  LM_TRY(lm_gir_rule(c->b, "object", &obj));
  LM_TRY(lm_gir_rule(c->b, "array", &arr));
  LM_TRY(lm_js_plain_string(c, 0, LM_G_INF, &str));
  LM_TRY(lm_js_number(c, NULL, "#", &num));
  LM_TRY(container(c, obj, '{', '}', str, v, "object"));
  LM_TRY(container(c, arr, '[', ']', -1, v, "array"));
  const int32_t parts[4] = {obj, arr, str, num};
  for (int i = 0; i < 4; i++) {
    lm_gseq s = {0};
    LM_TRY(alt_done(c, v, &s, lm_gseq_ref(c->b, &s, parts[i])));
  }
  static const char *const lits[3] = {"true", "false", "null"};
  for (int i = 0; i < 3; i++) {
    lm_gseq s = {0};
    LM_TRY(alt_done(c, v, &s, lm_gseq_lit(c->b, &s, lits[i], strlen(lits[i]))));
  }
  *rule = v;
  return LM_OK;
}
