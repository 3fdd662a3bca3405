/* status.h — error values with messages (see include/lumen.h for the codes).
 *
 * Usage: return LM_ERRF(LM_ERR_CORRUPT, "%s: tensor %s: offsets past end of file", path, name);
 * The macro formats the message into the calling thread's error buffer and evaluates to
 * the status, so a failing function reports and returns in one statement. */
#ifndef LM_BASE_STATUS_H
#define LM_BASE_STATUS_H

#include "lumen.h"

#if defined(__GNUC__)
#define LM_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define LM_PRINTF(a, b)
#endif

/* Sets the thread's message and returns s. */
lm_status lm_err_set(lm_status s, const char *fmt, ...) LM_PRINTF(2, 3);
/* Prepends "prefix: " to the thread's current message (adds context on the way up). */
lm_status lm_err_prefix(lm_status s, const char *fmt, ...) LM_PRINTF(2, 3);
/* Clears the thread's message. */
void lm_err_clear(void);

#define LM_ERRF(s, ...) lm_err_set((s), __VA_ARGS__)
#define LM_TRY(expr)                                                                               \
  do {                                                                                             \
    lm_status lm_try_s_ = (expr);                                                                  \
    if (lm_try_s_ != LM_OK) return lm_try_s_;                                                      \
  } while (0)

#endif
