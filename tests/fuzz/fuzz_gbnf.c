/* fuzz_gbnf.c — libFuzzer target: GBNF text (up to the first NUL; the bytes after it choose the
 * tokens of a walk) never crashes, leaks or hangs the parser, and a grammar it accepts drives a
 * matcher whose masks equal brute force (fuzz_grammar_common.h). */
#include "fuzz_grammar_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static lm_grammar_vocab *v;
  if (!v) v = fz_vocab();
  if (size > 16384) return 0;
  const uint8_t *nul = memchr(data, 0, size);
  size_t glen = nul ? (size_t)(nul - data) : size;
  lm_grammar *g = NULL;
  if (lm_grammar_from_gbnf((const char *)data, glen, &g) != LM_OK) return 0;
  char out[2048];
  size_t n;
  const uint8_t *choice = nul ? nul + 1 : data;
  fz_walk(g, v, choice, nul ? size - glen - 1 : size, 24, out, sizeof out, &n);
  lm_grammar_free(g);
  return 0;
}
