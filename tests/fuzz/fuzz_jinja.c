/* fuzz_jinja.c — libFuzzer target for the template interpreter: any bytes as a template must
 * compile or fail with a status, and a compiled template must render or fail within tight limits
 * against a chat-shaped context. Also runs the exact JSON reader on the same bytes.
 *
 * Seeds in tests/fuzz/seeds/jinja/ hold chains just past the parser's height cap (operators,
 * filters, calls, tests, subscripts) and macro recursion past the evaluation cap, so mutations
 * start at the limits rather than having to grow 300-term chains by chance: run with
 * `build-fuzz/fuzz_jinja -max_len=65536 CORPUS_DIR tests/fuzz/seeds/jinja`. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja.h"

static const char CTX[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \" sys \"}, {\"role\": \"user\", "
    "\"content\": [{\"type\": "
    "\"text\", \"text\": \"hi\"}, {\"type\": \"image\"}]}, {\"role\": \"assistant\", \"content\": "
    "\"ok\", "
    "\"reasoning_content\": \"r\", \"tool_calls\": [{\"id\": \"c\", \"function\": {\"name\": "
    "\"f\", \"arguments\": "
    "{\"a\": 1, \"b\": [1.5, null, true]}}}]}, {\"role\": \"tool\", \"tool_call_id\": \"c\", "
    "\"content\": \"x\"}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": "
    "{\"type\": \"object\"}}}],"
    " \"add_generation_prompt\": true, \"bos_token\": \"<bos>\", \"n\": 12345678901234567890}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  lm_jarena *a;
  if (lm_jarena_create(16u << 20, &a) != LM_OK) return 0;
  lm_jv v;
  lm_jv_parse_json(a, (const char *)data, size, &v);
  lm_jinja_template *t;
  if (lm_jinja_compile((const char *)data, size, NULL, &t) == LM_OK) {
    lm_jv vars;
    if (lm_jv_parse_json(a, CTX, strlen(CTX), &vars) != LM_OK) abort();
    lm_jinja_limits lim = {1u << 20, 16u << 20, 200000, 40};
    char *out = NULL;
    size_t len = 0;
    if (lm_jinja_render(t, a, vars, &lim, &out, &len) == LM_OK) {
      if (!out || strlen(out) > len || len > lim.max_output) abort();
      free(out);
    }
    lm_jinja_free(t);
  }
  lm_jarena_free(a);
  return 0;
}
