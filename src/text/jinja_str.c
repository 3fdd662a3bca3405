/* jinja_str.c — byte buffers, UTF-8 walking and Python string/number printing rules. */
#include "text/jinja_str.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "base/status.h"

/* ---- buffer -------------------------------------------------------------------------------- */

static lm_status jbuf_reserve(lm_jbuf *b, size_t extra) {
  if (b->cap_limit && (extra > b->cap_limit || b->len > b->cap_limit - extra))
    return LM_ERRF(LM_ERR_INVALID, "output larger than the limit of %zu bytes", b->cap_limit);
  if (b->len + extra + 1 <= b->cap) return LM_OK;
  size_t cap = b->cap ? b->cap : 64;
  while (cap < b->len + extra + 1) {
    if (cap > SIZE_MAX / 2) return LM_ERRF(LM_ERR_NOMEM, "buffer size overflow");
    cap *= 2;
  }
  char *p = realloc(b->data, cap);
  if (!p) return LM_ERRF(LM_ERR_NOMEM, "out of memory (%zu bytes)", cap);
  b->data = p;
  b->cap = cap;
  return LM_OK;
}

lm_status lm_jbuf_put(lm_jbuf *b, const char *s, size_t n) {
  LM_TRY(jbuf_reserve(b, n));
  if (n) memcpy(b->data + b->len, s, n);
  b->len += n;
  b->data[b->len] = '\0';
  return LM_OK;
}

lm_status lm_jbuf_puts(lm_jbuf *b, const char *s) { return lm_jbuf_put(b, s, strlen(s)); }

lm_status lm_jbuf_putc(lm_jbuf *b, char c) { return lm_jbuf_put(b, &c, 1); }

lm_status lm_jbuf_printf(lm_jbuf *b, const char *fmt, ...) {
  char tmp[256];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (n < 0) return LM_ERRF(LM_ERR_INVALID, "format error");
  if ((size_t)n < sizeof tmp) return lm_jbuf_put(b, tmp, (size_t)n);
  LM_TRY(jbuf_reserve(b, (size_t)n));
  va_start(ap, fmt);
  vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  b->len += (size_t)n;
  return LM_OK;
}

void lm_jbuf_free(lm_jbuf *b) {
  if (!b) return;
  free(b->data);
  b->data = NULL;
  b->len = b->cap = 0;
}

lm_status lm_jbuf_take(lm_jbuf *b, char **out) {
  if (!b->data) {
    LM_TRY(jbuf_reserve(b, 0));
    b->data[0] = '\0';
  }
  *out = b->data;
  b->data = NULL;
  b->len = b->cap = 0;
  return LM_OK;
}

/* ---- UTF-8 ---------------------------------------------------------------------------------- */

size_t lm_jutf8_next(const char *s, size_t n, uint32_t *cp) {
  const unsigned char *u = (const unsigned char *)s;
  unsigned c = u[0];
  size_t len;
  uint32_t v, min;
  if (c < 0x80) {
    *cp = c;
    return 1;
  } else if (c >= 0xC2 && c <= 0xDF) {
    len = 2, v = c & 0x1F, min = 0x80;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3, v = c & 0x0F, min = 0x800;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4, v = c & 0x07, min = 0x10000;
  } else {
    *cp = LM_JUTF8_RAW + c;
    return 1;
  }
  if (n < len) {
    *cp = LM_JUTF8_RAW + c;
    return 1;
  }
  for (size_t i = 1; i < len; i++) {
    if ((u[i] & 0xC0) != 0x80) {
      *cp = LM_JUTF8_RAW + c;
      return 1;
    }
    v = (v << 6) | (u[i] & 0x3F);
  }
  if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) {
    *cp = LM_JUTF8_RAW + c;
    return 1;
  }
  *cp = v;
  return len;
}

size_t lm_jutf8_prev(const char *s, size_t n) {
  /* Walk back over up to 3 continuation bytes and check that they form one valid sequence. */
  for (size_t k = 2; k <= 4 && k <= n; k++) {
    unsigned char c = (unsigned char)s[n - k];
    if ((c & 0xC0) == 0x80) continue;
    uint32_t cp;
    return lm_jutf8_next(s + n - k, k, &cp) == k ? k : 1;
  }
  return 1;
}

size_t lm_jutf8_put(uint32_t cp, char *out) {
  unsigned char *o = (unsigned char *)out;
  if (cp >= LM_JUTF8_RAW) {
    o[0] = (unsigned char)(cp - LM_JUTF8_RAW);
    return 1;
  }
  if (cp < 0x80) {
    o[0] = (unsigned char)cp;
    return 1;
  }
  if (cp < 0x800) {
    o[0] = (unsigned char)(0xC0 | (cp >> 6));
    o[1] = (unsigned char)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    o[0] = (unsigned char)(0xE0 | (cp >> 12));
    o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[2] = (unsigned char)(0x80 | (cp & 0x3F));
    return 3;
  }
  o[0] = (unsigned char)(0xF0 | (cp >> 18));
  o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
  o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
  o[3] = (unsigned char)(0x80 | (cp & 0x3F));
  return 4;
}

size_t lm_jutf8_count(const char *s, size_t n) {
  size_t count = 0;
  for (size_t i = 0; i < n; count++) {
    uint32_t cp;
    i += lm_jutf8_next(s + i, n - i, &cp);
  }
  return count;
}

size_t lm_jutf8_offset(const char *s, size_t n, size_t idx) {
  size_t i = 0;
  while (idx-- > 0 && i < n) {
    uint32_t cp;
    i += lm_jutf8_next(s + i, n - i, &cp);
  }
  return i;
}

size_t lm_jutf8_incomplete_tail(const char *s, size_t n) {
  /* A lead byte within the last 3 bytes whose sequence runs past the end. */
  for (size_t k = 1; k <= 3 && k <= n; k++) {
    unsigned char c = (unsigned char)s[n - k];
    if ((c & 0xC0) == 0x80) continue;
    size_t need = c >= 0xF0 && c <= 0xF4   ? 4
                  : c >= 0xE0 && c <= 0xEF ? 3
                  : c >= 0xC2 && c <= 0xDF ? 2
                                           : 1;
    if (need <= k) return 0;
    for (size_t i = n - k + 1; i < n; i++)
      if (((unsigned char)s[i] & 0xC0) != 0x80) return 0;
    return k;
  }
  return 0;
}

/* ---- Python character classes ---------------------------------------------------------------- */

int lm_py_isspace(uint32_t cp) {
  /* CPython's _PyUnicode_IsWhitespace: bidi class WS/B/S or category Zs. */
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x1F);
  switch (cp) {
  case 0x85:
  case 0xA0:
  case 0x1680:
  case 0x2028:
  case 0x2029:
  case 0x202F:
  case 0x205F:
  case 0x3000: return 1;
  default: return cp >= 0x2000 && cp <= 0x200A;
  }
}

int lm_py_isprintable(uint32_t cp) {
  if (cp == ' ') return 1;
  if (cp >= LM_JUTF8_RAW) return 0;
  switch (utf8proc_category((utf8proc_int32_t)cp)) {
  case UTF8PROC_CATEGORY_CC:
  case UTF8PROC_CATEGORY_CF:
  case UTF8PROC_CATEGORY_CS:
  case UTF8PROC_CATEGORY_CO:
  case UTF8PROC_CATEGORY_CN:
  case UTF8PROC_CATEGORY_ZL:
  case UTF8PROC_CATEGORY_ZP:
  case UTF8PROC_CATEGORY_ZS: return 0;
  default: return 1;
  }
}

size_t lm_py_lspace(const char *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    uint32_t cp;
    size_t k = lm_jutf8_next(s + i, n - i, &cp);
    if (!lm_py_isspace(cp)) break;
    i += k;
  }
  return i;
}

size_t lm_py_rspace(const char *s, size_t n) {
  size_t end = n;
  while (end > 0) {
    size_t k = lm_jutf8_prev(s, end);
    uint32_t cp;
    lm_jutf8_next(s + end - k, k, &cp);
    if (!lm_py_isspace(cp)) break;
    end -= k;
  }
  return n - end;
}

/* ---- Python float repr ---------------------------------------------------------------------- */

size_t lm_py_float_repr(double x, char *out) {
  if (isnan(x)) return (size_t)sprintf(out, "nan");
  if (isinf(x)) return (size_t)sprintf(out, x < 0 ? "-inf" : "inf");
  if (x == 0) return (size_t)sprintf(out, signbit(x) ? "-0.0" : "0.0");
  /* Shortest round-tripping digits: the correctly rounded p-digit value for the smallest p that
   * reads back exactly is what repr() prints (any p-digit string inside the rounding interval
   * implies the nearest one is too). */
  char tmp[40];
  int p;
  for (p = 1; p <= 17; p++) {
    snprintf(tmp, sizeof tmp, "%.*e", p - 1, x);
    if (strtod(tmp, NULL) == x) break;
  }
  const char *t = tmp;
  char digits[24] = {0};
  size_t nd = 0;
  int neg = 0;
  if (*t == '-') neg = 1, t++;
  for (; *t && *t != 'e'; t++)
    if (*t != '.') digits[nd++] = *t;
  int exp10 = atoi(t + 1), decpt = exp10 + 1;
  size_t o = 0;
  if (neg) out[o++] = '-';
  if (decpt > -4 && decpt <= 16) { /* float_repr_style 'r': fixed notation in this window */
    if (decpt <= 0) {
      out[o++] = '0', out[o++] = '.';
      for (int i = 0; i < -decpt; i++)
        out[o++] = '0';
      memcpy(out + o, digits, nd), o += nd;
    } else if ((size_t)decpt >= nd) {
      memcpy(out + o, digits, nd), o += nd;
      for (size_t i = nd; i < (size_t)decpt; i++)
        out[o++] = '0';
      out[o++] = '.', out[o++] = '0';
    } else {
      memcpy(out + o, digits, (size_t)decpt), o += (size_t)decpt;
      out[o++] = '.';
      memcpy(out + o, digits + decpt, nd - (size_t)decpt), o += nd - (size_t)decpt;
    }
  } else {
    out[o++] = digits[0];
    if (nd > 1) {
      out[o++] = '.';
      memcpy(out + o, digits + 1, nd - 1), o += nd - 1;
    }
    o += (size_t)sprintf(out + o, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
  }
  out[o] = '\0';
  return o;
}

/* ---- case mapping, repr, JSON strings -------------------------------------------------------- */

lm_status lm_jbuf_put_case(lm_jbuf *b, const char *s, size_t n, int upper) {
  for (size_t i = 0; i < n;) {
    uint32_t cp;
    size_t k = lm_jutf8_next(s + i, n - i, &cp);
    if (cp < LM_JUTF8_RAW)
      cp = (uint32_t)(upper ? utf8proc_toupper((utf8proc_int32_t)cp)
                            : utf8proc_tolower((utf8proc_int32_t)cp));
    char enc[4];
    LM_TRY(lm_jbuf_put(b, enc, lm_jutf8_put(cp, enc)));
    i += k;
  }
  return LM_OK;
}

lm_status lm_jbuf_put_pyrepr(lm_jbuf *b, const char *s, size_t n) {
  /* unicode_repr: single quotes unless the text has ' and no ". */
  int has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
  char q = has_sq && !has_dq ? '"' : '\'';
  LM_TRY(lm_jbuf_putc(b, q));
  for (size_t i = 0; i < n;) {
    uint32_t cp;
    size_t k = lm_jutf8_next(s + i, n - i, &cp);
    if (cp == (uint32_t)q || cp == '\\') {
      LM_TRY(lm_jbuf_putc(b, '\\'));
      LM_TRY(lm_jbuf_putc(b, (char)cp));
    } else if (cp == '\n') {
      LM_TRY(lm_jbuf_puts(b, "\\n"));
    } else if (cp == '\r') {
      LM_TRY(lm_jbuf_puts(b, "\\r"));
    } else if (cp == '\t') {
      LM_TRY(lm_jbuf_puts(b, "\\t"));
    } else if (cp >= LM_JUTF8_RAW) { /* an undecodable byte: Python would hold a surrogate escape */
      LM_TRY(lm_jbuf_printf(b, "\\udc%02x", (unsigned)(cp - LM_JUTF8_RAW)));
    } else if (!lm_py_isprintable(cp)) {
      if (cp < 0x100)
        LM_TRY(lm_jbuf_printf(b, "\\x%02x", (unsigned)cp));
      else if (cp < 0x10000)
        LM_TRY(lm_jbuf_printf(b, "\\u%04x", (unsigned)cp));
      else
        LM_TRY(lm_jbuf_printf(b, "\\U%08x", (unsigned)cp));
    } else {
      LM_TRY(lm_jbuf_put(b, s + i, k));
    }
    i += k;
  }
  return lm_jbuf_putc(b, q);
}

lm_status lm_jbuf_put_json_str(lm_jbuf *b, const char *s, size_t n, int ascii_only) {
  for (size_t i = 0; i < n;) {
    uint32_t cp;
    size_t k = lm_jutf8_next(s + i, n - i, &cp);
    if (cp >= LM_JUTF8_RAW) cp = 0xFFFD;
    switch (cp) {
    case '"': LM_TRY(lm_jbuf_puts(b, "\\\"")); break;
    case '\\': LM_TRY(lm_jbuf_puts(b, "\\\\")); break;
    case '\n': LM_TRY(lm_jbuf_puts(b, "\\n")); break;
    case '\r': LM_TRY(lm_jbuf_puts(b, "\\r")); break;
    case '\t': LM_TRY(lm_jbuf_puts(b, "\\t")); break;
    case '\b': LM_TRY(lm_jbuf_puts(b, "\\b")); break;
    case '\f': LM_TRY(lm_jbuf_puts(b, "\\f")); break;
    default:
      if (cp < 0x20 || (ascii_only && cp >= 0x7F && cp < 0x10000 && cp != 0x7F)) {
        LM_TRY(lm_jbuf_printf(b, "\\u%04x", (unsigned)cp));
      } else if (ascii_only &&
                 cp >= 0x10000) { /* a UTF-16 surrogate pair, as json.dumps writes it */
        uint32_t v = cp - 0x10000;
        LM_TRY(lm_jbuf_printf(b, "\\u%04x\\u%04x", 0xD800 + (unsigned)(v >> 10),
                              0xDC00 + (unsigned)(v & 0x3FF)));
      } else {
        char enc[4];
        LM_TRY(lm_jbuf_put(b, enc, lm_jutf8_put(cp, enc)));
      }
    }
    i += k;
  }
  return LM_OK;
}
