/* k_lora.cu — the LoRA ops on the device (backend.h lm_lora_shrink_args; cuda_kernels.h
 * lm_cu_lora). The shrink computes t = weight · A x with a block per (row, module, pick,
 * rank index). The expand is normally the GEMV's epilogue (store_y); the
 * kernel here serves the products that run through cuBLAS. Rows read their picks and the
 * tables when the kernel runs, so a replayed graph follows what is mounted now. */
#include "backend/cuda/k_gemv_common.cuh"

using namespace lmcu;

namespace {

/* A block per (row, module, pick, rank index): the dot of one A row with x, its threads each
 * loading their pieces at once (kLoads 16-byte pieces in flight), then one reduction in a fixed
 * order, so t has one summation order whatever the batch holds. */
constexpr int kThreads = 256, kLoads = 4;

struct ShrinkP {
  lm_cu_t x;
  lm_cu_lora m[3];
  int n, picks, rank;
};

/* This thread's part of Σ a[i] · x[i] (bf16 both, K a multiple of 8). */
__device__ float part_bf16(const uint16_t *a, const uint16_t *x, int64_t K) {
  float s0 = 0.0f, s1 = 0.0f;
  for (int64_t c0 = (int64_t)threadIdx.x * 8; c0 < K; c0 += (int64_t)kThreads * 8 * kLoads) {
    uint4 av[kLoads], xv[kLoads];
#pragma unroll
    for (int u = 0; u < kLoads; u++) {
      const int64_t c = c0 + (int64_t)u * kThreads * 8;
      av[u] = c < K ? *reinterpret_cast<const uint4 *>(a + c) : make_uint4(0, 0, 0, 0);
      xv[u] = c < K ? *reinterpret_cast<const uint4 *>(x + c) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kLoads; u++) {
      const uint32_t aw[4] = {av[u].x, av[u].y, av[u].z, av[u].w},
                     xw[4] = {xv[u].x, xv[u].y, xv[u].z, xv[u].w};
#pragma unroll
      for (int i = 0; i < 4; i++) {
        s0 = fmaf(bf2f(aw[i] & 0xffffu), bf2f(xw[i] & 0xffffu), s0);
        s1 = fmaf(bf2f(aw[i] >> 16), bf2f(xw[i] >> 16), s1);
      }
    }
  }
  return s0 + s1;
}

__device__ float part_any(const void *a, int adt, const lm_cu_t &x, int64_t row, int64_t K) {
  float s = 0.0f;
  for (int64_t c = threadIdx.x; c < K; c += kThreads)
    s = fmaf(ld(a, adt, c), ldt(x, row, c), s);
  return s;
}

__global__ void __launch_bounds__(kThreads) k_lora_shrink(ShrinkP p) {
  __shared__ float red[kThreads / 32];
  const int64_t row = blockIdx.y;
  int b = blockIdx.x;
  const int k = b % p.rank;
  b /= p.rank;
  const int j = b % p.picks, mi = b / p.picks;
  const lm_cu_lora &l = p.m[mi];
  /* the tables and picks are uploaded before the step: read them before the wait */
  const lm_cu_lora_pick pk = l.picks[(l.row0 + row) * LM_CU_LORA_PICKS + j];
  const lm_cu_lora_ent e = pk.slot >= 0 ? l.tab[pk.slot] : lm_cu_lora_ent{};
  pdl_wait();
  if (pk.slot < 0 || k >= e.rank) return;
  const int64_t K = p.x.cols;
  const bool vec = l.wdt == LM_CU_BF16 && p.x.dt == LM_CU_BF16 && K % 8 == 0 && p.x.ld % 8 == 0;
  float s =
      vec ? part_bf16((const uint16_t *)e.a + k * K, (const uint16_t *)p.x.p + row * p.x.ld, K)
          : part_any(l.wdt == LM_CU_BF16 ? (const void *)((const uint16_t *)e.a + k * K)
                                         : (const void *)((const float *)e.a + k * K),
                     l.wdt, p.x, row, K);
  s = warp_sum(s);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = s;
  __syncthreads();
  if (threadIdx.x) return;
  float tot = 0.0f;
  for (int w = 0; w < kThreads / 32; w++)
    tot += red[w];
  l.t[(l.row0 + row) * l.t_ld + j * l.rank_stride + k] = pk.weight * tot;
}

__global__ void k_lora_expand(lm_cu_t y, lm_cu_lora l) {
  pdl_wait();
  const int64_t r = blockIdx.y, c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= y.cols) return;
  stt(y, r, c, ldt(y, r, c) + lora_term(l, r, c));
}

} // namespace

cudaError_t lm_cu_lora_shrink(lm_cu_stream s, lm_cu_t x, int n, const lm_cu_lora *mods, int picks) {
  if (n < 1 || n > 3 || picks < 1 || picks > LM_CU_LORA_PICKS || x.rows <= 0 || x.rows > 65535)
    return cudaErrorInvalidValue;
  ShrinkP p = {x, {}, n, picks, mods[0].rank_stride};
  for (int i = 0; i < n; i++)
    p.m[i] = mods[i];
  dim3 grid((unsigned)(n * picks * p.rank), (unsigned)x.rows);
  return launch(k_lora_shrink, grid, dim3(kThreads), 0, s, p);
}

cudaError_t lm_cu_lora_expand(lm_cu_stream s, lm_cu_t y, const lm_cu_lora *l) {
  if (y.rows <= 0) return cudaSuccess;
  if (y.rows > 65535) return cudaErrorInvalidValue;
  dim3 grid((unsigned)((y.cols + 255) / 256), (unsigned)y.rows);
  return launch(k_lora_expand, grid, dim3(256), 0, s, y, *l);
}
