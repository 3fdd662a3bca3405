/* tokenizer_tables.c — the tokenizer's containers: growable buffers, a string table and two
 * open-addressing hash maps (token text -> id, merge pair -> rank). They are built once at load
 * (262k tokens and 515k merges for Gemma) and then only read, so the maps use linear probing
 * and never delete. */
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer_impl.h"

static lm_status grow(void **p, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return LM_OK;
  size_t c = *cap ? *cap : 16;
  while (c < need) {
    if (c > SIZE_MAX / 2 / elem) return LM_ERRF(LM_ERR_NOMEM, "tokenizer: buffer size overflow");
    c *= 2;
  }
  void *q = realloc(*p, c * elem);
  if (!q) return LM_ERRF(LM_ERR_NOMEM, "tokenizer: out of memory (%zu bytes)", c * elem);
  *p = q;
  *cap = c;
  return LM_OK;
}

lm_status lm_tbuf_reserve(lm_tbuf *b, size_t extra) {
  if (extra > SIZE_MAX - b->n - 1) return LM_ERRF(LM_ERR_NOMEM, "tokenizer: buffer size overflow");
  return grow((void **)&b->p, &b->cap, b->n + extra + 1, 1); /* +1 keeps room for a NUL */
}

lm_status lm_tbuf_put(lm_tbuf *b, const void *s, size_t n) {
  LM_TRY(lm_tbuf_reserve(b, n));
  if (n) memcpy(b->p + b->n, s, n);
  b->n += n;
  return LM_OK;
}

void lm_tbuf_free(lm_tbuf *b) {
  free(b->p);
  memset(b, 0, sizeof *b);
}

lm_status lm_tids_push(lm_tids *v, int32_t id) {
  LM_TRY(grow((void **)&v->v, &v->cap, v->n + 1, sizeof *v->v));
  v->v[v->n++] = id;
  return LM_OK;
}

lm_status lm_tids_append(lm_tids *v, const int32_t *ids, size_t n) {
  if (!n) return LM_OK;
  LM_TRY(grow((void **)&v->v, &v->cap, v->n + n, sizeof *v->v));
  memcpy(v->v + v->n, ids, n * sizeof *ids);
  v->n += n;
  return LM_OK;
}

void lm_tids_free(lm_tids *v) {
  free(v->v);
  memset(v, 0, sizeof *v);
}

lm_status lm_tspans_push(lm_tspans *v, size_t off, size_t len, int32_t id) {
  LM_TRY(grow((void **)&v->v, &v->cap, v->n + 1, sizeof *v->v));
  v->v[v->n++] = (lm_tspan){off, len, id};
  return LM_OK;
}

void lm_tspans_free(lm_tspans *v) {
  free(v->v);
  memset(v, 0, sizeof *v);
}

/* ---- string table ------------------------------------------------------------------------- */
lm_status lm_tok_strtab_resize(lm_tok_strtab *st, size_t n) {
  if (n <= st->n) return LM_OK;
  uint32_t *off = realloc(st->off, n * sizeof *off);
  if (!off) return LM_ERRF(LM_ERR_NOMEM, "tokenizer: out of memory (string table of %zu)", n);
  st->off = off;
  uint32_t *len = realloc(st->len, n * sizeof *len);
  if (!len) return LM_ERRF(LM_ERR_NOMEM, "tokenizer: out of memory (string table of %zu)", n);
  st->len = len;
  for (size_t i = st->n; i < n; i++)
    off[i] = 0, len[i] = LM_TOK_NONE;
  st->n = n;
  return LM_OK;
}

lm_status lm_tok_strtab_set(lm_tok_strtab *st, size_t idx, const char *s, size_t n) {
  if (idx >= st->n) LM_TRY(lm_tok_strtab_resize(st, idx + 1));
  /* offsets and lengths are 32-bit: the arena is bounded by the 2 GiB file limit */
  if (st->bytes.n + n >= UINT32_MAX)
    return LM_ERRF(LM_ERR_UNSUPPORTED, "tokenizer: token strings exceed 4 GiB");
  st->off[idx] = (uint32_t)st->bytes.n;
  st->len[idx] = (uint32_t)n;
  return lm_tbuf_put(&st->bytes, s, n);
}

void lm_tok_strtab_free(lm_tok_strtab *st) {
  lm_tbuf_free(&st->bytes);
  free(st->off);
  free(st->len);
  memset(st, 0, sizeof *st);
}

/* ---- string -> index map ------------------------------------------------------------------ */
/* FNV-1a over 8-byte words, then a murmur-style finalizer: token strings are short (9 bytes on
 * average in Gemma), so per-word mixing is cheaper than a byte loop. */
uint32_t lm_tok_hash(const char *s, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull ^ n;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    memcpy(&w, s + i, 8);
    h = (h ^ w) * 0x100000001b3ull;
    h ^= h >> 29;
  }
  if (i < n) {
    uint64_t w = 0;
    memcpy(&w, s + i, n - i);
    h = (h ^ w) * 0x100000001b3ull;
  }
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  return (uint32_t)h;
}

/* Tables start at a load factor <= 0.7 for the expected size and grow past 0.75: a fuller
 * table costs probes, an emptier one page faults and cache misses (Gemma's merge table). */
static size_t table_cap(size_t expected) {
  size_t c = 16;
  while (c < expected + expected / 2)
    c *= 2;
  return c;
}
static int table_full(size_t n, size_t mask) { return (n + 1) * 4 > (mask + 1) * 3; }

lm_status lm_tok_smap_init(lm_tok_smap *m, size_t expected) {
  size_t cap = table_cap(expected);
  m->slot = malloc(cap * sizeof *m->slot);
  if (!m->slot) return LM_ERRF(LM_ERR_NOMEM, "tokenizer: out of memory (hash of %zu)", expected);
  for (size_t i = 0; i < cap; i++)
    m->slot[i].idx = -1;
  m->mask = cap - 1;
  m->n = 0;
  return LM_OK;
}

static lm_status smap_rehash(lm_tok_smap *m) {
  lm_tok_smap nm;
  LM_TRY(lm_tok_smap_init(&nm, m->mask + 1));
  for (size_t i = 0; i <= m->mask; i++) {
    if (m->slot[i].idx < 0) continue;
    size_t j = m->slot[i].hash & nm.mask;
    while (nm.slot[j].idx >= 0)
      j = (j + 1) & nm.mask;
    nm.slot[j] = m->slot[i];
  }
  nm.n = m->n;
  free(m->slot);
  *m = nm;
  return LM_OK;
}

static uint64_t key_head(const char *s, size_t n) {
  uint64_t h = 0;
  if (n) memcpy(&h, s, n < 8 ? n : 8);
  return h;
}

static int slot_is(const lm_tok_sslot *e, const lm_tok_strtab *st, uint32_t h, uint64_t head,
                   const char *s, size_t n) {
  return e->hash == h && e->len == n && e->head == head &&
         (n <= 8 || !memcmp(st->bytes.p + e->off + 8, s + 8, n - 8));
}

lm_status lm_tok_smap_put(lm_tok_smap *m, const lm_tok_strtab *st, int32_t idx, int32_t *prev) {
  size_t n = 0;
  const char *s = lm_tok_strtab_get(st, (size_t)idx, &n);
  if (!s)
    return LM_ERRF(LM_ERR_STATE, "tokenizer: internal error: hashing an index without a string");
  return lm_tok_smap_put_h(m, st, idx, lm_tok_hash(s, n), prev);
}

lm_status lm_tok_smap_put_h(lm_tok_smap *m, const lm_tok_strtab *st, int32_t idx, uint32_t h,
                            int32_t *prev) {
  if (!m->slot) LM_TRY(lm_tok_smap_init(m, 16));
  if (table_full(m->n, m->mask)) LM_TRY(smap_rehash(m));
  size_t n = 0;
  const char *s = lm_tok_strtab_get(st, (size_t)idx, &n);
  if (!s)
    return LM_ERRF(LM_ERR_STATE, "tokenizer: internal error: hashing an index without a string");
  uint64_t head = key_head(s, n);
  lm_tok_sslot slot = {head, h, idx, st->off[idx], (uint32_t)n};
  if (prev) *prev = -1;
  for (size_t i = h & m->mask;; i = (i + 1) & m->mask) {
    lm_tok_sslot *e = &m->slot[i];
    if (e->idx < 0) {
      *e = slot;
      m->n++;
      return LM_OK;
    }
    if (slot_is(e, st, h, head, s, n)) {
      if (prev) *prev = e->idx;
      *e = slot;
      return LM_OK;
    }
  }
}

int32_t lm_tok_smap_get(const lm_tok_smap *m, const lm_tok_strtab *st, const char *s, size_t n) {
  return lm_tok_smap_get_h(m, st, s, n, lm_tok_hash(s, n));
}

int32_t lm_tok_smap_get_h(const lm_tok_smap *m, const lm_tok_strtab *st, const char *s, size_t n,
                          uint32_t h) {
  if (!m->slot) return -1;
  uint64_t head = key_head(s, n);
  for (size_t i = h & m->mask;; i = (i + 1) & m->mask) {
    const lm_tok_sslot *e = &m->slot[i];
    if (e->idx < 0) return -1;
    if (slot_is(e, st, h, head, s, n)) return e->idx;
  }
}

void lm_tok_smap_free(lm_tok_smap *m) {
  free(m->slot);
  memset(m, 0, sizeof *m);
}

/* ---- pair -> merge map -------------------------------------------------------------------- */
lm_status lm_tok_pmap_init(lm_tok_pmap *m, size_t expected) {
  size_t cap = table_cap(expected);
  m->slot = malloc(cap * sizeof *m->slot);
  if (!m->slot)
    return LM_ERRF(LM_ERR_NOMEM, "tokenizer: out of memory (merge table of %zu)", expected);
  for (size_t i = 0; i < cap; i++)
    m->slot[i].key = UINT64_MAX;
  m->mask = cap - 1;
  m->n = 0;
  return LM_OK;
}

static size_t pmap_home(uint64_t key, size_t mask) { return lm_tok_pmap_home(key, mask); }

static lm_status pmap_rehash(lm_tok_pmap *m) {
  lm_tok_pmap nm;
  LM_TRY(lm_tok_pmap_init(&nm, m->mask + 1));
  for (size_t i = 0; i <= m->mask; i++) {
    if (m->slot[i].key == UINT64_MAX) continue;
    size_t j = pmap_home(m->slot[i].key, nm.mask);
    while (nm.slot[j].key != UINT64_MAX)
      j = (j + 1) & nm.mask;
    nm.slot[j] = m->slot[i];
  }
  nm.n = m->n;
  free(m->slot);
  *m = nm;
  return LM_OK;
}

/* A pair seen twice keeps its last rank, as HF's HashMap collect does. */
lm_status lm_tok_pmap_put(lm_tok_pmap *m, int32_t a, int32_t b, uint32_t rank, int32_t id) {
  if (!m->slot) LM_TRY(lm_tok_pmap_init(m, 16));
  if (table_full(m->n, m->mask)) LM_TRY(pmap_rehash(m));
  uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
  for (size_t i = pmap_home(key, m->mask);; i = (i + 1) & m->mask) {
    if (m->slot[i].key == key || m->slot[i].key == UINT64_MAX) {
      if (m->slot[i].key == UINT64_MAX) m->n++;
      m->slot[i] = (lm_tok_merge){key, rank, id};
      return LM_OK;
    }
  }
}

void lm_tok_pmap_free(lm_tok_pmap *m) {
  free(m->slot);
  memset(m, 0, sizeof *m);
}
