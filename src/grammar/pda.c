/* pda.c — one byte step of the recognizer, and what the mask code asks of a state. */
#include "grammar/pda.h"

#include <stdlib.h>
#include <string.h>

#include "base/status.h"

lm_status lm_gpda_init(lm_gpda *p, const lm_grammar *g) {
  memset(p, 0, sizeof *p);
  p->g = g;
  return lm_gframes_init(&p->fr);
}

void lm_gpda_free(lm_gpda *p) {
  lm_gframes_free(&p->fr);
  free(p->work);
  memset(p, 0, sizeof *p);
}

void lm_gstate_free(lm_gstate *st) {
  free(st->s);
  memset(st, 0, sizeof *st);
}

static lm_status reserve(uint32_t **a, uint32_t *cap, uint32_t need) {
  if (need <= *cap) return LM_OK;
  uint32_t c = *cap ? *cap : 16;
  while (c < need)
    c *= 2;
  uint32_t *q = realloc(*a, c * sizeof *q);
  if (!q) return LM_ERRF(LM_ERR_NOMEM, "grammar: out of memory");
  *a = q;
  *cap = c;
  return LM_OK;
}

lm_status lm_gstate_copy(lm_gstate *dst, const lm_gstate *src) {
  LM_TRY(reserve(&dst->s, &dst->cap, src->n));
  if (src->n) memcpy(dst->s, src->s, src->n * sizeof *src->s);
  dst->n = src->n;
  dst->accept = src->accept;
  dst->ctx_hit = src->ctx_hit;
  dst->ctx_after = src->ctx_after;
  return LM_OK;
}

static int id_cmp(const void *x, const void *y) {
  uint32_t a = *(const uint32_t *)x, b = *(const uint32_t *)y;
  return a < b ? -1 : a > b;
}

static void sort_unique(lm_gstate *st) {
  uint32_t *a = st->s, n = st->n;
  if (n > 32) qsort(a, n, sizeof *a, id_cmp);
  for (uint32_t i = 1; i < n && n <= 32; i++) { /* states are mostly small: insertion sort */
    uint32_t x = a[i], j = i;
    while (j > 0 && a[j - 1] > x) {
      a[j] = a[j - 1];
      j--;
    }
    a[j] = x;
  }
  uint32_t k = 0;
  for (uint32_t i = 0; i < n; i++)
    if (k == 0 || a[k - 1] != a[i]) a[k++] = a[i];
  st->n = k;
}

static uint32_t dec(uint32_t x) { return x == LM_G_INF ? x : (x ? x - 1 : 0); }

/* The frame that continues at pos (counts of a REPEAT set from the element), or, at the end of
 * an alternative, the parent itself: returns happen as soon as they can, so no frame ever rests
 * on an END. */
static uint32_t enter(lm_gpda *p, uint32_t pos, uint32_t parent) {
  const lm_gelem *e = &p->g->elems[pos];
  if (e->kind == LM_GK_END) return parent;
  if (e->kind == LM_GK_REPEAT) {
    uint32_t lo = e->min, hi = e->max;
    if (p->clamp && lo >= p->clamp) lo = LM_G_INF;
    if (p->clamp && hi >= p->clamp) hi = LM_G_INF;
    return lm_gframes_intern(&p->fr, pos, lo, hi, parent);
  }
  return lm_gframes_intern(&p->fr, pos, 0, 0, parent);
}

typedef struct stepper {
  lm_gpda *p;
  lm_gstate *out;
  uint32_t n_work, done;
  uint8_t b;
} stepper;

static lm_status push_work(stepper *s, uint32_t id) {
  if (id == LM_GF_FAIL) return LM_ERR_NOMEM; /* the message is set */
  if (id == LM_GF_NULL) return LM_OK;        /* the root is complete: it takes no more bytes */
  if (id == LM_GF_CTX) {
    s->out->ctx_hit = 1;
    return LM_OK;
  }
  if (!lm_gframes_visit(&s->p->fr, id)) return LM_OK;
  if (s->p->budget && --s->p->budget == 0)
    return LM_ERRF(LM_ERR_UNSUPPORTED,
                   "grammar: too ambiguous (a mask needs more than %llu "
                   "expansions)",
                   (unsigned long long)LM_G_MASK_BUDGET);
  if (++s->done > LM_G_MAX_WORK)
    return LM_ERRF(LM_ERR_UNSUPPORTED,
                   "grammar: too ambiguous (more than %u expansions for one "
                   "byte)",
                   LM_G_MAX_WORK);
  LM_TRY(reserve(&s->p->work, &s->p->cap_work, s->n_work + 1));
  s->p->work[s->n_work++] = id;
  return LM_OK;
}

static lm_status result(stepper *s, uint32_t id) {
  if (id == LM_GF_FAIL) return LM_ERR_NOMEM;
  if (id == LM_GF_NULL) {
    s->out->accept = 1;
    return LM_OK;
  }
  if (id == LM_GF_CTX) {
    s->out->ctx_after = 1;
    return LM_OK;
  }
  if (s->out->n >= LM_G_MAX_STACKS * 4) {
    sort_unique(s->out);
    if (s->out->n >= LM_G_MAX_STACKS)
      return LM_ERRF(LM_ERR_UNSUPPORTED, "grammar: too ambiguous (more than %u parses at once)",
                     LM_G_MAX_STACKS);
  }
  LM_TRY(reserve(&s->out->s, &s->out->cap, s->out->n + 1));
  s->out->s[s->out->n++] = id;
  return LM_OK;
}

/* Expands rule r's alternatives that can take the byte, each returning to ret. */
static lm_status expand(stepper *s, uint32_t r, uint32_t ret) {
  const lm_grammar *g = s->p->g;
  for (uint32_t a = g->rule_alt_off[r]; a < g->rule_alt_off[r + 1]; a++) {
    uint32_t st = g->alt_start[a];
    if (!lm_gset_has(&g->suf_first[st], s->b)) continue;
    LM_TRY(push_work(s, enter(s->p, st, ret)));
  }
  return LM_OK;
}

static lm_status process(stepper *s, uint32_t id) {
  const lm_grammar *g = s->p->g;
  lm_gframe f = s->p->fr.f[id];
  const lm_gelem *e = &g->elems[f.pos];
  if (e->kind == LM_GK_TERM) {
    if (lm_gset_has(&g->sets[e->arg], s->b)) return result(s, enter(s->p, f.pos + 1, f.parent));
    return LM_OK;
  }
  if (e->kind == LM_GK_REF) {
    int take = lm_gset_has(&g->rule_first[e->arg], s->b);
    if (!take && !g->rule_null[e->arg]) return LM_OK;
    uint32_t ret = enter(s->p, f.pos + 1, f.parent);
    if (ret == LM_GF_FAIL) return LM_ERR_NOMEM;
    /* Skipping a nullable rule lands where any of its empty derivations would. */
    if (g->rule_null[e->arg]) LM_TRY(push_work(s, ret));
    return take ? expand(s, e->arg, ret) : LM_OK;
  }
  /* REPEAT: leave it (when enough repetitions were made), or begin one more. */
  if (f.rmin == 0 && (lm_gset_has(&g->suf_first[f.pos + 1], s->b) || g->suf_null[f.pos + 1]))
    LM_TRY(push_work(s, enter(s->p, f.pos + 1, f.parent)));
  /* An empty repetition would only come back here with fewer left: a body is entered only for
   * a byte it can take. */
  if (f.rmax > 0 && lm_gset_has(&g->rule_first[e->arg], s->b)) {
    uint32_t ret = lm_gframes_intern(&s->p->fr, f.pos, dec(f.rmin), dec(f.rmax), f.parent);
    if (ret == LM_GF_FAIL) return LM_ERR_NOMEM;
    LM_TRY(expand(s, e->arg, ret));
  }
  return LM_OK;
}

lm_status lm_gpda_step(lm_gpda *p, const lm_gstate *in, uint8_t b, lm_gstate *out) {
  out->n = 0;
  out->accept = out->ctx_hit = out->ctx_after = 0;
  stepper s = {p, out, 0, 0, b};
  lm_gframes_epoch(&p->fr);
  for (uint32_t i = 0; i < in->n; i++)
    LM_TRY(push_work(&s, in->s[i]));
  while (s.n_work)
    LM_TRY(process(&s, p->work[--s.n_work]));
  sort_unique(out);
  if (out->n > LM_G_MAX_STACKS)
    return LM_ERRF(LM_ERR_UNSUPPORTED, "grammar: too ambiguous (more than %u parses at once)",
                   LM_G_MAX_STACKS);
  return LM_OK;
}

lm_status lm_gpda_start(lm_gpda *p, lm_gstate *out) {
  const lm_grammar *g = p->g;
  out->n = 0;
  out->accept = out->ctx_hit = out->ctx_after = 0;
  for (uint32_t a = g->rule_alt_off[g->root]; a < g->rule_alt_off[g->root + 1]; a++) {
    uint32_t id = enter(p, g->alt_start[a], LM_GF_NULL);
    if (id == LM_GF_FAIL) return LM_ERR_NOMEM;
    if (id == LM_GF_NULL) {
      out->accept = 1;
      continue;
    }
    LM_TRY(reserve(&out->s, &out->cap, out->n + 1));
    out->s[out->n++] = id;
  }
  sort_unique(out);
  return LM_OK;
}

/* FIRST of one frame and whether it can return without a byte. */
static int frame_first(const lm_grammar *g, const lm_gframe *f, lm_gset *out) {
  const lm_gelem *e = &g->elems[f->pos];
  if (e->kind != LM_GK_REPEAT) {
    lm_gset_or(out, &g->suf_first[f->pos]);
    return g->suf_null[f->pos];
  }
  if (f->rmax > 0) lm_gset_or(out, &g->rule_first[e->arg]);
  if (f->rmin > 0) return 0;
  lm_gset_or(out, &g->suf_first[f->pos + 1]);
  return g->suf_null[f->pos + 1];
}

void lm_gpda_first(const lm_gpda *p, const lm_gstate *st, lm_gset *out, int *ctx) {
  memset(out, 0, sizeof *out);
  *ctx = 0;
  for (uint32_t i = 0; i < st->n; i++) {
    uint32_t id = st->s[i];
    while (id > LM_GF_CTX && frame_first(p->g, &p->fr.f[id], out))
      id = p->fr.f[id].parent;
    if (id == LM_GF_CTX) *ctx = 1;
  }
}

int lm_gpda_complete(const lm_gpda *p, const lm_gstate *st) {
  if (st->accept) return 1;
  lm_gset scratch;
  for (uint32_t i = 0; i < st->n; i++) {
    uint32_t id = st->s[i];
    while (id > LM_GF_CTX && frame_first(p->g, &p->fr.f[id], &scratch))
      id = p->fr.f[id].parent;
    if (id == LM_GF_NULL) return 1;
  }
  return 0;
}

/* A count a token cannot exhaust (clamp = the longest piece + 1, and every repetition of a
 * counted body takes at least a byte) behaves, for that token, like no bound at all: written as
 * LM_G_INF, so long repetitions share keys and, unbounded, step back to the same state. */
static uint32_t cap_count(uint32_t x, uint32_t clamp) { return x >= clamp ? LM_G_INF : x; }

#define KEY_END_ROOT 0xffffffffu
#define KEY_END_CUT 0xfffffffeu

/* Serializes stack `id` into w (3 words a frame + an end word); returns the words written. */
static uint32_t stack_words(const lm_gpda *p, uint32_t id, uint32_t depth, uint32_t clamp,
                            uint32_t *w) {
  uint32_t k = 0, d = 0;
  for (; id > LM_GF_CTX && d < depth; id = p->fr.f[id].parent, d++) {
    const lm_gframe *f = &p->fr.f[id];
    w[k++] = f->pos;
    w[k++] = cap_count(f->rmin, clamp);
    w[k++] = cap_count(f->rmax, clamp);
  }
  w[k++] = id == LM_GF_NULL ? KEY_END_ROOT : KEY_END_CUT;
  return k;
}

static uint32_t stack_depth(const lm_gpda *p, uint32_t id, uint32_t depth) {
  uint32_t d = 0;
  for (; id > LM_GF_CTX && d < depth; id = p->fr.f[id].parent)
    d++;
  return d;
}

typedef struct span {
  const uint32_t *w;
  uint32_t n;
} span;

static int span_cmp(const void *a, const void *b) {
  const span *x = a, *y = b;
  uint32_t n = x->n < y->n ? x->n : y->n;
  for (uint32_t i = 0; i < n; i++)
    if (x->w[i] != y->w[i]) return x->w[i] < y->w[i] ? -1 : 1;
  return x->n < y->n ? -1 : x->n > y->n;
}

lm_status lm_gpda_key(lm_gpda *p, const lm_gstate *st, uint32_t depth, uint32_t clamp,
                      uint32_t **buf, uint32_t *cap, uint32_t *len) {
  size_t total = 0;
  for (uint32_t i = 0; i < st->n; i++)
    total += 3 * (size_t)stack_depth(p, st->s[i], depth) + 1;
  if (total > UINT32_MAX / 4) return LM_ERRF(LM_ERR_NOMEM, "grammar: state too large");
  /* Scratch after the key area: the unsorted serializations. */
  LM_TRY(reserve(buf, cap, (uint32_t)(2 * total + 1)));
  uint32_t *raw = *buf + total;
  span *sp = malloc((st->n + 1) * sizeof *sp);
  if (!sp) return LM_ERRF(LM_ERR_NOMEM, "grammar: out of memory");
  uint32_t k = 0;
  for (uint32_t i = 0; i < st->n; i++) {
    uint32_t n = stack_words(p, st->s[i], depth, clamp, raw + k);
    sp[i] = (span){raw + k, n};
    k += n;
  }
  qsort(sp, st->n, sizeof *sp, span_cmp);
  uint32_t o = 0;
  for (uint32_t i = 0; i < st->n; i++) {
    if (i > 0 && span_cmp(&sp[i - 1], &sp[i]) == 0) continue;
    memmove(*buf + o, sp[i].w, sp[i].n * sizeof *sp[i].w);
    o += sp[i].n;
  }
  free(sp);
  *len = o;
  return LM_OK;
}

lm_status lm_gpda_truncate(lm_gpda *p, const lm_gstate *st, uint32_t depth, uint32_t clamp,
                           lm_gstate *out) {
  out->n = 0;
  out->accept = out->ctx_hit = out->ctx_after = 0;
  uint32_t chain[64];
  if (depth > 64) depth = 64;
  for (uint32_t i = 0; i < st->n; i++) {
    uint32_t d = 0, id = st->s[i];
    for (; id > LM_GF_CTX && d < depth; id = p->fr.f[id].parent)
      chain[d++] = id;
    uint32_t below = id == LM_GF_NULL ? LM_GF_NULL : LM_GF_CTX;
    while (d-- > 0) {
      lm_gframe f = p->fr.f[chain[d]];
      below = lm_gframes_intern(&p->fr, f.pos, cap_count(f.rmin, clamp), cap_count(f.rmax, clamp),
                                below);
      if (below == LM_GF_FAIL) return LM_ERR_NOMEM;
    }
    LM_TRY(reserve(&out->s, &out->cap, out->n + 1));
    out->s[out->n++] = below;
  }
  sort_unique(out);
  return LM_OK;
}

lm_status lm_gpda_compact(lm_gpda *p, lm_gstate *st) {
  lm_gframes nf;
  LM_TRY(lm_gframes_init(&nf));
  uint32_t *map = calloc(p->fr.n, sizeof *map); /* old id → new id, 0 = not copied yet */
  uint32_t *chain = NULL, cap = 0;
  lm_status s = LM_OK;
  if (!map) {
    s = LM_ERRF(LM_ERR_NOMEM, "grammar: out of memory");
    goto done;
  }
  map[LM_GF_CTX] = LM_GF_CTX;
  for (uint32_t i = 0; i < st->n; i++) {
    uint32_t d = 0, id = st->s[i];
    for (; id > LM_GF_CTX && !map[id]; id = p->fr.f[id].parent) {
      s = reserve(&chain, &cap, d + 1);
      if (s != LM_OK) goto done;
      chain[d++] = id;
    }
    uint32_t below = id > LM_GF_CTX ? map[id] : id;
    while (d-- > 0) {
      lm_gframe f = p->fr.f[chain[d]];
      below = lm_gframes_intern(&nf, f.pos, f.rmin, f.rmax, below);
      if (below == LM_GF_FAIL) {
        s = LM_ERR_NOMEM;
        goto done;
      }
      map[chain[d]] = below;
    }
    st->s[i] = below;
  }
  sort_unique(st);
  lm_gframes_free(&p->fr);
  p->fr = nf;
  nf.f = NULL;
done:
  if (nf.f) lm_gframes_free(&nf);
  free(map);
  free(chain);
  return s;
}
