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

/* The packed kernel's launch for m activation rows: its instance and block count (the
 * instance is null or the count too large when the shape has no such launch). */
struct QLaunch {
  gemv_q_fn fn;
  Geo g;
  int64_t blocks;
};

QLaunch q_launch(const lm_cu_mm_p &p, int m) {
  const int64_t nchunk = p.w.cols / (128 / p.w.bits);
  QLaunch q;
  q.g = geo_of(p.w.rows, nchunk, m, p.grid_cap / 4 > 0 ? p.grid_cap / 4 : 1);
  q.fn = pick_q(p.w.bits, p.w.group, m, q.g.r);
  const int64_t warps = (p.w.rows + q.g.r - 1) / q.g.r, per_block = kWarps / q.g.ks;
  q.blocks = (warps + per_block - 1) / per_block;
  return q;
}

bool q_fits(const lm_cu_mm_p &p, int m) {
  const QLaunch q = q_launch(p, m);
  return q.fn && q.blocks <= 0x7fffffff;
}

/* One launch of the packed kernel for m activation rows (or the grouped rows). */
cudaError_t launch_q(lm_cu_stream s, const lm_cu_mm_p &p, int m, unsigned gy) {
  const QLaunch q = q_launch(p, m);
  if (!q.fn || q.blocks > 0x7fffffff) return cudaErrorInvalidValue;
  launch(q.fn, dim3((unsigned)q.blocks, gy), kThreads, 0, s, p, q.g.ks);
  return cudaGetLastError();
}

/* Shared bytes per activation row: the dense and generic kernels stage x as f32. */
int64_t x_smem_per_row(const lm_cu_mm_p &p, Family f) {
  return f == kPacked ? 0 : p.w.cols * (int64_t)sizeof(float);
}

/* Activation rows of the next launch of a plain product with `left` rows still to do. */
int window_rows(int64_t left, int64_t per_row, int64_t optin) {
  return left >= 4 && 4 * per_row <= optin ? 4 : left >= 2 && 2 * per_row <= optin ? 2 : 1;
}

/* Whether the CUDA-core kernels of family f take every launch product p needs. */
bool cc_takes(const lm_cu_mm_p &p, Family f) {
  const int64_t per_row = x_smem_per_row(p, f), optin = p.smem_optin;
  if (p.epi == 3 || per_row > optin || p.w.rows <= 0) return false;
  if (p.ids) /* grouped: one x row per group */
    return p.y.rows <= 65535 && (f == kPacked ? q_fits(p, 1) : pick_m(p.w, f, 1) != nullptr);
  for (int64_t done = 0; done < p.x.rows;) {
    const int m = window_rows(p.x.rows - done, per_row, optin);
    if (f == kPacked ? !q_fits(p, m) : !pick_m(p.w, f, m)) return false;
    done += m;
  }
  return true;
}

/* Runs product pp on the CUDA-core kernels of family f (cc_takes must have said yes). */
cudaError_t run_cc(lm_cu_stream s, const lm_cu_mm_p *pp, Family f) {
  const int64_t per_row = x_smem_per_row(*pp, f), optin = pp->smem_optin;
  const int64_t pairs = (pp->w.rows + kRpw - 1) / kRpw;
  const int64_t want = (pairs + kWarps - 1) / kWarps;
  const unsigned gx = (unsigned)(want < pp->grid_cap ? want : pp->grid_cap);
  if (pp->ids) {
    if (f == kPacked) return launch_q(s, *pp, 1, (unsigned)pp->y.rows);
    launch(pick_m(pp->w, f, 1), dim3(gx, (unsigned)pp->y.rows), kThreads, (size_t)per_row, s, *pp);
    return cudaGetLastError();
  }
  for (int64_t done = 0; done < pp->x.rows;) {
    const int m = window_rows(pp->x.rows - done, per_row, optin);
    const lm_cu_mm_p p = rows_window(*pp, done, m);
    cudaError_t e;
    if (f == kPacked) {
      e = launch_q(s, p, m, 1);
    } else {
      launch(pick_m(p.w, f, m), dim3(gx, 1), kThreads, (size_t)(m * per_row), s, p);
      e = cudaGetLastError();
    }
    if (e != cudaSuccess) return e;
    done += m;
  }
  return cudaSuccess;
}

lm_cu_gemv_kind kind_of(Family f) {
  return f == kPacked ? LM_CU_GEMV_PACKED : f == kDense ? LM_CU_GEMV_DENSE : LM_CU_GEMV_GENERIC;
}

bool plain_rows_ok(const lm_cu_mm_p &p) {
  return p.ids || (p.x.rows >= 1 && p.x.rows <= LM_CU_GEMV_MAX_ROWS);
}

bool same_geometry(const lm_cu_w &a, const lm_cu_w &b) {
  return a.n_experts == b.n_experts && a.rows == b.rows && a.cols == b.cols &&
         a.row_bytes == b.row_bytes && a.bits == b.bits && a.group == b.group && a.wdt == b.wdt &&
         a.sb_kind == b.sb_kind;
}

} // namespace

extern "C" {

/* In order of preference: the tensor cores where they take the product (unless
 * LUMEN_CUDA_GEMV=cores), else the CUDA-core family of the weight's layout, else none. */
lm_cu_gemv_kind lm_cu_pick_gemv(const lm_cu_mm_p *p, const lm_cu_switches *sw) {
  if (p->epi == 3 || !plain_rows_ok(*p)) return LM_CU_GEMV_NONE;
  if (sw->tensor_cores && lm_cu_gemv_tc_takes(p)) return LM_CU_GEMV_TC;
  const Family f = family_of(p->w, p->x);
  return cc_takes(*p, f) ? kind_of(f) : LM_CU_GEMV_NONE;
}

/* Only the tensor-core kernel fuses a pair, so LUMEN_CUDA_GEMV=cores splits pairs as well. */
lm_cu_pair_kind lm_cu_pick_pair(const lm_cu_mm_p *p, const lm_cu_switches *sw) {
  if (p->epi != 3 || !sw->tensor_cores || !sw->glu_pair || !plain_rows_ok(*p) ||
      !same_geometry(p->w, p->w2))
    return LM_CU_PAIR_SPLIT;
  return lm_cu_gemv_tc_takes(p) ? LM_CU_PAIR_FUSED : LM_CU_PAIR_SPLIT;
}

cudaError_t lm_cu_gemv(lm_cu_stream s, const lm_cu_mm_p *pp, lm_cu_gemv_kind kind) {
  if (kind == LM_CU_GEMV_TC) return lm_cu_gemv_tc(s, pp);
  const Family f = family_of(pp->w, pp->x);
  if (kind == LM_CU_GEMV_NONE || kind != kind_of(f) || !plain_rows_ok(*pp) || !cc_takes(*pp, f))
    return cudaErrorInvalidValue;
  return run_cc(s, pp, f);
}

static cudaError_t set_smem(gemv_fn fn, int bytes) {
  return fn ? cudaFuncSetAttribute((const void *)fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   bytes)
            : cudaSuccess;
}

cudaError_t lm_cu_gemv_init(int max_smem_optin) {
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
  if (e == cudaSuccess) e = lm_cu_gemv_tc_init(max_smem_optin);
  return e;
}

} // extern "C"
