/* cli_quantize.c — `lumen quantize`: bf16 checkpoint → MLX affine-quantized checkpoint. */
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "cli/cli.h"
#include "cli/cli_common.h"
#include "model/quantize.h"

static const char *quantize_help =
    "usage: lumen quantize SRC_DIR OUT_DIR [--bits B] [--group G] [--set PATTERN=BITS[/GROUP]]... "
    "[--keep PATTERN]...\n"
    "\n"
    "Writes an MLX affine-quantized copy of a checkpoint (mlx-community layout): every matrix and\n"
    "embedding is quantized (router.proj at 8 bits, as the MLX converters do), norms and scalars "
    "are\n"
    "copied; config.json gets the quantization block; tokenizer and template files are copied.\n"
    "\n"
    "  --bits B           default bits: 2, 3, 4, 5, 6 or 8 (default 4)\n"
    "  --group G          group size: 32, 64 or 128 (default 64)\n"
    "  --set P=B[/G]      modules whose path contains P get B bits (and group G); first match "
    "wins\n"
    "  --keep P           modules whose path contains P stay bf16 (written as `false` in the "
    "map)\n";

int lm_cli_quantize(int argc, char **argv) {
  static const struct option lo[] = {{"bits", 1, 0, 'b'}, {"group", 1, 0, 'g'}, {"set", 1, 0, 's'},
                                     {"keep", 1, 0, 'k'}, {"help", 0, 0, 'h'},  {0, 0, 0, 0}};
  lm_quantize_opts o = {.bits = 4, .group = 64};
  lm_quantize_rule rules[64];
  char *owned[64];
  int n_owned = 0, c, rc = 1;
  optind = 1;
  while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
    if (c == 'h') return fputs(quantize_help, stdout), 0;
    if ((c == 's' || c == 'k') && o.n_rules == 64)
      return fprintf(stderr, "lumen: too many --set/--keep\n"), 2;
    switch (c) {
    case 'b': o.bits = atoi(optarg); break;
    case 'g': o.group = atoi(optarg); break;
    case 'k': rules[o.n_rules++] = (lm_quantize_rule){.pattern = optarg}; break;
    case 's': {
      char *eq = strchr(optarg, '='), *p = owned[n_owned++] = strdup(optarg);
      if (!eq || !p)
        return fprintf(stderr, "lumen: --set wants PATTERN=BITS[/GROUP], got '%s'\n", optarg), 2;
      p[eq - optarg] = '\0';
      lm_quantize_rule r = {.pattern = p, .bits = atoi(eq + 1)};
      const char *sl = strchr(eq, '/');
      if (sl) r.group = atoi(sl + 1);
      if (r.bits < 2 || r.bits > 8 || r.bits == 7 ||
          (sl && r.group != 32 && r.group != 64 && r.group != 128))
        return fprintf(stderr, "lumen: --set %s: bits 2..8 (not 7), group 32/64/128\n", optarg), 2;
      rules[o.n_rules++] = r;
      break;
    }
    default: return fputs(quantize_help, stderr), 2;
    }
  }
  if (optind != argc - 2) return fputs(quantize_help, stderr), 2;
  o.rules = rules;
  lm_model *m = lm_cli_load_model(argv[optind]);
  if (m) {
    double t0 = lm_cli_now();
    if (lm_model_quantize(m, argv[optind + 1], &o))
      lm_cli_fail("quantize");
    else {
      fprintf(stderr, "quantized %s -> %s (%d-bit, group %d) in %.1f s\n", argv[optind],
              argv[optind + 1], o.bits, o.group, lm_cli_now() - t0);
      rc = 0;
    }
  }
  lm_model_free(m);
  for (int i = 0; i < n_owned; i++)
    free(owned[i]);
  return rc;
}
