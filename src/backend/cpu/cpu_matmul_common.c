/* cpu_matmul_common.c — helpers every matmul kernel family shares: the generic unpacking
 * of packed codes (any bit width), scale conversion, the portable activation quantizer of
 * the FAST path, and the packing of weight tiles for the int8 GEMM. */
#include <string.h>

#include "backend/cpu/cpu_matmul_impl.h"

/* MLX packs each row as one little-endian bit stream (gemma4-spec §8.1). Eight codes of
 * `bits` bits fill exactly `bits` bytes, so a run that starts at a multiple of 8 codes is
 * byte-aligned: read `bits` bytes and peel 8 codes. Assumes a little-endian host (x86-64). */
void lm_mm_unpack_codes(const uint8_t *row, int bits, int64_t k0, int64_t n, uint8_t *out) {
  const uint8_t *p = row + k0 * bits / 8;
  uint64_t mask = (1u << bits) - 1u;
  for (int64_t i = 0; i < n; i += 8, p += bits) {
    uint64_t v = 0;
    memcpy(&v, p, (size_t)bits);
    for (int j = 0; j < 8; j++)
      out[i + j] = (uint8_t)((v >> (j * bits)) & mask);
  }
}

void lm_mm_load_f32s(const void *p, lm_dtype t, int64_t i0, int64_t n, float *out) {
  if (t == LM_DT_BF16) /* the common case, inline: one shift per element */
    for (int64_t i = 0; i < n; i++)
      out[i] = lm_bf16_to_f32(((const uint16_t *)p)[i0 + i]);
  else
    for (int64_t i = 0; i < n; i++)
      out[i] = lm_load_f32(p, t, i0 + i);
}

/* Position of column c in a perm-P layout (see lm_qact): evens of the chunk, then odds. */
static int64_t lm_perm_pos(int64_t c, int64_t k, int perm) {
  if (!perm) return c;
  int64_t base = c / perm * perm, len = k - base < perm ? k - base : perm, i = c - base;
  return base + ((i & 1) ? len / 2 + i / 2 : i / 2);
}

/* Round-to-nearest-even for |v| < 2^22 with plain f32 adds: the same result as the SIMD
 * cvtps2dq under the default rounding mode, so every family quantizes identically. */
static inline int lm_round_i(float v) {
  const float big = 12582912.0f; /* 1.5·2^23; without -ffast-math the pair is not folded */
  return (int)((v + big) - big);
}

static void lm_quantize_row(const float *x, int64_t k, int64_t group, int perm, int8_t *q, float *d,
                            float *dexp, float *sx, float *c8) {
  int64_t nb = k / LM_QA_BLOCK, bpg = group / LM_QA_BLOCK;
  for (int64_t b = 0; b < nb; b++) {
    const float *xb = x + b * LM_QA_BLOCK;
    float amax = 0.0f, sum = 0.0f;
    for (int i = 0; i < LM_QA_BLOCK; i++) {
      float a = xb[i] < 0 ? -xb[i] : xb[i];
      amax = a > amax ? a : amax;
      sum += xb[i];
    }
    float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    int qsum = 0;
    for (int i = 0; i < LM_QA_BLOCK; i++) {
      int v = lm_round_i(xb[i] * id);
      qsum += v;
      q[lm_perm_pos(b * LM_QA_BLOCK + i, k, perm)] = (int8_t)v;
    }
    d[b] = amax / 127.0f;
    if (dexp)
      for (int i = 0; i < 4; i++)
        dexp[b * 4 + i] = d[b];
    int64_t g = b / bpg;
    if (b % bpg == 0) sx[g] = c8[g] = 0.0f;
    sx[g] += sum;
    c8[g] += 128.0f * d[b] * (float)qsum;
  }
}

void lm_mm_quantize_rows(const lm_mm_job *j, lm_qact *qa, int64_t t0, int64_t t1) {
  for (int64_t t = t0; t < t1; t++)
    lm_quantize_row(j->x + t * j->ldx, j->k, j->w->group, qa->perm, qa->q + t * qa->ldq,
                    qa->d + t * j->nb, qa->dexp ? qa->dexp + t * j->nb * 4 : NULL,
                    qa->sx + t * j->ng, qa->c8 + t * j->ng);
}

static void lm_interleave_scalar(const uint8_t *rows, int64_t ldr, int nr, int64_t nq,
                                 uint8_t *dst) {
  for (int r = 0; r < nr; r++)
    for (int64_t q = 0; q < nq; q++)
      memcpy(dst + (q * nr + r) * 4, rows + r * ldr + 4 * q, 4);
}

/* Chunk by chunk of columns: unpack the nr rows' codes to bytes, then interleave them by
 * 4-column quads, so the scratch stays small (nr × LM_PACK_CHUNK) for any width. */
void lm_mm_pack_tile(const lm_cpu_kernels *kn, const lm_mm_job *j, int64_t r0, int nvalid,
                     lm_qtile *t, uint8_t *rowbuf) {
  const lm_weight *w = j->w;
  int nr = t->nr;
  float *tmp = (float *)(void *)rowbuf; /* nr·LM_PACK_CHUNK bytes >= 2·ng floats per pass */
  for (int r = 0; r < nr; r++) {
    for (int64_t g0 = 0; g0 < j->ng; g0 += LM_PACK_CHUNK / 8) {
      int64_t n = j->ng - g0 < LM_PACK_CHUNK / 8 ? j->ng - g0 : LM_PACK_CHUNK / 8;
      if (r < nvalid) {
        lm_mm_load_f32s(lm_weight_scale_ptr(w, j->e, r0 + r), w->sdtype, g0, n, tmp);
        lm_mm_load_f32s(lm_weight_bias_ptr(w, j->e, r0 + r), w->sdtype, g0, n, tmp + n);
      } else { /* padding rows: zero scales; their outputs are never stored */
        memset(tmp, 0, (size_t)(2 * n) * sizeof(float));
      }
      for (int64_t g = 0; g < n; g++) {
        t->s[(g0 + g) * nr + r] = tmp[g];
        t->b[(g0 + g) * nr + r] = tmp[n + g];
      }
    }
  }
  for (int64_t c0 = 0; c0 < j->k; c0 += LM_PACK_CHUNK) {
    int64_t n = j->k - c0 < LM_PACK_CHUNK ? j->k - c0 : LM_PACK_CHUNK;
    for (int r = 0; r < nr; r++) {
      uint8_t *rb = rowbuf + r * LM_PACK_CHUNK;
      if (r >= nvalid) {
        memset(rb, 0, (size_t)n);
        continue;
      }
      const uint8_t *row = lm_weight_row_ptr(w, j->e, r0 + r);
      /* nr interleaved row streams defeat the hardware prefetcher: fetch the next chunk */
      if (c0 + n < j->k) {
        __builtin_prefetch(row + (c0 + LM_PACK_CHUNK) * w->bits / 8);
        __builtin_prefetch(row + (c0 + LM_PACK_CHUNK) * w->bits / 8 + 64);
      }
      kn->unpack_codes(w, row, c0, n, rb);
      if (t->signed8)
        for (int64_t i = 0; i < n; i++)
          rb[i] ^= 0x80u;
    }
    uint8_t *dst = t->codes + c0 * nr;
    if (kn->interleave)
      kn->interleave(rowbuf, LM_PACK_CHUNK, nr, n / 4, dst);
    else
      lm_interleave_scalar(rowbuf, LM_PACK_CHUNK, nr, n / 4, dst);
  }
}
