/* k_kvquant.cu — the quantized KV cache kinds (kv:quant, kv:rotating-quant) on the device:
 * the quantizer (kv_stage, kv_convert), the append of staged codes, and attention that reads
 * codes and bf16 scales/biases in place, dequantizing each key/value row while it is staged
 * in shared memory (the cache is never dequantized as a whole).
 *
 * Bit-exact with the host (tensor/quant.c): the quantizer runs the same f32 operations in the
 * same order, each an IEEE-rounded intrinsic (__fsub_rn, __fdiv_rn, ...), so no compiler flag
 * (fast division, FMA contraction) can move a code; stored values are read back as
 * f32(bf16 scale) * q + f32(bf16 bias) with a separately rounded multiply and add, as
 * lm_affine_dequant_row_bf16 computes them. With bf16 activations kv_stage leaves the stored
 * values rounded to bf16 in k_new/v_new (their dtype), so only the chunk's own queries see
 * that rounding; the cache holds the same codes as in f32.
 *
 * Descriptors are per (sequence, cache): sequences of one batch may hold caches of different
 * kinds at one index (one has crossed --kv-quant-start, another not yet), so every kernel here
 * also serves plain descriptors, and the op layer uses them whenever any sequence's cache of
 * that index is quantized. Stage rows are written and read byte by byte: their stride comes
 * from the workspace and carries no alignment guarantee. Cache rows are aligned: a head's code
 * row starts at a multiple of 16 bytes (head_dim is a multiple of the group, itself ≥ 32).
 *
 * Attention follows k_attention.cu's plan (its kernel is not shared: the loaders differ):
 * blocks of up to 32 query rows (heads of one KV group × tokens of one tile), key tiles of 32
 * staged in shared memory as f32, online softmax in f32, split-K for decode merged by a
 * combine kernel; grid and split count depend only on the batch's shape, so captured graphs
 * stay valid as caches grow. Instances: head dims up to 32·NPL, NPL ∈ {1, 2, 4, 8, 16}. */
#include <math.h>

#include "backend/cuda/k_common.cuh"

using namespace lmcu;

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kRw = 4;              /* query rows per warp */
constexpr int kRows = kWarps * kRw; /* query rows per block */
constexpr int kKt = 32;             /* keys per tile (one per lane) */
constexpr int64_t kMinChunk = 64;   /* fewest keys a split takes */
constexpr int kMinGroup = 32;       /* smallest group: bounds the groups of a row */

int64_t blocks_for(int64_t n, int64_t per) { return (n + per - 1) / per; }

/* Byte layout of one token's stage row (kv.h order: K codes, V codes, K scales, K biases,
 * V scales, V biases), also the per-slot row sizes of the cache arrays. */
struct Layout {
  int64_t cb, sb; /* code bytes of a K (or V) row; bytes of its scales (or biases) */
  __device__ Layout(int64_t w, int bits, int group) : cb(w * bits / 8), sb(w / group * 2) {}
  __device__ int64_t codes(int which) const { return which * cb; }
  __device__ int64_t scales(int which) const { return 2 * cb + 2 * which * sb; }
  __device__ int64_t biases(int which) const { return 2 * cb + (2 * which + 1) * sb; }
  __device__ int64_t total() const { return 2 * cb + 4 * sb; }
};

__device__ __forceinline__ void put_u16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)(v & 0xffu);
  p[1] = (uint8_t)(v >> 8);
}

/* lm_affine_quantize_group + the bf16 rounding of lm_affine_quantize_row_bf16 for the group
 * of `group` values at src[off..] (dtype dt): codes as LSB-first bytes (bits 4 or 8), the bf16
 * scale and bias as little-endian bytes at sp/bp, and, when deq is set, the stored values
 * written to deq[off..] (same dtype; may be src: each value is read before it is replaced). */
__device__ void quant_group(const void *src, int dt, int64_t off, int group, int bits, uint8_t *codes, uint8_t *sp,
                            uint8_t *bp, void *deq) {
  float mx = ld(src, dt, off), mn = mx;
  for (int i = 1; i < group; i++) {
    const float w = ld(src, dt, off + i);
    mx = w > mx ? w : mx;
    mn = w < mn ? w : mn;
  }
  const float n_bins = (float)((1 << bits) - 1), eps = 1e-7f;
  const bool side = fabsf(mn) > fabsf(mx);
  float s = __fdiv_rn(__fsub_rn(mx, mn), n_bins);
  s = s > eps ? s : eps;
  s = side ? s : -s;
  const float edge = side ? mn : mx, q0 = rintf(__fdiv_rn(edge, s));
  float b = 0.0f;
  if (q0 != 0.0f) {
    s = __fdiv_rn(edge, q0);
    b = edge;
  }
  const uint16_t s16 = f2bf(s), b16 = f2bf(b);
  const float sf = bf2f(s16), bf = bf2f(b16);
  put_u16(sp, s16);
  put_u16(bp, b16);
  uint32_t low = 0; /* 4-bit: the even code waiting for its odd partner (high nibble) */
  for (int i = 0; i < group; i++) {
    float q = rintf(__fdiv_rn(__fsub_rn(ld(src, dt, off + i), b), s));
    q = q < 0.0f ? 0.0f : (q > n_bins ? n_bins : q);
    const uint32_t qi = (uint32_t)q;
    if (bits == 8)
      codes[i] = (uint8_t)qi;
    else if (i & 1)
      codes[i / 2] = (uint8_t)(low | qi << 4);
    else
      low = qi;
    if (deq) st(deq, dt, off + i, __fadd_rn(__fmul_rn(sf, (float)qi), bf));
  }
}

/* One thread per (token, K or V, group). */
__global__ void __launch_bounds__(kThreads) k_kvq_stage(lm_cu_t kn, lm_cu_t vn, lm_cu_t stage, const lm_cu_kvdesc *kv,
                                                       int n_caches, int cache, const int32_t *seq) {
  pdl_wait();
  const int64_t t = blockIdx.y, i = (int64_t)blockIdx.x * kThreads + threadIdx.x;
  const lm_cu_kvdesc d = kv[(int64_t)seq[t] * n_caches + cache];
  if (!d.quant) return; /* a plain cache stores the chunk as computed */
  const int64_t w = kn.cols, ng = w / d.group;
  if (i >= 2 * ng) return;
  const int which = (int)(i / ng);
  const int64_t g = i % ng;
  const lm_cu_t x = which ? vn : kn;
  const Layout L(w, d.bits, d.group);
  uint8_t *row = (uint8_t *)stage.p + t * stage.ld;
  const int64_t off = t * x.ld + g * d.group;
  quant_group(x.p, x.dt, off, d.group, d.bits, row + L.codes(which) + g * d.group * d.bits / 8,
              row + L.scales(which) + 2 * g, row + L.biases(which) + 2 * g, x.p);
}

/* One thread per byte of a quantized token's stage row, or per element of a plain one. */
__global__ void __launch_bounds__(kThreads) k_kvq_append(lm_cu_t kn, lm_cu_t vn, lm_cu_t stage,
                                                        const lm_cu_kvdesc *kv, int n_caches, int cache,
                                                        const int32_t *pos, const int32_t *seq) {
  pdl_wait();
  const int64_t t = blockIdx.y, j = (int64_t)blockIdx.x * kThreads + threadIdx.x;
  const lm_cu_kvdesc d = kv[(int64_t)seq[t] * n_caches + cache];
  const int64_t p = pos[t], slot = d.window > 0 ? p % d.window : p;
  /* A chunk longer than a ring: token t + window (same sequence, position p + window) owns
   * this slot, so only the last `window` tokens write, and no two threads race for a slot. */
  if (d.window > 0 && t + d.window < kn.rows && seq[t + d.window] == seq[t]) return;
  if (slot < 0 || slot >= d.slots) return; /* begin_step refused such a step already */
  const int64_t w = kn.cols;
  if (!d.quant) {
    if (j >= w) return;
    st(d.k, kn.dt, slot * w + j, ldt(kn, t, j));
    st(d.v, vn.dt, slot * w + j, ldt(vn, t, j));
    return;
  }
  const Layout L(w, d.bits, d.group);
  if (j >= L.total()) return;
  const uint8_t byte = ((const uint8_t *)stage.p)[t * stage.ld + j];
  if (j < 2 * L.cb) {
    uint8_t *dst = (uint8_t *)(j < L.cb ? d.k : d.v);
    dst[slot * L.cb + j % L.cb] = byte;
    return;
  }
  const int64_t r = j - 2 * L.cb, a = r / L.sb; /* 0: K scales, 1: K biases, 2: V scales, 3: V biases */
  uint8_t *dst = (uint8_t *)(a == 0 ? d.ks : a == 1 ? d.kb : a == 2 ? d.vs : d.vb);
  dst[slot * L.sb + r % L.sb] = byte;
}

/* One thread per (slot, K or V, group) of the held slots; a grid-stride loop, since a long
 * cache has more groups than one launch has blocks. */
__global__ void __launch_bounds__(kThreads) k_kvq_convert(lm_cu_kvdesc from, int dt, lm_cu_kvdesc to, int64_t w,
                                                         int64_t held) {
  pdl_wait();
  const int64_t ng = w / to.group, n = held * 2 * ng;
  const Layout L(w, to.bits, to.group);
  for (int64_t i = (int64_t)blockIdx.x * kThreads + threadIdx.x; i < n; i += (int64_t)gridDim.x * kThreads) {
    const int64_t slot = i / (2 * ng), g = i % ng;
    const int which = (int)(i / ng % 2);
    uint8_t *codes = (uint8_t *)(which ? to.v : to.k) + slot * L.cb + g * to.group * to.bits / 8;
    uint8_t *sp = (uint8_t *)(which ? to.vs : to.ks) + slot * L.sb + 2 * g;
    uint8_t *bp = (uint8_t *)(which ? to.vb : to.kb) + slot * L.sb + 2 * g;
    quant_group(which ? from.v : from.k, dt, slot * w + g * to.group, to.group, to.bits, codes, sp, bp, nullptr);
  }
}

/* ---- attention ----------------------------------------------------------------------------- */

/* Shared floats for head dim hd: q rows, K tile (rows padded by one float), V tile. */
constexpr int64_t smem_floats(int64_t hd) { return kRows * hd + kKt * (hd + 1) + kKt * hd; }

struct Range {
  int64_t lo, hi; /* this split's key positions [lo, hi) */
};

/* A lane's share of the cached key and value rows of KV head g at `slot`, dequantized into
 * the shared tiles kd/vd: 8 consecutive values per pass, which lie in one group (one scale and
 * bias) and in one aligned 8-byte (8-bit) or 4-byte (4-bit) word of codes. */
__device__ __forceinline__ void load_quant_row(const lm_cu_kvdesc &d, int64_t kvw, int64_t slot, int g, int hd,
                                               int lane, float *kd, float *vd) {
  const int64_t cb = kvw * d.bits / 8, ng = kvw / d.group, hoff = (int64_t)g * hd;
  const uint8_t *kc = (const uint8_t *)d.k + slot * cb + hoff * d.bits / 8;
  const uint8_t *vc = (const uint8_t *)d.v + slot * cb + hoff * d.bits / 8;
  const uint16_t *ksc = (const uint16_t *)d.ks + slot * ng, *kbi = (const uint16_t *)d.kb + slot * ng;
  const uint16_t *vsc = (const uint16_t *)d.vs + slot * ng, *vbi = (const uint16_t *)d.vb + slot * ng;
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

template <int NPL>
__global__ void __launch_bounds__(kThreads) k_attn_q(const lm_cu_attn_p p, int passes, int splits) {
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
      qs[rl * hd + dd] = r < rend ? ldt(p.q, tb + r / G, (int64_t)(g * G + r % G) * hd + dd) * p.scale : 0.0f;
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
    for (int c = 0; c < NPL; c++) acc[j][c] = 0.0f;
  }
  const int64_t kvw = (int64_t)p.n_kv_heads * hd, goff = (int64_t)g * hd;
  for (int64_t kb = rg.lo; kb < rg.hi; kb += kKt) {
    const int nk = (int)min((int64_t)kKt, rg.hi - kb);
    __syncthreads(); /* the previous tile is consumed (and q is staged) */
    if (threadIdx.x < kKt && (int)threadIdx.x < nk) {
      int64_t kp = kb + threadIdx.x;
      ksrc[threadIdx.x] = kp < n_past ? (d.window > 0 ? kp % d.window : kp) : -(1 + t0 + (kp - n_past));
    }
    __syncthreads();
    for (int j = warp; j < kKt; j += kWarps) { /* a warp per key row, coalesced along the head dim */
      float *kd = ks + j * (hd + 1), *vd = vs + j * hd;
      const int64_t src = j < nk ? ksrc[j] : 0;
      if (j < nk && src >= 0 && d.quant) {
        load_quant_row(d, kvw, src, g, hd, lane, kd, vd);
        continue;
      }
#pragma unroll 4
      for (int dd = lane; dd < hd; dd += 32) {
        float kk = 0.0f, vv = 0.0f;
        if (j < nk) {
          if (src >= 0) { /* a plain cache: this sequence's, while another's is quantized */
            kk = ld(d.k, p.k_new.dt, src * kvw + goff + dd);
            vv = ld(d.v, p.v_new.dt, src * kvw + goff + dd);
          } else { /* the chunk: already what the cache will store (kv_stage) */
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
      for (int j = 0; j < kRw; j++) s[j] = fmaf(qw[j * hd + dd], kv, s[j]);
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
      for (int c = 0; c < NPL; c++) acc[j][c] *= r;
      m[j] = mn;
      s[j] = pj;
    }
    for (int jj = 0; jj < nk; jj++) {
      float pv[kRw];
#pragma unroll
      for (int j = 0; j < kRw; j++) pv[j] = __shfl_sync(0xffffffffu, s[j], jj);
#pragma unroll
      for (int c = 0; c < NPL; c++) {
        int dd = lane + 32 * c;
        float v = dd < hd ? vs[jj * hd + dd] : 0.0f;
#pragma unroll
        for (int j = 0; j < kRw; j++) acc[j][c] = fmaf(pv[j], v, acc[j][c]);
      }
    }
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
__global__ void __launch_bounds__(kThreads) k_attn_q_combine(const lm_cu_attn_p p, int splits) {
  pdl_wait();
  const int64_t row = blockIdx.x, t = row / p.n_heads, h = row % p.n_heads;
  const int hd = p.head_dim;
  const float *pp = p.part + row * splits * (int64_t)(hd + 2);
  float M = -INFINITY, L = 0.0f;
  for (int s = 0; s < splits; s++) M = fmaxf(M, pp[s * (hd + 2)]);
  for (int s = 0; s < splits; s++) {
    float ls = pp[s * (hd + 2) + 1];
    if (ls > 0.0f) L += ls * expf(pp[s * (hd + 2)] - M);
  }
  float inv = L > 0.0f ? 1.0f / L : 0.0f;
  for (int dd = threadIdx.x; dd < hd; dd += kThreads) {
    float a = 0.0f;
    for (int s = 0; s < splits; s++) {
      const float *q = pp + s * (hd + 2);
      if (q[1] > 0.0f) a += q[2 + dd] * expf(q[0] - M);
    }
    stt(p.out, t, h * hd + dd, a * inv);
  }
}

typedef void (*attn_fn)(const lm_cu_attn_p, int, int);

attn_fn pick(int hd) {
  if (hd <= 32) return &k_attn_q<1>;
  if (hd <= 64) return &k_attn_q<2>;
  if (hd <= 128) return &k_attn_q<4>;
  if (hd <= 256) return &k_attn_q<8>;
  if (hd <= 512) return &k_attn_q<16>;
  return nullptr;
}

} // namespace

extern "C" {

cudaError_t lm_cu_kvq_stage(cudaStream_t s, lm_cu_t k_new, lm_cu_t v_new, lm_cu_t stage, const lm_cu_kvdesc *kv,
                            int n_caches, int cache, const int32_t *seq) {
  if (k_new.rows <= 0) return cudaSuccess;
  dim3 grid((unsigned)blocks_for(2 * (k_new.cols / kMinGroup), kThreads), (unsigned)k_new.rows);
  launch(k_kvq_stage, grid, kThreads, 0, s, k_new, v_new, stage, kv, n_caches, cache, seq);
  return cudaGetLastError();
}

cudaError_t lm_cu_kvq_append(cudaStream_t s, lm_cu_t k_new, lm_cu_t v_new, lm_cu_t stage, const lm_cu_kvdesc *kv,
                             int n_caches, int cache, const int32_t *pos, const int32_t *seq) {
  if (k_new.rows <= 0) return cudaSuccess;
  /* the largest stage row (8 bits, groups of 32), which also covers a plain row's elements */
  const int64_t w = k_new.cols, most = 2 * w + 4 * (w / kMinGroup) * 2;
  dim3 grid((unsigned)blocks_for(most, kThreads), (unsigned)k_new.rows);
  launch(k_kvq_append, grid, kThreads, 0, s, k_new, v_new, stage, kv, n_caches, cache, pos, seq);
  return cudaGetLastError();
}

cudaError_t lm_cu_kvq_convert(cudaStream_t s, const lm_cu_kvdesc *from, int dt, const lm_cu_kvdesc *to, int64_t w,
                              int64_t held) {
  if (held <= 0) return cudaSuccess;
  int64_t blocks = blocks_for(held * 2 * (w / to->group), kThreads);
  if (blocks > 65535) blocks = 65535;
  launch(k_kvq_convert, (unsigned)blocks, kThreads, 0, s, *from, dt, *to, w, held);
  return cudaGetLastError();
}

cudaError_t lm_cu_kvq_attention(cudaStream_t s, const lm_cu_attn_p *p, int n_sms) {
  attn_fn fn = pick(p->head_dim);
  if (!fn || p->n_kv_heads <= 0 || p->n_heads % p->n_kv_heads || p->n_tiles <= 0) return cudaErrorInvalidValue;
  const int G = p->n_heads / p->n_kv_heads;
  const int passes = (p->max_tile * G + kRows - 1) / kRows;
  const int64_t blocks = (int64_t)p->n_tiles * p->n_kv_heads * passes;
  if ((int64_t)p->n_kv_heads * passes > 65535) return cudaErrorInvalidValue;
  /* Partials stay in the first half of the shared scratch: k_attention.cu's kernels may keep
   * state (split counters) at its tail that must outlive this kernel. */
  const int64_t part_floats = p->part_floats / 2;
  int splits = 1;
  if (blocks < n_sms) { /* decode: spread each row's keys over more blocks */
    splits = (int)((2 * (int64_t)n_sms + blocks - 1) / blocks);
    if (splits > 32) splits = 32;
    while (splits > 1 && p->out.rows * p->n_heads * splits * (int64_t)(p->head_dim + 2) > part_floats) splits--;
  }
  size_t smem = (size_t)smem_floats(p->head_dim) * sizeof(float);
  dim3 grid((unsigned)p->n_tiles, (unsigned)(p->n_kv_heads * passes), (unsigned)splits);
  launch(fn, grid, kThreads, smem, s, *p, passes, splits);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess || splits == 1) return e;
  launch(k_attn_q_combine, (unsigned)(p->out.rows * p->n_heads), kThreads, 0, s, *p, splits);
  return cudaGetLastError();
}

cudaError_t lm_cu_kvq_init(int max_smem_optin) {
  static const int hds[] = {32, 64, 128, 256, 512};
  for (int i = 0; i < 5; i++) {
    size_t need = (size_t)smem_floats(hds[i]) * sizeof(float);
    if ((int64_t)need > max_smem_optin) return cudaErrorInvalidConfiguration;
    cudaError_t e =
        cudaFuncSetAttribute((const void *)pick(hds[i]), cudaFuncAttributeMaxDynamicSharedMemorySize, (int)need);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

} // extern "C"
