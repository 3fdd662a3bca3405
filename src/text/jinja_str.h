/* jinja_str.h — byte buffers and the Python string semantics chat templates rely on.
 *
 * Templates are Python programs in disguise: `trim` is str.strip() (all Unicode whitespace), len()
 * and slices count code points, and printed floats follow repr(). These helpers give the
 * interpreter and the output parsers one shared, byte-exact definition of each. Strings are UTF-8;
 * an invalid byte is treated as one code point of its own (kept as is), so no input is ever
 * rejected or altered by decoding. */
#ifndef LM_TEXT_JINJA_STR_H
#define LM_TEXT_JINJA_STR_H

#include <stddef.h>
#include <stdint.h>

#include "lumen.h"

/* A growable byte buffer, always NUL-terminated when data != NULL. `cap_limit` (0 = none) bounds
 * len: appends past it fail with LM_ERR_INVALID so runaway output is reported instead of exhausting
 * memory. */
typedef struct lm_jbuf {
  char *data;
  size_t len, cap;
  size_t cap_limit;
} lm_jbuf;

lm_status lm_jbuf_put(lm_jbuf *b, const char *s, size_t n);
lm_status lm_jbuf_puts(lm_jbuf *b, const char *s);
lm_status lm_jbuf_putc(lm_jbuf *b, char c);
lm_status lm_jbuf_printf(lm_jbuf *b, const char *fmt, ...);
/* Frees the bytes; the buffer can be reused after. NULL-safe. */
void lm_jbuf_free(lm_jbuf *b);
/* Hands the bytes to the caller (free() them); never NULL on LM_OK, "" for an empty buffer. */
lm_status lm_jbuf_take(lm_jbuf *b, char **out);

/* Decodes one code point at s[0..n) (n > 0); returns its byte length (1..4). An invalid or
 * truncated sequence decodes as 1 byte with *cp = LM_JUTF8_RAW + byte, a value outside Unicode that
 * lm_jutf8_put() turns back into the same byte, so callers never alter what they do not understand.
 */
#define LM_JUTF8_RAW 0x110000u
size_t lm_jutf8_next(const char *s, size_t n, uint32_t *cp);
/* Byte length of the last complete-or-invalid code point that ends at s[n) (n > 0). */
size_t lm_jutf8_prev(const char *s, size_t n);
/* Encodes cp into out (4 bytes room); returns the byte count. LM_JUTF8_RAW + b writes the byte b.
 */
size_t lm_jutf8_put(uint32_t cp, char *out);
/* Number of code points in s[0..n). */
size_t lm_jutf8_count(const char *s, size_t n);
/* Byte offset of code point index `idx` (clamped to n). */
size_t lm_jutf8_offset(const char *s, size_t n, size_t idx);
/* Length of an incomplete UTF-8 sequence at the end of s[0..n) (0 if the tail is complete). */
size_t lm_jutf8_incomplete_tail(const char *s, size_t n);

/* Python str.isspace() for one code point. */
int lm_py_isspace(uint32_t cp);
/* Python str.isprintable() for one code point (repr() escapes the others). */
int lm_py_isprintable(uint32_t cp);
/* Byte length of the leading / trailing Python whitespace of s[0..n). */
size_t lm_py_lspace(const char *s, size_t n);
size_t lm_py_rspace(const char *s, size_t n);

/* Python repr(float): the shortest digits that round-trip, "1e-05", "100.0", "1e+16", "inf", "nan".
 * out needs 32 bytes; returns the length. */
size_t lm_py_float_repr(double x, char *out);

/* Appends s with Python str.upper() / str.lower() applied per code point (simple case mapping). */
lm_status lm_jbuf_put_case(lm_jbuf *b, const char *s, size_t n, int upper);
/* Appends a Python repr() of the string s (quotes chosen as Python does). */
lm_status lm_jbuf_put_pyrepr(lm_jbuf *b, const char *s, size_t n);
/* Appends s as the body of a JSON string (no quotes): escapes ", \, control characters; invalid
 * UTF-8 bytes become U+FFFD so the result is always valid JSON. ascii_only also escapes non-ASCII
 * (\uXXXX). */
lm_status lm_jbuf_put_json_str(lm_jbuf *b, const char *s, size_t n, int ascii_only);

#endif
