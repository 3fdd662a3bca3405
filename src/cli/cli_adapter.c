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

int lm_cli_adapters_load(lm_cli_adapters *a, const lm_model *m) {
  for (int i = 0; i < a->n; i++) {
    char dir[4096];
    float w;
    lm_status s = lm_lora_parse_arg(a->arg[i], dir, sizeof dir, &w);
    if (!s) s = lm_lora_load(m, dir, w, &a->set[i]);
    if (s) {
      fprintf(stderr, "lumen: %s\n", lm_errmsg());
      lm_cli_adapters_free(a);
      return 1;
    }
    fprintf(stderr, "adapter %s (%s): %d modules, rank up to %d, weight %g\n", dir,
            a->set[i]->format, a->set[i]->n_mods, a->set[i]->max_rank, (double)w);
  }
  return 0;
}

void lm_cli_adapters_free(lm_cli_adapters *a) {
  for (int i = 0; i < LM_CLI_MAX_ADAPTERS; i++) {
    lm_lora_free(a->set[i]);
    a->set[i] = NULL;
  }
}

int lm_cli_adapters_engine(lm_cli_adapters *a, lm_engine_options *eo) {
  for (int i = 0; i < a->n; i++) {
    if (lm_lora_parse_arg(a->arg[i], a->dir[i], sizeof a->dir[i], &a->weight[i])) {
      fprintf(stderr, "lumen: %s\n", lm_errmsg());
      return 2;
    }
    a->dirs[i] = a->dir[i];
  }
  eo->adapters = a->n ? a->dirs : NULL;
  eo->adapter_weights = a->n ? a->weight : NULL;
  eo->n_adapters = a->n;
  return 0;
}
