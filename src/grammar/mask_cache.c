/* mask_cache.c — a chained hash table and an LRU list under one mutex (see mask_cache.h). The
 * lock covers only lookups and links; mask copies and checks happen outside it. */
#include "grammar/mask_cache.h"

#include <stdlib.h>
#include <string.h>

#include "base/rng.h"

struct lm_gcache {
  pthread_mutex_t mu;
  uint64_t vocab_hash;
  uint32_t n_words;
  lm_gcache_entry **buckets;
  uint32_t n_buckets;
  lm_gcache_entry *head, *tail; /* head: most recently used */
  size_t limit;
  lm_gcache_stats st;
};

lm_status lm_gcache_create(uint64_t vocab_hash, int32_t n_tokens, size_t limit, lm_gcache **out) {
  lm_gcache *c = calloc(1, sizeof *c);
  if (!c) return LM_ERRF(LM_ERR_NOMEM, "grammar: out of memory");
  c->n_buckets = 256;
  c->buckets = calloc(c->n_buckets, sizeof *c->buckets);
  if (!c->buckets) {
    free(c);
    return LM_ERRF(LM_ERR_NOMEM, "grammar: out of memory");
  }
  pthread_mutex_init(&c->mu, NULL);
  c->vocab_hash = vocab_hash;
  c->n_words = (uint32_t)(((int64_t)n_tokens + 31) / 32);
  c->limit = limit;
  *out = c;
  return LM_OK;
}

static void entry_free(lm_gcache_entry *e) {
  free(e->key);
  free(e->bits);
  free(e->unc);
  free(e);
}

void lm_gcache_free(lm_gcache *c) {
  if (!c) return;
  for (lm_gcache_entry *e = c->head, *nx; e; e = nx) {
    nx = e->lnext;
    entry_free(e);
  }
  free(c->buckets);
  pthread_mutex_destroy(&c->mu);
  free(c);
}

uint64_t lm_gcache_vocab(const lm_gcache *c) { return c->vocab_hash; }

uint64_t lm_gcache_hash(uint32_t kind, const uint32_t *key, uint32_t len) {
  uint64_t h = lm_mix64(kind + ((uint64_t)len << 8));
  for (uint32_t i = 0; i < len; i++)
    h = lm_mix64(h ^ key[i]);
  return h;
}

static void lru_unlink(lm_gcache *c, lm_gcache_entry *e) {
  if (e->lprev)
    e->lprev->lnext = e->lnext;
  else
    c->head = e->lnext;
  if (e->lnext)
    e->lnext->lprev = e->lprev;
  else
    c->tail = e->lprev;
  e->lprev = e->lnext = NULL;
}

static void lru_front(lm_gcache *c, lm_gcache_entry *e) {
  e->lprev = NULL;
  e->lnext = c->head;
  if (c->head) c->head->lprev = e;
  c->head = e;
  if (!c->tail) c->tail = e;
}

static void table_unlink(lm_gcache *c, lm_gcache_entry *e) {
  lm_gcache_entry **pp = &c->buckets[e->hash & (c->n_buckets - 1)];
  while (*pp != e)
    pp = &(*pp)->hnext;
  *pp = e->hnext;
}

/* Drops least-recently-used entries until `need` more bytes fit. An entry in use is unlinked
 * and freed by its last release. */
static void evict(lm_gcache *c, size_t need) {
  while (c->tail && c->st.bytes + need > c->limit) {
    lm_gcache_entry *e = c->tail;
    lru_unlink(c, e);
    table_unlink(c, e);
    e->linked = 0;
    c->st.bytes -= e->bytes;
    c->st.entries--;
    c->st.evictions++;
    if (e->refs == 0) entry_free(e);
  }
}

void lm_gcache_set_limit(lm_gcache *c, size_t limit) {
  pthread_mutex_lock(&c->mu);
  c->limit = limit;
  evict(c, 0);
  pthread_mutex_unlock(&c->mu);
}

lm_gcache_stats lm_gcache_get_stats(lm_gcache *c) {
  pthread_mutex_lock(&c->mu);
  lm_gcache_stats s = c->st;
  pthread_mutex_unlock(&c->mu);
  return s;
}

static lm_gcache_entry *find(lm_gcache *c, uint32_t kind, const uint32_t *key, uint32_t len,
                             uint64_t hash) {
  for (lm_gcache_entry *e = c->buckets[hash & (c->n_buckets - 1)]; e; e = e->hnext)
    if (e->hash == hash && e->kind == kind && e->key_len == len &&
        !memcmp(e->key, key, len * sizeof *key))
      return e;
  return NULL;
}

lm_gcache_entry *lm_gcache_get(lm_gcache *c, uint32_t kind, const uint32_t *key, uint32_t len,
                               uint64_t hash) {
  pthread_mutex_lock(&c->mu);
  lm_gcache_entry *e = find(c, kind, key, len, hash);
  if (e) {
    e->refs++;
    lru_unlink(c, e);
    lru_front(c, e);
    c->st.hits++;
  } else {
    c->st.misses++;
  }
  pthread_mutex_unlock(&c->mu);
  return e;
}

static void grow_table(lm_gcache *c) {
  uint32_t n = c->n_buckets * 2;
  lm_gcache_entry **b = calloc(n, sizeof *b);
  if (!b) return; /* longer chains, still correct */
  for (uint32_t i = 0; i < c->n_buckets; i++) {
    for (lm_gcache_entry *e = c->buckets[i], *nx; e; e = nx) {
      nx = e->hnext;
      e->hnext = b[e->hash & (n - 1)];
      b[e->hash & (n - 1)] = e;
    }
  }
  free(c->buckets);
  c->buckets = b;
  c->n_buckets = n;
}

lm_gcache_entry *lm_gcache_put(lm_gcache *c, uint32_t kind, const uint32_t *key, uint32_t len,
                               uint64_t hash, uint32_t *bits, int32_t *unc, uint32_t n_unc) {
  lm_gcache_entry *e = calloc(1, sizeof *e);
  uint32_t *k = malloc((len + 1) * sizeof *k);
  if (!e || !k) {
    free(e);
    free(k);
    free(bits);
    free(unc);
    return NULL;
  }
  memcpy(k, key, len * sizeof *k);
  *e = (lm_gcache_entry){.hash = hash,
                         .key = k,
                         .key_len = len,
                         .kind = kind,
                         .bits = bits,
                         .unc = unc,
                         .n_unc = n_unc,
                         .refs = 1};
  e->bytes = sizeof *e + len * sizeof *k + (size_t)c->n_words * 4 + (size_t)n_unc * 4;
  pthread_mutex_lock(&c->mu);
  lm_gcache_entry *old = find(c, kind, key, len, hash);
  if (old) { /* another matcher got here first */
    old->refs++;
    pthread_mutex_unlock(&c->mu);
    entry_free(e);
    return old;
  }
  if (e->bytes <= c->limit) {
    evict(c, e->bytes);
    uint32_t b = (uint32_t)(hash & (c->n_buckets - 1));
    e->hnext = c->buckets[b];
    c->buckets[b] = e;
    lru_front(c, e);
    e->linked = 1;
    c->st.bytes += e->bytes;
    c->st.entries++;
    c->st.inserts++;
    if (c->st.entries > c->n_buckets) grow_table(c);
  }
  pthread_mutex_unlock(&c->mu);
  return e;
}

void lm_gcache_release(lm_gcache *c, lm_gcache_entry *e) {
  if (!e) return;
  pthread_mutex_lock(&c->mu);
  int dead = --e->refs == 0 && !e->linked;
  pthread_mutex_unlock(&c->mu);
  if (dead) entry_free(e);
}
