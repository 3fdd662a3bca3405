/* k_tq.cuh — the TurboQuant cache kind on the device (kv/tq_codec.h is the host's codec):
 * the row layout, the reader's decode of a lane's share of a cached row, and the inverse
 * rotation of an attention output row in shared memory. Shared by k_tq.cu (the encoder),
 * k_kvquant.cu (the append) and k_attention.cu (the reader).
 *
 * Every operation mirrors tq_codec.c in fp32 with IEEE-rounded intrinsics (__fadd_rn,
 * __fmul_rn, ...), so no compiler contraction can move a value: the device reads what the CPU
 * reads, bit for bit. */
#ifndef LM_BACKEND_CUDA_K_TQ_CUH
#define LM_BACKEND_CUDA_K_TQ_CUH

#include "backend/cuda/k_common.cuh"

namespace lmcu {

constexpr int kTqBlock = 32;    /* LM_TQ_BLOCK */
constexpr float kTqEps = 1e-8f; /* LM_TQ_EPS */
constexpr int kTqMaxDim = 512;  /* LM_TQ_MAX_DIM */

/* Bytes of one slot's planes (and of one token's stage row, the same order): key codes,
 * value codes, then three fp16 planes of w/32 values (key scales, key zeros, value scales). */
struct TqLayout {
  int64_t kc, vc, sb;
  __device__ TqLayout(int64_t w, int k_bits, int v_bits)
      : kc(w * k_bits / 8), vc(w * v_bits / 8), sb(w / kTqBlock * 2) {}
  __device__ int64_t total() const { return kc + vc + 3 * sb; }
};

/* The 8 codes of b bits starting at element e0 (a multiple of 8) of a packed row: b bytes,
 * element e0 + i at bits [i·b, i·b + b) (the host's little-endian bit stream). Byte loads:
 * a head's codes start at any byte (head dim × b / 8). */
__device__ __forceinline__ uint64_t tq_word(const uint8_t *row, int64_t e0, int b) {
  const uint8_t *p = row + e0 * b / 8;
  uint64_t w = 0;
  for (int i = 0; i < b; i++)
    w |= (uint64_t)__ldg(p + i) << (8 * i);
  return w;
}

/* A lane's share of the cached key and value rows of KV head g at `slot` (8 consecutive
 * elements per pass, inside one 32-group): keys (idx + zero) · scale, values in the rotated
 * domain, centroid[idx] · scale (lm_tq_key_decode, lm_tq_value_decode_rot). */
__device__ __forceinline__ void tq_load_row(const lm_cu_kvdesc &d, int64_t kvw, int64_t slot, int g,
                                            int hd, int lane, float *kd, float *vd) {
  const TqLayout L(kvw, d.bits, d.v_bits);
  const int64_t ng = kvw / kTqBlock, hoff = (int64_t)g * hd;
  const uint8_t *kc = (const uint8_t *)d.k + slot * L.kc + hoff * d.bits / 8;
  const uint8_t *vc = (const uint8_t *)d.v + slot * L.vc + hoff * d.v_bits / 8;
  const uint16_t *ks = (const uint16_t *)d.ks + slot * ng, *kz = (const uint16_t *)d.kb + slot * ng,
                 *vs = (const uint16_t *)d.vs + slot * ng;
  const unsigned km = (1u << d.bits) - 1u, vm = (1u << d.v_bits) - 1u;
  for (int c0 = 8 * lane; c0 < hd; c0 += 8 * 32) {
    const int64_t gi = (hoff + c0) / kTqBlock;
    const float sk = f16f(ks[gi]), zk = f16f(kz[gi]), sv = f16f(vs[gi]);
    const uint64_t kw = tq_word(kc, c0, d.bits), vw = tq_word(vc, c0, d.v_bits);
#pragma unroll
    for (int e = 0; e < 8; e++) {
      const unsigned qk = (unsigned)(kw >> (e * d.bits)) & km;
      const float fk = d.bits == 8 ? (float)(int8_t)qk : (float)qk;
      kd[c0 + e] = __fmul_rn(__fadd_rn(fk, zk), sk);
      vd[c0 + e] = __fmul_rn(__ldg(d.tq_cent + ((unsigned)(vw >> (e * d.v_bits)) & vm)), sv);
    }
  }
}

/* x[0, n) ← H_n x / √n in shared memory (lm_tq_fwht): the butterflies (a + b, a − b) for
 * h = 1, 2, 4, …, then one multiply by fp32(1/√n). A stage's pairs are the sequential loop's, so
 * every value is the same sum. Threads tid, tid + nt, … take the pairs of a stage; sync()
 * separates the stages (a warp's or the block's barrier) and ends the transform. */
template <typename Sync>
__device__ __forceinline__ void tq_fwht(float *x, int n, int tid, int nt, Sync sync) {
  for (int h = 1; h < n; h *= 2) {
    for (int p = tid; p < n / 2; p += nt) {
      const int i = (p / h) * 2 * h + p % h;
      const float a = x[i], b = x[i + h];
      x[i] = __fadd_rn(a, b);
      x[i + h] = __fsub_rn(a, b);
    }
    sync();
  }
  const float s = (float)(1.0 / sqrt((double)n));
  for (int i = tid; i < n; i += nt)
    x[i] = __fmul_rn(x[i], s);
  sync();
}

/* The inverse rotation (lm_tq_unrotate): the transform, then the signs. */
template <typename Sync>
__device__ __forceinline__ void tq_unrotate(float *x, int n, const int8_t *signs, int tid, int nt,
                                            Sync sync) {
  tq_fwht(x, n, tid, nt, sync);
  for (int i = tid; i < n; i += nt)
    if (signs[i] < 0) x[i] = -x[i];
  sync();
}

} // namespace lmcu

#endif
