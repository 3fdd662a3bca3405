/* cli_adapter.h — `--adapter PATH[@WEIGHT]`, repeatable: LoRA adapters stacked on the model, each
 * with its weight (default 1). */
#ifndef LM_CLI_ADAPTER_H
#define LM_CLI_ADAPTER_H

#include "lumen.h"
#include "model/lora.h"

#define LM_CLI_MAX_ADAPTERS 8

typedef struct lm_cli_adapters {
  const char *arg[LM_CLI_MAX_ADAPTERS];
  int n;
  lm_lora *set[LM_CLI_MAX_ADAPTERS];   /* loaded by lm_cli_adapters_load */
  char dir[LM_CLI_MAX_ADAPTERS][4096]; /* the arguments split (lm_cli_adapters_parse) */
  const char *dirs[LM_CLI_MAX_ADAPTERS];
  float weight[LM_CLI_MAX_ADAPTERS];
} lm_cli_adapters;

/* Records one --adapter argument; 2 (after printing why) when there are too many. */
int lm_cli_adapters_add(lm_cli_adapters *a, const char *arg);
/* Loads every recorded adapter onto m, printing a line per adapter on stderr; 0, or 1 after
 * printing the error (nothing stays loaded). */
int lm_cli_adapters_load(lm_cli_adapters *a, const lm_model *m);
void lm_cli_adapters_free(lm_cli_adapters *a);
/* Splits every recorded argument into its directory and weight (dir, dirs, weight); 0, or 2
 * after printing why one is malformed. */
int lm_cli_adapters_parse(lm_cli_adapters *a);
/* Points the engine options at the split adapters (their directories and weights, which a
 * keeps). */
void lm_cli_adapters_options(const lm_cli_adapters *a, lm_engine_options *eo);

#endif
