/* cli_progress.h — progress of long commands on stderr (never stdout, which carries results).
 * Silent for the first second (LUMEN_PROGRESS_AFTER seconds), so quick runs print nothing; then one
 * line redrawn in place on a terminal, or a line every few seconds when stderr is a file or a pipe
 * (CI logs). */
#ifndef LM_CLI_PROGRESS_H
#define LM_CLI_PROGRESS_H

#include <stdint.h>

typedef struct lm_cli_progress {
  const char *label; /* "kv-eval", "quantize" */
  const char *unit;  /* "tok", "layers"; "B" prints sizes (MB, GB) */
  double total;      /* 0: unknown (no percentage, no ETA) */
  double t0, last;   /* start, last print (monotonic seconds) */
  double done;
  double after;  /* seconds of silence before the first line */
  char note[96]; /* printed after the ETA when set (what the time goes to, say) */
  int tty, shown, quiet;
} lm_cli_progress;

void lm_cli_progress_start(lm_cli_progress *p, const char *label, double total, const char *unit);
/* done: units finished so far (absolute, not an increment). */
void lm_cli_progress_update(lm_cli_progress *p, double done);
/* Clears a line drawn on a terminal, before the command prints a result (it is redrawn at the
 * next update). */
void lm_cli_progress_clear(lm_cli_progress *p);
/* A callback of the (ctx, done, total) shape (lm_engine_options.on_load): ctx is the progress. */
void lm_cli_progress_cb(void *ctx, int64_t done, int64_t total);
/* Ends the line (with the total time) when anything was shown. */
void lm_cli_progress_end(lm_cli_progress *p);

#endif
