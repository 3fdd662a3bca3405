/* k_gemm.cu — prefill-side matrix helpers: dequantizing weight rows to f32/bf16 tiles (which
 * cuBLAS then multiplies on the tensor cores, see cuda_matmul.c), and the gathered GEMM of
 * MoE prefill, whose per-expert row counts exist only in device memory (the routing never
 * crosses to the host). The gathered GEMM is a plain shared-memory tiled f32 kernel
 * (64×64 outputs, k-steps of 32, 4×4 per thread) that dequantizes as it loads. */
#include "backend/cuda/k_common.cuh"

using namespace lmcu;

namespace {

constexpr int kThreads = 256;
constexpr int kBM = 64, kBN = 64, kBK = 32;

__global__ void __launch_bounds__(kThreads)
    k_dequant_rows(lm_cu_w w, int64_t e, int64_t r0, void *dst, int dt) {
  pdl_wait();
  int64_t r = blockIdx.y, c = (int64_t)blockIdx.x * kThreads + threadIdx.x;
  if (c >= w.cols) return;
  st(dst, dt, r * w.cols + c, w_at(w, e, r0 + r, c));
}

__global__ void __launch_bounds__(kThreads) k_gemm_gathered(const lm_cu_gather_mm_p p) {
  pdl_wait();
  __shared__ float As[kBK][kBM + 4];
  __shared__ float Bs[kBK][kBN + 4];
  __shared__ int prow[kBM];
  const int e = blockIdx.z;
  const int64_t j0 = (int64_t)blockIdx.y * kBM, n0 = (int64_t)blockIdx.x * kBN;
  const int64_t s0 = p.start[e], cnt = p.start[e + 1] - s0, N = p.w.rows, K = p.w.cols;
  if (j0 >= cnt) return;
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  if (tid < kBM) prow[tid] = j0 + tid < cnt ? p.order[s0 + j0 + tid] : -1;
  __syncthreads();
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < K; k0 += kBK) {
    for (int i = tid; i < kBM * kBK; i += kThreads) {
      int rl = i / kBK, kk = i % kBK, pr = prow[rl];
      int64_t k = k0 + kk;
      As[kk][rl] = pr >= 0 && k < K ? ldt(p.x, pr / p.x_div, k) : 0.0f;
    }
    for (int i = tid; i < kBN * kBK; i += kThreads) {
      int nl = i / kBK, kk = i % kBK;
      int64_t n = n0 + nl, k = k0 + kk;
      Bs[kk][nl] = n < N && k < K ? w_at(p.w, e, n, k) : 0.0f;
    }
    __syncthreads();
#pragma unroll 8
    for (int kk = 0; kk < kBK; kk++) {
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; i++)
        a[i] = As[kk][ty * 4 + i], b[i] = Bs[kk][tx * 4 + i];
#pragma unroll
      for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
          acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; i++) {
    int pr = prow[ty * 4 + i];
    if (pr < 0) continue;
#pragma unroll
    for (int j = 0; j < 4; j++) {
      int64_t n = n0 + tx * 4 + j;
      if (n < N) stt(p.y, pr, n, acc[i][j]);
    }
  }
}

} // namespace

extern "C" {

cudaError_t lm_cu_dequant_rows(lm_cu_stream s, const lm_cu_w *w, int64_t e, int64_t r0, int64_t n,
                               void *dst, int dt) {
  if (n <= 0) return cudaSuccess;
  if (n > 65535) return cudaErrorInvalidValue;
  launch(k_dequant_rows, dim3((unsigned)((w->cols + kThreads - 1) / kThreads), (unsigned)n),
         kThreads, 0, s, *w, e, r0, dst, dt);
  return cudaGetLastError();
}

cudaError_t lm_cu_gemm_gathered(lm_cu_stream s, const lm_cu_gather_mm_p *p) {
  int64_t ne = p->w.n_experts ? p->w.n_experts : 1, ty = (p->max_rows + kBM - 1) / kBM;
  if (p->max_rows <= 0) return cudaSuccess;
  if (ty > 65535 || ne > 65535) return cudaErrorInvalidValue;
  dim3 grid((unsigned)((p->w.rows + kBN - 1) / kBN), (unsigned)ty, (unsigned)ne);
  launch(k_gemm_gathered, grid, kThreads, 0, s, *p);
  return cudaGetLastError();
}

} // extern "C"
