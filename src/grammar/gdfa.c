/* gdfa.c — interned parse states and their memoized byte transitions (see gdfa.h). */
#include "grammar/gdfa.h"

#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "base/status.h"

void lm_gdfa_free(lm_gdfa *d) {
  for (uint32_t i = 0; i < d->n; i++)
    free(d->rows[i]);
  free(d->off);
  free(d->ids);
  free(d->flags);
  free(d->first);
  free(d->rows);
  free(d->loop);
  free(d->loop_done);
  free(d->slot);
  lm_gstate_free(&d->tmp_in);
  lm_gstate_free(&d->tmp_out);
  memset(d, 0, sizeof *d);
}

static uint64_t state_hash(const uint32_t *ids, uint32_t n, uint8_t fl) {
  uint64_t h = lm_mix64(n + ((uint64_t)fl << 32));
  for (uint32_t i = 0; i < n; i++)
    h = lm_mix64(h ^ ids[i]);
  return h;
}

static lm_status nomem(void) { return LM_ERRF(LM_ERR_NOMEM, "grammar: out of memory"); }

lm_status lm_gdfa_reset(lm_gdfa *d, const lm_gpda *p) {
  for (uint32_t i = 0; i < d->n; i++)
    free(d->rows[i]);
  d->n = 0;
  d->n_ids = 0;
  if (!d->max_states) d->max_states = LM_GDFA_MAX_STATES;
  if (!d->max_new_frames) d->max_new_frames = LM_GDFA_MAX_NEW_FRAMES;
  if (!d->slot) {
    d->slot_mask = 1023;
    d->slot = calloc(d->slot_mask + 1, sizeof *d->slot);
    if (!d->slot) return nomem();
  } else {
    memset(d->slot, 0, (d->slot_mask + 1) * sizeof *d->slot);
  }
  d->frames_base = p->fr.n;
  /* State 0 is the dead state, so a dead transition needs no lookup. */
  lm_gstate dead = {0};
  uint32_t id;
  return lm_gdfa_intern(d, p, &dead, &id);
}

static lm_status grow_states(lm_gdfa *d) {
  uint32_t cap = d->cap ? d->cap * 2 : 64;
  uint32_t *off = realloc(d->off, (cap + 1) * sizeof *off);
  if (!off) return nomem();
  d->off = off;
  uint8_t *fl = realloc(d->flags, cap);
  if (!fl) return nomem();
  d->flags = fl;
  lm_gset *first = realloc(d->first, cap * sizeof *first);
  if (!first) return nomem();
  d->first = first;
  uint32_t **rows = realloc(d->rows, cap * sizeof *rows);
  if (!rows) return nomem();
  d->rows = rows;
  uint64_t(*loop)[2] = realloc(d->loop, cap * sizeof *loop);
  if (!loop) return nomem();
  d->loop = loop;
  uint8_t *done = realloc(d->loop_done, cap);
  if (!done) return nomem();
  d->loop_done = done;
  d->cap = cap;
  return LM_OK;
}

static lm_status rehash(lm_gdfa *d) {
  uint32_t n = (d->slot_mask + 1) * 2;
  uint32_t *slot = calloc(n, sizeof *slot);
  if (!slot) return nomem();
  for (uint32_t s = 0; s < d->n; s++) {
    uint32_t h = (uint32_t)state_hash(d->ids + d->off[s], d->off[s + 1] - d->off[s],
                                      (uint8_t)(d->flags[s] & ~LM_GDFA_CTX_ANY));
    h &= n - 1;
    while (slot[h])
      h = (h + 1) & (n - 1);
    slot[h] = s + 1;
  }
  free(d->slot);
  d->slot = slot;
  d->slot_mask = n - 1;
  return LM_OK;
}

static uint8_t step_flags(const lm_gstate *st) {
  return (uint8_t)((st->accept ? LM_GDFA_ACCEPT : 0) | (st->ctx_hit ? LM_GDFA_CTX_HIT : 0) |
                   (st->ctx_after ? LM_GDFA_CTX_AFTER : 0) | (st->n ? LM_GDFA_ALIVE : 0));
}

lm_status lm_gdfa_intern(lm_gdfa *d, const lm_gpda *p, const lm_gstate *st, uint32_t *id) {
  uint8_t fl = step_flags(st);
  uint32_t h = (uint32_t)state_hash(st->s, st->n, fl) & d->slot_mask;
  for (uint32_t k; (k = d->slot[h]) != 0; h = (h + 1) & d->slot_mask) {
    uint32_t s = k - 1, n = d->off[s + 1] - d->off[s];
    if ((d->flags[s] & ~LM_GDFA_CTX_ANY) == fl && n == st->n &&
        (n == 0 || !memcmp(d->ids + d->off[s], st->s, n * sizeof *st->s))) {
      *id = s;
      return LM_OK;
    }
  }
  if (d->n >= d->max_states) return LM_ERR_STATE;
  if (d->n + 1 > d->cap) LM_TRY(grow_states(d));
  if (d->n_ids + st->n > d->cap_ids) {
    uint32_t cap = d->cap_ids ? d->cap_ids : 256;
    while (cap < d->n_ids + st->n)
      cap *= 2;
    uint32_t *ids = realloc(d->ids, cap * sizeof *ids);
    if (!ids) return nomem();
    d->ids = ids;
    d->cap_ids = cap;
  }
  uint32_t s = d->n++;
  if (s == 0) d->off[0] = 0;
  if (st->n) memcpy(d->ids + d->n_ids, st->s, st->n * sizeof *st->s);
  d->n_ids += st->n;
  d->off[s + 1] = d->n_ids;
  int ctx = 0;
  lm_gpda_first(p, st, &d->first[s], &ctx);
  d->flags[s] = (uint8_t)(fl | (ctx ? LM_GDFA_CTX_ANY : 0));
  d->rows[s] = NULL;
  d->loop_done[s] = 0;
  d->slot[h] = s + 1;
  if (d->n * 2 > d->slot_mask) LM_TRY(rehash(d));
  *id = s;
  return LM_OK;
}

lm_status lm_gdfa_next(lm_gdfa *d, lm_gpda *p, uint32_t s, uint8_t b, uint32_t *t) {
  uint32_t *row = d->rows[s];
  if (row && row[b] != UINT32_MAX) {
    *t = row[b];
    return LM_OK;
  }
  if (!row) {
    row = malloc(256 * sizeof *row);
    if (!row) return nomem();
    memset(row, 0xff, 256 * sizeof *row);
    d->rows[s] = row;
  }
  if (!(d->flags[s] & LM_GDFA_CTX_ANY) && !lm_gset_has(&d->first[s], b)) {
    row[b] = LM_GDFA_DEAD;
    *t = LM_GDFA_DEAD;
    return LM_OK;
  }
  if (p->fr.n - d->frames_base > d->max_new_frames) return LM_ERR_STATE;
  /* The state's ids are copied out: interning may move d->ids. */
  uint32_t n = d->off[s + 1] - d->off[s];
  lm_gstate *in = &d->tmp_in;
  if (n > in->cap) {
    uint32_t *q = realloc(in->s, n * sizeof *q);
    if (!q) return nomem();
    in->s = q;
    in->cap = n;
  }
  if (n) memcpy(in->s, d->ids + d->off[s], n * sizeof *in->s);
  in->n = n;
  LM_TRY(lm_gpda_step(p, in, b, &d->tmp_out));
  LM_TRY(lm_gdfa_intern(d, p, &d->tmp_out, t));
  d->rows[s][b] = *t;
  return LM_OK;
}
