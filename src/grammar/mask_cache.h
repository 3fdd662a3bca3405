/* mask_cache.h — the masks of one (grammar, vocabulary), shared by every matcher of that pair:
 * a byte-capped LRU behind one mutex, keyed by a parse state's key (pda.h).
 *
 * Two kinds of entry:
 *   LOCAL  for a truncated state (the top frames of each stack): the tokens accepted whatever lies
 *          below (a bitset) and the few tokens that depend on it (a list, checked per call);
 *   FULL   for a whole state: the final mask, stored when checking a LOCAL entry's list had work.
 * Entries are reference-counted: a matcher copies or checks one outside the lock, and an entry
 * evicted meanwhile is freed by its last user. */
#ifndef LM_GRAMMAR_MASK_CACHE_H
#define LM_GRAMMAR_MASK_CACHE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

enum { LM_GC_LOCAL = 1, LM_GC_FULL = 2 };

typedef struct lm_gcache_entry {
  struct lm_gcache_entry *hnext, *lprev, *lnext;
  uint64_t hash;
  uint32_t *key;
  uint32_t key_len, kind;
  uint32_t *bits;
  int32_t *unc; /* LOCAL: the tokens that depend on the frames below the key, in trie order */
  uint32_t n_unc;
  size_t bytes;
  int refs, linked;
} lm_gcache_entry;

typedef struct lm_gcache_stats {
  uint64_t hits, misses, inserts, evictions;
  size_t bytes;
  uint32_t entries;
} lm_gcache_stats;

typedef struct lm_gcache lm_gcache;

lm_status lm_gcache_create(uint64_t vocab_hash, int32_t n_tokens, size_t limit, lm_gcache **out);
void lm_gcache_free(lm_gcache *c);
uint64_t lm_gcache_vocab(const lm_gcache *c);
void lm_gcache_set_limit(lm_gcache *c, size_t limit);
lm_gcache_stats lm_gcache_get_stats(lm_gcache *c);

uint64_t lm_gcache_hash(uint32_t kind, const uint32_t *key, uint32_t len);
/* The entry for (kind, key) with a reference taken, or NULL. */
lm_gcache_entry *lm_gcache_get(lm_gcache *c, uint32_t kind, const uint32_t *key, uint32_t len,
                               uint64_t hash);
/* Stores an entry; takes bits and unc (malloc'd) either way. Returns it with a reference taken
 * (the existing one when another matcher stored the key first), or NULL when out of memory. An
 * entry larger than the whole budget is returned unstored (freed at release). */
lm_gcache_entry *lm_gcache_put(lm_gcache *c, uint32_t kind, const uint32_t *key, uint32_t len,
                               uint64_t hash, uint32_t *bits, int32_t *unc, uint32_t n_unc);
void lm_gcache_release(lm_gcache *c, lm_gcache_entry *e);

#endif
