/* tokenizer_decode.c — ids -> text through the decoder chain (HF Tokenizer::decode +
 * Decoder::decode_chain), and the token lookups.
 *
 * Each decoder maps a list of strings to a list of strings; the result is their concatenation.
 * Without a decoder, HF joins the tokens with spaces. ByteFallback turns a run of "<0xNN>" tokens
 * into their UTF-8 text, or one U+FFFD per byte if the run is not valid UTF-8; ByteLevel maps
 * GPT-2 characters back to bytes and repairs invalid UTF-8 (from_utf8_lossy). */
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer_impl.h"
#include "text/utf8.h"

int32_t lm_tokenizer_find(const lm_tokenizer *t, const char *token, size_t len) {
  if (!t || (!token && len)) return -1;
  if (!token) token = "";
  int32_t a = lm_tok_smap_get(&t->added_map, &t->added_text, token, len);
  if (a >= 0) return t->added[a].id;
  return lm_tok_smap_get(&t->vocab_map, &t->vocab, token, len);
}

const char *lm_tokenizer_piece(const lm_tokenizer *t, int32_t id, size_t *len) {
  size_t n;
  if (!t || id < 0 || id >= t->vocab_size) return NULL;
  int32_t a = t->added_of_id[id];
  const char *s = a >= 0 ? lm_tok_strtab_get(&t->added_text, (size_t)a, &n)
                         : lm_tok_strtab_get(&t->vocab, (size_t)id, &n);
  if (s && len) *len = n;
  return s;
}

int lm_tokenizer_is_special(const lm_tokenizer *t, int32_t id) {
  if (!t || id < 0 || id >= t->vocab_size) return 0;
  int32_t a = t->added_of_id[id];
  return a >= 0 && t->added[a].special;
}

/* HF simple_id_to_token: a normalized added token decodes from its normalized form. */
const char *lm_tok_decode_text(const lm_tokenizer *t, int32_t id, size_t *len) {
  if (id < 0 || id >= t->vocab_size) return NULL;
  int32_t a = t->added_of_id[id];
  if (a >= 0) {
    const char *s = lm_tok_strtab_get(&t->added_norm, (size_t)a, len);
    return s ? s : lm_tok_strtab_get(&t->added_text, (size_t)a, len);
  }
  return lm_tok_strtab_get(&t->vocab, (size_t)id, len);
}

int lm_tok_byte_token(const char *s, size_t n) {
  if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return -1;
  int v = 0;
  for (int i = 3; i < 5; i++) {
    char c = s[i];
    v <<= 4;
    if (c >= '0' && c <= '9')
      v |= c - '0';
    else if (c >= 'a' && c <= 'f')
      v |= c - 'a' + 10;
    else if (c >= 'A' && c <= 'F')
      v |= c - 'A' + 10;
    else
      return -1;
  }
  return v;
}

/* ---- the chain: a list of strings as spans of one buffer ---------------------------------- */
typedef struct strlist {
  lm_tbuf buf;
  lm_tspans s;
} strlist;

static void strlist_free(strlist *l) {
  lm_tbuf_free(&l->buf);
  lm_tspans_free(&l->s);
}

static lm_status strlist_add(strlist *l, const char *p, size_t n) {
  size_t off = l->buf.n;
  LM_TRY(lm_tbuf_put(&l->buf, p, n));
  return lm_tspans_push(&l->s, off, n, 0);
}

/* Appends to the last string (which the caller has just begun). */
static lm_status strlist_extend(strlist *l, const char *p, size_t n) {
  LM_TRY(lm_tbuf_put(&l->buf, p, n));
  l->s.v[l->s.n - 1].len += n;
  return LM_OK;
}

static lm_status dec_replace(const lm_tok_dec *d, const strlist *in, strlist *out) {
  lm_tspans m = {0};
  lm_status s = LM_OK;
  for (size_t i = 0; i < in->s.n && s == LM_OK; i++) {
    const char *tok = in->buf.p + in->s.v[i].off;
    s = strlist_add(out, "", 0);
    if (s == LM_OK) s = lm_tok_pattern_find(&d->pat, tok, in->s.v[i].len, &m);
    for (size_t k = 0; k < m.n && s == LM_OK; k++)
      s = m.v[k].id ? strlist_extend(out, d->content, d->content_len)
                    : strlist_extend(out, tok + m.v[k].off, m.v[k].len);
  }
  lm_tspans_free(&m);
  return s;
}

static lm_status flush_bytes(lm_tbuf *bytes, strlist *out) {
  lm_status s = LM_OK;
  if (!bytes->n) return LM_OK;
  if (lm_utf8_valid(bytes->p, bytes->n))
    s = strlist_add(out, bytes->p, bytes->n);
  else
    for (size_t i = 0; i < bytes->n && s == LM_OK; i++)
      s = strlist_add(out, LM_UTF8_REPLACEMENT, 3);
  bytes->n = 0;
  return s;
}

static lm_status dec_bytefallback(const strlist *in, strlist *out) {
  lm_tbuf bytes = {0};
  lm_status s = LM_OK;
  for (size_t i = 0; i < in->s.n && s == LM_OK; i++) {
    const char *tok = in->buf.p + in->s.v[i].off;
    int b = lm_tok_byte_token(tok, in->s.v[i].len);
    if (b >= 0) {
      char c = (char)b;
      s = lm_tbuf_put(&bytes, &c, 1);
      continue;
    }
    s = flush_bytes(&bytes, out);
    if (s == LM_OK) s = strlist_add(out, tok, in->s.v[i].len);
  }
  if (s == LM_OK) s = flush_bytes(&bytes, out);
  lm_tbuf_free(&bytes);
  return s;
}

static lm_status dec_fuse(const strlist *in, strlist *out) {
  LM_TRY(strlist_add(out, "", 0));
  for (size_t i = 0; i < in->s.n; i++)
    LM_TRY(strlist_extend(out, in->buf.p + in->s.v[i].off, in->s.v[i].len));
  return LM_OK;
}

/* Strip: up to `start` leading and `stop` trailing copies of the content character, per string. */
static lm_status dec_strip(const lm_tok_dec *d, const strlist *in, strlist *out) {
  size_t c = d->content_len;
  for (size_t i = 0; i < in->s.n; i++) {
    const char *p = in->buf.p + in->s.v[i].off;
    size_t a = 0, b = in->s.v[i].len;
    for (size_t k = 0; k < d->start && b - a >= c && !memcmp(p + a, d->content, c); k++)
      a += c;
    for (size_t k = 0; k < d->stop && b - a >= c && !memcmp(p + b - c, d->content, c); k++)
      b -= c;
    LM_TRY(strlist_add(out, p + a, b - a));
  }
  return LM_OK;
}

/* Appends the bytes of one token: GPT-2 characters mapped back, or its raw UTF-8 if any character
 * is outside the table (an added token such as "<|im_start|>\n" keeps its text). */
lm_status lm_tok_bytelevel_bytes(const char *p, size_t n, lm_tbuf *out) {
  size_t start = out->n;
  for (size_t k = 0; k < n;) {
    int32_t cp;
    k += lm_utf8_next(p + k, n - k, &cp);
    int b = cp < 0 ? -1 : lm_tok_char_byte((uint32_t)cp);
    if (b < 0) {
      out->n = start;
      return lm_tbuf_put(out, p, n);
    }
    char c = (char)b;
    LM_TRY(lm_tbuf_put(out, &c, 1));
  }
  return LM_OK;
}

static lm_status dec_bytelevel(const strlist *in, strlist *out) {
  lm_tbuf bytes = {0};
  char *fixed = NULL;
  size_t n;
  lm_status s = LM_OK;
  for (size_t i = 0; i < in->s.n && s == LM_OK; i++)
    s = lm_tok_bytelevel_bytes(in->buf.p + in->s.v[i].off, in->s.v[i].len, &bytes);
  if (s == LM_OK) s = lm_utf8_sanitize(bytes.p ? bytes.p : "", bytes.n, &fixed, &n);
  if (s == LM_OK) s = strlist_add(out, fixed, n);
  free(fixed);
  lm_tbuf_free(&bytes);
  return s;
}

static lm_status run_decoder(const lm_tok_dec *d, const strlist *in, strlist *out) {
  switch (d->kind) {
  case LM_TD_REPLACE: return dec_replace(d, in, out);
  case LM_TD_BYTEFALLBACK: return dec_bytefallback(in, out);
  case LM_TD_FUSE: return dec_fuse(in, out);
  case LM_TD_STRIP: return dec_strip(d, in, out);
  case LM_TD_BYTELEVEL: return dec_bytelevel(in, out);
  }
  return LM_ERRF(LM_ERR_STATE, "tokenizer: unknown decoder");
}

static lm_status collect(const lm_tokenizer *t, const int32_t *ids, size_t n, int skip_special,
                         strlist *l) {
  for (size_t i = 0; i < n; i++) {
    size_t len;
    const char *s = lm_tok_decode_text(t, ids[i], &len);
    if (!s || (skip_special && lm_tokenizer_is_special(t, ids[i]))) continue;
    LM_TRY(strlist_add(l, s, len));
  }
  return LM_OK;
}

static lm_status join(const lm_tokenizer *t, const strlist *l, char **text, size_t *len) {
  lm_tbuf out = {0};
  lm_status s = lm_tbuf_reserve(&out, l->buf.n + l->s.n);
  for (size_t i = 0; i < l->s.n && s == LM_OK; i++) {
    if (i && !t->has_decoder) s = lm_tbuf_put(&out, " ", 1);
    if (s == LM_OK) s = lm_tbuf_put(&out, l->buf.p + l->s.v[i].off, l->s.v[i].len);
  }
  if (s != LM_OK) {
    lm_tbuf_free(&out);
    return s;
  }
  out.p[out.n] = '\0';
  *text = out.p;
  *len = out.n;
  return LM_OK;
}

lm_status lm_tokenizer_decode(const lm_tokenizer *t, const int32_t *ids, size_t n, int skip_special,
                              char **text, size_t *len) {
  if (!t || !text || !len || (!ids && n))
    return LM_ERRF(LM_ERR_INVALID, "lm_tokenizer_decode: NULL argument");
  *text = NULL, *len = 0;
  strlist a = {0}, b = {0};
  lm_status s = collect(t, ids, n, skip_special, &a);
  for (size_t i = 0; i < t->n_dec && s == LM_OK; i++) {
    b.buf.n = 0, b.s.n = 0;
    s = run_decoder(&t->dec[i], &a, &b);
    strlist x = a;
    a = b, b = x;
  }
  if (s == LM_OK) s = join(t, &a, text, len);
  strlist_free(&a);
  strlist_free(&b);
  return s;
}
