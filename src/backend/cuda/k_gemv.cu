/* k_gemv.cu — decode matrix-vector products y[m] = x[m] · Wᵀ for m ≤ 4 per launch, reading
 * the weight once at full bandwidth with dequantization fused.
 *
 * Affine codes use the identity Σ_k (s·q_k + b)·x_k = s·Σ q_k·x_k + b·Σ x_k per group. A code
 * becomes a float without a conversion instruction: OR-ing it under the mantissa of 1.0
 * gives f = 1 + q/2^bits exactly, so Σ q·x = 2^bits·(Σ f·x − Σ x); Σ x is shared by the rows.
 *
 * Three kernel families, chosen per weight: packed (2/4/8-bit, bf16 scale/bias pairs, rows a
 * multiple of 16 bytes, x 16-byte aligned), dense (f32/bf16/f16 rows a multiple of 16 bytes)
 * and a generic one (any layout, element by element through w_at). The packed kernel keeps
 * many 16-byte loads in flight per lane and reads x from global memory (it is tiny and hot
 * in L1/L2); the dense and generic ones stage x in shared memory as f32.
 * Instances: packed 3 bit widths × 3 groups × 7 (rows, rows per warp) shapes = 63; dense 9;
 * generic 3. */
#include "backend/cuda/k_gemv_common.cuh"

using namespace lmcu;

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kRpw = 2; /* rows per warp */

template <int M>
__device__ __forceinline__ void store_rows(const lm_cu_mm_p &p, const Route &rt, int64_t r0,
                                           float (&acc)[kRpw][M]) {
  int lane = threadIdx.x % 32;
#pragma unroll
  for (int r = 0; r < kRpw; r++)
#pragma unroll
    for (int mi = 0; mi < M; mi++)
      acc[r][mi] = warp_sum(acc[r][mi]);
  if (lane) return;
#pragma unroll
  for (int r = 0; r < kRpw; r++) {
    if (r0 + r >= p.w.rows) break;
#pragma unroll
    for (int mi = 0; mi < M; mi++) {
      store_y(p, rt.yr + mi, r0 + r, rt.ok ? acc[r][mi] : 0.0f);
    }
  }
}

__device__ __forceinline__ uint32_t word_of(const uint4 &q, int w) {
  return w == 0 ? q.x : w == 1 ? q.y : w == 2 ? q.z : q.w;
}

/* 1 + q/2^BITS for code i of a word, built with a shift and a mask. */
template <int BITS> __device__ __forceinline__ float code_f(uint32_t wd, int i) {
  constexpr int SH = 23 - BITS;
  constexpr uint32_t MASK = ((1u << BITS) - 1u) << SH;
  int sh = BITS * i;
  uint32_t v = sh <= SH ? wd << (SH - sh) : wd >> (sh - SH);
  return __uint_as_float((v & MASK) | 0x3F800000u);
}

/* x values of word w of chunk c (N = codes per word columns from column c·CPC + w·N) of
 * activation row xr, as f32. Read straight from global memory: x is small and shared by
 * every warp, so these hit L1/L2; one word at a time keeps few registers live. */
template <int N, int CPC>
__device__ __forceinline__ void x_word(const lm_cu_t &x, int64_t xr, int64_t c, int w,
                                       float (&xv)[N]) {
  const int64_t col = c * CPC + (int64_t)w * N;
  if (x.dt == LM_CU_BF16) {
    const uint16_t *src = (const uint16_t *)x.p + xr * x.ld + col;
    if constexpr (N >= 8) {
#pragma unroll
      for (int i = 0; i < N / 8; i++) {
        uint4 u = __ldg(reinterpret_cast<const uint4 *>(src) + i);
        uint32_t v[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int j = 0; j < 4; j++)
          xv[8 * i + 2 * j] = bf2f(v[j] & 0xffffu), xv[8 * i + 2 * j + 1] = bf2f(v[j] >> 16);
      }
    } else {
      uint2 u = __ldg(reinterpret_cast<const uint2 *>(src));
      xv[0] = bf2f(u.x & 0xffffu), xv[1] = bf2f(u.x >> 16), xv[2] = bf2f(u.y & 0xffffu),
      xv[3] = bf2f(u.y >> 16);
    }
  } else {
    const float4 *src = reinterpret_cast<const float4 *>((const float *)x.p + xr * x.ld + col);
#pragma unroll
    for (int i = 0; i < N / 4; i++) {
      float4 f = __ldg(src + i);
      xv[4 * i] = f.x, xv[4 * i + 1] = f.y, xv[4 * i + 2] = f.z, xv[4 * i + 3] = f.w;
    }
  }
}

/* Packed affine weights. A block's 8 warps are (8/KS) row groups × KS column slices: a warp
 * takes R rows over 1/KS of the columns, lanes on consecutive 16-byte chunks. Every lane
 * issues the loads of U chunks of its R rows before it uses any (R·U loads in flight), x
 * comes from global memory (no staging pass, no barrier before the weight loads), and the
 * KS partial sums of a row meet in shared memory. */
template <int BITS, int GROUP, int M, int R>
__global__ void __launch_bounds__(kThreads, M > 1    ? 1
                                            : R == 1 ? 3
                                                     : 2) k_gemv_q(const lm_cu_mm_p p, int ks_n) {
  pdl_wait();
  constexpr int CPC = 128 / BITS;                    /* codes per 16-byte chunk */
  constexpr int CPW = 32 / BITS;                     /* codes per word */
  constexpr int NG = CPC > GROUP ? CPC / GROUP : 1;  /* groups a chunk touches */
  constexpr int WPG = CPC > GROUP ? GROUP / CPW : 4; /* words per group inside a chunk */
  constexpr int U = R >= 4 ? 2 : 4;                  /* chunks per lane in flight, per row */
  __shared__ float red[kWarps][R * M];
  const Route rt = route(p);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, ks = warp % ks_n;
  const int64_t rows = p.w.rows, nchunk = p.w.cols / CPC;
  const int64_t r0 = ((int64_t)blockIdx.x * (kWarps / ks_n) + warp / ks_n) * R;
  const int64_t per = (nchunk + ks_n - 1) / ks_n, cbeg = ks * per, cend = min(cbeg + per, nchunk);
  const uint4 *wq[R];
  const uint32_t *sbp[R];
#pragma unroll
  for (int r = 0; r < R; r++) {
    int64_t row = rt.e * rows + (r0 + r < rows ? r0 + r : rows - 1);
    wq[r] = reinterpret_cast<const uint4 *>((const char *)p.w.data + row * p.w.row_bytes);
    sbp[r] = (const uint32_t *)p.w.sb + row * (p.w.cols / GROUP);
  }
  float acc[R][M] = {};
  for (int64_t c0 = cbeg + lane; c0 < cend; c0 += 32 * U) {
    uint4 q[U][R];
    uint32_t sb[U][R][NG];
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int64_t c =
          min(c0 + 32 * u, cend - 1); /* past the end: reloads the last chunk, unused */
#pragma unroll
      for (int r = 0; r < R; r++) {
        q[u][r] = __ldg(wq[r] + c);
#pragma unroll
        for (int j = 0; j < NG; j++)
          sb[u][r][j] = __ldg(sbp[r] + (c * CPC) / GROUP + j);
      }
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int64_t c = c0 + 32 * u;
      if (c >= cend) break;
#pragma unroll
      for (int mi = 0; mi < M; mi++) {
        float sx[NG] = {}, d[R][NG] = {};
#pragma unroll
        for (int w = 0; w < 4; w++) {
          const int j = w / WPG;
          float xv[CPW];
          x_word<CPW, CPC>(p.x, rt.xr + mi, c, w, xv);
#pragma unroll
          for (int i = 0; i < CPW; i++)
            sx[j] += xv[i];
#pragma unroll
          for (int r = 0; r < R; r++) {
            uint32_t wd = word_of(q[u][r], w);
#pragma unroll
            for (int i = 0; i < CPW; i++)
              d[r][j] = fmaf(code_f<BITS>(wd, i), xv[i], d[r][j]);
          }
        }
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
          for (int j = 0; j < NG; j++) {
            float sc = bf2f(sb[u][r][j] & 0xffffu), b = bf2f(sb[u][r][j] >> 16);
            acc[r][mi] += sc * ((d[r][j] - sx[j]) * (float)(1 << BITS)) + b * sx[j];
          }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int mi = 0; mi < M; mi++)
      acc[r][mi] = warp_sum(acc[r][mi]);
  if (ks_n > 1) {
    if (lane == 0)
#pragma unroll
      for (int r = 0; r < R; r++)
#pragma unroll
        for (int mi = 0; mi < M; mi++)
          red[warp][r * M + mi] = acc[r][mi];
    __syncthreads();
    if (ks || lane) return;
    for (int k = 1; k < ks_n; k++)
#pragma unroll
      for (int r = 0; r < R; r++)
#pragma unroll
        for (int mi = 0; mi < M; mi++)
          acc[r][mi] += red[warp + k][r * M + mi];
  } else if (lane) {
    return;
  }
#pragma unroll
  for (int r = 0; r < R; r++) {
    if (r0 + r >= rows) break;
#pragma unroll
    for (int mi = 0; mi < M; mi++) {
      store_y(p, rt.yr + mi, r0 + r, rt.ok ? acc[r][mi] : 0.0f);
    }
  }
}

template <typename WT> __device__ __forceinline__ float wconv(WT v);
template <> __device__ __forceinline__ float wconv<float>(float v) { return v; }
template <> __device__ __forceinline__ float wconv<uint16_t>(uint16_t v) { return bf2f(v); }
template <> __device__ __forceinline__ float wconv<__half>(__half v) { return __half2float(v); }

template <typename WT, int M>
__global__ void __launch_bounds__(kThreads) k_gemv_dense(const lm_cu_mm_p p) {
  pdl_wait();
  constexpr int EPC = 16 / (int)sizeof(WT); /* elements per chunk: 4 or 8 */
  extern __shared__ float4 smem4[];
  float *xs = reinterpret_cast<float *>(smem4);
  const Route rt = route(p);
  const int64_t cols = p.w.cols, nchunk = cols / EPC, rows = p.w.rows;
  for (int mi = 0; mi < M; mi++)
#pragma unroll 4
    for (int64_t c = threadIdx.x; c < cols; c += kThreads)
      xs[mi * cols + c] = ldt(p.x, rt.xr + mi, c);
  __syncthreads();
  const int lane = threadIdx.x % 32;
  const int64_t n_pairs = (rows + kRpw - 1) / kRpw;
  for (int64_t wr = (int64_t)blockIdx.x * kWarps + threadIdx.x / 32; wr < n_pairs;
       wr += (int64_t)gridDim.x * kWarps) {
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
      for (int r = 0; r < kRpw; r++)
        q[r] = __ldg(wq[r] + c);
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
          for (int i = 0; i < EPC; i++)
            acc[r][mi] = fmaf(wconv<WT>(wv[i]), xv[i], acc[r][mi]);
        }
      }
    }
    store_rows<M>(p, rt, r0, acc);
  }
}

template <int M> __global__ void __launch_bounds__(kThreads) k_gemv_generic(const lm_cu_mm_p p) {
  pdl_wait();
  extern __shared__ float4 smem4[];
  float *xs = reinterpret_cast<float *>(smem4);
  const Route rt = route(p);
  const int64_t cols = p.w.cols, rows = p.w.rows;
  for (int mi = 0; mi < M; mi++)
#pragma unroll 4
    for (int64_t c = threadIdx.x; c < cols; c += kThreads)
      xs[mi * cols + c] = ldt(p.x, rt.xr + mi, c);
  __syncthreads();
  const int lane = threadIdx.x % 32;
  const int64_t n_pairs = (rows + kRpw - 1) / kRpw;
  for (int64_t wr = (int64_t)blockIdx.x * kWarps + threadIdx.x / 32; wr < n_pairs;
       wr += (int64_t)gridDim.x * kWarps) {
    const int64_t r0 = wr * kRpw;
    float acc[kRpw][M] = {};
    for (int64_t c = lane; c < cols; c += 32) {
#pragma unroll
      for (int r = 0; r < kRpw; r++) {
        float wv = w_at(p.w, rt.e, r0 + r < rows ? r0 + r : rows - 1, c);
#pragma unroll
        for (int mi = 0; mi < M; mi++)
          acc[r][mi] = fmaf(wv, xs[mi * cols + c], acc[r][mi]);
      }
    }
    store_rows<M>(p, rt, r0, acc);
  }
}

typedef void (*gemv_fn)(const lm_cu_mm_p);
typedef void (*gemv_q_fn)(const lm_cu_mm_p, int);

#define LM_GEMV_Q_GROUPS(B, M, R)                                                                  \
  case B * 1000 + 32: return &k_gemv_q<B, 32, M, R>;                                               \
  case B * 1000 + 64: return &k_gemv_q<B, 64, M, R>;                                               \
  case B * 1000 + 128: return &k_gemv_q<B, 128, M, R>;

template <int M, int R> gemv_q_fn pick_q_r(int bits, int group) {
  switch (bits * 1000 + group) {
    LM_GEMV_Q_GROUPS(2, M, R)
    LM_GEMV_Q_GROUPS(4, M, R)
    LM_GEMV_Q_GROUPS(8, M, R)
  default: return nullptr;
  }
}

/* Instances: R ∈ {1, 2, 4} for one activation row, R ∈ {1, 2} for 2 and 4. */
gemv_q_fn pick_q(int bits, int group, int m, int r) {
  if (m == 1)
    return r == 4   ? pick_q_r<1, 4>(bits, group)
           : r == 2 ? pick_q_r<1, 2>(bits, group)
                    : pick_q_r<1, 1>(bits, group);
  if (m == 2) return r == 2 ? pick_q_r<2, 2>(bits, group) : pick_q_r<2, 1>(bits, group);
  return r == 2 ? pick_q_r<4, 2>(bits, group) : pick_q_r<4, 1>(bits, group);
}

template <int M> gemv_fn pick_dense(int wdt) {
  switch (wdt) {
  case LM_CU_F32: return &k_gemv_dense<float, M>;
  case LM_CU_BF16: return &k_gemv_dense<uint16_t, M>;
  case LM_CU_F16: return &k_gemv_dense<__half, M>;
  default: return nullptr;
  }
}

/* The kernel family a weight (and activation layout) takes. */
enum Family { kPacked, kDense, kGeneric };

Family family_of(const lm_cu_w &w, const lm_cu_t &x) {
  if (w.bits) {
    bool pow2 = w.bits == 2 || w.bits == 4 || w.bits == 8;
    bool grp = w.group == 32 || w.group == 64 || w.group == 128;
    /* the packed kernel reads x with 16-byte loads straight from global memory */
    bool xal = ((uintptr_t)x.p & 15u) == 0 && (x.ld * (x.dt == LM_CU_F32 ? 4 : 2)) % 16 == 0 &&
               (x.dt == LM_CU_F32 || x.dt == LM_CU_BF16);
    return pow2 && grp && xal && w.sb_kind == LM_CU_SB_BF16 && w.row_bytes % 16 == 0 ? kPacked
                                                                                     : kGeneric;
  }
  bool dt = w.wdt == LM_CU_F32 || w.wdt == LM_CU_BF16 || w.wdt == LM_CU_F16;
  return dt && w.row_bytes % 16 == 0 ? kDense : kGeneric;
}

/* Rows per warp R and column slices KS of the packed kernel: a lane holds at most ~4 chunks
 * of a row slice, and the launch should have ~8 warps per SM to keep loads in flight. */
struct Geo {
  int r, ks;
};

Geo geo_of(int64_t rows, int64_t nchunk, int m, int n_sms) {
  const int64_t target = 8 * (int64_t)n_sms;
  Geo g{m == 1 ? 4 : 2, 1};
  while (g.ks < kWarps && nchunk > 128 * g.ks)
    g.ks *= 2;
  while (g.r > 1 && (rows + g.r - 1) / g.r * g.ks < target)
    g.r /= 2;
  while (g.ks < kWarps && (rows + g.r - 1) / g.r * g.ks < target && nchunk >= 64 * g.ks)
    g.ks *= 2;
  return g;
}

template <int M> gemv_fn pick(const lm_cu_w &w, Family f) {
  return f == kDense ? pick_dense<M>(w.wdt) : &k_gemv_generic<M>;
}

gemv_fn pick_m(const lm_cu_w &w, Family f, int m) {
  return m == 4 ? pick<4>(w, f) : m == 2 ? pick<2>(w, f) : pick<1>(w, f);
}

/* One launch of the packed kernel for m activation rows (or the grouped rows). */
cudaError_t launch_q(cudaStream_t s, const lm_cu_mm_p &p, int m, unsigned gy) {
  const int64_t nchunk = p.w.cols / (128 / p.w.bits);
  const Geo g = geo_of(p.w.rows, nchunk, m, p.grid_cap / 4 > 0 ? p.grid_cap / 4 : 1);
  gemv_q_fn fn = pick_q(p.w.bits, p.w.group, m, g.r);
  if (!fn) return cudaErrorNotSupported;
  const int64_t warps = (p.w.rows + g.r - 1) / g.r, per_block = kWarps / g.ks;
  const int64_t blocks = (warps + per_block - 1) / per_block;
  if (blocks > 0x7fffffff) return cudaErrorNotSupported;
  launch(fn, dim3((unsigned)blocks, gy), kThreads, 0, s, p, g.ks);
  return cudaGetLastError();
}

/* Whether 4-bit products with bf16 activations take the tensor-core kernel (k_gemv_tc.cu);
 * off (lm_cu_switches.tensor_cores) keeps them on this file's CUDA-core kernel. */
bool g_tensor_cores = true;

} // namespace

extern "C" {

cudaError_t lm_cu_gemv(cudaStream_t s, const lm_cu_mm_p *pp) {
  if (g_tensor_cores) {
    cudaError_t e = lm_cu_gemv_tc(s, pp);
    if (e != cudaErrorNotSupported) return e;
  }
  if (pp->epi == 3) return cudaErrorNotSupported; /* a gate/up pair: only the tensor-core kernel */
  lm_cu_mm_p p = *pp;
  const Family f = family_of(p.w, p.x);
  /* shared bytes per activation row: the dense and generic kernels stage x as f32 */
  const int64_t per_row = f == kPacked ? 0 : p.w.cols * (int64_t)sizeof(float);
  const int64_t optin = p.smem_optin;
  cudaError_t e;
  if (per_row > optin || p.w.rows <= 0) return cudaErrorNotSupported;
  const int64_t pairs = (p.w.rows + kRpw - 1) / kRpw;
  const int64_t want = (pairs + kWarps - 1) / kWarps;
  const unsigned gx = (unsigned)(want < p.grid_cap ? want : p.grid_cap);
  if (p.ids) { /* grouped: one x row per group */
    if (p.y.rows > 65535) return cudaErrorNotSupported;
    if (f == kPacked) return launch_q(s, p, 1, (unsigned)p.y.rows);
    gemv_fn fn = pick_m(p.w, f, 1);
    launch(fn, dim3(gx, (unsigned)p.y.rows), kThreads, (size_t)per_row, s, p);
    return cudaGetLastError();
  }
  for (int64_t done = 0; done < pp->x.rows;) {
    int64_t left = pp->x.rows - done;
    int m = left >= 4 && 4 * per_row <= optin ? 4 : left >= 2 && 2 * per_row <= optin ? 2 : 1;
    p = rows_window(*pp, done, m);
    if (f == kPacked) {
      if ((e = launch_q(s, p, m, 1)) != cudaSuccess) return e;
    } else {
      gemv_fn fn = pick_m(p.w, f, m);
      if (!fn) return cudaErrorNotSupported;
      launch(fn, dim3(gx, 1), kThreads, (size_t)(m * per_row), s, p);
      if ((e = cudaGetLastError()) != cudaSuccess) return e;
    }
    done += m;
  }
  return cudaSuccess;
}

static cudaError_t set_smem(gemv_fn fn, int bytes) {
  return fn ? cudaFuncSetAttribute((const void *)fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   bytes)
            : cudaSuccess;
}

cudaError_t lm_cu_gemv_init(int max_smem_optin, int tensor_cores, int glu_pair) {
  g_tensor_cores = tensor_cores != 0;
  static const int dts[] = {LM_CU_F32, LM_CU_BF16, LM_CU_F16};
  cudaError_t e = cudaSuccess;
  for (int d = 0; d < 3; d++) {
    if (e == cudaSuccess) e = set_smem(pick_dense<1>(dts[d]), max_smem_optin);
    if (e == cudaSuccess) e = set_smem(pick_dense<2>(dts[d]), max_smem_optin);
    if (e == cudaSuccess) e = set_smem(pick_dense<4>(dts[d]), max_smem_optin);
  }
  if (e == cudaSuccess) e = set_smem(&k_gemv_generic<1>, max_smem_optin);
  if (e == cudaSuccess) e = set_smem(&k_gemv_generic<2>, max_smem_optin);
  if (e == cudaSuccess) e = set_smem(&k_gemv_generic<4>, max_smem_optin);
  if (e == cudaSuccess) e = lm_cu_gemv_tc_init(max_smem_optin, glu_pair);
  return e;
}

} // extern "C"
