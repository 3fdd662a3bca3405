/* tokenizer_json.c — a strict, streaming JSON scanner (RFC 8259) for tokenizer.json.
 *
 * Why not jansson for everything: building a DOM of Gemma's 33 MB file (262k vocab keys, 515k
 * merge arrays, ~1.3M strings) takes ~0.95 s here before any work is done. This scanner walks the
 * bytes once and hands vocab entries and merge strings straight to the tokenizer's own tables;
 * the small, structured parts (normalizer, pre_tokenizer, added_tokens, ...) are cut out as byte
 * spans and parsed by jansson. Every error names the file and byte offset. The caller has
 * checked that the whole input is valid UTF-8, so raw string bytes need no re-validation. */
#include <stdio.h>
#include <string.h>

#include "text/tokenizer_impl.h"
#include "text/utf8.h"

#define LM_TJS_MAX_DEPTH 128

size_t lm_tjs_offset(const lm_tjs *j) { return (size_t)(j->p - j->base); }

static lm_status bad(const lm_tjs *j, const char *what) {
  return LM_ERRF(LM_ERR_CORRUPT, "%s: invalid JSON at byte %zu: %s", j->name, lm_tjs_offset(j),
                 what);
}

static void skip_ws(lm_tjs *j) {
  while (j->p < j->end && (*j->p == ' ' || *j->p == '\n' || *j->p == '\r' || *j->p == '\t'))
    j->p++;
}

int lm_tjs_peek(lm_tjs *j) {
  skip_ws(j);
  return j->p < j->end ? (unsigned char)*j->p : -1;
}

lm_status lm_tjs_expect(lm_tjs *j, char c) {
  if (lm_tjs_peek(j) != (unsigned char)c) {
    char msg[32];
    snprintf(msg, sizeof msg, "expected '%c'", c);
    return bad(j, msg);
  }
  j->p++;
  return LM_OK;
}

static int hex4(const char *p, uint32_t *v) {
  uint32_t x = 0;
  for (int i = 0; i < 4; i++) {
    char c = p[i];
    x <<= 4;
    if (c >= '0' && c <= '9')
      x |= (uint32_t)(c - '0');
    else if (c >= 'a' && c <= 'f')
      x |= (uint32_t)(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F')
      x |= (uint32_t)(c - 'A' + 10);
    else
      return 0;
  }
  *v = x;
  return 1;
}

/* \uXXXX, with a following \uXXXX for a surrogate pair; lone surrogates are rejected (as
 * serde_json does), so every decoded string is valid UTF-8. */
static lm_status unicode_escape(lm_tjs *j, lm_tbuf *out) {
  uint32_t cp, lo;
  if (j->end - j->p < 6 || !hex4(j->p + 2, &cp)) return bad(j, "bad \\u escape");
  j->p += 6;
  if (cp >= 0xDC00 && cp <= 0xDFFF) return bad(j, "lone low surrogate in \\u escape");
  if (cp >= 0xD800 && cp <= 0xDBFF) {
    if (j->end - j->p < 6 || j->p[0] != '\\' || j->p[1] != 'u' || !hex4(j->p + 2, &lo) ||
        lo < 0xDC00 || lo > 0xDFFF)
      return bad(j, "lone high surrogate in \\u escape");
    j->p += 6;
    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
  }
  char u[4];
  size_t k = lm_utf8_encode(cp, u);
  return out ? lm_tbuf_put(out, u, k) : LM_OK;
}

static lm_status simple_escape(lm_tjs *j, lm_tbuf *out) {
  char c;
  switch (j->p[1]) {
  case '"': c = '"'; break;
  case '\\': c = '\\'; break;
  case '/': c = '/'; break;
  case 'b': c = '\b'; break;
  case 'f': c = '\f'; break;
  case 'n': c = '\n'; break;
  case 'r': c = '\r'; break;
  case 't': c = '\t'; break;
  default: return bad(j, "bad escape in string");
  }
  j->p += 2;
  return out ? lm_tbuf_put(out, &c, 1) : LM_OK;
}

/* Decodes a string; out == NULL only checks it. */
static lm_status scan_string(lm_tjs *j, lm_tbuf *out) {
  LM_TRY(lm_tjs_expect(j, '"'));
  for (;;) {
    const char *q = j->p;
    while (q < j->end && *q != '"' && *q != '\\' && (unsigned char)*q >= 0x20)
      q++;
    if (out) LM_TRY(lm_tbuf_put(out, j->p, (size_t)(q - j->p)));
    j->p = q;
    if (q >= j->end) return bad(j, "unterminated string");
    if (*q == '"') {
      j->p++;
      return LM_OK;
    }
    if ((unsigned char)*q < 0x20) return bad(j, "control character in string");
    if (j->end - q < 2) return bad(j, "unterminated escape");
    if (q[1] == 'u')
      LM_TRY(unicode_escape(j, out));
    else
      LM_TRY(simple_escape(j, out));
  }
}

lm_status lm_tjs_string(lm_tjs *j, lm_tbuf *out) { return scan_string(j, out); }

static int is_digit(int c) { return c >= '0' && c <= '9'; }

/* number = [-] int [frac] [exp]; *is_int tells whether frac and exp are absent. */
static lm_status scan_number(lm_tjs *j, int *is_int) {
  const char *p = j->p;
  if (p < j->end && *p == '-') p++;
  if (p >= j->end || !is_digit(*p)) return bad(j, "bad number");
  if (*p == '0')
    p++;
  else
    while (p < j->end && is_digit(*p))
      p++;
  *is_int = 1;
  if (p < j->end && *p == '.') {
    *is_int = 0;
    p++;
    if (p >= j->end || !is_digit(*p)) return bad(j, "bad number fraction");
    while (p < j->end && is_digit(*p))
      p++;
  }
  if (p < j->end && (*p == 'e' || *p == 'E')) {
    *is_int = 0;
    p++;
    if (p < j->end && (*p == '+' || *p == '-')) p++;
    if (p >= j->end || !is_digit(*p)) return bad(j, "bad number exponent");
    while (p < j->end && is_digit(*p))
      p++;
  }
  j->p = p;
  return LM_OK;
}

lm_status lm_tjs_int(lm_tjs *j, int64_t *v) {
  if (lm_tjs_peek(j) < 0) return bad(j, "expected a number");
  const char *start = j->p;
  int is_int;
  LM_TRY(scan_number(j, &is_int));
  if (!is_int) return bad(j, "expected an integer");
  int neg = *start == '-';
  int64_t x = 0;
  for (const char *p = start + neg; p < j->p; p++) {
    if (x > (INT64_MAX - 9) / 10) return bad(j, "integer out of range");
    x = x * 10 + (*p - '0');
  }
  *v = neg ? -x : x;
  return LM_OK;
}

static lm_status scan_literal(lm_tjs *j, const char *lit) {
  size_t n = strlen(lit);
  if ((size_t)(j->end - j->p) < n || memcmp(j->p, lit, n)) return bad(j, "unexpected token");
  j->p += n;
  return LM_OK;
}

lm_status lm_tjs_obj_begin(lm_tjs *j, int *more) {
  LM_TRY(lm_tjs_expect(j, '{'));
  *more = lm_tjs_peek(j) != '}';
  if (!*more) j->p++;
  return LM_OK;
}

lm_status lm_tjs_arr_begin(lm_tjs *j, int *more) {
  LM_TRY(lm_tjs_expect(j, '['));
  *more = lm_tjs_peek(j) != ']';
  if (!*more) j->p++;
  return LM_OK;
}

lm_status lm_tjs_next(lm_tjs *j, char close, int *more) {
  int c = lm_tjs_peek(j);
  if (c == ',') {
    j->p++;
    *more = 1;
    return LM_OK;
  }
  if (c == (unsigned char)close) {
    j->p++;
    *more = 0;
    return LM_OK;
  }
  return bad(j, close == '}' ? "expected ',' or '}'" : "expected ',' or ']'");
}

static lm_status skip_value(lm_tjs *j, int depth);

static lm_status skip_container(lm_tjs *j, int depth, int is_obj) {
  int more;
  if (depth >= LM_TJS_MAX_DEPTH) return bad(j, "nesting too deep");
  LM_TRY(is_obj ? lm_tjs_obj_begin(j, &more) : lm_tjs_arr_begin(j, &more));
  while (more) {
    if (is_obj) {
      if (lm_tjs_peek(j) != '"') return bad(j, "expected a key");
      LM_TRY(scan_string(j, NULL));
      LM_TRY(lm_tjs_expect(j, ':'));
    }
    LM_TRY(skip_value(j, depth + 1));
    LM_TRY(lm_tjs_next(j, is_obj ? '}' : ']', &more));
  }
  return LM_OK;
}

static lm_status skip_value(lm_tjs *j, int depth) {
  int is_int;
  switch (lm_tjs_peek(j)) {
  case '{': return skip_container(j, depth, 1);
  case '[': return skip_container(j, depth, 0);
  case '"': return scan_string(j, NULL);
  case 't': return scan_literal(j, "true");
  case 'f': return scan_literal(j, "false");
  case 'n': return scan_literal(j, "null");
  case -1: return bad(j, "unexpected end of input");
  default: return scan_number(j, &is_int);
  }
}

lm_status lm_tjs_skip(lm_tjs *j) { return skip_value(j, 0); }

lm_status lm_tjs_value(lm_tjs *j, json_t **out) {
  lm_tjs_peek(j);
  const char *start = j->p;
  LM_TRY(skip_value(j, 0));
  json_error_t e;
  *out = json_loadb(start, (size_t)(j->p - start), JSON_DECODE_ANY | JSON_ALLOW_NUL, &e);
  if (!*out)
    return LM_ERRF(LM_ERR_CORRUPT, "%s: invalid JSON at byte %zu: %s", j->name,
                   (size_t)(start - j->base) + (e.position > 0 ? (size_t)e.position : 0), e.text);
  return LM_OK;
}

lm_status lm_tjs_end(lm_tjs *j) {
  if (lm_tjs_peek(j) != -1) return bad(j, "trailing data after the top-level value");
  return LM_OK;
}
