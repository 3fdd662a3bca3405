/* buf.c — growable byte buffers (buf.h). */
#include "base/buf.h"

#include <stdlib.h>
#include <string.h>

#include "base/status.h"

lm_status lm_buf_append(char **p, size_t *len, size_t *cap, size_t min_cap, const void *s,
                        size_t n) {
  if (*len + n + 1 > *cap) {
    size_t c = *cap ? *cap : min_cap;
    while (c < *len + n + 1)
      c *= 2;
    char *q = realloc(*p, c);
    if (!q) return LM_ERRF(LM_ERR_NOMEM, "out of memory (a %zu-byte buffer)", c);
    *p = q;
    *cap = c;
  }
  if (n) memcpy(*p + *len, s, n);
  *len += n;
  (*p)[*len] = '\0';
  return LM_OK;
}
