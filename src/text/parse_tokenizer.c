/* parse_tokenizer.c — the Gemma 4 control-token ids of a loaded tokenizer, looked up by their text.
 */
#include "text/parse.h"
#include "text/tokenizer.h"

static int32_t find(const void *ctx, const char *text, size_t len) {
  return lm_tokenizer_find(ctx, text, len);
}

lm_status lm_parser_tokens_from_tokenizer(const struct lm_tokenizer *t, lm_parser_tokens *out) {
  return lm_parser_tokens_gemma4(find, t, out);
}
