/* logit_stats.c — KL, argmax agreement and NLL over logit rows (see logit_stats.h). */
#include "model/logit_stats.h"

#include <math.h>
#include <stdlib.h>

static int64_t argmax(const float *r, int64_t V) {
  int64_t a = 0;
  for (int64_t i = 1; i < V; i++)
    if (r[i] > r[a]) a = i;
  return a;
}

/* log Σ exp(r[i]) with the max taken out. */
static double log_sum_exp(const float *r, int64_t V, double mx) {
  double s = 0;
  for (int64_t i = 0; i < V; i++)
    s += exp(r[i] - mx);
  return mx + log(s);
}

/* KL(softmax(r) ‖ softmax(g)) of one row. */
static double row_kl(const float *r, const float *g, int64_t V) {
  double zr = log_sum_exp(r, V, r[argmax(r, V)]), zg = log_sum_exp(g, V, g[argmax(g, V)]), k = 0;
  for (int64_t i = 0; i < V; i++) {
    double lr = r[i] - zr, lg = g[i] - zg;
    k += exp(lr) * (lr - lg);
  }
  return k;
}

/* The mean of the rows' KLs, summed in position order (the same bits for any thread count). An
 * `ordered` sum inside the parallel loop would serialize it: with static chunks each thread's
 * first ordered step waits for the whole chunk before it. */
static double mean_in_order(const double *k, int64_t T) {
  double sum = 0;
  for (int64_t t = 0; t < T; t++)
    sum += k[t] / (double)T;
  return sum;
}

void lm_logits_kl(const float *ref, const float *got, int64_t T, int64_t V, double *kl,
                  int64_t *agree) {
  int64_t same = 0;
  double *k = malloc((size_t)(T ? T : 1) * sizeof(double));
  if (!k) {
    *kl = NAN, *agree = 0;
    return;
  }
#pragma omp parallel for schedule(static) reduction(+ : same)
  for (int64_t t = 0; t < T; t++) {
    const float *r = ref + t * V, *g = got + t * V;
    k[t] = row_kl(r, g, V);
    same += argmax(r, V) == argmax(g, V);
  }
  *kl = mean_in_order(k, T);
  *agree = same;
  free(k);
}

int lm_logits_ref_init(lm_logits_ref *r, const float *ref, int64_t T, int64_t V) {
  r->T = T, r->V = V;
  r->lp = malloc((size_t)(T * V) * sizeof(double));
  r->p = malloc((size_t)(T * V) * sizeof(double));
  r->argmax = malloc((size_t)(T ? T : 1) * sizeof(int64_t));
  if (!r->lp || !r->p || !r->argmax) return lm_logits_ref_free(r), -1;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; t++) {
    const float *x = ref + t * V;
    r->argmax[t] = argmax(x, V);
    double z = log_sum_exp(x, V, x[r->argmax[t]]);
    for (int64_t i = 0; i < V; i++) {
      r->lp[t * V + i] = x[i] - z;
      r->p[t * V + i] = exp(x[i] - z);
    }
  }
  return 0;
}

void lm_logits_kl_ref(const lm_logits_ref *r, const float *got, double *kl, int64_t *agree) {
  int64_t same = 0, V = r->V;
  double *k = malloc((size_t)(r->T ? r->T : 1) * sizeof(double));
  if (!k) {
    *kl = NAN, *agree = 0;
    return;
  }
#pragma omp parallel for schedule(static) reduction(+ : same)
  for (int64_t t = 0; t < r->T; t++) {
    const float *g = got + t * V;
    const double *lp = r->lp + t * V, *p = r->p + t * V;
    int64_t ag = argmax(g, V);
    double zg = log_sum_exp(g, V, g[ag]), kt = 0;
    for (int64_t i = 0; i < V; i++)
      kt += p[i] * (lp[i] - (g[i] - zg)); /* row_kl's terms, in its order */
    k[t] = kt;
    same += r->argmax[t] == ag;
  }
  *kl = mean_in_order(k, r->T);
  *agree = same;
  free(k);
}

void lm_logits_ref_free(lm_logits_ref *r) {
  free(r->lp), free(r->p), free(r->argmax);
  r->lp = r->p = NULL;
  r->argmax = NULL;
}

double lm_logits_nll(const float *logits, const int32_t *next, int64_t T, int64_t V) {
  double nll = 0;
  for (int64_t t = 0; t < T; t++) {
    const float *r = logits + t * V;
    nll += (log_sum_exp(r, V, r[argmax(r, V)]) - r[next[t]]) / (double)T;
  }
  return nll;
}
