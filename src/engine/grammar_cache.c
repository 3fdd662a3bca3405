/* grammar_cache.c — the LRU of compiled grammars (grammar_cache.h).
 *
 * Locking: `mu` guards the list, the counters and every entry's state; an entry's reference count
 * is atomic, so releasing one needs no cache (it may be gone). A compile runs without the lock; the
 * entry is in the list meanwhile (state COMPILING), which is what makes a second caller wait for it
 * rather than compile the same text again. */
#include "engine/grammar_cache.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"

enum { G_COMPILING = 0, G_READY, G_FAILED };

struct lm_grammar_ref {
  atomic_int refs; /* holders, the cache's own one included while it is listed */
  lm_grammar *g;
  lm_grammar_kind kind;
  char *text;
  size_t len;
  uint64_t hash;
  int state;
  lm_status err; /* G_FAILED */
  char msg[512];
  uint64_t used; /* LRU clock */
  struct lm_grammar_ref *next;
};

struct lm_grammar_cache {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  lm_grammar_ref *head;
  int n, cap;
  uint64_t tick;
  lm_grammar_cache_stats st;
};

static uint64_t fnv1a(const char *s, size_t n, lm_grammar_kind kind) {
  uint64_t h = 1469598103934665603ull ^ (uint64_t)kind;
  for (size_t i = 0; i < n; i++)
    h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
  return h;
}

lm_status lm_grammar_cache_create(int cap, lm_grammar_cache **out) {
  *out = NULL;
  lm_grammar_cache *c = calloc(1, sizeof *c);
  if (!c) return LM_ERRF(LM_ERR_NOMEM, "out of memory (grammar cache)");
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, NULL);
  c->cap = cap > 0 ? cap : 1;
  *out = c;
  return LM_OK;
}

void lm_grammar_ref_release(lm_grammar_ref *r) {
  if (!r || atomic_fetch_sub(&r->refs, 1) != 1) return;
  lm_grammar_free(r->g);
  free(r->text);
  free(r);
}

const lm_grammar *lm_grammar_ref_get(const lm_grammar_ref *r) { return r->g; }

/* Unlinks r from the list (mu held) and drops the cache's reference. */
static void unlink_entry(lm_grammar_cache *c, lm_grammar_ref *r) {
  for (lm_grammar_ref **p = &c->head; *p; p = &(*p)->next)
    if (*p == r) {
      *p = r->next;
      c->n--;
      lm_grammar_ref_release(r);
      return;
    }
}

/* Evicts the least recently used finished entries while the list is over its cap (mu held). */
static void evict(lm_grammar_cache *c) {
  while (c->n > c->cap) {
    lm_grammar_ref *lru = NULL;
    for (lm_grammar_ref *r = c->head; r; r = r->next)
      if (r->state != G_COMPILING && (!lru || r->used < lru->used)) lru = r;
    if (!lru) return; /* every entry is being compiled: the list shrinks when they finish */
    unlink_entry(c, lru);
    c->st.evictions++;
  }
}

void lm_grammar_cache_free(lm_grammar_cache *c) {
  if (!c) return;
  while (c->head)
    unlink_entry(c, c->head);
  pthread_cond_destroy(&c->cv);
  pthread_mutex_destroy(&c->mu);
  free(c);
}

static lm_grammar_ref *find(lm_grammar_cache *c, lm_grammar_kind kind, const char *text, size_t len,
                            uint64_t h) {
  for (lm_grammar_ref *r = c->head; r; r = r->next)
    if (r->hash == h && r->kind == kind && r->len == len && !memcmp(r->text, text, len)) return r;
  return NULL;
}

static lm_status compile(lm_grammar_kind kind, const char *text, size_t len, lm_grammar **g) {
  switch (kind) {
  case LM_GRAMMAR_GBNF: return lm_grammar_from_gbnf(text, len, g);
  case LM_GRAMMAR_JSON_SCHEMA: return lm_grammar_from_json_schema(text, len, g);
  case LM_GRAMMAR_JSON_OBJECT: return lm_grammar_json_object(g);
  }
  return LM_ERRF(LM_ERR_INVALID, "grammar: unknown kind %d", (int)kind);
}

/* Waits for r's compile (mu held, the caller holding a reference) and returns its outcome. */
static lm_status wait_ready(lm_grammar_cache *c, lm_grammar_ref *r) {
  while (r->state == G_COMPILING)
    pthread_cond_wait(&c->cv, &c->mu);
  if (r->state == G_READY) return LM_OK;
  return lm_err_set(r->err, "%s", r->msg);
}

/* A new entry, listed as being compiled, with two references (the cache's and the caller's). */
static lm_grammar_ref *add_entry(lm_grammar_cache *c, lm_grammar_kind kind, const char *text,
                                 size_t len, uint64_t h) {
  lm_grammar_ref *r = calloc(1, sizeof *r);
  if (!r || !(r->text = malloc(len ? len : 1))) {
    free(r);
    return NULL;
  }
  if (len) memcpy(r->text, text, len);
  r->len = len;
  r->kind = kind;
  r->hash = h;
  r->state = G_COMPILING;
  r->used = ++c->tick;
  atomic_init(&r->refs, 2);
  r->next = c->head;
  c->head = r;
  c->n++;
  return r;
}

lm_status lm_grammar_cache_get(lm_grammar_cache *c, lm_grammar_kind kind, const char *text,
                               size_t len, lm_grammar_ref **out) {
  *out = NULL;
  if (kind == LM_GRAMMAR_JSON_OBJECT) text = "", len = 0;
  uint64_t h = fnv1a(text, len, kind);
  pthread_mutex_lock(&c->mu);
  lm_grammar_ref *r = find(c, kind, text, len, h);
  if (r) {
    atomic_fetch_add(&r->refs, 1);
    r->used = ++c->tick;
    c->st.hits++;
    lm_status s = wait_ready(c, r);
    pthread_mutex_unlock(&c->mu);
    if (s) {
      lm_grammar_ref_release(r);
      return s;
    }
    *out = r;
    return LM_OK;
  }
  c->st.misses++;
  if (!(r = add_entry(c, kind, text, len, h))) {
    pthread_mutex_unlock(&c->mu);
    return LM_ERRF(LM_ERR_NOMEM, "out of memory (grammar cache)");
  }
  evict(c);
  pthread_mutex_unlock(&c->mu);

  lm_grammar *g = NULL;
  lm_status s = compile(kind, text, len, &g);

  pthread_mutex_lock(&c->mu);
  c->st.compiles++;
  r->g = g;
  r->state = s ? G_FAILED : G_READY;
  if (s) {
    r->err = s;
    snprintf(r->msg, sizeof r->msg, "%s", lm_errmsg());
    /* a failure of the text is kept (the same text fails the same way); others are not */
    if (s != LM_ERR_INVALID && s != LM_ERR_UNSUPPORTED) unlink_entry(c, r);
  }
  evict(c);
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
  if (s) {
    lm_grammar_ref_release(r);
    return s;
  }
  *out = r;
  return LM_OK;
}

void lm_grammar_cache_get_stats(lm_grammar_cache *c, lm_grammar_cache_stats *st) {
  pthread_mutex_lock(&c->mu);
  *st = c->st;
  st->entries = c->n;
  pthread_mutex_unlock(&c->mu);
}
