/* cli_logits.c — `lumen logits`: teacher-forced logits of a token sequence, fed as a prefill
 * (in one pass or in chunks) followed by token-by-token decode through the caches. */
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "cli/cli.h"
#include "cli/cli_adapter.h"
#include "cli/cli_args.h"
#include "cli/cli_common.h"
#include "model/forward.h"
#include "model/kv_plan.h"

static const char *logits_help =
    "usage: lumen logits MODEL_DIR --ids 2,17,... [options]\n"
    "       (MODEL_DIR may be ORG/REPO[@REV]: a model in the Hugging Face cache, see `lumen get`)\n"
    "\n"
    "Feeds the ids teacher-forced and writes the logits of every position as little-endian\n"
    "float32 [T, V]; prints a one-line JSON summary (T, V, timings) on stderr.\n"
    "\n"
    "  --ids LIST        comma-separated token ids (required)\n"
    "  --prefill N       prefill the first N ids (default: all), then decode the rest one by one\n"
    "  --chunk C         prefill in chunks of C tokens (default: the whole prefill at once)\n"
    "  --out FILE        where to write the logits ('-' = stdout; default: none)\n"
    "  --backend B       cpu or cuda (default: cuda when this build has it and a GPU is present)\n"
    "  --precision P     f32 (default: the parity path), fast, or bf16 (on the CPU: f32 math "
    "rounded\n"
    "                    to bf16 where the CUDA fast path stores bf16, to study its numerics "
    "anywhere)\n"
    "  --threads N       CPU threads (default: all)\n"
    "  --adapter P[@W]   apply the LoRA adapter in directory P (PEFT or mlx-lm) with weight W\n"
    "                    (default 1); repeat to stack several\n";

typedef struct logits_opts {
  const char *model, *ids, *out;
  int64_t prefill, chunk;
  lm_cli_backend_opts be;
  lm_kv_options kv;
  lm_cli_adapters ad;
} logits_opts;

static int parse(int argc, char **argv, logits_opts *o) {
  static const struct option lo[] = {{"ids", 1, 0, 'i'},       {"prefill", 1, 0, 'p'},
                                     {"chunk", 1, 0, 'c'},     {"out", 1, 0, 'o'},
                                     {"backend", 1, 0, 'b'},   {"precision", 1, 0, 'P'},
                                     {"threads", 1, 0, 't'},   {"help", 0, 0, 'h'},
                                     {"kv-quant", 1, 0, 'q'},  {"kv-group", 1, 0, 'g'},
                                     {"kv-config", 1, 0, 'K'}, {"kv-quant-start", 1, 0, 'S'},
                                     {"adapter", 1, 0, 'A'},   {0, 0, 0, 0}};
  memset(o, 0, sizeof *o);
  o->prefill = o->chunk = -1;
  int c;
  optind = 1;
  while ((c = getopt_long(argc, argv, ":h", lo, NULL)) != -1) {
    switch (c) {
    case 'i': o->ids = optarg; break;
    case 'p': o->prefill = atoll(optarg); break;
    case 'c': o->chunk = atoll(optarg); break;
    case 'o': o->out = optarg; break;
    case 'b': o->be.backend = optarg; break;
    case 'P': o->be.precision = optarg; break;
    case 't': o->be.threads = atoi(optarg); break;
    case 'q': o->kv.mode = optarg; break;
    case 'g': o->kv.group = atoi(optarg); break;
    case 'K': o->kv.config_path = optarg; break;
    case 'S': o->kv.quant_start = atoll(optarg); break;
    case 'A':
      if (lm_cli_adapters_add(&o->ad, optarg)) return 2;
      break;
    case 'h': fputs(logits_help, stdout); return 0;
    default: return lm_cli_flag_error(c, argc, argv, lo);
    }
  }
  if (optind != argc - 1 || !o->ids) {
    fputs(logits_help, stderr);
    return 2;
  }
  o->model = argv[optind];
  return -1;
}

static int run(const logits_opts *o, lm_model *m, lm_backend *be, const int32_t *ids, int64_t T) {
  int64_t V = m->cfg.vocab_size, P = o->prefill < 0 ? T : o->prefill;
  if (P > T) P = T;
  int64_t C = o->chunk > 0 ? o->chunk : (P > 0 ? P : 1);
  for (int64_t i = 0; i < T; i++)
    if (ids[i] >= V) {
      fprintf(stderr, "lumen: --ids: id %d at position %lld is outside the vocabulary (%lld)\n",
              ids[i], (long long)i, (long long)V);
      return 1;
    }
  float *logits = malloc((size_t)T * (size_t)V * sizeof(float));
  lm_kv_spec specs[m->cfg.n_caches + 1];
  lm_kv_set *kv = NULL;
  lm_forward *f = NULL;
  int rc = 1;
  if (!logits) {
    fprintf(stderr, "lumen: out of memory for %lld x %lld logits\n", (long long)T, (long long)V);
    return 1;
  }
  if (lm_model_kv_plan(m, &o->kv, specs) || lm_kv_set_create(be, specs, m->cfg.n_caches, &kv) ||
      lm_forward_create(m, be, C, C, &f) || lm_forward_set_adapters(f, o->ad.set, o->ad.n)) {
    lm_cli_fail(NULL);
    goto done;
  }
  double t0 = lm_cli_now();
  if (P && lm_forward_feed(f, kv, ids, P, C, logits)) {
    lm_cli_fail("prefill");
    goto done;
  }
  double t1 = lm_cli_now();
  if (T > P && lm_forward_feed(f, kv, ids + P, T - P, 1, logits + P * V)) {
    lm_cli_fail("decode");
    goto done;
  }
  double t2 = lm_cli_now();
  if (o->out) {
    FILE *fo = !strcmp(o->out, "-") ? stdout : fopen(o->out, "wb");
    int ok = fo && fwrite(logits, sizeof(float), (size_t)(T * V), fo) == (size_t)(T * V);
    if (fo && fo != stdout) ok = (fclose(fo) == 0) && ok;
    if (!ok) {
      fprintf(stderr, "lumen: cannot write %s\n", o->out);
      goto done;
    }
  }
  fprintf(stderr,
          "{\"T\":%lld,\"V\":%lld,\"prefill_tokens\":%lld,\"chunk\":%lld,\"decode_tokens\":%lld,"
          "\"prefill_s\":%.6f,\"decode_s\":%.6f,\"backend\":\"%s\"}\n",
          (long long)T, (long long)V, (long long)P, (long long)C, (long long)(T - P), t1 - t0,
          t2 - t1, be->ops->name);
  rc = 0;
done:
  lm_forward_free(f);
  lm_kv_set_free(kv);
  free(logits);
  return rc;
}

int lm_cli_logits(int argc, char **argv) {
  logits_opts o;
  int pr = parse(argc, argv, &o);
  if (pr >= 0) return pr;
  int32_t *ids;
  int64_t T;
  if (lm_cli_parse_ids(o.ids, &ids, &T)) return 1;
  lm_model *m = lm_cli_load_model(o.model);
  lm_backend *be = m ? lm_cli_backend(&o.be, LM_PRECISION_F32) : NULL;
  if (be && lm_cli_prepare(m, be)) { /* device backends upload the weights once */
    lm_cli_fail("preparing the weights");
    lm_backend_destroy(be);
    be = NULL;
  }
  int rc = (m && be && !lm_cli_adapters_load(&o.ad, m)) ? run(&o, m, be, ids, T) : 1;
  lm_cli_adapters_free(&o.ad); /* before the backend: their copies are its memory */
  lm_backend_destroy(be);
  lm_model_free(m);
  free(ids);
  return rc;
}
