/* cli_sampling.h — the one table of sampling and stopping flags, shared by `lumen run`, `lumen
 * chat` (and `lumen serve`, whose flags set the server's defaults):
 *   --temperature/--temp T  --top-k K  --top-p P  --min-p P  --repeat-penalty R  --repeat-last-n N
 *   --presence-penalty X  --frequency-penalty X  --penalty-last-n N  --seed S  --logit-bias ID=V
 *   --stop STR  --max-tokens/-n N
 * A verb appends the table to its getopt_long options, hands each result it does not know to
 * lm_cli_sampling_handle, and at the end overlays what was given on the checkpoint's defaults
 * (generation_config.json) with lm_cli_sampling_apply. */
#ifndef LM_CLI_SAMPLING_H
#define LM_CLI_SAMPLING_H

#include <getopt.h>
#include <stdint.h>
#include <stdio.h>

#include "sample/sampler.h"

/* getopt_long values of the table's flags are LM_CLI_SAMPLING_BASE + index. */
#define LM_CLI_SAMPLING_BASE 0x1000

typedef struct lm_cli_sampling {
  lm_sampling s;      /* the values given (only the fields flagged in `set` count) */
  uint32_t set;       /* bit i: table entry i was given */
  int64_t max_tokens; /* -1: not given */
  const char **stops; /* --stop values (borrowed from argv) */
  int32_t n_stops;
} lm_cli_sampling;

void lm_cli_sampling_init(lm_cli_sampling *c);
void lm_cli_sampling_free(lm_cli_sampling *c);

/* Appends the table's entries to opts[n..] (and the terminating zero entry). Returns the new
 * count, or -1 when cap is too small. */
int lm_cli_sampling_options(struct option *opts, int n, int cap);

/* Handles one getopt_long result. Returns 1 when opt was a sampling flag (and arg was valid), 0
 * when opt is not one of the table's, -1 for a bad value (the message is printed). */
int lm_cli_sampling_handle(lm_cli_sampling *c, int opt, const char *arg);

/* The getopt_long value of the table's flag `name` ("max-tokens"), or -1. */
int lm_cli_sampling_opt(const char *name);

/* Prints the table's help lines. */
void lm_cli_sampling_help(FILE *f);

/* *out = defaults with every given flag overlaid (logit biases added to the defaults' list). The
 * seed is random when --seed was not given. *out owns its lists (lm_sampling_clear it). */
lm_status lm_cli_sampling_apply(const lm_cli_sampling *c, const lm_sampling *defaults,
                                lm_sampling *out);

#endif
