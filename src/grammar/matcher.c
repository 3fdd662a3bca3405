/* matcher.c — lm_matcher: one sequence's parse state over a shared grammar and vocabulary.
 * Accepting a token steps its bytes; a token the state cannot take leaves it unchanged. */
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "grammar/matcher_impl.h"

/* Frames of a long generation pile up (each step makes a few); past this many, and four times
 * what the state uses, the table is rebuilt with only the live ones. */
#define LM_G_COMPACT_MIN 4096u

void lm_matcher_free(lm_matcher *m) {
  if (!m) return;
  if (m->lv)
    for (uint32_t i = 0; i < m->v->max_len + 2; i++)
      lm_gstate_free(&m->lv[i]);
  free(m->lv);
  free(m->lev);
  free(m->marks);
  free(m->key);
  free(m->key2);
  lm_gstate_free(&m->cur);
  lm_gstate_free(&m->nxt);
  lm_gdfa_free(&m->dfa);
  lm_gpda_free(&m->pda);
  free(m);
}

lm_status lm_matcher_create(const lm_grammar *g, const lm_grammar_vocab *v, lm_matcher **out) {
  if (!g || !v || !out) return LM_ERRF(LM_ERR_INVALID, "grammar: matcher_create: NULL argument");
  lm_matcher *m = calloc(1, sizeof *m);
  if (!m) return LM_ERRF(LM_ERR_NOMEM, "grammar: out of memory");
  m->g = g;
  m->v = v;
  m->key_depth = LM_G_KEY_DEPTH;
  m->max_uncertain = LM_G_MAX_UNCERTAIN;
  lm_status s = lm_gpda_init(&m->pda, g);
  if (s != LM_OK) {
    free(m);
    return s;
  }
  size_t levels = (size_t)v->max_len + 2;
  m->lv = calloc(levels, sizeof *m->lv);
  m->lev = calloc(levels, sizeof *m->lev);
  m->marks = calloc(levels, sizeof *m->marks);
  if (!m->lv || !m->lev || !m->marks) s = LM_ERRF(LM_ERR_NOMEM, "grammar: out of memory");
  if (s == LM_OK) s = lm_grammar_cache_for(g, v, &m->cache);
  if (s == LM_OK) s = lm_gpda_start(&m->pda, &m->cur);
  if (s != LM_OK) {
    lm_matcher_free(m);
    return s;
  }
  m->live_frames = m->pda.fr.n;
  *out = m;
  return LM_OK;
}

void lm_matcher_set_key_depth(lm_matcher *m, uint32_t depth) {
  m->key_depth = depth < 1 ? 1 : depth > 64 ? 64 : depth;
}

/* Steps cur through bytes into nxt; on success swaps them, else rolls back. */
static lm_status advance(lm_matcher *m, const uint8_t *p, size_t n) {
  uint32_t mark = m->pda.fr.n;
  lm_status s = lm_gstate_copy(&m->nxt, &m->cur);
  lm_gstate tmp = {0};
  for (size_t i = 0; i < n && s == LM_OK; i++) {
    if (m->nxt.n == 0) {
      s = LM_ERR_INVALID;
      break;
    }
    s = lm_gpda_step(&m->pda, &m->nxt, p[i], &tmp);
    lm_gstate sw = m->nxt;
    m->nxt = tmp;
    tmp = sw;
  }
  lm_gstate_free(&tmp);
  if (s == LM_OK && m->nxt.n == 0 && !m->nxt.accept) s = LM_ERR_INVALID;
  if (s != LM_OK) {
    lm_gframes_rollback(&m->pda.fr, mark);
    return s;
  }
  lm_gstate sw = m->cur;
  m->cur = m->nxt;
  m->nxt = sw;
  if (m->pda.fr.n > LM_G_COMPACT_MIN && m->pda.fr.n > 4 * m->live_frames) {
    LM_TRY(lm_gpda_compact(&m->pda, &m->cur));
    m->live_frames = m->pda.fr.n;
  }
  return LM_OK;
}

lm_status lm_matcher_accept(lm_matcher *m, int32_t id) {
  if (id < 0 || id >= m->v->n)
    return LM_ERRF(LM_ERR_INVALID, "grammar: token %d is outside the vocabulary (%d)", id, m->v->n);
  uint32_t len = m->v->len[id];
  if (len == 0) return LM_ERRF(LM_ERR_INVALID, "grammar: token %d is not allowed here", id);
  lm_status s = advance(m, (const uint8_t *)m->v->bytes + m->v->off[id], len);
  if (s == LM_ERR_INVALID) return LM_ERRF(s, "grammar: token %d is not allowed here", id);
  return s;
}

lm_status lm_matcher_accept_bytes(lm_matcher *m, const char *bytes, size_t n) {
  if (n == 0) return LM_OK;
  if (!bytes) return LM_ERRF(LM_ERR_INVALID, "grammar: accept_bytes: NULL bytes");
  lm_status s = advance(m, (const uint8_t *)bytes, n);
  if (s == LM_ERR_INVALID)
    return LM_ERRF(s, "grammar: the %zu forced bytes are not allowed here", n);
  return s;
}

int lm_matcher_complete(const lm_matcher *m) { return lm_gpda_complete(&m->pda, &m->cur); }

int lm_matcher_finished(const lm_matcher *m) {
  if (!lm_matcher_complete(m)) return 0;
  lm_gset f;
  int ctx;
  lm_gpda_first(&m->pda, &m->cur, &f, &ctx);
  return lm_gset_empty(&f);
}

void lm_matcher_reset(lm_matcher *m) {
  lm_gframes_rollback(&m->pda.fr, 2);
  m->cur.n = 0;
  /* The start state only interns a frame per root alternative: it cannot fail once it has
   * succeeded at create, with the same memory back. */
  if (lm_gpda_start(&m->pda, &m->cur) != LM_OK) m->cur.n = 0;
  m->live_frames = m->pda.fr.n;
}
