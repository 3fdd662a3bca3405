/* cpu_matmul.c — lm_cpu_matmul: argument checks, choice of kernel family (run-time CPU
 * detection), and the drivers that split the work over OpenMP threads:
 *   decode  (small m): output rows in blocks, fused gemv kernels (F32 or FAST);
 *   prefill F32: row tiles dequantized to f32, then OpenBLAS sgemm on each tile;
 *   prefill FAST: activations quantized to int8 once, row tiles repacked for an int8 GEMM.
 * The kernels themselves live in cpu_matmul_{scalar,avx2,avx512}.c. */
#include <cblas.h>
#include <limits.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_matmul_impl.h"
#include "backend/cpu/cpu_team.h"
#include "base/status.h"

#define LM_MM_STACK_BYTES 65536 /* decode scratch on the caller's stack */
#define LM_MM_SGEMM_MIN_M 8     /* F32: from this m on, dequantized tiles + sgemm */
#define LM_MM_GEMM_MIN_M 8      /* FAST: from this m on, the family's int8 GEMM */
#define LM_MM_ROW_BLOCK 16      /* decode: rows per scheduling block */
#define LM_MM_TILE_BYTES                                                                           \
  (2 << 20)              /* F32 prefill: f32 tile per thread handed to sgemm (>= 64 rows) */
#define LM_MM_SUBTILES 4 /* FAST prefill: NR-row subtiles packed together */
/* Team decode: weight bytes per claimed chunk. A phase gets about LM_MM_CHUNKS_PER_THREAD
 * chunks per thread, within these bounds: small enough that a thread the OS takes off its
 * core holds back at most one chunk, large enough that each chunk's stream of prefetches
 * runs long past its start (a chunk's first lines wait for memory: ~8% of a 48 KiB chunk's
 * time) and that the claims' atomics stay a few %. */
#define LM_MM_CHUNK_MIN_BYTES (48 << 10)
#define LM_MM_CHUNK_MAX_BYTES (512 << 10)
#define LM_MM_CHUNKS_PER_THREAD 4

/* ---- kernel families ------------------------------------------------------------------- */

int lm_cpu_isa_available(lm_cpu_isa isa) {
  switch (isa) {
  case LM_CPU_ISA_AUTO:
  case LM_CPU_ISA_SCALAR: return 1;
#if defined(__x86_64__)
  case LM_CPU_ISA_AVX2:
#if defined(__clang__) /* clang 14 cannot ask for f16c; every AVX2 CPU shipped has it */
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
#endif
  case LM_CPU_ISA_AVX512:
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
           __builtin_cpu_supports("fma");
#endif
  default: return 0;
  }
}

static lm_cpu_isa lm_isa_resolve(lm_cpu_isa isa) {
  if (isa != LM_CPU_ISA_AUTO) return isa;
  if (lm_cpu_isa_available(LM_CPU_ISA_AVX512)) return LM_CPU_ISA_AVX512;
  if (lm_cpu_isa_available(LM_CPU_ISA_AVX2)) return LM_CPU_ISA_AVX2;
  return LM_CPU_ISA_SCALAR;
}

static const lm_cpu_kernels *lm_kernels(lm_cpu_isa isa) {
  switch (isa) {
#if defined(__x86_64__)
  case LM_CPU_ISA_AVX512: return &lm_cpu_kernels_avx512;
  case LM_CPU_ISA_AVX2: return &lm_cpu_kernels_avx2;
#endif
  default: return &lm_cpu_kernels_scalar;
  }
}

const char *lm_cpu_isa_name(lm_cpu_isa isa) {
  if (isa < 0 || isa >= LM_CPU_ISA_COUNT) return "?";
  return lm_kernels(lm_isa_resolve(isa))->name;
}

void lm_cpu_kernels_info(char *buf, size_t n) {
  const lm_cpu_kernels *kn = lm_kernels(lm_isa_resolve(LM_CPU_ISA_AUTO));
  snprintf(buf, n,
           "cpu matmul: %s kernels (avx2 %s, avx512-vnni %s), %d threads; decode: fused gemv; "
           "prefill F32: f32 tiles + OpenBLAS sgemm (%s); prefill FAST: %s",
           kn->name, lm_cpu_isa_available(LM_CPU_ISA_AVX2) ? "yes" : "no",
           lm_cpu_isa_available(LM_CPU_ISA_AVX512) ? "yes" : "no", omp_get_max_threads(),
           openblas_get_config(),
           kn->gemm_fast ? "int8 GEMM, activations int8 per 32"
                         : "int8 gemv, activations int8 per 32");
}

/* ---- argument checks ------------------------------------------------------------------- */

static int lm_float_dtype(lm_dtype t) {
  return t == LM_DT_F32 || t == LM_DT_F16 || t == LM_DT_BF16;
}

static lm_status lm_mm_check_weight(const lm_weight *w, int64_t expert) {
  const char *nm = w->name ? w->name : "?";
  if (w->rows <= 0 || w->cols <= 0) return LM_ERRF(LM_ERR_INVALID, "matmul: %s: empty shape", nm);
  if (!w->data) return LM_ERRF(LM_ERR_INVALID, "matmul: %s: no data", nm);
  if (w->n_experts < 0 || (w->n_experts ? expert < 0 || expert >= w->n_experts : expert != 0))
    return LM_ERRF(LM_ERR_INVALID, "matmul: %s: expert %lld out of range (%lld experts)", nm,
                   (long long)expert, (long long)w->n_experts);
  if (w->n_experts && w->expert_rows < w->rows)
    return LM_ERRF(LM_ERR_INVALID, "matmul: %s: expert_rows %lld < rows %lld", nm,
                   (long long)w->expert_rows, (long long)w->rows);
  if (!w->bits) {
    if (!lm_float_dtype(w->dtype))
      return LM_ERRF(LM_ERR_UNSUPPORTED, "matmul: %s: dense dtype %s", nm, lm_dtype_name(w->dtype));
    return LM_OK;
  }
  if (w->bits < 2 || w->bits > 8 || w->bits == 7)
    return LM_ERRF(LM_ERR_UNSUPPORTED, "matmul: %s: %d-bit codes", nm, w->bits);
  if (w->group != 32 && w->group != 64 && w->group != 128)
    return LM_ERRF(LM_ERR_UNSUPPORTED, "matmul: %s: group size %d", nm, w->group);
  if (w->cols % w->group)
    return LM_ERRF(LM_ERR_INVALID, "matmul: %s: cols %lld not a multiple of group %d", nm,
                   (long long)w->cols, w->group);
  if (!lm_float_dtype(w->sdtype) || !w->scales || !w->biases)
    return LM_ERRF(LM_ERR_INVALID, "matmul: %s: scales/biases missing or of dtype %s", nm,
                   lm_dtype_name(w->sdtype));
  return LM_OK;
}

int lm_mm_same_format(const lm_weight *a, const lm_weight *b) {
  return a->rows == b->rows && a->cols == b->cols && a->bits == b->bits && a->group == b->group &&
         a->n_experts == b->n_experts && (a->bits ? a->sdtype == b->sdtype : a->dtype == b->dtype);
}

static lm_status lm_mm_check(const lm_cpu_matmul_args *a, int64_t *nrows) {
  if (!a || !a->w || !a->x || !a->y) return LM_ERRF(LM_ERR_INVALID, "matmul: NULL argument");
  LM_TRY(lm_mm_check_weight(a->w, a->expert));
  const lm_weight *w = a->w;
  int64_t n = a->nrows ? a->nrows : w->rows;
  if (a->m < 0 || a->row0 < 0 || a->nrows < 0 || a->row0 + n > w->rows)
    return LM_ERRF(LM_ERR_INVALID, "matmul: %s: m %lld, rows [%lld, +%lld) outside [0, %lld)",
                   w->name ? w->name : "?", (long long)a->m, (long long)a->row0, (long long)n,
                   (long long)w->rows);
  if (a->m > 1 && (a->ldx < w->cols || a->ldy < a->row0 + n))
    return LM_ERRF(LM_ERR_INVALID, "matmul: %s: ldx %lld < cols %lld or ldy %lld < %lld",
                   w->name ? w->name : "?", (long long)a->ldx, (long long)w->cols,
                   (long long)a->ldy, (long long)(a->row0 + n));
  if (a->prec != LM_CPU_PREC_F32 && a->prec != LM_CPU_PREC_FAST)
    return LM_ERRF(LM_ERR_INVALID, "matmul: precision %d", (int)a->prec);
  if (a->w2 && (!a->y2 || a->accumulate || !lm_mm_same_format(w, a->w2) ||
                (a->m > 1 && a->ldy2 < a->row0 + n)))
    return LM_ERRF(LM_ERR_INVALID,
                   "matmul: %s: a second weight needs W's shape and format, y2, and no accumulate",
                   w->name ? w->name : "?");
  if (a->w2) LM_TRY(lm_mm_check_weight(a->w2, a->expert));
  if (a->team && a->m >= LM_MM_GEMM_MIN_M)
    return LM_ERRF(LM_ERR_INVALID, "matmul: %s: a team call takes fewer than %d tokens",
                   w->name ? w->name : "?", LM_MM_GEMM_MIN_M);
  *nrows = n;
  return LM_OK;
}

/* ---- decode: fused gemv over row blocks ---------------------------------------------------- */

typedef void (*lm_gemv_fn)(const lm_mm_job *j, int64_t r0, int64_t r1);

/* Rows [s, e) for every token, in token chunks of at most LM_MM_GEMV_MAX_M (the kernels'
 * per-row accumulators); each chunk is a job shifted to its first token. */
static void lm_mm_gemv_rows(lm_gemv_fn fn, const lm_mm_job *j, int64_t s, int64_t e) {
  if (j->m <= LM_MM_GEMV_MAX_M) {
    fn(j, s, e);
    return;
  }
  for (int64_t t0 = 0; t0 < j->m; t0 += LM_MM_GEMV_MAX_M) {
    lm_mm_job sub = *j;
    lm_qact qa;
    sub.m = j->m - t0 < LM_MM_GEMV_MAX_M ? j->m - t0 : LM_MM_GEMV_MAX_M;
    sub.x += t0 * j->ldx;
    sub.y += t0 * j->ldy;
    if (j->gsum) sub.gsum += t0 * j->ng;
    if (j->qa) {
      qa = *j->qa;
      qa.q += t0 * qa.ldq;
      qa.d += t0 * j->nb;
      if (qa.dexp) qa.dexp += t0 * j->nb * 4;
      qa.sx += t0 * j->ng;
      qa.c8 += t0 * j->ng;
      sub.qa = &qa;
    }
    fn(&sub, s, e);
  }
}

/* One contiguous range of rows per thread (multiples of LM_MM_ROW_BLOCK): each thread
 * streams its part of the weight front to back, which its prefetches can run ahead of. */
static void lm_mm_thread_rows(int64_t r0, int64_t n, int64_t *s, int64_t *e) {
  int nt = omp_get_num_threads(), id = omp_get_thread_num();
  int64_t nblk = (n + LM_MM_ROW_BLOCK - 1) / LM_MM_ROW_BLOCK, per = nblk / nt, extra = nblk % nt;
  int64_t b0 = id * per + (id < extra ? id : extra), b1 = b0 + per + (id < extra);
  *s = r0 + b0 * LM_MM_ROW_BLOCK;
  *e = r0 + b1 * LM_MM_ROW_BLOCK < r0 + n ? r0 + b1 * LM_MM_ROW_BLOCK : r0 + n;
}

static void lm_mm_rows_parallel(lm_gemv_fn fn, const lm_mm_job *j, int64_t r0, int64_t n) {
#pragma omp parallel
  {
    int64_t s, e;
    lm_mm_thread_rows(r0, n, &s, &e);
    if (s < e) lm_mm_gemv_rows(fn, j, s, e);
  }
}

/* Σ x per weight group, the b·Σx half of the factored affine term. */
static void lm_mm_group_sums(const lm_mm_job *j, float *gsum) {
  int64_t gs = j->w->group;
  for (int64_t t = 0; t < j->m; t++)
    for (int64_t g = 0; g < j->ng; g++) {
      const float *x = j->x + t * j->ldx + g * gs;
      float s = 0.0f;
      for (int64_t i = 0; i < gs; i++)
        s += x[i];
      gsum[t * j->ng + g] = s;
    }
}

/* ---- prefill F32: dequantized tiles + sgemm ---------------------------------------------- */

static int lm_fits_blas(int64_t v) { return v <= INT_MAX; }

/* Each thread dequantizes its own tiles of rows and multiplies them with a single-threaded
 * sgemm (OpenBLAS runs serially inside a parallel region): no barrier between the two
 * steps, and the tile is still in the thread's cache when sgemm packs it. */
static lm_status lm_mm_sgemm(const lm_cpu_kernels *kn, const lm_mm_job *j, int64_t row0,
                             int64_t n) {
  const lm_weight *w = j->w;
  float beta = j->acc ? 1.0f : 0.0f;
  if (!w->bits && w->dtype == LM_DT_F32) { /* dense f32: no copy, OpenBLAS threads itself */
    const float *wp = (const float *)(const void *)lm_weight_row_ptr(w, j->e, row0);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)j->m, (int)n, (int)j->k, 1.0f, j->x,
                (int)j->ldx, wp, (int)j->k, beta, j->y + row0, (int)j->ldy);
    return LM_OK;
  }
  int nt = omp_get_max_threads();
  int64_t tn = LM_MM_TILE_BYTES / (4 * j->k);
  tn = tn < 64 ? 64 : tn / 16 * 16;        /* sgemm wants a wide N */
  if (tn * nt > n) tn = (n + nt - 1) / nt; /* every thread gets a tile */
  float *buf = malloc((size_t)(tn * j->k) * sizeof(float) * (size_t)nt);
  if (!buf)
    return LM_ERRF(LM_ERR_NOMEM, "matmul: %s: %lld-byte f32 tiles", w->name ? w->name : "?",
                   (long long)(tn * j->k * 4 * nt));
  int64_t ntiles = (n + tn - 1) / tn;
#pragma omp parallel num_threads(nt)
  {
    float *tile = buf + (size_t)omp_get_thread_num() * (size_t)(tn * j->k);
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < ntiles; i++) {
      int64_t r = row0 + i * tn, cnt = r + tn < row0 + n ? tn : row0 + n - r;
      kn->dequant_rows(w, j->e, r, cnt, tile, j->k);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)j->m, (int)cnt, (int)j->k, 1.0f,
                  j->x, (int)j->ldx, tile, (int)j->k, beta, j->y + r, (int)j->ldy);
    }
  }
  free(buf);
  return LM_OK;
}

static lm_status lm_mm_f32(const lm_cpu_kernels *kn, lm_mm_job *j, int64_t row0, int64_t n,
                           void *stack) {
  if (j->m >= LM_MM_SGEMM_MIN_M && lm_fits_blas(j->m) && lm_fits_blas(j->k) &&
      lm_fits_blas(j->ldx) && lm_fits_blas(j->ldy) && lm_fits_blas(n))
    return lm_mm_sgemm(kn, j, row0, n);
  float *gsum = NULL;
  if (j->w->bits) {
    size_t bytes = (size_t)(j->m * j->ng) * sizeof(float);
    gsum = bytes <= LM_MM_STACK_BYTES ? stack : malloc(bytes);
    if (!gsum) return LM_ERRF(LM_ERR_NOMEM, "matmul: %zu bytes of group sums", bytes);
    lm_mm_group_sums(j, gsum);
  }
  j->gsum = gsum;
  lm_mm_rows_parallel(kn->gemv_f32, j, row0, n);
  if (gsum != stack) free(gsum);
  return LM_OK;
}

/* ---- FAST: int8 activations ------------------------------------------------------------ */

/* Scratch of a FAST call: the quantized activations, then (GEMM) one packed tile set per thread. */
typedef struct lm_fast_plan {
  int use_gemm, nthreads;
  int64_t mp; /* token rows, padded to the GEMM's MR */
  size_t act_bytes, tile_bytes, bytes;
} lm_fast_plan;

static size_t lm_align64(size_t v) { return (v + 63) & ~(size_t)63; }

static lm_fast_plan lm_fast_plan_make(const lm_cpu_kernels *kn, const lm_mm_job *j, lm_qact *qa) {
  lm_fast_plan p = {0};
  p.use_gemm = kn->gemm_fast && j->m >= LM_MM_GEMM_MIN_M;
  p.mp = p.use_gemm ? (j->m + kn->gemm_mr - 1) / kn->gemm_mr * kn->gemm_mr : j->m;
  p.nthreads = omp_get_max_threads();
  qa->perm = (!p.use_gemm && j->w->bits == 4) ? kn->q4_perm : 0;
  qa->ldq = (j->k + 63) / 64 * 64;
  p.act_bytes = lm_align64((size_t)(p.mp * qa->ldq)) + lm_align64((size_t)(p.mp * j->nb) * 4) +
                (qa->perm ? lm_align64((size_t)(p.mp * j->nb) * 16) : 0) +
                2 * lm_align64((size_t)(p.mp * j->ng) * 4);
  if (p.use_gemm) {
    size_t nr = (size_t)kn->gemm_nr * LM_MM_SUBTILES;
    p.tile_bytes = lm_align64(nr * (size_t)j->k) + 2 * lm_align64(nr * (size_t)j->ng * 4) +
                   (size_t)kn->gemm_nr * LM_PACK_CHUNK;
  }
  p.bytes = p.act_bytes + p.tile_bytes * (size_t)p.nthreads;
  return p;
}

static void lm_qact_bind(lm_qact *qa, const lm_fast_plan *p, const lm_mm_job *j, uint8_t *base) {
  qa->q = (int8_t *)base;
  base += lm_align64((size_t)(p->mp * qa->ldq));
  qa->d = (float *)(void *)base;
  base += lm_align64((size_t)(p->mp * j->nb) * 4);
  qa->dexp = NULL;
  if (qa->perm) {
    qa->dexp = (float *)(void *)base;
    base += lm_align64((size_t)(p->mp * j->nb) * 16);
  }
  qa->sx = (float *)(void *)base;
  base += lm_align64((size_t)(p->mp * j->ng) * 4);
  qa->c8 = (float *)(void *)base;
  /* padding tokens quantize to zero and are never stored */
  for (int64_t t = j->m; t < p->mp; t++) {
    memset(qa->q + t * qa->ldq, 0, (size_t)qa->ldq);
    memset(qa->d + t * j->nb, 0, (size_t)j->nb * 4);
    memset(qa->sx + t * j->ng, 0, (size_t)j->ng * 4);
    memset(qa->c8 + t * j->ng, 0, (size_t)j->ng * 4);
  }
}

/* One thread's share of the int8 GEMM: macro tiles of SUBTILES×NR rows, each packed once
 * and then multiplied with every MR-token block. */
static void lm_mm_gemm_thread(const lm_cpu_kernels *kn, const lm_mm_job *j, const lm_fast_plan *p,
                              int64_t row0, int64_t n, uint8_t *scratch) {
  int nr = kn->gemm_nr, mr = kn->gemm_mr;
  int64_t mt_rows = (int64_t)nr * LM_MM_SUBTILES, nmt = (n + mt_rows - 1) / mt_rows;
  lm_qtile tiles[LM_MM_SUBTILES];
  uint8_t *codes = scratch;
  float *s = (float *)(void *)(scratch + lm_align64((size_t)mt_rows * (size_t)j->k));
  float *b = (float *)(void *)((uint8_t *)s + lm_align64((size_t)mt_rows * (size_t)j->ng * 4));
  uint8_t *rowbuf = (uint8_t *)b + lm_align64((size_t)mt_rows * (size_t)j->ng * 4);
  for (int i = 0; i < LM_MM_SUBTILES; i++)
    tiles[i] = (lm_qtile){.codes = codes + (size_t)i * nr * j->k,
                          .s = s + (size_t)i * nr * j->ng,
                          .b = b + (size_t)i * nr * j->ng,
                          .nr = nr,
                          .signed8 = j->w->bits == 8 && kn->gemm_signed8};
#pragma omp for schedule(dynamic, 1)
  for (int64_t mt = 0; mt < nmt; mt++) {
    int64_t r = row0 + mt * mt_rows;
    int nsub = 0, valid[LM_MM_SUBTILES];
    for (; nsub < LM_MM_SUBTILES && r + nsub * nr < row0 + n; nsub++) {
      int64_t left = row0 + n - (r + nsub * nr);
      valid[nsub] = left < nr ? (int)left : nr;
      lm_mm_pack_tile(kn, j, r + nsub * nr, valid[nsub], &tiles[nsub], rowbuf);
    }
    for (int64_t t0 = 0; t0 < p->mp; t0 += mr)
      for (int i = 0; i < nsub; i++)
        kn->gemm_fast(j, &tiles[i], r + i * nr, valid[i], t0, t0 + mr);
  }
}

static lm_status lm_mm_fast(const lm_cpu_kernels *kn, lm_mm_job *j, int64_t row0, int64_t n,
                            void *stack) {
  if (!kn->gemv_fast) kn = &lm_cpu_kernels_scalar; /* a family may leave FAST to the generic one */
  lm_qact qa = {0};
  lm_fast_plan p = lm_fast_plan_make(kn, j, &qa);
  uint8_t *mem = p.bytes <= LM_MM_STACK_BYTES ? stack : malloc(p.bytes);
  if (!mem) return LM_ERRF(LM_ERR_NOMEM, "matmul: %zu bytes of FAST scratch", p.bytes);
  lm_qact_bind(&qa, &p, j, mem);
  j->qa = &qa;
#pragma omp parallel num_threads(p.nthreads)
  {
#pragma omp for schedule(static)
    for (int64_t t = 0; t < j->m; t++)
      kn->quantize(j, &qa, t, t + 1);
    if (p.use_gemm) {
      lm_mm_gemm_thread(kn, j, &p, row0, n,
                        mem + p.act_bytes + p.tile_bytes * (size_t)omp_get_thread_num());
    } else {
      int64_t s, e;
      lm_mm_thread_rows(row0, n, &s, &e);
      if (s < e) lm_mm_gemv_rows(kn->gemv_fast, j, s, e);
    }
  }
  if (mem != stack) free(mem);
  return LM_OK;
}

/* ---- team decode: rows as chunks claimed by the step's threads --------------------------- */

/* The job of the second weight of a pair: same activations, its own output. */
static lm_mm_job lm_mm_second(const lm_mm_job *j, const lm_cpu_matmul_args *a) {
  lm_mm_job j2 = *j;
  j2.w = a->w2;
  j2.y = a->y2;
  j2.ldy = a->ldy2;
  return j2;
}

/* One thread's view of a team call: its own copy of the prepared activations (quantized, or
 * the group sums), made on its stack when it claims its first chunk. A thread that claims
 * none (it arrived late) prepares nothing. */
typedef struct lm_team_mm {
  const lm_cpu_kernels *kn;
  const lm_cpu_matmul_args *a;
  lm_mm_job j, j2;
  lm_gemv_fn fn;
  int64_t row0, n, rows; /* the call's rows, rows per chunk */
  uint8_t *stack;
  int ready, fast;
  lm_qact qa;
  lm_fast_plan p;
} lm_team_mm;

static void lm_team_mm_prepare(lm_team_mm *c) {
  if (c->fast) {
    lm_qact_bind(&c->qa, &c->p, &c->j, c->stack);
    c->kn->quantize(&c->j, &c->qa, 0, c->j.m);
    c->j.qa = c->j2.qa = &c->qa;
  } else if (c->j.w->bits) {
    lm_mm_group_sums(&c->j, (float *)(void *)c->stack);
    c->j.gsum = c->j2.gsum = (const float *)(void *)c->stack;
  }
  c->ready = 1;
}

static void lm_team_mm_chunk(void *arg, int64_t i) {
  lm_team_mm *c = arg;
  if (!c->ready) lm_team_mm_prepare(c);
  int64_t s = c->row0 + i * c->rows,
          e = s + c->rows < c->row0 + c->n ? s + c->rows : c->row0 + c->n;
  c->fn(&c->j, s, e);
  if (c->a->w2) c->fn(&c->j2, s, e);
  if (c->a->epi) c->a->epi(c->a->epi_arg, s, e);
}

typedef struct lm_mm_solo {
  lm_cpu_matmul_args a;
  lm_cpu_isa isa;
} lm_mm_solo;

static lm_status lm_mm_solo_run(void *arg) {
  lm_mm_solo *c = arg;
  return lm_cpu_matmul_isa(&c->a, c->isa);
}

static lm_status lm_mm_team(const lm_cpu_kernels *kn, const lm_cpu_matmul_args *a, lm_mm_job *j,
                            int64_t n, uint8_t *stack) {
  lm_team_mm c = {.kn = kn, .a = a, .j = *j, .row0 = a->row0, .n = n, .stack = stack};
  c.j2 = lm_mm_second(j, a);
  c.fast = a->prec == LM_CPU_PREC_FAST && j->w->bits;
  size_t need = (size_t)(j->m * j->ng) * sizeof(float);
  if (c.fast) {
    if (!kn->gemv_fast) c.kn = kn = &lm_cpu_kernels_scalar;
    c.p = lm_fast_plan_make(kn, j, &c.qa);
    need = c.p.bytes;
  }
  if (need > LM_MM_STACK_BYTES) { /* more tokens than the stack holds: one thread, as a call */
    lm_mm_solo solo = {.a = *a, .isa = kn->isa};
    solo.a.team = NULL;
    return lm_cpu_team_solo(a->team, 1, lm_mm_solo_run, &solo);
  }
  c.fn = c.fast ? kn->gemv_fast : kn->gemv_f32;
  int64_t rb = lm_weight_row_bytes(j->w) * (a->w2 ? 2 : 1);
  int64_t chunk = n * rb / ((int64_t)a->team->size * LM_MM_CHUNKS_PER_THREAD);
  chunk = chunk < LM_MM_CHUNK_MIN_BYTES   ? LM_MM_CHUNK_MIN_BYTES
          : chunk > LM_MM_CHUNK_MAX_BYTES ? LM_MM_CHUNK_MAX_BYTES
                                          : chunk;
  c.rows = chunk / (rb > 0 ? rb : 1) / LM_MM_ROW_BLOCK * LM_MM_ROW_BLOCK;
  if (c.rows < LM_MM_ROW_BLOCK) c.rows = LM_MM_ROW_BLOCK;
  lm_cpu_team_run(a->team, (n + c.rows - 1) / c.rows, 0, lm_team_mm_chunk, &c);
  return LM_OK;
}

/* ---- entry points ---------------------------------------------------------------------- */

lm_status lm_cpu_matmul_isa(const lm_cpu_matmul_args *a, lm_cpu_isa isa) {
  int64_t n = 0;
  LM_TRY(lm_mm_check(a, &n));
  if (isa < 0 || isa >= LM_CPU_ISA_COUNT)
    return LM_ERRF(LM_ERR_INVALID, "matmul: kernel family %d", (int)isa);
  if (!lm_cpu_isa_available(isa))
    return LM_ERRF(LM_ERR_UNSUPPORTED, "matmul: this CPU cannot run the %s kernels",
                   lm_kernels(isa)->name);
  if (a->m == 0) return LM_OK;
  const lm_cpu_kernels *kn = lm_kernels(lm_isa_resolve(isa));
  const lm_weight *w = a->w;
  lm_mm_job j = {.w = w,
                 .e = a->expert,
                 .x = a->x,
                 .ldx = a->ldx,
                 .m = a->m,
                 .y = a->y,
                 .ldy = a->ldy,
                 .acc = a->accumulate,
                 .k = w->cols};
  j.ng = w->bits ? w->cols / w->group : 0;
  j.nb = w->bits ? w->cols / LM_QA_BLOCK : 0;
  _Alignas(64) uint8_t stack[LM_MM_STACK_BYTES];
  if (a->team && lm_cpu_team_active(a->team)) return lm_mm_team(kn, a, &j, n, stack);
  int fast = a->prec == LM_CPU_PREC_FAST && w->bits;
  LM_TRY(fast ? lm_mm_fast(kn, &j, a->row0, n, stack) : lm_mm_f32(kn, &j, a->row0, n, stack));
  if (a->w2) {
    lm_mm_job j2 = lm_mm_second(&j, a);
    LM_TRY(fast ? lm_mm_fast(kn, &j2, a->row0, n, stack) : lm_mm_f32(kn, &j2, a->row0, n, stack));
  }
  if (a->epi) a->epi(a->epi_arg, a->row0, a->row0 + n);
  return LM_OK;
}

lm_status lm_cpu_matmul(const lm_cpu_matmul_args *a) {
  return lm_cpu_matmul_isa(a, LM_CPU_ISA_AUTO);
}
