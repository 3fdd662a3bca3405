/* grammar.c — lm_grammar's lifetime and its per-vocabulary mask caches. */
#include <stdlib.h>

#include "base/status.h"
#include "grammar/grammar_impl.h"
#include "grammar/mask_cache.h"
#include "grammar/vocab.h"

void lm_grammar_free(lm_grammar *g) {
  if (!g) return;
  for (uint32_t i = 0; i < g->n_caches; i++)
    lm_gcache_free(g->caches[i]);
  free(g->caches);
  if (g->names)
    for (uint32_t r = 0; r < g->n_rules; r++)
      free(g->names[r]);
  free(g->names);
  free(g->elems);
  free(g->rule_alt_off);
  free(g->alt_start);
  free(g->sets);
  free(g->rule_first);
  free(g->rule_null);
  free(g->suf_first);
  free(g->suf_null);
  pthread_mutex_destroy(&g->lock);
  free(g);
}

void lm_grammar_set_cache_limit(lm_grammar *g, size_t bytes) {
  pthread_mutex_lock(&g->lock);
  g->cache_limit = bytes;
  for (uint32_t i = 0; i < g->n_caches; i++)
    lm_gcache_set_limit(g->caches[i], bytes);
  pthread_mutex_unlock(&g->lock);
}

lm_status lm_grammar_cache_for(const lm_grammar *cg, const lm_grammar_vocab *v, lm_gcache **out) {
  /* The caches are the one mutable part of a shared grammar; the lock makes that safe. */
  lm_grammar *g = (lm_grammar *)cg;
  lm_status s = LM_OK;
  pthread_mutex_lock(&g->lock);
  for (uint32_t i = 0; i < g->n_caches; i++) {
    if (lm_gcache_vocab(g->caches[i]) == v->hash) {
      *out = g->caches[i];
      goto done;
    }
  }
  lm_gcache **c = realloc(g->caches, (g->n_caches + 1) * sizeof *c);
  if (!c) {
    s = LM_ERRF(LM_ERR_NOMEM, "grammar: out of memory");
    goto done;
  }
  g->caches = c;
  s = lm_gcache_create(v->hash, v->n, g->cache_limit, &g->caches[g->n_caches]);
  if (s == LM_OK) *out = g->caches[g->n_caches++];
done:
  pthread_mutex_unlock(&g->lock);
  return s;
}
