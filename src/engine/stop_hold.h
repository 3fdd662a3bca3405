/* stop_hold.h — stop strings matched on decoded text, with hold-back: text that might be the start
 * of a stop string is kept until it is known not to be, so a stream never shows any part of a stop
 * string nor anything after it, even when the string is split across tokens. */
#ifndef LM_ENGINE_STOP_HOLD_H
#define LM_ENGINE_STOP_HOLD_H

#include <stddef.h>

#include "lumen.h"

typedef struct lm_stop_hold {
  char **stops; /* borrowed: the job's strings */
  int n_stops;
  char *hold; /* text not yet released */
  size_t n, cap;
  int matched; /* index of the stop string found, -1 while none */
} lm_stop_hold;

void lm_stop_hold_init(lm_stop_hold *s, char **stops, int n_stops);
void lm_stop_hold_clear(lm_stop_hold *s);
/* Adds text; *out (malloc'ed, NULL when *n_out is 0) gets what is final now. `final` releases
 * everything held (the response ends). After a match, s->matched >= 0 and the text before the
 * match is the last released. */
lm_status lm_stop_hold_push(lm_stop_hold *s, const char *text, size_t len, int final, char **out,
                            size_t *n_out);

#endif
