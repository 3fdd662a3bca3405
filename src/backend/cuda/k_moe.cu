/* k_moe.cu — Gemma 4 MoE routing on the device (Gemma4TextRouter: softmax over all experts
 * in f32, top-k, renormalize, × per_expert_scale), the stable counting sort of (token, slot)
 * pairs by expert for grouped prefill, and the weighted combine of the experts' outputs. */
#include <math.h>

#include "backend/cuda/k_common.cuh"

using namespace lmcu;

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kSortChunk = 4096;

/* One warp per token; probabilities in shared memory ([8][E] floats). Top-k by repeated
 * argmax with ties to the lowest expert id, as the CPU's selection does. */
__global__ void __launch_bounds__(kThreads)
    k_route(lm_cu_t ids, lm_cu_t wts, lm_cu_t lg, int k, const float *pes) {
  pdl_wait();
  extern __shared__ float prob_all[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t t = (int64_t)blockIdx.x * kWarps + warp, E = lg.cols;
  if (t >= lg.rows) return;
  float *pr = prob_all + warp * E;
  float mx = -INFINITY;
  for (int64_t e = lane; e < E; e += 32) {
    float v = ldt(lg, t, e);
    pr[e] = v;
    mx = fmaxf(mx, v);
  }
  mx = warp_max(mx);
  float sum = 0.0f;
  for (int64_t e = lane; e < E; e += 32) {
    float v = expf(pr[e] - mx);
    pr[e] = v;
    sum += v;
  }
  sum = warp_sum(sum);
  for (int64_t e = lane; e < E; e += 32)
    pr[e] /= sum;
  __syncwarp();
  int32_t *id_row = (int32_t *)ids.p + t * ids.ld;
  float wsum = 0.0f;
  for (int j = 0; j < k; j++) {
    float bv = -1.0f;
    int64_t bi = -1;
    for (int64_t e = lane; e < E; e += 32)
      if (pr[e] > bv) bv = pr[e], bi = e; /* taken experts hold -1 and never win */
    for (int o = 16; o; o >>= 1) {
      float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      int64_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) bv = ov, bi = oi;
    }
    wsum += bv;
    if (lane == 0) {
      id_row[j] = (int32_t)bi;
      stt(wts, t, j, bv);
      pr[bi] = -1.0f;
    }
    __syncwarp();
  }
  if (lane == 0)
    for (int j = 0; j < k; j++)
      stt(wts, t, j, ldt(wts, t, j) / wsum * pes[id_row[j]]);
}

/* One block. Thread e counts, then places, the pairs routed to expert e in pair order, so
 * the order is stable (and deterministic). The ids are staged through shared memory. */
__global__ void __launch_bounds__(kThreads)
    k_sort(lm_cu_t ids, int64_t E, int32_t *start, int32_t *order) {
  pdl_wait();
  extern __shared__ int32_t sm[];
  int32_t *cnt = sm, *buf = sm + E;
  const int64_t K = ids.cols, P = ids.rows * K;
  for (int64_t e = threadIdx.x; e < E; e += kThreads)
    cnt[e] = 0;
  for (int pass = 0; pass < 2; pass++) {
    for (int64_t base = 0; base < P; base += kSortChunk) {
      int64_t n = P - base < kSortChunk ? P - base : kSortChunk;
      __syncthreads();
      for (int64_t i = threadIdx.x; i < n; i += kThreads) {
        int64_t q = base + i;
        buf[i] = ((const int32_t *)ids.p)[(q / K) * ids.ld + q % K];
      }
      __syncthreads();
      for (int64_t e = threadIdx.x; e < E; e += kThreads) {
        int32_t c = cnt[e];
        if (pass == 0) {
          for (int64_t i = 0; i < n; i++)
            c += buf[i] == e;
        } else {
          for (int64_t i = 0; i < n; i++)
            if (buf[i] == e) order[c++] = (int32_t)(base + i);
        }
        cnt[e] = c;
      }
    }
    __syncthreads();
    if (pass == 0 && threadIdx.x == 0) { /* counts -> bucket starts; cnt becomes the write cursor */
      int32_t acc = 0;
      for (int64_t e = 0; e < E; e++) {
        start[e] = acc;
        int32_t c = cnt[e];
        cnt[e] = acc;
        acc += c;
      }
      start[E] = acc;
    }
    __syncthreads();
  }
}

__global__ void __launch_bounds__(kThreads) k_combine(lm_cu_t out, lm_cu_t w, lm_cu_t y, int k) {
  pdl_wait();
  int64_t t = blockIdx.y, c = (int64_t)blockIdx.x * kThreads + threadIdx.x;
  if (c >= out.cols) return;
  float acc = 0.0f;
  for (int j = 0; j < k; j++)
    acc += ldt(w, t, j) * ldt(y, t * k + j, c);
  stt(out, t, c, acc);
}

} // namespace

extern "C" {

/* Decode (up to 4 tokens, and at most 65535 pairs: a grid's y extent) runs grouped GEMVs, one
 * group per (token, slot) pair reading its expert off the device ids; more tokens run
 * gathered GEMMs over the pairs sorted by expert. */
lm_cu_moe_kind lm_cu_pick_moe(const lm_cu_mm_p *pair, const lm_cu_switches *sw) {
  const int64_t tokens = pair->x.rows, top_k = pair->ids_k;
  if (tokens > 4 || tokens * top_k > 65535) return LM_CU_MOE_GATHERED;
  return lm_cu_pick_pair(pair, sw) == LM_CU_PAIR_FUSED ? LM_CU_MOE_GROUPED_PAIR : LM_CU_MOE_GROUPED;
}

cudaError_t lm_cu_moe_route(lm_cu_stream s, lm_cu_t ids, lm_cu_t weights, lm_cu_t logits, int top_k,
                            const float *per_expert_scale) {
  if (logits.rows <= 0) return cudaSuccess;
  size_t smem = (size_t)kWarps * (size_t)logits.cols * sizeof(float);
  if (smem > 48 * 1024 || top_k > logits.cols) return cudaErrorInvalidValue;
  launch(k_route, (unsigned)((logits.rows + kWarps - 1) / kWarps), kThreads, smem, s, ids, weights,
         logits, top_k, per_expert_scale);
  return cudaGetLastError();
}

cudaError_t lm_cu_moe_sort(lm_cu_stream s, lm_cu_t ids, int64_t n_experts, int32_t *start,
                           int32_t *order) {
  size_t smem = (size_t)(n_experts + kSortChunk) * sizeof(int32_t);
  if (smem > 48 * 1024) return cudaErrorInvalidValue;
  launch(k_sort, 1, kThreads, smem, s, ids, n_experts, start, order);
  return cudaGetLastError();
}

cudaError_t lm_cu_moe_combine(lm_cu_stream s, lm_cu_t out, lm_cu_t weights, lm_cu_t y, int top_k) {
  if (out.rows <= 0) return cudaSuccess;
  launch(k_combine, dim3((unsigned)((out.cols + kThreads - 1) / kThreads), (unsigned)out.rows),
         kThreads, 0, s, out, weights, y, top_k);
  return cudaGetLastError();
}

} // extern "C"
