/* hub_progress.c — the progress line of a download (see hub_progress.h). */
#include "hub/hub_progress.h"

#include <stdio.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* "12.3 MB" (decimal units, as the hub shows sizes). */
static void human(double b, char *buf, size_t n) {
  static const char *u[] = {"B", "kB", "MB", "GB", "TB"};
  int i = 0;
  while (b >= 1000 && i < 4)
    b /= 1000, i++;
  snprintf(buf, n, i ? "%.1f %s" : "%.0f %s", b, u[i]);
}

static void draw(lm_hub_progress *p, double t, int last) {
  char have[32], all[32], rate[32], eta[64] = "";
  double dt = t - p->t0, r = dt > 0 ? (double)(p->done - p->done0) / dt : 0;
  human((double)p->done, have, sizeof have);
  human((double)p->total, all, sizeof all);
  human(r, rate, sizeof rate);
  if (!last && r > 0 && p->total > p->done) {
    long s = (long)((double)(p->total - p->done) / r);
    snprintf(eta, sizeof eta, ", %ld:%02ld:%02ld left", s / 3600, s / 60 % 60, s % 60);
  }
  int pct = p->total > 0 ? (int)(100.0 * (double)p->done / (double)p->total) : 100;
  fprintf(stderr, "%s%s / %s (%d%%), %s/s%s%s%s%s", p->tty ? "\r" : "", have, all, pct, rate, eta,
          p->file && !last ? " — " : "", p->file && !last ? p->file : "", p->tty ? "\033[K" : "\n");
  fflush(stderr);
  p->drawn = p->tty;
  p->last = t;
}

void lm_hub_progress_start(lm_hub_progress *p, int enabled, int64_t total, int64_t already) {
  *p = (lm_hub_progress){
      .enabled = enabled, .tty = isatty(2), .total = total, .done = already, .done0 = already};
  p->t0 = p->last = now_s();
}

void lm_hub_progress_file(lm_hub_progress *p, const char *file) { p->file = file; }

void lm_hub_progress_add(lm_hub_progress *p, int64_t n) {
  p->done += n;
  if (!p->enabled) return;
  double t = now_s();
  if (t - p->last >= (p->tty ? 0.1 : 5.0)) draw(p, t, 0);
}

void lm_hub_progress_sub(lm_hub_progress *p, int64_t n) { p->done -= n; }

void lm_hub_progress_end(lm_hub_progress *p) {
  if (!p->enabled) return;
  draw(p, now_s(), 1);
  if (p->tty) fputc('\n', stderr);
  p->drawn = 0;
}
