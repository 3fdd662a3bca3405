/* srv_chan.c — the engine → HTTP channel of srv_chan.h: a mutex, a condition variable and a
 * growable array of token events. */
#include "server/srv_chan.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/status.h"

struct lm_srv_chan {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int refs;
  atomic_int cancel;
  lm_srv_tok *ev;
  size_t n, cap;
  int done;
  lm_srv_finish fin;
};

lm_srv_chan *lm_srv_chan_create(void) {
  lm_srv_chan *c = calloc(1, sizeof *c);
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

void lm_srv_tok_clear(lm_srv_tok *t) {
  if (!t) return;
  free(t->text);
  t->text = NULL;
  t->len = 0;
}

void lm_srv_toks_free(lm_srv_tok *ev, size_t n) {
  for (size_t i = 0; i < n; i++)
    lm_srv_tok_clear(&ev[i]);
  free(ev);
}

void lm_srv_chan_unref(lm_srv_chan *c) {
  if (!c) return;
  pthread_mutex_lock(&c->mu);
  int last = --c->refs == 0;
  pthread_mutex_unlock(&c->mu);
  if (!last) return;
  lm_srv_toks_free(c->ev, c->n);
  pthread_cond_destroy(&c->cv);
  pthread_mutex_destroy(&c->mu);
  free(c);
}

lm_status lm_srv_chan_push(lm_srv_chan *c, lm_srv_tok *t) {
  pthread_mutex_lock(&c->mu);
  if (c->n == c->cap) {
    size_t cap = c->cap ? 2 * c->cap : 16;
    lm_srv_tok *ev = realloc(c->ev, cap * sizeof *ev);
    if (!ev) {
      pthread_mutex_unlock(&c->mu);
      lm_srv_tok_clear(t);
      return LM_ERRF(LM_ERR_NOMEM, "server: out of memory (token queue)");
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

void lm_srv_chan_finish(lm_srv_chan *c, const lm_srv_finish *f) {
  pthread_mutex_lock(&c->mu);
  if (!c->done) {
    c->done = 1;
    c->fin = *f;
  }
  pthread_cond_signal(&c->cv);
  pthread_mutex_unlock(&c->mu);
}

int lm_srv_chan_cancelled(lm_srv_chan *c) { return atomic_load(&c->cancel); }

void lm_srv_chan_cancel(lm_srv_chan *c) { atomic_store(&c->cancel, 1); }

int lm_srv_chan_take(lm_srv_chan *c, int timeout_ms, lm_srv_tok **ev, size_t *n,
                     lm_srv_finish *fin) {
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
