/* logit_stats.c — KL, argmax agreement and NLL over logit rows (see logit_stats.h). */
#include "model/logit_stats.h"

#include <math.h>

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

void lm_logits_kl(const float *ref, const float *got, int64_t T, int64_t V, double *kl,
                  int64_t *agree) {
  int64_t same = 0;
  double sum = 0;
  /* rows in parallel, summed in position order: the same bits for any thread count */
#pragma omp parallel for schedule(static) reduction(+ : same) ordered
  for (int64_t t = 0; t < T; t++) {
    const float *r = ref + t * V, *g = got + t * V;
    double k = row_kl(r, g, V);
    same += argmax(r, V) == argmax(g, V);
#pragma omp ordered
    sum += k / (double)T;
  }
  *kl = sum;
  *agree = same;
}

double lm_logits_nll(const float *logits, const int32_t *next, int64_t T, int64_t V) {
  double nll = 0;
  for (int64_t t = 0; t < T; t++) {
    const float *r = logits + t * V;
    nll += (log_sum_exp(r, V, r[argmax(r, V)]) - r[next[t]]) / (double)T;
  }
  return nll;
}
