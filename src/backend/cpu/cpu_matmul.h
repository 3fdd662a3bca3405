/* cpu_matmul.h — the CPU backend's matrix product y = x · Wᵀ over an lm_weight (dense
 * f32/f16/bf16 or MLX affine q2..q8, optionally one expert of a stack).
 *
 * Two precisions:
 *  - LM_CPU_PREC_F32 (the parity path): the f32 math of lm_weight_dequant_row, i.e.
 *    w = s·q + b in f32 and an f32 dot with f32 accumulation. The summation order differs
 *    from the reference, and for decode the affine term is factored per group as
 *    s·Σ q·x + b·Σ x (algebraically identical; rounding differs at ~1e-7 relative).
 *  - LM_CPU_PREC_FAST (the speed path; quantized weights only, dense weights run as F32):
 *    x is quantized per block of 32 columns to int8, xq = round(x·127/amax), d = amax/127,
 *    and y = Σ_g s_g·Σ_{blocks b in g} d_b·(Σ_k q_k·xq_k) + Σ_g b_g·(Σ_{k in g} x_k), with
 *    integer SIMD for Σ q·xq and the exact f32 sum of x for the zero-point term. Its error
 *    is bounded by Σ_k |s_g·q_k|·d_b/2 (each xq is off by at most half a step), plus f32
 *    rounding.
 *
 * Shapes: x [m][ldx] (columns [0, cols) read), y [m][ldy] (columns [row0, row0+nrows)
 * written, or accumulated into). Paths (cpu_matmul.c):
 *  - m < 8 (decode, small verify batches): fused gemv kernels; each OpenMP thread streams one
 *    contiguous range of rows with software prefetch ahead of the codes it reads;
 *  - F32, m >= 8: each thread dequantizes tiles of rows to f32 (bit-identical to
 *    lm_weight_dequant_row) and runs a single-threaded OpenBLAS sgemm on them;
 *  - FAST, m >= 8: activations quantized once, rows repacked to int8 tiles (4-column quads)
 *    for an int8 GEMM (AVX2 vpmaddubsw, AVX-512 VNNI vpdpbusd).
 * Threads: OpenMP inside, omp_get_max_threads(); call from a serial region.
 *
 * Memory: decode (m·cols up to ~34k elements) works in a 64 KiB buffer on the caller's
 * stack, so the calling thread needs that much stack; larger calls allocate their scratch
 * once per call. */
#ifndef LM_BACKEND_CPU_MATMUL_H
#define LM_BACKEND_CPU_MATMUL_H

#include <stddef.h>
#include <stdint.h>

#include "lumen.h"
#include "tensor/weight.h"

typedef enum lm_cpu_prec { LM_CPU_PREC_F32 = 0, LM_CPU_PREC_FAST = 1 } lm_cpu_prec;

typedef struct lm_cpu_matmul_args {
  float *y;
  int64_t ldy; /* output [m][ldy]; columns [row0, row0+nrows) written (or accumulated) */
  const float *x;
  int64_t ldx; /* input  [m][ldx]; columns [0, w->cols) read */
  int64_t m;   /* number of activation rows (tokens) */
  const lm_weight *w;
  int64_t expert;      /* expert index (0 for a plain matrix) */
  int64_t row0, nrows; /* output-feature range; nrows = 0 means all w->rows */
  lm_cpu_prec prec;    /* F32: exact fp32 math (the parity path); FAST: may quantize activations */
  int accumulate;      /* 1: y += x·Wᵀ, 0: y = x·Wᵀ */
  /* Optional, for the fused forms of the backend's ops: */
  const lm_weight *w2; /* a second weight of W's shape and format: y2 = x·W2ᵀ too (no accumulate) */
  float *y2;
  int64_t ldy2;
  /* runs after rows [r0, r1) of y (and y2) are written, on the thread that wrote them */
  void (*epi)(void *arg, int64_t r0, int64_t r1);
  void *epi_arg;
  /* Non-NULL while its step runs (lm_cpu_team_active): every thread of the team calls with the
   * same arguments and the rows are shared among them as chunks; m must be below 8. */
  struct lm_cpu_team *team;
} lm_cpu_matmul_args;

/* Kernel families. AUTO picks the best one this CPU supports (checked at run time). */
typedef enum lm_cpu_isa {
  LM_CPU_ISA_AUTO = 0,
  LM_CPU_ISA_SCALAR, /* portable C: the generic path */
  LM_CPU_ISA_AVX2,   /* AVX2 + FMA + F16C */
  LM_CPU_ISA_AVX512, /* AVX-512 F/BW/VL + VNNI */
  LM_CPU_ISA_COUNT
} lm_cpu_isa;

/* y = x · Wᵀ (or y += ...). Validates the arguments (LM_ERR_INVALID naming the field, or
 * LM_ERR_UNSUPPORTED for a weight layout it cannot read); LM_ERR_NOMEM if scratch for a
 * large call cannot be allocated. Thread-safe for distinct outputs. */
lm_status lm_cpu_matmul(const lm_cpu_matmul_args *a);

/* The same with a chosen kernel family, for tests and `lumen bench-kernels`. An ISA this
 * CPU lacks gives LM_ERR_UNSUPPORTED. */
lm_status lm_cpu_matmul_isa(const lm_cpu_matmul_args *a, lm_cpu_isa isa);

/* 1 if b can be the second weight (w2) of a call with weight a: same shape, codes and scale
 * dtype. */
int lm_mm_same_format(const lm_weight *a, const lm_weight *b);

/* 1 if this CPU (and build) can run `isa`. AUTO and SCALAR are always available. */
int lm_cpu_isa_available(lm_cpu_isa isa);
/* "scalar", "avx2", "avx512"; AUTO resolves to the chosen one. */
const char *lm_cpu_isa_name(lm_cpu_isa isa);

/* One line saying which paths were selected, for `lumen info` / `bench`. */
void lm_cpu_kernels_info(char *buf, size_t n);

/* Measured read bandwidth in GB/s (1e9 bytes/s) with `threads` OpenMP threads (<= 0: all):
 * sums a 256 MiB buffer in 15 passes and reports the best (the machine's rate when
 * nobody else takes its cores or memory), with the slowest and the median pass as the spread.
 * All 0 if the buffer cannot be allocated. */
typedef struct lm_cpu_bw {
  double best, median, worst; /* GB/s */
  int passes;
} lm_cpu_bw;
lm_cpu_bw lm_cpu_read_bandwidth(int threads);
/* The same probe with `passes` passes (1..15): a few passes taken between the runs of a
 * measurement see the neighbours that measurement saw. */
lm_cpu_bw lm_cpu_read_bandwidth_passes(int threads, int passes);
/* lm_cpu_read_bandwidth(threads).best */
double lm_cpu_read_bandwidth_gbs(int threads);

#endif
