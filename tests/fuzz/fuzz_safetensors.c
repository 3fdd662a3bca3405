/* fuzz_safetensors.c — libFuzzer target over lm_st_parse_header: any byte string is a candidate
 * file. Besides "no crash", it checks the contract of an accepted header: every tensor lies
 * inside the input, the ranges tile the data section, and the data can be read end to end. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"

/* Invariants of an accepted header; a violation aborts, which libFuzzer reports. */
static void check_header(const lm_st_header *h, const uint8_t *data, size_t size) {
  uint64_t cursor = h->data_start;
  volatile uint8_t sink = 0;
  if (h->data_start != 8 + h->header_len || h->data_start > size) abort();
  for (size_t i = 0; i < h->n_tensors; i++) {
    const lm_st_tensor *t = &h->tensors[i];
    if (t->offset != cursor || t->offset + t->nbytes > size) abort();
    if ((const uint8_t *)t->data != data + t->offset) abort();
    if (t->ndim < 0 || t->ndim > LM_ST_MAX_DIMS || t->dtype >= LM_DT_COUNT) abort();
    if ((uint64_t)lm_st_numel(t) * lm_dtype_size(t->dtype) != t->nbytes) abort();
    for (uint64_t b = 0; b < t->nbytes; b++)
      sink ^= ((const uint8_t *)t->data)[b];
    sink ^= (uint8_t)strlen(t->name);
    cursor += t->nbytes;
  }
  if (cursor != size) abort();
  for (size_t i = 0; i < h->n_meta; i++)
    sink ^= (uint8_t)(strlen(h->meta_keys[i]) + strlen(h->meta_values[i]));
  (void)sink;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  lm_st_header *h = NULL;
  if (lm_st_parse_header(data, size, "fuzz.safetensors", &h) == LM_OK) {
    check_header(h, data, size);
    lm_st_header_free(h);
  } else if (h) {
    abort(); /* a failed parse must not hand out a header */
  }
  return 0;
}
