/* cli_spec.c — the speculative-decoding flags (cli_spec.h). */
#include "cli/cli_spec.h"

#include <stdlib.h>
#include <string.h>

#include "lumen.h"

int lm_cli_spec_source(lm_cli_spec *s, const char *arg) {
  if (!strcmp(arg, "ngram")) {
    s->source = "ngram";
    return 0;
  }
  if (!strncmp(arg, "draft:", 6) && arg[6]) {
    s->source = "draft";
    s->draft = arg + 6;
    return 0;
  }
  if (!strncmp(arg, "assistant:", 10))
    fprintf(stderr,
            "lumen: --spec %s: the Gemma 4 assistant drafters are not in this build yet (ngram "
            "and draft:DIR are)\n",
            arg);
  else
    fprintf(stderr, "lumen: --spec: unknown draft source '%s' (ngram, draft:DIR)\n", arg);
  return 2;
}

int lm_cli_spec_tokens(lm_cli_spec *s, const char *arg) {
  char *end;
  long x = strtol(arg, &end, 10);
  if (end == arg || *end || x < 1 || x > LM_SPEC_MAX_TOKENS) {
    fprintf(stderr, "lumen: --spec-tokens: '%s' is not a count of 1..%d\n", arg,
            LM_SPEC_MAX_TOKENS);
    return 2;
  }
  s->tokens = (int)x;
  return 0;
}

int lm_cli_spec_engine_tokens(const lm_cli_spec *s) {
  return !s->source ? 0 : s->tokens ? s->tokens : LM_SPEC_DEFAULT_TOKENS;
}

void lm_cli_spec_help(FILE *f) {
  fprintf(f,
          "  --spec ngram             speculative decoding: drafts from the longest earlier\n"
          "                           repeat of the context's end, verified in one step; the\n"
          "                           answer is the one plain decoding gives (CPU backend)\n"
          "  --spec draft:DIR         the same with the greedy tokens of a smaller checkpoint of\n"
          "                           the same vocabulary as drafts (e.g. a 4-bit copy)\n"
          "  --spec-tokens N          drafts per step, 1..%d (default %d; the CPU verifies up to\n"
          "                           7 tokens a step)\n",
          LM_SPEC_MAX_TOKENS, LM_SPEC_DEFAULT_TOKENS);
}
