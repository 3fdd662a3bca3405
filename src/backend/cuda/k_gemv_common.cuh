/* k_gemv_common.cuh — what the decode GEMV kernels (k_gemv.cu, k_gemv_tc.cu) share: where a
 * launch's group reads and writes (grouped MoE mode or a plain matrix), the output store with
 * its fused epilogue, and the row window of one launch over a many-row product. */
#ifndef LM_BACKEND_CUDA_K_GEMV_COMMON_CUH
#define LM_BACKEND_CUDA_K_GEMV_COMMON_CUH

#include "backend/cuda/k_common.cuh"

namespace lmcu {

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

/* s + Σ_k B[c][k] · t[k] over k < rank, in that order. For bf16 B with 16-byte rows the pieces
 * of up to 32 rank indices (B's row and t) are all loaded before the first multiply: a loop of
 * scalar loads waits for each in turn, a round trip per rank index at the product's tail. */
__device__ __forceinline__ float lora_dot(const void *b, int wdt, int rank, int64_t c,
                                          const float *t, float s) {
  const uint16_t *bb = (const uint16_t *)b + c * rank;
  if (wdt == LM_CU_BF16 && rank % 8 == 0 && ((uintptr_t)bb & 15) == 0 && ((uintptr_t)t & 15) == 0) {
    for (int k0 = 0; k0 < rank; k0 += 32) {
      const int n = min(rank - k0, 32) / 8;
      uint4 bv[4];
      float4 tv[8];
#pragma unroll
      for (int i = 0; i < 4; i++)
        if (i < n) {
          bv[i] = *reinterpret_cast<const uint4 *>(bb + k0 + 8 * i);
          tv[2 * i] = *reinterpret_cast<const float4 *>(t + k0 + 8 * i);
          tv[2 * i + 1] = *reinterpret_cast<const float4 *>(t + k0 + 8 * i + 4);
        }
#pragma unroll
      for (int i = 0; i < 4; i++)
        if (i < n) {
          const uint32_t w[4] = {bv[i].x, bv[i].y, bv[i].z, bv[i].w};
          const float tt[8] = {tv[2 * i].x,     tv[2 * i].y,     tv[2 * i].z,     tv[2 * i].w,
                               tv[2 * i + 1].x, tv[2 * i + 1].y, tv[2 * i + 1].z, tv[2 * i + 1].w};
#pragma unroll
          for (int q = 0; q < 4; q++) {
            s = fmaf(bf2f(w[q] & 0xffffu), tt[2 * q], s);
            s = fmaf(bf2f(w[q] >> 16), tt[2 * q + 1], s);
          }
        }
    }
    return s;
  }
  for (int k = 0; k < rank; k++)
    s = fmaf(ld(b, wdt, c * rank + k), t[k], s);
  return s;
}

/* The LoRA terms of output (r, c): Σ over row r's picks of B_j[c] · t_j, in f32. */
__device__ __forceinline__ float lora_term(const lm_cu_lora &l, int64_t r, int64_t c) {
  const int64_t row = l.row0 + r;
  const lm_cu_lora_pick *pk = l.picks + row * LM_CU_LORA_PICKS;
  const float *t = l.t + row * l.t_ld;
  float s = 0.0f;
  for (int j = 0; j < LM_CU_LORA_PICKS; j++) {
    const int slot = pk[j].slot;
    if (slot < 0) break;
    const lm_cu_lora_ent e = l.tab[slot];
    s = lora_dot(e.b, l.wdt, e.rank, c, t + j * l.rank_stride, s);
  }
  return s;
}

/* Writes one output value; an epilogue sees the product rounded to y's dtype and rounds like
 * k_geglu (gelu rounded, then the product), so fused and separate ops agree bit for bit. */
__device__ __forceinline__ void store_y(const lm_cu_mm_p &p, int64_t r, int64_t c, float v) {
  if (p.lora.tab) v += lora_term(p.lora, r, c);
  if (p.accumulate) v += ldt(p.y, r, c);
  if (p.epi) {
    v = rnd(p.y.dt, v);
    const float o = ldt(p.other, r, c);
    v = p.epi == 1 ? rnd(p.y.dt, gelu_tanh(o)) * v
                   : rnd(p.y.dt, gelu_tanh(v)) * o; /* as k_geglu rounds */
  }
  stt(p.y, r, c, v);
}

/* The launch parameters for activation rows [r0, r0 + m) of a plain (ungrouped) product. */
inline lm_cu_mm_p rows_window(const lm_cu_mm_p &p, int64_t r0, int64_t m) {
  lm_cu_mm_p q = p;
  const size_t xsz = p.x.dt == LM_CU_F32 ? 4 : 2, ysz = p.y.dt == LM_CU_F32 ? 4 : 2;
  q.x.p = (char *)p.x.p + (size_t)(r0 * p.x.ld) * xsz;
  q.y.p = (char *)p.y.p + (size_t)(r0 * p.y.ld) * ysz;
  if (p.epi)
    q.other.p = (char *)p.other.p + (size_t)(r0 * p.other.ld) * (p.other.dt == LM_CU_F32 ? 4 : 2);
  q.x.rows = q.y.rows = m;
  q.lora.row0 += r0, q.lora2.row0 += r0;
  return q;
}

} // namespace lmcu

#endif
