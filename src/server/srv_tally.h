/* srv_tally.h — the token counts of one HTTP request for its log line (--log-requests): prompt,
 * cached and generated tokens summed over the request's generations. Shared by the connection
 * (which prints it when the request completes) and the generations (which add to it as they end),
 * whose lifetimes are not nested — a stream may outlive its connection's completion — so it is
 * reference counted and its counters are atomic. */
#ifndef LM_SERVER_SRV_TALLY_H
#define LM_SERVER_SRV_TALLY_H

#include <stdatomic.h>
#include <stdint.h>

typedef struct lm_srv_tally {
  atomic_int refs;
  atomic_int_fast64_t prompt, cached, generated;
  atomic_int generations; /* 0: the request generated nothing (no token counts in its line) */
} lm_srv_tally;

/* One reference (NULL when out of memory: every function accepts NULL). */
lm_srv_tally *lm_srv_tally_new(void);
lm_srv_tally *lm_srv_tally_ref(lm_srv_tally *t);
void lm_srv_tally_unref(lm_srv_tally *t);
void lm_srv_tally_add(lm_srv_tally *t, int64_t prompt, int64_t cached, int64_t generated);

#endif
