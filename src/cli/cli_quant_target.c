/* cli_quant_target.c — the --target-bpw flow of `lumen quantize` (see cli_quant_target.h). */
#include "cli/cli_quant_target.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "cli/cli_progress.h"
#include "model/quant_plan.h"

/* "2,3,4" into v (at most cap); 0 on success, else prints the error. */
static int parse_list(const char *flag, const char *s, int *v, int cap, int *n) {
  *n = 0;
  for (const char *p = s; *p;) {
    char *end;
    long x = strtol(p, &end, 10);
    if (end == p || *n == cap || (*end && *end != ','))
      return fprintf(stderr, "lumen quantize: %s '%s': want a comma-separated list\n", flag, s), 1;
    v[(*n)++] = (int)x;
    p = *end ? end + 1 : end;
  }
  return *n ? 0 : (fprintf(stderr, "lumen quantize: %s is empty\n", flag), 1);
}

static int parse_kinds(const lm_cli_qtarget *q, lm_qkind *k, int *nk) {
  int bits[8], groups[3], nb, ng;
  if (parse_list("--bits-set", q->bits_set, bits, 8, &nb) ||
      parse_list("--groups", q->groups, groups, 3, &ng))
    return 1;
  *nk = 0;
  for (int i = 0; i < nb; i++)
    for (int j = 0; j < ng; j++) {
      if (!lm_quantize_bits_ok(bits[i]) || !lm_quantize_group_ok(groups[j]))
        return fprintf(stderr,
                       "lumen quantize: %d bits / group %d: bits are 2, 3, 4, 5, 6 or 8; "
                       "groups 32, 64 or 128\n",
                       bits[i], groups[j]),
               1;
      k[(*nk)++] = (lm_qkind){bits[i], groups[j]};
    }
  return 0;
}

/* The calibration ids: --calib-ids, or --calib's text (or the default text) tokenized with the
 * model's tokenizer and its BOS; the first calib_tokens of them. */
static int calib_ids(const lm_model *m, const lm_cli_qtarget *q, int32_t **ids, int64_t *n) {
  char *text = NULL;
  const char *file = q->calib_ids ? q->calib_ids : q->calib;
  if (file && lm_cli_read_text(q->calib_ids ? "--calib-ids" : "--calib", file, &text)) return 1;
  int rc = 0;
  if (q->calib_ids) {
    rc = lm_cli_parse_ids(text, ids, n);
  } else if (!m->st) { /* a synthetic model has no tokenizer: seeded ids (a timing run) */
    if (!(*ids = malloc((size_t)q->calib_tokens * sizeof **ids)))
      return fprintf(stderr, "lumen quantize: out of memory\n"), 1;
    for (int64_t i = 0; i < q->calib_tokens; i++)
      (*ids)[i] = (int32_t)(3 + (uint64_t)(i * 2654435761u) % (uint64_t)(m->cfg.vocab_size - 3));
    *n = q->calib_tokens;
  } else {
    rc = lm_cli_encode_text("quantize", m->dir, text ? text : lm_cli_default_calib, ids, n);
  }
  free(text);
  if (rc) return 1;
  for (int64_t i = 0; i < *n; i++)
    if ((*ids)[i] < 0 || (*ids)[i] >= m->cfg.vocab_size)
      return fprintf(stderr, "lumen quantize: calibration id %d is outside the vocabulary\n",
                     (*ids)[i]),
             1;
  if (*n > q->calib_tokens) *n = q->calib_tokens;
  if (*n < 2) return fprintf(stderr, "lumen quantize: fewer than 2 calibration tokens\n"), 1;
  return 0;
}

/* The progress line of a sweep, with where its time has gone so far. */
typedef struct sweep_ui {
  lm_cli_progress pr;
  const lm_qsweep *t;
} sweep_ui;

static void on_sweep(void *ctx, int64_t done, int64_t total, const char *module) {
  sweep_ui *u = ctx;
  const lm_qsweep *t = u->t;
  (void)module;
  double all = t->s_quantize + t->s_exchange + t->s_forward + t->s_kl;
  if (all > 0)
    snprintf(u->pr.note, sizeof u->pr.note,
             "(quantizing %.0f%%, exchanging %.0f%%, forwards %.0f%%, KL %.0f%%)",
             100 * t->s_quantize / all, 100 * t->s_exchange / all, 100 * t->s_forward / all,
             100 * t->s_kl / all);
  u->pr.total = (double)total;
  lm_cli_progress_update(&u->pr, (double)done);
}

static int measure(lm_model *m, const lm_cli_qtarget *q, lm_qsweep *t) {
  lm_qkind kinds[LM_QSWEEP_MAX_KINDS];
  int nk;
  int32_t *ids = NULL;
  int64_t n = 0;
  if (parse_kinds(q, kinds, &nk) || calib_ids(m, q, &ids, &n)) return free(ids), 1;
  /* CUDA's f32 path converts every bf16 weight for every product: its sweep of E4B takes
   * hours; the fast path measures candidate and reference alike in bf16 */
  lm_precision prec =
      strcmp(lm_cli_backend_name(&q->be), "cuda") ? LM_PRECISION_F32 : LM_PRECISION_FAST;
  lm_backend *be = lm_cli_backend(&q->be, prec);
  if (be && lm_cli_prepare(m, be)) { /* a device backend holds its own copy */
    fprintf(stderr, "lumen quantize: preparing the weights: %s\n", lm_errmsg());
    lm_backend_destroy(be);
    be = NULL;
  }
  if (!be) return free(ids), 1;
  sweep_ui ui = {.t = t};
  lm_cli_progress_start(&ui.pr, "sensitivity", 0, "runs");
  ui.pr.after = 0; /* a sweep takes minutes: say so from the start */
  double t0 = lm_cli_now();
  lm_qsweep_opts so = {.kinds = kinds,
                       .n_kinds = nk,
                       .ids = ids,
                       .n_ids = n,
                       .chunk = n,
                       .progress = on_sweep,
                       .progress_ctx = &ui};
  lm_status s = lm_quant_sweep(m, be, &so, t);
  lm_cli_progress_end(&ui.pr);
  lm_backend_destroy(be);
  free(ids);
  if (s) return fprintf(stderr, "lumen quantize: sensitivity: %s\n", lm_errmsg()), 1;
  fprintf(stderr,
          "measured %d modules x %d kinds on %lld calibration tokens in %.1f s (quantizing %.1f s, "
          "exchanging %.1f s, forwards %.1f s, KL %.1f s)\n",
          t->n_rows, nk, (long long)n, lm_cli_now() - t0, t->s_quantize, t->s_exchange,
          t->s_forward, t->s_kl);
  return 0;
}

/* ---- the table as a file (--table / --from-table) -------------------------------------------- */

static int save_table(const lm_qsweep *t, const lm_qplan *p, double target, const char *path) {
  json_t *kinds = json_array(), *mods = json_array();
  for (int k = 0; k < t->n_kinds; k++)
    json_array_append_new(
        kinds, json_pack("{s:i,s:i}", "bits", t->kinds[k].bits, "group_size", t->kinds[k].group));
  for (int i = 0; i < t->n_rows; i++) {
    json_t *kl = json_array(), *by = json_array();
    for (int k = 0; k < t->n_kinds; k++) {
      json_array_append_new(kl, t->rows[i].kl[k] < 0 ? json_null() : json_real(t->rows[i].kl[k]));
      json_array_append_new(by, json_integer(t->rows[i].bytes[k]));
    }
    json_array_append_new(mods, json_pack("{s:s,s:I,s:o,s:o,s:i}", "module", t->rows[i].module,
                                          "params", (json_int_t)t->rows[i].params, "kl", kl,
                                          "bytes", by, "chosen", p->choice[i]));
  }
  json_t *root = json_pack("{s:s,s:I,s:o,s:o,s:f,s:f,s:f}", "format", "lumen-quant-sweep-1",
                           "calib_tokens", (json_int_t)t->calib_tokens, "kinds", kinds, "modules",
                           mods, "target_bpw", target, "bpw", p->bpw, "predicted_kl", p->kl_sum);
  int bad = !root || json_dump_file(root, path, JSON_INDENT(1));
  json_decref(root);
  if (bad) fprintf(stderr, "lumen quantize: --table %s: cannot write\n", path);
  return bad;
}

/* One module of a saved table onto row r (whose kinds are t's). Its bytes are not read: they
 * are the model's (check_table). */
static int load_row(json_t *mo, const lm_qsweep *t, lm_qsweep_row *r) {
  const char *name;
  json_int_t params;
  json_t *kl;
  if (json_unpack(mo, "{s:s,s:I,s:o}", "module", &name, "params", &params, "kl", &kl) ||
      !json_is_array(kl) || (int)json_array_size(kl) != t->n_kinds ||
      strlen(name) >= sizeof r->module || params < 1)
    return 1;
  memset(r, 0, sizeof *r);
  snprintf(r->module, sizeof r->module, "%s", name);
  r->params = params;
  for (int k = 0; k < t->n_kinds; k++) {
    json_t *v = json_array_get(kl, (size_t)k);
    r->kl[k] = json_is_null(v) ? -1 : json_number_value(v);
    if (!json_is_null(v) && (!json_is_number(v) || r->kl[k] < 0)) return 1;
  }
  return 0;
}

static int load_table(const char *path, lm_qsweep *t) {
  json_error_t e;
  json_t *root = json_load_file(path, 0, &e), *kinds, *mods;
  json_int_t ct;
  memset(t, 0, sizeof *t);
  if (!root) return fprintf(stderr, "lumen quantize: --from-table %s: %s\n", path, e.text), 1;
  int bad =
      json_unpack(root, "{s:I,s:o,s:o}", "calib_tokens", &ct, "kinds", &kinds, "modules", &mods) ||
      !json_is_array(kinds) || !json_is_array(mods) || json_array_size(kinds) < 1 ||
      json_array_size(kinds) > LM_QSWEEP_MAX_KINDS;
  t->n_kinds = bad ? 0 : (int)json_array_size(kinds);
  for (int k = 0; !bad && k < t->n_kinds; k++)
    bad = json_unpack(json_array_get(kinds, (size_t)k), "{s:i,s:i}", "bits", &t->kinds[k].bits,
                      "group_size", &t->kinds[k].group) ||
          !lm_quantize_bits_ok(t->kinds[k].bits) || !lm_quantize_group_ok(t->kinds[k].group);
  t->n_rows = bad ? 0 : (int)json_array_size(mods);
  t->rows = bad ? NULL : calloc((size_t)t->n_rows + 1, sizeof *t->rows);
  bad |= !t->rows;
  for (int i = 0; !bad && i < t->n_rows; i++)
    bad = load_row(json_array_get(mods, (size_t)i), t, &t->rows[i]);
  t->calib_tokens = ct;
  json_decref(root);
  if (bad) {
    lm_qsweep_free(t);
    return fprintf(stderr, "lumen quantize: --from-table %s: not a table `--table` wrote\n", path),
           1;
  }
  return 0;
}

/* Every row of the table must be a module of this model, with its size; the bytes of each kind
 * are computed again from the model (a file's numbers are not trusted with the budget). */
typedef struct match_ctx {
  lm_qsweep *t;
  int found;
  const char *missing;
} match_ctx;

static lm_status match_module(const lm_weight *w, const char *module, void *arg) {
  match_ctx *c = arg;
  int64_t params = (w->n_experts ? w->n_experts : 1) * w->rows * w->cols;
  for (int i = 0; i < c->t->n_rows; i++) {
    lm_qsweep_row *r = &c->t->rows[i];
    if (strcmp(r->module, module)) continue;
    if (r->params != params) return LM_ERRF(LM_ERR_INVALID, "%s has another shape here", module);
    lm_qsweep_row_kinds(r, w, c->t->kinds, c->t->n_kinds); /* the model's bytes, not the file's */
    c->found++;
    return LM_OK;
  }
  c->missing = module;
  return LM_OK;
}

static int check_table(const lm_model *m, lm_qsweep *t, const char *path) {
  match_ctx c = {.t = t};
  lm_status s = lm_quantize_foreach_module(m, match_module, &c);
  if (s || c.missing || c.found != t->n_rows)
    return fprintf(stderr, "lumen quantize: --from-table %s was measured on another model (%s)\n",
                   path,
                   s           ? lm_errmsg()
                   : c.missing ? c.missing
                               : "extra modules"),
           1;
  return 0;
}

/* ---- the plan ------------------------------------------------------------------------------- */

static void print_plan(const lm_qsweep *t, const lm_qplan *p, double target) {
  int count[LM_QSWEEP_MAX_KINDS] = {0};
  printf("mean KL against the unquantized model, one module quantized at a time (bits/group):\n");
  printf("%-44s %10s", "module", "params");
  for (int k = 0; k < t->n_kinds; k++) {
    char h[16];
    snprintf(h, sizeof h, "%d/%d", t->kinds[k].bits, t->kinds[k].group);
    printf(" %9s", h);
  }
  printf("  chosen\n");
  for (int i = 0; i < t->n_rows; i++) {
    const lm_qsweep_row *r = &t->rows[i];
    printf("%-44s %10lld", r->module, (long long)r->params);
    for (int k = 0; k < t->n_kinds; k++)
      r->kl[k] < 0 ? printf(" %9s", "-") : printf(" %9.3g", r->kl[k]);
    printf("  %d/%d\n", t->kinds[p->choice[i]].bits, t->kinds[p->choice[i]].group);
    count[p->choice[i]]++;
  }
  printf("plan for --target-bpw %.3g: %.4f bits per weight, %lld bytes, predicted KL %.4g "
         "(the sum of the modules' KLs); modules per kind:",
         target, p->bpw, (long long)p->bytes, p->kl_sum);
  for (int k = 0; k < t->n_kinds; k++)
    if (count[k]) printf(" %d/%d x%d", t->kinds[k].bits, t->kinds[k].group, count[k]);
  printf("\n");
}

/* One exact rule per module; the default kind is the most common choice. */
static int plan_rules(const lm_qsweep *t, const lm_qplan *p, lm_quantize_opts *o) {
  int count[LM_QSWEEP_MAX_KINDS] = {0}, top = 0;
  for (int i = 0; i < t->n_rows; i++)
    if (++count[p->choice[i]] > count[top]) top = p->choice[i];
  lm_quantize_rule *rules = calloc((size_t)t->n_rows + 1, sizeof *rules);
  if (!rules) return fprintf(stderr, "lumen quantize: out of memory\n"), 1;
  for (int i = 0; i < t->n_rows; i++) {
    const lm_qkind *k = &t->kinds[p->choice[i]];
    rules[i] = (lm_quantize_rule){
        .pattern = strdup(t->rows[i].module), .bits = k->bits, .group = k->group, .exact = 1};
  }
  o->rules = rules;
  o->n_rules = t->n_rows;
  o->bits = t->kinds[top].bits;
  o->group = t->kinds[top].group;
  for (int i = 0; i < t->n_rows; i++)
    if (!rules[i].pattern) return fprintf(stderr, "lumen quantize: out of memory\n"), 1;
  return 0;
}

void lm_cli_qtarget_free_rules(lm_quantize_opts *o) {
  for (int i = 0; o->rules && i < o->n_rules; i++)
    free((char *)o->rules[i].pattern);
  free((lm_quantize_rule *)o->rules);
  o->rules = NULL;
  o->n_rules = 0;
}

int lm_cli_qtarget_plan(lm_model *m, const lm_cli_qtarget *q, lm_quantize_opts *o) {
  lm_qsweep t;
  lm_qplan p = {0};
  if (q->table_in ? load_table(q->table_in, &t) || check_table(m, &t, q->table_in)
                  : measure(m, q, &t))
    return q->table_in ? (lm_qsweep_free(&t), 1) : 1;
  int rc = 1;
  if (lm_quant_plan(&t, q->bpw, &p)) {
    fprintf(stderr, "lumen quantize: %s\n", lm_errmsg());
  } else {
    print_plan(&t, &p, q->bpw);
    fflush(stdout);
    rc = (q->table_out && save_table(&t, &p, q->bpw, q->table_out)) || plan_rules(&t, &p, o);
  }
  lm_qplan_free(&p);
  lm_qsweep_free(&t);
  return rc;
}
