/* grammar_ir.h — the grammar IR every front end (GBNF, JSON Schema, the pattern regex) builds:
 * rules, each a list of alternatives, each a sequence of elements over BYTES:
 *   TERM    one byte out of a 256-bit set (a literal is a run of single-byte TERMs; a Unicode char
 *           class is a rule of UTF-8 byte-sequence alternatives, grammar_utf8.c)
 *   REF     a rule
 *   REPEAT  a rule between min and max times (max LM_G_INF: unbounded). Counted natively (the
 *           matcher keeps the counts in its stack frame), so {0,10000} costs one element, not
 *           ten thousand rules.
 * lm_gir_finish normalizes (drops alternatives that can derive nothing, inlines rules used once,
 * refuses left recursion) and compiles the immutable lm_grammar the matcher runs. */
#ifndef LM_GRAMMAR_IR_H
#define LM_GRAMMAR_IR_H

#include <stddef.h>
#include <stdint.h>

#include "grammar/grammar.h"

#define LM_G_INF UINT32_MAX
/* Hostile inputs are refused before they can cost much: the whole IR and the rule count. */
#define LM_G_MAX_ELEMS 100000u
#define LM_G_MAX_RULES 100000u
/* A repetition of something that can match the empty string is only counted to this bound
 * (each count would be a parse of its own at every byte). */
#define LM_G_MAX_NULLABLE_REPEAT 64u

enum { LM_GK_END = 0, LM_GK_TERM = 1, LM_GK_REF = 2, LM_GK_REPEAT = 3 };

typedef struct lm_gelem {
  uint32_t kind;     /* LM_GK_* */
  uint32_t arg;      /* TERM: byte-set id; REF / REPEAT: rule id */
  uint32_t min, max; /* REPEAT only */
} lm_gelem;

typedef struct lm_gset {
  uint64_t w[4];
} lm_gset;

static inline int lm_gset_has(const lm_gset *s, unsigned b) {
  return (int)((s->w[b >> 6] >> (b & 63)) & 1u);
}
static inline void lm_gset_add(lm_gset *s, unsigned b) { s->w[b >> 6] |= 1ull << (b & 63); }
static inline void lm_gset_add_range(lm_gset *s, unsigned lo, unsigned hi) {
  for (unsigned b = lo; b <= hi; b++)
    lm_gset_add(s, b);
}
static inline void lm_gset_or(lm_gset *d, const lm_gset *s) {
  for (int i = 0; i < 4; i++)
    d->w[i] |= s->w[i];
}
static inline int lm_gset_empty(const lm_gset *s) {
  return !(s->w[0] | s->w[1] | s->w[2] | s->w[3]);
}

/* A sequence under construction (one alternative). Zero-initialize; lm_gir_add_alt takes its
 * elements; lm_gseq_free releases one that was not added. */
typedef struct lm_gseq {
  lm_gelem *e;
  uint32_t n, cap;
} lm_gseq;

typedef struct lm_gir lm_gir;

lm_status lm_gir_create(lm_gir **out);
void lm_gir_free(lm_gir *b);

/* A new rule with no alternatives yet; `name` (copied) appears in messages. *id is its id.
 * Errors: LM_ERR_INVALID (more than LM_G_MAX_RULES rules), LM_ERR_NOMEM. */
lm_status lm_gir_rule(lm_gir *b, const char *name, int32_t *id);
const char *lm_gir_rule_name(const lm_gir *b, int32_t id);
uint32_t lm_gir_rule_alts(const lm_gir *b, int32_t id);

/* Appends to a sequence. Errors: LM_ERR_INVALID (the IR would pass LM_G_MAX_ELEMS), NOMEM. */
lm_status lm_gseq_set(lm_gir *b, lm_gseq *s, const lm_gset *set);
lm_status lm_gseq_byte(lm_gir *b, lm_gseq *s, uint8_t c);
lm_status lm_gseq_lit(lm_gir *b, lm_gseq *s, const char *bytes, size_t n);
lm_status lm_gseq_ref(lm_gir *b, lm_gseq *s, int32_t rule);
/* max >= min; LM_G_INF for no upper bound. max == 0 appends nothing. */
lm_status lm_gseq_repeat(lm_gir *b, lm_gseq *s, int32_t rule, uint32_t min, uint32_t max);
/* Appends all of src's elements to s (src unchanged). */
lm_status lm_gseq_cat(lm_gir *b, lm_gseq *s, const lm_gseq *src);
void lm_gseq_free(lm_gseq *s);

/* Adds s as an alternative of `rule` and empties s (an empty s adds the empty alternative). */
lm_status lm_gir_add_alt(lm_gir *b, int32_t rule, lm_gseq *s);
/* A new rule whose one alternative is s (emptied): the body of a repetition of a sequence. */
lm_status lm_gir_wrap(lm_gir *b, const char *name, lm_gseq *s, int32_t *id);
/* A new rule with one alternative: the single byte-set `set`. */
lm_status lm_gir_set_rule(lm_gir *b, const char *name, const lm_gset *set, int32_t *id);

/* Normalizes and compiles with `root` as the start rule; b is left as it was (free it after).
 * Errors: LM_ERR_INVALID (the grammar accepts no string; a left-recursive rule, named;
 * LM_ERR_UNSUPPORTED for a repetition bound LM_G_MAX_NULLABLE_REPEAT refuses), LM_ERR_NOMEM. */
lm_status lm_gir_finish(lm_gir *b, int32_t root, lm_grammar **out);

/* Internal access for the compiler (grammar_compile.c). */
typedef struct lm_gir_view {
  uint32_t n_rules;
  const char *const *names;
  const uint32_t *rule_alt_off; /* n_rules + 1 offsets into alts */
  const lm_gseq *alts;          /* every alternative, grouped by rule */
  const lm_gset *sets;
  uint32_t n_sets;
} lm_gir_view;
/* Builds the view (its arrays live in b until the next change). Errors: LM_ERR_NOMEM. */
lm_status lm_gir_view_make(lm_gir *b, lm_gir_view *v);

#endif
