/* grammar_cache.h — the engine's compiled grammars, by source text: a bounded LRU, so that the
 * requests of one schema (64 streams of the same response_format, a tool set sent with every
 * turn) compile it once.
 *
 * A lookup that misses compiles on the caller's thread (the request's, never the engine's); a
 * second caller of the same text waits for that compile instead of starting its own. Entries are
 * reference-counted on their own: a request holds its grammar past an eviction, and past the
 * engine itself (a request may outlive its engine, lumen.h). Compile errors that come from the
 * text (LM_ERR_INVALID, LM_ERR_UNSUPPORTED) are cached as well, so a bad schema sent 64 times is
 * refused 64 times from one compile; out-of-memory is not.
 *
 * Thread safety: every function may be called from any thread. */
#ifndef LM_ENGINE_GRAMMAR_CACHE_H
#define LM_ENGINE_GRAMMAR_CACHE_H

#include <stddef.h>

#include "grammar/grammar.h"

typedef enum lm_grammar_kind {
  LM_GRAMMAR_GBNF = 0,
  LM_GRAMMAR_JSON_SCHEMA,
  LM_GRAMMAR_JSON_OBJECT /* the text is ignored */
} lm_grammar_kind;

typedef struct lm_grammar_cache lm_grammar_cache;
typedef struct lm_grammar_ref lm_grammar_ref; /* one holder's reference to a compiled grammar */

/* cap: entries kept (>= 1). Errors: LM_ERR_NOMEM. */
lm_status lm_grammar_cache_create(int cap, lm_grammar_cache **out);
/* Drops the cache's references; grammars still held live on until released. NULL is a no-op. */
void lm_grammar_cache_free(lm_grammar_cache *c);

/* The grammar of (kind, text[0..len)), compiled now or found; *out is the caller's reference.
 * Errors: the compiler's (LM_ERR_INVALID, LM_ERR_UNSUPPORTED with its message), LM_ERR_NOMEM. */
lm_status lm_grammar_cache_get(lm_grammar_cache *c, lm_grammar_kind kind, const char *text,
                               size_t len, lm_grammar_ref **out);
const lm_grammar *lm_grammar_ref_get(const lm_grammar_ref *r);
/* Releases one reference (the grammar is freed with the last). NULL is a no-op. */
void lm_grammar_ref_release(lm_grammar_ref *r);

typedef struct lm_grammar_cache_stats {
  int entries;
  long long hits, misses, compiles, evictions;
} lm_grammar_cache_stats;
void lm_grammar_cache_get_stats(lm_grammar_cache *c, lm_grammar_cache_stats *st);

#endif
