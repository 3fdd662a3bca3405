/* main.c — the `lumen` command: dispatches to one verb per file (cli_<verb>.c). */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/cli_args.h"

static const lm_cli_verb lm_verbs[] = {
#define LM_VERB(name, fn, help) {name, fn, help},
#include "cli/verbs.def"
#undef LM_VERB
};

static void usage(FILE *f) {
  fprintf(
      f,
      "lumen %s — local LLM inference for Gemma 4\n\nusage: lumen <command> [args]\n\ncommands:\n",
      LUMEN_VERSION);
  for (size_t i = 0; i < sizeof lm_verbs / sizeof lm_verbs[0]; i++)
    fprintf(f, "  %-14s %s\n", lm_verbs[i].name, lm_verbs[i].help);
  fprintf(f,
          "\nA MODEL_DIR may also be ORG/REPO[@REV], a model `lumen get` put in the Hugging Face "
          "cache.\n`lumen <command> --help` describes each command.\n");
}

int main(int argc, char **argv) {
  if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") ||
      !strcmp(argv[1], "help")) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (!strcmp(argv[1], "--version")) {
    printf("lumen %s\n", LUMEN_VERSION);
    return 0;
  }
  opterr = 0; /* the verbs name a bad flag themselves (lm_cli_flag_error) */
  for (size_t i = 0; i < sizeof lm_verbs / sizeof lm_verbs[0]; i++) {
    if (strcmp(argv[1], lm_verbs[i].name)) continue;
    lm_cli_args a;
    if (lm_cli_args_normalize(argc - 1, argv + 1, &a)) return 2;
    int rc = lm_verbs[i].fn(a.argc, a.argv);
    lm_cli_args_free(&a);
    return rc;
  }
  fprintf(stderr, "lumen: unknown command '%s' (see `lumen --help`)\n", argv[1]);
  return 2;
}
