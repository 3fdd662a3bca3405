/* json_schema.c — JSON Schema → grammar IR: the dispatch over keywords, objects, arrays,
 * combinators and references (strings and numbers are in json_schema_prim.c / _num.c).
 *
 * Choices (the JSON produced always validates; the grammar may admit fewer documents than the
 * schema does):
 *   - Objects emit only the listed properties, in the schema's order; required ones must appear,
 *     optional ones may be skipped. additionalProperties false (strict mode) changes nothing
 *     then; additionalProperties: {schema} or true is used only by objects without properties
 *     (a map of string keys). A required name not listed is added, with any value.
 *   - Without "type", the type follows from the keywords present (properties → object, items →
 *     array, minLength → string, ...), or any JSON value when none tells.
 *   - oneOf is read as anyOf (exclusivity cannot be enforced by a grammar); enum / const values
 *     are written in their compact serialization.
 *   - Whitespace: none at the start and end; between tokens none, one space, or a newline with
 *     up to LM_JS_WS_MAX spaces or tabs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "base/status.h"
#include "grammar/json_schema_impl.h"

lm_status lm_js_err(lm_status code, const char *ptr, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return LM_ERRF(code, "json schema: %s: %s", ptr, msg);
}

void lm_js_ptr(char *out, const char *ptr, const char *seg, const char *key) {
  size_t n = (size_t)snprintf(out, LM_JS_PTR_MAX, "%s/%s", ptr, seg);
  if (n >= LM_JS_PTR_MAX) n = LM_JS_PTR_MAX - 1;
  if (!key) return;
  if (n + 1 < LM_JS_PTR_MAX) out[n++] = '/';
  for (const char *k = key; *k && n + 3 < LM_JS_PTR_MAX; k++) {
    if (*k == '~')
      out[n++] = '~', out[n++] = '0';
    else if (*k == '/')
      out[n++] = '~', out[n++] = '1';
    else
      out[n++] = *k;
  }
  out[n] = '\0';
}

int lm_js_annotation(const char *k) {
  static const char *const ann[] = {
      "$schema",         "$id",           "$comment",    "$anchor",      "$defs",
      "definitions",     "title",         "description", "default",      "examples",
      "deprecated",      "readOnly",      "writeOnly",   "$vocabulary",  "contentMediaType",
      "contentEncoding", "discriminator", "xml",         "externalDocs", "example",
      "strict"};
  for (size_t i = 0; i < sizeof ann / sizeof *ann; i++)
    if (!strcmp(k, ann[i])) return 1;
  return !strncmp(k, "x-", 2);
}

static int unsupported(const char *k) {
  static const char *const bad[] = {"patternProperties",
                                    "propertyNames",
                                    "dependentRequired",
                                    "dependentSchemas",
                                    "dependencies",
                                    "if",
                                    "then",
                                    "else",
                                    "not",
                                    "contains",
                                    "minContains",
                                    "maxContains",
                                    "unevaluatedProperties",
                                    "unevaluatedItems",
                                    "multipleOf",
                                    "minProperties",
                                    "maxProperties",
                                    "$dynamicRef",
                                    "$dynamicAnchor",
                                    "$recursiveRef",
                                    "$recursiveAnchor",
                                    "contentSchema"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
    if (!strcmp(k, bad[i])) return 1;
  return 0;
}

static lm_status check_keywords(const json_t *node, const char *ptr) {
  const char *k;
  json_t *v;
  json_object_foreach((json_t *)node, k, v) {
    if (unsupported(k)) return lm_js_err(LM_ERR_UNSUPPORTED, ptr, "'%s' is not supported", k);
    if (!strcmp(k, "uniqueItems") && json_is_true(v))
      return lm_js_err(LM_ERR_UNSUPPORTED, ptr, "'uniqueItems': true is not supported");
  }
  return LM_OK;
}

/* ---- memo ---------------------------------------------------------------------------------- */

static uint32_t ptr_hash(const void *p) { return (uint32_t)lm_mix64((uint64_t)(uintptr_t)p); }

static int32_t memo_get(lm_js *c, const void *key) {
  if (!c->memo) return -1;
  for (uint32_t h = ptr_hash(key) & c->memo_mask; c->memo[h].key; h = (h + 1) & c->memo_mask)
    if (c->memo[h].key == key) return c->memo[h].rule;
  return -1;
}

static lm_status memo_put(lm_js *c, const void *key, int32_t rule) {
  if (!c->memo || (c->n_memo + 1) * 2 > c->memo_mask) {
    uint32_t n = c->memo ? (c->memo_mask + 1) * 2 : 256;
    js_memo *m = calloc(n, sizeof *m);
    if (!m) return LM_ERRF(LM_ERR_NOMEM, "json schema: out of memory");
    for (uint32_t i = 0; c->memo && i <= c->memo_mask; i++) {
      if (!c->memo[i].key) continue;
      uint32_t h = ptr_hash(c->memo[i].key) & (n - 1);
      while (m[h].key)
        h = (h + 1) & (n - 1);
      m[h] = c->memo[i];
    }
    free(c->memo);
    c->memo = m;
    c->memo_mask = n - 1;
  }
  uint32_t h = ptr_hash(key) & c->memo_mask;
  while (c->memo[h].key)
    h = (h + 1) & c->memo_mask;
  c->memo[h] = (js_memo){key, rule};
  c->n_memo++;
  return LM_OK;
}

/* ---- references ------------------------------------------------------------------------------ */

static int hexd(char ch) {
  if (ch >= '0' && ch <= '9') return ch - '0';
  if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
  if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
  return -1;
}

lm_status lm_js_resolve(lm_js *c, const char *ref, const char *ptr, const json_t **out) {
  if (ref[0] != '#' || (ref[1] != '\0' && ref[1] != '/'))
    return lm_js_err(LM_ERR_UNSUPPORTED, ptr,
                     "$ref '%.200s': only local JSON pointers (\"#\", \"#/...\") are supported",
                     ref);
  const json_t *cur = c->doc;
  const char *p = ref + 1;
  char tok[LM_JS_PTR_MAX];
  while (*p == '/') {
    p++;
    size_t n = 0;
    while (*p && *p != '/' && n + 1 < sizeof tok) {
      char ch = *p++;
      if (ch == '~' && (*p == '0' || *p == '1'))
        ch = *p++ == '0' ? '~' : '/';
      else if (ch == '%' && hexd(p[0]) >= 0 && hexd(p[1]) >= 0) {
        ch = (char)(hexd(p[0]) * 16 + hexd(p[1]));
        p += 2;
      }
      tok[n++] = ch;
    }
    tok[n] = '\0';
    if (json_is_object(cur)) {
      cur = json_object_getn(cur, tok, n);
    } else if (json_is_array(cur)) {
      char *end;
      unsigned long i = strtoul(tok, &end, 10);
      cur = (*tok && !*end) ? json_array_get(cur, i) : NULL;
    } else {
      cur = NULL;
    }
    if (!cur) return lm_js_err(LM_ERR_INVALID, ptr, "$ref '%.200s' does not resolve", ref);
  }
  *out = cur;
  return LM_OK;
}

/* ---- objects ------------------------------------------------------------------------------- */

typedef struct prop {
  const char *name;
  const json_t *schema;
  int required;
} prop;

/* "name" ws ":" ws value ws */
static lm_status kv_seq(lm_js *c, lm_gseq *s, const prop *p, int32_t value) {
  LM_TRY(lm_js_string_lit(c, s, p->name, strlen(p->name)));
  LM_TRY(lm_js_seq_ws(c, s));
  LM_TRY(lm_gseq_byte(c->b, s, ':'));
  LM_TRY(lm_js_seq_ws(c, s));
  LM_TRY(lm_gseq_ref(c->b, s, value));
  return lm_js_seq_ws(c, s);
}

static lm_status add_alt(lm_js *c, int32_t rule, lm_gseq *s) {
  lm_status st = lm_gir_add_alt(c->b, rule, s);
  lm_gseq_free(s);
  return st;
}

/* The properties in order: T(i) is "what may follow once something was written, from property
 * i on", F(i) "what may come first from property i on"; an optional property is an alternative
 * that skips it. Linear in the number of properties. */
static lm_status object_chain(lm_js *c, const prop *ps, uint32_t n, const int32_t *vals,
                              const char *ptr, int32_t *first) {
  int32_t t_next = -1, f_next = -1;
  lm_status st = LM_OK;
  for (uint32_t k = n; k-- > 0 && st == LM_OK;) {
    char name[LM_JS_PTR_MAX + 16];
    int32_t t, f;
    snprintf(name, sizeof name, "%s-rest-%u", ptr, k);
    LM_TRY(lm_gir_rule(c->b, name, &t));
    snprintf(name, sizeof name, "%s-first-%u", ptr, k);
    LM_TRY(lm_gir_rule(c->b, name, &f));
    lm_gseq s = {0};
    st = lm_gseq_byte(c->b, &s, ',');
    if (st == LM_OK) st = lm_js_seq_ws(c, &s);
    if (st == LM_OK) st = kv_seq(c, &s, &ps[k], vals[k]);
    if (st == LM_OK && t_next >= 0) st = lm_gseq_ref(c->b, &s, t_next);
    if (st == LM_OK) st = add_alt(c, t, &s);
    if (st == LM_OK && !ps[k].required) {
      if (t_next >= 0) st = lm_gseq_ref(c->b, &s, t_next);
      if (st == LM_OK) st = add_alt(c, t, &s);
    }
    if (st == LM_OK) st = kv_seq(c, &s, &ps[k], vals[k]);
    if (st == LM_OK && t_next >= 0) st = lm_gseq_ref(c->b, &s, t_next);
    if (st == LM_OK) st = add_alt(c, f, &s);
    if (st == LM_OK && !ps[k].required) {
      if (f_next >= 0) st = lm_gseq_ref(c->b, &s, f_next);
      if (st == LM_OK) st = add_alt(c, f, &s);
    }
    lm_gseq_free(&s);
    t_next = t;
    f_next = f;
  }
  *first = f_next;
  return st;
}

/* "{" ws (K ws ":" ws V ws ("," ws K ws ":" ws V ws)*)? "}" */
static lm_status object_map(lm_js *c, int32_t value, const char *ptr, lm_gseq *out) {
  int32_t key, opt;
  LM_TRY(lm_js_plain_string(c, 0, LM_G_INF, &key));
  lm_gseq s = {0};
  lm_status st = lm_gseq_ref(c->b, &s, key);
  if (st == LM_OK) st = lm_js_seq_ws(c, &s);
  if (st == LM_OK) st = lm_gseq_byte(c->b, &s, ':');
  if (st == LM_OK) st = lm_js_seq_ws(c, &s);
  if (st == LM_OK) st = lm_gseq_ref(c->b, &s, value);
  if (st == LM_OK) st = lm_js_seq_ws(c, &s);
  if (st == LM_OK) st = lm_js_comma_list(c, &s, ptr, "pair", &opt);
  lm_gseq_free(&s);
  if (st == LM_OK) st = lm_gseq_byte(c->b, out, '{');
  if (st == LM_OK) st = lm_js_seq_ws(c, out);
  if (st == LM_OK) st = lm_gseq_repeat(c->b, out, opt, 0, 1);
  if (st == LM_OK) st = lm_gseq_byte(c->b, out, '}');
  return st;
}

static int listed(const prop *ps, uint32_t n, const char *name) {
  for (uint32_t i = 0; i < n; i++)
    if (!strcmp(ps[i].name, name)) return 1;
  return 0;
}

static lm_status object_props(lm_js *c, const json_t *node, const char *ptr, prop **out,
                              uint32_t *n_out) {
  const json_t *props = json_object_get(node, "properties");
  const json_t *req = json_object_get(node, "required");
  const json_t *addl = json_object_get(node, "additionalProperties");
  if (props && !json_is_object(props))
    return lm_js_err(LM_ERR_INVALID, ptr, "'properties' must be an object");
  if (req && !json_is_array(req))
    return lm_js_err(LM_ERR_INVALID, ptr, "'required' must be an array");
  size_t cap = json_object_size(props) + json_array_size(req) + 1;
  prop *ps = calloc(cap, sizeof *ps);
  if (!ps) return LM_ERRF(LM_ERR_NOMEM, "json schema: out of memory");
  uint32_t n = 0;
  const char *k;
  json_t *v;
  json_object_foreach((json_t *)props, k, v) ps[n++] = (prop){k, v, 0};
  size_t i;
  json_array_foreach(req, i, v) {
    if (!json_is_string(v)) {
      free(ps);
      return lm_js_err(LM_ERR_INVALID, ptr, "'required' must list strings");
    }
    const char *name = json_string_value(v);
    uint32_t j = 0;
    while (j < n && strcmp(ps[j].name, name))
      j++;
    if (j == n) {
      if (json_is_false(addl)) {
        free(ps);
        return lm_js_err(LM_ERR_INVALID, ptr,
                         "required property '%.100s' is not in 'properties' and "
                         "additionalProperties is false",
                         name);
      }
      if (listed(ps, n, name)) continue;
      ps[n++] = (prop){name, json_true(), 1};
    }
    ps[j].required = 1;
  }
  *out = ps;
  *n_out = n;
  return LM_OK;
}

static lm_status build_object(lm_js *c, const json_t *node, const char *ptr, lm_gseq *out) {
  const json_t *addl = json_object_get(node, "additionalProperties");
  if (addl && !json_is_boolean(addl) && !json_is_object(addl))
    return lm_js_err(LM_ERR_INVALID, ptr, "'additionalProperties' must be a boolean or a schema");
  prop *ps = NULL;
  uint32_t n = 0;
  LM_TRY(object_props(c, node, ptr, &ps, &n));
  lm_status st = LM_OK;
  if (n == 0) {
    free(ps);
    if (json_is_false(addl)) {
      LM_TRY(lm_gseq_byte(c->b, out, '{'));
      LM_TRY(lm_js_seq_ws(c, out));
      return lm_gseq_byte(c->b, out, '}');
    }
    int32_t value;
    char sub[LM_JS_PTR_MAX];
    lm_js_ptr(sub, ptr, "additionalProperties", NULL);
    if (json_is_object(addl))
      LM_TRY(lm_js_rule(c, addl, sub, &value));
    else
      LM_TRY(lm_js_value(c, &value));
    return object_map(c, value, ptr, out);
  }
  int32_t *vals = calloc(n, sizeof *vals);
  if (!vals) st = LM_ERRF(LM_ERR_NOMEM, "json schema: out of memory");
  for (uint32_t i = 0; i < n && st == LM_OK; i++) {
    char sub[LM_JS_PTR_MAX];
    lm_js_ptr(sub, ptr, "properties", ps[i].name);
    st = lm_js_rule(c, ps[i].schema, sub, &vals[i]);
  }
  int32_t first = -1;
  if (st == LM_OK) st = object_chain(c, ps, n, vals, ptr, &first);
  if (st == LM_OK) st = lm_gseq_byte(c->b, out, '{');
  if (st == LM_OK) st = lm_js_seq_ws(c, out);
  if (st == LM_OK) st = lm_gseq_ref(c->b, out, first);
  if (st == LM_OK) st = lm_gseq_byte(c->b, out, '}');
  free(vals);
  free(ps);
  return st;
}

/* ---- arrays -------------------------------------------------------------------------------- */

static lm_status get_count(const json_t *node, const char *key, const char *ptr, uint32_t dflt,
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

/* The rule of an item schema (absent or true: any value). */
static lm_status item_rule(lm_js *c, const json_t *s, const char *ptr, int32_t *rule) {
  if (!s || json_is_true(s)) return lm_js_value(c, rule);
  return lm_js_rule(c, s, ptr, rule);
}

/* "," ws ITEM ws, as a rule. */
static lm_status comma_item(lm_js *c, int32_t item, const char *ptr, int32_t *rule) {
  lm_gseq s = {0};
  char name[LM_JS_PTR_MAX + 16];
  snprintf(name, sizeof name, "%s-next", ptr);
  lm_status st = lm_gseq_byte(c->b, &s, ',');
  if (st == LM_OK) st = lm_js_seq_ws(c, &s);
  if (st == LM_OK) st = lm_gseq_ref(c->b, &s, item);
  if (st == LM_OK) st = lm_js_seq_ws(c, &s);
  if (st == LM_OK) st = lm_gir_wrap(c->b, name, &s, rule);
  lm_gseq_free(&s);
  return st;
}

typedef struct arr {
  const json_t *prefix; /* array of schemas, or NULL */
  const json_t *extra;  /* schema of items past the prefix; NULL with no_extra: none allowed */
  int no_extra;
  uint32_t min, max;
} arr;

static lm_status array_shape(const json_t *node, const char *ptr, arr *a) {
  const json_t *pre = json_object_get(node, "prefixItems");
  const json_t *items = json_object_get(node, "items");
  memset(a, 0, sizeof *a);
  if (pre && !json_is_array(pre))
    return lm_js_err(LM_ERR_INVALID, ptr, "'prefixItems' must be an array");
  if (pre) {
    a->prefix = pre;
    a->extra = items;
  } else if (json_is_array(items)) { /* draft 7 tuples */
    a->prefix = items;
    a->extra = json_object_get(node, "additionalItems");
  } else {
    a->extra = items;
  }
  if (a->extra && !json_is_boolean(a->extra) && !json_is_object(a->extra))
    return lm_js_err(LM_ERR_INVALID, ptr, "array items must be a schema or a boolean");
  a->no_extra = json_is_false(a->extra);
  LM_TRY(get_count(node, "minItems", ptr, 0, &a->min));
  LM_TRY(get_count(node, "maxItems", ptr, LM_G_INF, &a->max));
  uint32_t k = (uint32_t)json_array_size(a->prefix);
  if (a->no_extra && a->max > k) a->max = k;
  if (a->min > a->max)
    return lm_js_err(LM_ERR_INVALID, ptr, "no array fits (minItems %u, at most %u items)", a->min,
                     a->max);
  return LM_OK;
}

static uint32_t sub_count(uint32_t x, uint32_t k) {
  return x == LM_G_INF ? x : (x > k ? x - k : 0);
}

/* rules[j] for j = 1..k: what may follow once the prefix item j (1-based) was written; -1 when
 * nothing may (built from the last back, so a long tuple costs no recursion). */
static lm_status array_tails(lm_js *c, const arr *a, const int32_t *pre, int32_t extra,
                             const char *ptr, int32_t *rules) {
  uint32_t k = (uint32_t)json_array_size(a->prefix);
  lm_status st = LM_OK;
  for (uint32_t j = k; j >= 1 && st == LM_OK; j--) {
    char name[LM_JS_PTR_MAX + 16];
    snprintf(name, sizeof name, "%s-after-%u", ptr, j);
    int32_t rule;
    LM_TRY(lm_gir_rule(c->b, name, &rule));
    lm_gseq s = {0};
    if (j < k) {
      if (j >= a->min) st = add_alt(c, rule, &s);
      if (st == LM_OK && j + 1 <= a->max) {
        st = lm_gseq_byte(c->b, &s, ',');
        if (st == LM_OK) st = lm_js_seq_ws(c, &s);
        if (st == LM_OK) st = lm_gseq_ref(c->b, &s, pre[j]);
        if (st == LM_OK) st = lm_js_seq_ws(c, &s);
        if (st == LM_OK && rules[j + 1] >= 0) st = lm_gseq_ref(c->b, &s, rules[j + 1]);
        if (st == LM_OK) st = add_alt(c, rule, &s);
      }
    } else if (extra >= 0 && a->max > k) {
      int32_t more;
      st = comma_item(c, extra, ptr, &more);
      if (st == LM_OK)
        st = lm_gseq_repeat(c->b, &s, more, sub_count(a->min, k), sub_count(a->max, k));
      if (st == LM_OK) st = add_alt(c, rule, &s);
    } else {
      st = add_alt(c, rule, &s); /* j == k == max: the array ends */
    }
    lm_gseq_free(&s);
    rules[j] = rule;
  }
  return st;
}

static lm_status build_array(lm_js *c, const json_t *node, const char *ptr, lm_gseq *out) {
  arr a;
  LM_TRY(array_shape(node, ptr, &a));
  uint32_t k = (uint32_t)json_array_size(a.prefix);
  int32_t extra = -1, first_item;
  char sub[LM_JS_PTR_MAX];
  if (!a.no_extra && a.max > k) {
    lm_js_ptr(sub, ptr,
              a.prefix && json_object_get(node, "prefixItems") ? "items"
              : a.prefix                                       ? "additionalItems"
                                                               : "items",
              NULL);
    LM_TRY(item_rule(c, a.extra, sub, &extra));
  }
  int32_t *pre = calloc(k + 1, sizeof *pre), *tails = calloc(k + 2, sizeof *tails);
  if (!pre || !tails) {
    free(pre);
    free(tails);
    return LM_ERRF(LM_ERR_NOMEM, "json schema: out of memory");
  }
  lm_status st = LM_OK;
  const char *pname = json_object_get(node, "prefixItems") ? "prefixItems" : "items";
  for (uint32_t i = 0; i < k && st == LM_OK; i++) {
    char idx[24];
    snprintf(idx, sizeof idx, "%u", i);
    lm_js_ptr(sub, ptr, pname, idx);
    st = item_rule(c, json_array_get(a.prefix, i), sub, &pre[i]);
  }
  lm_gseq body = {0};
  if (st == LM_OK) st = lm_gseq_byte(c->b, out, '[');
  if (st == LM_OK) st = lm_js_seq_ws(c, out);
  if (st == LM_OK && a.max > 0) {
    /* The first item, then the rest; optional when minItems is 0. */
    int32_t tail = -1, whole;
    first_item = k > 0 ? pre[0] : extra;
    if (k > 0) {
      st = array_tails(c, &a, pre, extra, ptr, tails);
      tail = tails[1];
    } else {
      int32_t more;
      st = comma_item(c, extra, ptr, &more);
      if (st == LM_OK)
        st = lm_gseq_repeat(c->b, &body, more, a.min > 0 ? a.min - 1 : 0, sub_count(a.max, 1));
    }
    lm_gseq head = {0};
    if (st == LM_OK) st = lm_gseq_ref(c->b, &head, first_item);
    if (st == LM_OK) st = lm_js_seq_ws(c, &head);
    if (st == LM_OK && tail >= 0) st = lm_gseq_ref(c->b, &head, tail);
    if (st == LM_OK) st = lm_gseq_cat(c->b, &head, &body);
    snprintf(sub, sizeof sub, "%s-items", ptr);
    if (st == LM_OK) st = lm_gir_wrap(c->b, sub, &head, &whole);
    lm_gseq_free(&head);
    if (st == LM_OK) st = lm_gseq_repeat(c->b, out, whole, a.min > 0 ? 1 : 0, 1);
  }
  if (st == LM_OK) st = lm_gseq_byte(c->b, out, ']');
  lm_gseq_free(&body);
  free(pre);
  free(tails);
  return st;
}

/* ---- types --------------------------------------------------------------------------------- */

enum {
  T_NULL = 1,
  T_BOOL = 2,
  T_OBJECT = 4,
  T_ARRAY = 8,
  T_NUMBER = 16,
  T_STRING = 32,
  T_INTEGER = 64,
  T_ALL = 127
};

static int type_bit(const char *t) {
  static const char *const names[] = {"null",   "boolean", "object", "array",
                                      "number", "string",  "integer"};
  for (int i = 0; i < 7; i++)
    if (!strcmp(t, names[i])) return 1 << i;
  return 0;
}

static int has_any(const json_t *node, const char *const *keys) {
  for (; *keys; keys++)
    if (json_object_get(node, *keys)) return 1;
  return 0;
}

static lm_status type_set(const json_t *node, const char *ptr, int *out) {
  const json_t *t = json_object_get(node, "type");
  int m = 0;
  if (json_is_string(t)) {
    m = type_bit(json_string_value(t));
    if (!m) return lm_js_err(LM_ERR_INVALID, ptr, "unknown type '%.60s'", json_string_value(t));
  } else if (json_is_array(t)) {
    size_t i;
    json_t *v;
    json_array_foreach(t, i, v) {
      int b = json_is_string(v) ? type_bit(json_string_value(v)) : 0;
      if (!b) return lm_js_err(LM_ERR_INVALID, ptr, "'type' must list type names");
      m |= b;
    }
    if (!m) return lm_js_err(LM_ERR_INVALID, ptr, "'type' is an empty list");
  } else if (t) {
    return lm_js_err(LM_ERR_INVALID, ptr, "'type' must be a string or an array");
  } else {
    static const char *const obj[] = {"properties", "required", "additionalProperties", NULL};
    static const char *const ar[] = {"items",    "prefixItems",     "minItems",
                                     "maxItems", "additionalItems", NULL};
    static const char *const str[] = {"minLength", "maxLength", "pattern", "format", NULL};
    static const char *const num[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                                      NULL};
    if (has_any(node, obj)) m |= T_OBJECT;
    if (has_any(node, ar)) m |= T_ARRAY;
    if (has_any(node, str)) m |= T_STRING;
    if (has_any(node, num)) m |= T_NUMBER;
    if (!m) m = T_ALL;
  }
  if (json_is_true(json_object_get(node, "nullable"))) m |= T_NULL;
  if ((m & T_NUMBER) && (m & T_INTEGER)) m &= ~T_INTEGER; /* numbers include the integers */
  *out = m;
  return LM_OK;
}

static int value_fits(const json_t *v, int types) {
  switch (json_typeof(v)) {
  case JSON_NULL: return types & T_NULL;
  case JSON_TRUE:
  case JSON_FALSE: return types & T_BOOL;
  case JSON_OBJECT: return types & T_OBJECT;
  case JSON_ARRAY: return types & T_ARRAY;
  case JSON_STRING: return types & T_STRING;
  case JSON_INTEGER: return types & (T_NUMBER | T_INTEGER);
  case JSON_REAL: {
    double d = json_real_value(v);
    return (types & T_NUMBER) || ((types & T_INTEGER) && d == (double)(int64_t)d);
  }
  }
  return 0;
}

static lm_status add_typed(lm_js *c, const json_t *node, const char *ptr, int t, int32_t rule) {
  lm_gseq s = {0};
  lm_status st = LM_OK;
  int32_t r;
  switch (t) {
  case T_NULL: st = lm_gseq_lit(c->b, &s, "null", 4); break;
  case T_BOOL:
    st = lm_gseq_lit(c->b, &s, "true", 4);
    if (st == LM_OK) st = add_alt(c, rule, &s);
    if (st == LM_OK) st = lm_gseq_lit(c->b, &s, "false", 5);
    break;
  case T_OBJECT: st = build_object(c, node, ptr, &s); break;
  case T_ARRAY: st = build_array(c, node, ptr, &s); break;
  case T_STRING:
    st = lm_js_string(c, node, ptr, &r);
    if (st == LM_OK) st = lm_gseq_ref(c->b, &s, r);
    break;
  case T_NUMBER:
    st = lm_js_number(c, node, ptr, &r);
    if (st == LM_OK) st = lm_gseq_ref(c->b, &s, r);
    break;
  case T_INTEGER:
    st = lm_js_integer(c, node, ptr, &r);
    if (st == LM_OK) st = lm_gseq_ref(c->b, &s, r);
    break;
  }
  if (st == LM_OK) st = add_alt(c, rule, &s);
  lm_gseq_free(&s);
  return st;
}

/* ---- combinators ------------------------------------------------------------------------------
 */

static int is_pure_ref(const json_t *s) {
  if (!json_is_object(s) || !json_is_string(json_object_get(s, "$ref"))) return 0;
  const char *k;
  json_t *v;
  json_object_foreach((json_t *)s, k, v) if (strcmp(k, "$ref") && !lm_js_annotation(k)) return 0;
  return 1;
}

/* Whether the node has assertion keywords besides those in `except`. */
static int has_assertions(const json_t *node, const char *const *except) {
  const char *k;
  json_t *v;
  json_object_foreach((json_t *)node, k, v) {
    if (lm_js_annotation(k)) continue;
    int skip = 0;
    for (const char *const *e = except; *e; e++)
      skip |= !strcmp(k, *e);
    if (!skip) return 1;
  }
  return 0;
}

/* node without the keys in `drop` (a new object owned by c), or NULL when nothing is left. */
static lm_status rest_of(lm_js *c, const json_t *node, const char *const *drop, json_t **out) {
  json_t *r = json_object();
  if (!r) return LM_ERRF(LM_ERR_NOMEM, "json schema: out of memory");
  const char *k;
  json_t *v;
  int any = 0;
  json_object_foreach((json_t *)node, k, v) {
    int skip = lm_js_annotation(k);
    for (const char *const *d = drop; *d; d++)
      skip |= !strcmp(k, *d);
    if (skip) continue;
    json_object_set(r, k, v);
    any = 1;
  }
  if (!any) {
    json_decref(r);
    *out = NULL;
    return LM_OK;
  }
  if (c->n_owned == c->cap_owned) {
    uint32_t cap = c->cap_owned ? c->cap_owned * 2 : 16;
    json_t **o = realloc(c->owned, cap * sizeof *o);
    if (!o) {
      json_decref(r);
      return LM_ERRF(LM_ERR_NOMEM, "json schema: out of memory");
    }
    c->owned = o;
    c->cap_owned = cap;
  }
  c->owned[c->n_owned++] = r;
  *out = r;
  return LM_OK;
}

static lm_status build(lm_js *c, const json_t *node, const char *ptr, int32_t rule);

/* The rule of allOf(parts), memoized by the parts (pure $refs replaced by their targets). */
static lm_status merged_rule(lm_js *c, const json_t **parts, uint32_t n, const char *ptr,
                             int32_t *rule) {
  uint64_t h = n;
  for (uint32_t i = 0; i < n; i++) {
    if (is_pure_ref(parts[i]))
      LM_TRY(
          lm_js_resolve(c, json_string_value(json_object_get(parts[i], "$ref")), ptr, &parts[i]));
    h = lm_mix64(h ^ (uint64_t)(uintptr_t)parts[i]);
  }
  for (uint32_t m = 0; m < c->n_merges; m++) {
    const js_merge *g = &c->merges[m];
    if (g->hash == h && g->n == n && !memcmp(g->parts, parts, n * sizeof *parts)) {
      *rule = g->rule;
      return LM_OK;
    }
  }
  if (c->n_merges == c->cap_merges) {
    uint32_t cap = c->cap_merges ? c->cap_merges * 2 : 16;
    js_merge *g = realloc(c->merges, cap * sizeof *g);
    if (!g) return LM_ERRF(LM_ERR_NOMEM, "json schema: out of memory");
    c->merges = g;
    c->cap_merges = cap;
  }
  js_merge *g = &c->merges[c->n_merges];
  g->parts = malloc(n * sizeof *parts);
  if (!g->parts) return LM_ERRF(LM_ERR_NOMEM, "json schema: out of memory");
  memcpy(g->parts, parts, n * sizeof *parts);
  g->n = n;
  g->hash = h;
  char name[LM_JS_PTR_MAX + 16];
  snprintf(name, sizeof name, "%s-allOf", ptr);
  LM_TRY(lm_gir_rule(c->b, name, &g->rule));
  int32_t r = g->rule;
  c->n_merges++;
  json_t *merged;
  LM_TRY(lm_js_merge(c, parts, n, ptr, &merged));
  if (++c->depth > LM_JS_MAX_DEPTH)
    return lm_js_err(LM_ERR_UNSUPPORTED, ptr, "nested deeper than %d levels", LM_JS_MAX_DEPTH);
  LM_TRY(build(c, merged, ptr, r));
  c->depth--;
  *rule = r;
  return LM_OK;
}

static lm_status build_all_of(lm_js *c, const json_t *node, const char *ptr, int32_t rule) {
  const json_t *all = json_object_get(node, "allOf");
  if (!json_is_array(all) || json_array_size(all) == 0)
    return lm_js_err(LM_ERR_INVALID, ptr, "'allOf' must be a non-empty array");
  static const char *const drop[] = {"allOf", NULL};
  json_t *rest;
  LM_TRY(rest_of(c, node, drop, &rest));
  size_t n = json_array_size(all);
  const json_t **parts = calloc(n + 1, sizeof *parts);
  if (!parts) return LM_ERRF(LM_ERR_NOMEM, "json schema: out of memory");
  uint32_t k = 0;
  if (rest) parts[k++] = rest;
  for (size_t i = 0; i < n; i++)
    parts[k++] = json_array_get(all, i);
  int32_t r;
  lm_status st = merged_rule(c, parts, k, ptr, &r);
  free(parts);
  lm_gseq s = {0};
  if (st == LM_OK) st = lm_gseq_ref(c->b, &s, r);
  if (st == LM_OK) st = add_alt(c, rule, &s);
  lm_gseq_free(&s);
  return st;
}

static lm_status build_any_of(lm_js *c, const json_t *node, const char *ptr, const char *kw,
                              int32_t rule) {
  const json_t *any = json_object_get(node, kw);
  if (!json_is_array(any) || json_array_size(any) == 0)
    return lm_js_err(LM_ERR_INVALID, ptr, "'%s' must be a non-empty array", kw);
  static const char *const drop[] = {"anyOf", "oneOf", NULL};
  json_t *rest = NULL;
  if (has_assertions(node, drop)) LM_TRY(rest_of(c, node, drop, &rest));
  size_t i;
  json_t *br;
  json_array_foreach(any, i, br) {
    char sub[LM_JS_PTR_MAX], idx[24];
    snprintf(idx, sizeof idx, "%zu", i);
    lm_js_ptr(sub, ptr, kw, idx);
    int32_t r;
    if (rest) {
      const json_t *parts[2] = {rest, br};
      LM_TRY(merged_rule(c, parts, 2, sub, &r));
    } else {
      LM_TRY(lm_js_rule(c, br, sub, &r));
    }
    lm_gseq s = {0};
    lm_status st = lm_gseq_ref(c->b, &s, r);
    if (st == LM_OK) st = add_alt(c, rule, &s);
    lm_gseq_free(&s);
    LM_TRY(st);
  }
  return LM_OK;
}

static lm_status build_enum(lm_js *c, const json_t *node, const char *ptr, int32_t rule) {
  const json_t *cst = json_object_get(node, "const");
  const json_t *en = json_object_get(node, "enum");
  int types = T_ALL;
  if (json_object_get(node, "type") || json_object_get(node, "nullable"))
    LM_TRY(type_set(node, ptr, &types));
  if ((types & T_NUMBER)) types |= T_INTEGER;
  if (en && (!json_is_array(en) || json_array_size(en) == 0))
    return lm_js_err(LM_ERR_INVALID, ptr, "'enum' must be a non-empty array");
  int added = 0;
  size_t i;
  json_t *v;
  if (cst) {
    int in = !en;
    json_array_foreach(en, i, v) in |= json_equal(v, (json_t *)cst);
    if (in && value_fits(cst, types)) {
      lm_gseq s = {0};
      lm_status st = lm_js_literal(c, &s, cst, ptr);
      if (st == LM_OK) st = add_alt(c, rule, &s);
      lm_gseq_free(&s);
      LM_TRY(st);
      added = 1;
    }
  } else {
    json_array_foreach(en, i, v) {
      if (!value_fits(v, types)) continue;
      lm_gseq s = {0};
      lm_status st = lm_js_literal(c, &s, v, ptr);
      if (st == LM_OK) st = add_alt(c, rule, &s);
      lm_gseq_free(&s);
      LM_TRY(st);
      added = 1;
    }
  }
  if (!added) return lm_js_err(LM_ERR_INVALID, ptr, "no value of 'enum' / 'const' fits the schema");
  return LM_OK;
}

/* Adds the alternatives of schema `node` to `rule`. */
static lm_status build(lm_js *c, const json_t *node, const char *ptr, int32_t rule) {
  if (++c->work > LM_JS_MAX_WORK)
    return lm_js_err(LM_ERR_UNSUPPORTED, ptr, "the schema is too complex (more than %u parts)",
                     LM_JS_MAX_WORK);
  if (json_is_true(node)) {
    int32_t v;
    LM_TRY(lm_js_value(c, &v));
    lm_gseq s = {0};
    lm_status st = lm_gseq_ref(c->b, &s, v);
    if (st == LM_OK) st = add_alt(c, rule, &s);
    lm_gseq_free(&s);
    return st;
  }
  if (json_is_false(node)) return lm_js_err(LM_ERR_INVALID, ptr, "schema false accepts no value");
  if (!json_is_object(node))
    return lm_js_err(LM_ERR_INVALID, ptr, "a schema must be an object or a boolean");
  LM_TRY(check_keywords(node, ptr));
  if (json_object_get(node, "allOf")) return build_all_of(c, node, ptr, rule);
  const json_t *ref = json_object_get(node, "$ref");
  if (ref) {
    if (!json_is_string(ref)) return lm_js_err(LM_ERR_INVALID, ptr, "'$ref' must be a string");
    if (!is_pure_ref(node)) { /* $ref beside other keywords: both apply */
      static const char *const drop[] = {"$ref", NULL};
      json_t *rest;
      LM_TRY(rest_of(c, node, drop, &rest));
      json_t *refonly = json_pack("{s:O}", "$ref", ref);
      if (!refonly) return LM_ERRF(LM_ERR_NOMEM, "json schema: out of memory");
      const json_t *parts[2] = {refonly, rest};
      int32_t r;
      lm_status st = merged_rule(c, parts, 2, ptr, &r);
      json_decref(refonly);
      lm_gseq s = {0};
      if (st == LM_OK) st = lm_gseq_ref(c->b, &s, r);
      if (st == LM_OK) st = add_alt(c, rule, &s);
      lm_gseq_free(&s);
      return st;
    }
    const json_t *target;
    LM_TRY(lm_js_resolve(c, json_string_value(ref), ptr, &target));
    int32_t r;
    LM_TRY(lm_js_rule(c, target, json_string_value(ref), &r));
    lm_gseq s = {0};
    lm_status st = lm_gseq_ref(c->b, &s, r);
    if (st == LM_OK) st = add_alt(c, rule, &s);
    lm_gseq_free(&s);
    return st;
  }
  if (json_object_get(node, "const") || json_object_get(node, "enum"))
    return build_enum(c, node, ptr, rule);
  int any = json_object_get(node, "anyOf") != NULL, one = json_object_get(node, "oneOf") != NULL;
  if (any && one)
    return lm_js_err(LM_ERR_UNSUPPORTED, ptr, "'anyOf' together with 'oneOf' is not supported");
  if (any || one) return build_any_of(c, node, ptr, any ? "anyOf" : "oneOf", rule);
  int types;
  LM_TRY(type_set(node, ptr, &types));
  for (int t = 1; t <= T_INTEGER; t <<= 1)
    if (types & t) LM_TRY(add_typed(c, node, ptr, t, rule));
  return LM_OK;
}

lm_status lm_js_rule(lm_js *c, const json_t *node, const char *ptr, int32_t *rule) {
  int32_t r = memo_get(c, node);
  if (r >= 0) {
    *rule = r;
    return LM_OK;
  }
  LM_TRY(lm_gir_rule(c->b, ptr, &r));
  LM_TRY(memo_put(c, node, r));
  if (++c->depth > LM_JS_MAX_DEPTH)
    return lm_js_err(LM_ERR_UNSUPPORTED, ptr, "nested deeper than %d levels", LM_JS_MAX_DEPTH);
  LM_TRY(build(c, node, ptr, r));
  c->depth--;
  *rule = r;
  return LM_OK;
}

static void js_free(lm_js *c) {
  for (uint32_t i = 0; i < c->n_owned; i++)
    json_decref(c->owned[i]);
  for (uint32_t i = 0; i < c->n_merges; i++)
    free(c->merges[i].parts);
  free(c->owned);
  free(c->merges);
  free(c->memo);
  free(c->strs);
  lm_gir_free(c->b);
}

static lm_status convert(json_t *doc, lm_grammar **out) {
  lm_js c;
  memset(&c, 0, sizeof c);
  c.doc = doc;
  c.r_ws = c.r_char = c.r_string = c.r_value = c.r_number = c.r_integer = c.r_object = c.r_array =
      c.r_digit = c.r_frac = c.r_frac_nz = c.r_frac_zero = -1;
  for (int i = 0; i < 8; i++)
    c.r_fmt[i] = -1;
  lm_status s = lm_gir_create(&c.b);
  if (s != LM_OK) return s;
  int32_t root = -1;
  s = lm_js_rule(&c, doc, "#", &root);
  if (s == LM_OK) {
    s = lm_gir_finish(c.b, root, out);
    if (s != LM_OK && strncmp(lm_errmsg(), "json schema", 11)) lm_err_prefix(s, "json schema");
  }
  js_free(&c);
  return s;
}

lm_status lm_grammar_from_json_schema(const char *schema, size_t len, lm_grammar **out) {
  if (!out || (!schema && len)) return LM_ERRF(LM_ERR_INVALID, "json schema: NULL argument");
  json_error_t err;
  json_t *doc =
      json_loadb(schema ? schema : "", len, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &err);
  if (!doc)
    return LM_ERRF(LM_ERR_INVALID, "json schema: invalid JSON at line %d, column %d: %s", err.line,
                   err.column, err.text);
  lm_status s = convert(doc, out);
  json_decref(doc);
  return s;
}

lm_status lm_grammar_json_object(lm_grammar **out) {
  json_t *doc = json_pack("{s:s}", "type", "object");
  if (!doc) return LM_ERRF(LM_ERR_NOMEM, "json schema: out of memory");
  lm_status s = convert(doc, out);
  json_decref(doc);
  return s;
}
