/* cli_kv_plan.c — KV plans by measurement (see cli_kv_plan.h). */
#include "cli/cli_kv_plan.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/knapsack.h"
#include "model/forward.h"
#include "model/kv_plan.h"
#include "model/logit_stats.h"

#define LM_KVP_MAX_KINDS 8

typedef struct kv_kind {
  int bits, group; /* bits 0: plain */
} kv_kind;

/* "8:64,4:32" after the plain kind, which every plan may keep. */
static int parse_kinds(const char *s, kv_kind *k, int *n) {
  k[0] = (kv_kind){0, 0};
  *n = 1;
  for (const char *p = s; *p && *n < LM_KVP_MAX_KINDS;) {
    int bits, group, used = 0;
    if (sscanf(p, "%d:%d%n", &bits, &group, &used) != 2 || (p[used] && p[used] != ',') ||
        (bits != 4 && bits != 8) || (group != 32 && group != 64 && group != 128))
      break;
    k[(*n)++] = (kv_kind){bits, group};
    p += used + (p[used] == ',');
    if (!*p) return 0;
  }
  fprintf(stderr,
          "lumen kv-eval: --kinds '%s': want BITS:GROUP,... (bits 4 or 8, groups 32, 64 or 128; "
          "at most %d)\n",
          s, LM_KVP_MAX_KINDS - 1);
  return 1;
}

typedef struct kv_table {
  int n, nk;
  kv_kind kinds[LM_KVP_MAX_KINDS];
  int64_t *cost; /* [n][nk] bytes per token; -1: the kind does not fit the cache */
  double *kl;    /* [n][nk] */
} kv_table;

/* Cache c alone at kind k: its KL against the plain caches (the plain kind costs nothing). */
static int measure_one(lm_model *m, lm_backend *be, const int32_t *ids, int64_t T, int64_t C,
                       const float *ref, float *got, kv_table *t, int c, int k) {
  lm_kv_spec specs[m->cfg.n_caches + 1];
  lm_model_kv_specs(m, specs);
  size_t at = (size_t)c * (size_t)t->nk + (size_t)k;
  if (k && lm_kv_spec_quantize(&specs[c], t->kinds[k].bits, t->kinds[k].group, "kv plan")) {
    t->cost[at] = -1; /* a group that does not divide this cache's head dim */
    return 0;
  }
  t->cost[at] = lm_kv_spec_bytes_per_token(&specs[c], be->act_dtype);
  t->kl[at] = 0;
  if (!k) return 0;
  if (lm_cli_kv_feed(m, be, specs, ids, T, C, got, NULL, NULL))
    return fprintf(stderr, "lumen kv-eval: cache %d: %s\n", c, lm_errmsg()), 1;
  int64_t agree;
  lm_logits_kl(ref, got, T, m->cfg.vocab_size, &t->kl[at], &agree);
  return 0;
}

static int measure(lm_model *m, lm_backend *be, const int32_t *ids, int64_t T, int64_t C,
                   const float *ref, kv_table *t) {
  float *got = malloc((size_t)(T * m->cfg.vocab_size) * sizeof(float));
  if (!got) return fprintf(stderr, "lumen kv-eval: out of memory\n"), 1;
  lm_cli_progress pr;
  lm_cli_progress_start(&pr, "kv plan", (double)(t->n * (t->nk - 1)), "runs");
  int rc = 0;
  for (int c = 0; !rc && c < t->n; c++)
    for (int k = 0; !rc && k < t->nk; k++) {
      rc = measure_one(m, be, ids, T, C, ref, got, t, c, k);
      if (k) lm_cli_progress_update(&pr, (double)(c * (t->nk - 1) + k));
    }
  lm_cli_progress_end(&pr);
  free(got);
  return rc;
}

static void print_table(const lm_model *m, const kv_table *t, const lm_knapsack_result *r) {
  printf("KV plan: mean KL with one cache quantized at a time (bytes per token in brackets)\n");
  printf("%-8s %-6s", "cache", "layer");
  for (int k = 0; k < t->nk; k++) {
    char h[24];
    snprintf(h, sizeof h, k ? "kv%d g%d" : "plain", t->kinds[k].bits, t->kinds[k].group);
    printf(" %18s", h);
  }
  printf("  chosen\n");
  for (int c = 0; c < t->n; c++) {
    printf("%-8d %-6d", c, m->cfg.cache_layer[c]);
    for (int k = 0; k < t->nk; k++) {
      size_t at = (size_t)c * (size_t)t->nk + (size_t)k;
      char v[40];
      if (t->cost[at] < 0)
        snprintf(v, sizeof v, "-");
      else
        snprintf(v, sizeof v, "%.3g [%lld]", t->kl[at], (long long)t->cost[at]);
      printf(" %18s", v);
    }
    int k = r->choice[c];
    printf("  %s", k ? "" : "plain");
    if (k) printf("kv%d g%d", t->kinds[k].bits, t->kinds[k].group);
    printf("\n");
  }
}

static int write_config(const lm_model *m, const kv_table *t, const lm_knapsack_result *r,
                        const char *path) {
  json_t *a = json_array();
  for (int c = 0; c < t->n; c++) {
    const kv_kind *k = &t->kinds[r->choice[c]];
    if (k->bits)
      json_array_append_new(a, json_pack("{s:i,s:i,s:i}", "layer_idx", m->cfg.cache_layer[c],
                                         "bits", k->bits, "group_size", k->group));
  }
  int bad = json_dump_file(a, path, JSON_INDENT(2));
  json_decref(a);
  if (bad) fprintf(stderr, "lumen kv-eval: --write-config %s: cannot write\n", path);
  return bad;
}

/* The plan as the server would run it: read back from the file it was written to. */
static int measure_written(lm_model *m, lm_backend *be, const int32_t *ids, int64_t T, int64_t C,
                           const float *ref, const char *path) {
  lm_kv_spec specs[m->cfg.n_caches + 1];
  lm_kv_options ko = {.mode = "config", .config_path = path};
  float *got = malloc((size_t)(T * m->cfg.vocab_size) * sizeof(float));
  int64_t bytes = 0, agree;
  lm_status s = got ? lm_model_kv_plan(m, &ko, specs) : LM_ERRF(LM_ERR_NOMEM, "out of memory");
  if (!s) s = lm_cli_kv_feed(m, be, specs, ids, T, C, got, &bytes, NULL);
  if (!s) {
    double kl;
    lm_logits_kl(ref, got, T, m->cfg.vocab_size, &kl, &agree);
    printf("%s as written: mean KL %.4g, argmax %lld/%lld, KV bytes held %lld\n", path, kl,
           (long long)agree, (long long)T, (long long)bytes);
  } else {
    fprintf(stderr, "lumen kv-eval: %s: %s\n", path, lm_errmsg());
  }
  free(got);
  return s != LM_OK;
}

static int solve(const kv_table *t, const lm_cli_kv_plan_opts *o, lm_knapsack_result *r) {
  int64_t most = 0;
  for (int c = 0; c < t->n; c++)
    most += t->cost[(size_t)c * (size_t)t->nk]; /* everything plain */
  lm_knapsack ks = {.n = t->n,
                    .nk = t->nk,
                    .cost = t->cost,
                    .value = t->kl,
                    .budget = o->max_kl >= 0 ? most : o->target_bpt,
                    .max_value = o->max_kl};
  if (!lm_knapsack_solve(&ks, r)) return 0;
  if (o->max_kl >= 0)
    fprintf(stderr, "lumen kv-eval: no plan keeps the predicted KL within %g\n", o->max_kl);
  else
    fprintf(stderr,
            "lumen kv-eval: --target-bytes-per-token %lld is below the smallest plan of "
            "these kinds\n",
            (long long)o->target_bpt);
  return 1;
}

int lm_cli_kv_write_plan(lm_model *m, lm_backend *be, const int32_t *ids, int64_t T, int64_t C,
                         const float *ref, const lm_cli_kv_plan_opts *o) {
  kv_table t = {.n = m->cfg.n_caches};
  if (parse_kinds(o->kinds, t.kinds, &t.nk)) return 1;
  t.cost = calloc((size_t)t.n * (size_t)t.nk + 1, sizeof *t.cost);
  t.kl = calloc((size_t)t.n * (size_t)t.nk + 1, sizeof *t.kl);
  lm_knapsack_result r = {0};
  int rc = !t.cost || !t.kl ? (fprintf(stderr, "lumen kv-eval: out of memory\n"), 1)
                            : measure(m, be, ids, T, C, ref, &t);
  if (!rc) rc = solve(&t, o, &r);
  if (!rc) {
    print_table(m, &t, &r);
    printf("plan: %lld KV bytes per token (%s activations for plain caches), predicted KL %.4g "
           "(the sum of the caches' KLs)\n",
           (long long)r.cost, lm_dtype_name(be->act_dtype), r.value);
    fflush(stdout);
    rc = write_config(m, &t, &r, o->out) || measure_written(m, be, ids, T, C, ref, o->out);
  }
  lm_knapsack_result_free(&r);
  free(t.cost);
  free(t.kl);
  return rc;
}
