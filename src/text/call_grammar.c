/* call_grammar.c — tools → the GBNF of a Gemma 4 call (call_grammar.h).
 *
 * Each schema becomes one rule; its body is built in its own buffer and appended to the output when
 * complete, so nested schemas simply emit their rules first. A $ref gets its rule name before its
 * body is made, which is what lets a recursive schema refer to itself. The shared rules (any value,
 * strings, numbers) are written once, on first use. */
#include "text/call_grammar.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/status.h"

#define CG_MAX_DEPTH 64
#define CG_MAX_DIGITS 16 /* integers: at most 16 digits (bounds are clamped to them) */

typedef struct sbuf {
  char *p;
  size_t n, cap;
  int oom;
} sbuf;

typedef struct cg_ref {
  char *ref;
  char name[24];
} cg_ref;

typedef struct cg {
  sbuf out; /* the rules so far */
  int rules;
  const json_t *params; /* the tool's parameters: the document $refs point into */
  cg_ref *refs;
  size_t n_refs, cap_refs;
  unsigned shared; /* which shared rules have been written */
  char tool[160];  /* "tools[0] (get_verse)": names the tool in messages */
} cg;

enum { SH_VALUE = 1, SH_STR = 2, SH_NUM = 4, SH_INT = 8, SH_NOARGS = 16 };

static void sb_put(sbuf *b, const char *s, size_t n) {
  if (!b->oom && lm_buf_append(&b->p, &b->n, &b->cap, 256, s, n)) b->oom = 1;
}

static void sb_puts(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_fmt(sbuf *b, const char *fmt, ...) LM_PRINTF(2, 3);
static void sb_fmt(sbuf *b, const char *fmt, ...) {
  char tmp[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (n < 0 || (size_t)n >= sizeof tmp)
    b->oom = 1;
  else
    sb_put(b, tmp, (size_t)n);
}

/* A GBNF string literal of s[0..n). */
static void sb_lit(sbuf *b, const char *s, size_t n) {
  sb_puts(b, "\"");
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == '"' || c == '\\') {
      char e[2] = {'\\', (char)c};
      sb_put(b, e, 2);
    } else if (c < 0x20 || c == 0x7f) {
      sb_fmt(b, "\\x%02X", c);
    } else {
      sb_put(b, (const char *)&c, 1);
    }
  }
  sb_puts(b, "\"");
}

static lm_status sb_done(const sbuf *b) {
  return b->oom ? LM_ERRF(LM_ERR_NOMEM, "tool grammar: out of memory") : LM_OK;
}

/* ---- shared rules ---------------------------------------------------------------------------- */

static void need_shared(cg *g, unsigned what) {
  unsigned add = what & ~g->shared;
  if (add & SH_VALUE) add |= SH_STR | SH_NUM; /* any value uses both */
  g->shared |= add;
  if (add & SH_STR)
    sb_puts(&g->out, "str ::= \"<|\\\"|>\" strchar* \"<|\\\"|>\"\n"
                     "strchar ::= [^<] | \"<\"+ [^|<]\n");
  if (add & SH_NUM)
    sb_puts(&g->out, "num ::= \"-\"? ([0] | [1-9] [0-9]{0,15}) (\".\" [0-9]{1,16})? "
                     "([eE] [-+]? [0-9]{1,3})?\n");
  if (add & SH_NOARGS) sb_puts(&g->out, "noargs ::= \"{\" \"}\"\n");
  if (add & SH_INT) sb_puts(&g->out, "int ::= \"-\"? ([0] | [1-9] [0-9]{0,15})\n");
  if (add & SH_VALUE)
    sb_puts(&g->out, "value ::= str | num | obj | arr | \"true\" | \"false\" | \"null\"\n"
                     "obj ::= \"{\" (key \":\" value (\",\" key \":\" value)*)? \"}\"\n"
                     "key ::= [a-zA-Z_] [a-zA-Z0-9_]{0,63}\n"
                     "arr ::= \"[\" (value (\",\" value)*)? \"]\"\n");
}

/* ---- errors ---------------------------------------------------------------------------------- */

static lm_status unsupported(const cg *g, const char *kw, const char *ptr, const char *why) {
  return LM_ERRF(LM_ERR_UNSUPPORTED, "%s: %s '%s' at %s is not supported in tool parameters%s%s",
                 g->tool, "keyword", kw, *ptr ? ptr : "/", why ? ": " : "", why ? why : "");
}

static lm_status invalid(const cg *g, const char *ptr, const char *what) {
  return LM_ERRF(LM_ERR_INVALID, "%s: the parameters schema at %s: %s", g->tool, *ptr ? ptr : "/",
                 what);
}

/* ---- values as the call syntax writes them (enum, const) ------------------------------------ */

static int cmp_keys(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int bare_key(const char *k) {
  if (!*k || strstr(k, "<|")) return 0;
  for (const char *c = k; *c; c++)
    if (strchr(":{}[],<\"", *c) || *c == ' ' || *c == '\t' || *c == '\n' || *c == '\r') return 0;
  return 1;
}

/* v in the call syntax (the chat template's format: keys sorted, bare when they can be). */
static void put_value(sbuf *b, const json_t *v, int depth) {
  if (depth > CG_MAX_DEPTH) {
    b->oom = 1;
    return;
  }
  if (json_is_string(v)) {
    sb_puts(b, "<|\"|>");
    sb_put(b, json_string_value(v), json_string_length(v));
    sb_puts(b, "<|\"|>");
  } else if (json_is_integer(v)) {
    sb_fmt(b, "%lld", (long long)json_integer_value(v));
  } else if (json_is_real(v)) {
    sb_fmt(b, "%.17g", json_real_value(v));
  } else if (json_is_true(v) || json_is_false(v)) {
    sb_puts(b, json_is_true(v) ? "true" : "false");
  } else if (json_is_array(v)) {
    sb_puts(b, "[");
    for (size_t i = 0; i < json_array_size(v); i++) {
      if (i) sb_puts(b, ",");
      put_value(b, json_array_get(v, i), depth + 1);
    }
    sb_puts(b, "]");
  } else if (json_is_object(v)) {
    size_t n = json_object_size(v), k = 0;
    const char **keys = malloc((n ? n : 1) * sizeof *keys);
    const char *key;
    const json_t *x;
    if (!keys) {
      b->oom = 1;
      return;
    }
    json_object_foreach((json_t *)v, key, x) keys[k++] = key;
    qsort(keys, n, sizeof *keys, cmp_keys);
    sb_puts(b, "{");
    for (k = 0; k < n; k++) {
      if (k) sb_puts(b, ",");
      if (bare_key(keys[k])) {
        sb_puts(b, keys[k]);
      } else {
        sb_puts(b, "<|\"|>");
        sb_puts(b, keys[k]);
        sb_puts(b, "<|\"|>");
      }
      sb_puts(b, ":");
      put_value(b, json_object_get(v, keys[k]), depth + 1);
    }
    sb_puts(b, "}");
    free(keys);
  } else {
    sb_puts(b, "null");
  }
}

/* The GBNF literal of v's text in the call syntax. */
static lm_status value_literal(sbuf *body, const json_t *v) {
  sbuf t = {0};
  put_value(&t, v, 0);
  lm_status s = sb_done(&t);
  if (!s) sb_lit(body, t.p ? t.p : "", t.n);
  free(t.p);
  return s;
}

/* ---- integers in a range: alternatives over the digits ------------------------------------- */

/* Digits of the non-negative numbers with as many digits as a and b, a <= b (same length). */
static void same_len(sbuf *b, const char *a, const char *z, size_t n) {
  if (n == 0) return;
  if (!strncmp(a, z, n)) {
    sb_lit(b, a, n);
    return;
  }
  if (n == 1) {
    sb_fmt(b, "[%c-%c]", a[0], z[0]);
    return;
  }
  char nines[CG_MAX_DIGITS + 1], zeros[CG_MAX_DIGITS + 1];
  memset(nines, '9', n - 1);
  memset(zeros, '0', n - 1);
  if (a[0] == z[0]) {
    sb_lit(b, a, 1);
    sb_puts(b, " (");
    same_len(b, a + 1, z + 1, n - 1);
    sb_puts(b, ")");
    return;
  }
  /* a0 a[1..] .. a0 9..9 | (a0+1 .. z0-1) any | z0 0..0 .. z0 z[1..] */
  sb_puts(b, "(");
  sb_lit(b, a, 1);
  sb_puts(b, " (");
  same_len(b, a + 1, nines, n - 1);
  sb_puts(b, ")");
  if (z[0] - a[0] > 1) sb_fmt(b, " | [%c-%c] [0-9]{%zu,%zu}", a[0] + 1, z[0] - 1, n - 1, n - 1);
  sb_puts(b, " | ");
  sb_lit(b, z, 1);
  sb_puts(b, " (");
  same_len(b, zeros, z + 1, n - 1);
  sb_puts(b, "))");
}

/* The non-negative integers lo..hi (lo <= hi), written without leading zeros. */
static void nonneg_range(sbuf *b, long long lo, long long hi) {
  char a[32], z[32];
  int first = 1;
  sb_puts(b, "(");
  while (lo <= hi) {
    int la = snprintf(a, sizeof a, "%lld", lo);
    long long top = 9; /* the largest number with la digits */
    for (int i = 1; i < la; i++)
      top = top * 10 + 9;
    long long end = hi < top ? hi : top;
    snprintf(z, sizeof z, "%lld", end);
    if (!first) sb_puts(b, " | ");
    first = 0;
    sb_puts(b, "(");
    same_len(b, a, z, (size_t)la);
    sb_puts(b, ")");
    if (end == hi) break;
    lo = end + 1;
  }
  sb_puts(b, ")");
}

static void int_range(sbuf *b, long long lo, long long hi) {
  if (lo >= 0) {
    nonneg_range(b, lo, hi);
    return;
  }
  sb_puts(b, "(\"-\" ");
  nonneg_range(b, hi < 0 ? -hi : 1, -lo);
  if (hi >= 0) {
    sb_puts(b, " | ");
    nonneg_range(b, 0, hi);
  }
  sb_puts(b, ")");
}

/* ---- schemas --------------------------------------------------------------------------------- */

static lm_status schema_rule(cg *g, const json_t *s, const char *ptr, int depth, char *name);

static void new_name(cg *g, char *name) { snprintf(name, 24, "r%d", ++g->rules); }

static void emit_rule(cg *g, const char *name, const sbuf *body) {
  sb_fmt(&g->out, "%s ::= ", name);
  sb_put(&g->out, body->p ? body->p : "", body->n);
  sb_puts(&g->out, "\n");
}

static const char *const ignored_kw[] = {
    "description",   "title",       "examples",        "default", "$comment",    "deprecated",
    "readOnly",      "writeOnly",   "format",          "$schema", "$id",         "$anchor",
    "$defs",         "definitions", "contentEncoding", "strict",  "$vocabulary", "contentMediaType",
    "discriminator", "xml",         "externalDocs"};
static const char *const known_kw[] = {"type",
                                       "enum",
                                       "const",
                                       "properties",
                                       "required",
                                       "additionalProperties",
                                       "items",
                                       "minItems",
                                       "maxItems",
                                       "anyOf",
                                       "oneOf",
                                       "allOf",
                                       "$ref",
                                       "nullable",
                                       "minLength",
                                       "maxLength",
                                       "minimum",
                                       "maximum",
                                       "exclusiveMinimum",
                                       "exclusiveMaximum"};

static int in_list(const char *k, const char *const *list, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!strcmp(k, list[i])) return 1;
  return 0;
}

static lm_status check_keywords(const cg *g, const json_t *s, const char *ptr) {
  const char *k;
  const json_t *v;
  json_object_foreach((json_t *)s, k, v) {
    if (in_list(k, ignored_kw, sizeof ignored_kw / sizeof *ignored_kw) ||
        in_list(k, known_kw, sizeof known_kw / sizeof *known_kw))
      continue;
    return unsupported(g, k, ptr, NULL);
  }
  return LM_OK;
}

static void child_ptr(char *out, size_t n, const char *ptr, const char *a, const char *b) {
  snprintf(out, n, "%s/%s%s%s", ptr, a, b ? "/" : "", b ? b : "");
}

static lm_status ref_rule(cg *g, const char *ref, const char *ptr, int depth, char *name) {
  for (size_t i = 0; i < g->n_refs; i++)
    if (!strcmp(g->refs[i].ref, ref)) {
      snprintf(name, 24, "%s", g->refs[i].name);
      return LM_OK;
    }
  const json_t *target = NULL;
  if (!strcmp(ref, "#")) {
    target = g->params;
  } else if (!strncmp(ref, "#/$defs/", 8)) {
    target = json_object_get(json_object_get(g->params, "$defs"), ref + 8);
  } else if (!strncmp(ref, "#/definitions/", 14)) {
    target = json_object_get(json_object_get(g->params, "definitions"), ref + 14);
  }
  if (!target) return unsupported(g, "$ref", ptr, "only #, #/$defs/NAME and #/definitions/NAME");
  if (g->n_refs == g->cap_refs) {
    size_t cap = g->cap_refs ? 2 * g->cap_refs : 8;
    cg_ref *r = realloc(g->refs, cap * sizeof *r);
    if (!r) return LM_ERRF(LM_ERR_NOMEM, "tool grammar: out of memory");
    g->refs = r;
    g->cap_refs = cap;
  }
  cg_ref *r = &g->refs[g->n_refs];
  if (!(r->ref = strdup(ref))) return LM_ERRF(LM_ERR_NOMEM, "tool grammar: out of memory");
  new_name(g, r->name);
  g->n_refs++;
  snprintf(name, 24, "%s", r->name);
  /* the body under the name given out before it exists: a recursive reference finds it above */
  sbuf body = {0};
  char sub[24];
  lm_status st = schema_rule(g, target, ref + 1, depth + 1, sub);
  if (!st) {
    sb_puts(&body, sub);
    emit_rule(g, name, &body);
  }
  free(body.p);
  return st;
}

static lm_status string_body(cg *g, const json_t *s, const char *ptr, sbuf *b) {
  const json_t *mn = json_object_get(s, "minLength"), *mx = json_object_get(s, "maxLength");
  if ((mn && !json_is_integer(mn)) || (mx && !json_is_integer(mx)))
    return invalid(g, ptr, "minLength and maxLength must be integers");
  long long lo = mn ? json_integer_value(mn) : 0, hi = mx ? json_integer_value(mx) : -1;
  if (lo < 0 || (mx && hi < lo)) return invalid(g, ptr, "bad minLength / maxLength");
  if (lo > 10000 || hi > 10000)
    return unsupported(g, mx ? "maxLength" : "minLength", ptr, "> 10000");
  if (!mn && !mx) {
    need_shared(g, SH_STR);
    sb_puts(b, "str");
    return LM_OK;
  }
  sb_puts(b, "\"<|\\\"|>\" ");
  if (mx)
    sb_fmt(b, "[^<]{%lld,%lld}", lo, hi);
  else
    sb_fmt(b, "[^<]{%lld,%lld} [^<]*", lo, lo);
  sb_puts(b, " \"<|\\\"|>\"");
  return LM_OK;
}

/* An integer bound (minimum / maximum, exclusive ones moved by one); 0 when absent. */
static lm_status int_bound(const cg *g, const json_t *s, const char *ptr, int upper, long long *out,
                           int *given) {
  const char *inc = upper ? "maximum" : "minimum",
             *exc = upper ? "exclusiveMaximum" : "exclusiveMinimum";
  const json_t *v = json_object_get(s, inc), *x = json_object_get(s, exc);
  double lim = upper ? 9999999999999999.0 : -9999999999999999.0, b = lim;
  *given = 0;
  if (v && !json_is_number(v)) return invalid(g, ptr, "minimum / maximum must be numbers");
  if (x && !json_is_number(x)) return invalid(g, ptr, "exclusive bounds must be numbers");
  if (v) {
    double d = json_number_value(v);
    b = upper ? floor(d) : ceil(d);
    *given = 1;
  }
  if (x) {
    double d = json_number_value(x), e = upper ? ceil(d) - 1 : floor(d) + 1;
    if (!*given || (upper ? e < b : e > b)) b = e;
    *given = 1;
  }
  if (upper ? b > lim : b < lim) b = lim;
  if (upper ? b < -lim : b > -lim) b = -lim;
  *out = (long long)b;
  return LM_OK;
}

static lm_status integer_body(cg *g, const json_t *s, const char *ptr, sbuf *b) {
  long long lo, hi;
  int has_lo, has_hi;
  LM_TRY(int_bound(g, s, ptr, 0, &lo, &has_lo));
  LM_TRY(int_bound(g, s, ptr, 1, &hi, &has_hi));
  if (!has_lo && !has_hi) {
    need_shared(g, SH_INT);
    sb_puts(b, "int");
    return LM_OK;
  }
  if (lo > hi) return invalid(g, ptr, "no integer lies between minimum and maximum");
  int_range(b, lo, hi);
  return LM_OK;
}

static lm_status number_body(cg *g, const json_t *s, const char *ptr, sbuf *b) {
  const json_t *mn = json_object_get(s, "minimum");
  static const char *const bounds[] = {"maximum", "exclusiveMinimum", "exclusiveMaximum"};
  for (int i = 0; i < 3; i++)
    if (json_object_get(s, bounds[i]))
      return unsupported(g, bounds[i], ptr, "numbers take only minimum >= 0 (integers take all)");
  if (mn && (!json_is_number(mn) || json_number_value(mn) != 0))
    return unsupported(g, "minimum", ptr, "numbers take only minimum 0 (integers take any)");
  if (mn) {
    sb_puts(b, "([0] | [1-9] [0-9]{0,15}) (\".\" [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})?");
    return LM_OK;
  }
  need_shared(g, SH_NUM);
  sb_puts(b, "num");
  return LM_OK;
}

static lm_status array_body(cg *g, const json_t *s, const char *ptr, int depth, sbuf *b) {
  const json_t *items = json_object_get(s, "items"), *mn = json_object_get(s, "minItems"),
               *mx = json_object_get(s, "maxItems");
  if ((mn && !json_is_integer(mn)) || (mx && !json_is_integer(mx)))
    return invalid(g, ptr, "minItems and maxItems must be integers");
  long long lo = mn ? json_integer_value(mn) : 0, hi = mx ? json_integer_value(mx) : -1;
  if (lo < 0 || (mx && hi < lo)) return invalid(g, ptr, "bad minItems / maxItems");
  if (lo > 1000 || hi > 1000) return unsupported(g, mx ? "maxItems" : "minItems", ptr, "> 1000");
  char item[24], sub[512];
  if (items && !json_is_object(items) && !json_is_boolean(items))
    return unsupported(g, "items", ptr, "items must be one schema");
  child_ptr(sub, sizeof sub, ptr, "items", NULL);
  if (items && json_is_object(items)) {
    LM_TRY(schema_rule(g, items, sub, depth + 1, item));
  } else {
    need_shared(g, SH_VALUE);
    snprintf(item, sizeof item, "value");
  }
  if (mx && hi == 0) {
    sb_puts(b, "\"[\" \"]\"");
    return LM_OK;
  }
  /* "[" item ("," item){lo-1, hi-1} "]", the whole list optional when lo is 0 */
  long long rlo = lo > 0 ? lo - 1 : 0;
  sb_fmt(b, "\"[\" %s%s (\",\" %s)", lo == 0 ? "(" : "", item, item);
  if (mx)
    sb_fmt(b, "{%lld,%lld}", rlo, hi - 1);
  else if (rlo)
    sb_fmt(b, "{%lld,%lld} (\",\" %s)*", rlo, rlo, item);
  else
    sb_puts(b, "*");
  sb_fmt(b, "%s \"]\"", lo == 0 ? ")?" : "");
  return LM_OK;
}

typedef struct prop {
  const char *key;
  const json_t *schema;
  int required;
  char rule[24];
} prop;

static int cmp_prop(const void *a, const void *b) {
  return strcmp(((const prop *)a)->key, ((const prop *)b)->key);
}

static int is_required(const json_t *req, const char *key) {
  size_t i;
  const json_t *r;
  json_array_foreach(req, i,
                     r) if (json_is_string(r) && !strcmp(json_string_value(r), key)) return 1;
  return 0;
}

/* One key:value pair's text: the key (bare, or quoted when it must be) and the value's rule. */
static void put_pair(sbuf *b, const prop *p) {
  sbuf k = {0};
  if (bare_key(p->key)) {
    sb_puts(&k, p->key);
  } else {
    sb_puts(&k, "<|\"|>");
    sb_puts(&k, p->key);
    sb_puts(&k, "<|\"|>");
  }
  sb_puts(&k, ":");
  if (k.oom) b->oom = 1;
  sb_lit(b, k.p ? k.p : "", k.n);
  sb_fmt(b, " %s", p->rule);
  free(k.p);
}

/* The properties in sorted order, each optional one may be left out. B_i: the properties from i
 * on after something was written (each one comma-led; may be empty); A_i: the same when nothing
 * was written yet, at least one of them written (so A_0 is optional when no property is
 * required). Rules, not inline text, keep the grammar linear in the number of properties. */
static lm_status props_body(cg *g, prop *ps, size_t n, sbuf *b) {
  char(*an)[24] = calloc(n + 1, sizeof *an), (*bn)[24] = calloc(n + 1, sizeof *bn);
  if (!an || !bn) {
    free(an);
    free(bn);
    return LM_ERRF(LM_ERR_NOMEM, "tool grammar: out of memory");
  }
  int any_required = 0;
  for (size_t i = n; i-- > 0;) {
    sbuf ra = {0}, rb = {0};
    sb_puts(&rb, ps[i].required ? "\",\" " : "(\",\" ");
    put_pair(&rb, &ps[i]);
    if (!ps[i].required) sb_puts(&rb, ")?");
    if (i + 1 < n) sb_fmt(&rb, " %s", bn[i + 1]);
    put_pair(&ra, &ps[i]);
    if (i + 1 < n) sb_fmt(&ra, " %s", bn[i + 1]);
    if (!ps[i].required && i + 1 < n) sb_fmt(&ra, " | %s", an[i + 1]);
    any_required |= ps[i].required;
    if (ra.oom || rb.oom) g->out.oom = 1;
    /* A_i is used by A_0's caller and by an optional A_{i-1}; B_i by the pairs before it */
    if (i == 0 || !ps[i - 1].required) {
      new_name(g, an[i]);
      emit_rule(g, an[i], &ra);
    }
    if (i > 0) {
      new_name(g, bn[i]);
      emit_rule(g, bn[i], &rb);
    }
    free(ra.p);
    free(rb.p);
  }
  sb_fmt(b, "\"{\" %s%s \"}\"", an[0], any_required ? "" : "?");
  free(an);
  free(bn);
  return LM_OK;
}

static lm_status object_body(cg *g, const json_t *s, const char *ptr, int depth, sbuf *b) {
  const json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
  if (props && !json_is_object(props)) return invalid(g, ptr, "properties must be an object");
  if (req && !json_is_array(req)) return invalid(g, ptr, "required must be an array");
  const json_t *ap = json_object_get(s, "additionalProperties");
  if (ap && !json_is_boolean(ap) && !json_is_object(ap))
    return invalid(g, ptr, "additionalProperties must be a boolean or a schema");
  if (!props || !json_object_size(props)) {
    if (json_array_size(req)) return unsupported(g, "required", ptr, "required without properties");
    if (json_is_false(ap)) {
      sb_puts(b, "\"{\" \"}\"");
      return LM_OK;
    }
    need_shared(g, SH_VALUE);
    sb_puts(b, "obj");
    return LM_OK;
  }
  size_t n = json_object_size(props), k = 0;
  prop *ps = calloc(n, sizeof *ps);
  if (!ps) return LM_ERRF(LM_ERR_NOMEM, "tool grammar: out of memory");
  const char *key;
  const json_t *v;
  json_object_foreach((json_t *)props, key, v) {
    ps[k].key = key;
    ps[k].schema = v;
    ps[k].required = is_required(req, key);
    k++;
  }
  qsort(ps, n, sizeof *ps, cmp_prop);
  lm_status st = LM_OK;
  for (k = 0; k < n && !st; k++) {
    char sub[512];
    child_ptr(sub, sizeof sub, ptr, "properties", ps[k].key);
    if (json_is_true(ps[k].schema)) {
      need_shared(g, SH_VALUE);
      snprintf(ps[k].rule, sizeof ps[k].rule, "value");
    } else if (!json_is_object(ps[k].schema)) {
      st = invalid(g, sub, "a property's schema must be an object");
    } else {
      st = schema_rule(g, ps[k].schema, sub, depth + 1, ps[k].rule);
    }
  }
  if (!st) st = props_body(g, ps, n, b);
  free(ps);
  return st;
}

static lm_status type_body(cg *g, const json_t *s, const char *type, const char *ptr, int depth,
                           sbuf *b) {
  if (!strcmp(type, "string")) return string_body(g, s, ptr, b);
  if (!strcmp(type, "integer")) return integer_body(g, s, ptr, b);
  if (!strcmp(type, "number")) return number_body(g, s, ptr, b);
  if (!strcmp(type, "boolean")) {
    sb_puts(b, "(\"true\" | \"false\")");
    return LM_OK;
  }
  if (!strcmp(type, "null")) {
    sb_puts(b, "\"null\"");
    return LM_OK;
  }
  if (!strcmp(type, "object")) return object_body(g, s, ptr, depth, b);
  if (!strcmp(type, "array")) return array_body(g, s, ptr, depth, b);
  return invalid(g, ptr, "unknown type");
}

/* The type a schema without "type" has: from the keywords it uses, else any value (NULL). */
static const char *implied_type(const json_t *s) {
  if (json_object_get(s, "properties") || json_object_get(s, "additionalProperties"))
    return "object";
  if (json_object_get(s, "items") || json_object_get(s, "minItems") ||
      json_object_get(s, "maxItems"))
    return "array";
  if (json_object_get(s, "minLength") || json_object_get(s, "maxLength")) return "string";
  if (json_object_get(s, "minimum") || json_object_get(s, "maximum")) return "number";
  return NULL;
}

static lm_status alternatives(cg *g, const json_t *list, const char *kw, const char *ptr, int depth,
                              sbuf *b) {
  if (!json_is_array(list) || !json_array_size(list))
    return invalid(g, ptr, "anyOf / oneOf must be a non-empty array");
  size_t i;
  const json_t *x;
  sb_puts(b, "(");
  json_array_foreach(list, i, x) {
    char sub[512], idx[24], name[24];
    snprintf(idx, sizeof idx, "%zu", i);
    child_ptr(sub, sizeof sub, ptr, kw, idx);
    if (!json_is_object(x)) return invalid(g, sub, "a schema must be an object");
    LM_TRY(schema_rule(g, x, sub, depth + 1, name));
    sb_fmt(b, "%s%s", i ? " | " : "", name);
  }
  sb_puts(b, ")");
  return LM_OK;
}

/* allOf of object schemas: one object with every property, every required name. */
static lm_status merge_all_of(cg *g, const json_t *s, const char *ptr, json_t **out) {
  const json_t *list = json_object_get(s, "allOf"), *x;
  size_t i;
  if (!json_is_array(list) || !json_array_size(list))
    return invalid(g, ptr, "allOf must be a non-empty array");
  json_t *m = json_deep_copy(s), *props = json_object(), *req = json_array();
  json_object_del(m, "allOf");
  json_array_foreach(list, i, x) {
    const char *k;
    const json_t *v;
    int other = 0;
    json_object_foreach((json_t *)x, k, v) other |=
        strcmp(k, "type") && strcmp(k, "properties") && strcmp(k, "required") &&
        !in_list(k, ignored_kw, sizeof ignored_kw / sizeof *ignored_kw) &&
        strcmp(k, "additionalProperties");
    const char *t = json_string_value(json_object_get(x, "type"));
    if (!json_is_object(x) || other || (t && strcmp(t, "object"))) {
      json_decref(m);
      json_decref(props);
      json_decref(req);
      return unsupported(g, "allOf", ptr, "only allOf of object schemas (properties, required)");
    }
    json_object_update(props, json_object_get(x, "properties"));
    json_array_extend(req, json_object_get(x, "required"));
  }
  json_object_update(props, json_object_get(m, "properties"));
  if (json_is_array(json_object_get(m, "required")))
    json_array_extend(req, json_object_get(m, "required"));
  json_object_set_new(m, "properties", props);
  json_object_set_new(m, "required", req);
  json_object_set_new(m, "type", json_string("object"));
  *out = m;
  return LM_OK;
}

static lm_status types_body(cg *g, const json_t *s, const char *ptr, int depth, sbuf *b) {
  const json_t *t = json_object_get(s, "type");
  int nullable = json_is_true(json_object_get(s, "nullable"));
  if (t && !json_is_string(t) && !json_is_array(t))
    return invalid(g, ptr, "type must be a string or a list");
  if (json_is_array(t) || nullable) {
    size_t i, k = 0;
    const json_t *x;
    sb_puts(b, "(");
    json_array_foreach(t, i, x) {
      if (!json_is_string(x)) return invalid(g, ptr, "type lists hold strings");
      if (k++) sb_puts(b, " | ");
      LM_TRY(type_body(g, s, json_string_value(x), ptr, depth, b));
    }
    if (json_is_string(t)) {
      k++;
      LM_TRY(type_body(g, s, json_string_value(t), ptr, depth, b));
    }
    if (!k) {
      const char *it = implied_type(s);
      if (it) {
        k++;
        LM_TRY(type_body(g, s, it, ptr, depth, b));
      }
    }
    sb_fmt(b, "%s\"null\")", k ? " | " : "");
    return LM_OK;
  }
  const char *type = t ? json_string_value(t) : implied_type(s);
  if (type) return type_body(g, s, type, ptr, depth, b);
  need_shared(g, SH_VALUE);
  sb_puts(b, "value");
  return LM_OK;
}

static lm_status schema_body(cg *g, const json_t *s, const char *ptr, int depth, sbuf *b) {
  if (depth > CG_MAX_DEPTH) return invalid(g, ptr, "nested deeper than 64 levels");
  LM_TRY(check_keywords(g, s, ptr));
  const json_t *ref = json_object_get(s, "$ref"), *c = json_object_get(s, "const"),
               *e = json_object_get(s, "enum");
  if (ref) {
    if (!json_is_string(ref)) return invalid(g, ptr, "$ref must be a string");
    char name[24];
    LM_TRY(ref_rule(g, json_string_value(ref), ptr, depth, name));
    sb_puts(b, name);
    return LM_OK;
  }
  if (c) return value_literal(b, c);
  if (e) {
    if (!json_is_array(e) || !json_array_size(e))
      return invalid(g, ptr, "enum must be a non-empty array");
    size_t i;
    const json_t *x;
    sb_puts(b, "(");
    json_array_foreach(e, i, x) {
      if (i) sb_puts(b, " | ");
      LM_TRY(value_literal(b, x));
    }
    sb_puts(b, ")");
    return LM_OK;
  }
  if (json_object_get(s, "anyOf"))
    return alternatives(g, json_object_get(s, "anyOf"), "anyOf", ptr, depth, b);
  if (json_object_get(s, "oneOf"))
    return alternatives(g, json_object_get(s, "oneOf"), "oneOf", ptr, depth, b);
  if (json_object_get(s, "allOf")) {
    json_t *m = NULL;
    LM_TRY(merge_all_of(g, s, ptr, &m));
    lm_status st = types_body(g, m, ptr, depth, b);
    json_decref(m);
    return st;
  }
  return types_body(g, s, ptr, depth, b);
}

static lm_status schema_rule(cg *g, const json_t *s, const char *ptr, int depth, char *name) {
  if (json_is_true(s) || (json_is_object(s) && !json_object_size(s))) {
    need_shared(g, SH_VALUE);
    snprintf(name, 24, "value");
    return LM_OK;
  }
  if (!json_is_object(s)) return invalid(g, ptr, "a schema must be an object");
  sbuf b = {0};
  lm_status st = schema_body(g, s, ptr, depth, &b);
  if (!st) st = sb_done(&b);
  if (!st) {
    new_name(g, name);
    emit_rule(g, name, &b);
  }
  free(b.p);
  return st;
}

/* ---- tools ----------------------------------------------------------------------------------- */

static const json_t *tool_function(const json_t *t) {
  const json_t *f = json_object_get(t, "function");
  return json_is_object(f) ? f : t;
}

/* One alternative of root: the tool's name and its arguments' rule. */
static lm_status tool_alt(cg *g, const json_t *fn, sbuf *root, int first) {
  const char *name = json_string_value(json_object_get(fn, "name"));
  const json_t *params = json_object_get(fn, "parameters");
  char rule[24];
  g->params = params;
  g->n_refs = 0; /* $refs are per tool document */
  if (!params || json_is_null(params)) {
    snprintf(rule, sizeof rule, "noargs");
    need_shared(g, SH_NOARGS);
  } else {
    if (!json_is_object(params)) return invalid(g, "", "parameters must be an object");
    LM_TRY(schema_rule(g, params, "", 0, rule));
  }
  if (!first) sb_puts(root, " | ");
  sb_lit(root, name, strlen(name));
  sb_fmt(root, " %s", rule);
  return LM_OK;
}

static lm_status build(cg *g, const json_t *tools, const char *only, sbuf *root) {
  if (!json_is_array(tools)) return LM_ERRF(LM_ERR_INVALID, "tools: must be a JSON array");
  size_t i, n = 0;
  const json_t *t;
  sb_puts(root, "\"call:\" (");
  json_array_foreach(tools, i, t) {
    const json_t *fn = tool_function(t);
    const char *name = json_string_value(json_object_get(fn, "name"));
    if (!name || !*name) return LM_ERRF(LM_ERR_INVALID, "tools[%zu]: no function name", i);
    if (only && strcmp(name, only)) continue;
    snprintf(g->tool, sizeof g->tool, "tools[%zu] (%.120s)", i, name);
    for (size_t r = 0; r < g->n_refs; r++)
      free(g->refs[r].ref);
    LM_TRY(tool_alt(g, fn, root, n == 0));
    n++;
  }
  sb_puts(root, ")");
  if (!n && only) return LM_ERRF(LM_ERR_INVALID, "tools: no tool is named '%.120s'", only);
  if (!n) return LM_ERRF(LM_ERR_INVALID, "tools: no tools are given");
  return LM_OK;
}

lm_status lm_call_grammar_gemma4(const char *tools_json, const char *only_name, char **gbnf) {
  *gbnf = NULL;
  json_error_t je;
  json_t *tools = tools_json ? json_loads(tools_json, 0, &je) : NULL;
  if (!tools)
    return LM_ERRF(LM_ERR_INVALID, "tools: bad JSON (%s)", tools_json ? je.text : "none given");
  cg g = {0};
  sbuf root = {0};
  lm_status st = build(&g, tools, only_name, &root);
  if (!st) {
    sb_puts(&g.out, "root ::= ");
    sb_put(&g.out, root.p, root.n);
    sb_puts(&g.out, "\n");
    st = sb_done(&g.out);
  }
  for (size_t r = 0; r < g.n_refs; r++)
    free(g.refs[r].ref);
  free(g.refs);
  free(root.p);
  json_decref(tools);
  if (st) {
    free(g.out.p);
    return st;
  }
  *gbnf = g.out.p;
  return LM_OK;
}
