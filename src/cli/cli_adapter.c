/* cli_adapter.c — the --adapter flag (see cli_adapter.h). */
#include "cli/cli_adapter.h"

#include <stdio.h>

#include "base/status.h"

int lm_cli_adapters_add(lm_cli_adapters *a, const char *arg) {
  if (a->n == LM_CLI_MAX_ADAPTERS) {
    fprintf(stderr, "lumen: at most %d --adapter flags\n", LM_CLI_MAX_ADAPTERS);
    return 2;
  }
  a->arg[a->n++] = arg;
  return 0;
}

int lm_cli_adapters_parse(lm_cli_adapters *a) {
  for (int i = 0; i < a->n; i++) {
    if (lm_lora_parse_arg(a->arg[i], a->dir[i], sizeof a->dir[i], &a->weight[i])) {
      fprintf(stderr, "lumen: %s\n", lm_errmsg());
      return 2;
    }
    a->dirs[i] = a->dir[i];
  }
  return 0;
}

int lm_cli_adapters_load(lm_cli_adapters *a, const lm_model *m) {
  if (lm_cli_adapters_parse(a)) return 1;
  for (int i = 0; i < a->n; i++) {
    if (lm_lora_load(m, a->dir[i], a->weight[i], &a->set[i])) {
      fprintf(stderr, "lumen: %s\n", lm_errmsg());
      lm_cli_adapters_free(a);
      return 1;
    }
    fprintf(stderr, "adapter %s (%s): %d modules, rank up to %d, weight %g\n", a->dir[i],
            a->set[i]->format, a->set[i]->n_mods, a->set[i]->max_rank, (double)a->weight[i]);
  }
  return 0;
}

void lm_cli_adapters_free(lm_cli_adapters *a) {
  for (int i = 0; i < LM_CLI_MAX_ADAPTERS; i++) {
    lm_lora_free(a->set[i]);
    a->set[i] = NULL;
  }
}

void lm_cli_adapters_options(const lm_cli_adapters *a, lm_engine_options *eo) {
  eo->adapters = a->n ? a->dirs : NULL;
  eo->adapter_weights = a->n ? a->weight : NULL;
  eo->n_adapters = a->n;
}
