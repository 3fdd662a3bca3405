/* prompt_cache.h — a byte-capped LRU of cached prompt prefixes: snapshots of a session's cache
 * set after exactly n tokens, keyed by (namespace, token ids).
 *
 * A request looks up its ids: the longest cached prefix it can use is copied into the request's
 * cache set (the entry stays intact) and only the rest is prefilled. Which lengths are usable:
 *   - an entry of n tokens whose ids are a prefix of the request: its full n tokens, always —
 *     the snapshot was taken at the prefix end, so a sliding layer's ring is exactly right even
 *     when the prefix is longer than the window (the ring has wrapped);
 *   - a shorter common prefix m < n of an entry: only where every cache can be cut back to m
 *     (plain caches always; rings only while they have not wrapped, kv_snapshot.h). Otherwise the
 *     entry is declined for that length: never attend to keys a ring has evicted.
 * Entries whose cache plan (or backend, or element dtype) differs from the request's set are
 * never used. Namespaces keep apart what must not be shared (adapters later: "" is the base).
 *
 * Memory: bytes held = backend memory of the snapshots (exact-fit, kv_snapshot.h) plus their ids.
 * An insert evicts least-recently-used entries until it fits under max_bytes; a snapshot larger
 * than max_bytes is not stored. An insert also drops entries it supersedes (same namespace, ids a
 * prefix of the new ones, and the new snapshot can be cut back to them).
 * Cost: a lookup compares ids against every entry, O(entries × prefix); fine for the tens of
 * entries a byte cap allows.
 * Thread-safety: none; one owner (the engine's scheduler thread) calls it. */
#ifndef LM_ENGINE_PROMPT_CACHE_H
#define LM_ENGINE_PROMPT_CACHE_H

#include <stdint.h>

#include "kv/kv.h"

typedef struct lm_prompt_cache lm_prompt_cache;

typedef struct lm_prompt_cache_stats {
  int64_t lookups, hits, misses;
  int64_t tokens_reused; /* tokens restored by hits, summed */
  int64_t declined;   /* lookups that got less (or nothing) because a ring had wrapped past a longer
                         match */
  int64_t inserts;    /* snapshots stored */
  int64_t evictions;  /* entries dropped to fit the byte cap */
  int64_t superseded; /* entries dropped because a longer snapshot covers them */
  int64_t rejected;   /* inserts larger than the whole cap */
  int64_t entries, bytes_held, max_bytes;
} lm_prompt_cache_stats;

/* max_bytes > 0; max_entries >= 0 (0: no cap but the bytes). Errors: LM_ERR_INVALID, LM_ERR_NOMEM.
 */
lm_status lm_prompt_cache_create(int64_t max_bytes, int max_entries, lm_prompt_cache **out);
void lm_prompt_cache_free(lm_prompt_cache *pc); /* NULL is a no-op; frees every snapshot */

/* Finds the longest usable cached prefix of ids[0..n), at most max_reuse tokens (max_reuse < 0:
 * n; pass n - 1 to keep one token to feed for fresh logits), and copies that state into dst, a
 * set of the same plan on the same backend. *reused gets its length (0: a miss; dst untouched).
 * ns NULL is "". Errors: LM_ERR_INVALID (bad arguments), the copy's errors (then dst is empty). */
lm_status lm_prompt_cache_lookup(lm_prompt_cache *pc, const char *ns, const int32_t *ids, int64_t n,
                                 int64_t max_reuse, lm_kv_set *dst, int64_t *reused);

/* Stores a snapshot of kv, which must hold exactly the n >= 1 tokens ids[0..n) (the caller
 * inserts right after feeding them). An entry with the same namespace and ids is only marked
 * used. Errors: LM_ERR_INVALID (kv does not hold n tokens), snapshot allocation errors (nothing
 * is stored). A snapshot over the cap is not stored (stats.rejected), which is not an error. */
lm_status lm_prompt_cache_insert(lm_prompt_cache *pc, const char *ns, const int32_t *ids, int64_t n,
                                 const lm_kv_set *kv);

/* Like insert, but takes ownership of kv instead of copying it (a finished sequence's caches, or
 * a loaded state): no copy, and the entry's bytes are what kv has allocated. kv is freed when it
 * is not kept (an equal entry exists, it is over the cap, or on error). */
lm_status lm_prompt_cache_adopt(lm_prompt_cache *pc, const char *ns, const int32_t *ids, int64_t n,
                                lm_kv_set *kv);

/* The longest entry whose ids are a prefix of ids[0..n) (whole entries only): its caches (owned
 * by the cache, valid until the next call that changes it), its length in *len; NULL when none. */
const lm_kv_set *lm_prompt_cache_find(const lm_prompt_cache *pc, const char *ns, const int32_t *ids,
                                      int64_t n, int64_t *len);

/* Evicts the least recently used entry when more than `bytes` are held. Returns 1 when it evicted
 * one (call again to go further), 0 when the cache already fits or is empty. */
int lm_prompt_cache_shrink(lm_prompt_cache *pc, int64_t bytes);

/* Drops every entry (stats are kept). */
void lm_prompt_cache_clear(lm_prompt_cache *pc);
lm_prompt_cache_stats lm_prompt_cache_get_stats(const lm_prompt_cache *pc);

#endif
