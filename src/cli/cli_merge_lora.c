/* cli_merge_lora.c — `lumen merge-lora BASE ADAPTER[@W]... OUT`: adapters merged into a copy of
 * the base checkpoint (model/lora_merge.c). */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "base/status.h"
#include "cli/cli.h"
#include "cli/cli_adapter.h"
#include "cli/cli_args.h"
#include "cli/cli_common.h"
#include "model/lora_merge.h"

static const char *merge_help =
    "usage: lumen merge-lora BASE_DIR ADAPTER_DIR[@WEIGHT]... OUT_DIR [--force]\n"
    "       (BASE_DIR may be ORG/REPO[@REV]: a model in the Hugging Face cache, see `lumen get`)\n"
    "\n"
    "Writes a copy of the base checkpoint with the LoRA adapters (PEFT or mlx-lm, each with its\n"
    "weight, default 1) merged into the modules they adapt: W + weight * scale * B A, in the\n"
    "base's layout. A bf16 base stays bf16 (loadable by transformers and lumen); an MLX-quantized\n"
    "base is quantized again module by module with each module's own bits and group (loadable by\n"
    "mlx-lm and lumen), which adds that quantization's error to the adapter's effect. Every other\n"
    "tensor, config.json, the tokenizer and templates are copied as they are. OUT_DIR must not\n"
    "exist or be empty (--force writes into it).\n"
    "\n"
    "  --force   write into a non-empty OUT_DIR\n";

int lm_cli_merge_lora(int argc, char **argv) {
  static const struct option lo[] = {{"force", 0, 0, 'f'}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
  int c, force = 0;
  optind = 1;
  while ((c = getopt_long(argc, argv, ":h", lo, NULL)) != -1) {
    switch (c) {
    case 'f': force = 1; break;
    case 'h': fputs(merge_help, stdout); return 0;
    default: return lm_cli_flag_error(c, argc, argv, lo);
    }
  }
  if (argc - optind < 3) {
    fputs(merge_help, stderr);
    return 2;
  }
  const char *base = argv[optind], *out = argv[argc - 1];
  lm_cli_adapters ad = {0};
  for (int i = optind + 1; i < argc - 1; i++)
    if (lm_cli_adapters_add(&ad, argv[i])) return 2;
  lm_model *m = lm_cli_load_model(base);
  if (!m) return 1;
  int rc = lm_cli_check_out_dir("merge-lora", m->dir, out, force);
  if (!rc) rc = lm_cli_adapters_load(&ad, m);
  if (!rc && lm_lora_merge(m, ad.set, ad.n, out)) {
    fprintf(stderr, "lumen merge-lora: %s\n", lm_errmsg());
    rc = 1;
  }
  if (!rc) fprintf(stderr, "merged %d adapter(s) into %s -> %s\n", ad.n, m->dir, out);
  lm_cli_adapters_free(&ad);
  lm_model_free(m);
  return rc;
}
