/* cli_kv_eval.c — `lumen kv-eval`: the quality cost of each KV-cache choice. Teacher-forces
 * a token sequence through plain caches and through each quantized plan, and reports the
 * mean KL(plain ‖ quantized) of the next-token distributions, argmax agreement, and the KV
 * bytes held at the end. A measurement program, not a test. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "cli/cli.h"
#include "cli/cli_args.h"
#include "cli/cli_common.h"
#include "cli/cli_kv_plan.h"
#include "cli/cli_progress.h"
#include "model/forward.h"
#include "model/kv_plan.h"
#include "model/logit_stats.h"

static const char *kv_eval_help =
    "usage: lumen kv-eval MODEL_DIR --ids-file FILE [--chunk C] [--kv-group G] [options]\n"
    "       (MODEL_DIR may be ORG/REPO[@REV]: a model in the Hugging Face cache, see `lumen get`)\n"
    "\n"
    "Feeds the comma-separated ids of FILE (prefill in chunks of C, default 64) with plain caches "
    "and\n"
    "with --kv-quant 8, 4, turboquant:8:3, turboquant:8:4, turboquant:4:3 (where the full layers'\n"
    "head dims allow) and config (when MODEL_DIR has a kv_config.json), and prints for each "
    "the mean\n"
    "KL(plain || quantized) over positions, argmax agreement and the KV bytes held at the end.\n"
    "  --backend B, --precision f32|fast|bf16 (default f32), --threads N as elsewhere\n"
    "\n"
    "A KV plan by measurement:\n"
    "  --write-config FILE   measure each donor cache's KL at each --kinds kind with only that\n"
    "                        cache quantized, choose per cache (plain or a kind) the least total\n"
    "                        KL within the budget, write FILE as kv_config.json ([{layer_idx,\n"
    "                        bits, group_size}], what --kv-quant config reads), and measure it\n"
    "  --target-bytes-per-token N   the budget: KV bytes per token over every cache, plain caches\n"
    "                        at the backend's activation size (f32 on the cpu)\n"
    "  --max-kl K            instead: the fewest bytes whose predicted KL is within K\n"
    "  --kinds LIST          candidates, BITS:GROUP (default 8:64,4:64,4:32)\n";

/* Feeds ids through caches of these specs, chunk by chunk so the progress line moves (a fed
 * chunk leaves the caches exactly as one feed of the whole sequence would). */
lm_status lm_cli_kv_feed(lm_model *m, lm_backend *be, const lm_kv_spec *specs, const int32_t *ids,
                         int64_t T, int64_t C, float *out, int64_t *bytes, lm_cli_progress *pr) {
  lm_kv_set *kv = NULL;
  lm_forward *f = NULL;
  lm_status s = lm_kv_set_create(be, specs, m->cfg.n_caches, &kv);
  if (!s) s = lm_forward_create(m, be, C, C, &f);
  int64_t V = m->cfg.vocab_size;
  double base = pr ? pr->done : 0;
  for (int64_t i = 0; !s && i < T; i += C) {
    int64_t n = T - i < C ? T - i : C;
    s = lm_forward_feed(f, kv, ids + i, n, C, out + i * V);
    if (pr) lm_cli_progress_update(pr, base + (double)(i + n));
  }
  if (!s && bytes) *bytes = lm_kv_set_bytes(kv);
  lm_forward_free(f);
  lm_kv_set_free(kv);
  return s;
}

/* The same through one cache plan. */
static lm_status run_plan(lm_model *m, lm_backend *be, const lm_kv_options *ko, const int32_t *ids,
                          int64_t T, int64_t C, float *out, int64_t *bytes, lm_cli_progress *pr) {
  lm_kv_spec specs[m->cfg.n_caches + 1];
  LM_TRY(lm_model_kv_plan(m, ko, specs));
  return lm_cli_kv_feed(m, be, specs, ids, T, C, out, bytes, pr);
}

int lm_cli_kv_eval(int argc, char **argv) {
  static const struct option lo[] = {
      {"ids-file", 1, 0, 'i'}, {"chunk", 1, 0, 'c'},        {"kv-group", 1, 0, 'g'},
      {"backend", 1, 0, 'b'},  {"precision", 1, 0, 'P'},    {"threads", 1, 0, 't'},
      {"help", 0, 0, 'h'},     {"write-config", 1, 0, 'w'}, {"target-bytes-per-token", 1, 0, 'B'},
      {"max-kl", 1, 0, 'K'},   {"kinds", 1, 0, 'k'},        {0, 0, 0, 0}};
  lm_cli_kv_plan_opts po = {.max_kl = -1, .kinds = "8:64,4:64,4:32"};
  const char *file = NULL;
  int64_t C = 64;
  int group = 64, c;
  lm_cli_backend_opts bo = {0};
  optind = 1;
  while ((c = getopt_long(argc, argv, ":h", lo, NULL)) != -1) {
    switch (c) {
    case 'i': file = optarg; break;
    case 'c': C = atoll(optarg); break;
    case 'g': group = atoi(optarg); break;
    case 'b': bo.backend = optarg; break;
    case 'P': bo.precision = optarg; break;
    case 't': bo.threads = atoi(optarg); break;
    case 'h': return fputs(kv_eval_help, stdout), 0;
    case 'w': po.out = optarg; break;
    case 'B': po.target_bpt = atoll(optarg); break;
    case 'K': po.max_kl = atof(optarg); break;
    case 'k': po.kinds = optarg; break;
    default: return lm_cli_flag_error(c, argc, argv, lo);
    }
  }
  if (optind != argc - 1 || !file || C < 1) return fputs(kv_eval_help, stderr), 2;
  if (!po.out != (po.target_bpt <= 0 && po.max_kl < 0) || (po.target_bpt > 0 && po.max_kl >= 0))
    return fprintf(stderr, "lumen kv-eval: --write-config wants one of --target-bytes-per-token N "
                           "(N > 0) or --max-kl K, and they want --write-config\n"),
           2;
  FILE *fi = fopen(file, "rb");
  if (!fi) return fprintf(stderr, "lumen kv-eval: --ids-file %s: %s\n", file, strerror(errno)), 1;
  static char buf[1 << 22];
  size_t n = fread(buf, 1, sizeof buf - 1, fi);
  fclose(fi);
  buf[n] = '\0';
  while (n && (buf[n - 1] == '\n' || buf[n - 1] == ' '))
    buf[--n] = '\0';
  int32_t *ids;
  int64_t T;
  if (lm_cli_parse_ids(buf, &ids, &T)) return 1;
  lm_model *m = lm_cli_load_model(argv[optind]);
  lm_backend *be = m ? lm_cli_backend(&bo, LM_PRECISION_F32) : NULL;
  if (be && lm_cli_prepare(m, be)) { /* device backends upload the weights once */
    lm_cli_fail("prepare");
    lm_backend_destroy(be);
    be = NULL;
  }
  int64_t V = m ? m->cfg.vocab_size : 0, bytes = 0;
  float *ref = m ? malloc((size_t)(T * V) * sizeof(float)) : NULL,
        *got = m ? malloc((size_t)(T * V) * sizeof(float)) : NULL;
  int rc = 1;
  if (!be || !ref || !got) goto done;
  lm_cli_progress pr;
  static const char *modes[] = {
      "8", "4", "turboquant:8:3", "turboquant:8:4", "turboquant:4:3", "config",
  };
  const int n_modes = (int)(sizeof modes / sizeof *modes);
  lm_cli_progress_start(&pr, "kv-eval", (double)(n_modes + 1) * (double)T, "tok");
  if (run_plan(m, be, &(lm_kv_options){.mode = "off"}, ids, T, C, ref, &bytes, &pr)) {
    lm_cli_fail("plain caches");
    goto done;
  }
  lm_cli_progress_clear(&pr);
  printf("%lld tokens, chunk %lld\n%-15s mean KL %-10s argmax %-9s KV bytes held\n%-15s %-18s "
         "%-16s %lld\n",
         (long long)T, (long long)C, "plan", "", "", "off", "0", "all", (long long)bytes);
  fflush(stdout);
  for (int i = 0; i < n_modes; i++) {
    pr.done = (double)(i + 1) * (double)T;
    if (run_plan(m, be, &(lm_kv_options){.mode = modes[i], .group = group}, ids, T, C, got, &bytes,
                 &pr)) {
      lm_cli_progress_clear(&pr);
      if (strcmp(modes[i], "config")) printf("%-15s failed: %s\n", modes[i], lm_errmsg());
      continue;
    }
    double kl;
    int64_t agree;
    lm_logits_kl(ref, got, T, V, &kl, &agree);
    lm_cli_progress_clear(&pr);
    printf("%-15s %-18.4g %lld/%-13lld %lld\n", modes[i], kl, (long long)agree, (long long)T,
           (long long)bytes);
    fflush(stdout);
  }
  lm_cli_progress_end(&pr);
  rc = po.out ? lm_cli_kv_write_plan(m, be, ids, T, C, ref, &po) : 0;
done:
  free(ref);
  free(got);
  free(ids);
  lm_backend_destroy(be);
  lm_model_free(m);
  return rc;
}
