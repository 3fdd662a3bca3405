/* token_mask.c — which tokens may come next, in the spirit of XGrammar: most tokens are decided
 * by the top of the parse stacks alone, so that part is computed once per distinct stack top and
 * cached; only the few tokens that reach below it are checked against the whole state per call.
 *
 * fill_mask:
 *   1. FULL key (the whole state, counts capped) in the cache: copy the mask. Done.
 *   2. LOCAL key (the top LM_G_KEY_DEPTH frames of each stack): if absent, walk the vocabulary
 *      trie from the truncated state (lm_gmask_walk): a token is accepted when a parse takes all
 *      its bytes, rejected when every parse dies within the top frames, uncertain when a parse
 *      needed what lies below the cut before the token's last byte.
 *   3. mask = accepted | the uncertain tokens the whole state takes (lm_gmask_check); stored as
 *      FULL when there were uncertain tokens, so the next call in the same state is a copy.
 * The walk and the check step through gdfa.h's memoized transitions (a lookup per trie node where
 * states repeat); when that memo fills up they start again stepping plainly (walk_plain,
 * check_plain: frames rolled back per trie node, consecutive tokens sharing their prefix's
 * steps), which is slower but bounded in memory. The whole fill has a budget of expansions
 * (LM_G_MASK_BUDGET), so no grammar makes it run unbounded.
 * Exactness: a parse of the truncated state is the top of a parse of the whole state, so whatever
 * it accepts or rejects without touching the cut holds for the whole state; the rest is checked.
 * Counts are capped at the longest piece + 1 in keys: a token cannot tell larger counts apart. */
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "grammar/gdfa.h"
#include "grammar/matcher_impl.h"

static void set_range(uint32_t *bits, const int32_t *tok, uint32_t lo, uint32_t hi) {
  for (uint32_t i = lo; i < hi; i++)
    bits[tok[i] >> 5] |= 1u << (tok[i] & 31);
}

typedef struct unc_list {
  int32_t *a;
  uint32_t n, cap;
} unc_list;

static lm_status unc_add(unc_list *u, const int32_t *tok, uint32_t lo, uint32_t hi) {
  if (hi <= lo) return LM_OK;
  uint32_t need = u->n + (hi - lo);
  if (need > u->cap) {
    uint32_t c = u->cap ? u->cap : 64;
    while (c < need)
      c *= 2;
    int32_t *q = realloc(u->a, c * sizeof *q);
    if (!q) return LM_ERRF(LM_ERR_NOMEM, "grammar: out of memory");
    u->a = q;
    u->cap = c;
  }
  memcpy(u->a + u->n, tok + lo, (hi - lo) * sizeof *tok);
  u->n = need;
  return LM_OK;
}

static void level_init(lm_matcher *m, lm_gwalk_level *L, uint32_t node, uint32_t mark, int inh,
                       const lm_gstate *st) {
  L->node = node;
  L->child = node + 1;
  L->mark = mark;
  L->inh = (uint8_t)inh;
  lm_gpda_first(&m->pda, st, &L->first, &L->ctx_any);
}

static lm_status walk_plain(lm_matcher *m, const lm_gstate *st, uint32_t *bits, int32_t **unc,
                            uint32_t *n_unc) {
  const lm_grammar_vocab *v = m->v;
  memset(bits, 0, ((size_t)v->n + 31) / 32 * sizeof *bits);
  unc_list u = {0};
  lm_status s = lm_gstate_copy(&m->lv[0], st);
  if (s != LM_OK) return s;
  uint32_t sp = 1;
  level_init(m, &m->lev[0], 0, m->pda.fr.n, 0, &m->lv[0]);
  while (sp > 0 && s == LM_OK) {
    lm_gwalk_level *L = &m->lev[sp - 1];
    if (L->child >= v->nend[L->node]) {
      lm_gframes_rollback(&m->pda.fr, L->mark);
      sp--;
      continue;
    }
    uint32_t c = L->child;
    L->child = v->nend[c];
    uint8_t b = v->nbyte[c];
    if (!lm_gset_has(&L->first, b) && !L->ctx_any) {
      if (L->inh) s = unc_add(&u, v->tok, v->ntok[c], v->ntok[v->nend[c]]);
      continue;
    }
    uint32_t mark = m->pda.fr.n;
    lm_gstate *nx = &m->lv[sp];
    s = lm_gpda_step(&m->pda, &m->lv[sp - 1], b, nx);
    if (s != LM_OK) break;
    if (nx->n || nx->accept || nx->ctx_after)
      set_range(bits, v->tok, v->ntok[c], v->ntok[c + 1]);
    else if (L->inh || nx->ctx_hit)
      s = unc_add(&u, v->tok, v->ntok[c], v->ntok[c + 1]);
    int deeper = L->inh || nx->ctx_hit || nx->ctx_after;
    if (nx->n && c + 1 < v->nend[c] && s == LM_OK) {
      level_init(m, &m->lev[sp], c, mark, deeper, nx);
      sp++;
      continue;
    }
    if (deeper && s == LM_OK) s = unc_add(&u, v->tok, v->ntok[c + 1], v->ntok[v->nend[c]]);
    lm_gframes_rollback(&m->pda.fr, mark);
  }
  if (s != LM_OK) {
    lm_gframes_rollback(&m->pda.fr, m->lev[0].mark);
    free(u.a);
    return s;
  }
  *unc = u.a;
  *n_unc = u.n;
  return LM_OK;
}

static lm_status check_plain(lm_matcher *m, const int32_t *unc, uint32_t n_unc, uint32_t *mask) {
  const lm_grammar_vocab *v = m->v;
  uint32_t base = m->pda.fr.n, have = 0;
  const uint8_t *prev = NULL;
  uint32_t prev_len = 0;
  lm_status s = lm_gstate_copy(&m->lv[0], &m->cur);
  for (uint32_t i = 0; i < n_unc && s == LM_OK; i++) {
    int32_t t = unc[i];
    const uint8_t *p = (const uint8_t *)v->bytes + v->off[t];
    uint32_t len = v->len[t], lcp = 0;
    while (prev && lcp < prev_len && lcp < len && lcp < have && p[lcp] == prev[lcp])
      lcp++;
    if (lcp < have) {
      lm_gframes_rollback(&m->pda.fr, m->marks[lcp]);
      have = lcp;
    }
    /* Levels past a dead one are never made: a prefix nothing takes kills its extensions. */
    while (have < len && m->lv[have].n > 0) {
      m->marks[have] = m->pda.fr.n;
      s = lm_gpda_step(&m->pda, &m->lv[have], p[have], &m->lv[have + 1]);
      if (s != LM_OK) break;
      have++;
    }
    if (s == LM_OK && have == len && (m->lv[len].n > 0 || m->lv[len].accept))
      mask[t >> 5] |= 1u << (t & 31);
    prev = p;
    prev_len = len;
  }
  lm_gframes_rollback(&m->pda.fr, base);
  return s;
}

/* The transition of DFA state s by byte b: the row's entry, or a step (gdfa.h). */
static inline lm_status dfa_next(lm_matcher *m, uint32_t s, uint8_t b, uint32_t *t) {
  const uint32_t *row = m->dfa.rows[s];
  if (row && row[b] != UINT32_MAX) {
    *t = row[b];
    return LM_OK;
  }
  return lm_gdfa_next(&m->dfa, &m->pda, s, b, t);
}

/* Whether every well-formed UTF-8 character of two or more bytes leads DFA state s back to
 * itself, through live states only (so a piece may also stop inside one). Followed shape by
 * shape (lead range, continuation ranges), the states after each byte deduplicated. */
static lm_status utf8_loops(lm_matcher *m, uint32_t s, int *yes) {
  static const struct {
    uint8_t lead_lo, lead_hi, n, lo1, hi1;
  } shapes[] = {{0xC2, 0xDF, 1, 0x80, 0xBF}, {0xE0, 0xE0, 2, 0xA0, 0xBF},
                {0xE1, 0xEC, 2, 0x80, 0xBF}, {0xED, 0xED, 2, 0x80, 0x9F},
                {0xEE, 0xEF, 2, 0x80, 0xBF}, {0xF0, 0xF0, 3, 0x90, 0xBF},
                {0xF1, 0xF3, 3, 0x80, 0xBF}, {0xF4, 0xF4, 3, 0x80, 0x8F}};
  *yes = 0;
  for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++) {
    uint32_t fr[16], n = 0;
    for (unsigned b = shapes[k].lead_lo; b <= shapes[k].lead_hi; b++) {
      uint32_t t;
      LM_TRY(dfa_next(m, s, (uint8_t)b, &t));
      if (!(m->dfa.flags[t] & LM_GDFA_ALIVE)) return LM_OK;
      uint32_t j = 0;
      while (j < n && fr[j] != t)
        j++;
      if (j == n && n == 16) return LM_OK; /* too varied to be a loop worth finding */
      if (j == n) fr[n++] = t;
    }
    for (unsigned i = 0; i < shapes[k].n; i++) {
      unsigned lo = i ? 0x80 : shapes[k].lo1, hi = i ? 0xBF : shapes[k].hi1;
      uint32_t nx[16], nn = 0;
      for (uint32_t f = 0; f < n; f++)
        for (unsigned b = lo; b <= hi; b++) {
          uint32_t t;
          LM_TRY(dfa_next(m, fr[f], (uint8_t)b, &t));
          int last = i + 1 == shapes[k].n;
          if (last ? t != s : !(m->dfa.flags[t] & LM_GDFA_ALIVE)) return LM_OK;
          uint32_t j = 0;
          while (j < nn && nx[j] != t)
            j++;
          if (j == nn && nn == 16) return LM_OK;
          if (j == nn) nx[nn++] = t;
        }
      memcpy(fr, nx, nn * sizeof *nx);
      n = nn;
    }
  }
  *yes = 1;
  return LM_OK;
}

/* The ASCII bytes that lead DFA state s back to itself (gdfa.h's loop set), computed once per
 * state; with `utf8`, also whether multi-byte characters do (computed once, when first asked:
 * it takes a few hundred steps, worth it only where wide characters are met). */
static lm_status loop_set(lm_matcher *m, uint32_t s, int utf8, uint64_t out[2], int *wide) {
  lm_gdfa *d = &m->dfa;
  if (!d->loop_done[s]) {
    uint64_t l[2] = {0, 0};
    for (unsigned b = 0; b < 128; b++) {
      uint32_t t;
      LM_TRY(dfa_next(m, s, (uint8_t)b, &t));
      if (t == s) l[b >> 6] |= 1ull << (b & 63);
    }
    d->loop[s][0] = l[0]; /* after the steps: interning may have moved d->loop */
    d->loop[s][1] = l[1];
    d->loop_done[s] = 1;
  }
  if (utf8 && d->loop_done[s] == 1) {
    int u;
    LM_TRY(utf8_loops(m, s, &u));
    d->loop_done[s] = (uint8_t)(u ? 3 : 2);
  }
  out[0] = d->loop[s][0];
  out[1] = d->loop[s][1];
  *wide = d->loop_done[s] == 3;
  return LM_OK;
}

/* Subtrees at least this large are first tested for acceptance in bulk. */
#define LM_G_BULK_MIN 2u

/* The walk of walk_plain with states interned and transitions memoized: a lookup per trie node
 * where states repeat. A subtree whose every ASCII byte leads the (live) state back to itself, and
 * whose other bytes are well-formed characters that do the same, holds only accepted tokens,
 * whatever their lengths: inside a JSON string that is most text, taken without visiting it.
 * LM_ERR_STATE when the memo fills up (the caller falls back). */
static lm_status walk_dfa(lm_matcher *m, const lm_gstate *st, uint32_t *bits, unc_list *u) {
  const lm_grammar_vocab *v = m->v;
  lm_gdfa *d = &m->dfa;
  uint32_t s0;
  LM_TRY(lm_gdfa_reset(d, &m->pda));
  LM_TRY(lm_gdfa_intern(d, &m->pda, st, &s0));
  lm_gwalk_level *lev = m->lev;
  uint32_t sp = 1;
  lev[0] = (lm_gwalk_level){.node = 0, .child = 1, .sid = s0};
  while (sp > 0) {
    lm_gwalk_level *L = &lev[sp - 1];
    if (L->child >= v->nend[L->node]) {
      sp--;
      continue;
    }
    uint32_t c = L->child, t;
    L->child = v->nend[c];
    if (v->nend[c] - c >= LM_G_BULK_MIN && (d->flags[L->sid] & LM_GDFA_ALIVE)) {
      uint64_t loop[2];
      int wide = 0;
      LM_TRY(loop_set(m, L->sid, 0, loop, &wide));
      int ascii_ok = !(v->nsum[c][0] & ~loop[0]) && !(v->nsum[c][1] & ~loop[1]);
      uint8_t nf = v->nflags[c];
      if (ascii_ok && (nf & LM_GV_NONASCII) && (nf & LM_GV_UTF8))
        LM_TRY(loop_set(m, L->sid, 1, loop, &wide));
      if (ascii_ok && (!(nf & LM_GV_NONASCII) || wide)) {
        set_range(bits, v->tok, v->ntok[c], v->ntok[v->nend[c]]);
        continue;
      }
    }
    LM_TRY(dfa_next(m, L->sid, v->nbyte[c], &t));
    uint8_t fl = d->flags[t];
    if (fl & (LM_GDFA_ALIVE | LM_GDFA_ACCEPT | LM_GDFA_CTX_AFTER))
      set_range(bits, v->tok, v->ntok[c], v->ntok[c + 1]);
    else if (L->inh || (fl & LM_GDFA_CTX_HIT))
      LM_TRY(unc_add(u, v->tok, v->ntok[c], v->ntok[c + 1]));
    int deeper = L->inh || (fl & (LM_GDFA_CTX_HIT | LM_GDFA_CTX_AFTER));
    if ((fl & LM_GDFA_ALIVE) && c + 1 < v->nend[c]) {
      lev[sp++] = (lm_gwalk_level){.node = c, .child = c + 1, .sid = t, .inh = (uint8_t)deeper};
      continue;
    }
    if (deeper) LM_TRY(unc_add(u, v->tok, v->ntok[c + 1], v->ntok[v->nend[c]]));
  }
  return LM_OK;
}

lm_status lm_gmask_walk(lm_matcher *m, const lm_gstate *st, uint32_t *bits, int32_t **unc,
                        uint32_t *n_unc) {
  const lm_grammar_vocab *v = m->v;
  uint32_t mark = m->pda.fr.n;
  memset(bits, 0, ((size_t)v->n + 31) / 32 * sizeof *bits);
  unc_list u = {0};
  lm_status s = m->no_dfa ? LM_ERR_STATE : walk_dfa(m, st, bits, &u);
  lm_gframes_rollback(&m->pda.fr, mark);
  if (s == LM_OK) {
    *unc = u.a;
    *n_unc = u.n;
    return LM_OK;
  }
  free(u.a);
  if (s != LM_ERR_STATE) return s;
  m->n_fallbacks++;
  return walk_plain(m, st, bits, unc, n_unc);
}

/* check_plain with memoized transitions from the whole state. */
static lm_status check_dfa(lm_matcher *m, const int32_t *unc, uint32_t n_unc, uint32_t *mask) {
  const lm_grammar_vocab *v = m->v;
  lm_gdfa *d = &m->dfa;
  uint32_t s0;
  LM_TRY(lm_gdfa_reset(d, &m->pda));
  LM_TRY(lm_gdfa_intern(d, &m->pda, &m->cur, &s0));
  for (uint32_t i = 0; i < n_unc; i++) {
    int32_t t = unc[i];
    const uint8_t *p = (const uint8_t *)v->bytes + v->off[t];
    uint32_t st = s0, len = v->len[t], k = 0;
    for (; k < len && (d->flags[st] & LM_GDFA_ALIVE); k++)
      LM_TRY(dfa_next(m, st, p[k], &st));
    if (k == len && (d->flags[st] & (LM_GDFA_ALIVE | LM_GDFA_ACCEPT)))
      mask[t >> 5] |= 1u << (t & 31);
  }
  return LM_OK;
}

lm_status lm_gmask_check(lm_matcher *m, const int32_t *unc, uint32_t n_unc, uint32_t *mask) {
  uint32_t mark = m->pda.fr.n;
  lm_status s = m->no_dfa ? LM_ERR_STATE : check_dfa(m, unc, n_unc, mask);
  lm_gframes_rollback(&m->pda.fr, mark);
  m->n_checked += n_unc;
  if (s == LM_ERR_STATE) {
    /* Start again without the memo. The uncertain tokens are exactly the bits the check may
     * have set (the accepted ones never include them), so clearing them restores the mask. */
    for (uint32_t i = 0; i < n_unc; i++)
      mask[unc[i] >> 5] &= ~(1u << (unc[i] & 31));
    m->n_fallbacks++;
    s = check_plain(m, unc, n_unc, mask);
  }
  return s;
}

static int same_key(const uint32_t *a, uint32_t na, const uint32_t *b, uint32_t nb) {
  return na == nb && !memcmp(a, b, na * sizeof *a);
}

static lm_status fill_local(lm_matcher *m, uint32_t depth, const uint32_t *key, uint32_t len,
                            uint64_t h, lm_gcache_entry **out) {
  *out = lm_gcache_get(m->cache, LM_GC_LOCAL, key, len, h);
  if (*out) {
    m->n_local_hits++;
    return LM_OK;
  }
  const lm_grammar_vocab *v = m->v;
  uint32_t mark = m->pda.fr.n;
  lm_gstate tr = {0};
  uint32_t *bits = malloc(((size_t)v->n + 31) / 32 * sizeof *bits + 4);
  int32_t *unc = NULL;
  uint32_t n_unc = 0;
  lm_status s = bits ? LM_OK : LM_ERRF(LM_ERR_NOMEM, "grammar: out of memory");
  if (s == LM_OK) s = lm_gpda_truncate(&m->pda, &m->cur, depth, v->max_len + 1, &tr);
  if (s == LM_OK) s = lm_gmask_walk(m, &tr, bits, &unc, &n_unc);
  lm_gstate_free(&tr);
  lm_gframes_rollback(&m->pda.fr, mark);
  if (s != LM_OK) {
    free(bits);
    return s;
  }
  m->n_walks++;
  *out = lm_gcache_put(m->cache, LM_GC_LOCAL, key, len, h, bits, unc, n_unc);
  return *out ? LM_OK : LM_ERRF(LM_ERR_NOMEM, "grammar: out of memory");
}

static lm_status fill(lm_matcher *m, uint32_t *mask);

lm_status lm_matcher_fill_mask(lm_matcher *m, uint32_t *mask) {
  m->pda.budget = LM_G_MASK_BUDGET;
  m->pda.clamp = m->v->max_len + 1;
  lm_status s = fill(m, mask);
  m->pda.budget = 0;
  m->pda.clamp = 0;
  return s;
}

static lm_status fill(lm_matcher *m, uint32_t *mask) {
  const lm_grammar_vocab *v = m->v;
  size_t n_words = ((size_t)v->n + 31) / 32;
  if (!mask) return LM_ERRF(LM_ERR_INVALID, "grammar: fill_mask: no mask");
  if (m->cur.n == 0) { /* complete and nothing may follow, or nothing at all */
    memset(mask, 0, n_words * sizeof *mask);
    return LM_OK;
  }
  uint32_t clamp = v->max_len + 1, n2 = 0, n1 = 0;
  LM_TRY(lm_gpda_key(&m->pda, &m->cur, UINT32_MAX, clamp, &m->key2, &m->key2_cap, &n2));
  uint64_t h2 = lm_gcache_hash(LM_GC_FULL, m->key2, n2);
  lm_gcache_entry *e = lm_gcache_get(m->cache, LM_GC_FULL, m->key2, n2, h2);
  if (e) {
    memcpy(mask, e->bits, n_words * sizeof *mask);
    lm_gcache_release(m->cache, e);
    m->n_full_hits++;
    return LM_OK;
  }
  /* A key whose entry leaves many tokens to check per call gives way to a deeper one (the
   * entry remembers nothing of it: the same key always leads to the same deeper key). */
  for (uint32_t depth = m->key_depth;; depth *= 2) {
    LM_TRY(lm_gpda_key(&m->pda, &m->cur, depth, clamp, &m->key, &m->key_cap, &n1));
    uint64_t h1 = lm_gcache_hash(LM_GC_LOCAL, m->key, n1);
    LM_TRY(fill_local(m, depth, m->key, n1, h1, &e));
    if (e->n_unc <= m->max_uncertain || depth >= 64 || same_key(m->key, n1, m->key2, n2)) break;
    lm_gcache_release(m->cache, e);
  }
  memcpy(mask, e->bits, n_words * sizeof *mask);
  lm_status s = LM_OK;
  if (e->n_unc && !same_key(m->key, n1, m->key2, n2)) {
    s = lm_gmask_check(m, e->unc, e->n_unc, mask);
    uint32_t *copy = s == LM_OK ? malloc(n_words * sizeof *copy + 4) : NULL;
    if (copy) {
      memcpy(copy, mask, n_words * sizeof *copy);
      lm_gcache_release(m->cache,
                        lm_gcache_put(m->cache, LM_GC_FULL, m->key2, n2, h2, copy, NULL, 0));
    }
  }
  lm_gcache_release(m->cache, e);
  return s;
}
