/* k_attention.cu — Gemma 4 attention over a cache read in place plus the step's own chunk
 * (keys not yet appended), flash style: online softmax in f32, so no [T, S] score matrix
 * exists anywhere. Raw dot products times `scale` (1.0 for Gemma 4), causal, and a sliding
 * window of `window` keys including the query.
 *
 * A block takes up to 32 query rows (heads of one KV group × tokens of one tile of one
 * sequence; 8 warps × 4 rows) and walks their key range in tiles of 32 keys staged in shared
 * memory as f32: lane j scores key j for the warp's 4 rows, then every lane accumulates its
 * head-dim slice of P·V. Keys are addressed by absolute position: below the cache's length
 * they come from slot(pos) of the cache (a ring wraps), above it from the chunk's K/V rows.
 * For decode (few blocks) the key range is split across blocks (flash-decoding); a second
 * kernel merges the splits' (max, sum, acc) partials. Grid and split count depend only on the
 * batch's shape, never on the context length, so a captured graph stays valid as caches grow.
 * The same kernel serves the quantized cache kinds (kv:quant, kv:rotating-quant; Q = true):
 * their key/value rows are dequantized while they are staged (load_quant_row), and the rest of
 * the kernel does not know the difference. kv:turboquant too (tq_load_row): its values stay in
 * the rotated domain, so each output row is un-rotated once at the end (tq_finish, or the
 * combine kernel when the keys were split). Instances: head dims up to 32·NPL, NPL ∈ {1, 2, 4,
 * 8, 16}, each plain and quantized (10 kernels + 1 combine), and the decode kernels (below)
 * for plain caches and head dims 32..512 that are powers of two: one warp per head, or, where
 * 8 or 16 query heads share a KV head, a block per KV head staging K/V in shared memory. */
#include <math.h>

#include "backend/cuda/k_tq.cuh"

using namespace lmcu;

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kRw = 4;              /* query rows per warp */
constexpr int kRows = kWarps * kRw; /* query rows per block */
constexpr int kKt = 32;             /* keys per tile (one per lane) */
constexpr int64_t kMinChunk = 64;   /* fewest keys a split takes */

/* Shared floats for head dim hd: q rows, K tile (rows padded by one float), V tile. */
constexpr int64_t smem_floats(int64_t hd) { return kRows * hd + kKt * (hd + 1) + kKt * hd; }

struct Range {
  int64_t lo, hi; /* this split's key positions [lo, hi) */
};

/* A lane's share of the cached key and value rows of KV head g at `slot`, dequantized into
 * the shared tiles kd/vd: 8 consecutive values per pass, which lie in one group (one scale and
 * bias) and in one aligned 8-byte (8-bit) or 4-byte (4-bit) word of codes. */
__device__ __forceinline__ void load_quant_row(const lm_cu_kvdesc &d, int64_t kvw, int64_t slot,
                                               int g, int hd, int lane, float *kd, float *vd) {
  const int64_t cb = kvw * d.bits / 8, ng = kvw / d.group, hoff = (int64_t)g * hd;
  const uint8_t *kc = (const uint8_t *)d.k + slot * cb + hoff * d.bits / 8;
  const uint8_t *vc = (const uint8_t *)d.v + slot * cb + hoff * d.bits / 8;
  const uint16_t *ksc = (const uint16_t *)d.ks + slot * ng,
                 *kbi = (const uint16_t *)d.kb + slot * ng;
  const uint16_t *vsc = (const uint16_t *)d.vs + slot * ng,
                 *vbi = (const uint16_t *)d.vb + slot * ng;
  for (int c0 = 8 * lane; c0 < hd; c0 += 8 * 32) {
    const int64_t gi = (hoff + c0) / d.group;
    const float sk = bf2f(ksc[gi]), bk = bf2f(kbi[gi]), sv = bf2f(vsc[gi]), bv = bf2f(vbi[gi]);
    uint2 kw, vw;
    if (d.bits == 8) {
      kw = *reinterpret_cast<const uint2 *>(kc + c0);
      vw = *reinterpret_cast<const uint2 *>(vc + c0);
    } else {
      kw = make_uint2(*reinterpret_cast<const uint32_t *>(kc + c0 / 2), 0u);
      vw = make_uint2(*reinterpret_cast<const uint32_t *>(vc + c0 / 2), 0u);
    }
#pragma unroll
    for (int e = 0; e < 8; e++) {
      uint32_t qk, qv;
      if (d.bits == 8) {
        qk = ((e < 4 ? kw.x : kw.y) >> (8 * (e & 3))) & 0xffu;
        qv = ((e < 4 ? vw.x : vw.y) >> (8 * (e & 3))) & 0xffu;
      } else {
        qk = (kw.x >> (4 * e)) & 0xfu;
        qv = (vw.x >> (4 * e)) & 0xfu;
      }
      kd[c0 + e] = __fadd_rn(__fmul_rn(sk, (float)qk), bk);
      vd[c0 + e] = __fadd_rn(__fmul_rn(sv, (float)qv), bv);
    }
  }
}

/* The end of a block over a TurboQuant cache with one split (every thread calls it): each
 * warp's normalized rows go to its own rows of the q tile, which no warp reads any more, are
 * un-rotated there (the values were summed in the rotated domain) and stored. r0: the block
 * row of the warp's first row. */
template <int NPL>
__device__ void tq_finish(const lm_cu_attn_p &p, float *xs, const int8_t *signs,
                          const bool (&rv)[kRw], const float (&l)[kRw],
                          const float (&acc)[kRw][NPL], int64_t tb, int r0, int G, int g,
                          int lane) {
  const int hd = p.head_dim;
  __syncthreads(); /* every warp has scored its last tile */
#pragma unroll
  for (int j = 0; j < kRw; j++) {
    const float inv = l[j] > 0.0f ? 1.0f / l[j] : 0.0f;
#pragma unroll
    for (int c = 0; c < NPL; c++) {
      const int dd = lane + 32 * c;
      if (dd < hd) xs[j * hd + dd] = acc[j][c] * inv;
    }
  }
  __syncwarp();
  for (int j = 0; j < kRw; j++) {
    if (!rv[j]) continue; /* uniform in the warp */
    float *x = xs + j * hd;
    tq_unrotate(x, hd, signs, lane, 32, [] { __syncwarp(); });
    const int r = r0 + j;
    const int64_t t = tb + r / G, h = (int64_t)g * G + r % G;
    for (int dd = lane; dd < hd; dd += 32)
      stt(p.out, t, h * hd + dd, x[dd]);
  }
}

/* Q: descriptors may be quantized (kv_stage has already replaced the chunk's rows by what the
 * cache will store); any descriptor may also be plain (another sequence of the batch). */
template <int NPL, bool Q>
__global__ void __launch_bounds__(kThreads) k_attn(const lm_cu_attn_p p, int passes, int splits) {
  pdl_wait();
  extern __shared__ float4 smem4[];
  const int hd = p.head_dim, G = p.n_heads / p.n_kv_heads;
  float *qs = reinterpret_cast<float *>(smem4), *ks = qs + kRows * hd, *vs = ks + kKt * (hd + 1);
  const int tb = p.tiles[2 * blockIdx.x], tn = p.tiles[2 * blockIdx.x + 1];
  const int g = blockIdx.y / passes, pass = blockIdx.y % passes, split = blockIdx.z;
  const int rbeg = pass * kRows, nrows = tn * G;
  if (rbeg >= nrows) return; /* a pass past a short tile: it owns no rows, not even partials */
  const int rend = min(rbeg + kRows, nrows);
  const lm_cu_kvdesc d = p.kv[(int64_t)p.seq[tb] * p.n_caches + p.cache];
  const int64_t n_past = d.n, first = d.window > 0 && d.n > d.window ? d.n - d.window : 0;
  const int64_t t0 = tb - (p.pos[tb] - n_past); /* batch row of this sequence's position n_past */
  const int64_t p_lo = p.pos[tb + rbeg / G], p_hi = p.pos[tb + (rend - 1) / G];
  int64_t klo = p.window > 0 ? max(p_lo - p.window + 1, (int64_t)0) : 0;
  klo = max(klo, first);
  const int64_t L = p_hi - klo + 1;
  int64_t chunk = L;
  if (splits > 1) chunk = max((L + splits - 1) / splits, kMinChunk);
  const Range rg{klo + split * chunk, min(klo + (split + 1) * chunk, p_hi + 1)};

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int rl = warp; rl < kRows; rl += kWarps) { /* a warp per row, lanes along the head dim */
    int r = rbeg + rl;
#pragma unroll 4
    for (int dd = lane; dd < hd; dd += 32)
      qs[rl * hd + dd] =
          r < rend ? ldt(p.q, tb + r / G, (int64_t)(g * G + r % G) * hd + dd) * p.scale : 0.0f;
  }
  __shared__ int64_t ksrc[kKt]; /* per key of a tile: cache slot, or -(1 + chunk row) */
  int64_t prow[kRw];
  bool rv[kRw];
  float m[kRw], l[kRw], acc[kRw][NPL];
#pragma unroll
  for (int j = 0; j < kRw; j++) {
    int r = rbeg + warp * kRw + j;
    rv[j] = r < rend;
    prow[j] = rv[j] ? p.pos[tb + r / G] : -1;
    m[j] = -INFINITY;
    l[j] = 0.0f;
#pragma unroll
    for (int c = 0; c < NPL; c++)
      acc[j][c] = 0.0f;
  }
  const int64_t kvw = (int64_t)p.n_kv_heads * hd, goff = (int64_t)g * hd;
  for (int64_t kb = rg.lo; kb < rg.hi; kb += kKt) {
    const int nk = (int)min((int64_t)kKt, rg.hi - kb);
    __syncthreads(); /* the previous tile is consumed (and q is staged) */
    if (threadIdx.x < kKt && (int)threadIdx.x < nk) {
      int64_t kp = kb + threadIdx.x;
      ksrc[threadIdx.x] =
          kp < n_past ? (d.window > 0 ? kp % d.window : kp) : -(1 + t0 + (kp - n_past));
    }
    __syncthreads();
    for (int j = warp; j < kKt;
         j += kWarps) { /* a warp per key row, coalesced along the head dim */
      float *kd = ks + j * (hd + 1), *vd = vs + j * hd;
      const int64_t src = j < nk ? ksrc[j] : 0, off = src * kvw + goff;
      if (Q && j < nk && src >= 0 && d.quant) {
        load_quant_row(d, kvw, src, g, hd, lane, kd, vd);
        continue;
      }
      if (Q && j < nk && src >= 0 && d.tq) {
        tq_load_row(d, kvw, src, g, hd, lane, kd, vd);
        continue;
      }
#pragma unroll 4
      for (int dd = lane; dd < hd; dd += 32) {
        float kk = 0.0f, vv = 0.0f;
        if (j < nk) {
          if (src >= 0) {
            kk = ld(d.k, p.k_new.dt, off + dd);
            vv = ld(d.v, p.v_new.dt, off + dd);
          } else {
            kk = ldt(p.k_new, -src - 1, goff + dd);
            vv = ldt(p.v_new, -src - 1, goff + dd);
          }
        }
        kd[dd] = kk;
        vd[dd] = vv;
      }
    }
    __syncthreads();
    float s[kRw] = {};
    const float *kr = ks + lane * (hd + 1), *qw = qs + warp * kRw * hd;
    for (int dd = 0; dd < hd; dd++) {
      float kv = kr[dd];
#pragma unroll
      for (int j = 0; j < kRw; j++)
        s[j] = fmaf(qw[j * hd + dd], kv, s[j]);
    }
    const int64_t kp = kb + lane;
#pragma unroll
    for (int j = 0; j < kRw; j++) {
      bool ok = rv[j] && lane < nk && kp <= prow[j] && (p.window <= 0 || kp > prow[j] - p.window);
      float sj = ok ? s[j] : -INFINITY, mx = warp_max(sj);
      if (mx == -INFINITY) { /* no key of this tile is visible to the row */
        s[j] = 0.0f;
        continue;
      }
      float mn = fmaxf(m[j], mx), r = expf(m[j] - mn), pj = ok ? expf(sj - mn) : 0.0f;
      l[j] = l[j] * r + warp_sum(pj);
#pragma unroll
      for (int c = 0; c < NPL; c++)
        acc[j][c] *= r;
      m[j] = mn;
      s[j] = pj;
    }
    for (int jj = 0; jj < nk; jj++) {
      float pv[kRw];
#pragma unroll
      for (int j = 0; j < kRw; j++)
        pv[j] = __shfl_sync(0xffffffffu, s[j], jj);
#pragma unroll
      for (int c = 0; c < NPL; c++) {
        int dd = lane + 32 * c;
        float v = dd < hd ? vs[jj * hd + dd] : 0.0f;
#pragma unroll
        for (int j = 0; j < kRw; j++)
          acc[j][c] = fmaf(pv[j], v, acc[j][c]);
      }
    }
  }
  if (Q && d.tq && splits == 1) { /* block-uniform: un-rotate the rows, then store them */
    tq_finish<NPL>(p, qs + warp * kRw * hd, d.tq_signs, rv, l, acc, tb, rbeg + warp * kRw, G, g,
                   lane);
    return;
  }
#pragma unroll
  for (int j = 0; j < kRw; j++) {
    if (!rv[j]) continue;
    int r = rbeg + warp * kRw + j;
    int64_t t = tb + r / G, h = g * G + r % G;
    if (splits == 1) {
      float inv = l[j] > 0.0f ? 1.0f / l[j] : 0.0f;
#pragma unroll
      for (int c = 0; c < NPL; c++) {
        int dd = lane + 32 * c;
        if (dd < hd) stt(p.out, t, h * hd + dd, acc[j][c] * inv);
      }
    } else {
      float *pp = p.part + ((t * p.n_heads + h) * splits + split) * (int64_t)(hd + 2);
      if (lane == 0) pp[0] = m[j], pp[1] = l[j];
#pragma unroll
      for (int c = 0; c < NPL; c++) {
        int dd = lane + 32 * c;
        if (dd < hd) pp[2 + dd] = acc[j][c];
      }
    }
  }
}

/* Merges the splits of row (t, h): out = Σ_s acc_s·e^{m_s−M} / Σ_s l_s·e^{m_s−M}. */
__global__ void __launch_bounds__(kThreads) k_attn_combine(const lm_cu_attn_p p, int splits) {
  pdl_wait();
  const int64_t row = blockIdx.x, t = row / p.n_heads, h = row % p.n_heads;
  const int hd = p.head_dim;
  const float *pp = p.part + row * splits * (int64_t)(hd + 2);
  float M = -INFINITY, L = 0.0f;
  for (int s = 0; s < splits; s++)
    M = fmaxf(M, pp[s * (hd + 2)]);
  for (int s = 0; s < splits; s++) {
    float ls = pp[s * (hd + 2) + 1];
    if (ls > 0.0f) L += ls * expf(pp[s * (hd + 2)] - M);
  }
  float inv = L > 0.0f ? 1.0f / L : 0.0f;
  const lm_cu_kvdesc &d = p.kv[(int64_t)p.seq[t] * p.n_caches + p.cache];
  __shared__ float xs[LM_CU_ATTN_MAX_HD]; /* a TurboQuant row, un-rotated before it is stored */
  for (int dd = threadIdx.x; dd < hd; dd += kThreads) {
    float a = 0.0f;
    for (int s = 0; s < splits; s++) {
      const float *q = pp + s * (hd + 2);
      if (q[1] > 0.0f) a += q[2 + dd] * expf(q[0] - M);
    }
    if (d.tq)
      xs[dd] = a * inv;
    else
      stt(p.out, t, h * hd + dd, a * inv);
  }
  if (!d.tq) return; /* block-uniform */
  __syncthreads();
  tq_unrotate(xs, hd, d.tq_signs, threadIdx.x, kThreads, [] { __syncthreads(); });
  for (int dd = threadIdx.x; dd < hd; dd += kThreads)
    stt(p.out, t, h * hd + dd, xs[dd]);
}

/* ---- decode: one query token per sequence ---------------------------------------------------
 * A warp per query head, lanes along the head dim (EPL = hd/32 elements each, one vector load
 * per key row), so a key costs one coalesced load of K and of V and a warp reduction; kDecU
 * keys are loaded before any is used, so a warp has 2·kDecU loads in flight. The warps of a
 * block are heads of the same token (those sharing a KV head hit the same rows in L1). The
 * key range is split across gridDim.z blocks; the last block of a (token, head block) to
 * finish — counted with an atomic that it resets — merges the partials, so there is no
 * second launch. The split count depends only on the batch's shape and the layer's window. */

constexpr int kDecMinChunk = 16;   /* fewest keys a split takes */
constexpr int kDecMaxSplits = 128; /* a multiple of 32 (dec_merge: splits per lane) */
constexpr int kCountSlots = 65536; /* split counters, at the tail of the partials buffer */

template <int EPL>
__device__ __forceinline__ void ld_vec(const void *base, int dt, int64_t off, float (&o)[EPL]) {
  if (dt == LM_CU_BF16) {
    const uint16_t *b = (const uint16_t *)base + off;
    if constexpr (EPL >= 8) {
#pragma unroll
      for (int i = 0; i < EPL / 8; i++) {
        uint4 u = __ldg((const uint4 *)b + i);
        uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int j = 0; j < 4; j++)
          o[8 * i + 2 * j] = bf2f(w[j] & 0xffffu), o[8 * i + 2 * j + 1] = bf2f(w[j] >> 16);
      }
    } else if constexpr (EPL == 4) {
      uint2 u = __ldg((const uint2 *)b);
      o[0] = bf2f(u.x & 0xffffu), o[1] = bf2f(u.x >> 16), o[2] = bf2f(u.y & 0xffffu),
      o[3] = bf2f(u.y >> 16);
    } else if constexpr (EPL == 2) {
      uint32_t u = __ldg((const uint32_t *)b);
      o[0] = bf2f(u & 0xffffu), o[1] = bf2f(u >> 16);
    } else {
      o[0] = bf2f(__ldg(b));
    }
  } else {
    const float *f = (const float *)base + off;
    if constexpr (EPL >= 4) {
#pragma unroll
      for (int i = 0; i < EPL / 4; i++) {
        float4 v = __ldg((const float4 *)f + i);
        o[4 * i] = v.x, o[4 * i + 1] = v.y, o[4 * i + 2] = v.z, o[4 * i + 3] = v.w;
      }
    } else if constexpr (EPL == 2) {
      float2 v = __ldg((const float2 *)f);
      o[0] = v.x, o[1] = v.y;
    } else {
      o[0] = __ldg(f);
    }
  }
}

/* Partial of (token row t, head h, split z): m, l, then the head dim's acc from float 4 on. */
__device__ __forceinline__ float *dec_part(const lm_cu_attn_p &p, int64_t t, int h, int splits,
                                           int z, int hd) {
  return p.part + (((int64_t)t * p.n_heads + h) * splits + z) * (int64_t)(hd + 4);
}

template <int EPL>
__device__ __forceinline__ void dec_store(const lm_cu_attn_p &p, int64_t t, int h, int lane,
                                          const float (&acc)[EPL], float inv) {
#pragma unroll
  for (int e = 0; e < EPL; e++)
    stt(p.out, t, (int64_t)h * 32 * EPL + lane * EPL + e, acc[e] * inv);
}

/* The last split of a (token, head block) merges every split's partial of each head: lanes
 * read the splits' (m, l) in parallel, then the acc slices of kMergeU splits at a time are
 * loaded before they are summed (L2 reads: the partials come from other SMs). */
template <int EPL> __device__ __forceinline__ void ld_part(const float *pp, float (&o)[EPL]) {
  if constexpr (EPL >= 4) {
#pragma unroll
    for (int i = 0; i < EPL / 4; i++) {
      float4 v = __ldcg(reinterpret_cast<const float4 *>(pp) + i);
      o[4 * i] = v.x, o[4 * i + 1] = v.y, o[4 * i + 2] = v.z, o[4 * i + 3] = v.w;
    }
  } else {
#pragma unroll
    for (int e = 0; e < EPL; e++)
      o[e] = __ldcg(pp + e);
  }
}

template <int EPL>
__device__ void dec_merge(const lm_cu_attn_p &p, int64_t t, int h, int lane, int splits) {
  constexpr int HD = 32 * EPL, MU = EPL >= 16 ? 4 : 8;
  constexpr int NZ = kDecMaxSplits / 32; /* splits per lane */
  float wz[NZ], L = 0.0f, M = -INFINITY, acc[EPL] = {};
  float mz[NZ], lz[NZ];
#pragma unroll
  for (int k = 0; k < NZ; k++) {
    const int z = lane + 32 * k;
    const float *pp = dec_part(p, t, h, splits, z < splits ? z : 0, HD);
    mz[k] = z < splits ? __ldcg(pp) : -INFINITY;
    lz[k] = z < splits ? __ldcg(pp + 1) : 0.0f;
    if (lz[k] > 0.0f) M = fmaxf(M, mz[k]);
  }
  M = warp_max(M);
#pragma unroll
  for (int k = 0; k < NZ; k++) {
    wz[k] = lz[k] > 0.0f ? expf(mz[k] - M) : 0.0f;
    L += lz[k] * wz[k];
  }
  L = warp_sum(L);
  for (int z0 = 0; z0 < splits; z0 += MU) {
    float v[MU][EPL], w[MU];
#pragma unroll
    for (int u = 0; u < MU; u++) {
      const int z = z0 + u;
      float wk = wz[0];
#pragma unroll
      for (int k = 1; k < NZ; k++)
        if (z / 32 == k) wk = wz[k];
      w[u] = __shfl_sync(0xffffffffu, wk, z & 31);
      if (z < splits && w[u] > 0.0f)
        ld_part<EPL>(dec_part(p, t, h, splits, z, HD) + 4 + lane * EPL, v[u]);
      else
#pragma unroll
        for (int e = 0; e < EPL; e++)
          v[u][e] = 0.0f;
    }
#pragma unroll
    for (int u = 0; u < MU; u++)
#pragma unroll
      for (int e = 0; e < EPL; e++)
        acc[e] = fmaf(w[u], v[u][e], acc[e]);
  }
  dec_store<EPL>(p, t, h, lane, acc, L > 0.0f ? 1.0f / L : 0.0f);
}

/* Keys [lo, hi) of split z of a decode query at pos: the layer's window and the cache's ring
 * bound the range, which is cut into `splits` chunks of at least kDecMinChunk keys. */
__device__ __forceinline__ Range dec_range(const lm_cu_attn_p &p, const lm_cu_kvdesc &d,
                                           int64_t pos, int splits, int z) {
  int64_t klo = p.window > 0 ? max(pos - p.window + 1, (int64_t)0) : 0;
  klo = max(klo, d.window > 0 && d.n > d.window ? d.n - d.window : (int64_t)0);
  const int64_t chunk = max((pos - klo + 1 + splits - 1) / splits, (int64_t)kDecMinChunk);
  const int64_t lo = klo + z * chunk;
  return Range{lo, min(lo + chunk, pos + 1)};
}

/* Head h's query of token row tb in a lane's EPL values, with the q norm and RoPE when the
 * step asks (rounded as the separate op would store q), times the scale. A split with no
 * keys (most of them, at a short context) skips the work: its q stays zero. */
template <int EPL>
__device__ __forceinline__ void dec_load_q(const lm_cu_attn_p &p, int64_t tb, int h, int lane,
                                           int64_t pos, bool keys, float (&q)[EPL]) {
#pragma unroll
  for (int e = 0; e < EPL; e++)
    q[e] = 0.0f;
  if (!keys) return;
  ld_vec<EPL>(p.q.p, p.q.dt, tb * p.q.ld + (int64_t)h * 32 * EPL + lane * EPL, q);
  if (p.q_inv) {
    norm_rope_lane<EPL>(q, p.q_w, p.q_eps, (float)pos, p.q_inv, p.q.dt, lane);
#pragma unroll
    for (int e = 0; e < EPL; e++)
      q[e] = rnd(p.q.dt, q[e]);
  }
#pragma unroll
  for (int e = 0; e < EPL; e++)
    q[e] *= p.scale;
}

/* Online softmax over a batch of N scores (each lane's partial dot product; the first nk are
 * keys): the warp sums, one rescale of (m, l, acc) per batch, and s left holding the keys'
 * probabilities (0 past nk) for the caller's P·V. */
template <int N, int EPL>
__device__ __forceinline__ void dec_softmax(float (&s)[N], int nk, float &m, float &l,
                                            float (&acc)[EPL]) {
  float mx = m;
#pragma unroll
  for (int i = 0; i < N; i++) {
    s[i] = warp_sum(s[i]);
    if (i < nk) mx = fmaxf(mx, s[i]);
  }
  const float r = expf(m - mx);
  l *= r;
#pragma unroll
  for (int e = 0; e < EPL; e++)
    acc[e] *= r;
#pragma unroll
  for (int i = 0; i < N; i++) {
    s[i] = i < nk ? expf(s[i] - mx) : 0.0f;
    l += s[i];
  }
  m = mx;
}

/* The end of a split (every thread of the block calls it): the result when there is one
 * split, else this head's partial; the last block of a (token, head block) to finish, counted
 * with an atomic that it resets, then merges every split of its warps' heads. */
template <int EPL>
__device__ __forceinline__ void dec_finish(const lm_cu_attn_p &p, int64_t tb, int h, int lane,
                                           int splits, float m, float l, const float (&acc)[EPL],
                                           int *count) {
  if (splits == 1) {
    dec_store<EPL>(p, tb, h, lane, acc, l > 0.0f ? 1.0f / l : 0.0f);
    return;
  }
  float *pp = dec_part(p, tb, h, splits, blockIdx.z, 32 * EPL);
  if (lane == 0) pp[0] = m, pp[1] = l;
#pragma unroll
  for (int e = 0; e < EPL; e++)
    pp[4 + lane * EPL + e] = acc[e];
  __threadfence(); /* the partial is visible before the count says so */
  __syncthreads();
  __shared__ int last;
  const int64_t ci = (int64_t)blockIdx.x * gridDim.y + blockIdx.y;
  if (threadIdx.x == 0) last = atomicAdd(count + ci, 1) == splits - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  dec_merge<EPL>(p, tb, h, lane, splits);
  if (threadIdx.x == 0) count[ci] = 0; /* ready for the next launch (graph replays included) */
}

template <int EPL>
__global__ void __launch_bounds__(256) k_attn_dec(const lm_cu_attn_p p, int splits, int *count) {
  pdl_wait();
  constexpr int HD = 32 * EPL, U = EPL >= 16 ? 4 : 8; /* keys in flight per warp */
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, hpb = blockDim.x / 32;
  const int64_t tb = p.tiles[2 * blockIdx.x];
  const int h = blockIdx.y * hpb + warp, kvh = h / (p.n_heads / p.n_kv_heads);
  const lm_cu_kvdesc d = p.kv[(int64_t)p.seq[tb] * p.n_caches + p.cache];
  const int64_t n_past = d.n, pos = p.pos[tb];
  const Range rg = dec_range(p, d, pos, splits, blockIdx.z);
  const int64_t kvw = (int64_t)p.n_kv_heads * HD, hoff = (int64_t)kvh * HD + lane * EPL;
  const int dt = p.k_new.dt;
  float q[EPL], acc[EPL] = {}, m = -INFINITY, l = 0.0f;
  dec_load_q<EPL>(p, tb, h, lane, pos, rg.lo < rg.hi, q);
  for (int64_t kb = rg.lo; kb < rg.hi; kb += U) {
    float kk[U][EPL], vv[U][EPL], s[U];
    const int64_t slot0 =
        d.window > 0 ? kb % d.window : kb; /* one division per batch, not per key */
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int64_t kp =
          min(kb + u, rg.hi - 1); /* past the end: a repeat of the last key, masked below */
      if (kp < n_past) {
        int64_t slot = slot0 + (kp - kb);
        if (d.window > 0 && slot >= d.window) slot -= d.window;
        const int64_t off = slot * kvw + hoff;
        ld_vec<EPL>(d.k, dt, off, kk[u]);
        ld_vec<EPL>(d.v, dt, off, vv[u]);
      } else { /* this step's own key: chunk row of position kp */
        const int64_t r = tb + (kp - n_past);
        ld_vec<EPL>(p.k_new.p, dt, r * p.k_new.ld + hoff, kk[u]);
        ld_vec<EPL>(p.v_new.p, dt, r * p.v_new.ld + hoff, vv[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      float a = 0.0f;
#pragma unroll
      for (int e = 0; e < EPL; e++)
        a = fmaf(q[e], kk[u][e], a);
      s[u] = a;
    }
    dec_softmax<U, EPL>(s, (int)min((int64_t)U, rg.hi - kb), m, l, acc);
#pragma unroll
    for (int u = 0; u < U; u++)
#pragma unroll
      for (int e = 0; e < EPL; e++)
        acc[e] = fmaf(s[u], vv[u][e], acc[e]);
  }
  dec_finish<EPL>(p, tb, h, lane, splits, m, l, acc, count);
}

typedef void (*dec_fn)(const lm_cu_attn_p, int, int *);

/* ---- decode for many query heads per KV head ----------------------------------------------
 * G = 8 or 16 query heads share a KV head (the full layers of 12B, 26B-A4B and 31B: head dim
 * 512, one to four KV heads). k_attn_dec would give each head a warp that reads every K/V row
 * itself, so a block's warps all wait on the same rows, and the two blocks of a 16-head group
 * read them twice. Here a block is (token, KV head, split) with one warp per head of the
 * group: the split's keys pass through shared memory in tiles of G rows of K and V, each row
 * copied by one warp with cp.async (two tiles in flight), and every warp scores all keys of
 * the tile for its head. A row is read from memory once per split, and a tile's G rows are in
 * flight together. Partials and the last-block merge are k_attn_dec's (dec_part, dec_merge). */
__device__ __forceinline__ void cp16(void *dst, const void *src) {
  asm volatile(
      "cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((uint32_t)__cvta_generic_to_shared(dst)),
      "l"(src));
}

/* EPL consecutive bf16 or f32 values of a shared-memory row, as f32. */
template <int EPL>
__device__ __forceinline__ void lds_vec(const char *row, int dt, int lane, float (&o)[EPL]) {
  if (dt == LM_CU_BF16) {
    const uint4 *b = reinterpret_cast<const uint4 *>(row) + lane * (EPL / 8);
#pragma unroll
    for (int i = 0; i < EPL / 8; i++) {
      const uint4 u = b[i];
      const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
      for (int j = 0; j < 4; j++)
        o[8 * i + 2 * j] = bf2f(w[j] & 0xffffu), o[8 * i + 2 * j + 1] = bf2f(w[j] >> 16);
    }
  } else {
    const float4 *f = reinterpret_cast<const float4 *>(row) + lane * (EPL / 4);
#pragma unroll
    for (int i = 0; i < EPL / 4; i++) {
      const float4 v = f[i];
      o[4 * i] = v.x, o[4 * i + 1] = v.y, o[4 * i + 2] = v.z, o[4 * i + 3] = v.w;
    }
  }
}

/* Shared bytes of k_attn_dec_gqa with W warps: 2 tiles × (K, V) × W rows. */
constexpr size_t gqa_smem(int w, int hd, int esz) { return (size_t)2 * 2 * w * hd * esz; }

template <int EPL, int W>
__global__ void __launch_bounds__(32 * W)
    k_attn_dec_gqa(const lm_cu_attn_p p, int splits, int *count) {
  pdl_wait();
  constexpr int HD = 32 * EPL;
  extern __shared__ float4 gsm4[];
  char *gsm = reinterpret_cast<char *>(gsm4);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t tb = p.tiles[2 * blockIdx.x];
  const int kvh = blockIdx.y, h = kvh * W + warp;
  const lm_cu_kvdesc d = p.kv[(int64_t)p.seq[tb] * p.n_caches + p.cache];
  const int64_t n_past = d.n, pos = p.pos[tb];
  const Range rg = dec_range(p, d, pos, splits, blockIdx.z);
  const int64_t lo = rg.lo, hi = rg.hi;
  const int dt = p.k_new.dt, esz = dt == LM_CU_BF16 ? 2 : 4, rowb = HD * esz;
  const int64_t kvw = (int64_t)p.n_kv_heads * HD, hoff = (int64_t)kvh * HD;
  float q[EPL], acc[EPL] = {}, m = -INFINITY, l = 0.0f;
  dec_load_q<EPL>(p, tb, h, lane, pos, lo < hi, q);
  /* this warp's row of the tile that starts at key kb: K and V into stage st */
  auto issue = [&](int64_t kb, int st) {
    const int64_t kp = kb + warp;
    if (kp < hi) {
      const char *ks, *vs;
      if (kp < n_past) {
        const int64_t off = ((d.window > 0 ? kp % d.window : kp) * kvw + hoff) * esz;
        ks = (const char *)d.k + off, vs = (const char *)d.v + off;
      } else { /* this step's own key: its chunk row */
        const int64_t r = tb + (kp - n_past);
        ks = (const char *)p.k_new.p + (r * p.k_new.ld + hoff) * esz;
        vs = (const char *)p.v_new.p + (r * p.v_new.ld + hoff) * esz;
      }
      char *kd = gsm + ((size_t)(2 * st) * W + warp) * rowb, *vd = kd + (size_t)W * rowb;
      for (int b = 16 * lane; b < rowb; b += 16 * 32)
        cp16(kd + b, ks + b), cp16(vd + b, vs + b);
    }
    asm volatile("cp.async.commit_group;");
  };
  const int64_t n = hi > lo ? hi - lo : 0, tiles = (n + W - 1) / W;
  if (tiles > 0) issue(lo, 0);
  for (int64_t t = 0; t < tiles; t++) {
    const int st = (int)(t & 1), nk = (int)min((int64_t)W, n - t * W);
    if (t + 1 < tiles)
      issue(lo + (t + 1) * W, st ^ 1);
    else
      asm volatile("cp.async.commit_group;"); /* an empty group keeps the wait below true */
    asm volatile("cp.async.wait_group 1;" ::: "memory");
    __syncthreads(); /* every warp's rows of tile t have landed */
    const char *kt = gsm + (size_t)(2 * st) * W * rowb, *vt = kt + (size_t)W * rowb;
    float sc[W];
#pragma unroll
    for (int i = 0; i < W; i++) {
      float kk[EPL], a = 0.0f;
      lds_vec<EPL>(kt + (size_t)i * rowb, dt, lane, kk);
#pragma unroll
      for (int e = 0; e < EPL; e++)
        a = fmaf(q[e], kk[e], a);
      sc[i] = a;
    }
    dec_softmax<W, EPL>(sc, nk, m, l, acc);
#pragma unroll
    for (int i = 0; i < W; i++) {
      if (i >= nk) break;
      float vv[EPL];
      lds_vec<EPL>(vt + (size_t)i * rowb, dt, lane, vv);
#pragma unroll
      for (int e = 0; e < EPL; e++)
        acc[e] = fmaf(sc[i], vv[e], acc[e]);
    }
    __syncthreads(); /* tile t is consumed before tile t + 2 is copied over it */
  }
  dec_finish<EPL>(p, tb, h, lane, splits, m, l, acc, count);
}

/* The instance for head dim hd and G query heads per KV head, or null where k_attn_dec serves. */
dec_fn pick_gqa(int hd, int G) {
  if (G == 8)
    return hd == 256 ? &k_attn_dec_gqa<8, 8> : hd == 512 ? &k_attn_dec_gqa<16, 8> : nullptr;
  if (G == 16)
    return hd == 256 ? &k_attn_dec_gqa<8, 16> : hd == 512 ? &k_attn_dec_gqa<16, 16> : nullptr;
  return nullptr;
}

dec_fn pick_dec(int hd) {
  switch (hd) {
  case 32: return &k_attn_dec<1>;
  case 64: return &k_attn_dec<2>;
  case 128: return &k_attn_dec<4>;
  case 256: return &k_attn_dec<8>;
  case 512: return &k_attn_dec<16>;
  default: return nullptr;
  }
}

bool aligned16(const void *p, int64_t ld, int dt) {
  return ((uintptr_t)p & 15u) == 0 && (ld * (dt == LM_CU_F32 ? 4 : 2)) % 16 == 0;
}

/* A launch of the decode kernel: its instance, grid, block and shared memory. */
struct DecPlan {
  dec_fn fn;
  dim3 grid;
  int threads, splits;
  size_t smem;
};

/* The decode kernel's launch, when the step is one token per sequence and the layout allows
 * its vector loads; false leaves the step to the general kernel. Host logic only. */
bool dec_plan(const lm_cu_attn_p *p, int n_sms, DecPlan &d) {
  const int dt = p->k_new.dt;
  if (p->n_kv_heads <= 0 || p->n_heads % p->n_kv_heads || p->n_tiles <= 0 ||
      p->part_floats <= 2 * kCountSlots)
    return false;
  dec_fn fn = pick_dec(p->head_dim);
  if (!fn || p->max_tile != 1 || (dt != LM_CU_BF16 && dt != LM_CU_F32) || p->q.dt != dt ||
      p->v_new.dt != dt || !aligned16(p->q.p, p->q.ld, dt) ||
      !aligned16(p->k_new.p, p->k_new.ld, dt) || !aligned16(p->v_new.p, p->v_new.ld, dt))
    return false;
  /* heads of one KV group per block (their K/V rows are shared in L1), at most 8; or, with 8
   * or 16 heads per KV head, a block per KV head whose warps share the rows in shared memory */
  const dec_fn gqa = pick_gqa(p->head_dim, p->n_heads / p->n_kv_heads);
  int hpb = p->n_heads / p->n_kv_heads;
  while (hpb > 8 || p->n_heads % hpb)
    hpb = hpb > 8 ? hpb / 2 : hpb - 1;
  if (gqa) hpb = p->n_heads / p->n_kv_heads;
  const int64_t blocks = (int64_t)p->n_tiles * (p->n_heads / hpb);
  if (p->n_heads / hpb > 65535) return false;
  /* ~2 blocks per SM over a long context (4 measured slower: the merge reads twice the
   * partials); a sliding layer never sees more than its window, so splits beyond
   * window / kDecMinChunk would only be empty blocks for the merge to count */
  int splits = (int)((2 * (int64_t)n_sms + blocks - 1) / blocks);
  const int64_t most =
      p->window > 0 ? (p->window + kDecMinChunk - 1) / kDecMinChunk : kDecMaxSplits;
  splits = splits > most ? (int)most : splits;
  splits = splits > kDecMaxSplits ? kDecMaxSplits : splits < 1 ? 1 : splits;
  if (blocks > kCountSlots) splits = 1;
  while (splits > 1 && (int64_t)p->n_tiles * p->n_heads * splits * (p->head_dim + 4) >
                           p->part_floats - kCountSlots)
    splits--;
  d.fn = gqa ? gqa : fn;
  d.grid = dim3((unsigned)p->n_tiles, (unsigned)(p->n_heads / hpb), (unsigned)splits);
  d.threads = 32 * hpb;
  d.splits = splits;
  d.smem = gqa ? gqa_smem(hpb, p->head_dim, dt == LM_CU_BF16 ? 2 : 4) : 0;
  return true;
}

cudaError_t attention_decode(lm_cu_stream s, const lm_cu_attn_p *p, int n_sms) {
  DecPlan d;
  if (!dec_plan(p, n_sms, d)) return cudaErrorInvalidValue;
  int *count = (int *)(p->part + (p->part_floats - kCountSlots));
  launch(d.fn, d.grid, d.threads, d.smem, s, *p, d.splits, count);
  return cudaGetLastError();
}

typedef void (*attn_fn)(const lm_cu_attn_p, int, int);

template <bool Q> attn_fn pick(int hd) {
  if (hd <= 32) return &k_attn<1, Q>;
  if (hd <= 64) return &k_attn<2, Q>;
  if (hd <= 128) return &k_attn<4, Q>;
  if (hd <= 256) return &k_attn<8, Q>;
  if (hd <= 512) return &k_attn<16, Q>;
  return nullptr;
}

/* The general kernel (any tile shape; split-K with a combine launch when the batch has fewer
 * blocks than SMs). Its partials stay clear of the decode kernel's split counters at the tail
 * of the scratch, which must outlive every launch. */
cudaError_t attention_tiled(lm_cu_stream s, const lm_cu_attn_p *p, int n_sms, bool quant) {
  attn_fn fn = quant ? pick<true>(p->head_dim) : pick<false>(p->head_dim);
  if (!fn || p->n_kv_heads <= 0 || p->n_heads % p->n_kv_heads || p->n_tiles <= 0)
    return cudaErrorInvalidValue;
  const int G = p->n_heads / p->n_kv_heads;
  const int passes = (p->max_tile * G + kRows - 1) / kRows;
  const int64_t blocks = (int64_t)p->n_tiles * p->n_kv_heads * passes;
  if ((int64_t)p->n_kv_heads * passes > 65535) return cudaErrorInvalidValue;
  int splits = 1;
  if (blocks < n_sms) { /* decode: spread each row's keys over more blocks */
    splits = (int)((2 * (int64_t)n_sms + blocks - 1) / blocks);
    if (splits > 32) splits = 32;
    while (splits > 1 && p->out.rows * p->n_heads * splits * (int64_t)(p->head_dim + 2) >
                             p->part_floats - kCountSlots)
      splits--;
  }
  size_t smem = (size_t)smem_floats(p->head_dim) * sizeof(float);
  dim3 grid((unsigned)p->n_tiles, (unsigned)(p->n_kv_heads * passes), (unsigned)splits);
  launch(fn, grid, kThreads, smem, s, *p, passes, splits);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess || splits == 1) return e;
  launch(k_attn_combine, (unsigned)(p->out.rows * p->n_heads), kThreads, 0, s, *p, splits);
  return cudaGetLastError();
}

} // namespace

extern "C" {

lm_cu_attn_kind lm_cu_pick_attn(const lm_cu_attn_p *p, int quant, int n_sms,
                                const lm_cu_switches *sw) {
  DecPlan d;
  const bool dec = !quant && dec_plan(p, n_sms, d);
  if (p->q_inv) return dec && sw->q_norm ? LM_CU_ATTN_DECODE : LM_CU_ATTN_NORM_FIRST;
  return dec ? LM_CU_ATTN_DECODE : LM_CU_ATTN_TILED;
}

cudaError_t lm_cu_attention(lm_cu_stream s, const lm_cu_attn_p *p, int n_sms,
                            lm_cu_attn_kind kind) {
  if (kind == LM_CU_ATTN_DECODE) return attention_decode(s, p, n_sms);
  if (kind != LM_CU_ATTN_TILED || p->q_inv) return cudaErrorInvalidValue;
  return attention_tiled(s, p, n_sms, false);
}

cudaError_t lm_cu_kvq_attention(lm_cu_stream s, const lm_cu_attn_p *p, int n_sms) {
  if (p->q_inv) return cudaErrorInvalidValue; /* the caller norms q first (NORM_FIRST) */
  return attention_tiled(s, p, n_sms, true);
}

cudaError_t lm_cu_attn_init(int max_smem_optin) {
  for (int hd : {256, 512})
    for (int G : {8, 16}) { /* f32 rows of 512 with 16 warps need 128 KB */
      const size_t need = gqa_smem(G, hd, 4);
      if ((int64_t)need > max_smem_optin) return cudaErrorInvalidConfiguration;
      cudaError_t e = cudaFuncSetAttribute((const void *)pick_gqa(hd, G),
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, (int)need);
      if (e != cudaSuccess) return e;
    }
  static const int hds[] = {32, 64, 128, 256, 512};
  for (int i = 0; i < 5; i++) {
    size_t need = (size_t)smem_floats(hds[i]) * sizeof(float);
    if ((int64_t)need > max_smem_optin) return cudaErrorInvalidConfiguration;
    for (attn_fn fn : {pick<false>(hds[i]), pick<true>(hds[i])}) {
      cudaError_t e = cudaFuncSetAttribute((const void *)fn,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, (int)need);
      if (e != cudaSuccess) return e;
    }
  }
  return cudaSuccess;
}

} // extern "C"
