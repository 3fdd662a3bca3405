/* buf.h — growable byte buffers: the one growth rule shared by every text/byte accumulator
 * (generation text, SSE frames). */
#ifndef LM_BASE_BUF_H
#define LM_BASE_BUF_H

#include <stddef.h>

#include "lumen.h"

/* Appends s[0..n) to the buffer *p of length *len and capacity *cap (doubling, at least
 * `min_cap`), keeping it NUL-terminated. On failure the buffer is unchanged. */
lm_status lm_buf_append(char **p, size_t *len, size_t *cap, size_t min_cap, const void *s,
                        size_t n);

#endif
