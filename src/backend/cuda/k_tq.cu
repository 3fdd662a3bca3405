/* k_tq.cu — the TurboQuant encoder on the device (kv_stage for kv:turboquant caches): a warp
 * per (token, KV head, K or V) runs kv/tq_codec.c's encoder on that head's row in shared
 * memory, with the same fp32 operations (k_tq.cuh): element-wise work a lane per element, the
 * rotation's butterflies a lane per pair of a stage, and what the host sums left to right (a
 * group's squares) one lane per group in the same order; so the stage bytes equal the host's
 * bit for bit. It then writes back what a reader of the cache sees (keys dequantized, values
 * rotated). */
#include <math.h>

#include "backend/cuda/k_tq.cuh"

using namespace lmcu;

namespace {

constexpr int kWarps = 4, kThreads = 32 * kWarps;

__device__ __forceinline__ void put_u16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)(v & 0xffu);
  p[1] = (uint8_t)(v >> 8);
}

/* lm_f32_to_f16: round to nearest even, overflow to ±Inf, NaN kept quiet (payload 0x200). */
__device__ uint16_t f2h(float f) {
  const uint32_t u = __float_as_uint(f), sign = (u >> 16) & 0x8000u, man = u & 0x7fffffu;
  const int32_t exp = (int32_t)((u >> 23) & 0xff) - 127 + 15;
  if (((u >> 23) & 0xff) == 0xff) return (uint16_t)(sign | 0x7c00u | (man ? 0x200u : 0));
  if (exp >= 31) return (uint16_t)(sign | 0x7c00u);
  if (exp <= 0) {
    if (exp < -10) return (uint16_t)sign;
    const uint32_t m = man | 0x800000u, shift = (uint32_t)(14 - exp);
    uint32_t half = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) half++;
    return (uint16_t)(sign | half);
  }
  uint32_t half = sign | ((uint32_t)exp << 10) | (man >> 13);
  const uint32_t rem = man & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1))) half++;
  return (uint16_t)half;
}

/* clamp_code: a NaN becomes lo. */
__device__ __forceinline__ int clamp_code(float q, int lo, int hi) {
  if (q > (float)hi) return hi;
  if (!(q >= (float)lo)) return lo;
  return (int)q;
}

/* Shared scratch of one warp: the head's row, its codes as bytes, and per 32-group the fp32
 * scale (and zero) the codes were computed with and the fp16-rounded ones a reader sees. */
struct Row {
  float x[kTqMaxDim];
  uint8_t idx[kTqMaxDim];
  float sc[kTqMaxDim / kTqBlock], zr[kTqMaxDim / kTqBlock];
  float sd[kTqMaxDim / kTqBlock], zd[kTqMaxDim / kTqBlock];
};

__device__ __forceinline__ void wsync() { __syncwarp(); }

/* The row's codes (bytes, b bits each) into the little-endian stream of hd·b/8 bytes: lanes
 * build whole bytes (lm_tq_pack; 8-bit codes are copied). */
__device__ void pack(const Row &r, int hd, int b, uint8_t *out, int lane) {
  for (int j = lane; j < hd * b / 8; j += 32) {
    if (b == 8) {
      out[j] = r.idx[j];
      continue;
    }
    unsigned byte = 0;
    for (int bit = 0; bit < 8; bit++) {
      const int p = 8 * j + bit;
      byte |= ((unsigned)(r.idx[p / b] >> (p % b)) & 1u) << bit;
    }
    out[j] = (uint8_t)byte;
  }
}

/* Keys of one head (key_group + lm_tq_key_encode): a lane per 32-group finds its range and its
 * scale and zero (fp16 into the stage planes), then a lane per element its code; the row is
 * replaced by its decode (idx + zero16) · scale16. */
__device__ void key_encode(Row &r, const lm_cu_t &x, int64_t t, int64_t off, int hd, int bits,
                           uint8_t *codes, uint8_t *scales, uint8_t *zeros, int lane) {
  const bool sgn = bits == 8;
  const int m = sgn ? 127 : (1 << bits) - 1;
  for (int i = lane; i < hd; i += 32)
    r.x[i] = ldt(x, t, off + i);
  wsync();
  for (int g = lane; g < hd / kTqBlock; g += 32) {
    const float *xg = r.x + g * kTqBlock;
    float lo = xg[0], hi = xg[0];
    for (int i = 1; i < kTqBlock; i++) {
      lo = xg[i] < lo ? xg[i] : lo;
      hi = xg[i] > hi ? xg[i] : hi;
    }
    float scale, zero;
    if (sgn) {
      scale = __fdiv_rn(__fsub_rn(hi, lo), 2.0f * (float)m);
      zero = rintf(__fdiv_rn(__fadd_rn(hi, lo), __fmul_rn(2.0f, __fadd_rn(scale, kTqEps))));
    } else {
      scale = __fdiv_rn(__fsub_rn(hi, lo), (float)m);
      zero = rintf(__fdiv_rn(lo, __fadd_rn(scale, kTqEps)));
    }
    const uint16_t s16 = f2h(scale), z16 = f2h(zero);
    put_u16(scales + 2 * g, s16);
    put_u16(zeros + 2 * g, z16);
    r.sc[g] = scale, r.zr[g] = zero, r.sd[g] = f16f(s16), r.zd[g] = f16f(z16);
  }
  wsync();
  for (int i = lane; i < hd; i += 32) {
    const int g = i / kTqBlock;
    const float v = __fsub_rn(__fdiv_rn(r.x[i], __fadd_rn(r.sc[g], kTqEps)), r.zr[g]);
    const int q = clamp_code(rintf(v), sgn ? -m : 0, m);
    r.idx[i] = (uint8_t)(q & 0xff);
    stt(x, t, off + i, __fmul_rn(__fadd_rn((float)q, r.zd[g]), r.sd[g]));
  }
  wsync();
  pack(r, hd, bits, codes, lane);
}

/* Values of one head (lm_tq_value_encode): rotated (signs, then the normalized Walsh–Hadamard
 * transform), a lane per 32-group sums its squares left to right for the RMS scale, a lane per
 * element finds its Lloyd-Max index (a strict `>`); the row is replaced by centroid[idx] ·
 * scale16 (still rotated). */
__device__ void value_encode(Row &r, const lm_cu_kvdesc &d, const lm_cu_t &x, int64_t t,
                             int64_t off, int hd, uint8_t *codes, uint8_t *scales, int lane) {
  for (int i = lane; i < hd; i += 32) {
    const float v = ldt(x, t, off + i);
    r.x[i] = d.tq_signs[i] < 0 ? -v : v;
  }
  wsync();
  tq_fwht(r.x, hd, lane, 32, wsync);
  for (int g = lane; g < hd / kTqBlock; g += 32) {
    const float *yg = r.x + g * kTqBlock;
    float acc = 0.0f;
    for (int i = 0; i < kTqBlock; i++)
      acc = __fadd_rn(acc, __fmul_rn(yg[i], yg[i]));
    const float scale = __fsqrt_rn(__fdiv_rn(acc, (float)kTqBlock));
    const uint16_t s16 = f2h(scale);
    put_u16(scales + 2 * g, s16);
    r.sc[g] = scale, r.sd[g] = f16f(s16);
  }
  wsync();
  const int nb = (1 << d.v_bits) - 1;
  for (int i = lane; i < hd; i += 32) {
    const int g = i / kTqBlock;
    const float yn = __fdiv_rn(r.x[i], __fadd_rn(r.sc[g], kTqEps));
    int c = 0;
    for (int j = 0; j < nb; j++)
      c += yn > d.tq_bnd[j];
    r.idx[i] = (uint8_t)c;
    stt(x, t, off + i, __fmul_rn(d.tq_cent[c], r.sd[g]));
  }
  wsync();
  pack(r, hd, d.v_bits, codes, lane);
}

/* A warp per (token, KV head, K or V). */
__global__ void __launch_bounds__(kThreads)
    k_tq_stage(lm_cu_t kn, lm_cu_t vn, lm_cu_t stage, const lm_cu_kvdesc *kv, int n_caches,
               int cache, const int32_t *seq) {
  pdl_wait();
  __shared__ Row rows[kWarps];
  const int64_t t = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, i = blockIdx.x * kWarps + warp;
  const lm_cu_kvdesc d = kv[(int64_t)seq[t] * n_caches + cache];
  if (!d.tq) return; /* another kind's row (k_kvquant.cu or a plain append) */
  const int64_t w = kn.cols;
  const int hd = d.head_dim, nh = (int)(w / hd);
  if (i >= 2 * nh) return; /* uniform in the warp */
  const int which = i / nh, g = i % nh;
  const TqLayout L(w, d.bits, d.v_bits);
  uint8_t *row = (uint8_t *)stage.p + t * stage.ld;
  uint8_t *planes = row + L.kc + L.vc;
  const int64_t off = (int64_t)g * hd, gp = 2 * (off / kTqBlock);
  if (!which)
    key_encode(rows[warp], kn, t, off, hd, d.bits, row + off * d.bits / 8, planes + gp,
               planes + L.sb + gp, lane);
  else
    value_encode(rows[warp], d, vn, t, off, hd, row + L.kc + off * d.v_bits / 8,
                 planes + 2 * L.sb + gp, lane);
}

} // namespace

extern "C" {

cudaError_t lm_cu_tq_stage(lm_cu_stream s, lm_cu_t k_new, lm_cu_t v_new, lm_cu_t stage,
                           const lm_cu_kvdesc *kv, int n_caches, int cache, const int32_t *seq) {
  if (k_new.rows <= 0) return cudaSuccess;
  /* the most rows a token can have: the smallest head dim the codec takes */
  const int64_t most = 2 * (k_new.cols / 64);
  dim3 grid((unsigned)((most + kWarps - 1) / kWarps), (unsigned)k_new.rows);
  launch(k_tq_stage, grid, kThreads, 0, s, k_new, v_new, stage, kv, n_caches, cache, seq);
  return cudaGetLastError();
}

} // extern "C"
