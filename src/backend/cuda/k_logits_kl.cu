/* k_logits_kl.cu — the KL between two sets of logit rows, on the device (the logits_kl op:
 * lumen quantize's sweep compares every candidate with the reference there, so a 262k
 * vocabulary's rows never cross to the host). One block of 1024 threads per row, three passes:
 * the two maxima (exact in f32), the two sums of exponentials in f64, then
 * Σ p_ref (log p_ref − log p_x) in f64 — logit_stats.c's row_kl, summed in a tree instead of
 * left to right (the last bits differ; nothing compares them with the host's). */
#include <math.h>

#include "backend/cuda/k_common.cuh"

using namespace lmcu;

namespace {

constexpr int kThreads = 1024, kWarps = kThreads / 32;

__device__ float block_max(float v, float *sh) {
  v = warp_max(v);
  __syncthreads(); /* sh may still be read from the previous reduction */
  if (threadIdx.x % 32 == 0) sh[threadIdx.x / 32] = v;
  __syncthreads();
  v = -INFINITY;
  for (int w = 0; w < kWarps; w++)
    v = fmaxf(v, sh[w]);
  return v;
}

__device__ double block_sum(double v, double *sh) {
  for (int o = 16; o; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (threadIdx.x % 32 == 0) sh[threadIdx.x / 32] = v;
  __syncthreads();
  v = 0;
  for (int w = 0; w < kWarps; w++)
    v += sh[w];
  return v;
}

__global__ void __launch_bounds__(kThreads) k_logits_kl(lm_cu_t kl, lm_cu_t x, lm_cu_t ref) {
  pdl_wait();
  __shared__ float shf[kWarps];
  __shared__ double shd[kWarps];
  const int64_t r = blockIdx.x, V = x.cols;
  const float *g = (const float *)x.p + r * x.ld, *q = (const float *)ref.p + r * ref.ld;
  float mg = -INFINITY, mr = -INFINITY;
  for (int64_t i = threadIdx.x; i < V; i += kThreads)
    mg = fmaxf(mg, g[i]), mr = fmaxf(mr, q[i]);
  mg = block_max(mg, shf);
  mr = block_max(mr, shf);
  double sg = 0, sr = 0;
  for (int64_t i = threadIdx.x; i < V; i += kThreads) {
    sg += exp((double)g[i] - mg);
    sr += exp((double)q[i] - mr);
  }
  const double zg = mg + log(block_sum(sg, shd)), zr = mr + log(block_sum(sr, shd));
  double k = 0;
  for (int64_t i = threadIdx.x; i < V; i += kThreads) {
    const double lr = q[i] - zr, lg = g[i] - zg;
    k += exp(lr) * (lr - lg);
  }
  k = block_sum(k, shd);
  if (threadIdx.x == 0) ((float *)kl.p)[r * kl.ld] = (float)k;
}

} // namespace

extern "C" cudaError_t lm_cu_logits_kl(lm_cu_stream s, lm_cu_t kl, lm_cu_t x, lm_cu_t ref) {
  if (x.rows <= 0) return cudaSuccess;
  launch(k_logits_kl, (unsigned)x.rows, kThreads, 0, s, kl, x, ref);
  return cudaGetLastError();
}
