/* weight_payload.c — building and exchanging weight payloads (see weight_payload.h). */
#include "tensor/weight_payload.h"

#include <stdlib.h>
#include <string.h>

#include "tensor/quant.h"

static int64_t total_rows(const lm_weight *w) {
  return (w->n_experts ? w->n_experts : 1) * w->rows;
}

int64_t lm_weight_payload_bytes(const lm_weight *w, int bits, int group) {
  if (!bits) return total_rows(w) * w->cols * 2; /* bf16 */
  return total_rows(w) * (w->cols * bits / 8 + 2 * 2 * (w->cols / group));
}

void lm_weight_quantize_row_bf16(const lm_weight *w, int64_t r, int bits, int group, float *row,
                                 uint8_t *codes, uint16_t *scales, uint16_t *biases) {
  int64_t ng = w->cols / group;
  float s[ng], b[ng];
  lm_weight_dequant_row(w, r / w->rows, r % w->rows, row);
  lm_affine_quantize_row(row, w->cols, bits, group, codes, s, b);
  for (int64_t g = 0; g < ng; g++) {
    scales[g] = lm_f32_to_bf16(s[g]);
    biases[g] = lm_f32_to_bf16(b[g]);
  }
}

int lm_weight_payload_fits(const lm_weight *w, int bits, int group) {
  return bits >= 2 && bits <= 8 && bits != 7 && (group == 32 || group == 64 || group == 128) &&
         w->cols % group == 0 && (w->cols * bits) % 32 == 0;
}

lm_status lm_weight_payload_quantize(const lm_weight *w, int bits, int group,
                                     lm_weight_payload *out) {
  memset(out, 0, sizeof *out);
  if (!lm_weight_payload_fits(w, bits, group))
    return LM_ERRF(LM_ERR_INVALID,
                   "%s: %d bits in groups of %d is no MLX affine kind for %lld columns", w->name,
                   bits, group, (long long)w->cols);
  int64_t rows = total_rows(w), cb = w->cols * bits / 8, ng = w->cols / group;
  size_t codes = (size_t)(rows * cb), sb = (size_t)(rows * ng) * 2;
  uint8_t *mem = malloc(codes + 2 * sb + 8); /* + 8: lm_affine_code reads 2 bytes at the end */
  if (!mem) return LM_ERRF(LM_ERR_NOMEM, "out of memory quantizing %s", w->name);
  uint16_t *s = (uint16_t *)(void *)(mem + codes), *b = s + rows * ng;
  int ok = 1;
  /* rows are independent: a sweep quantizes embeddings of billions of weights at every kind */
#pragma omp parallel reduction(&& : ok)
  {
    float *tmp = malloc((size_t)w->cols * sizeof(float));
    ok = tmp != NULL;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; r++)
      if (tmp)
        lm_weight_quantize_row_bf16(w, r, bits, group, tmp, mem + r * cb, s + r * ng, b + r * ng);
    free(tmp);
  }
  if (!ok) {
    free(mem);
    return LM_ERRF(LM_ERR_NOMEM, "out of memory quantizing %s", w->name);
  }
  *out = (lm_weight_payload){.dtype = LM_DT_U32,
                             .bits = bits,
                             .group = group,
                             .sdtype = LM_DT_BF16,
                             .expert_rows = w->rows,
                             .data = mem,
                             .scales = s,
                             .biases = b,
                             .owned = mem};
  return LM_OK;
}

void lm_weight_payload_swap(lm_weight *w, lm_weight_payload *p) {
  lm_weight_payload old = {.dtype = w->dtype,
                           .bits = w->bits,
                           .group = w->group,
                           .sdtype = w->sdtype,
                           .expert_rows = w->expert_rows,
                           .data = w->data,
                           .scales = w->scales,
                           .biases = w->biases,
                           .owned = w->owned};
  w->dtype = p->dtype;
  w->bits = p->bits;
  w->group = p->group;
  w->sdtype = p->sdtype;
  w->expert_rows = p->expert_rows;
  w->data = p->data;
  w->scales = p->scales;
  w->biases = p->biases;
  w->owned = p->owned; /* ownership travels with the payload */
  *p = old;
}

void lm_weight_payload_free(lm_weight_payload *p) {
  free(p->owned);
  p->owned = NULL;
}
