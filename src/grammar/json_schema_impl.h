/* json_schema_impl.h — what the JSON Schema converter's files share: the conversion context and
 * the builders of each kind of value.
 *
 * Every schema node becomes one rule, memoized by node (so $ref recursion and shared $defs cost
 * one rule each); allOf merges are memoized by the nodes merged (so merging a schema with itself
 * at every level stays linear). Depth, work and IR size are bounded: a hostile schema is refused
 * with a message, never a crash or an exponential blowup. Messages read
 *   json schema: #/properties/a: 'patternProperties' is not supported */
#ifndef LM_GRAMMAR_JSON_SCHEMA_IMPL_H
#define LM_GRAMMAR_JSON_SCHEMA_IMPL_H

#include <jansson.h>

#include "grammar/grammar_ir.h"
#include "grammar/regex.h"

#define LM_JS_MAX_DEPTH 64
#define LM_JS_MAX_WORK 20000u
#define LM_JS_PTR_MAX 512
/* A whitespace run (after a newline) is at most this long: a model cannot loop in whitespace. */
#define LM_JS_WS_MAX 32

typedef struct js_memo {
  const void *key;
  int32_t rule;
} js_memo;

typedef struct js_merge {
  uint64_t hash;
  const json_t **parts;
  uint32_t n;
  int32_t rule;
} js_merge;

typedef struct js_strrule {
  uint32_t min, max;
  int32_t rule;
} js_strrule;

typedef struct lm_js {
  lm_gir *b;
  json_t *doc;
  /* shared rules, -1 until first used */
  int32_t r_ws, r_char, r_string, r_value, r_number, r_integer, r_object, r_array, r_digit;
  int32_t r_frac, r_frac_nz, r_frac_zero, r_fmt[8];
  js_memo *memo;
  uint32_t memo_mask, n_memo;
  js_merge *merges;
  uint32_t n_merges, cap_merges;
  js_strrule *strs;
  uint32_t n_strs, cap_strs;
  json_t **owned; /* merged schemas made here */
  uint32_t n_owned, cap_owned;
  int depth;
  uint32_t work, anon;
} lm_js;

/* "json schema: PTR: message" with the given code. */
lm_status lm_js_err(lm_status code, const char *ptr, const char *fmt, ...) LM_PRINTF(3, 4);
/* ptr + "/" + key with JSON-pointer escaping (~0, ~1), truncated to LM_JS_PTR_MAX. */
void lm_js_ptr(char *out, const char *ptr, const char *seg, const char *key);

/* The rule of a schema node (memoized). */
lm_status lm_js_rule(lm_js *c, const json_t *node, const char *ptr, int32_t *rule);
/* The node a local $ref ("#", "#/a/b") points at. */
lm_status lm_js_resolve(lm_js *c, const char *ref, const char *ptr, const json_t **out);
/* Whether a keyword only annotates (ignored by the converter). */
int lm_js_annotation(const char *key);

/* json_schema_merge.c: one schema equivalent to all of parts (allOf), owned by c. */
lm_status lm_js_merge(lm_js *c, const json_t *const *parts, size_t n, const char *ptr,
                      json_t **out);

/* json_schema_prim.c */
lm_status lm_js_ws(lm_js *c, int32_t *rule);
lm_status lm_js_value(lm_js *c, int32_t *rule); /* any JSON value */
lm_status lm_js_string(lm_js *c, const json_t *node, const char *ptr, int32_t *rule);
lm_status lm_js_plain_string(lm_js *c, uint32_t min, uint32_t max, int32_t *rule);
/* Appends the compact serialization of v (enum / const values). */
lm_status lm_js_literal(lm_js *c, lm_gseq *s, const json_t *v, const char *ptr);
/* Appends a JSON string literal of the UTF-8 text (a property name). */
lm_status lm_js_string_lit(lm_js *c, lm_gseq *s, const char *text, size_t len);
/* Appends a reference to the shared whitespace rule. */
lm_status lm_js_seq_ws(lm_js *c, lm_gseq *s);
/* The rule ITEM ("," ws ITEM)* of a comma-separated list, where ITEM is the sequence in item
 * (emptied, for the caller to reuse or free). Its rules are named NAME-WORD (the item),
 * NAME-more and NAME-WORDs (the list). */
lm_status lm_js_comma_list(lm_js *c, lm_gseq *item, const char *name, const char *word,
                           int32_t *list);

/* json_schema_num.c */
lm_status lm_js_integer(lm_js *c, const json_t *node, const char *ptr, int32_t *rule);
lm_status lm_js_number(lm_js *c, const json_t *node, const char *ptr, int32_t *rule);

#endif
