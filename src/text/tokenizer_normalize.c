/* tokenizer_normalize.c — the normalizer stage: Replace, Unicode normalization forms (utf8proc)
 * and Prepend, applied in order to each piece of text between non-normalized added tokens
 * (HF Normalizer::normalize on a NormalizedString; lumen does not track offsets). */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "text/tokenizer_impl.h"

/* Replaces every match of n->pat in in[0..len) with n->content. */
static lm_status replace(const lm_tok_norm *n, const char *in, size_t len, lm_tbuf *out) {
  lm_tspans m = {0};
  lm_status s = lm_tok_pattern_find(&n->pat, in, len, &m);
  for (size_t i = 0; i < m.n && s == LM_OK; i++)
    s = m.v[i].id ? lm_tbuf_put(out, n->content, n->content_len)
                  : lm_tbuf_put(out, in + m.v[i].off, m.v[i].len);
  lm_tspans_free(&m);
  return s;
}

static lm_status unicode_form(lm_tn_kind kind, const char *in, size_t len, lm_tbuf *out) {
  int opt = UTF8PROC_STABLE;
  if (kind == LM_TN_NFC || kind == LM_TN_NFKC)
    opt |= UTF8PROC_COMPOSE;
  else
    opt |= UTF8PROC_DECOMPOSE;
  if (kind == LM_TN_NFKC || kind == LM_TN_NFKD) opt |= UTF8PROC_COMPAT;
  if (len == 0) return LM_OK;
  size_t i = 0; /* ASCII is its own normal form in all four */
  while (i < len && (unsigned char)in[i] < 0x80)
    i++;
  if (i == len) return lm_tbuf_put(out, in, len);
  if (len > (size_t)PTRDIFF_MAX / 4)
    return LM_ERRF(LM_ERR_NOMEM, "tokenizer: text too long to normalize");
  utf8proc_uint8_t *dst = NULL;
  utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)in, (utf8proc_ssize_t)len, &dst,
                                    (utf8proc_option_t)opt);
  if (r < 0)
    return LM_ERRF(r == UTF8PROC_ERROR_NOMEM ? LM_ERR_NOMEM : LM_ERR_CORRUPT,
                   "tokenizer: Unicode normalization failed: %s", utf8proc_errmsg(r));
  lm_status s = lm_tbuf_put(out, dst, (size_t)r);
  free(dst);
  return s;
}

static lm_status apply_one(const lm_tok_norm *n, const char *in, size_t len, lm_tbuf *out) {
  out->n = 0;
  switch (n->kind) {
  case LM_TN_REPLACE: return replace(n, in, len, out);
  case LM_TN_PREPEND:
    if (len)
      LM_TRY(lm_tbuf_put(out, n->content, n->content_len)); /* HF prepends to non-empty text only */
    return lm_tbuf_put(out, in, len);
  default: return unicode_form(n->kind, in, len, out);
  }
}

lm_status lm_tok_normalize(const lm_tokenizer *t, const char *in, size_t n, lm_tbuf *out) {
  out->n = 0;
  if (t->n_norm == 0) return lm_tbuf_put(out, in, n);
  lm_tbuf tmp = {0};
  lm_status s = LM_OK;
  /* ping-pong between out and tmp; the last stage writes to out */
  const char *src = in;
  size_t src_n = n;
  for (size_t i = 0; i < t->n_norm && s == LM_OK; i++) {
    lm_tbuf *dst = ((t->n_norm - 1 - i) % 2 == 0) ? out : &tmp;
    s = apply_one(&t->norm[i], src, src_n, dst);
    src = dst->p, src_n = dst->n;
  }
  lm_tbuf_free(&tmp);
  return s;
}

lm_status lm_tok_normalize_str(const lm_tokenizer *t, const char *in, size_t n, char **out,
                               size_t *out_len) {
  lm_tbuf b = {0};
  lm_status s = lm_tok_normalize(t, in, n, &b);
  if (s == LM_OK) s = lm_tbuf_reserve(&b, 0); /* a buffer even for empty text */
  if (s != LM_OK) {
    lm_tbuf_free(&b);
    return s;
  }
  b.p[b.n] = '\0';
  *out = b.p;
  *out_len = b.n;
  return LM_OK;
}
