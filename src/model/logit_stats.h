/* logit_stats.h — how far one model's next-token distributions are from another's over the
 * same teacher-forced positions: the measure of every quality choice (KV kinds, weight widths). */
#ifndef LM_MODEL_LOGIT_STATS_H
#define LM_MODEL_LOGIT_STATS_H

#include <stdint.h>

/* Mean over T positions of KL(softmax(ref) ‖ softmax(got)) in nats, computed in f64, and the
 * number of positions whose argmax (lowest id on ties) agrees. ref, got: [T][V] logits. Rows
 * run in parallel and are summed in position order (the same bits for any thread count); kl is
 * NaN when T doubles of scratch cannot be had. */
void lm_logits_kl(const float *ref, const float *got, int64_t T, int64_t V, double *kl,
                  int64_t *agree);

/* A reference's log-probabilities and probabilities kept for many comparisons (a sweep compares
 * thousands of candidates with one reference): lm_logits_kl_ref gives lm_logits_kl's bits with a
 * third of its exponentials. 16 bytes per logit. */
typedef struct lm_logits_ref {
  int64_t T, V;
  double *lp, *p;  /* [T][V] */
  int64_t *argmax; /* [T] */
} lm_logits_ref;
int lm_logits_ref_init(lm_logits_ref *r, const float *ref, int64_t T, int64_t V); /* 0, or -1 OOM */
void lm_logits_kl_ref(const lm_logits_ref *r, const float *got, double *kl, int64_t *agree);
void lm_logits_ref_free(lm_logits_ref *r);

/* Mean negative log-likelihood (nats) of next[t] under softmax(logits[t]) over T positions:
 * exp of it is the perplexity. */
double lm_logits_nll(const float *logits, const int32_t *next, int64_t T, int64_t V);

#endif
