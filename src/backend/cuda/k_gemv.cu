/* k_gemv.cu — decode matrix-vector products y[m] = x[m] · Wᵀ for m ≤ 4 per launch, reading
 * the weight once at full bandwidth: each lane streams 16-byte chunks of two rows (several
 * loads in flight), dequantization is fused, and x sits in shared memory as f32.
 *
 * Affine codes use the identity Σ_k (s·q_k + b)·x_k = s·Σ q_k·x_k + b·Σ x_k per group. A code
 * becomes a float without a conversion instruction: OR-ing it under the mantissa of 1.0
 * gives f = 1 + q/2^bits exactly, so Σ q·x = 2^bits·(Σ f·x − Σ x); Σ x is shared by the rows.
 * In shared memory each chunk's x values are followed by 4 pad floats, so the 16-byte reads
 * of 8 consecutive lanes fall in distinct banks.
 *
 * Three kernel families, chosen per weight: packed (2/4/8-bit, bf16 scale/bias pairs, rows a
 * multiple of 16 bytes), dense (f32/bf16/f16 rows a multiple of 16 bytes), and a generic one
 * (any layout, element by element through w_at). Instances: 27 + 9 + 3. */
#include "backend/cuda/k_common.cuh"

using namespace lmcu;

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kRpw = 2; /* rows per warp */

/* Where group g of the launch reads and writes (grouped MoE mode or a plain matrix). */
struct Route {
  int64_t e, xr, yr;
  bool ok;
};

__device__ __forceinline__ Route route(const lm_cu_mm_p &p) {
  Route r{p.expert, 0, 0, true};
  if (p.ids) {
    int64_t g = blockIdx.y, t = g / p.ids_k, k = g % p.ids_k;
    r.e = p.ids[t * p.ids_ld + k];
    r.xr = g / p.x_div;
    r.yr = g;
  }
  int64_t ne = p.w.n_experts ? p.w.n_experts : 1;
  if (r.e < 0 || r.e >= ne) r.ok = false, r.e = 0; /* a corrupt route writes zeros */
  return r;
}

template <int M>
__device__ __forceinline__ void store_rows(const lm_cu_mm_p &p, const Route &rt, int64_t r0, float (&acc)[kRpw][M]) {
  int lane = threadIdx.x % 32;
#pragma unroll
  for (int r = 0; r < kRpw; r++)
#pragma unroll
    for (int mi = 0; mi < M; mi++) acc[r][mi] = warp_sum(acc[r][mi]);
  if (lane) return;
#pragma unroll
  for (int r = 0; r < kRpw; r++) {
    if (r0 + r >= p.w.rows) break;
#pragma unroll
    for (int mi = 0; mi < M; mi++) {
      float v = rt.ok ? acc[r][mi] : 0.0f;
      if (p.accumulate) v += ldt(p.y, rt.yr + mi, r0 + r);
      stt(p.y, rt.yr + mi, r0 + r, v);
    }
  }
}

__device__ __forceinline__ uint32_t word_of(const uint4 &q, int w) { return w == 0 ? q.x : w == 1 ? q.y : w == 2 ? q.z : q.w; }

/* 1 + q/2^BITS for code i of a word, built with a shift and a mask. */
template <int BITS>
__device__ __forceinline__ float code_f(uint32_t wd, int i) {
  constexpr int SH = 23 - BITS;
  constexpr uint32_t MASK = ((1u << BITS) - 1u) << SH;
  int sh = BITS * i;
  uint32_t v = sh <= SH ? wd << (SH - sh) : wd >> (sh - SH);
  return __uint_as_float((v & MASK) | 0x3F800000u);
}

template <int BITS, int GROUP, int M>
__global__ void __launch_bounds__(kThreads) k_gemv_q(const lm_cu_mm_p p) {
  constexpr int CPC = 128 / BITS;                        /* codes per 16-byte chunk */
  constexpr int CPW = 32 / BITS;                         /* codes per word */
  constexpr int NG = CPC > GROUP ? CPC / GROUP : 1;      /* groups a chunk touches */
  constexpr int WPG = CPC > GROUP ? GROUP / CPW : 4;     /* words per group inside a chunk */
  constexpr int XP = CPC + 4;                            /* padded floats per chunk */
  extern __shared__ float4 smem4[];
  float *xs = reinterpret_cast<float *>(smem4);
  const Route rt = route(p);
  const int64_t cols = p.w.cols, nchunk = cols / CPC, XS = nchunk * XP, rows = p.w.rows;
  for (int mi = 0; mi < M; mi++) /* unrolled: several independent loads in flight per thread */
#pragma unroll 4
    for (int64_t c = threadIdx.x; c < cols; c += kThreads) xs[mi * XS + (c / CPC) * XP + c % CPC] = ldt(p.x, rt.xr + mi, c);
  __syncthreads();
  const int lane = threadIdx.x % 32;
  const int64_t n_pairs = (rows + kRpw - 1) / kRpw;
  for (int64_t wr = (int64_t)blockIdx.x * kWarps + threadIdx.x / 32; wr < n_pairs; wr += (int64_t)gridDim.x * kWarps) {
    const int64_t r0 = wr * kRpw;
    const uint4 *wq[kRpw];
    const uint32_t *sbp[kRpw];
#pragma unroll
    for (int r = 0; r < kRpw; r++) {
      int64_t row = rt.e * rows + (r0 + r < rows ? r0 + r : rows - 1);
      wq[r] = reinterpret_cast<const uint4 *>((const char *)p.w.data + row * p.w.row_bytes);
      sbp[r] = (const uint32_t *)p.w.sb + row * (cols / GROUP);
    }
    float acc[kRpw][M] = {};
#pragma unroll 2
    for (int64_t c = lane; c < nchunk; c += 32) {
      uint4 q[kRpw];
      uint32_t sb[kRpw][NG];
#pragma unroll
      for (int r = 0; r < kRpw; r++) q[r] = __ldg(wq[r] + c);
#pragma unroll
      for (int r = 0; r < kRpw; r++)
#pragma unroll
        for (int j = 0; j < NG; j++) sb[r][j] = __ldg(sbp[r] + (c * CPC) / GROUP + j);
#pragma unroll
      for (int mi = 0; mi < M; mi++) {
        const float4 *xc = reinterpret_cast<const float4 *>(xs + mi * XS + c * XP);
        float sx[NG] = {}, d[kRpw][NG] = {};
#pragma unroll
        for (int w = 0; w < 4; w++) {
          const int j = w / WPG;
          float xv[CPW];
#pragma unroll
          for (int v = 0; v < CPW / 4; v++) {
            float4 f = xc[(w * CPW) / 4 + v];
            xv[4 * v] = f.x, xv[4 * v + 1] = f.y, xv[4 * v + 2] = f.z, xv[4 * v + 3] = f.w;
          }
#pragma unroll
          for (int i = 0; i < CPW; i++) sx[j] += xv[i];
#pragma unroll
          for (int r = 0; r < kRpw; r++) {
            uint32_t wd = word_of(q[r], w);
#pragma unroll
            for (int i = 0; i < CPW; i++) d[r][j] = fmaf(code_f<BITS>(wd, i), xv[i], d[r][j]);
          }
        }
#pragma unroll
        for (int r = 0; r < kRpw; r++)
#pragma unroll
          for (int j = 0; j < NG; j++) {
            float s = bf2f(sb[r][j] & 0xffffu), b = bf2f(sb[r][j] >> 16);
            acc[r][mi] += s * ((d[r][j] - sx[j]) * (float)(1 << BITS)) + b * sx[j];
          }
      }
    }
    store_rows<M>(p, rt, r0, acc);
  }
}

template <typename WT>
__device__ __forceinline__ float wconv(WT v);
template <>
__device__ __forceinline__ float wconv<float>(float v) { return v; }
template <>
__device__ __forceinline__ float wconv<uint16_t>(uint16_t v) { return bf2f(v); }
template <>
__device__ __forceinline__ float wconv<__half>(__half v) { return __half2float(v); }

template <typename WT, int M>
__global__ void __launch_bounds__(kThreads) k_gemv_dense(const lm_cu_mm_p p) {
  constexpr int EPC = 16 / (int)sizeof(WT); /* elements per chunk: 4 or 8 */
  extern __shared__ float4 smem4[];
  float *xs = reinterpret_cast<float *>(smem4);
  const Route rt = route(p);
  const int64_t cols = p.w.cols, nchunk = cols / EPC, rows = p.w.rows;
  for (int mi = 0; mi < M; mi++)
#pragma unroll 4
    for (int64_t c = threadIdx.x; c < cols; c += kThreads) xs[mi * cols + c] = ldt(p.x, rt.xr + mi, c);
  __syncthreads();
  const int lane = threadIdx.x % 32;
  const int64_t n_pairs = (rows + kRpw - 1) / kRpw;
  for (int64_t wr = (int64_t)blockIdx.x * kWarps + threadIdx.x / 32; wr < n_pairs; wr += (int64_t)gridDim.x * kWarps) {
    const int64_t r0 = wr * kRpw;
    const uint4 *wq[kRpw];
#pragma unroll
    for (int r = 0; r < kRpw; r++) {
      int64_t row = rt.e * rows + (r0 + r < rows ? r0 + r : rows - 1);
      wq[r] = reinterpret_cast<const uint4 *>((const char *)p.w.data + row * p.w.row_bytes);
    }
    float acc[kRpw][M] = {};
#pragma unroll 2
    for (int64_t c = lane; c < nchunk; c += 32) {
      uint4 q[kRpw];
#pragma unroll
      for (int r = 0; r < kRpw; r++) q[r] = __ldg(wq[r] + c);
#pragma unroll
      for (int mi = 0; mi < M; mi++) {
        const float4 *xc = reinterpret_cast<const float4 *>(xs + mi * cols + c * EPC);
        float xv[EPC];
#pragma unroll
        for (int v = 0; v < EPC / 4; v++) {
          float4 f = xc[v];
          xv[4 * v] = f.x, xv[4 * v + 1] = f.y, xv[4 * v + 2] = f.z, xv[4 * v + 3] = f.w;
        }
#pragma unroll
        for (int r = 0; r < kRpw; r++) {
          const WT *wv = reinterpret_cast<const WT *>(&q[r]);
#pragma unroll
          for (int i = 0; i < EPC; i++) acc[r][mi] = fmaf(wconv<WT>(wv[i]), xv[i], acc[r][mi]);
        }
      }
    }
    store_rows<M>(p, rt, r0, acc);
  }
}

template <int M>
__global__ void __launch_bounds__(kThreads) k_gemv_generic(const lm_cu_mm_p p) {
  extern __shared__ float4 smem4[];
  float *xs = reinterpret_cast<float *>(smem4);
  const Route rt = route(p);
  const int64_t cols = p.w.cols, rows = p.w.rows;
  for (int mi = 0; mi < M; mi++)
#pragma unroll 4
    for (int64_t c = threadIdx.x; c < cols; c += kThreads) xs[mi * cols + c] = ldt(p.x, rt.xr + mi, c);
  __syncthreads();
  const int lane = threadIdx.x % 32;
  const int64_t n_pairs = (rows + kRpw - 1) / kRpw;
  for (int64_t wr = (int64_t)blockIdx.x * kWarps + threadIdx.x / 32; wr < n_pairs; wr += (int64_t)gridDim.x * kWarps) {
    const int64_t r0 = wr * kRpw;
    float acc[kRpw][M] = {};
    for (int64_t c = lane; c < cols; c += 32) {
#pragma unroll
      for (int r = 0; r < kRpw; r++) {
        float wv = w_at(p.w, rt.e, r0 + r < rows ? r0 + r : rows - 1, c);
#pragma unroll
        for (int mi = 0; mi < M; mi++) acc[r][mi] = fmaf(wv, xs[mi * cols + c], acc[r][mi]);
      }
    }
    store_rows<M>(p, rt, r0, acc);
  }
}

typedef void (*gemv_fn)(const lm_cu_mm_p);

#define LM_GEMV_Q_GROUPS(B, M) \
  case B * 1000 + 32: return &k_gemv_q<B, 32, M>; \
  case B * 1000 + 64: return &k_gemv_q<B, 64, M>; \
  case B * 1000 + 128: return &k_gemv_q<B, 128, M>;

template <int M>
gemv_fn pick_q(int bits, int group) {
  switch (bits * 1000 + group) {
    LM_GEMV_Q_GROUPS(2, M)
    LM_GEMV_Q_GROUPS(4, M)
    LM_GEMV_Q_GROUPS(8, M)
  default: return nullptr;
  }
}

template <int M>
gemv_fn pick_dense(int wdt) {
  switch (wdt) {
  case LM_CU_F32: return &k_gemv_dense<float, M>;
  case LM_CU_BF16: return &k_gemv_dense<uint16_t, M>;
  case LM_CU_F16: return &k_gemv_dense<__half, M>;
  default: return nullptr;
  }
}

/* The kernel family a weight takes and the f32 words of x it stages per row. */
enum Family { kPacked, kDense, kGeneric };

Family family_of(const lm_cu_w &w) {
  if (w.bits) {
    bool pow2 = w.bits == 2 || w.bits == 4 || w.bits == 8;
    bool grp = w.group == 32 || w.group == 64 || w.group == 128;
    return pow2 && grp && w.sb_kind == LM_CU_SB_BF16 && w.row_bytes % 16 == 0 ? kPacked : kGeneric;
  }
  bool dt = w.wdt == LM_CU_F32 || w.wdt == LM_CU_BF16 || w.wdt == LM_CU_F16;
  return dt && w.row_bytes % 16 == 0 ? kDense : kGeneric;
}

int64_t staged_floats(const lm_cu_w &w, Family f) {
  if (f != kPacked) return w.cols;
  int64_t cpc = 128 / w.bits;
  return (w.cols / cpc) * (cpc + 4);
}

template <int M>
gemv_fn pick(const lm_cu_w &w, Family f) {
  return f == kPacked ? pick_q<M>(w.bits, w.group) : f == kDense ? pick_dense<M>(w.wdt) : &k_gemv_generic<M>;
}

gemv_fn pick_m(const lm_cu_w &w, Family f, int m) {
  return m == 4 ? pick<4>(w, f) : m == 2 ? pick<2>(w, f) : pick<1>(w, f);
}

} // namespace

extern "C" {

cudaError_t lm_cu_gemv(cudaStream_t s, const lm_cu_mm_p *pp) {
  lm_cu_mm_p p = *pp;
  const Family f = family_of(p.w);
  const int64_t per_row = staged_floats(p.w, f) * (int64_t)sizeof(float);
  const int64_t optin = p.smem_optin;
  cudaError_t e;
  if (per_row > optin || p.w.rows <= 0) return cudaErrorNotSupported;
  const int64_t pairs = (p.w.rows + kRpw - 1) / kRpw;
  const int64_t want = (pairs + kWarps - 1) / kWarps;
  const unsigned gx = (unsigned)(want < p.grid_cap ? want : p.grid_cap);
  if (p.ids) { /* grouped: one x row per group */
    if (p.y.rows > 65535) return cudaErrorNotSupported;
    gemv_fn fn = pick_m(p.w, f, 1);
    if (!fn) return cudaErrorNotSupported;
    fn<<<dim3(gx, (unsigned)p.y.rows), kThreads, (size_t)per_row, s>>>(p);
    return cudaGetLastError();
  }
  const size_t xsz = p.x.dt == LM_CU_F32 ? 4 : 2, ysz = p.y.dt == LM_CU_F32 ? 4 : 2;
  for (int64_t done = 0; done < pp->x.rows;) {
    int64_t left = pp->x.rows - done;
    int m = left >= 4 && 4 * per_row <= optin ? 4 : left >= 2 && 2 * per_row <= optin ? 2 : 1;
    gemv_fn fn = pick_m(p.w, f, m);
    if (!fn) return cudaErrorNotSupported;
    p.x.p = (char *)pp->x.p + (size_t)(done * pp->x.ld) * xsz;
    p.y.p = (char *)pp->y.p + (size_t)(done * pp->y.ld) * ysz;
    p.x.rows = p.y.rows = m;
    fn<<<dim3(gx, 1), kThreads, (size_t)(m * per_row), s>>>(p);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    done += m;
  }
  return cudaSuccess;
}

static cudaError_t set_smem(gemv_fn fn, int bytes) {
  return fn ? cudaFuncSetAttribute((const void *)fn, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) : cudaSuccess;
}

cudaError_t lm_cu_gemv_init(int max_smem_optin) {
  static const int bits[] = {2, 4, 8}, groups[] = {32, 64, 128}, dts[] = {LM_CU_F32, LM_CU_BF16, LM_CU_F16};
  cudaError_t e = cudaSuccess;
  for (int b = 0; b < 3; b++)
    for (int g = 0; g < 3; g++) {
      if (e == cudaSuccess) e = set_smem(pick_q<1>(bits[b], groups[g]), max_smem_optin);
      if (e == cudaSuccess) e = set_smem(pick_q<2>(bits[b], groups[g]), max_smem_optin);
      if (e == cudaSuccess) e = set_smem(pick_q<4>(bits[b], groups[g]), max_smem_optin);
    }
  for (int d = 0; d < 3; d++) {
    if (e == cudaSuccess) e = set_smem(pick_dense<1>(dts[d]), max_smem_optin);
    if (e == cudaSuccess) e = set_smem(pick_dense<2>(dts[d]), max_smem_optin);
    if (e == cudaSuccess) e = set_smem(pick_dense<4>(dts[d]), max_smem_optin);
  }
  if (e == cudaSuccess) e = set_smem(&k_gemv_generic<1>, max_smem_optin);
  if (e == cudaSuccess) e = set_smem(&k_gemv_generic<2>, max_smem_optin);
  if (e == cudaSuccess) e = set_smem(&k_gemv_generic<4>, max_smem_optin);
  return e;
}

} // extern "C"
