/* k_gemv_tc.cu — decode products y[m] = x[m] · Wᵀ (m ≤ 8, or grouped MoE rows) for 4-bit
 * affine weights and bf16 activations, on the tensor cores (mma.sync m16n8k16, bf16 in, f32
 * accumulation).
 *
 * Why: the CUDA-core kernel (k_gemv.cu) spends ~3.5 instructions per code (extract, convert,
 * FMA, and x's conversion and group sum); here it is ~1, with 64 registers, and the first
 * weight loads are issued before the wait on the previous kernel (pdl_wait), so they overlap
 * it. Measured on the H200 (docs/perf/NOTES.md, v4): in isolation both kernels run a 15 MB
 * product at ~1.2 TB/s (the loads, not the instructions, set that time), but in a replayed
 * decode step this one is 6–22% faster. How:
 *  - A 4-bit code OR-ed under the exponent of 128 is the bf16 value 128 + q exactly, so
 *    (word >> 4j) & 0x000F000F | 0x43004300 (a shift and one LOP3) holds codes j and j+4 of a
 *    word as a bf16x2.
 *  - A warp takes 16 rows. Per group of G columns, lane (g, t) (g = lane/4, t = lane%4) loads
 *    its G/4 codes [t·G/4, (t+1)·G/4) of rows g and g+8: G/32 words each, which are the A
 *    fragments of the group's G/16 mmas once the k positions {2t, 2t+1, 2t+8, 2t+9} of mma i
 *    stand for the lane's code pairs 2i and 2i+1. Which column a k position stands for does
 *    not change a sum, as long as x's B fragment (column n = g: activation row g) uses the same
 *    map: the x pairs (c, c+4) come from one 16-byte load and two byte permutes.
 *  - Per group, Σ(128+q)·x and Σx (an mma with an all-ones A) give
 *    Σ(s·q + b)·x = s·Σ(128+q)·x + (b − 128·s)·Σx. The products are exact, the sums f32.
 *  - The W warps of a block split the groups; their partial sums meet in shared memory in a
 *    fixed order, so a result does not depend on timing. */
#include "backend/cuda/k_gemv_common.cuh"

using namespace lmcu;

namespace {

constexpr uint32_t kOnes = 0x3F803F80u; /* bf16x2 (1, 1) */

/* d += a · b for one m16n8k16 tile: a = 4 bf16x2 registers (rows g/g+8, k 2t.., 2t+8..),
 * b = 2 bf16x2 registers (k 2t.., 2t+8.., column g). */
__device__ __forceinline__ void mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* bf16x2 (128 + code j, 128 + code j+4) of a word of eight 4-bit codes. */
__device__ __forceinline__ uint32_t code_pair(uint32_t w, int j) {
  return ((w >> (4 * j)) & 0x000F000Fu) | 0x43004300u;
}

/* bf16x2 (x[j], x[j+4]) of eight consecutive bf16 values. */
__device__ __forceinline__ uint32_t x_pair(const uint4 &u, int j) {
  const uint32_t lo = j < 2 ? u.x : u.y, hi = j < 2 ? u.z : u.w;
  return __byte_perm(lo, hi, (j & 1) ? 0x7632 : 0x5410);
}

template <int WPR> __device__ __forceinline__ void load_words(const char *p, uint32_t (&w)[WPR]) {
  if constexpr (WPR == 4) {
    const uint4 v = __ldg(reinterpret_cast<const uint4 *>(p));
    w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
  } else if constexpr (WPR == 2) {
    const uint2 v = __ldg(reinterpret_cast<const uint2 *>(p));
    w[0] = v.x, w[1] = v.y;
  } else {
    w[0] = __ldg(reinterpret_cast<const uint32_t *>(p));
  }
}

/* Adds one group to tot: s·Σ(128+q)·x + (b − 128·s)·Σx for rows g (c0, sb0) and g + 8
 * (c1, sb1); xg: the lane's x values of the group (read only when xon). */
template <int G>
__device__ __forceinline__ void group_mma(const uint32_t *c0, const uint32_t *c1, uint32_t sb0,
                                          uint32_t sb1, const uint16_t *xg, bool xon,
                                          float (&tot)[4]) {
  constexpr int WPR = G / 32, NMMA = G / 16;
  uint32_t xb[NMMA][2];
  float sx[4] = {}, d[4] = {};
#pragma unroll
  for (int w = 0; w < WPR; w++) {
    const uint4 xv = xon ? *reinterpret_cast<const uint4 *>(xg + 8 * w) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int j = 0; j < 4; j++)
      xb[2 * w + j / 2][j % 2] = x_pair(xv, j);
  }
#pragma unroll
  for (int mi = 0; mi < NMMA; mi++) {
    const int w = mi / 2, j = 2 * (mi % 2);
    mma16816(sx, kOnes, kOnes, kOnes, kOnes, xb[mi][0], xb[mi][1]);
    mma16816(d, code_pair(c0[w], j), code_pair(c1[w], j), code_pair(c0[w], j + 1),
             code_pair(c1[w], j + 1), xb[mi][0], xb[mi][1]);
  }
#pragma unroll
  for (int c = 0; c < 4; c++) {
    const uint32_t v = c < 2 ? sb0 : sb1;
    const float s = bf2f(v & 0xffffu), b = bf2f(v >> 16);
    tot[c] = fmaf(s, d[c], fmaf(fmaf(-128.0f, s, b), sx[c], tot[c]));
  }
}

/* The W warps' partial sums of a 16-row tile meet in shared memory in a fixed order; entry e
 * of a warp: lane l = e/4, value c = e%4 (row l/4, +8 for c ≥ 2; column 2·(l%4) + c%2). With
 * P = 2 (a gate/up pair) the second product's sums meet too and the GeGLU is applied: both
 * products rounded to y's dtype, the gelu rounded, then the product (as epilogue 1 rounds). */
template <int W, int P>
__device__ __forceinline__ void reduce_store(const lm_cu_mm_p &p, const Route &rt, int64_t row0,
                                             int m, const float (&tot)[P][4],
                                             float4 (&red)[P][W][32]) {
#pragma unroll
  for (int j = 0; j < P; j++)
    red[j][threadIdx.x / 32][threadIdx.x % 32] =
        make_float4(tot[j][0], tot[j][1], tot[j][2], tot[j][3]);
  __syncthreads();
  if (threadIdx.x >= 128) return;
  const int e = threadIdx.x, l = e / 4, c = e % 4, n = 2 * (l % 4) + (c & 1);
  const int64_t row = row0 + l / 4 + (c >= 2 ? 8 : 0);
  if (n >= m || row >= p.w.rows) return;
  float v[P] = {};
#pragma unroll
  for (int j = 0; j < P; j++)
#pragma unroll
    for (int w = 0; w < W; w++)
      v[j] += reinterpret_cast<const float *>(&red[j][w][l])[c];
  if constexpr (P == 2) {
    if (p.lora.tab) v[0] += lora_term(p.lora, rt.yr + n, row);
    if (p.lora2.tab) v[1] += lora_term(p.lora2, rt.yr + n, row);
    const float g = rnd(p.y.dt, v[0]), u = rnd(p.y.dt, v[1]);
    stt(p.y, rt.yr + n, row, rt.ok ? rnd(p.y.dt, gelu_tanh(g)) * u : 0.0f);
  } else {
    store_y(p, rt.yr + n, row, rt.ok ? v[0] : 0.0f);
  }
}

/* A lane's loads of U groups from group k0 on (clamped to the warp's last group ke - 1): rows
 * g (at w, s) and g + 8 (dw bytes and ds words further). */
template <int G, int U>
__device__ __forceinline__ void load_groups(const char *w, const uint32_t *s, int dw, int ds,
                                            int k0, int ke, uint32_t (&cw)[U][2][G / 32],
                                            uint32_t (&sb)[U][2]) {
#pragma unroll
  for (int u = 0; u < U; u++) {
    const int k = min(k0 + u, ke - 1);
    load_words<G / 32>(w + k * (G / 2), cw[u][0]);
    load_words<G / 32>(w + dw + k * (G / 2), cw[u][1]);
    sb[u][0] = __ldg(s + k);
    sb[u][1] = __ldg(s + ds + k);
  }
}

/* One block: 16 rows; its W warps split the groups. x is staged in shared memory in chunks of
 * kc columns (rows padded by 8 values so that the activation rows fall on different banks);
 * the first weight loads are issued before the staging, so they overlap it. U: groups whose
 * loads a lane issues before it uses any (48 bytes in flight per lane); 1024 threads per SM.
 * m: activation rows (1..8; 1 in grouped mode). P = 2: each warp also takes the same groups of
 * a second matrix (w2: the up projection of a gate/up pair), with the same x fragments; each
 * product still sums its groups in the order it would alone. */
template <int G, int U, int W, int P>
__global__ void __launch_bounds__(32 * W, 32 / W) k_gemv_tc(const lm_cu_mm_p p, int m, int kc) {
  constexpr int WPR = G / 32; /* words of a row's group a lane holds */
  extern __shared__ uint4 xs4[];
  __shared__ float4 red[P][W][32];
  const uint16_t *xs = reinterpret_cast<const uint16_t *>(xs4);
  if (p.ids) pdl_wait(); /* the expert ids come from the previous kernel */
  const Route rt = route(p);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t rows = p.w.rows, row0 = (int64_t)blockIdx.x * 16;
  const int cols = (int)p.w.cols, ng = cols / G, xld = kc + 8;
  const int64_t r0 = row0 + g < rows ? row0 + g : rows - 1,
                r1 = row0 + g + 8 < rows ? row0 + g + 8 : rows - 1;
  const int64_t woff = (rt.e * rows + r0) * p.w.row_bytes + t * (G / 8),
                soff = (rt.e * rows + r0) * ng;
  const char *wp[P];
  const uint32_t *sp[P];
#pragma unroll
  for (int j = 0; j < P; j++) {
    wp[j] = (const char *)(j ? p.w2.data : p.w.data) + woff;
    sp[j] = (const uint32_t *)(j ? p.w2.sb : p.w.sb) + soff;
  }
  const int dw = (int)((r1 - r0) * p.w.row_bytes), ds = (int)(r1 - r0) * ng;
  const bool xon = g < m;
  float tot[P][4] = {};
  for (int c0 = 0; c0 < cols; c0 += kc) {
    const int gc = c0 / G, n = min(kc, cols - c0) / G, per = (n + W - 1) / W;
    const int gb = gc + warp * per, ge = min(gb + per, gc + n);
    uint32_t cw[P][U][2][WPR], sb[P][U][2];
#pragma unroll
    for (int j = 0; j < P; j++)
      if (gb < ge) load_groups<G, U>(wp[j], sp[j], dw, ds, gb, ge, cw[j], sb[j]);
    pdl_wait();      /* the weight loads above overlap the previous kernel; x is its output */
    __syncthreads(); /* the previous chunk's readers are done */
    const int v8 = (n * G) / 8; /* 16-byte pieces of an activation row in this chunk */
    for (int i = threadIdx.x; i < m * v8; i += 32 * W) {
      const int r = i / v8, c = i % v8;
      xs4[(r * xld) / 8 + c] = __ldg(
          reinterpret_cast<const uint4 *>((const uint16_t *)p.x.p + (rt.xr + r) * p.x.ld + c0) + c);
    }
    __syncthreads();
    for (int k0 = gb; k0 < ge;) {
#pragma unroll
      for (int u = 0; u < U; u++) {
        if (k0 + u >= ge) break;
        const uint16_t *xg = xs + (xon ? g : 0) * xld + (k0 + u - gc) * G + t * (G / 4);
#pragma unroll
        for (int j = 0; j < P; j++)
          group_mma<G>(cw[j][u][0], cw[j][u][1], sb[j][u][0], sb[j][u][1], xg, xon, tot[j]);
      }
      k0 += U;
#pragma unroll
      for (int j = 0; j < P; j++)
        if (k0 < ge) load_groups<G, U>(wp[j], sp[j], dw, ds, k0, ge, cw[j], sb[j]);
    }
  }
  reduce_store<W, P>(p, rt, row0, m, tot, red);
}

typedef void (*tc_fn)(const lm_cu_mm_p, int, int);

/* U: 48 bytes in flight per lane (U · 2 rows · G/8 bytes; 64 for G = 128) within 64 registers;
 * a pair holds two matrices' loads, so it takes about half the groups of each. */
template <int W, int P> tc_fn pick_g(int group) {
  if constexpr (P == 2)
    return group == 32   ? &k_gemv_tc<32, 3, W, 2>
           : group == 64 ? &k_gemv_tc<64, 2, W, 2>
                         : &k_gemv_tc<128, 1, W, 2>;
  else
    return group == 32   ? &k_gemv_tc<32, 6, W, 1>
           : group == 64 ? &k_gemv_tc<64, 3, W, 1>
                         : &k_gemv_tc<128, 2, W, 1>;
}

template <int P> tc_fn pick_wg(int W, int group) {
  return W == 16 ? pick_g<16, P>(group) : W == 8 ? pick_g<8, P>(group) : pick_g<4, P>(group);
}

bool tc_layout(const lm_cu_mm_p &p) {
  const int G = p.w.group;
  if (p.w.bits != 4 || (G != 32 && G != 64 && G != 128) || p.w.sb_kind != LM_CU_SB_BF16 ||
      p.x.dt != LM_CU_BF16)
    return false;
  /* a pair: one launch instead of two (and a GeGLU), which E4B, 12B and 26B-A4B decode gain
   * 4-5% from; on 31B's 21504x5376 products the halved loads in flight per matrix cost more
   * than the launch saves (docs/perf/NOTES.md, v5), so products that large run as two */
  if (p.epi == 3 &&
      (p.accumulate || ((uintptr_t)p.w2.data & 15u) != 0 || p.w.rows * p.w.cols > (1ll << 26)))
    return false;
  /* a lane loads G/8 bytes of a row per group; x is staged in 16-byte pieces */
  return p.w.cols % G == 0 && p.w.row_bytes % 16 == 0 && ((uintptr_t)p.w.data & 15u) == 0 &&
         ((uintptr_t)p.x.p & 15u) == 0 && (p.x.ld * 2) % 16 == 0;
}

/* The geometry of one launch of the register kernel for m activation rows (or gy groups of
 * one row). A block is one 16-row tile; its warp count W is the largest of 16, 8, 4 with which
 * every tile's block is resident at once (32 warps per SM at 64 registers), so a launch is one
 * wave with the most loads in flight; matrices too large for that take W = 4. x's staging (at
 * most 24 KB for W = 4, so that 8 blocks fit an SM, else 40 KB) sets the chunk kc: whole
 * groups for every warp. False when the shape has no such launch. */
struct TcGeo {
  int64_t tiles, kc;
  int w;
};

bool tc_geo(const lm_cu_mm_p &p, int m, unsigned gy, TcGeo &g) {
  const int64_t n_sms = p.grid_cap / 4 > 0 ? p.grid_cap / 4 : 1;
  g.tiles = (p.w.rows + 15) / 16;
  const int64_t blocks = g.tiles * gy, slots = 32 * n_sms;
  g.w = blocks * 16 <= slots ? 16 : blocks * 8 <= slots ? 8 : 4;
  const int64_t G = p.w.group, xs = g.w == 4 ? 24 * 1024 : 40 * 1024;
  const int64_t fit = (xs / (2 * m) - 8) / (G * g.w) * (G * g.w);
  g.kc = p.w.cols < fit ? p.w.cols : fit;
  return g.kc >= G && g.tiles <= 0x7fffffff;
}

/* One launch (tc_geo must have said yes). */
cudaError_t launch_tc(lm_cu_stream s, const lm_cu_mm_p &p, int m, unsigned gy) {
  TcGeo g;
  if (!tc_geo(p, m, gy, g)) return cudaErrorInvalidValue;
  const size_t smem = (size_t)m * (size_t)(g.kc + 8) * 2;
  const int G = p.w.group;
  const tc_fn fn = p.epi == 3 ? pick_wg<2>(g.w, G) : pick_wg<1>(g.w, G);
  launch(fn, dim3((unsigned)g.tiles, gy), 32 * g.w, smem, s, p, m, (int)g.kc);
  return cudaGetLastError();
}

} // namespace

/* A pair with W = 16 holds 16 KB of partial sums next to up to 40 KB of x: above the 48 KB a
 * launch gets without asking. (The pair stages x in the same chunks as a single product, so
 * the two agree bit for bit.) */
extern "C" cudaError_t lm_cu_gemv_tc_init(int max_smem_optin) {
  cudaError_t e = cudaSuccess;
  for (int G : {32, 64, 128}) {
    const tc_fn fn = pick_wg<2>(16, G);
    cudaFuncAttributes fa;
    if (e == cudaSuccess) e = cudaFuncGetAttributes(&fa, fn);
    const int want = 40 * 1024 < max_smem_optin - (int)fa.sharedSizeBytes
                         ? 40 * 1024
                         : max_smem_optin - (int)fa.sharedSizeBytes;
    if (e == cudaSuccess)
      e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, want);
  }
  return e;
}

extern "C" int lm_cu_gemv_tc_takes(const lm_cu_mm_p *pp) {
  TcGeo g;
  if (!tc_layout(*pp) || pp->w.rows <= 0) return 0;
  if (pp->ids) return pp->y.rows <= 65535 && tc_geo(*pp, 1, (unsigned)pp->y.rows, g);
  for (int64_t done = 0; done < pp->x.rows; done += 8)
    if (!tc_geo(*pp, (int)(pp->x.rows - done < 8 ? pp->x.rows - done : 8), 1, g)) return 0;
  return 1;
}

extern "C" cudaError_t lm_cu_gemv_tc(lm_cu_stream s, const lm_cu_mm_p *pp) {
  if (!lm_cu_gemv_tc_takes(pp)) return cudaErrorInvalidValue;
  if (pp->ids) return launch_tc(s, *pp, 1, (unsigned)pp->y.rows);
  for (int64_t done = 0; done < pp->x.rows; done += 8) {
    const int m = (int)(pp->x.rows - done < 8 ? pp->x.rows - done : 8);
    cudaError_t e = launch_tc(s, rows_window(*pp, done, m), m, 1);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}
