/* srv_tally.c — per-request token counts for the request log (srv_tally.h). */
#include "server/srv_tally.h"

#include <stdlib.h>

lm_srv_tally *lm_srv_tally_new(void) {
  lm_srv_tally *t = malloc(sizeof *t);
  if (!t) return NULL;
  atomic_init(&t->refs, 1);
  atomic_init(&t->prompt, 0);
  atomic_init(&t->cached, 0);
  atomic_init(&t->generated, 0);
  atomic_init(&t->generations, 0);
  return t;
}

lm_srv_tally *lm_srv_tally_ref(lm_srv_tally *t) {
  if (t) atomic_fetch_add(&t->refs, 1);
  return t;
}

void lm_srv_tally_unref(lm_srv_tally *t) {
  if (t && atomic_fetch_sub(&t->refs, 1) == 1) free(t);
}

void lm_srv_tally_add(lm_srv_tally *t, int64_t prompt, int64_t cached, int64_t generated) {
  if (!t) return;
  atomic_fetch_add(&t->prompt, prompt);
  atomic_fetch_add(&t->cached, cached);
  atomic_fetch_add(&t->generated, generated);
  atomic_fetch_add(&t->generations, 1);
}
