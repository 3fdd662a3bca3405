/* gstack.c — interned frames with LIFO rollback (see gstack.h for why the rollback is exact). */
#include "grammar/gstack.h"

#include <stdlib.h>
#include <string.h>

#include "base/rng.h"

static uint32_t frame_hash(uint32_t pos, uint32_t rmin, uint32_t rmax, uint32_t parent) {
  uint64_t a = ((uint64_t)pos << 32) | parent, b = ((uint64_t)rmin << 32) | rmax;
  return (uint32_t)lm_mix64(a ^ lm_mix64(b + 0x9e3779b97f4a7c15ull));
}

lm_status lm_gframes_init(lm_gframes *fs) {
  memset(fs, 0, sizeof *fs);
  fs->cap = 256;
  fs->f = malloc(fs->cap * sizeof *fs->f);
  fs->stamp = calloc(fs->cap, sizeof *fs->stamp);
  fs->slot_mask = 511;
  fs->slot = calloc(fs->slot_mask + 1, sizeof *fs->slot);
  if (!fs->f || !fs->stamp || !fs->slot) {
    lm_gframes_free(fs);
    return LM_ERRF(LM_ERR_NOMEM, "grammar: out of memory");
  }
  /* The sentinels: ids 0 and 1 are no real frame. */
  memset(fs->f, 0, 2 * sizeof *fs->f);
  fs->n = 2;
  fs->epoch = 1;
  return LM_OK;
}

void lm_gframes_free(lm_gframes *fs) {
  free(fs->f);
  free(fs->stamp);
  free(fs->slot);
  memset(fs, 0, sizeof *fs);
}

/* Reinserts in creation order, so the layout is the one LIFO rollback expects. */
static int rehash(lm_gframes *fs) {
  uint32_t n = (fs->slot_mask + 1) * 2;
  uint32_t *slot = calloc(n, sizeof *slot);
  if (!slot) return 0;
  for (uint32_t i = 2; i < fs->n; i++) {
    const lm_gframe *f = &fs->f[i];
    uint32_t h = frame_hash(f->pos, f->rmin, f->rmax, f->parent) & (n - 1);
    while (slot[h])
      h = (h + 1) & (n - 1);
    slot[h] = i;
  }
  free(fs->slot);
  fs->slot = slot;
  fs->slot_mask = n - 1;
  return 1;
}

static int grow(lm_gframes *fs) {
  uint32_t cap = fs->cap * 2;
  lm_gframe *f = realloc(fs->f, cap * sizeof *f);
  if (!f) return 0;
  fs->f = f;
  uint32_t *st = realloc(fs->stamp, cap * sizeof *st);
  if (!st) return 0;
  memset(st + fs->cap, 0, (cap - fs->cap) * sizeof *st);
  fs->stamp = st;
  fs->cap = cap;
  return 1;
}

uint32_t lm_gframes_intern(lm_gframes *fs, uint32_t pos, uint32_t rmin, uint32_t rmax,
                           uint32_t parent) {
  uint32_t h = frame_hash(pos, rmin, rmax, parent) & fs->slot_mask;
  for (uint32_t id; (id = fs->slot[h]) != 0; h = (h + 1) & fs->slot_mask) {
    const lm_gframe *f = &fs->f[id];
    if (f->pos == pos && f->parent == parent && f->rmin == rmin && f->rmax == rmax) return id;
  }
  if (fs->n >= LM_GF_MAX_FRAMES) {
    LM_ERRF(LM_ERR_NOMEM, "grammar: the parse needs more than %u stack frames", LM_GF_MAX_FRAMES);
    return LM_GF_FAIL;
  }
  if (fs->n == fs->cap && !grow(fs)) {
    LM_ERRF(LM_ERR_NOMEM, "grammar: out of memory");
    return LM_GF_FAIL;
  }
  uint32_t id = fs->n++;
  fs->f[id] = (lm_gframe){pos, rmin, rmax, parent};
  fs->stamp[id] = 0;
  fs->slot[h] = id;
  if ((fs->n - 2) * 2 > fs->slot_mask && !rehash(fs)) {
    fs->slot[h] = 0;
    fs->n--;
    LM_ERRF(LM_ERR_NOMEM, "grammar: out of memory");
    return LM_GF_FAIL;
  }
  return id;
}

void lm_gframes_rollback(lm_gframes *fs, uint32_t mark) {
  while (fs->n > mark && fs->n > 2) {
    uint32_t id = --fs->n;
    const lm_gframe *f = &fs->f[id];
    uint32_t h = frame_hash(f->pos, f->rmin, f->rmax, f->parent) & fs->slot_mask;
    while (fs->slot[h] != id)
      h = (h + 1) & fs->slot_mask;
    fs->slot[h] = 0;
  }
}

void lm_gframes_epoch(lm_gframes *fs) {
  if (++fs->epoch == 0) { /* wrapped: clear the marks so no stale one matches */
    memset(fs->stamp, 0, fs->cap * sizeof *fs->stamp);
    fs->epoch = 1;
  }
}
