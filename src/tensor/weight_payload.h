/* weight_payload.h — a weight's stored payload (codes or elements, scales, biases and their
 * kind) as a value that can be built, measured, and exchanged into a loaded weight atomically:
 * the only way weights change after load. A quantization sweep builds a candidate payload for
 * one module, exchanges it in, measures the model, and exchanges the original back, without
 * reloading anything; inference in between sees a whole payload, never a mix. */
#ifndef LM_TENSOR_WEIGHT_PAYLOAD_H
#define LM_TENSOR_WEIGHT_PAYLOAD_H

#include "base/status.h"
#include "tensor/weight.h"

typedef struct lm_weight_payload {
  lm_dtype dtype;      /* LM_DT_U32 when quantized, else the dense element type */
  int bits, group;     /* 0, 0 when dense */
  lm_dtype sdtype;     /* scales/biases element type (quantized only) */
  int64_t expert_rows; /* rows between experts: a built payload is compact, a view's is not */
  const void *data, *scales, *biases;
  void *owned; /* the allocation holding data/scales/biases, NULL when they are the checkpoint's */
} lm_weight_payload;

/* The affine quantization of every row of w (any stored kind, dequantized in f32) with bits and
 * group, as `lumen quantize` writes it: codes from the f32 scales, scales and biases stored as
 * bf16. Errors: LM_ERR_INVALID for a kind MLX has not (bits, group, or cols % group != 0). */
lm_status lm_weight_payload_quantize(const lm_weight *w, int bits, int group,
                                     lm_weight_payload *out);

/* Row r (over all experts) of w quantized that way into codes [cols*bits/8] and bf16 scales and
 * biases [cols/group]; row is scratch of cols floats. */
void lm_weight_quantize_row_bf16(const lm_weight *w, int64_t r, int bits, int group, float *row,
                                 uint8_t *codes, uint16_t *scales, uint16_t *biases);

/* 1 if bits/group make an MLX affine kind (2..8 bits but 7; groups 32, 64, 128) that fits w's
 * width (the group and the packed rows divide it). */
int lm_weight_payload_fits(const lm_weight *w, int bits, int group);

/* Bytes the payload would occupy in w's shape (codes + scales + biases, every expert). */
int64_t lm_weight_payload_bytes(const lm_weight *w, int bits, int group);

/* Swaps the payload fields of w and p: afterwards w holds p's payload and p the previous one,
 * each with its ownership (an allocation in w is freed with the model, one in p by
 * lm_weight_payload_free), so a second call undoes the first. Touches no backend copy: callers
 * with a backend that keeps its own copy of weights use lm_exchange_weight. */
void lm_weight_payload_swap(lm_weight *w, lm_weight_payload *p);

/* Frees what p owns (a payload that came from w at load owns nothing). */
void lm_weight_payload_free(lm_weight_payload *p);

#endif
