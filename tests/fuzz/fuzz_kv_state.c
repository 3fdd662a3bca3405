/* fuzz_kv_state.c — libFuzzer target over lm_kv_state_parse, the KV state loader's validation:
 * any byte string is a candidate file. It parses twice: with checksums off (so mutations reach
 * the structural checks behind them) and with every checksum on. Besides "no crash", it checks
 * the contract of an accepted file: every block lies inside the input, aligned, in order and
 * disjoint, with the size its cache's geometry implies, and the data can be read end to end. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kv/kv_state.h"

/* Invariants of an accepted file; a violation aborts, which libFuzzer reports. */
static void check_info(const lm_kv_state_info *in, const uint8_t *data, size_t size) {
  volatile uint8_t sink = 0;
  uint64_t cursor = in->data_offset;
  if (in->file_size != size || in->data_offset > size || in->data_offset % LM_KV_STATE_ALIGN)
    abort();
  if (in->n_caches < 0 || in->n_caches > LM_KV_STATE_MAX_CACHES || in->n_tokens < 0) abort();
  for (int64_t t = 0; t < in->n_tokens; t++)
    sink ^= (uint8_t)in->tokens[t];
  for (int i = 0; i < in->n_caches; i++) {
    const lm_kv_state_cache *c = &in->caches[i];
    if (c->n != in->n_tokens || c->rows > c->n || c->rows < 0) abort();
    if (lm_kv_kind_ring(c->plan.kind) && c->rows > c->plan.window) abort();
    for (int a = 0; a < LM_KV_ARRAYS; a++) {
      const lm_kv_state_block *b = &c->arrays[a];
      if (!b->bytes) continue;
      if (b->offset < cursor || b->offset % LM_KV_STATE_ALIGN || b->offset > size ||
          b->bytes > size - b->offset)
        abort();
      for (uint64_t k = 0; k < b->bytes; k += 61)
        sink ^= data[b->offset + k];
      cursor = b->offset + b->bytes;
    }
  }
  if (cursor != size) abort();
  (void)sink;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  for (int verify = 0; verify <= LM_KV_STATE_VERIFY_ALL; verify += LM_KV_STATE_VERIFY_ALL) {
    lm_kv_state_info *in = NULL;
    if (lm_kv_state_parse(data, size, "fuzz.kvstate", verify, &in) == LM_OK) {
      check_info(in, data, size);
      lm_kv_state_info_free(in);
    } else if (in) {
      abort(); /* a failed parse must not hand out an info */
    }
  }
  return 0;
}
