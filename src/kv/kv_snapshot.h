/* kv_snapshot.h — explicit copies of caches: deep clones, and the state of a cache as it was
 * after its first m tokens (what the prompt cache stores and restores).
 *
 * Every byte moves through the backend's alloc/copy ops; nothing here reads cache memory on the
 * host, so it works the same on device memory.
 *
 * When is "the state after m tokens" recoverable from a cache that holds n >= m tokens?
 *   - plain kinds: always (slot = position; rows past m are simply not held any more);
 *   - rings: if the ring has not wrapped, if m == n, or if m >= lm_kv_min_len (the spare slots
 *     past the window still hold what m's next token attends to: lm_kv_trim's rule). Below
 *     that, the slots hold newer positions and the keys are gone. A copy keeps the source's
 *     high-water mark, so it obeys the same rule.
 * A ring snapshot taken AT the prefix end (m == n) is always exact, wrapped or not: this is
 * what the prompt cache stores, so a prefix longer than the sliding window is still reusable.
 *
 * A cache's plan is the spec it was created from (lm_kv_create): for a delayed quantization
 * (quant_start > 0) that is the quantized spec even while the cache is still plain. Its layout
 * is what it stores now (kind/bits/group of lm_kv_signature). Copies keep both.
 *
 * Thread-safety: these calls read `src` only, and write only what they create or `dst`. */
#ifndef LM_KV_KV_SNAPSHOT_H
#define LM_KV_KV_SNAPSHOT_H

#include "kv/kv.h"

/* The spec the cache was created from (geometry + kind + quantization + quant_start). */
lm_kv_spec lm_kv_plan_spec(const lm_kv_cache *c);
/* The spec of its layout now (quant_start 0): a fresh cache of it stores rows the same way. */
lm_kv_spec lm_kv_layout_spec(const lm_kv_cache *c);
/* 1 if two specs describe the same cache (fields a kind does not use are ignored). */
int lm_kv_spec_equal(const lm_kv_spec *a, const lm_kv_spec *b);

/* Bytes of backend memory the cache has allocated (slots × bytes per token). */
int64_t lm_kv_alloc_bytes(const lm_kv_cache *c);
int64_t lm_kv_set_alloc_bytes(const lm_kv_set *s);

/* 1 if the state after the first m tokens can be recovered from c (see above), else 0. */
int lm_kv_can_truncate(const lm_kv_cache *c, int64_t m);
int lm_kv_set_can_truncate(const lm_kv_set *s, int64_t m);

/* A new cache (same backend) holding exactly src's state after its first m tokens, with no
 * slack slots (plain kinds allocate m rows; rings their window). Errors: LM_ERR_STATE when that
 * state is not recoverable, LM_ERR_INVALID for m out of [0, n], allocation errors. */
lm_status lm_kv_clone_prefix(const lm_kv_cache *src, int64_t m, lm_kv_cache **out);
/* The whole cache: lm_kv_clone_prefix(src, src->n, out). */
lm_status lm_kv_clone(const lm_kv_cache *src, lm_kv_cache **out);
lm_status lm_kv_set_clone_prefix(const lm_kv_set *src, int64_t m, lm_kv_set **out);
lm_status lm_kv_set_clone(const lm_kv_set *src, lm_kv_set **out);

/* Makes dst hold src's state after its first m tokens. dst keeps its identity (the pointer,
 * and its arrays when its layout already matches: they are reused, growing as a reserve
 * would). Requires the same backend, the same plan and the same element dtype; errors:
 * LM_ERR_INVALID (incompatible caches, m out of range), LM_ERR_STATE (not recoverable),
 * allocation errors (dst unchanged), a failed backend copy (dst left empty, n = 0). */
lm_status lm_kv_copy_prefix(lm_kv_cache *dst, const lm_kv_cache *src, int64_t m);
/* The same for every cache of a set. Every check runs before anything changes; a failure
 * midway (allocation, backend copy) leaves every cache of dst empty, never a mix of states. */
lm_status lm_kv_set_copy_prefix(lm_kv_set *dst, const lm_kv_set *src, int64_t m);

/* Creates an empty cache of layout `layout` (quant_start ignored) that remembers `plan` as its
 * plan and, if has_pending, still converts to it at plan->quant_start (restoring a saved cache).
 * Errors: those of lm_kv_create; LM_ERR_INVALID when plan and layout disagree on geometry, or
 * has_pending does not fit the plan (a delayed quantized plan and a plain layout). */
lm_status lm_kv_create_restored(lm_backend *be, const lm_kv_spec *plan, const lm_kv_spec *layout,
                                int has_pending, lm_kv_cache **out);

#endif
