/* chan.c — the engine → consumer channel of chan.h: a mutex, a condition variable and a
 * growable array of token events. */
#include "engine/chan.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/status.h"

struct lm_chan {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int refs;
  atomic_int cancel;
  lm_tok_event *ev;
  size_t n, cap;
  int done;
  lm_finish fin;
};

lm_chan *lm_chan_create(void) {
  lm_chan *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, &ca);
  pthread_condattr_destroy(&ca);
  c->refs = 2;
  atomic_init(&c->cancel, 0);
  return c;
}

void lm_tok_event_clear(lm_tok_event *t) {
  if (!t) return;
  free(t->text);
  t->text = NULL;
  t->len = 0;
}

void lm_tok_events_free(lm_tok_event *ev, size_t n) {
  for (size_t i = 0; i < n; i++)
    lm_tok_event_clear(&ev[i]);
  free(ev);
}

void lm_chan_unref(lm_chan *c) {
  if (!c) return;
  pthread_mutex_lock(&c->mu);
  int last = --c->refs == 0;
  pthread_mutex_unlock(&c->mu);
  if (!last) return;
  lm_tok_events_free(c->ev, c->n);
  pthread_cond_destroy(&c->cv);
  pthread_mutex_destroy(&c->mu);
  free(c);
}

lm_status lm_chan_push(lm_chan *c, lm_tok_event *t) {
  pthread_mutex_lock(&c->mu);
  if (c->n == c->cap) {
    size_t cap = c->cap ? 2 * c->cap : 16;
    lm_tok_event *ev = realloc(c->ev, cap * sizeof *ev);
    if (!ev) {
      pthread_mutex_unlock(&c->mu);
      lm_tok_event_clear(t);
      return LM_ERRF(LM_ERR_NOMEM, "engine: out of memory (token queue)");
    }
    c->ev = ev;
    c->cap = cap;
  }
  c->ev[c->n++] = *t;
  t->text = NULL;
  pthread_cond_signal(&c->cv);
  pthread_mutex_unlock(&c->mu);
  return LM_OK;
}

void lm_chan_finish(lm_chan *c, const lm_finish *f) {
  pthread_mutex_lock(&c->mu);
  if (!c->done) {
    c->done = 1;
    c->fin = *f;
  }
  pthread_cond_signal(&c->cv);
  pthread_mutex_unlock(&c->mu);
}

int lm_chan_cancelled(lm_chan *c) { return atomic_load(&c->cancel); }

void lm_chan_cancel(lm_chan *c) { atomic_store(&c->cancel, 1); }

int lm_chan_take(lm_chan *c, int timeout_ms, lm_tok_event **ev, size_t *n, lm_finish *fin) {
  struct timespec until;
  clock_gettime(CLOCK_MONOTONIC, &until);
  until.tv_sec += timeout_ms / 1000;
  until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
  if (until.tv_nsec >= 1000000000L) {
    until.tv_sec++;
    until.tv_nsec -= 1000000000L;
  }
  pthread_mutex_lock(&c->mu);
  while (!c->n && !c->done)
    if (pthread_cond_timedwait(&c->cv, &c->mu, &until) == ETIMEDOUT) break;
  *ev = c->ev;
  *n = c->n;
  c->ev = NULL;
  c->n = c->cap = 0;
  int done = c->done;
  if (done && fin) *fin = c->fin;
  pthread_mutex_unlock(&c->mu);
  return done;
}
