/* k_lora.cu — the LoRA ops on the device (backend.h lm_lora_shrink_args; cuda_kernels.h
 * lm_cu_lora). The shrink computes t = weight · A x with a warp per (row, module, pick, rank
 * index): a dot of one A row with x over the whole input, so the result has one summation
 * order whatever the batch holds. The expand is normally the GEMV's epilogue (store_y); the
 * kernel here serves the products that run through cuBLAS. Rows read their picks and the
 * tables when the kernel runs, so a replayed graph follows what is mounted now. */
#include "backend/cuda/k_gemv_common.cuh"

using namespace lmcu;

namespace {

constexpr int kWarps = 4; /* rank indices per block */

struct ShrinkP {
  lm_cu_t x;
  lm_cu_lora m[3];
  int n, picks, groups;
};

/* Σ a[i] · x[i] over K, lanes striding 8 elements (16 bytes) at a time. */
__device__ float dot_bf16(const uint16_t *a, const uint16_t *x, int64_t K, int lane) {
  float s0 = 0.0f, s1 = 0.0f;
  for (int64_t c = (int64_t)lane * 8; c < K; c += 256) {
    const uint4 av = *reinterpret_cast<const uint4 *>(a + c);
    const uint4 xv = *reinterpret_cast<const uint4 *>(x + c);
    const uint32_t aw[4] = {av.x, av.y, av.z, av.w}, xw[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
      s0 = fmaf(bf2f(aw[i] & 0xffffu), bf2f(xw[i] & 0xffffu), s0);
      s1 = fmaf(bf2f(aw[i] >> 16), bf2f(xw[i] >> 16), s1);
    }
  }
  return s0 + s1;
}

__device__ float dot_any(const void *a, int adt, const lm_cu_t &x, int64_t row, int64_t K,
                         int lane) {
  float s = 0.0f;
  for (int64_t c = lane; c < K; c += 32)
    s = fmaf(ld(a, adt, c), ldt(x, row, c), s);
  return s;
}

__global__ void k_lora_shrink(ShrinkP p) {
  pdl_wait();
  const int64_t row = blockIdx.y;
  int b = blockIdx.x;
  const int g = b % p.groups;
  b /= p.groups;
  const int j = b % p.picks, mi = b / p.picks;
  const lm_cu_lora &l = p.m[mi];
  const lm_cu_lora_pick pk = l.picks[(l.row0 + row) * LM_CU_LORA_PICKS + j];
  if (pk.slot < 0) return;
  const lm_cu_lora_ent e = l.tab[pk.slot];
  const int k = g * kWarps + (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32;
  if (k >= e.rank) return;
  const int64_t K = p.x.cols;
  const bool vec = l.wdt == LM_CU_BF16 && p.x.dt == LM_CU_BF16 && K % 8 == 0 && p.x.ld % 8 == 0;
  const float s =
      vec ? dot_bf16((const uint16_t *)e.a + k * K, (const uint16_t *)p.x.p + row * p.x.ld, K, lane)
          : dot_any(l.wdt == LM_CU_BF16 ? (const void *)((const uint16_t *)e.a + k * K)
                                        : (const void *)((const float *)e.a + k * K),
                    l.wdt, p.x, row, K, lane);
  const float tot = warp_sum(s);
  if (lane == 0) l.t[(l.row0 + row) * l.t_ld + j * l.rank_stride + k] = pk.weight * tot;
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
  ShrinkP p = {x, {}, n, picks, (mods[0].rank_stride + kWarps - 1) / kWarps};
  for (int i = 0; i < n; i++)
    p.m[i] = mods[i];
  dim3 grid((unsigned)(n * picks * p.groups), (unsigned)x.rows);
  return launch(k_lora_shrink, grid, dim3(32 * kWarps), 0, s, p);
}

cudaError_t lm_cu_lora_expand(lm_cu_stream s, lm_cu_t y, const lm_cu_lora *l) {
  if (y.rows <= 0) return cudaSuccess;
  if (y.rows > 65535) return cudaErrorInvalidValue;
  dim3 grid((unsigned)((y.cols + 255) / 256), (unsigned)y.rows);
  return launch(k_lora_expand, grid, dim3(256), 0, s, y, *l);
}
