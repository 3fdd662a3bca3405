/* hub_progress.h — the download's progress on stderr: bytes, rate and time left. On a terminal
 * it is one line rewritten in place ten times a second; otherwise (a log, CI) a line every five
 * seconds, so a log shows that a long download moves without filling up. */
#ifndef LM_HUB_PROGRESS_H
#define LM_HUB_PROGRESS_H

#include <stdint.h>

typedef struct lm_hub_progress {
  int enabled, tty, drawn;
  int64_t total, done, done0; /* bytes: to have in all, had so far, had at the start */
  double t0, last;            /* monotonic seconds: start, last line */
  const char *file;           /* the file being fetched */
} lm_hub_progress;

/* total: the bytes of every file to fetch; already: those present (complete or partial). */
void lm_hub_progress_start(lm_hub_progress *p, int enabled, int64_t total, int64_t already);
void lm_hub_progress_file(lm_hub_progress *p, const char *file);
void lm_hub_progress_add(lm_hub_progress *p, int64_t n);
/* Bytes that are no longer had (a download that restarts from zero). */
void lm_hub_progress_sub(lm_hub_progress *p, int64_t n);
/* The last line (and the newline a terminal line needs). */
void lm_hub_progress_end(lm_hub_progress *p);

#endif
