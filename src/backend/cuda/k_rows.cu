/* k_rows.cu — the row-wise and elementwise kernels of the CUDA backend: embedding lookup,
 * RMSNorm (optionally fused with the residual add), RoPE, GeGLU, scaled add, softcap, row
 * gather, argmax, the KV append, and the bandwidth probe. Math is f32; with bf16 tensors each
 * op rounds where transformers' bf16 run rounds (at every tensor op's output), so the fast
 * path tracks the reference's own bf16 numerics. */
#include <math.h>

#include "backend/cuda/k_common.cuh"
#include "tensor/dtype.h"

static_assert(LM_CU_F32 == LM_DT_F32 && LM_CU_F16 == LM_DT_F16 && LM_CU_BF16 == LM_DT_BF16,
              "dtype codes");

using namespace lmcu;

namespace {

constexpr int kRowThreads = 256; /* every kernel here: 8 warps */
constexpr int kRowWarps = kRowThreads / 32;

int64_t blocks_for(int64_t n, int64_t per) { return (n + per - 1) / per; }

__global__ void __launch_bounds__(kRowThreads)
    k_embed(lm_cu_t out, lm_cu_w w, const int32_t *ids, float scale) {
  pdl_wait();
  int64_t t = blockIdx.y, c = (int64_t)blockIdx.x * kRowThreads + threadIdx.x;
  if (c >= out.cols) return;
  int64_t id = ids[t];
  float v = (id >= 0 && id < w.rows) ? w_at(w, 0, id, c) * scale : 0.0f;
  stt(out, t, c, v);
}

constexpr int kNormVals = 24; /* values a thread keeps in registers: one pass up to 6144 columns */

__device__ __forceinline__ void norm_store(const lm_cu_t &out, const lm_cu_t &res, int has_res,
                                           int64_t r, int64_t c, float v) {
  if (has_res)
    stt(res, r, c, ldt(res, r, c) + rnd(res.dt, v));
  else
    stt(out, r, c, v);
}

/* One block per row: sum of squares, then y = x * rsqrt(mean + eps) * w (Gemma4RMSNorm: the
 * weight as is). With a residual: residual += round(y) (transformers adds the normed bf16
 * tensor to the bf16 residual, rounding each). Each thread loads its (up to 24) values with
 * independent loads into registers before it sums, so a row costs one memory round trip, not
 * one per element. In place is safe: a thread writes only the elements it read. */
__global__ void __launch_bounds__(kRowThreads)
    k_rmsnorm(lm_cu_t out, lm_cu_t x, const float *w, float eps, lm_cu_t res, int has_res) {
  pdl_wait();
  __shared__ float part[kRowWarps];
  const int64_t r = blockIdx.x, cols = x.cols;
  float v[kNormVals], ss = 0.0f;
#pragma unroll
  for (int k = 0; k < kNormVals; k++) {
    int64_t c = threadIdx.x + (int64_t)k * kRowThreads;
    v[k] = c < cols ? ldt(x, r, c) : 0.0f;
  }
#pragma unroll
  for (int k = 0; k < kNormVals; k++)
    ss += v[k] * v[k];
  for (int64_t c = threadIdx.x + (int64_t)kNormVals * kRowThreads; c < cols; c += kRowThreads) {
    float t = ldt(x, r, c);
    ss += t * t;
  }
  ss = warp_sum(ss);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = ss;
  __syncthreads();
  ss = 0.0f;
#pragma unroll
  for (int i = 0; i < kRowWarps; i++)
    ss += part[i];
  const float inv = 1.0f / sqrtf(ss / (float)cols + eps);
#pragma unroll
  for (int k = 0; k < kNormVals; k++) {
    int64_t c = threadIdx.x + (int64_t)k * kRowThreads;
    if (c < cols) norm_store(out, res, has_res, r, c, w ? v[k] * inv * w[c] : v[k] * inv);
  }
  for (int64_t c = threadIdx.x + (int64_t)kNormVals * kRowThreads; c < cols; c += kRowThreads) {
    float t = ldt(x, r, c) * inv;
    norm_store(out, res, has_res, r, c, w ? t * w[c] : t);
  }
}

/* 8 consecutive values of a bf16 or f32 row, as f32 (16- or 32-byte loads). */
__device__ __forceinline__ void ld8(const void *p, int64_t ld, int dt, int64_t r, int64_t j,
                                    float (&v)[8]) {
  if (dt == LM_CU_BF16) {
    uint4 u = *reinterpret_cast<const uint4 *>((const uint16_t *)p + r * ld + 8 * j);
    uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++)
      v[2 * i] = bf2f(w[i] & 0xffffu), v[2 * i + 1] = bf2f(w[i] >> 16);
  } else {
    const float4 *f = reinterpret_cast<const float4 *>((const float *)p + r * ld + 8 * j);
    float4 a = f[0], b = f[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  }
}

__device__ __forceinline__ void st8(void *p, int64_t ld, int dt, int64_t r, int64_t j,
                                    const float (&v)[8]) {
  if (dt == LM_CU_BF16) {
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; i++)
      w[i] = (uint32_t)f2bf(v[2 * i]) | (uint32_t)f2bf(v[2 * i + 1]) << 16;
    *reinterpret_cast<uint4 *>((uint16_t *)p + r * ld + 8 * j) = make_uint4(w[0], w[1], w[2], w[3]);
  } else {
    float4 *f = reinterpret_cast<float4 *>((float *)p + r * ld + 8 * j);
    f[0] = make_float4(v[0], v[1], v[2], v[3]);
    f[1] = make_float4(v[4], v[5], v[6], v[7]);
  }
}

/* The same RMSNorm for aligned bf16/f32 rows whose width is a multiple of 8: TPR threads per
 * row (rows of up to 1024 columns share a block), NV 8-value vectors per thread. x, the
 * weight and the residual are all loaded before the reduction, so a row costs one round
 * trip to memory plus the store. Same rounding as k_rmsnorm. With a residual it also does
 * the fused tail of lm_rmsnorm_args in registers: the layer scalar (rounded as k_add rounds)
 * and the next block's input norm of the updated residual (a second row reduction). */
__device__ __forceinline__ float row_sum(float v, float *part, int tpr) {
  const int wpr = tpr / 32;
  v = warp_sum(v);
  if (wpr == 1) return v;
  __syncthreads(); /* a previous reduction's reads of part are done */
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
  __syncthreads();
  v = 0.0f;
  for (int i = 0; i < wpr; i++)
    v += part[(threadIdx.x / tpr) * wpr + i];
  return v;
}

__device__ __forceinline__ void ld_w8(const float *w, int64_t j, float (&o)[8]) {
  float4 a = reinterpret_cast<const float4 *>(w)[2 * j],
         b = reinterpret_cast<const float4 *>(w)[2 * j + 1];
  o[0] = a.x, o[1] = a.y, o[2] = a.z, o[3] = a.w, o[4] = b.x, o[5] = b.y, o[6] = b.z, o[7] = b.w;
}

struct NormTail {
  int scaled;
  float scale;
  lm_cu_t next;
  const float *next_w;
};

template <int NV>
__global__ void __launch_bounds__(kRowThreads)
    k_rmsnorm_vec(lm_cu_t out, lm_cu_t x, const float *w, float eps, lm_cu_t res, int has_res,
                  int tpr, NormTail tail) {
  pdl_wait();
  __shared__ float part[kRowWarps];
  const int t = threadIdx.x % tpr;
  const int64_t r = (int64_t)blockIdx.x * (blockDim.x / tpr) + threadIdx.x / tpr, nv = x.cols / 8;
  const bool row_ok = r < x.rows;
  float v[NV][8], wv[NV][8], rv[NV][8], nw[NV][8], ss = 0.0f;
  const bool next = has_res && tail.next.p;
#pragma unroll
  for (int k = 0; k < NV;
       k++) { /* every load of the row is issued here, the next norm's weight too */
    const int64_t j = t + (int64_t)k * tpr;
#pragma unroll
    for (int i = 0; i < 8; i++)
      v[k][i] = 0.0f, wv[k][i] = 1.0f, rv[k][i] = 0.0f, nw[k][i] = 1.0f;
    if (!row_ok || j >= nv) continue;
    ld8(x.p, x.ld, x.dt, r, j, v[k]);
    if (w) ld_w8(w, j, wv[k]);
    if (has_res) ld8(res.p, res.ld, res.dt, r, j, rv[k]);
    if (next && tail.next_w) ld_w8(tail.next_w, j, nw[k]);
  }
#pragma unroll
  for (int k = 0; k < NV; k++)
#pragma unroll
    for (int i = 0; i < 8; i++)
      ss += v[k][i] * v[k][i];
  ss = row_sum(ss, part, tpr);
  const float inv = 1.0f / sqrtf(ss / (float)x.cols + eps);
  float ss2 = 0.0f;
#pragma unroll
  for (int k = 0; k < NV; k++) {
    const int64_t j = t + (int64_t)k * tpr;
    const bool ok = row_ok && j < nv;
    float y[8];
#pragma unroll
    for (int i = 0; i < 8; i++) {
      float n = w ? v[k][i] * inv * wv[k][i] : v[k][i] * inv;
      if (has_res) {
        n = rnd(res.dt, rv[k][i] + rnd(res.dt, n));
        if (tail.scaled) n = rnd(res.dt, n * tail.scale);
      }
      y[i] = ok ? n : 0.0f;
      ss2 += y[i] * y[i];
      v[k][i] = y[i]; /* kept for the next norm */
    }
    if (!ok) continue;
    if (has_res)
      st8(res.p, res.ld, res.dt, r, j, y);
    else
      st8(out.p, out.ld, out.dt, r, j, y);
  }
  if (!next) return;
  ss2 = row_sum(ss2, part, tpr);
  const float inv2 = 1.0f / sqrtf(ss2 / (float)x.cols + eps);
#pragma unroll
  for (int k = 0; k < NV; k++) {
    const int64_t j = t + (int64_t)k * tpr;
    if (!row_ok || j >= nv) continue;
    float y[8];
#pragma unroll
    for (int i = 0; i < 8; i++)
      y[i] = v[k][i] * inv2 * nw[k][i];
    st8(tail.next.p, tail.next.ld, tail.next.dt, r, j, y);
  }
}

/* Norm + RoPE of head rows (heads per token), a warp per head: lane l holds EPL consecutive
 * values, so the RoPE partner (i ± head_dim/2) sits in lane l ^ 16 (norm_rope_lane). */
template <int EPL>
__global__ void __launch_bounds__(kRowThreads)
    k_norm_rope(lm_cu_t out, lm_cu_t x, const float *w, float eps, int heads, const float *inv_freq,
                const int32_t *pos, bool vec) {
  pdl_wait();
  const int lane = threadIdx.x % 32;
  const int64_t r = (int64_t)blockIdx.x * kRowWarps + threadIdx.x / 32;
  if (r >= x.rows) return;
  float v[EPL];
  if (EPL >= 8 && vec) {
#pragma unroll
    for (int i = 0; i < EPL / 8; i++) {
      float u[8];
      ld8(x.p, x.ld, x.dt, r, lane * (EPL / 8) + i, u);
#pragma unroll
      for (int e = 0; e < 8; e++)
        v[8 * i + e] = u[e];
    }
  } else {
#pragma unroll
    for (int e = 0; e < EPL; e++)
      v[e] = ldt(x, r, lane * EPL + e);
  }
  norm_rope_lane<EPL>(v, w, eps, (float)pos[r / heads], inv_freq, out.dt, lane);
#pragma unroll
  for (int e = 0; e < EPL; e++)
    stt(out, r, lane * EPL + e, v[e]);
}

bool vec_ok(const lm_cu_t &t) {
  return (t.dt == LM_CU_BF16 || t.dt == LM_CU_F32) && ((uintptr_t)t.p & 15u) == 0 &&
         (t.ld * (t.dt == LM_CU_F32 ? 4 : 2)) % 16 == 0;
}

/* apply_rotary_pos_emb (rotate_half pairing i, i+d/2) over T tokens of `heads` heads: token
 * t's head h starts at element t*token_stride + h*head_stride of x, so one kernel serves token
 * rows [T][heads*hd] (the rope op) and head rows [T*heads][hd] (behind k_norm_rope). */
__global__ void __launch_bounds__(kRowThreads)
    k_rope(lm_cu_t x, int64_t token_stride, int64_t head_stride, int64_t T, int heads, int hd,
           const float *inv, const int32_t *pos) {
  pdl_wait();
  const int half = hd / 2;
  const int64_t i = (int64_t)blockIdx.x * kRowThreads + threadIdx.x;
  if (i >= T * heads * half) return;
  const int64_t t = i / ((int64_t)heads * half);
  const int rem = (int)(i % ((int64_t)heads * half)), h = rem / half, k = rem % half;
  const float ang = (float)pos[t] * inv[k];
  const int64_t e0 = t * token_stride + (int64_t)h * head_stride + k;
  float y0, y1;
  rope_pair(x.dt, ld(x.p, x.dt, e0), ld(x.p, x.dt, e0 + half), cosf(ang), sinf(ang), y0, y1);
  st(x.p, x.dt, e0, y0);
  st(x.p, x.dt, e0 + half, y1);
}

__global__ void __launch_bounds__(kRowThreads) k_geglu(lm_cu_t out, lm_cu_t g, lm_cu_t u) {
  pdl_wait();
  int64_t r = blockIdx.y, c = (int64_t)blockIdx.x * kRowThreads + threadIdx.x;
  if (c >= out.cols) return;
  float a = rnd(out.dt, gelu_tanh(ldt(g, r, c)));
  stt(out, r, c, a * ldt(u, r, c));
}

__global__ void __launch_bounds__(kRowThreads)
    k_add(lm_cu_t out, lm_cu_t a, lm_cu_t b, float scale) {
  pdl_wait();
  int64_t r = blockIdx.y, c = (int64_t)blockIdx.x * kRowThreads + threadIdx.x;
  if (c >= out.cols) return;
  float v = ldt(a, r, c);
  if (b.p) v = rnd(out.dt, v + ldt(b, r, c));
  stt(out, r, c, v * scale);
}

__global__ void __launch_bounds__(kRowThreads) k_softcap(lm_cu_t x, float cap) {
  pdl_wait();
  int64_t r = blockIdx.y, c = (int64_t)blockIdx.x * kRowThreads + threadIdx.x;
  if (c >= x.cols) return;
  stt(x, r, c, tanhf(ldt(x, r, c) / cap) * cap);
}

__global__ void __launch_bounds__(kRowThreads)
    k_gather(lm_cu_t out, lm_cu_t x, const int32_t *rows) {
  pdl_wait();
  int64_t r = blockIdx.y, c = (int64_t)blockIdx.x * kRowThreads + threadIdx.x;
  if (c >= out.cols) return;
  stt(out, r, c, ldt(x, rows[r], c));
}

/* One block of 1024 threads per row (a 262k vocabulary is 1 MiB of f32 logits: one SM must
 * keep many loads in flight); f32 rows aligned to 16 bytes are read 4 values at a time.
 * Ties go to the lowest index, as the CPU's strict '>' scan does: each thread scans its
 * columns in increasing order and the merges prefer the lower index. */
constexpr int kArgThreads = 1024;

__global__ void __launch_bounds__(kArgThreads) k_argmax(lm_cu_t ids, lm_cu_t x) {
  pdl_wait();
  __shared__ float sv[kArgThreads / 32];
  __shared__ int64_t si[kArgThreads / 32];
  int64_t r = blockIdx.x, best = -1;
  float bv = -INFINITY;
  const bool vec = x.dt == LM_CU_F32 && ((uintptr_t)x.p & 15u) == 0 && x.ld % 4 == 0;
  const int64_t nv = vec ? x.cols / 4 : 0;
  const float4 *row4 = reinterpret_cast<const float4 *>((const float *)x.p + r * x.ld);
#pragma unroll 4
  for (int64_t j = threadIdx.x; j < nv; j += kArgThreads) {
    float4 f = __ldg(row4 + j);
    float v[4] = {f.x, f.y, f.z, f.w};
#pragma unroll
    for (int i = 0; i < 4; i++)
      if (best < 0 || v[i] > bv) bv = v[i], best = 4 * j + i;
  }
  for (int64_t c = 4 * nv + threadIdx.x; c < x.cols; c += kArgThreads) {
    float v = ldt(x, r, c);
    if (best < 0 || v > bv) bv = v, best = c;
  }
  for (int o = 16; o; o >>= 1) {
    float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    int64_t oi = __shfl_xor_sync(0xffffffffu, best, o);
    if (oi >= 0 && (best < 0 || ov > bv || (ov == bv && oi < best))) bv = ov, best = oi;
  }
  if (threadIdx.x % 32 == 0) sv[threadIdx.x / 32] = bv, si[threadIdx.x / 32] = best;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int i = 1; i < kArgThreads / 32; i++)
      if (si[i] >= 0 && (best < 0 || sv[i] > bv || (sv[i] == bv && si[i] < best)))
        bv = sv[i], best = si[i];
    ((int32_t *)ids.p)[r * ids.ld] = (int32_t)(best < 0 ? 0 : best);
  }
}

__global__ void __launch_bounds__(kRowThreads)
    k_kv_append(lm_cu_t kn, lm_cu_t vn, const lm_cu_kvdesc *kv, int n_caches, int cache,
                const int32_t *pos, const int32_t *seq) {
  pdl_wait();
  int64_t t = blockIdx.y, c = (int64_t)blockIdx.x * kRowThreads + threadIdx.x;
  if (c >= kn.cols) return;
  lm_cu_kvdesc d = kv[(int64_t)seq[t] * n_caches + cache];
  int64_t p = pos[t], slot = d.window > 0 ? p % d.window : p;
  /* A chunk longer than a ring: token t + window (same sequence, position p + window) owns
   * this slot, so only the last `window` tokens write, and no two blocks race for a slot. */
  if (d.window > 0 && t + d.window < kn.rows && seq[t + d.window] == seq[t]) return;
  if (slot < 0 || slot >= d.slots) return; /* begin_step refused such a step already */
  st(d.k, kn.dt, slot * kn.cols + c, ldt(kn, t, c));
  st(d.v, vn.dt, slot * vn.cols + c, ldt(vn, t, c));
}

__global__ void __launch_bounds__(kRowThreads) k_read(const uint4 *buf, size_t n, unsigned *sink) {
  pdl_wait();
  unsigned acc = 0;
  for (size_t i = (size_t)blockIdx.x * kRowThreads + threadIdx.x; i < n;
       i += (size_t)gridDim.x * kRowThreads) {
    uint4 v = __ldcs(buf + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  acc = __reduce_xor_sync(0xffffffffu, acc);
  if (threadIdx.x == 0) sink[blockIdx.x] = acc;
}

dim3 grid2(int64_t cols, int64_t rows) {
  return dim3((unsigned)blocks_for(cols, kRowThreads), (unsigned)rows);
}

bool norm_vec_ok(const lm_cu_t &x, const float *w) {
  return x.cols % 8 == 0 && x.cols / 8 <= 4 * kRowThreads && vec_ok(x) && ((uintptr_t)w & 15u) == 0;
}

cudaError_t launch_norm_vec(lm_cu_stream s, lm_cu_t out, lm_cu_t x, const float *w, float eps,
                            lm_cu_t res, int has_res, NormTail tail) {
  const int64_t nv = x.cols / 8;
  const int per = (int)((nv + kRowThreads - 1) / kRowThreads); /* vectors per thread, 1..4 */
  int tpr = (int)((nv + per - 1) / per);
  tpr = (tpr + 31) / 32 * 32;
  const int rpb = kRowThreads / tpr;
  const unsigned blocks = (unsigned)((x.rows + rpb - 1) / rpb);
  void (*fn)(lm_cu_t, lm_cu_t, const float *, float, lm_cu_t, int, int, NormTail) =
      per == 1   ? &k_rmsnorm_vec<1>
      : per == 2 ? &k_rmsnorm_vec<2>
      : per == 3 ? &k_rmsnorm_vec<3>
                 : &k_rmsnorm_vec<4>;
  launch(fn, blocks, rpb * tpr, 0, s, out, x, w, eps, res, has_res, tpr, tail);
  return cudaGetLastError();
}

} // namespace

extern "C" {

cudaError_t lm_cu_embed(lm_cu_stream s, lm_cu_t out, const lm_cu_w *w, const int32_t *ids,
                        float scale) {
  if (out.rows <= 0) return cudaSuccess;
  launch(k_embed, grid2(out.cols, out.rows), kRowThreads, 0, s, out, *w, ids, scale);
  return cudaGetLastError();
}

cudaError_t lm_cu_rmsnorm(lm_cu_stream s, lm_cu_t out, lm_cu_t x, const float *w, float eps,
                          const lm_cu_t *residual) {
  if (x.rows <= 0) return cudaSuccess;
  lm_cu_t res = residual ? *residual : lm_cu_t{};
  if (x.rows > 0x7fffffff) return cudaErrorInvalidValue;
  if (norm_vec_ok(x, w) && (residual ? vec_ok(res) : vec_ok(out))) {
    return launch_norm_vec(s, out, x, w, eps, res, residual != NULL,
                           NormTail{0, 1.0f, lm_cu_t{}, NULL});
  }
  launch(k_rmsnorm, (unsigned)x.rows, kRowThreads, 0, s, out, x, w, eps, res, residual != NULL);
  return cudaGetLastError();
}

cudaError_t lm_cu_rmsnorm_res(lm_cu_stream s, lm_cu_t x, const float *w, float eps,
                              lm_cu_t residual, int scaled, float scale, lm_cu_t next,
                              const float *next_w) {
  if (x.rows <= 0) return cudaSuccess;
  if (x.rows > 0x7fffffff) return cudaErrorInvalidValue;
  if (norm_vec_ok(x, w) && vec_ok(residual) && (!next.p || vec_ok(next)) &&
      ((uintptr_t)next_w & 15u) == 0)
    return launch_norm_vec(s, lm_cu_t{}, x, w, eps, residual, 1,
                           NormTail{scaled, scale, next, next_w});
  cudaError_t e = lm_cu_rmsnorm(s, residual, x, w, eps, &residual);
  if (e == cudaSuccess && scaled) e = lm_cu_add(s, residual, residual, lm_cu_t{}, scale);
  if (e == cudaSuccess && next.p) e = lm_cu_rmsnorm(s, next, residual, next_w, eps, NULL);
  return e;
}

cudaError_t lm_cu_rmsnorm_rope(lm_cu_stream s, lm_cu_t out, lm_cu_t x, const float *w, float eps,
                               int heads, const float *inv_freq, const int32_t *pos) {
  if (x.rows <= 0) return cudaSuccess;
  const int64_t hd = x.cols;
  void (*fn)(lm_cu_t, lm_cu_t, const float *, float, int, const float *, const int32_t *, bool) =
      hd == 32    ? &k_norm_rope<1>
      : hd == 64  ? &k_norm_rope<2>
      : hd == 128 ? &k_norm_rope<4>
      : hd == 256 ? &k_norm_rope<8>
      : hd == 512 ? &k_norm_rope<16>
                  : nullptr;
  if (fn && x.rows <= 0x7fffffffLL * kRowWarps) {
    launch(fn, (unsigned)((x.rows + kRowWarps - 1) / kRowWarps), kRowThreads, 0, s, out, x, w, eps,
           heads, inv_freq, pos, vec_ok(x));
    return cudaGetLastError();
  }
  cudaError_t e = lm_cu_rmsnorm(s, out, x, w, eps, NULL);
  if (e != cudaSuccess) return e;
  const int64_t n = out.rows * (hd / 2);
  launch(k_rope, (unsigned)blocks_for(n, kRowThreads), kRowThreads, 0, s, out, out.ld * heads,
         out.ld, out.rows / heads, heads, (int)hd, inv_freq, pos);
  return cudaGetLastError();
}

cudaError_t lm_cu_rope(lm_cu_stream s, lm_cu_t x, int n_heads, int head_dim, const float *inv_freq,
                       const int32_t *pos) {
  int64_t n = x.rows * n_heads * (head_dim / 2);
  if (n <= 0) return cudaSuccess;
  launch(k_rope, (unsigned)blocks_for(n, kRowThreads), kRowThreads, 0, s, x, x.ld, head_dim, x.rows,
         n_heads, head_dim, inv_freq, pos);
  return cudaGetLastError();
}

cudaError_t lm_cu_geglu(lm_cu_stream s, lm_cu_t out, lm_cu_t gate, lm_cu_t up) {
  if (out.rows <= 0) return cudaSuccess;
  launch(k_geglu, grid2(out.cols, out.rows), kRowThreads, 0, s, out, gate, up);
  return cudaGetLastError();
}

cudaError_t lm_cu_add(lm_cu_stream s, lm_cu_t out, lm_cu_t a, lm_cu_t b, float scale) {
  if (out.rows <= 0) return cudaSuccess;
  launch(k_add, grid2(out.cols, out.rows), kRowThreads, 0, s, out, a, b, scale);
  return cudaGetLastError();
}

cudaError_t lm_cu_softcap(lm_cu_stream s, lm_cu_t x, float cap) {
  if (x.rows <= 0) return cudaSuccess;
  launch(k_softcap, grid2(x.cols, x.rows), kRowThreads, 0, s, x, cap);
  return cudaGetLastError();
}

cudaError_t lm_cu_gather_rows(lm_cu_stream s, lm_cu_t out, lm_cu_t x, const int32_t *rows) {
  if (out.rows <= 0) return cudaSuccess;
  launch(k_gather, grid2(out.cols, out.rows), kRowThreads, 0, s, out, x, rows);
  return cudaGetLastError();
}

cudaError_t lm_cu_argmax(lm_cu_stream s, lm_cu_t ids, lm_cu_t x) {
  if (x.rows <= 0) return cudaSuccess;
  launch(k_argmax, (unsigned)x.rows, kArgThreads, 0, s, ids, x);
  return cudaGetLastError();
}

cudaError_t lm_cu_kv_append(lm_cu_stream s, lm_cu_t k_new, lm_cu_t v_new, const lm_cu_kvdesc *kv,
                            int n_caches, int cache, const int32_t *pos, const int32_t *seq) {
  if (k_new.rows <= 0) return cudaSuccess;
  launch(k_kv_append, grid2(k_new.cols, k_new.rows), kRowThreads, 0, s, k_new, v_new, kv, n_caches,
         cache, pos, seq);
  return cudaGetLastError();
}

cudaError_t lm_cu_read_kernel(lm_cu_stream s, const void *buf, size_t bytes, unsigned *sink,
                              int blocks) {
  launch(k_read, (unsigned)blocks, kRowThreads, 0, s, (const uint4 *)buf, bytes / 16, sink);
  return cudaGetLastError();
}

cudaError_t lm_cu_gemv_init(int max_smem_optin);
cudaError_t lm_cu_attn_init(int max_smem_optin);

cudaError_t lm_cu_kernels_init(int max_smem_optin) {
  cudaError_t e = lm_cu_gemv_init(max_smem_optin);
  return e != cudaSuccess ? e : lm_cu_attn_init(max_smem_optin);
}

} // extern "C"
