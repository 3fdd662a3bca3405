/* gstack.h — the recognizer's persistent stacks: frames are interned (hash-consed), so a stack is
 * one frame id and two stacks are equal exactly when their ids are. Many parses share their
 * lower frames; deduplicating a set of parses is sorting ids.
 *
 * A frame says "continue at element `pos` of the grammar, then return to `parent`". At a REPEAT
 * element, rmin / rmax are the repetitions still required / still allowed (rmax LM_G_INF:
 * unbounded); elsewhere both are 0.
 *
 * Frames are appended in creation order and never change. Rolling back to a mark removes the
 * newer ones from the table too; with linear probing, removing the newest entries in reverse
 * order restores the table exactly (no later insertion probed past them), which is what lets the
 * token-mask walk explore a trie depth-first and undo each branch in O(frames it made). */
#ifndef LM_GRAMMAR_GSTACK_H
#define LM_GRAMMAR_GSTACK_H

#include <stdint.h>

#include "base/status.h"

#define LM_GF_NULL 0u /* below the root: returning here completes the sentence */
#define LM_GF_CTX 1u  /* below a truncated stack: returning here needs the real context */
#define LM_GF_FAIL UINT32_MAX
/* Frames one matcher may hold at once (about 64 MiB of them): a bound for hostile grammars. */
#define LM_GF_MAX_FRAMES (1u << 22)

typedef struct lm_gframe {
  uint32_t pos, rmin, rmax, parent;
} lm_gframe;

typedef struct lm_gframes {
  lm_gframe *f;
  uint32_t *stamp; /* visit marks of one step (lm_gframes_epoch) */
  uint32_t n, cap;
  uint32_t *slot; /* frame id, 0 = empty (ids 0 and 1 are the sentinels, never in the table) */
  uint32_t slot_mask;
  uint32_t epoch;
} lm_gframes;

lm_status lm_gframes_init(lm_gframes *fs);
void lm_gframes_free(lm_gframes *fs);
/* The id of frame (pos, rmin, rmax, parent), made if new. LM_GF_FAIL when out of memory or past
 * LM_GF_MAX_FRAMES (the message is set). */
uint32_t lm_gframes_intern(lm_gframes *fs, uint32_t pos, uint32_t rmin, uint32_t rmax,
                           uint32_t parent);
/* Removes every frame with id >= mark. */
void lm_gframes_rollback(lm_gframes *fs, uint32_t mark);
/* Starts a new visit epoch: lm_gframes_visit is then true once per frame. */
void lm_gframes_epoch(lm_gframes *fs);
static inline int lm_gframes_visit(lm_gframes *fs, uint32_t id) {
  if (fs->stamp[id] == fs->epoch) return 0;
  fs->stamp[id] = fs->epoch;
  return 1;
}

#endif
