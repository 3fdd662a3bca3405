/* k_kvquant.cu — the quantized KV cache kinds (kv:quant, kv:rotating-quant) on the device:
 * the quantizer (kv_stage, kv_convert) and the append of staged codes, which also serves
 * kv:turboquant (its encoder is k_tq.cu's). (Attention reads the
 * codes and bf16 scales/biases in place: k_attention.cu dequantizes each key/value row while
 * it is staged in shared memory, so the cache is never dequantized as a whole.)
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
 * Attention over these kinds is k_attention.cu's general kernel with the quantized row loader. */
#include <math.h>

#include "backend/cuda/k_tq.cuh"

using namespace lmcu;

namespace {

constexpr int kThreads = 256;
constexpr int kMinGroup = 32; /* smallest group: bounds the groups of a row */

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
__device__ void quant_group(const void *src, int dt, int64_t off, int group, int bits,
                            uint8_t *codes, uint8_t *sp, uint8_t *bp, void *deq) {
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
__global__ void __launch_bounds__(kThreads)
    k_kvq_stage(lm_cu_t kn, lm_cu_t vn, lm_cu_t stage, const lm_cu_kvdesc *kv, int n_caches,
                int cache, const int32_t *seq) {
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

/* One thread per byte of a quantized (affine or TurboQuant) token's stage row, or per element
 * of a plain one. */
__global__ void __launch_bounds__(kThreads)
    k_kvq_append(lm_cu_t kn, lm_cu_t vn, lm_cu_t stage, const lm_cu_kvdesc *kv, int n_caches,
                 int cache, const int32_t *pos, const int32_t *seq) {
  pdl_wait();
  const int64_t t = blockIdx.y, j = (int64_t)blockIdx.x * kThreads + threadIdx.x;
  const lm_cu_kvdesc d = kv[(int64_t)seq[t] * n_caches + cache];
  const int64_t p = pos[t], slot = d.window > 0 ? p % d.window : p;
  /* A chunk longer than a ring: token t + window (same sequence, position p + window) owns
   * this slot, so only the last `window` tokens write, and no two threads race for a slot. */
  if (d.window > 0 && t + d.window < kn.rows && seq[t + d.window] == seq[t]) return;
  if (slot < 0 || slot >= d.slots) return; /* begin_step refused such a step already */
  const int64_t w = kn.cols;
  if (!d.quant && !d.tq) {
    if (j >= w) return;
    st(d.k, kn.dt, slot * w + j, ldt(kn, t, j));
    st(d.v, vn.dt, slot * w + j, ldt(vn, t, j));
    return;
  }
  const uint8_t *srow = (const uint8_t *)stage.p + t * stage.ld;
  if (d.tq) { /* key codes, value codes, then the three fp16 planes */
    const TqLayout T(w, d.bits, d.v_bits);
    if (j >= T.total()) return;
    if (j < T.kc) {
      ((uint8_t *)d.k)[slot * T.kc + j] = srow[j];
    } else if (j < T.kc + T.vc) {
      ((uint8_t *)d.v)[slot * T.vc + j - T.kc] = srow[j];
    } else {
      const int64_t r = j - T.kc - T.vc, a = r / T.sb; /* 0: K scales, 1: K zeros, 2: V scales */
      uint8_t *dst = (uint8_t *)(a == 0 ? d.ks : a == 1 ? d.kb : d.vs);
      dst[slot * T.sb + r % T.sb] = srow[j];
    }
    return;
  }
  const Layout L(w, d.bits, d.group);
  if (j >= L.total()) return;
  const uint8_t byte = srow[j];
  if (j < 2 * L.cb) {
    uint8_t *dst = (uint8_t *)(j < L.cb ? d.k : d.v);
    dst[slot * L.cb + j % L.cb] = byte;
    return;
  }
  const int64_t r = j - 2 * L.cb,
                a = r / L.sb; /* 0: K scales, 1: K biases, 2: V scales, 3: V biases */
  uint8_t *dst = (uint8_t *)(a == 0 ? d.ks : a == 1 ? d.kb : a == 2 ? d.vs : d.vb);
  dst[slot * L.sb + r % L.sb] = byte;
}

/* One thread per (slot, K or V, group) of the held slots; a grid-stride loop, since a long
 * cache has more groups than one launch has blocks. */
__global__ void __launch_bounds__(kThreads)
    k_kvq_convert(lm_cu_kvdesc from, int dt, lm_cu_kvdesc to, int64_t w, int64_t held) {
  pdl_wait();
  const int64_t ng = w / to.group, n = held * 2 * ng;
  const Layout L(w, to.bits, to.group);
  for (int64_t i = (int64_t)blockIdx.x * kThreads + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * kThreads) {
    const int64_t slot = i / (2 * ng), g = i % ng;
    const int which = (int)(i / ng % 2);
    uint8_t *codes = (uint8_t *)(which ? to.v : to.k) + slot * L.cb + g * to.group * to.bits / 8;
    uint8_t *sp = (uint8_t *)(which ? to.vs : to.ks) + slot * L.sb + 2 * g;
    uint8_t *bp = (uint8_t *)(which ? to.vb : to.kb) + slot * L.sb + 2 * g;
    quant_group(which ? from.v : from.k, dt, slot * w + g * to.group, to.group, to.bits, codes, sp,
                bp, nullptr);
  }
}

} // namespace

extern "C" {

cudaError_t lm_cu_kvq_stage(lm_cu_stream s, lm_cu_t k_new, lm_cu_t v_new, lm_cu_t stage,
                            const lm_cu_kvdesc *kv, int n_caches, int cache, const int32_t *seq) {
  if (k_new.rows <= 0) return cudaSuccess;
  dim3 grid((unsigned)blocks_for(2 * (k_new.cols / kMinGroup), kThreads), (unsigned)k_new.rows);
  launch(k_kvq_stage, grid, kThreads, 0, s, k_new, v_new, stage, kv, n_caches, cache, seq);
  return cudaGetLastError();
}

cudaError_t lm_cu_kvq_append(lm_cu_stream s, lm_cu_t k_new, lm_cu_t v_new, lm_cu_t stage,
                             const lm_cu_kvdesc *kv, int n_caches, int cache, const int32_t *pos,
                             const int32_t *seq) {
  if (k_new.rows <= 0) return cudaSuccess;
  /* the largest stage row (8 bits, groups of 32), which also covers a plain row's elements
   * and a TurboQuant row (at most 13 bits and 3 fp16 planes per 32 values) */
  const int64_t w = k_new.cols, most = 2 * w + 4 * (w / kMinGroup) * 2;
  dim3 grid((unsigned)blocks_for(most, kThreads), (unsigned)k_new.rows);
  launch(k_kvq_append, grid, kThreads, 0, s, k_new, v_new, stage, kv, n_caches, cache, pos, seq);
  return cudaGetLastError();
}

cudaError_t lm_cu_kvq_convert(lm_cu_stream s, const lm_cu_kvdesc *from, int dt,
                              const lm_cu_kvdesc *to, int64_t w, int64_t held) {
  if (held <= 0) return cudaSuccess;
  int64_t blocks = blocks_for(held * 2 * (w / to->group), kThreads);
  if (blocks > 65535) blocks = 65535;
  launch(k_kvq_convert, (unsigned)blocks, kThreads, 0, s, *from, dt, *to, w, held);
  return cudaGetLastError();
}

} // extern "C"
