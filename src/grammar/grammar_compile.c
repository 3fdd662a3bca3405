/* grammar_compile.c — IR → lm_grammar: the normalization the matcher relies on.
 *
 *  1. Productive rules (those that derive some finite string), by a linear worklist; alternatives
 *     that use an unproductive rule are dropped. Without this a matcher could accept a prefix that
 *     can never be completed. A root that derives nothing is an error.
 *  2. Nullable rules, by the same kind of worklist; a repetition of a nullable body is counted
 *     from 0 (x{m,n} = x{0,n} when x can be empty) and bounded (LM_G_MAX_NULLABLE_REPEAT).
 *  3. Flattening from the root: only reachable rules are kept; a rule with one alternative used
 *     once is inlined into its user (GBNF groups, schema pieces), so the matcher's stacks are
 *     shallower and its cache keys more local.
 *  4. Left recursion is refused (a rule that can reach itself before consuming a byte would make
 *     the recognizer's expansion endless). The check is a depth-first search of the "can start
 *     with" graph; its post-order then computes FIRST sets in one pass (the graph is acyclic).
 * Every pass is iterative (no recursion on the grammar's depth) and linear in the IR size. */
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "grammar/grammar_impl.h"

typedef struct occ {
  uint32_t alt, next; /* an alternative waiting on a rule; next occurrence of the same rule */
} occ;

typedef struct comp {
  const lm_gir_view *v;
  uint32_t n_alts;
  uint32_t *alt_rule;
  uint8_t *prod, *alt_live, *null;
} comp;

static void *xcalloc(size_t n, size_t sz) { return calloc(n ? n : 1, sz); }

/* Which rule each alternative belongs to. */
static lm_status map_alts(comp *c) {
  c->n_alts = c->v->rule_alt_off[c->v->n_rules];
  c->alt_rule = xcalloc(c->n_alts, sizeof *c->alt_rule);
  if (!c->alt_rule) return LM_ERRF(LM_ERR_NOMEM, "grammar: out of memory");
  for (uint32_t r = 0; r < c->v->n_rules; r++)
    for (uint32_t a = c->v->rule_alt_off[r]; a < c->v->rule_alt_off[r + 1]; a++)
      c->alt_rule[a] = r;
  return LM_OK;
}

/* Shared worklist fixpoint: a rule gets the property when one of its alternatives has all its
 * elements with it. `waits(e)` says on which rule an element waits (-1: it has the property
 * already; -2: it never will). Used for productive (every TERM has it) and nullable (no TERM
 * has it). `alive` restricts to live alternatives (NULL: all). */
typedef int64_t (*wait_fn)(const lm_gelem *e);

static lm_status fixpoint(comp *c, wait_fn waits, const uint8_t *alive, uint8_t *out) {
  const lm_gir_view *v = c->v;
  uint32_t *pending = xcalloc(c->n_alts, sizeof *pending);
  uint32_t *head = malloc((v->n_rules + 1) * sizeof *head);
  uint32_t *queue = xcalloc(v->n_rules, sizeof *queue);
  size_t n_occ = 0, cap_occ = 64;
  occ *o = malloc(cap_occ * sizeof *o);
  lm_status s = LM_OK;
  if (!pending || !head || !queue || !o) {
    s = LM_ERRF(LM_ERR_NOMEM, "grammar: out of memory");
    goto done;
  }
  memset(head, 0xff, (v->n_rules + 1) * sizeof *head);
  memset(out, 0, v->n_rules);
  uint32_t qn = 0;
  for (uint32_t a = 0; a < c->n_alts; a++) {
    if (alive && !alive[a]) continue;
    const lm_gseq *q = &v->alts[a];
    int never = 0;
    for (uint32_t i = 0; i < q->n && !never; i++) {
      int64_t w = waits(&q->e[i]);
      if (w == -2) never = 1;
      if (w < 0) continue;
      if (n_occ == cap_occ) {
        occ *g = realloc(o, cap_occ * 2 * sizeof *o);
        if (!g) {
          s = LM_ERRF(LM_ERR_NOMEM, "grammar: out of memory");
          goto done;
        }
        o = g;
        cap_occ *= 2;
      }
      o[n_occ] = (occ){a, head[w]};
      head[w] = (uint32_t)n_occ++;
      pending[a]++;
    }
    if (never) {
      pending[a] = UINT32_MAX;
      continue;
    }
    uint32_t r = c->alt_rule[a];
    if (pending[a] == 0 && !out[r]) {
      out[r] = 1;
      queue[qn++] = r;
    }
  }
  for (uint32_t qi = 0; qi < qn; qi++) {
    for (uint32_t k = head[queue[qi]]; k != UINT32_MAX; k = o[k].next) {
      uint32_t a = o[k].alt;
      if (pending[a] == UINT32_MAX || --pending[a] != 0) continue;
      uint32_t r = c->alt_rule[a];
      if (!out[r]) {
        out[r] = 1;
        queue[qn++] = r;
      }
    }
  }
done:
  free(pending);
  free(head);
  free(queue);
  free(o);
  return s;
}

static int64_t wait_prod(const lm_gelem *e) {
  if (e->kind == LM_GK_TERM) return -1;
  if (e->kind == LM_GK_REPEAT && e->min == 0) return -1;
  return e->arg;
}

static int64_t wait_null(const lm_gelem *e) {
  if (e->kind == LM_GK_TERM) return -2;
  if (e->kind == LM_GK_REPEAT && e->min == 0) return -1;
  return e->arg;
}

/* An alternative is live when every element can derive something. */
static void mark_live(comp *c) {
  for (uint32_t a = 0; a < c->n_alts; a++) {
    const lm_gseq *q = &c->v->alts[a];
    c->alt_live[a] = 1;
    for (uint32_t i = 0; i < q->n; i++) {
      const lm_gelem *e = &q->e[i];
      if (e->kind == LM_GK_REF && !c->prod[e->arg]) c->alt_live[a] = 0;
      if (e->kind == LM_GK_REPEAT && e->min > 0 && !c->prod[e->arg]) c->alt_live[a] = 0;
    }
  }
}

/* ---- flattening -------------------------------------------------------------------------- */

typedef struct flat {
  comp *c;
  int32_t *newid; /* builder rule → final rule, -1: not yet */
  uint32_t *order;
  uint32_t n_order;
  uint32_t *uses_ref, *uses_rep;
  lm_gelem *el;
  uint32_t n_el, cap_el;
  uint32_t *alt_start;
  uint32_t n_alt, cap_alt;
  uint32_t *rule_off;
} flat;

static lm_status push_el(flat *f, lm_gelem e) {
  if (f->n_el >= LM_G_MAX_ELEMS + 16)
    return LM_ERRF(LM_ERR_INVALID, "grammar: too large (more than %u elements)", LM_G_MAX_ELEMS);
  if (f->n_el == f->cap_el) {
    uint32_t cap = f->cap_el ? f->cap_el * 2 : 256;
    lm_gelem *g = realloc(f->el, cap * sizeof *g);
    if (!g) return LM_ERRF(LM_ERR_NOMEM, "grammar: out of memory");
    f->el = g;
    f->cap_el = cap;
  }
  f->el[f->n_el++] = e;
  return LM_OK;
}

static uint32_t rule_id(flat *f, uint32_t r) {
  if (f->newid[r] < 0) {
    f->newid[r] = (int32_t)f->n_order;
    f->order[f->n_order++] = r;
  }
  return (uint32_t)f->newid[r];
}

/* The one live alternative of r (inlining candidates have exactly one). */
static const lm_gseq *only_alt(flat *f, uint32_t r) {
  const lm_gir_view *v = f->c->v;
  for (uint32_t a = v->rule_alt_off[r]; a < v->rule_alt_off[r + 1]; a++)
    if (f->c->alt_live[a]) return &v->alts[a];
  return NULL;
}

static int inlinable(flat *f, uint32_t r, uint32_t root) {
  if (r == root || f->uses_ref[r] != 1 || f->uses_rep[r] != 0) return 0;
  const lm_gir_view *v = f->c->v;
  uint32_t live = 0;
  for (uint32_t a = v->rule_alt_off[r]; a < v->rule_alt_off[r + 1]; a++)
    live += f->c->alt_live[a];
  if (live != 1) return 0;
  const lm_gseq *q = only_alt(f, r);
  for (uint32_t i = 0; i < q->n; i++)
    if (q->e[i].kind != LM_GK_TERM && q->e[i].arg == r) return 0;
  return 1;
}

/* Emits q's elements; single-use rules are spliced in, up to a depth (an unreachable cycle of
 * single-use rules would otherwise never end). */
#define LM_G_INLINE_DEPTH 16
static lm_status emit_seq(flat *f, const lm_gseq *q, uint32_t root, int depth) {
  for (uint32_t i = 0; i < q->n; i++) {
    lm_gelem e = q->e[i];
    if (e.kind == LM_GK_TERM) {
      LM_TRY(push_el(f, e));
    } else if (e.kind == LM_GK_REF) {
      if (depth < LM_G_INLINE_DEPTH && inlinable(f, e.arg, root)) {
        LM_TRY(emit_seq(f, only_alt(f, e.arg), root, depth + 1));
      } else {
        e.arg = rule_id(f, e.arg);
        LM_TRY(push_el(f, e));
      }
    } else {
      if (!f->c->prod[e.arg]) continue; /* min is 0 (else the alternative is dead): only ε */
      if (f->c->null[e.arg]) {
        if (e.max != LM_G_INF && e.max > LM_G_MAX_NULLABLE_REPEAT)
          return LM_ERRF(LM_ERR_UNSUPPORTED,
                         "grammar: rule '%s': a repetition of something that can be empty is "
                         "limited to %u (here %u)",
                         f->c->v->names[e.arg], LM_G_MAX_NULLABLE_REPEAT, e.max);
        e.min = 0;
      }
      e.arg = rule_id(f, e.arg);
      LM_TRY(push_el(f, e));
    }
  }
  return LM_OK;
}

static lm_status flatten(flat *f, uint32_t root) {
  const lm_gir_view *v = f->c->v;
  for (uint32_t a = 0; a < f->c->n_alts; a++) {
    if (!f->c->alt_live[a]) continue;
    for (uint32_t i = 0; i < v->alts[a].n; i++) {
      const lm_gelem *e = &v->alts[a].e[i];
      if (e->kind == LM_GK_REF) f->uses_ref[e->arg]++;
      if (e->kind == LM_GK_REPEAT) f->uses_rep[e->arg]++;
    }
  }
  rule_id(f, root);
  for (uint32_t k = 0; k < f->n_order; k++) {
    uint32_t r = f->order[k];
    f->rule_off[k] = f->n_alt;
    for (uint32_t a = v->rule_alt_off[r]; a < v->rule_alt_off[r + 1]; a++) {
      if (!f->c->alt_live[a]) continue;
      if (f->n_alt == f->cap_alt) {
        uint32_t cap = f->cap_alt ? f->cap_alt * 2 : 64;
        uint32_t *g = realloc(f->alt_start, cap * sizeof *g);
        if (!g) return LM_ERRF(LM_ERR_NOMEM, "grammar: out of memory");
        f->alt_start = g;
        f->cap_alt = cap;
      }
      f->alt_start[f->n_alt++] = f->n_el;
      LM_TRY(emit_seq(f, &v->alts[a], root, 0));
      LM_TRY(push_el(f, (lm_gelem){LM_GK_END, 0, 0, 0}));
    }
  }
  f->rule_off[f->n_order] = f->n_alt;
  return LM_OK;
}

/* ---- analysis of the flat grammar -------------------------------------------------------- */

static int elem_null(const lm_grammar *g, const lm_gelem *e) {
  if (e->kind == LM_GK_END) return 1;
  if (e->kind == LM_GK_TERM) return 0;
  if (e->kind == LM_GK_REF) return g->rule_null[e->arg];
  return e->min == 0 || g->rule_null[e->arg];
}

typedef struct dfs_frame {
  uint32_t rule, alt, pos; /* pos: the next element of alt to look at */
} dfs_frame;

/* Next "can start with" edge of the frame's rule, or UINT32_MAX when none is left. */
static uint32_t next_edge(const lm_grammar *g, dfs_frame *d) {
  while (d->alt < g->rule_alt_off[d->rule + 1]) {
    const lm_gelem *e = &g->elems[d->pos];
    int stop = e->kind == LM_GK_END || !elem_null(g, e);
    uint32_t to = (e->kind == LM_GK_REF || e->kind == LM_GK_REPEAT) ? e->arg : UINT32_MAX;
    if (stop) {
      d->alt++;
      if (d->alt < g->rule_alt_off[d->rule + 1]) d->pos = g->alt_start[d->alt];
    } else {
      d->pos++;
    }
    if (to != UINT32_MAX) return to;
  }
  return UINT32_MAX;
}

/* Depth-first over the edges: a back edge is left recursion; the post-order is written to
 * `post` (every rule's FIRST-dependencies before it). */
static lm_status left_rec_order(const lm_grammar *g, uint32_t *post) {
  uint8_t *color = xcalloc(g->n_rules, 1);
  dfs_frame *st = xcalloc(g->n_rules, sizeof *st);
  lm_status s = LM_OK;
  if (!color || !st) {
    s = LM_ERRF(LM_ERR_NOMEM, "grammar: out of memory");
    goto done;
  }
  uint32_t n_post = 0;
  for (uint32_t r0 = 0; r0 < g->n_rules; r0++) {
    if (color[r0]) continue;
    uint32_t sp = 0;
    st[sp++] = (dfs_frame){r0, g->rule_alt_off[r0], g->alt_start[g->rule_alt_off[r0]]};
    color[r0] = 1;
    while (sp) {
      dfs_frame *d = &st[sp - 1];
      uint32_t to = next_edge(g, d);
      if (to == UINT32_MAX) {
        color[d->rule] = 2;
        post[n_post++] = d->rule;
        sp--;
      } else if (color[to] == 1) {
        s = LM_ERRF(LM_ERR_INVALID,
                    "grammar: rule '%s' is left-recursive (it can reach itself before any byte)",
                    g->names[to]);
        goto done;
      } else if (color[to] == 0) {
        color[to] = 1;
        st[sp++] = (dfs_frame){to, g->rule_alt_off[to], g->alt_start[g->rule_alt_off[to]]};
      }
    }
  }
done:
  free(color);
  free(st);
  return s;
}

static void elem_first(const lm_grammar *g, const lm_gelem *e, lm_gset *out) {
  if (e->kind == LM_GK_TERM) lm_gset_or(out, &g->sets[e->arg]);
  if (e->kind == LM_GK_REF || e->kind == LM_GK_REPEAT) lm_gset_or(out, &g->rule_first[e->arg]);
}

static void first_sets(lm_grammar *g, const uint32_t *post) {
  for (uint32_t k = 0; k < g->n_rules; k++) {
    uint32_t r = post[k];
    lm_gset f = {{0}};
    for (uint32_t a = g->rule_alt_off[r]; a < g->rule_alt_off[r + 1]; a++) {
      for (uint32_t p = g->alt_start[a];; p++) {
        const lm_gelem *e = &g->elems[p];
        if (e->kind == LM_GK_END) break;
        elem_first(g, e, &f);
        if (!elem_null(g, e)) break;
      }
    }
    g->rule_first[r] = f;
  }
  /* Suffix sets, from each END backwards. */
  for (uint32_t p = g->n_elems; p-- > 0;) {
    const lm_gelem *e = &g->elems[p];
    if (e->kind == LM_GK_END) {
      memset(&g->suf_first[p], 0, sizeof g->suf_first[p]);
      g->suf_null[p] = 1;
      continue;
    }
    lm_gset f = {{0}};
    elem_first(g, e, &f);
    int nul = elem_null(g, e);
    if (nul) lm_gset_or(&f, &g->suf_first[p + 1]);
    g->suf_first[p] = f;
    g->suf_null[p] = (uint8_t)(nul && g->suf_null[p + 1]);
  }
}

static lm_status build(comp *c, flat *f, uint32_t root, lm_grammar **out) {
  const lm_gir_view *v = c->v;
  lm_grammar *g = calloc(1, sizeof *g);
  if (!g) return LM_ERRF(LM_ERR_NOMEM, "grammar: out of memory");
  g->n_rules = f->n_order;
  g->root = 0;
  g->elems = f->el;
  g->n_elems = f->n_el;
  f->el = NULL;
  g->alt_start = f->alt_start;
  f->alt_start = NULL;
  g->rule_alt_off = f->rule_off;
  f->rule_off = NULL;
  (void)root;
  g->names = xcalloc(g->n_rules, sizeof *g->names);
  g->sets = xcalloc(v->n_sets, sizeof *g->sets);
  g->rule_first = xcalloc(g->n_rules, sizeof *g->rule_first);
  g->rule_null = xcalloc(g->n_rules, 1);
  g->suf_first = xcalloc(g->n_elems, sizeof *g->suf_first);
  g->suf_null = xcalloc(g->n_elems, 1);
  uint32_t *post = xcalloc(g->n_rules, sizeof *post);
  g->cache_limit = LM_GRAMMAR_CACHE_BYTES;
  pthread_mutex_init(&g->lock, NULL);
  lm_status s = LM_OK;
  if (!g->names || !g->sets || !g->rule_first || !g->rule_null || !g->suf_first || !g->suf_null ||
      !post) {
    s = LM_ERRF(LM_ERR_NOMEM, "grammar: out of memory");
    goto done;
  }
  if (v->n_sets) memcpy(g->sets, v->sets, v->n_sets * sizeof *g->sets);
  g->n_sets = v->n_sets;
  for (uint32_t k = 0; k < g->n_rules; k++) {
    g->names[k] = strdup(v->names[f->order[k]]);
    if (!g->names[k]) {
      s = LM_ERRF(LM_ERR_NOMEM, "grammar: out of memory");
      goto done;
    }
    g->rule_null[k] = c->null[f->order[k]];
  }
  s = left_rec_order(g, post);
  if (s == LM_OK) first_sets(g, post);
done:
  free(post);
  if (s != LM_OK) {
    lm_grammar_free(g);
    return s;
  }
  *out = g;
  return LM_OK;
}

lm_status lm_gir_finish(lm_gir *b, int32_t root, lm_grammar **out) {
  lm_gir_view v;
  LM_TRY(lm_gir_view_make(b, &v));
  if (root < 0 || (uint32_t)root >= v.n_rules)
    return LM_ERRF(LM_ERR_INVALID, "grammar: no root rule");
  comp c = {.v = &v};
  flat f = {.c = &c};
  lm_status s = map_alts(&c);
  if (s != LM_OK) return s;
  c.prod = xcalloc(v.n_rules, 1);
  c.null = xcalloc(v.n_rules, 1);
  c.alt_live = xcalloc(c.n_alts, 1);
  f.newid = malloc(v.n_rules * sizeof *f.newid + 1);
  f.order = xcalloc(v.n_rules, sizeof *f.order);
  f.uses_ref = xcalloc(v.n_rules, sizeof *f.uses_ref);
  f.uses_rep = xcalloc(v.n_rules, sizeof *f.uses_rep);
  f.rule_off = xcalloc(v.n_rules + 1, sizeof *f.rule_off);
  if (!c.prod || !c.null || !c.alt_live || !f.newid || !f.order || !f.uses_ref || !f.uses_rep ||
      !f.rule_off) {
    s = LM_ERRF(LM_ERR_NOMEM, "grammar: out of memory");
    goto done;
  }
  memset(f.newid, 0xff, v.n_rules * sizeof *f.newid);
  s = fixpoint(&c, wait_prod, NULL, c.prod);
  if (s != LM_OK) goto done;
  if (!c.prod[root]) {
    s = LM_ERRF(LM_ERR_INVALID, "grammar: rule '%s' matches no finite string", v.names[root]);
    goto done;
  }
  mark_live(&c);
  s = fixpoint(&c, wait_null, c.alt_live, c.null);
  if (s == LM_OK) s = flatten(&f, (uint32_t)root);
  if (s == LM_OK) s = build(&c, &f, (uint32_t)root, out);
done:
  free(c.alt_rule);
  free(c.prod);
  free(c.null);
  free(c.alt_live);
  free(f.newid);
  free(f.order);
  free(f.uses_ref);
  free(f.uses_rep);
  free(f.el);
  free(f.alt_start);
  free(f.rule_off);
  return s;
}
