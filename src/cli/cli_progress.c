/* cli_progress.c — progress lines on stderr (cli_progress.h). */
#include "cli/cli_progress.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli_common.h"

enum { TTY_EVERY_MS = 200, LOG_EVERY_S = 5 };

void lm_cli_progress_start(lm_cli_progress *p, const char *label, double total, const char *unit) {
  memset(p, 0, sizeof *p);
  p->label = label;
  p->unit = unit;
  p->total = total;
  p->t0 = p->last = lm_cli_now();
  p->tty = isatty(STDERR_FILENO);
  /* LUMEN_PROGRESS_AFTER: seconds of silence before the first line (1; the tests use 0) */
  const char *e = getenv("LUMEN_PROGRESS_AFTER");
  p->after = e && *e ? atof(e) : 1.0;
}

/* n in the unit, sizes scaled ("12.3 MB") */
static void amount(char *s, size_t cap, double n, const char *unit) {
  if (strcmp(unit, "B")) {
    snprintf(s, cap, "%.0f %s", n, unit);
    return;
  }
  static const char *const sfx[] = {"B", "KB", "MB", "GB", "TB"};
  int k = 0;
  while (n >= 1000 && k < 4)
    n /= 1000, k++;
  snprintf(s, cap, k ? "%.1f %s" : "%.0f %s", n, sfx[k]);
}

static void duration(char *s, size_t cap, double sec) {
  if (sec < 60)
    snprintf(s, cap, "%.0f s", sec);
  else if (sec < 3600)
    snprintf(s, cap, "%d min %02d s", (int)sec / 60, (int)sec % 60);
  else
    snprintf(s, cap, "%d h %02d min", (int)sec / 3600, (int)sec % 3600 / 60);
}

static void print_line(lm_cli_progress *p, double now, int final) {
  char done[32], total[32], rate[32], eta[32] = "";
  double el = now - p->t0, r = el > 0 ? p->done / el : 0;
  amount(done, sizeof done, p->done, p->unit);
  amount(total, sizeof total, p->total, p->unit);
  amount(rate, sizeof rate, r, p->unit);
  if (final) {
    duration(eta, sizeof eta, el);
    fprintf(stderr, "%s%s: %s in %s (%s/s)%s\n", p->tty ? "\r" : "", p->label, done, eta, rate,
            p->tty ? "\033[K" : "");
    return;
  }
  if (p->total > 0 && r > 0) duration(eta, sizeof eta, (p->total - p->done) / r);
  if (p->total > 0)
    fprintf(stderr, "%s%s: %3.0f%%  %s of %s  %s/s%s%s%s%s%s", p->tty ? "\r" : "", p->label,
            100.0 * p->done / p->total, done, total, rate, *eta ? "  ETA " : "", eta,
            *p->note ? "  " : "", p->note, p->tty ? "\033[K" : "\n");
  else
    fprintf(stderr, "%s%s: %s  %s/s%s", p->tty ? "\r" : "", p->label, done, rate,
            p->tty ? "\033[K" : "\n");
  fflush(stderr);
}

void lm_cli_progress_update(lm_cli_progress *p, double done) {
  p->done = done;
  if (p->quiet) return;
  double now = lm_cli_now();
  if (now - p->t0 < p->after) return;
  if (p->shown && now - p->last < (p->tty ? TTY_EVERY_MS / 1000.0 : LOG_EVERY_S)) return;
  p->shown = 1;
  p->last = now;
  print_line(p, now, 0);
}

void lm_cli_progress_end(lm_cli_progress *p) {
  if (p->shown && !p->quiet) print_line(p, lm_cli_now(), 1);
  p->shown = 0;
}

void lm_cli_progress_clear(lm_cli_progress *p) {
  if (!p->shown || !p->tty) return;
  fputs("\r\033[K", stderr);
  fflush(stderr);
  p->shown = 0;
}

void lm_cli_progress_cb(void *ctx, int64_t done, int64_t total) {
  lm_cli_progress *p = ctx;
  p->total = (double)total;
  lm_cli_progress_update(p, (double)done);
}
