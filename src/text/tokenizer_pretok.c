/* tokenizer_pretok.c — patterns (literal or PCRE2 regex), the Split and ByteLevel
 * pre-tokenizers, and GPT-2's byte <-> unicode table.
 *
 * HF compiles patterns with Oniguruma; lumen uses PCRE2 with PCRE2_UTF | PCRE2_UCP, which gives
 * \s \w \d \p{..} their Unicode meanings and agrees with Oniguruma on the patterns of Llama 3 and
 * Qwen 3 (checked by the golden test). Literal String patterns are searched with memmem, as HF
 * escapes them into a regex that can only match literally. */
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer_impl.h"
#include "text/utf8.h"

/* ---- patterns ----------------------------------------------------------------------------- */
lm_status lm_tok_pattern_literal(lm_tok_pattern *p, const char *s, size_t n) {
  memset(p, 0, sizeof *p);
  p->lit = malloc(n + 1);
  if (!p->lit) return LM_ERRF(LM_ERR_NOMEM, "tokenizer: out of memory");
  memcpy(p->lit, s, n);
  p->lit[n] = '\0';
  p->lit_len = n;
  return LM_OK;
}

/* Unicode White_Space, which is Oniguruma's \s. PCRE2 10.42's \s (with UCP) also matches
 * U+180E MONGOLIAN VOWEL SEPARATOR, a format character since Unicode 6.3, so \s and \S are
 * rewritten into explicit classes before compiling. */
#define LM_WHITE_SPACE                                                                             \
  "\\t-\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}"   \
  "\\x{3000}"

static lm_status put_str(lm_tbuf *out, const char *s) { return lm_tbuf_put(out, s, strlen(s)); }

static lm_status translate_regex(const char *src, size_t n, lm_tbuf *out) {
  int in_class = 0;
  for (size_t i = 0; i < n; i++) {
    char c = src[i];
    if (c == '\\' && i + 1 < n) {
      char e = src[++i];
      if (e == 's')
        LM_TRY(put_str(out, in_class ? LM_WHITE_SPACE : "[" LM_WHITE_SPACE "]"));
      else if (e == 'S')
        LM_TRY(put_str(out, in_class ? "\\S\\x{180E}" : "[^" LM_WHITE_SPACE "]"));
      else if (e == 'Q') { /* \Q...\E is literal text */
        const char *end = i + 1 < n ? memmem(src + i + 1, n - i - 1, "\\E", 2) : NULL;
        size_t stop = end ? (size_t)(end - src) + 2 : n;
        LM_TRY(lm_tbuf_put(out, src + i - 1, stop - (i - 1)));
        i = stop - 1;
      } else {
        char esc[2] = {c, e};
        LM_TRY(lm_tbuf_put(out, esc, 2));
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = 1;
      LM_TRY(lm_tbuf_put(out, &c, 1));
      if (i + 1 < n && src[i + 1] == '^') LM_TRY(lm_tbuf_put(out, src + ++i, 1));
      if (i + 1 < n && src[i + 1] == ']')
        LM_TRY(lm_tbuf_put(out, src + ++i, 1)); /* a leading ] is literal */
      continue;
    }
    if (in_class && c == '[' && i + 1 < n && src[i + 1] == ':') { /* [:posix:] inside a class */
      const char *end = memmem(src + i + 2, n - i - 2, ":]", 2);
      size_t stop = end ? (size_t)(end - src) + 2 : n;
      LM_TRY(lm_tbuf_put(out, src + i, stop - i));
      i = stop - 1;
      continue;
    }
    if (in_class && c == ']') in_class = 0;
    LM_TRY(lm_tbuf_put(out, &c, 1));
  }
  return LM_OK;
}

lm_status lm_tok_pattern_regex(lm_tok_pattern *p, const char *src, size_t n, const char *where) {
  int err;
  PCRE2_SIZE at;
  lm_tbuf re = {0};
  memset(p, 0, sizeof *p);
  lm_status s = translate_regex(src, n, &re);
  if (s == LM_OK) s = lm_tbuf_reserve(&re, 0);
  if (s != LM_OK) {
    lm_tbuf_free(&re);
    return s;
  }
  p->re = pcre2_compile((PCRE2_SPTR)re.p, re.n, PCRE2_UTF | PCRE2_UCP, &err, &at, NULL);
  lm_tbuf_free(&re);
  if (!p->re) {
    PCRE2_UCHAR msg[160];
    pcre2_get_error_message(err, msg, sizeof msg);
    return LM_ERRF(LM_ERR_UNSUPPORTED, "%s: regex not supported by PCRE2 at offset %zu: %s", where,
                   (size_t)at, (const char *)msg);
  }
  pcre2_jit_compile(p->re, PCRE2_JIT_COMPLETE); /* without JIT, pcre2_match interprets */
  return LM_OK;
}

void lm_tok_pattern_free(lm_tok_pattern *p) {
  free(p->lit);
  pcre2_code_free(p->re);
  memset(p, 0, sizeof *p);
}

static lm_status find_literal(const lm_tok_pattern *p, const char *s, size_t n, lm_tspans *out) {
  size_t prev = 0;
  if (p->lit_len == 0) return lm_tspans_push(out, 0, n, 0); /* an empty pattern matches nothing */
  for (size_t i = 0; i + p->lit_len <= n;) {
    const char *q = memmem(s + i, n - i, p->lit, p->lit_len);
    if (!q) break;
    size_t at = (size_t)(q - s);
    if (at > prev) LM_TRY(lm_tspans_push(out, prev, at - prev, 0));
    LM_TRY(lm_tspans_push(out, at, p->lit_len, 1));
    prev = i = at + p->lit_len;
  }
  if (prev < n) LM_TRY(lm_tspans_push(out, prev, n - prev, 0));
  return LM_OK;
}

static int run_regex(const pcre2_code *re, const char *s, size_t n, size_t from,
                     pcre2_match_data *md) {
  /* input is valid UTF-8 (checked or repaired on entry), so PCRE2 need not check it again */
  int rc = pcre2_match(re, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK, md, NULL);
  /* the JIT's default 32 KiB stack can run out on pathological input; the interpreter keeps its
   * frames on the heap */
  if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
    rc = pcre2_match(re, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, NULL);
  return rc;
}

static lm_status find_regex(const lm_tok_pattern *p, const char *s, size_t n, lm_tspans *out) {
  pcre2_match_data *md = pcre2_match_data_create(1, NULL);
  if (!md) return LM_ERRF(LM_ERR_NOMEM, "tokenizer: out of memory (regex match data)");
  size_t prev = 0, from = 0;
  lm_status st = LM_OK;
  while (from <= n && st == LM_OK) {
    int rc = run_regex(p->re, s, n, from, md);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[120];
      pcre2_get_error_message(rc, msg, sizeof msg);
      st = LM_ERRF(LM_ERR_CORRUPT, "tokenizer: regex match failed at byte %zu: %s", from,
                   (const char *)msg);
      break;
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    size_t a = ov[0], b = ov[1];
    if (b <= a) { /* an empty match splits nothing: step over one character */
      if (a >= n) break;
      int32_t cp;
      from = a + lm_utf8_next(s + a, n - a, &cp);
      continue;
    }
    if (a > prev) st = lm_tspans_push(out, prev, a - prev, 0);
    if (st == LM_OK) st = lm_tspans_push(out, a, b - a, 1);
    prev = from = b;
  }
  if (st == LM_OK && prev < n) st = lm_tspans_push(out, prev, n - prev, 0);
  pcre2_match_data_free(md);
  return st;
}

lm_status lm_tok_pattern_find(const lm_tok_pattern *p, const char *s, size_t n, lm_tspans *out) {
  out->n = 0;
  if (n == 0) return LM_OK;
  return p->re ? find_regex(p, s, n, out) : find_literal(p, s, n, out);
}

/* ---- GPT-2 byte table (HF pre_tokenizers/byte_level.rs bytes_char) ------------------------ */
/* Printable bytes ('!'..'~', 0xA1..0xAC, 0xAE..0xFF) map to themselves; the other 68 get
 * U+0100.. in byte order: 0x00..0x20 -> +0..32, 0x7F..0xA0 -> +33..66, 0xAD -> +67. */
uint32_t lm_tok_byte_char(uint8_t b) {
  if (b <= 0x20) return 256u + b;
  if (b >= 0x7F && b <= 0xA0) return 256u + 33u + (b - 0x7Fu);
  if (b == 0xAD) return 256u + 67u;
  return b;
}

int lm_tok_char_byte(uint32_t cp) {
  if (cp < 256) return (cp <= 0x20 || (cp >= 0x7F && cp <= 0xA0) || cp == 0xAD) ? -1 : (int)cp;
  if (cp <= 256 + 32) return (int)(cp - 256);
  if (cp <= 256 + 66) return (int)(cp - 256 - 33 + 0x7F);
  return cp == 256 + 67 ? 0xAD : -1;
}

/* ---- Split -------------------------------------------------------------------------------- */
/* Folds matches (id 1) and gaps (id 0) of one piece into the behavior's pieces (HF
 * NormalizedString::split); pieces get id 0, removed delimiters are dropped. */
static lm_status split_piece(const lm_tok_pretok *p, size_t base, const lm_tspans *m,
                             lm_tspans *out) {
  int prev_match = 0;
  size_t first = out->n;
  for (size_t i = 0; i < m->n; i++) {
    size_t off = base + m->v[i].off, len = m->v[i].len;
    int is_match = m->v[i].id ^ p->invert;
    int glue = 0;
    switch (p->behavior) {
    case LM_SPLIT_REMOVED:
      if (is_match) continue;
      break;
    case LM_SPLIT_ISOLATED: break;
    case LM_SPLIT_CONTIGUOUS: glue = i > 0 && is_match == prev_match; break;
    case LM_SPLIT_MERGED_PREV: glue = is_match && !prev_match && out->n > first; break;
    case LM_SPLIT_MERGED_NEXT: glue = i > 0 && prev_match && !is_match; break;
    }
    prev_match = is_match;
    if (glue)
      out->v[out->n - 1].len += len;
    else
      LM_TRY(lm_tspans_push(out, off, len, 0));
  }
  return LM_OK;
}

/* MergedWithNext glues a match to what follows; HF folds it from the right, which is the same
 * as gluing each piece that follows a match onto it (a run of matches stays separate pieces). */
static lm_status split_all(const lm_tok_pretok *p, const char *buf, const lm_tspans *in,
                           lm_tspans *out, lm_tspans *m) {
  out->n = 0;
  for (size_t i = 0; i < in->n; i++) {
    LM_TRY(lm_tok_pattern_find(&p->pat, buf + in->v[i].off, in->v[i].len, m));
    LM_TRY(split_piece(p, in->v[i].off, m, out));
  }
  return LM_OK;
}

/* ---- ByteLevel ---------------------------------------------------------------------------- */
static lm_status put_bytelevel(const char *s, size_t n, lm_tbuf *out) {
  LM_TRY(lm_tbuf_reserve(out, n * 2));
  for (size_t i = 0; i < n; i++) {
    uint32_t c = lm_tok_byte_char((uint8_t)s[i]);
    if (c < 0x80)
      out->p[out->n++] = (char)c;
    else {
      out->p[out->n++] = (char)(0xC0 | (c >> 6));
      out->p[out->n++] = (char)(0x80 | (c & 0x3F));
    }
  }
  return LM_OK;
}

static lm_status bytelevel_piece(const lm_tok_pretok *p, const char *s, size_t n, lm_tbuf *out,
                                 lm_tspans *pieces, lm_tbuf *tmp, lm_tspans *m) {
  tmp->n = 0;
  if (p->add_prefix_space && (n == 0 || s[0] != ' ')) LM_TRY(lm_tbuf_put(tmp, " ", 1));
  LM_TRY(lm_tbuf_put(tmp, s, n));
  m->n = 0;
  if (p->use_regex)
    LM_TRY(lm_tok_pattern_find(&p->pat, tmp->p, tmp->n, m));
  else
    LM_TRY(lm_tspans_push(m, 0, tmp->n, 0));
  for (size_t i = 0; i < m->n; i++) {
    size_t start = out->n;
    LM_TRY(put_bytelevel(tmp->p + m->v[i].off, m->v[i].len, out));
    if (out->n > start) LM_TRY(lm_tspans_push(pieces, start, out->n - start, 0));
  }
  return LM_OK;
}

/* Runs the pre-tokenizers on in[0..n): the pieces end in sc->pieces[sc->cur] over
 * sc->pre[sc->cur]. Split only re-slices the text, ByteLevel rewrites it. */
lm_status lm_tok_pretokenize(const lm_tokenizer *t, const char *in, size_t n, lm_tok_scratch *sc) {
  int cur = 0;
  sc->pre[0].n = 0;
  sc->pieces[0].n = 0;
  LM_TRY(lm_tbuf_put(&sc->pre[0], in, n));
  if (n) LM_TRY(lm_tspans_push(&sc->pieces[0], 0, n, 0));
  for (size_t k = 0; k < t->n_pretok; k++) {
    const lm_tok_pretok *p = &t->pretok[k];
    int nxt = !cur;
    if (p->kind == LM_TP_SPLIT) {
      LM_TRY(split_all(p, sc->pre[cur].p, &sc->pieces[cur], &sc->pieces[nxt], &sc->found));
      /* the text stays in pre[cur]: swap it into pre[nxt] */
      lm_tbuf b = sc->pre[cur];
      sc->pre[cur] = sc->pre[nxt];
      sc->pre[nxt] = b;
    } else {
      sc->pre[nxt].n = 0;
      sc->pieces[nxt].n = 0;
      for (size_t i = 0; i < sc->pieces[cur].n; i++) {
        const lm_tspan *q = &sc->pieces[cur].v[i];
        LM_TRY(bytelevel_piece(p, sc->pre[cur].p + q->off, q->len, &sc->pre[nxt], &sc->pieces[nxt],
                               &sc->tmp, &sc->found));
      }
    }
    cur = nxt;
  }
  sc->cur = cur;
  return LM_OK;
}
