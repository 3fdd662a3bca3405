/* cli_ls.c — `lumen ls`: the models of the Hugging Face cache, each with its revisions, size on
 * disk, architecture and quantization (from config.json), and whether lumen can run it: its
 * config is one lumen's loader accepts (model/config.c, model/quant_config.c) and its weights are
 * all there. */
#include <dirent.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/status.h"
#include "cli/cli.h"
#include "cli/cli_args.h"
#include "cli/cli_common.h"
#include "hub/hub.h"
#include "model/config.h"

static const char *ls_help =
    "usage: lumen ls [--json]\n"
    "\n"
    "Lists the models in the Hugging Face cache ($HF_HUB_CACHE, else $HF_HOME/hub, else\n"
    "~/.cache/huggingface/hub): name, revisions (ref and commit), size on disk, architecture,\n"
    "quantization (bits/group, or the weights' dtype) and whether lumen can run it — with the\n"
    "reason when not. The details come from the snapshot of main (else the first one).\n"
    "\n"
    "  --json    machine-readable output\n";

typedef struct ls_row {
  char arch[128], quant[64], reason[512], snapshot[4200];
  int runnable, has_tokenizer;
} ls_row;

static int file_ok(const char *dir, const char *name) {
  char p[4500];
  struct stat st;
  snprintf(p, sizeof p, "%s/%s", dir, name);
  return stat(p, &st) == 0 && S_ISREG(st.st_mode); /* follows the snapshot link to its blob */
}

/* torch_dtype/dtype spelled as lumen spells dtypes. */
static const char *dtype_name(const char *d) {
  if (!strcmp(d, "bfloat16")) return "bf16";
  if (!strcmp(d, "float16")) return "f16";
  if (!strcmp(d, "float32")) return "f32";
  return d;
}

static const char *str_at(const json_t *root, const char *key) {
  const json_t *tc = json_object_get(root, "text_config");
  const char *s = json_string_value(json_object_get(tc, key));
  return s ? s : json_string_value(json_object_get(root, key));
}

/* What config.json says of itself: architecture and quantization (or dtype). */
static void describe(const json_t *root, ls_row *r) {
  const char *a = json_string_value(json_array_get(json_object_get(root, "architectures"), 0));
  if (!a) a = json_string_value(json_object_get(root, "model_type"));
  snprintf(r->arch, sizeof r->arch, "%s", a ? a : "?");
  const json_t *q = json_object_get(root, "quantization");
  if (!q) q = json_object_get(root, "quantization_config");
  const json_t *bits = json_object_get(q, "bits"), *group = json_object_get(q, "group_size");
  const char *method = json_string_value(json_object_get(q, "quant_method"));
  const char *dt = str_at(root, "dtype");
  if (!dt) dt = str_at(root, "torch_dtype");
  if (json_is_integer(bits) && json_is_integer(group))
    snprintf(r->quant, sizeof r->quant, "q%lld/g%lld", (long long)json_integer_value(bits),
             (long long)json_integer_value(group));
  else
    snprintf(r->quant, sizeof r->quant, "%s", method ? method : dt ? dtype_name(dt) : "?");
}

/* The shards an index names must all be present (a --include may have left some out). */
static int shards_reason(const char *dir, const json_t *idx, char *why, size_t n) {
  const char *k;
  const json_t *v;
  json_object_foreach((json_t *)json_object_get(idx, "weight_map"), k, v) {
    const char *f = json_string_value(v);
    if (f && !file_ok(dir, f)) return snprintf(why, n, "weights shard %s is not downloaded", f), 1;
  }
  return 0;
}

static int weights_reason(const char *dir, char *why, size_t n) {
  char p[4500];
  snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
  json_t *idx = json_load_file(p, 0, NULL);
  if (idx) {
    int r = shards_reason(dir, idx, why, n);
    json_decref(idx);
    return r;
  }
  DIR *d = opendir(dir);
  struct dirent *e;
  size_t k;
  while (d && (e = readdir(d)))
    if ((k = strlen(e->d_name)) > 12 && !strcmp(e->d_name + k - 12, ".safetensors") &&
        file_ok(dir, e->d_name)) {
      closedir(d);
      return 0;
    }
  if (d) closedir(d);
  return snprintf(why, n, "no weights (*.safetensors) downloaded"), 1;
}

/* lumen's own parsers on the config; the reason is theirs, less the path they start with. */
static int config_reason(const char *dir, char *why, size_t n) {
  char path[4500];
  snprintf(path, sizeof path, "%s/config.json", dir);
  lm_model_config cfg;
  lm_quant_config q;
  lm_status s = lm_config_load(path, &cfg);
  if (!s) {
    lm_config_free(&cfg);
    s = lm_quant_config_parse(path, &q);
    if (!s) lm_quant_config_free(&q);
  }
  if (!s) return 0;
  const char *m = lm_errmsg();
  size_t pl = strlen(path);
  if (!strncmp(m, path, pl) && m[pl] == ':') m += pl + 1 + (m[pl + 1] == ' ');
  snprintf(why, n, "%s", m);
  lm_err_clear();
  return 1;
}

static void inspect(const lm_hub_cached *c, ls_row *r) {
  memset(r, 0, sizeof *r);
  snprintf(r->arch, sizeof r->arch, "?");
  snprintf(r->quant, sizeof r->quant, "?");
  if (!c->n_revs) {
    snprintf(r->reason, sizeof r->reason, "no snapshot (an unfinished download)");
    return;
  }
  snprintf(r->snapshot, sizeof r->snapshot, "%s/snapshots/%s", c->dir, c->revs[0].commit);
  char path[4500];
  snprintf(path, sizeof path, "%s/config.json", r->snapshot);
  json_t *root = json_load_file(path, 0, NULL);
  if (!root) {
    snprintf(r->reason, sizeof r->reason, "no readable config.json");
    return;
  }
  describe(root, r);
  json_decref(root);
  r->has_tokenizer = file_ok(r->snapshot, "tokenizer.json");
  r->runnable = !config_reason(r->snapshot, r->reason, sizeof r->reason) &&
                !weights_reason(r->snapshot, r->reason, sizeof r->reason);
}

static void revs_text(const lm_hub_cached *c, char *buf, size_t n) {
  size_t k = 0;
  buf[0] = '\0';
  for (size_t i = 0; i < c->n_revs && k < n; i++) {
    const lm_hub_rev *v = &c->revs[i];
    int w = v->name[0] ? snprintf(buf + k, n - k, "%s%s (%.8s)", i ? ", " : "", v->name, v->commit)
                       : snprintf(buf + k, n - k, "%s%.8s", i ? ", " : "", v->commit);
    if (w < 0) break;
    k += (size_t)w;
  }
  if (!c->n_revs) snprintf(buf, n, "-");
}

static void print_text(const lm_hub_cache_list *l) {
  printf("%-36s %-24s %10s  %-32s %-8s %s\n", "MODEL", "REVISIONS", "SIZE", "ARCHITECTURE", "QUANT",
         "RUNNABLE");
  for (size_t i = 0; i < l->n; i++) {
    const lm_hub_cached *c = &l->repos[i];
    ls_row r;
    char revs[1024];
    inspect(c, &r);
    revs_text(c, revs, sizeof revs);
    printf("%-36s %-24s %7.1f MB  %-32s %-8s %s%s%s%s\n", c->id, revs, (double)c->size / 1e6,
           r.arch, r.quant, r.runnable ? "yes" : "no: ", r.runnable ? "" : r.reason,
           r.runnable && !r.has_tokenizer ? " (ids only: no tokenizer.json)" : "",
           c->partial ? " [a download is unfinished]" : "");
  }
}

static json_t *row_json(const lm_hub_cached *c) {
  ls_row r;
  inspect(c, &r);
  json_t *revs = json_array();
  for (size_t i = 0; i < c->n_revs; i++)
    json_array_append_new(revs, json_pack("{s:s?,s:s}", "ref",
                                          c->revs[i].name[0] ? c->revs[i].name : NULL, "commit",
                                          c->revs[i].commit));
  return json_pack("{s:s,s:s,s:s?,s:o,s:I,s:b,s:s,s:s,s:b,s:s?,s:b}", "id", c->id, "path", c->dir,
                   "snapshot", r.snapshot[0] ? r.snapshot : NULL, "revisions", revs, "size_bytes",
                   (json_int_t)c->size, "partial", c->partial, "architecture", r.arch,
                   "quantization", r.quant, "runnable", r.runnable, "reason",
                   r.runnable ? NULL : r.reason, "tokenizer", r.has_tokenizer);
}

int lm_cli_ls(int argc, char **argv) {
  static const struct option lo[] = {{"json", 0, 0, 'j'}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
  int json = 0, c;
  optind = 1;
  while ((c = getopt_long(argc, argv, ":h", lo, NULL)) != -1) {
    if (c == 'j')
      json = 1;
    else if (c == 'h')
      return fputs(ls_help, stdout), 0;
    else
      return lm_cli_flag_error(c, argc, argv, lo);
  }
  if (optind != argc) return fputs(ls_help, stderr), 2;
  lm_hub_cache_list l;
  if (lm_hub_scan(&l)) return lm_cli_fail("ls");
  if (json) {
    json_t *a = json_array();
    for (size_t i = 0; i < l.n; i++)
      json_array_append_new(a, row_json(&l.repos[i]));
    char *s = json_dumps(a, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    puts(s ? s : "[]");
    free(s);
    json_decref(a);
  } else if (!l.n) {
    fprintf(stderr, "lumen ls: no models in %s (lumen get ORG/REPO downloads one)\n", l.root);
  } else {
    print_text(&l);
  }
  lm_hub_cache_list_free(&l);
  return 0;
}
