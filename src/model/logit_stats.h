/* logit_stats.h — how far one model's next-token distributions are from another's over the
 * same teacher-forced positions: the measure of every quality choice (KV kinds, weight widths). */
#ifndef LM_MODEL_LOGIT_STATS_H
#define LM_MODEL_LOGIT_STATS_H

#include <stdint.h>

/* Mean over T positions of KL(softmax(ref) ‖ softmax(got)) in nats, computed in f64, and the
 * number of positions whose argmax (lowest id on ties) agrees. ref, got: [T][V] logits. */
void lm_logits_kl(const float *ref, const float *got, int64_t T, int64_t V, double *kl,
                  int64_t *agree);

/* Mean negative log-likelihood (nats) of next[t] under softmax(logits[t]) over T positions:
 * exp of it is the perplexity. */
double lm_logits_nll(const float *logits, const int32_t *next, int64_t T, int64_t V);

#endif
