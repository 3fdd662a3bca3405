/* grammar_utf8.h — Unicode for a byte-level grammar: code-point sets become alternatives of
 * UTF-8 byte-range sequences (so "[^\"]" matches every valid encoding of every other character,
 * and a byte-fallback token carrying half a character is judged byte by byte). The codec is
 * text/utf8.h's. Surrogates (U+D800..U+DFFF) are never matched: they are not valid
 * UTF-8. */
#ifndef LM_GRAMMAR_UTF8_H
#define LM_GRAMMAR_UTF8_H

#include <stddef.h>
#include <stdint.h>

#include "grammar/grammar_ir.h"

#define LM_CP_MAX 0x10FFFFu

typedef struct lm_cprange {
  uint32_t lo, hi; /* inclusive */
} lm_cprange;

/* A growable set of ranges. */
typedef struct lm_cpset {
  lm_cprange *r;
  size_t n, cap;
} lm_cpset;

lm_status lm_cpset_add(lm_cpset *s, uint32_t lo, uint32_t hi);
/* Sorts and merges, clips to LM_CP_MAX and removes the surrogates. */
lm_status lm_cpset_normalize(lm_cpset *s);
/* s = every code point not in s (normalized). */
lm_status lm_cpset_negate(lm_cpset *s);
void lm_cpset_free(lm_cpset *s);

/* Appends to s one element that matches one code point of the normalized set: a TERM when the
 * set is ASCII only, else a reference to a new rule named `name` with one alternative per byte
 * sequence shape. An empty set is LM_ERR_INVALID. */
lm_status lm_gutf8_class(lm_gir *b, lm_gseq *s, const lm_cpset *set, const char *name);
/* Adds those alternatives (one code point of the normalized set each) to an existing rule. */
lm_status lm_gutf8_class_alts(lm_gir *b, int32_t rule, const lm_cpset *set);

#endif
