/* cli_spec.h — the speculative-decoding flags of `run`, `chat`, `generate` and `serve`:
 * --spec SOURCE and --spec-tokens N, checked once here. */
#ifndef LM_CLI_SPEC_H
#define LM_CLI_SPEC_H

#include <stdio.h>

typedef struct lm_cli_spec {
  const char *source; /* "ngram", "draft", or NULL: off (lm_request_options.speculative) */
  const char *draft;  /* --spec draft:DIR: the draft model's directory (lm_engine_options) */
  int tokens;         /* --spec-tokens (0: LM_SPEC_DEFAULT_TOKENS) */
} lm_cli_spec;

/* --spec SOURCE; prints the error and returns 2 when it is not a source this build has. */
int lm_cli_spec_source(lm_cli_spec *s, const char *arg);
/* --spec-tokens N (1..LM_SPEC_MAX_TOKENS); prints the error and returns 2 otherwise. */
int lm_cli_spec_tokens(lm_cli_spec *s, const char *arg);
/* The drafts per step the engine must make room for (0 without --spec). */
int lm_cli_spec_engine_tokens(const lm_cli_spec *s);
/* The flags' lines of --help. */
void lm_cli_spec_help(FILE *f);

#endif
