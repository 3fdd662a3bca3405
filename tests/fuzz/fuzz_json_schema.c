/* fuzz_json_schema.c — libFuzzer target: any bytes as a JSON Schema never crash, leak or hang the
 * converter (hostile nesting, sizes and references are refused with a message); a schema it
 * accepts drives a matcher whose masks equal brute force, and a walk that ends complete is JSON
 * that jansson parses. */
#include <jansson.h>

#include "fuzz_grammar_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static lm_grammar_vocab *v;
  if (!v) v = fz_vocab();
  if (size > 65536) return 0;
  lm_grammar *g = NULL;
  if (lm_grammar_from_json_schema((const char *)data, size, &g) != LM_OK) return 0;
  char out[4096];
  size_t n;
  if (fz_walk(g, v, data, size, 48, out, sizeof out, &n) && n < sizeof out) {
    json_error_t err;
    json_t *doc = json_loadb(out, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &err);
    /* Numbers past what a double holds are valid JSON that jansson refuses; the grammar caps
     * them, so any refusal here is a real error. */
    if (!doc) {
      fprintf(stderr, "complete but not JSON (%s): %.*s\n", err.text, (int)n, out);
      abort();
    }
    json_decref(doc);
  }
  lm_grammar_free(g);
  return 0;
}
