/* cli_quantize.c — `lumen quantize`: bf16 checkpoint → MLX affine-quantized checkpoint. */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/status.h"
#include "cli/cli.h"
#include "cli/cli_args.h"
#include "cli/cli_common.h"
#include "cli/cli_progress.h"
#include "cli/cli_quant_target.h"
#include "model/quantize.h"

static const char *quantize_help =
    "usage: lumen quantize SRC_DIR OUT_DIR [--bits B] [--group G] [--set PATTERN=BITS[/GROUP]]... "
    "[--keep PATTERN]...\n"
    "       lumen quantize SRC_DIR OUT_DIR --target-bpw B [options below]\n"
    "       lumen quantize --preset FILE --target-bpw B [--table FILE] (measure and plan only)\n"
    "       (SRC_DIR may be ORG/REPO[@REV]: a model in the Hugging Face cache, see `lumen get`)\n"
    "\n"
    "Writes an MLX affine-quantized copy of a checkpoint (mlx-community layout): every matrix and\n"
    "embedding is quantized (router.proj at 8 bits, as the MLX converters do), norms and scalars "
    "are\n"
    "copied; config.json gets the quantization block; the tokenizer, templates, generation "
    "config\n"
    "and kv_config.json are copied. OUT_DIR must not exist or be empty (--force writes into it).\n"
    "\n"
    "  --bits B           default bits: 2, 3, 4, 5, 6 or 8 (default 4)\n"
    "  --group G          group size: 32, 64 or 128 (default 64)\n"
    "  --set P=B[/G]      modules whose path contains P get B bits (and group G); first match "
    "wins\n"
    "  --keep P           modules whose path contains P stay bf16 (written as `false` in the "
    "map)\n"
    "  --force            write into a non-empty OUT_DIR (its model.safetensors and config are "
    "replaced)\n"
    "\n"
    "Mixed precision by measurement (instead of --bits/--group/--set/--keep):\n"
    "  --target-bpw B     choose each module's bits and group so that the model averages at most "
    "B\n"
    "                     bits per weight (codes + bf16 scales and biases; 4-bit g64 is 4.5) and "
    "the\n"
    "                     sum of the modules' measured KLs is least: every module is quantized\n"
    "                     alone at every candidate kind and the model's next-token distributions\n"
    "                     on calibration tokens are compared with the unquantized model's (mean\n"
    "                     KL); an exact knapsack over that table picks the plan. The table and "
    "the\n"
    "                     plan are printed; config.json gets one override per module that differs\n"
    "                     from the most common kind (the layout mlx-lm reads)\n"
    "  --calib FILE       calibration text (tokenized with the model's tokenizer, BOS first);\n"
    "                     default: a mixed English text that ships with lumen\n"
    "  --calib-ids FILE   calibration token ids instead, comma-separated\n"
    "  --calib-tokens N   use the first N calibration tokens (default 256)\n"
    "  --bits-set LIST    candidate widths (default 2,3,4,5,6,8)\n"
    "  --groups LIST      candidate groups (default 32,64,128)\n"
    "  --table FILE       also save the measured table and the plan (JSON)\n"
    "  --from-table FILE  plan from a table saved by --table instead of measuring again\n"
    "  --backend B        where to measure: cpu or cuda (default: cuda when a GPU is visible);\n"
    "                     --threads N\n"
    "  --precision P      how to measure: f32 (the default on the CPU: exact) or fast (the "
    "default\n"
    "                     on CUDA: bf16 activations on the tensor cores, the reference measured\n"
    "                     the same way; E4B's sweep takes minutes instead of hours)\n"
    "  --preset FILE      measure a synthetic bf16 model of this config.json-shaped geometry\n"
    "                     (random weights and, without --calib-ids, seeded random tokens: a\n"
    "                     timing run; nothing is written but --table)\n";

static int check_kind(const lm_quantize_opts *o) {
  if (!lm_quantize_bits_ok(o->bits))
    return fprintf(stderr, "lumen quantize: --bits %d: supported are 2, 3, 4, 5, 6 and 8\n",
                   o->bits),
           2;
  if (!lm_quantize_group_ok(o->group))
    return fprintf(stderr, "lumen quantize: --group %d: supported are 32, 64 and 128\n", o->group),
           2;
  return 0;
}

/* --target-bpw and its flags against the manual ones. */
static int check_target(const lm_cli_qtarget *q, int manual) {
  if (q->bpw <= 0) {
    if (q->calib || q->calib_ids || q->table_in || q->table_out || q->be.precision)
      return fprintf(stderr, "lumen quantize: --calib, --calib-ids, --table, --from-table and "
                             "--precision go with --target-bpw\n"),
             2;
    return 0;
  }
  if (manual)
    return fprintf(stderr, "lumen quantize: --target-bpw chooses every module's bits and group; "
                           "it does not combine with --bits, --group, --set or --keep\n"),
           2;
  if (q->bpw < 2 || q->bpw > 16)
    return fprintf(stderr, "lumen quantize: --target-bpw %g: want 2 to 16 bits per weight\n",
                   q->bpw),
           2;
  if (q->calib && q->calib_ids)
    return fprintf(stderr, "lumen quantize: give --calib or --calib-ids, not both\n"), 2;
  if (q->calib_tokens < 2)
    return fprintf(stderr, "lumen quantize: --calib-tokens wants at least 2\n"), 2;
  return 0;
}

/* --preset: a synthetic bf16 model measured and planned (the sweep's timing on a geometry). */
static int measure_preset(const lm_cli_qtarget *q, int no_dirs) {
  if (!no_dirs || q->bpw <= 0 || q->calib)
    return fprintf(stderr, "lumen quantize: --preset wants --target-bpw, no directories and no "
                           "--calib (it has no tokenizer)\n"),
           2;
  lm_model *m = NULL;
  fprintf(stderr, "lumen quantize: building a synthetic bf16 model of %s...\n", q->preset);
  if (lm_model_synth(q->preset, 0, 64, 1, &m)) return lm_cli_fail("synthetic model"), 1;
  lm_quantize_opts o = {.bits = 4, .group = 64};
  int rc = lm_cli_qtarget_plan(m, q, &o);
  lm_cli_qtarget_free_rules(&o);
  lm_model_free(m);
  return rc;
}

static void on_progress(void *ctx, int done, int total) {
  lm_cli_progress *p = ctx;
  p->total = total;
  lm_cli_progress_update(p, done);
}

int lm_cli_quantize(int argc, char **argv) {
  static const struct option lo[] = {{"bits", 1, 0, 'b'},
                                     {"group", 1, 0, 'g'},
                                     {"set", 1, 0, 's'},
                                     {"keep", 1, 0, 'k'},
                                     {"help", 0, 0, 'h'},
                                     {"force", 0, 0, 'f'},
                                     {"target-bpw", 1, 0, 'T'},
                                     {"calib", 1, 0, 'C'},
                                     {"calib-ids", 1, 0, 'I'},
                                     {"calib-tokens", 1, 0, 'N'},
                                     {"bits-set", 1, 0, 'B'},
                                     {"groups", 1, 0, 'G'},
                                     {"table", 1, 0, 'o'},
                                     {"from-table", 1, 0, 'i'},
                                     {"threads", 1, 0, 't'},
                                     {"backend", 1, 0, 'e'},
                                     {"preset", 1, 0, 'p'},
                                     {"precision", 1, 0, 'P'},
                                     {0, 0, 0, 0}};
  lm_cli_qtarget qt = {.bits_set = "2,3,4,5,6,8",
                       .groups = "32,64,128",
                       .calib_tokens = 256,
                       .be = {.backend = "cpu"}};
  int manual = 0;
  lm_quantize_opts o = {.bits = 4, .group = 64};
  lm_quantize_rule rules[64];
  char *owned[64];
  int n_owned = 0, c, rc = 1, force = 0;
  optind = 1;
  while ((c = getopt_long(argc, argv, ":h", lo, NULL)) != -1) {
    if (c == 'h') return fputs(quantize_help, stdout), 0;
    if ((c == 's' || c == 'k') && o.n_rules == 64)
      return fprintf(stderr, "lumen: too many --set/--keep\n"), 2;
    switch (c) {
    case 'b': o.bits = atoi(optarg), manual = 1; break;
    case 'g': o.group = atoi(optarg), manual = 1; break;
    case 'k': rules[o.n_rules++] = (lm_quantize_rule){.pattern = optarg}, manual = 1; break;
    case 'f': force = 1; break;
    case 'T': qt.bpw = atof(optarg); break;
    case 'C': qt.calib = optarg; break;
    case 'I': qt.calib_ids = optarg; break;
    case 'N': qt.calib_tokens = atoll(optarg); break;
    case 'B': qt.bits_set = optarg; break;
    case 'G': qt.groups = optarg; break;
    case 'o': qt.table_out = optarg; break;
    case 'i': qt.table_in = optarg; break;
    case 't': qt.be.threads = atoi(optarg); break;
    case 'e': qt.be.backend = optarg; break;
    case 'P': qt.be.precision = optarg; break;
    case 'p': qt.preset = optarg; break;
    case 's': {
      char *eq = strchr(optarg, '='), *p = owned[n_owned++] = strdup(optarg);
      if (!eq || !p)
        return fprintf(stderr, "lumen: --set wants PATTERN=BITS[/GROUP], got '%s'\n", optarg), 2;
      p[eq - optarg] = '\0';
      lm_quantize_rule r = {.pattern = p, .bits = atoi(eq + 1)};
      const char *sl = strchr(eq, '/');
      if (sl) r.group = atoi(sl + 1);
      if (!lm_quantize_bits_ok(r.bits) || (sl && !lm_quantize_group_ok(r.group)))
        return fprintf(stderr,
                       "lumen quantize: --set %s: bits are 2, 3, 4, 5, 6 or 8; groups 32, 64 or "
                       "128\n",
                       optarg),
               2;
      rules[o.n_rules++] = r;
      manual = 1;
      break;
    }
    default: return lm_cli_flag_error(c, argc, argv, lo);
    }
  }
  if (qt.preset) return measure_preset(&qt, optind == argc);
  if (optind != argc - 2) return fputs(quantize_help, stderr), 2;
  if (check_kind(&o) || lm_cli_check_out_dir("quantize", argv[optind], argv[optind + 1], force) ||
      check_target(&qt, manual))
    return 2;
  o.rules = rules;
  lm_model *m = lm_cli_load_model(argv[optind]);
  if (m && qt.bpw > 0 && lm_cli_qtarget_plan(m, &qt, &o)) {
    lm_model_free(m);
    m = NULL;
  }
  if (m) {
    double t0 = lm_cli_now();
    lm_cli_progress pr;
    lm_cli_progress_start(&pr, "quantize", 0, "layers");
    o.progress = on_progress;
    o.progress_ctx = &pr;
    lm_status s = lm_model_quantize(m, argv[optind + 1], &o);
    lm_cli_progress_clear(&pr);
    if (s)
      lm_cli_fail("quantize");
    else {
      fprintf(stderr, "quantized %s -> %s (%s%d-bit, group %d) in %.1f s\n", argv[optind],
              argv[optind + 1], qt.bpw > 0 ? "mixed, mostly " : "", o.bits, o.group,
              lm_cli_now() - t0);
      rc = 0;
    }
  }
  lm_model_free(m);
  if (qt.bpw > 0) lm_cli_qtarget_free_rules(&o);
  for (int i = 0; i < n_owned; i++)
    free(owned[i]);
  return rc;
}
