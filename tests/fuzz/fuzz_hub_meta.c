/* fuzz_hub_meta.c — libFuzzer target: what a hub server sends never crashes, overruns or leaks:
 * the bytes as the revision API's JSON, then as header lines (split at newlines) of one
 * response; every etag and file name that comes out must be one the cache can safely use. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "hub/hub_meta.h"
#include "hub/hub_ref.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  lm_hub_revision r;
  if (lm_hub_revision_parse((const char *)data, size, &r) == LM_OK) {
    for (size_t i = 0; i < r.n_files; i++)
      if (!lm_hub_file_valid(r.files[i])) abort();
    lm_hub_revision_free(&r);
  }
  lm_hub_head h;
  lm_hub_head_reset(&h);
  const char *p = (const char *)data, *end = p + size;
  while (p < end) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    size_t n = nl ? (size_t)(nl - p) + 1 : (size_t)(end - p);
    lm_hub_head_line(&h, p, n);
    p += n;
  }
  lm_hub_head_finish(&h);
  char out[LM_HUB_ETAG_MAX + 1];
  if (h.etag[0] && !lm_hub_etag_normalize(h.etag, strlen(h.etag), out, sizeof out)) abort();
  if (h.commit[0] && !lm_hub_is_commit(h.commit)) abort();
  return 0;
}
