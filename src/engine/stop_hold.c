/* stop_hold.c — the stop-string matcher of stop_hold.h. */
#include "engine/stop_hold.h"

#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/status.h"
#include "engine/stop_match.h"

void lm_stop_hold_init(lm_stop_hold *s, char **stops, int n_stops) {
  memset(s, 0, sizeof *s);
  s->stops = stops;
  s->n_stops = n_stops;
  s->matched = -1;
}

void lm_stop_hold_clear(lm_stop_hold *s) {
  free(s->hold);
  s->hold = NULL;
  s->n = s->cap = 0;
}

lm_status lm_stop_hold_push(lm_stop_hold *s, const char *text, size_t len, int final, char **out,
                            size_t *n_out) {
  *out = NULL;
  *n_out = 0;
  if (s->matched >= 0) return LM_OK;
  LM_TRY(lm_buf_append(&s->hold, &s->n, &s->cap, 64, text, len));
  int which = -1;
  int64_t at = lm_stop_find(s->stops, s->n_stops, s->hold, s->n, &which);
  size_t k = at >= 0 ? (size_t)at
             : final ? s->n
                     : s->n - lm_stop_held_suffix(s->stops, s->n_stops, s->hold, s->n);
  if (k) {
    if (!(*out = malloc(k + 1)))
      return LM_ERRF(LM_ERR_NOMEM, "engine: out of memory (stop strings)");
    memcpy(*out, s->hold, k);
    (*out)[k] = '\0';
    *n_out = k;
  }
  if (at >= 0) {
    s->matched = which;
    s->n = 0;
  } else {
    memmove(s->hold, s->hold + k, s->n - k);
    s->n -= k;
  }
  return LM_OK;
}
