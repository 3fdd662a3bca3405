/* utf8.c — UTF-8 validation, decoding and maximal-subpart repair (see utf8.h). */
#include "text/utf8.h"

#include <stdlib.h>
#include <string.h>

#include "base/status.h"

/* Second-byte bounds per lead byte (RFC 3629 table): E0 excludes overlongs, ED excludes
 * surrogates, F0 excludes overlongs, F4 stops at U+10FFFF. Later bytes are always 80..BF. */
size_t lm_utf8_next(const char *s, size_t n, int32_t *cp) {
  const uint8_t *p = (const uint8_t *)s;
  uint8_t b0 = p[0], lo = 0x80, hi = 0xBF;
  size_t need;
  uint32_t c;
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  }
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1, c = b0 & 0x1Fu;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2, c = b0 & 0x0Fu;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3, c = b0 & 0x07u;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    *cp = -1; /* 80..C1 and F5..FF never start a sequence */
    return 1;
  }
  for (size_t i = 1; i <= need; i++) {
    if (i >= n || p[i] < lo || p[i] > hi) {
      *cp = -1; /* the lead plus the good continuation bytes so far is one maximal subpart */
      return i;
    }
    lo = 0x80, hi = 0xBF;
    c = (c << 6) | (p[i] & 0x3Fu);
  }
  *cp = (int32_t)c;
  return need + 1;
}

int lm_utf8_valid(const char *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    /* ASCII fast path, 8 bytes at a time */
    if (i + 8 <= n) {
      uint64_t w;
      memcpy(&w, s + i, 8);
      if (!(w & 0x8080808080808080ull)) {
        i += 8;
        continue;
      }
    }
    if ((uint8_t)s[i] < 0x80) {
      i++;
      continue;
    }
    int32_t cp;
    size_t k = lm_utf8_next(s + i, n - i, &cp);
    if (cp < 0) return 0;
    i += k;
  }
  return 1;
}

size_t lm_utf8_encode(uint32_t cp, char out[4]) {
  if (cp < 0x80) {
    out[0] = (char)cp;
    return 1;
  }
  if (cp < 0x800) {
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp >= 0xD800 && cp <= 0xDFFF) return 0;
  if (cp < 0x10000) {
    out[0] = (char)(0xE0 | (cp >> 12));
    out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
  }
  if (cp > 0x10FFFF) return 0;
  out[0] = (char)(0xF0 | (cp >> 18));
  out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
  out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
  out[3] = (char)(0x80 | (cp & 0x3F));
  return 4;
}

static size_t seq_len_of_lead(uint8_t b) {
  if (b >= 0xC2 && b <= 0xDF) return 2;
  if (b >= 0xE0 && b <= 0xEF) return 3;
  if (b >= 0xF0 && b <= 0xF4) return 4;
  return 0;
}

size_t lm_utf8_incomplete_tail(const char *s, size_t n) {
  const uint8_t *p = (const uint8_t *)s;
  for (size_t k = 1; k <= 3 && k <= n; k++) {
    uint8_t b = p[n - k];
    if (b >= 0x80 && b <= 0xBF) continue; /* a continuation byte: the lead is further back */
    size_t need = seq_len_of_lead(b);
    if (need <= k) return 0; /* ASCII, a bad byte, or a sequence with all its bytes present */
    int32_t cp;
    /* the tail is held back only if every byte so far fits the lead's pattern */
    return lm_utf8_next(s + n - k, k, &cp) == k ? k : 0;
  }
  return 0;
}

lm_status lm_utf8_sanitize(const char *s, size_t n, char **out, size_t *out_len) {
  /* Each bad byte becomes at most 3 bytes, so 3n + 1 always suffices. */
  char *o = malloc(n * 3 + 1);
  if (!o) return LM_ERRF(LM_ERR_NOMEM, "utf8: out of memory repairing %zu bytes", n);
  size_t i = 0, w = 0;
  while (i < n) {
    int32_t cp;
    size_t k = lm_utf8_next(s + i, n - i, &cp);
    if (cp < 0) {
      memcpy(o + w, LM_UTF8_REPLACEMENT, 3);
      w += 3;
    } else {
      memcpy(o + w, s + i, k);
      w += k;
    }
    i += k;
  }
  o[w] = '\0';
  *out = o;
  *out_len = w;
  return LM_OK;
}
