/* k_common.cuh — device helpers shared by the CUDA backend's kernels: bf16/f16 conversion
 * with the host's rounding (round-to-nearest-even, NaN kept), activation loads/stores by
 * dtype, warp reductions, and the scalar weight accessor that defines the dequantization
 * every fast kernel must agree with (w = scale*q + bias, codes LSB-first per row). */
#ifndef LM_BACKEND_CUDA_K_COMMON_CUH
#define LM_BACKEND_CUDA_K_COMMON_CUH

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "backend/cuda/cuda_kernels.h"

/* lm_dtype values the kernels see (tensor/dtype.h; kept in sync by a static_assert in k_rows.cu).
 */
#define LM_CU_F32 0
#define LM_CU_F16 1
#define LM_CU_BF16 2

namespace lmcu {

/* Programmatic dependent launch (Hopper): every kernel is launched with launch() below, which
 * lets it start before the previous kernel in the stream has finished, and every kernel calls
 * pdl_wait() before it touches memory an earlier kernel writes (and before it writes any).
 * pdl_wait() blocks until the previous kernel has completed and its writes are visible, then
 * lets the next kernel launch; so at most two kernels overlap, and a kernel may load read-only
 * data before its wait — the tensor-core GEMV issues its first weight loads there, so that DRAM
 * round trip overlaps the previous kernel's tail. In a kernel launched without the attribute
 * (s.pdl == 0: LUMEN_CUDA_PDL=0, read by the backend) pdl_wait() returns at once. */
__device__ __forceinline__ void pdl_wait() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");
}

template <typename... P, typename... A>
inline cudaError_t launch(void (*fn)(P...), dim3 grid, dim3 block, size_t smem, lm_cu_stream s,
                          A &&...args) {
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = s.stream;
  cfg.attrs = at, cfg.numAttrs = s.pdl ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, fn, static_cast<P>(args)...);
}

__device__ __forceinline__ float bf2f(uint32_t h) { return __uint_as_float(h << 16); }

__device__ __forceinline__ uint16_t f2bf(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

/* Rounds to the precision a tensor of dtype dt stores (identity for f32). */
__device__ __forceinline__ float rnd(int dt, float v) {
  return dt == LM_CU_BF16 ? bf2f(f2bf(v)) : v;
}

__device__ __forceinline__ float f16f(uint16_t h) { return __half2float(__ushort_as_half(h)); }

__device__ __forceinline__ float ld(const void *p, int dt, int64_t i) {
  if (dt == LM_CU_BF16) return bf2f(((const uint16_t *)p)[i]);
  if (dt == LM_CU_F16) return f16f(((const uint16_t *)p)[i]);
  return ((const float *)p)[i];
}

__device__ __forceinline__ void st(void *p, int dt, int64_t i, float v) {
  if (dt == LM_CU_BF16)
    ((uint16_t *)p)[i] = f2bf(v);
  else if (dt == LM_CU_F16)
    ((uint16_t *)p)[i] = __half_as_ushort(__float2half_rn(v));
  else
    ((float *)p)[i] = v;
}

__device__ __forceinline__ float ldt(const lm_cu_t &t, int64_t r, int64_t c) {
  return ld(t.p, t.dt, r * t.ld + c);
}
__device__ __forceinline__ void stt(const lm_cu_t &t, int64_t r, int64_t c, float v) {
  st(t.p, t.dt, r * t.ld + c, v);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o; o >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/* Scale and bias of group g of a pair array. */
__device__ __forceinline__ float2 sb_at(const void *sb, int kind, int64_t g) {
  if (kind == LM_CU_SB_F32) return ((const float2 *)sb)[g];
  uint32_t u = ((const uint32_t *)sb)[g];
  if (kind == LM_CU_SB_BF16) return make_float2(bf2f(u & 0xffffu), bf2f(u >> 16));
  return make_float2(f16f((uint16_t)(u & 0xffffu)), f16f((uint16_t)(u >> 16)));
}

/* Element (r, c) of expert e, dequantized to f32: the reference every fast path matches. */
__device__ __forceinline__ float w_at(const lm_cu_w &w, int64_t e, int64_t r, int64_t c) {
  int64_t row = e * w.rows + r;
  const uint8_t *base = (const uint8_t *)w.data + row * w.row_bytes;
  if (!w.bits) return ld(base, w.wdt, c);
  uint64_t bp = (uint64_t)c * (uint64_t)w.bits;
  uint32_t v = base[bp >> 3];
  if ((bp & 7) + (uint64_t)w.bits > 8)
    v |= (uint32_t)base[(bp >> 3) + 1] << 8; /* a code spans 2 bytes at most */
  uint32_t q = (v >> (bp & 7)) & ((1u << w.bits) - 1u);
  float2 sbv = sb_at(w.sb, w.sb_kind, row * (w.cols / w.group) + c / w.group);
  return sbv.x * (float)q + sbv.y;
}

__device__ __forceinline__ float gelu_tanh(float x) {
  const float k = 0.7978845608028654f; /* sqrt(2/pi) */
  return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

/* One RoPE pair (x0 at i, x1 at i + hd/2). bf16: cos/sin are cast to the activation dtype and
 * each product and sum rounds, as torch does; rnd is the identity for f32. */
__device__ __forceinline__ void rope_pair(int dt, float x0, float x1, float c, float s, float &y0,
                                          float &y1) {
  c = rnd(dt, c);
  s = rnd(dt, s);
  y0 = rnd(dt, x0 * c) - rnd(dt, x1 * s);
  y1 = rnd(dt, x1 * c) + rnd(dt, x0 * s);
}

/* RMSNorm(v) * w (w NULL: no scale), then RoPE at position pos, of one head held by a warp:
 * lane l holds the EPL consecutive values from l·EPL, so its RoPE partners sit in lane l ^ 16.
 * The normed value is rounded to dt (the stored tensor's dtype) before the rotation, as the
 * separate ops store it; the result is left for the caller to store (or round). The q/k norm
 * kernel (k_rows.cu) and the decode attention's fused q norm (k_attention.cu) both use this,
 * so they agree bit for bit. */
template <int EPL>
__device__ __forceinline__ void norm_rope_lane(float (&v)[EPL], const float *w, float eps,
                                               float pos, const float *inv_freq, int dt, int lane) {
  constexpr int HALF = 16 * EPL;
  float ss = 0.0f;
#pragma unroll
  for (int e = 0; e < EPL; e++)
    ss += v[e] * v[e];
  ss = warp_sum(ss);
  const float inv = 1.0f / sqrtf(ss / (float)(32 * EPL) + eps);
  const bool lo = lane < 16;
#pragma unroll
  for (int e = 0; e < EPL; e++) {
    const int c = lane * EPL + e;
    const float y = rnd(dt, w ? v[e] * inv * w[c] : v[e] * inv);
    const float o = __shfl_xor_sync(0xffffffffu, y, 16);
    const float ang = pos * inv_freq[c % HALF];
    float cs, sn, y0, y1;
    sincosf(ang, &sn, &cs);
    rope_pair(dt, lo ? y : o, lo ? o : y, cs, sn, y0, y1); /* this lane holds x0 (lo) or x1 */
    v[e] = lo ? y0 : y1;
  }
}

} // namespace lmcu

#endif
