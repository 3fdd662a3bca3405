/* cpu_matmul_impl.h — what the matmul driver (cpu_matmul.c) shares with its kernel
 * families (cpu_matmul_scalar.c, _avx2.c, _avx512.c): the per-call job, the quantized
 * activations of the FAST path, the packed weight tile of the int8 GEMM, and the table of
 * kernels each family provides. Not a public header. */
#ifndef LM_BACKEND_CPU_MATMUL_IMPL_H
#define LM_BACKEND_CPU_MATMUL_IMPL_H

#include <stdint.h>

#include "backend/cpu/cpu_matmul.h"
#include "tensor/weight.h"

/* The gemv kernels handle at most this many tokens per call (the driver switches to the
 * GEMM paths, or splits, above it). */
#define LM_MM_GEMV_MAX_M 16

/* FAST path: activations are quantized per block of this many columns. Every quantized
 * weight's cols is a multiple of its group (>= 32), hence of this block. */
#define LM_QA_BLOCK 32

/* Quantized activations for the FAST path (all arrays row-major, one row per token).
 * Layout of q per row: natural column order when perm == 0; with perm == P, each chunk of
 * P columns holds its even columns first, then its odd ones (a final chunk of 64 or 32 likewise):
 * that is the order in which a vector of packed 4-bit codes yields its low and high nibbles. */
typedef struct lm_qact {
  int8_t *q; /* [m][ldq] */
  int64_t ldq;
  float *d;    /* [m][nb] block scales: x ≈ d·q */
  float *dexp; /* [m][nb*4] each d repeated 4 times (perm layouts only, else NULL) */
  float *sx;   /* [m][ng] Σ x over each weight group, exact f32 */
  float *c8; /* [m][ng] 128·Σ_{b in g} d_b·Σ_{k in b} q_k: the offset term of signed 8-bit codes */
  int perm;
} lm_qact;

/* One call, resolved: the weight pointer of the expert, shapes, and output. */
typedef struct lm_mm_job {
  const lm_weight *w;
  int64_t e;
  const float *x;
  int64_t ldx, m;
  float *y;
  int64_t ldy;
  int acc;           /* accumulate into y */
  int64_t k, ng, nb; /* cols, groups per row, LM_QA_BLOCK blocks per row */
  const float *gsum; /* [m][ng] Σ x per group (F32 path, quantized weights), or NULL */
  const lm_qact *qa; /* FAST path */
} lm_mm_job;

/* A tile of NR consecutive rows repacked for an int8 GEMM: codes as bytes, interleaved by
 * 4 columns (for column quad j: NR rows × 4 codes), and the rows' scales/biases in f32. */
typedef struct lm_qtile {
  uint8_t *codes; /* [k/4][nr][4]; 8-bit weights store q ^ 0x80 when `signed8` */
  float *s, *b;   /* [ng][nr] */
  int nr;         /* rows per tile (the kernel's vector width in rows) */
  int signed8;
} lm_qtile;

/* The kernels of one family. Row ranges are [r0, r1) relative to the weight's row 0. */
typedef struct lm_cpu_kernels {
  lm_cpu_isa isa;
  const char *name;
  int q4_perm; /* activation layout the FAST q4 kernel reads (0: natural) */
  /* small-m product, F32 math: y[t][r] (=|+=) Σ_k w[r][k]·x[t][k] for all t < m */
  void (*gemv_f32)(const lm_mm_job *j, int64_t r0, int64_t r1);
  /* small-m product, FAST (quantized weights), activations j->qa */
  void (*gemv_fast)(const lm_mm_job *j, int64_t r0, int64_t r1);
  /* rows [r0, r0+n) of expert e as f32 into out[n][ldo] (exactly lm_weight_dequant_row) */
  void (*dequant_rows)(const lm_weight *w, int64_t e, int64_t r0, int64_t n, float *out,
                       int64_t ldo);
  /* quantizes token rows [t0, t1) into qa, exactly as lm_mm_quantize_rows */
  void (*quantize)(const lm_mm_job *j, lm_qact *qa, int64_t t0, int64_t t1);
  /* codes [c0, c0+n) of a row as bytes, natural order (c0, n multiples of 32) */
  void (*unpack_codes)(const lm_weight *w, const uint8_t *row, int64_t c0, int64_t n, uint8_t *out);
  /* GEMM tile layout from byte rows: dst[q][r][0..3] = rows[r][4q..4q+3] for r < nr, q < nq
   * (rows has stride ldr; nq a multiple of 8); NULL: the portable loop */
  void (*interleave)(const uint8_t *rows, int64_t ldr, int nr, int64_t nq, uint8_t *dst);
  /* int8 GEMM over a packed tile: tokens [t0, t1) (t1 - t0 a multiple of gemm_mr; the
   * activations are padded), rows tile_r0 + [0, nvalid). NULL: FAST prefill uses gemv_fast. */
  int gemm_nr, gemm_mr;
  int gemm_signed8; /* the GEMM wants 8-bit codes stored as q ^ 0x80 */
  void (*gemm_fast)(const lm_mm_job *j, const lm_qtile *t, int64_t tile_r0, int nvalid, int64_t t0,
                    int64_t t1);
} lm_cpu_kernels;

extern const lm_cpu_kernels lm_cpu_kernels_scalar;
extern const lm_cpu_kernels lm_cpu_kernels_avx2;
extern const lm_cpu_kernels lm_cpu_kernels_avx512;

/* ---- shared helpers (cpu_matmul_common.c) ----------------------------------------------- */

/* Codes [k0, k0+n) of a packed row as bytes; k0 and n multiples of 8 (true for every group). */
void lm_mm_unpack_codes(const uint8_t *row, int bits, int64_t k0, int64_t n, uint8_t *out);
/* n elements of a f32/f16/bf16 array starting at element i0, as f32. */
void lm_mm_load_f32s(const void *p, lm_dtype t, int64_t i0, int64_t n, float *out);
/* Quantizes token rows [t0, t1) of x into qa (layout qa->perm), see lm_qact. */
void lm_mm_quantize_rows(const lm_mm_job *j, lm_qact *qa, int64_t t0, int64_t t1);
/* Columns per packing step of lm_mm_pack_tile; its scratch holds nr × this many bytes. */
#define LM_PACK_CHUNK 256
/* Packs rows [r0, r0+nvalid) of the job's weight into tile t (rows past nvalid are zero);
 * rowbuf: t->nr · LM_PACK_CHUNK bytes. */
void lm_mm_pack_tile(const lm_cpu_kernels *kn, const lm_mm_job *j, int64_t r0, int nvalid,
                     lm_qtile *t, uint8_t *rowbuf);
/* Stores or accumulates v into y (n floats). */
static inline void lm_mm_put(float *y, float v, int acc) { *y = acc ? *y + v : v; }

/* ---- pieces of the AVX2 family that the AVX-512 family reuses (cpu_matmul_avx2.c) --------- */

/* Per-row segment kernels (n columns of one row, n <= 8192, whole groups) that the shared
 * row drivers call; see cpu_matmul_avx2.c for their contracts. The F32 driver uses the
 * f32_ fields only. */
typedef struct lm_seg_kernels {
  float (*f32_quant)(const lm_weight *w, const uint8_t *q, const float *x, const float *sf,
                     int64_t n);
  float (*f32_dense)(const lm_weight *w, const uint8_t *row, const float *x, int64_t k);
  float (*fast_u8)(const uint8_t *q, const int8_t *xq, const float *d, const float *sf, int group,
                   int64_t n, int signed8);
  int signed8; /* fast_u8 reads 8-bit codes as q ^ 0x80 and needs the c8 term */
} lm_seg_kernels;

void lm_mm_avx2_gemv_f32_with(const lm_seg_kernels *sk, const lm_mm_job *j, int64_t r0, int64_t r1);
void lm_mm_avx2_gemv_fast(const lm_mm_job *j, int64_t r0, int64_t r1);
void lm_mm_avx2_dequant_rows(const lm_weight *w, int64_t e, int64_t r0, int64_t n, float *out,
                             int64_t ldo);
void lm_mm_avx2_unpack_codes(const lm_weight *w, const uint8_t *row, int64_t c0, int64_t n,
                             uint8_t *out);
void lm_mm_avx2_interleave(const uint8_t *rows, int64_t ldr, int nr, int64_t nq, uint8_t *dst);
void lm_mm_avx2_quantize(const lm_mm_job *j, lm_qact *qa, int64_t t0, int64_t t1);

#endif
