/* utf8.h — UTF-8 validation, decoding and repair.
 *
 * "Valid" means RFC 3629 UTF-8: no overlong forms, no surrogates (U+D800..DFFF), nothing above
 * U+10FFFF. Invalid input is repaired the way Python's `bytes.decode("utf-8", "replace")`, Rust's
 * `String::from_utf8_lossy` and WHATWG decoders do it ("substitution of maximal subparts",
 * Unicode §3.9 U+FFFD substitution): each maximal prefix of a would-be-valid sequence, or each
 * lone bad byte, becomes one U+FFFD. All functions are pure and thread-safe. */
#ifndef LM_TEXT_UTF8_H
#define LM_TEXT_UTF8_H

#include <stddef.h>
#include <stdint.h>

#include "lumen.h"

#define LM_UTF8_REPLACEMENT "\xEF\xBF\xBD" /* U+FFFD, 3 bytes */

/* 1 if s[0..n) is valid UTF-8 (n == 0 is valid; s may be NULL then), else 0. */
int lm_utf8_valid(const char *s, size_t n);

/* Decodes the sequence at s (n >= 1 bytes available). Returns the number of bytes it spans
 * (1..4) and sets *cp to the code point, or, for an invalid sequence, returns the length of its
 * maximal subpart (1..3) and sets *cp = -1. */
size_t lm_utf8_next(const char *s, size_t n, int32_t *cp);

/* Writes the UTF-8 form of cp (<= U+10FFFF, not a surrogate) to out; returns its length (1..4),
 * or 0 for a value that has none. */
size_t lm_utf8_encode(uint32_t cp, char out[4]);

/* Number of bytes at the end of s[0..n) that form a valid but unfinished sequence (0..3): the part
 * a streaming decoder must hold back until more bytes arrive. */
size_t lm_utf8_incomplete_tail(const char *s, size_t n);

/* Copies s[0..n) to a new malloc'ed, NUL-terminated buffer with every invalid sequence replaced by
 * U+FFFD (see above). *out must be freed by the caller. Errors: LM_ERR_NOMEM. */
lm_status lm_utf8_sanitize(const char *s, size_t n, char **out, size_t *out_len);

#endif
