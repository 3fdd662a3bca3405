/* jinja_value.h — the template interpreter's value type and the arena that owns values.
 *
 * A value (lm_jv) is 16 bytes passed by value: a kind tag plus a scalar or a pointer into an arena.
 * All heap parts of values live in one lm_jarena per render and die with it, so the evaluator never
 * counts references and a failed render frees everything in one call. The kinds mirror what Python
 * jinja2 sees after transformers hands it JSON: None, bool, int (int64, or a decimal text when a
 * JSON integer does not fit: Python ints are unbounded), float, str, list/tuple, dict with
 * insertion order — plus the interpreter's own objects (Undefined, namespace(), macros, builtin
 * functions, the `loop` object).
 *
 * Printing follows Python's str()/repr(): `None`, `True`, `1e-05`, `100.0`, `['a', 1]`, `{'k':
 * 'v'}`. */
#ifndef LM_TEXT_JINJA_VALUE_H
#define LM_TEXT_JINJA_VALUE_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "lumen.h"
#include "text/jinja_str.h"

/* ---- arena ---------------------------------------------------------------------------------- */

typedef struct lm_jarena lm_jarena;

/* An arena that refuses to grow past max_bytes (0 = unbounded): templates that build huge strings
 * in a loop get an error instead of taking the process's memory. */
lm_status lm_jarena_create(size_t max_bytes, lm_jarena **out);
void lm_jarena_free(lm_jarena *a);
/* Zeroed memory, 16-byte aligned; LM_ERR_NOMEM (with message) past the limit. */
lm_status lm_jarena_alloc(lm_jarena *a, size_t size, void **out);
size_t lm_jarena_used(const lm_jarena *a);

/* ---- values --------------------------------------------------------------------------------- */

typedef enum lm_jv_kind {
  LM_JV_UNDEF = 0, /* jinja2 Undefined: prints "", is falsy, iterates as empty */
  LM_JV_NONE,
  LM_JV_BOOL,
  LM_JV_INT,
  LM_JV_BIGINT, /* an integer outside int64, kept as its decimal text (printing and equality only)
                 */
  LM_JV_FLOAT,
  LM_JV_STR,
  LM_JV_LIST, /* list or tuple (lm_jlist.tuple) */
  LM_JV_DICT,
  LM_JV_NS,    /* namespace(): a dict whose attributes can be assigned */
  LM_JV_MACRO, /* a template macro (evaluator-owned closure) */
  LM_JV_FUNC,  /* a builtin global function (u.i = its id) */
  LM_JV_LOOP   /* the `loop` object of a for loop (evaluator-owned) */
} lm_jv_kind;

typedef struct lm_jstr {
  size_t len;
  char s[]; /* len bytes + NUL */
} lm_jstr;

typedef struct lm_jv {
  lm_jv_kind kind;
  union {
    int b;
    int64_t i;
    double f;
    const lm_jstr *s; /* STR, BIGINT; UNDEF: the missing name, or NULL */
    struct lm_jlist *l;
    struct lm_jdict *d; /* DICT, NS */
    void *p;            /* MACRO, LOOP */
  } u;
} lm_jv;

typedef struct lm_jlist {
  size_t n, cap;
  lm_jv *v;
  int tuple;
} lm_jlist;

typedef struct lm_jdict {
  size_t n, cap;
  lm_jv *k, *v; /* insertion order */
} lm_jdict;

static inline lm_jv lm_jv_undef(void) {
  lm_jv v = {LM_JV_UNDEF, {0}};
  return v;
}
static inline lm_jv lm_jv_none(void) {
  lm_jv v = {LM_JV_NONE, {0}};
  return v;
}
static inline lm_jv lm_jv_bool(int b) {
  lm_jv v = {LM_JV_BOOL, {.b = b != 0}};
  return v;
}
static inline lm_jv lm_jv_int(int64_t i) {
  lm_jv v = {LM_JV_INT, {.i = i}};
  return v;
}
static inline lm_jv lm_jv_float(double f) {
  lm_jv v = {LM_JV_FLOAT, {.f = f}};
  return v;
}

lm_status lm_jv_str(lm_jarena *a, const char *s, size_t n, lm_jv *out);
lm_status lm_jv_cstr(lm_jarena *a, const char *s, lm_jv *out);
lm_status lm_jv_list(lm_jarena *a, size_t cap, lm_jv *out);
lm_status lm_jv_dict(lm_jarena *a, size_t cap, lm_jv *out);
lm_status lm_jv_list_push(lm_jarena *a, lm_jv list, lm_jv item);
/* Sets key to val: replaces in place if present (keeps its position), else appends. */
lm_status lm_jv_dict_set(lm_jarena *a, lm_jv dict, lm_jv key, lm_jv val);
/* Looks a key up; returns 1 and *out when found. */
int lm_jv_dict_get(lm_jv dict, lm_jv key, lm_jv *out);
int lm_jv_dict_gets(lm_jv dict, const char *key, lm_jv *out);

static inline int lm_jv_is_str(lm_jv v) { return v.kind == LM_JV_STR; }
static inline int lm_jv_is_num(lm_jv v) {
  return v.kind == LM_JV_INT || v.kind == LM_JV_FLOAT || v.kind == LM_JV_BOOL ||
         v.kind == LM_JV_BIGINT;
}
static inline int lm_jv_is_mapping(lm_jv v) { return v.kind == LM_JV_DICT; }

/* Python truthiness (Undefined is falsy). */
int lm_jv_truthy(lm_jv v);
/* Python ==. */
int lm_jv_equal(lm_jv a, lm_jv b);
/* Python ordering (<): LM_ERR_INVALID for types Python cannot order ("'<' not supported ..."). */
lm_status lm_jv_compare(lm_jv a, lm_jv b, int *cmp);
/* Python type name ("str", "dict", "NoneType") for error messages. */
const char *lm_jv_type_name(lm_jv v);

/* Appends str(v) / repr(v). */
lm_status lm_jv_put_str(lm_jbuf *b, lm_jv v);
lm_status lm_jv_put_repr(lm_jbuf *b, lm_jv v);
/* str(v) as a value (strings are returned as is). */
lm_status lm_jv_to_str(lm_jarena *a, lm_jv v, lm_jv *out);

/* json.dumps(v, ensure_ascii, indent, separators, sort_keys) as transformers' tojson filter calls
 * it. indent < 0 means None. item_sep/key_sep NULL mean the json.dumps defaults. */
typedef struct lm_jv_json_opts {
  int indent;
  int sort_keys;
  int ensure_ascii;
  const char *item_sep, *key_sep;
} lm_jv_json_opts;
lm_status lm_jv_put_json(lm_jbuf *b, lm_jv v, const lm_jv_json_opts *opts);

/* Converts jansson JSON (any type; NULL becomes None) into arena values, keeping int vs float. */
lm_status lm_jv_from_json(lm_jarena *a, const json_t *j, lm_jv *out);

/* Parses JSON text into arena values, exactly: integers of any size (BIGINT beyond int64), int vs
 * float as written, object keys in document order (a repeated key keeps its first position, last
 * value, as Python's json.loads). Errors name the byte offset. Nesting deeper than 512 is rejected.
 */
lm_status lm_jv_parse_json(lm_jarena *a, const char *text, size_t len, lm_jv *out);

#endif
