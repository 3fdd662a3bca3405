/* grammar_ir.c — the IR builder: rules, alternatives, byte sets (interned, so equal sets share
 * an id and the compiled grammar stores each once). Limits are checked as the IR grows, so a
 * hostile schema or grammar is refused before it has cost much memory. */
#include "grammar/grammar_ir.h"

#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "base/status.h"

typedef struct gir_rule {
  char *name;
  lm_gseq *alts;
  uint32_t n_alts, cap_alts;
} gir_rule;

struct lm_gir {
  gir_rule *rules;
  uint32_t n_rules, cap_rules;
  lm_gset *sets;
  uint32_t n_sets, cap_sets;
  uint32_t *set_slot; /* open addressing: set id + 1, 0 = empty */
  uint32_t set_mask;
  size_t n_elems; /* elements in added alternatives and sequences under construction */
  /* the view's arrays */
  const char **v_names;
  uint32_t *v_off;
  lm_gseq *v_alts;
};

static lm_status grow(void **p, uint32_t *cap, uint32_t need, size_t elem) {
  if (need <= *cap) return LM_OK;
  uint32_t c = *cap ? *cap : 8;
  while (c < need)
    c *= 2;
  void *q = realloc(*p, (size_t)c * elem);
  if (!q) return LM_ERRF(LM_ERR_NOMEM, "grammar: out of memory");
  *p = q;
  *cap = c;
  return LM_OK;
}

lm_status lm_gir_create(lm_gir **out) {
  lm_gir *b = calloc(1, sizeof *b);
  if (!b) return LM_ERRF(LM_ERR_NOMEM, "grammar: out of memory");
  b->set_mask = 255;
  b->set_slot = calloc(256, sizeof *b->set_slot);
  if (!b->set_slot) {
    free(b);
    return LM_ERRF(LM_ERR_NOMEM, "grammar: out of memory");
  }
  *out = b;
  return LM_OK;
}

void lm_gir_free(lm_gir *b) {
  if (!b) return;
  for (uint32_t r = 0; r < b->n_rules; r++) {
    for (uint32_t a = 0; a < b->rules[r].n_alts; a++)
      free(b->rules[r].alts[a].e);
    free(b->rules[r].alts);
    free(b->rules[r].name);
  }
  free(b->rules);
  free(b->sets);
  free(b->set_slot);
  free(b->v_names);
  free(b->v_off);
  free(b->v_alts);
  free(b);
}

lm_status lm_gir_rule(lm_gir *b, const char *name, int32_t *id) {
  if (b->n_rules >= LM_G_MAX_RULES)
    return LM_ERRF(LM_ERR_INVALID, "grammar: more than %u rules", LM_G_MAX_RULES);
  LM_TRY(grow((void **)&b->rules, &b->cap_rules, b->n_rules + 1, sizeof *b->rules));
  gir_rule *r = &b->rules[b->n_rules];
  memset(r, 0, sizeof *r);
  r->name = strdup(name ? name : "");
  if (!r->name) return LM_ERRF(LM_ERR_NOMEM, "grammar: out of memory");
  *id = (int32_t)b->n_rules++;
  return LM_OK;
}

const char *lm_gir_rule_name(const lm_gir *b, int32_t id) { return b->rules[id].name; }
uint32_t lm_gir_rule_alts(const lm_gir *b, int32_t id) { return b->rules[id].n_alts; }

static uint64_t set_hash(const lm_gset *s) {
  return lm_mix64(s->w[0] ^ lm_mix64(s->w[1] ^ lm_mix64(s->w[2] ^ lm_mix64(s->w[3]))));
}

static lm_status set_rehash(lm_gir *b) {
  uint32_t n = (b->set_mask + 1) * 2;
  uint32_t *slot = calloc(n, sizeof *slot);
  if (!slot) return LM_ERRF(LM_ERR_NOMEM, "grammar: out of memory");
  for (uint32_t i = 0; i < b->n_sets; i++) {
    uint32_t h = (uint32_t)set_hash(&b->sets[i]) & (n - 1);
    while (slot[h])
      h = (h + 1) & (n - 1);
    slot[h] = i + 1;
  }
  free(b->set_slot);
  b->set_slot = slot;
  b->set_mask = n - 1;
  return LM_OK;
}

/* The id of `s`, adding it when new. */
static lm_status set_id(lm_gir *b, const lm_gset *s, uint32_t *id) {
  uint32_t h = (uint32_t)set_hash(s) & b->set_mask;
  while (b->set_slot[h]) {
    uint32_t i = b->set_slot[h] - 1;
    if (!memcmp(&b->sets[i], s, sizeof *s)) {
      *id = i;
      return LM_OK;
    }
    h = (h + 1) & b->set_mask;
  }
  LM_TRY(grow((void **)&b->sets, &b->cap_sets, b->n_sets + 1, sizeof *b->sets));
  b->sets[b->n_sets] = *s;
  b->set_slot[h] = b->n_sets + 1;
  *id = b->n_sets++;
  if (b->n_sets * 2 > b->set_mask) LM_TRY(set_rehash(b));
  return LM_OK;
}

static lm_status seq_push(lm_gir *b, lm_gseq *s, lm_gelem e) {
  if (b->n_elems >= LM_G_MAX_ELEMS)
    return LM_ERRF(LM_ERR_INVALID, "grammar: too large (more than %u elements)", LM_G_MAX_ELEMS);
  LM_TRY(grow((void **)&s->e, &s->cap, s->n + 1, sizeof *s->e));
  s->e[s->n++] = e;
  b->n_elems++;
  return LM_OK;
}

lm_status lm_gseq_set(lm_gir *b, lm_gseq *s, const lm_gset *set) {
  uint32_t id;
  LM_TRY(set_id(b, set, &id));
  return seq_push(b, s, (lm_gelem){LM_GK_TERM, id, 0, 0});
}

lm_status lm_gseq_byte(lm_gir *b, lm_gseq *s, uint8_t c) {
  lm_gset set = {{0}};
  lm_gset_add(&set, c);
  return lm_gseq_set(b, s, &set);
}

lm_status lm_gseq_lit(lm_gir *b, lm_gseq *s, const char *bytes, size_t n) {
  for (size_t i = 0; i < n; i++)
    LM_TRY(lm_gseq_byte(b, s, (uint8_t)bytes[i]));
  return LM_OK;
}

lm_status lm_gseq_ref(lm_gir *b, lm_gseq *s, int32_t rule) {
  return seq_push(b, s, (lm_gelem){LM_GK_REF, (uint32_t)rule, 0, 0});
}

lm_status lm_gseq_repeat(lm_gir *b, lm_gseq *s, int32_t rule, uint32_t min, uint32_t max) {
  if (max < min) return LM_ERRF(LM_ERR_INVALID, "grammar: repetition {%u,%u}: max < min", min, max);
  if (max == 0) return LM_OK;
  if (min == 1 && max == 1) return lm_gseq_ref(b, s, rule);
  return seq_push(b, s, (lm_gelem){LM_GK_REPEAT, (uint32_t)rule, min, max});
}

lm_status lm_gseq_cat(lm_gir *b, lm_gseq *s, const lm_gseq *src) {
  for (uint32_t i = 0; i < src->n; i++)
    LM_TRY(seq_push(b, s, src->e[i]));
  return LM_OK;
}

void lm_gseq_free(lm_gseq *s) {
  free(s->e);
  memset(s, 0, sizeof *s);
}

lm_status lm_gir_add_alt(lm_gir *b, int32_t rule, lm_gseq *s) {
  gir_rule *r = &b->rules[rule];
  /* The alternative's END counts against the limit too: a million empty alternatives cost. */
  if (b->n_elems >= LM_G_MAX_ELEMS)
    return LM_ERRF(LM_ERR_INVALID, "grammar: too large (more than %u elements)", LM_G_MAX_ELEMS);
  b->n_elems++;
  LM_TRY(grow((void **)&r->alts, &r->cap_alts, r->n_alts + 1, sizeof *r->alts));
  r->alts[r->n_alts++] = *s;
  memset(s, 0, sizeof *s);
  return LM_OK;
}

lm_status lm_gir_wrap(lm_gir *b, const char *name, lm_gseq *s, int32_t *id) {
  LM_TRY(lm_gir_rule(b, name, id));
  return lm_gir_add_alt(b, *id, s);
}

lm_status lm_gir_set_rule(lm_gir *b, const char *name, const lm_gset *set, int32_t *id) {
  lm_gseq s = {0};
  lm_status st = lm_gseq_set(b, &s, set);
  if (st == LM_OK) st = lm_gir_wrap(b, name, &s, id);
  lm_gseq_free(&s);
  return st;
}

lm_status lm_gir_view_make(lm_gir *b, lm_gir_view *v) {
  free(b->v_names);
  free(b->v_off);
  free(b->v_alts);
  size_t n_alts = 0;
  for (uint32_t r = 0; r < b->n_rules; r++)
    n_alts += b->rules[r].n_alts;
  b->v_names = malloc((b->n_rules + 1) * sizeof *b->v_names);
  b->v_off = malloc((b->n_rules + 1) * sizeof *b->v_off);
  b->v_alts = malloc((n_alts + 1) * sizeof *b->v_alts);
  if (!b->v_names || !b->v_off || !b->v_alts)
    return LM_ERRF(LM_ERR_NOMEM, "grammar: out of memory");
  uint32_t k = 0;
  for (uint32_t r = 0; r < b->n_rules; r++) {
    b->v_names[r] = b->rules[r].name;
    b->v_off[r] = k;
    for (uint32_t a = 0; a < b->rules[r].n_alts; a++)
      b->v_alts[k++] = b->rules[r].alts[a];
  }
  b->v_off[b->n_rules] = k;
  v->n_rules = b->n_rules;
  v->names = b->v_names;
  v->rule_alt_off = b->v_off;
  v->alts = b->v_alts;
  v->sets = b->sets;
  v->n_sets = b->n_sets;
  return LM_OK;
}
