/* mask_prep.c — see mask_prep.h. One helper thread; its work runs as an OpenMP loop of its own
 * over the rows (the engine thread is blocked in the forward meanwhile). */
#include "engine/mask_prep.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/status.h"

struct lm_mask_prep {
  pthread_t th;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  lm_constraint **cons; /* [max_rows] */
  int max_rows, n;
  int pending; /* work handed over and not finished */
  int quit;
  double host_s;
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double prepare_all(lm_constraint *const *cons, int n) {
  double sum = 0;
#pragma omp parallel for schedule(dynamic) reduction(+ : sum) if (n > 1)
  for (int i = 0; i < n; i++) {
    if (!cons[i]) continue;
    double t0 = now_s();
    (void)lm_constraint_prepare(cons[i]); /* a failure: apply prepares again and reports it */
    sum += now_s() - t0;
  }
  return sum;
}

static void *helper(void *arg) {
  lm_mask_prep *p = arg;
  pthread_mutex_lock(&p->mu);
  for (;;) {
    while (!p->pending && !p->quit)
      pthread_cond_wait(&p->cv, &p->mu);
    if (!p->pending) break; /* quit, nothing left */
    int n = p->n;
    pthread_mutex_unlock(&p->mu);
    double s = prepare_all(p->cons, n);
    pthread_mutex_lock(&p->mu);
    p->host_s = s;
    p->pending = 0;
    pthread_cond_broadcast(&p->cv);
  }
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

lm_status lm_mask_prep_create(int max_rows, lm_mask_prep **out) {
  *out = NULL;
  lm_mask_prep *p = calloc(1, sizeof *p);
  if (!p || !(p->cons = calloc((size_t)(max_rows > 0 ? max_rows : 1), sizeof *p->cons))) {
    free(p);
    return LM_ERRF(LM_ERR_NOMEM, "engine: out of memory (mask helper)");
  }
  p->max_rows = max_rows;
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cv, NULL);
  if (pthread_create(&p->th, NULL, helper, p)) {
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->cons);
    free(p);
    return LM_ERRF(LM_ERR_IO, "engine: cannot start the mask helper thread");
  }
  *out = p;
  return LM_OK;
}

void lm_mask_prep_free(lm_mask_prep *p) {
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  p->quit = 1;
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
  pthread_join(p->th, NULL);
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->cv);
  free(p->cons);
  free(p);
}

void lm_mask_prep_start(lm_mask_prep *p, lm_constraint *const *cons, int n) {
  double unused;
  lm_mask_prep_wait(p, &unused); /* never two at once */
  if (n > p->max_rows) n = p->max_rows;
  if (n <= 0) return;
  pthread_mutex_lock(&p->mu);
  memcpy(p->cons, cons, (size_t)n * sizeof *cons);
  p->n = n;
  p->host_s = 0;
  p->pending = 1;
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
}

void lm_mask_prep_wait(lm_mask_prep *p, double *host_s) {
  pthread_mutex_lock(&p->mu);
  while (p->pending)
    pthread_cond_wait(&p->cv, &p->mu);
  *host_s = p->host_s;
  p->host_s = 0;
  pthread_mutex_unlock(&p->mu);
}
