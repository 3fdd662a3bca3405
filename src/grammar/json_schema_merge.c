/* json_schema_merge.c — allOf as one schema: the keywords of every part combined.
 *   properties: the union; a property in several parts gets {"allOf": [each]} (merged when
 *               its own rule is built, memoized, so nesting stays linear);
 *   required: the union; type: the intersection; additionalProperties: false wins;
 *   lower bounds (minimum, minLength, minItems, exclusiveMinimum): the largest, upper bounds the
 *   smallest; enum: the common values; const: must agree; anyOf / oneOf in two parts: the
 *   branches' cross product (bounded); items: {"allOf": [both]}.
 * Any other keyword present in two parts must be equal, else LM_ERR_UNSUPPORTED names it. A
 * part's $ref is followed (bounded depth) and its allOf merged in turn. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "grammar/json_schema_impl.h"

#define MERGE_MAX_CROSS 64

static lm_status nomem(void) { return LM_ERRF(LM_ERR_NOMEM, "json schema: out of memory"); }

static json_t *all_of2(json_t *a, json_t *b) { return json_pack("{s:[O,O]}", "allOf", a, b); }

static lm_status merge_props(json_t *acc, const json_t *oldp, const json_t *newp) {
  /* A shallow copy: the property schemas stay the document's nodes (the rule memo is by node). */
  json_t *p = json_copy((json_t *)oldp);
  if (!p) return nomem();
  const char *k;
  json_t *v;
  json_object_foreach((json_t *)newp, k, v) {
    json_t *o = json_object_get(p, k);
    json_t *nv = o ? all_of2(o, v) : json_incref(v);
    if (!nv || json_object_set_new(p, k, nv)) {
      json_decref(p);
      return nomem();
    }
  }
  return json_object_set_new(acc, "properties", p) ? nomem() : LM_OK;
}

static lm_status merge_required(json_t *acc, const json_t *oldr, const json_t *newr) {
  json_t *r = json_copy((json_t *)oldr);
  if (!r) return nomem();
  size_t i, j;
  json_t *v, *w;
  json_array_foreach(newr, i, v) {
    int have = 0;
    json_array_foreach(r, j, w) have |= json_equal(v, w);
    if (!have) json_array_append(r, v);
  }
  return json_object_set_new(acc, "required", r) ? nomem() : LM_OK;
}

/* The types both allow ("integer" is in "number"). */
static lm_status merge_type(json_t *acc, const json_t *a, const json_t *b, const char *ptr) {
  static const char *const names[] = {"null",   "boolean", "object", "array",
                                      "number", "string",  "integer"};
  int ma = 0, mb = 0;
  for (int side = 0; side < 2; side++) {
    const json_t *t = side ? b : a;
    int *m = side ? &mb : &ma;
    for (int i = 0; i < 7; i++) {
      int has = json_is_string(t) && !strcmp(json_string_value(t), names[i]);
      size_t k;
      json_t *v;
      json_array_foreach(t, k, v) has |=
          json_is_string(v) && !strcmp(json_string_value(v), names[i]);
      if (has) *m |= 1 << i;
    }
    if (*m & 16) *m |= 64; /* number includes integer */
  }
  int m = ma & mb;
  if (!m) return lm_js_err(LM_ERR_INVALID, ptr, "allOf: the parts share no type");
  if ((m & 64) && (m & 16) && !((ma & 16) && (mb & 16))) m &= ~16;
  json_t *t = json_array();
  if (!t) return nomem();
  for (int i = 0; i < 7; i++)
    if (m & (1 << i)) json_array_append_new(t, json_string(names[i]));
  return json_object_set_new(acc, "type", t) ? nomem() : LM_OK;
}

static lm_status merge_addl(json_t *acc, json_t *a, json_t *b) {
  json_t *r;
  if (json_is_false(a) || json_is_false(b))
    r = json_false();
  else if (json_is_true(a))
    r = json_incref(b);
  else if (json_is_true(b))
    r = json_incref(a);
  else
    r = all_of2(a, b);
  if (!r) return nomem();
  return json_object_set_new(acc, "additionalProperties", r) ? nomem() : LM_OK;
}

static lm_status merge_bound(json_t *acc, const char *k, json_t *a, json_t *b, int lower,
                             const char *ptr) {
  if (!json_is_number(a) || !json_is_number(b)) {
    if (json_equal(a, b)) return LM_OK;
    return lm_js_err(LM_ERR_UNSUPPORTED, ptr, "allOf: cannot combine two different '%s'", k);
  }
  double x = json_number_value(a), y = json_number_value(b);
  json_t *pick = (lower ? x >= y : x <= y) ? a : b;
  return json_object_set(acc, k, pick) ? nomem() : LM_OK;
}

static lm_status merge_enum(json_t *acc, const json_t *a, const json_t *b, const char *ptr) {
  json_t *r = json_array();
  if (!r) return nomem();
  size_t i, j;
  json_t *v, *w;
  json_array_foreach(a, i, v) {
    int in = 0;
    json_array_foreach(b, j, w) in |= json_equal(v, w);
    if (in) json_array_append(r, v);
  }
  if (json_array_size(r) == 0) {
    json_decref(r);
    return lm_js_err(LM_ERR_INVALID, ptr, "allOf: the parts' enums share no value");
  }
  return json_object_set_new(acc, "enum", r) ? nomem() : LM_OK;
}

static lm_status merge_any(json_t *acc, json_t *a, json_t *b, const char *ptr) {
  if (!json_is_array(a) || !json_is_array(b))
    return lm_js_err(LM_ERR_INVALID, ptr, "'anyOf' / 'oneOf' must be arrays");
  if (json_array_size(a) * json_array_size(b) > MERGE_MAX_CROSS)
    return lm_js_err(LM_ERR_UNSUPPORTED, ptr,
                     "allOf of two anyOf / oneOf with more than %d combinations", MERGE_MAX_CROSS);
  json_t *r = json_array();
  if (!r) return nomem();
  size_t i, j;
  json_t *v, *w;
  json_array_foreach(a, i, v) json_array_foreach(b, j, w) json_array_append_new(r, all_of2(v, w));
  return json_object_set_new(acc, "anyOf", r) ? nomem() : LM_OK;
}

static lm_status merge_kw(json_t *acc, const char *k, json_t *v, const char *ptr) {
  if (!strcmp(k, "oneOf")) k = "anyOf"; /* read as anyOf everywhere */
  json_t *old = json_object_get(acc, k);
  if (!old) return json_object_set(acc, k, v) ? nomem() : LM_OK;
  if (!strcmp(k, "properties")) {
    if (!json_is_object(old) || !json_is_object(v))
      return lm_js_err(LM_ERR_INVALID, ptr, "'properties' must be an object");
    return merge_props(acc, old, v);
  }
  if (!strcmp(k, "required")) {
    if (!json_is_array(old) || !json_is_array(v))
      return lm_js_err(LM_ERR_INVALID, ptr, "'required' must be an array");
    return merge_required(acc, old, v);
  }
  if (!strcmp(k, "type")) return merge_type(acc, old, v, ptr);
  if (!strcmp(k, "additionalProperties")) return merge_addl(acc, old, v);
  if (!strcmp(k, "items") && !json_is_array(old) && !json_is_array(v)) {
    json_t *r = all_of2(old, v);
    return !r || json_object_set_new(acc, k, r) ? nomem() : LM_OK;
  }
  static const char *const lower[] = {"minimum", "exclusiveMinimum", "minLength", "minItems"};
  static const char *const upper[] = {"maximum", "exclusiveMaximum", "maxLength", "maxItems"};
  for (int i = 0; i < 4; i++) {
    if (!strcmp(k, lower[i])) return merge_bound(acc, k, old, v, 1, ptr);
    if (!strcmp(k, upper[i])) return merge_bound(acc, k, old, v, 0, ptr);
  }
  if (!strcmp(k, "enum")) {
    if (!json_is_array(old) || !json_is_array(v))
      return lm_js_err(LM_ERR_INVALID, ptr, "'enum' must be an array");
    return merge_enum(acc, old, v, ptr);
  }
  if (!strcmp(k, "anyOf")) return merge_any(acc, old, v, ptr);
  if (json_equal(old, v)) return LM_OK;
  if (!strcmp(k, "const")) return lm_js_err(LM_ERR_INVALID, ptr, "allOf: two different 'const'");
  return lm_js_err(LM_ERR_UNSUPPORTED, ptr, "allOf: cannot combine two different '%s'", k);
}

static lm_status merge_into(lm_js *c, json_t *acc, const json_t *part, const char *ptr, int depth) {
  if (depth > LM_JS_MAX_DEPTH)
    return lm_js_err(LM_ERR_UNSUPPORTED, ptr, "allOf / $ref nested deeper than %d levels",
                     LM_JS_MAX_DEPTH);
  if (json_is_true(part)) return LM_OK;
  if (json_is_false(part)) return lm_js_err(LM_ERR_INVALID, ptr, "allOf: a part is false");
  if (!json_is_object(part)) return lm_js_err(LM_ERR_INVALID, ptr, "allOf: a part is not a schema");
  const json_t *ref = json_object_get(part, "$ref");
  if (ref) {
    const json_t *target;
    if (!json_is_string(ref)) return lm_js_err(LM_ERR_INVALID, ptr, "'$ref' must be a string");
    LM_TRY(lm_js_resolve(c, json_string_value(ref), ptr, &target));
    LM_TRY(merge_into(c, acc, target, ptr, depth + 1));
  }
  const char *k;
  json_t *v;
  json_object_foreach((json_t *)part, k, v) {
    if (lm_js_annotation(k) || !strcmp(k, "$ref")) continue;
    if (!strcmp(k, "allOf")) {
      if (!json_is_array(v)) return lm_js_err(LM_ERR_INVALID, ptr, "'allOf' must be an array");
      size_t i;
      json_t *sub;
      json_array_foreach(v, i, sub) LM_TRY(merge_into(c, acc, sub, ptr, depth + 1));
      continue;
    }
    LM_TRY(merge_kw(acc, k, v, ptr));
  }
  return LM_OK;
}

lm_status lm_js_merge(lm_js *c, const json_t *const *parts, size_t n, const char *ptr,
                      json_t **out) {
  json_t *acc = json_object();
  if (!acc) return nomem();
  if (c->n_owned == c->cap_owned) {
    uint32_t cap = c->cap_owned ? c->cap_owned * 2 : 16;
    json_t **o = realloc(c->owned, cap * sizeof *o);
    if (!o) {
      json_decref(acc);
      return nomem();
    }
    c->owned = o;
    c->cap_owned = cap;
  }
  c->owned[c->n_owned++] = acc;
  for (size_t i = 0; i < n; i++)
    LM_TRY(merge_into(c, acc, parts[i], ptr, 0));
  *out = acc;
  return LM_OK;
}
