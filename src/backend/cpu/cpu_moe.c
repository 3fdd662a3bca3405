/* cpu_moe.c — Gemma 4 MoE routing and experts (modeling_gemma4.py Gemma4TextRouter,
 * Gemma4TextExperts). Experts run grouped: the tokens routed to one expert are gathered
 * and multiplied together, so prefill reads each expert's weights once per step. */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/cpu_matmul.h"
#include "base/status.h"

static lm_status moe_route_here(const lm_moe_route_args *a);
static lm_status moe_experts_here(lm_backend *be, const lm_moe_experts_args *a);

typedef struct moe_call {
  lm_backend *be;
  const lm_moe_experts_args *a;
} moe_call;

static lm_status moe_route_call(void *arg) { return moe_route_here(arg); }

static lm_status moe_experts_call(void *arg) {
  moe_call *c = arg;
  return moe_experts_here(c->be, c->a);
}

/* In a decode step's team these run on one thread (the experts' matmuls with no team). */
lm_status lm_cpu_moe_route(lm_backend *be, const lm_moe_route_args *a) {
  return lm_cpu_team_solo(lm_cpu_team_of(be), 0, moe_route_call, (void *)a);
}

lm_status lm_cpu_moe_experts(lm_backend *be, const lm_moe_experts_args *a) {
  moe_call c = {be, a};
  return lm_cpu_team_solo(lm_cpu_team_of(be), 1, moe_experts_call, &c);
}

/* softmax over all experts in f32, top-k, renormalize, × per_expert_scale. */
static lm_status moe_route_here(const lm_moe_route_args *a) {
  int64_t E = a->logits.cols;
  int k = a->top_k;
  const float *pes = a->per_expert_scale->data;
  for (int64_t t = 0; t < a->logits.rows; t++) {
    const float *lg = lm_cpu_row(a->logits, t);
    float mx = lg[0], prob[E];
    for (int64_t e = 1; e < E; e++)
      mx = lg[e] > mx ? lg[e] : mx;
    double sum = 0.0;
    for (int64_t e = 0; e < E; e++)
      sum += prob[e] = expf(lg[e] - mx);
    for (int64_t e = 0; e < E; e++)
      prob[e] = (float)(prob[e] / sum);
    int32_t *ids = (int32_t *)a->ids.data + t * a->ids.ld;
    float *w = lm_cpu_row(a->weights, t), wsum = 0.0f;
    for (int j = 0; j < k; j++) { /* selection by repeated max: E ≤ a few hundred */
      int64_t best = -1;
      for (int64_t e = 0; e < E; e++) {
        int taken = 0;
        for (int i = 0; i < j; i++)
          taken |= ids[i] == e;
        if (!taken && (best < 0 || prob[e] > prob[best])) best = e;
      }
      ids[j] = (int32_t)best;
      w[j] = prob[best];
      wsum += w[j];
    }
    for (int j = 0; j < k; j++)
      w[j] = w[j] / wsum * pes[ids[j]];
  }
  return LM_OK;
}

static lm_status expert_mm(lm_backend *be, float *y, int64_t ldy, const float *x, int64_t ldx,
                           int64_t m, const lm_weight *w, int64_t e) {
  lm_cpu_matmul_args mm = {.y = y,
                           .ldy = ldy,
                           .x = x,
                           .ldx = ldx,
                           .m = m,
                           .w = w,
                           .expert = e,
                           .prec = be->precision == LM_PRECISION_FAST ? LM_CPU_PREC_FAST
                                                                      : LM_CPU_PREC_F32};
  return lm_cpu_matmul(&mm);
}

static lm_status moe_experts_here(lm_backend *be, const lm_moe_experts_args *a) {
  int64_t T = a->x.rows, K = a->ids.cols, H = a->x.cols, I = a->gate->rows, E = a->gate->n_experts;
  if (a->scratch.rows < T * K || a->scratch.cols < 2 * I + 2 * H ||
      a->iscratch.cols < T * K + E + 1)
    return LM_ERRF(LM_ERR_INVALID, "moe_experts: workspace too small");
  /* Counting sort of the T*K (token, slot) pairs by expert, ascending expert id. */
  int32_t *start = a->iscratch.data, *order = start + E + 1;
  memset(start, 0, (size_t)(E + 1) * sizeof *start);
  for (int64_t i = 0; i < T * K; i++)
    start[((int32_t *)a->ids.data)[(i / K) * a->ids.ld + i % K] + 1]++;
  for (int64_t e = 0; e < E; e++)
    start[e + 1] += start[e];
  for (int64_t i = 0; i < T * K; i++) {
    int32_t e = ((int32_t *)a->ids.data)[(i / K) * a->ids.ld + i % K];
    order[start[e]++] = (int32_t)i;
  }
  for (int64_t e = E; e > 0; e--)
    start[e] = start[e - 1]; /* restore the bucket starts */
  start[0] = 0;
  for (int64_t t = 0; t < T; t++)
    memset(lm_cpu_row(a->out, t), 0, (size_t)H * sizeof(float));
  int64_t ld = a->scratch.ld;
  float *xs = a->scratch.data, *g = xs + H, *u = g + I, *y = u + I; /* column blocks of each row */
  for (int64_t e = 0; e < E; e++) {
    int64_t n = start[e + 1] - start[e];
    if (!n) continue;
    for (int64_t j = 0; j < n; j++)
      memcpy(xs + j * ld, lm_cpu_row(a->x, order[start[e] + j] / K), (size_t)H * sizeof(float));
    LM_TRY(expert_mm(be, g, ld, xs, ld, n, a->gate, e));
    LM_TRY(expert_mm(be, u, ld, xs, ld, n, a->up, e));
    for (int64_t j = 0; j < n; j++)
      lm_cpu_vec_of(be)->geglu(g + j * ld, g + j * ld, u + j * ld, I);
    LM_TRY(expert_mm(be, y, ld, g, ld, n, a->down, e));
    for (int64_t j = 0; j < n; j++) {
      int64_t pair = order[start[e] + j], t = pair / K;
      float w = lm_cpu_row(a->weights, t)[pair % K], *o = lm_cpu_row(a->out, t);
      for (int64_t i = 0; i < H; i++)
        o[i] += w * y[j * ld + i];
    }
  }
  return LM_OK;
}
