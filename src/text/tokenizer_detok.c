/* tokenizer_detok.c — the streaming detokenizer (see tokenizer.h for the contract).
 *
 * Each id is turned into bytes by running its token alone through the decoder chain's per-token
 * steps (Replace, ByteFallback of "<0xNN>" to its byte, a Strip that comes before any Fuse,
 * ByteLevel's character -> byte map). Those bytes join a pending buffer, and every complete UTF-8
 * sequence at its front is released; an unfinished tail waits for the next id. Steps that act on
 * the whole text are applied to the stream: a Strip after Fuse / ByteLevel strips the start of
 * the stream, and without a decoder tokens are joined with spaces, as HF does. */
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer_impl.h"
#include "text/utf8.h"

struct lm_detok {
  const lm_tokenizer *t;
  int skip_special;
  lm_tbuf pending; /* bytes not yet released: an unfinished UTF-8 tail */
  lm_tbuf out;     /* the text returned by the last call */
  lm_tbuf tok;     /* one token's bytes */
  lm_tbuf tmp;
  const lm_tok_dec *lead_strip; /* a Strip applied to the start of the whole text, or NULL */
  size_t strip_left;            /* leading characters it may still remove */
  size_t n_tokens;              /* tokens seen since the start (for the space join) */
};

/* Finds a Strip that follows a step joining all tokens (Fuse or ByteLevel). */
static lm_status whole_text_strip(const lm_tokenizer *t, const lm_tok_dec **out) {
  int joined = 0;
  *out = NULL;
  for (size_t i = 0; i < t->n_dec; i++) {
    const lm_tok_dec *d = &t->dec[i];
    if (d->kind == LM_TD_FUSE || d->kind == LM_TD_BYTELEVEL) joined = 1;
    if (d->kind != LM_TD_STRIP || !joined) continue;
    if (d->stop > 0)
      return LM_ERRF(LM_ERR_UNSUPPORTED,
                     "detokenizer: a Strip decoder that removes the end of the text cannot stream");
    if (*out)
      return LM_ERRF(LM_ERR_UNSUPPORTED,
                     "detokenizer: two Strip decoders on the whole text cannot stream");
    *out = d;
  }
  return LM_OK;
}

lm_status lm_detok_create(const lm_tokenizer *t, int skip_special, lm_detok **out) {
  if (!t || !out) return LM_ERRF(LM_ERR_INVALID, "lm_detok_create: NULL argument");
  *out = NULL;
  const lm_tok_dec *strip;
  LM_TRY(whole_text_strip(t, &strip));
  lm_detok *d = calloc(1, sizeof *d);
  if (!d) return LM_ERRF(LM_ERR_NOMEM, "detokenizer: out of memory");
  d->t = t;
  d->skip_special = skip_special;
  d->lead_strip = strip;
  lm_detok_reset(d);
  *out = d;
  return LM_OK;
}

void lm_detok_free(lm_detok *d) {
  if (!d) return;
  lm_tbuf_free(&d->pending);
  lm_tbuf_free(&d->out);
  lm_tbuf_free(&d->tok);
  lm_tbuf_free(&d->tmp);
  free(d);
}

void lm_detok_reset(lm_detok *d) {
  if (!d) return;
  d->pending.n = 0;
  d->n_tokens = 0;
  d->strip_left = d->lead_strip ? d->lead_strip->start : 0;
}

static lm_status replace_into(const lm_tok_dec *dec, const lm_tbuf *in, lm_tbuf *out) {
  lm_tspans m = {0};
  out->n = 0;
  lm_status s = lm_tok_pattern_find(&dec->pat, in->p, in->n, &m);
  for (size_t i = 0; i < m.n && s == LM_OK; i++)
    s = m.v[i].id ? lm_tbuf_put(out, dec->content, dec->content_len)
                  : lm_tbuf_put(out, in->p + m.v[i].off, m.v[i].len);
  lm_tspans_free(&m);
  return s;
}

static void strip_token(const lm_tok_dec *dec, lm_tbuf *b) {
  size_t c = dec->content_len, a = 0, e = b->n;
  for (size_t k = 0; k < dec->start && e - a >= c && !memcmp(b->p + a, dec->content, c); k++)
    a += c;
  for (size_t k = 0; k < dec->stop && e - a >= c && !memcmp(b->p + e - c, dec->content, c); k++)
    e -= c;
  if (a) memmove(b->p, b->p + a, e - a);
  b->n = e - a;
}

/* The bytes one token contributes, through the chain's per-token steps. */
static lm_status token_bytes(lm_detok *d, const char *s, size_t n) {
  int joined = 0, raw_byte = 0;
  d->tok.n = 0;
  LM_TRY(lm_tbuf_put(&d->tok, s, n));
  for (size_t i = 0; i < d->t->n_dec; i++) {
    const lm_tok_dec *dec = &d->t->dec[i];
    int b;
    switch (dec->kind) {
    case LM_TD_REPLACE:
      if (raw_byte) break; /* a lone byte is not text yet */
      LM_TRY(replace_into(dec, &d->tok, &d->tmp));
      d->tok.n = 0;
      LM_TRY(lm_tbuf_put(&d->tok, d->tmp.p, d->tmp.n));
      break;
    case LM_TD_BYTEFALLBACK:
      if ((b = lm_tok_byte_token(d->tok.p, d->tok.n)) >= 0)
        d->tok.p[0] = (char)b, d->tok.n = 1, raw_byte = 1;
      break;
    case LM_TD_FUSE: joined = 1; break;
    case LM_TD_STRIP:
      if (!joined && !raw_byte) strip_token(dec, &d->tok);
      break;
    case LM_TD_BYTELEVEL:
      if (!raw_byte) {
        d->tmp.n = 0;
        LM_TRY(lm_tok_bytelevel_bytes(d->tok.p, d->tok.n, &d->tmp));
        d->tok.n = 0;
        LM_TRY(lm_tbuf_put(&d->tok, d->tmp.p, d->tmp.n));
      }
      joined = 1;
      break;
    }
  }
  return LM_OK;
}

/* Moves every finished sequence from pending to out; `final` also releases the tail as U+FFFD. */
static lm_status release(lm_detok *d, int final) {
  const char *p = d->pending.p;
  size_t n = d->pending.n, i = 0;
  while (i < n) {
    int32_t cp;
    size_t k = lm_utf8_next(p + i, n - i, &cp);
    if (cp < 0 && !final && i + k == n && lm_utf8_incomplete_tail(p + i, k) == k)
      break; /* wait for more */
    if (cp < 0)
      LM_TRY(lm_tbuf_put(&d->out, LM_UTF8_REPLACEMENT, 3));
    else
      LM_TRY(lm_tbuf_put(&d->out, p + i, k));
    i += k;
  }
  if (i < n) memmove(d->pending.p, p + i, n - i);
  d->pending.n = n - i;
  return LM_OK;
}

/* A Strip on the whole text removes its first characters as they appear. */
static void strip_stream_start(lm_detok *d) {
  const lm_tok_dec *s = d->lead_strip;
  size_t a = 0;
  if (!s || !d->strip_left) return;
  while (d->strip_left && d->out.n - a >= s->content_len &&
         !memcmp(d->out.p + a, s->content, s->content_len))
    a += s->content_len, d->strip_left--;
  if (a < d->out.n) d->strip_left = 0; /* other text came first: the strip is over */
  if (a) memmove(d->out.p, d->out.p + a, d->out.n - a);
  d->out.n -= a;
}

static lm_status finish(lm_detok *d, const char **text, size_t *len) {
  LM_TRY(lm_tbuf_reserve(&d->out, 0));
  d->out.p[d->out.n] = '\0';
  *text = d->out.p;
  *len = d->out.n;
  return LM_OK;
}

lm_status lm_detok_push(lm_detok *d, int32_t id, const char **text, size_t *len) {
  if (!d || !text || !len) return LM_ERRF(LM_ERR_INVALID, "lm_detok_push: NULL argument");
  size_t n;
  const char *s = lm_tok_decode_text(d->t, id, &n);
  d->out.n = 0;
  if (s && !(d->skip_special && lm_tokenizer_is_special(d->t, id))) {
    if (!d->t->has_decoder && d->n_tokens > 0) LM_TRY(lm_tbuf_put(&d->pending, " ", 1));
    d->n_tokens++;
    LM_TRY(token_bytes(d, s, n));
    LM_TRY(lm_tbuf_put(&d->pending, d->tok.p, d->tok.n));
    LM_TRY(release(d, 0));
    strip_stream_start(d);
  }
  return finish(d, text, len);
}

lm_status lm_detok_flush(lm_detok *d, const char **text, size_t *len) {
  if (!d || !text || !len) return LM_ERRF(LM_ERR_INVALID, "lm_detok_flush: NULL argument");
  d->out.n = 0;
  LM_TRY(release(d, 1));
  strip_stream_start(d);
  lm_detok_reset(d);
  return finish(d, text, len);
}

lm_status lm_detok_token_bytes(lm_detok *d, int32_t id, const char **bytes, size_t *len) {
  if (!d || !bytes || !len) return LM_ERRF(LM_ERR_INVALID, "lm_detok_token_bytes: NULL argument");
  size_t n;
  const char *s = lm_tok_decode_text(d->t, id, &n);
  if (!s) return LM_ERRF(LM_ERR_INVALID, "detokenizer: id %d has no token", id);
  LM_TRY(token_bytes(d, s, n));
  *bytes = d->tok.p ? d->tok.p : "";
  *len = d->tok.n;
  return LM_OK;
}
