/* grammar_impl.h — the compiled, immutable grammar the matcher runs (what lm_gir_finish makes).
 *
 * Elements are one flat array; each alternative is a run of elements ended by an END element, so
 * a parse position is one index (pos) and "the rest of this alternative" is pos, pos+1, ... .
 * Precomputed per position: the bytes the rest of the alternative can start with (suf_first) and
 * whether it can match the empty string (suf_null); per rule the same for the whole rule. The
 * matcher uses them to expand only the alternatives a byte can enter.
 *
 * The only mutable part is the mask caches (one per vocabulary), behind `lock`. */
#ifndef LM_GRAMMAR_IMPL_H
#define LM_GRAMMAR_IMPL_H

#include <pthread.h>

#include "grammar/grammar_ir.h"

typedef struct lm_gcache lm_gcache;

struct lm_grammar {
  lm_gelem *elems;
  uint32_t n_elems;
  uint32_t n_rules, root;
  uint32_t *rule_alt_off; /* n_rules + 1 offsets into alt_start */
  uint32_t *alt_start;    /* the first element of each alternative */
  char **names;           /* per rule, for messages */
  lm_gset *sets;          /* TERM byte sets */
  uint32_t n_sets;
  lm_gset *rule_first; /* per rule */
  uint8_t *rule_null;
  lm_gset *suf_first; /* per element position */
  uint8_t *suf_null;

  pthread_mutex_t lock;
  lm_gcache **caches;
  uint32_t n_caches;
  size_t cache_limit; /* bytes per vocabulary's cache */
};

/* Default byte budget of each (grammar, vocabulary) mask cache. */
#define LM_GRAMMAR_CACHE_BYTES ((size_t)64 << 20)

#endif
