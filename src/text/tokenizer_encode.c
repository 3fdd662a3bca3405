/* tokenizer_encode.c — text -> ids: the stages of HF `encode_single_sequence` in order
 * (see tokenizer_impl.h), then the post-processor's ids when add_special is set. */
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer_impl.h"
#include "text/utf8.h"

void lm_tok_scratch_free(lm_tok_scratch *sc) {
  lm_tbuf_free(&sc->norm);
  lm_tbuf_free(&sc->pre[0]);
  lm_tbuf_free(&sc->pre[1]);
  lm_tbuf_free(&sc->tmp);
  lm_tbuf_free(&sc->word);
  lm_tspans_free(&sc->segs);
  lm_tspans_free(&sc->segs2);
  lm_tspans_free(&sc->pieces[0]);
  lm_tspans_free(&sc->pieces[1]);
  lm_tspans_free(&sc->found);
  free(sc->sym_id);
  free(sc->sym_prev);
  free(sc->sym_next);
  free(sc->heap);
}

/* Pre-tokenizes and BPE-encodes a piece of normalized text that holds no added token. */
static lm_status encode_plain(const lm_tokenizer *t, const char *s, size_t n, lm_tok_scratch *sc,
                              lm_tids *out) {
  if (n == 0) return LM_OK;
  if (t->n_pretok == 0) return lm_tok_bpe(t, s, n, sc, out);
  LM_TRY(lm_tok_pretokenize(t, s, n, sc));
  const lm_tbuf *buf = &sc->pre[sc->cur];
  const lm_tspans *pc = &sc->pieces[sc->cur];
  for (size_t i = 0; i < pc->n; i++)
    LM_TRY(lm_tok_bpe(t, buf->p + pc->v[i].off, pc->v[i].len, sc, out));
  return LM_OK;
}

/* One piece between non-normalized added tokens: normalize, find normalized added tokens,
 * encode the rest. */
static lm_status encode_segment(const lm_tokenizer *t, const char *s, size_t n, lm_tok_scratch *sc,
                                lm_tids *out) {
  LM_TRY(lm_tok_normalize(t, s, n, &sc->norm));
  if (t->trie_norm.n == 0) return encode_plain(t, sc->norm.p, sc->norm.n, sc, out);
  sc->segs2.n = 0;
  LM_TRY(lm_tok_added_split(t, &t->trie_norm, sc->norm.p, sc->norm.n, 0, &sc->segs2));
  for (size_t i = 0; i < sc->segs2.n; i++) {
    const lm_tspan *g = &sc->segs2.v[i];
    if (g->id >= 0)
      LM_TRY(lm_tids_push(out, g->id));
    else
      LM_TRY(encode_plain(t, sc->norm.p + g->off, g->len, sc, out));
  }
  return LM_OK;
}

static lm_status encode_text(const lm_tokenizer *t, const char *s, size_t n, lm_tok_scratch *sc,
                             lm_tids *out) {
  if (t->trie_raw.n == 0) return encode_segment(t, s, n, sc, out);
  LM_TRY(lm_tok_added_split(t, &t->trie_raw, s, n, 0, &sc->segs));
  for (size_t i = 0; i < sc->segs.n; i++) {
    const lm_tspan *g = &sc->segs.v[i];
    if (g->id >= 0)
      LM_TRY(lm_tids_push(out, g->id));
    else
      LM_TRY(encode_segment(t, s + g->off, g->len, sc, out));
  }
  return LM_OK;
}

/* The post-processor's ids around the text. The BOS is never doubled: if the text already
 * starts with it (a rendered chat template writes it), the automatic one is left out. */
static lm_status add_specials(const lm_tokenizer *t, lm_tids *ids) {
  size_t skip = (lm_tokenizer_adds_bos(t) && ids->n > 0 && ids->v[0] == t->bos) ? 1 : 0;
  size_t np = t->prefix.n - skip;
  if (np) {
    LM_TRY(lm_tids_append(ids, t->prefix.v, np)); /* room, then shift the text right */
    memmove(ids->v + np, ids->v, (ids->n - np) * sizeof *ids->v);
    memcpy(ids->v, t->prefix.v + skip, np * sizeof *ids->v);
  }
  return lm_tids_append(ids, t->suffix.v, t->suffix.n);
}

lm_status lm_tokenizer_encode(const lm_tokenizer *t, const char *text, size_t len, int add_special,
                              int32_t **ids, size_t *n_ids) {
  if (!t || !ids || !n_ids || (!text && len))
    return LM_ERRF(LM_ERR_INVALID, "lm_tokenizer_encode: NULL argument");
  *ids = NULL, *n_ids = 0;
  char *fixed = NULL;
  if (!lm_utf8_valid(text, len)) { /* repaired like errors="replace" (see tokenizer.h) */
    LM_TRY(lm_utf8_sanitize(text, len, &fixed, &len));
    text = fixed;
  }
  lm_tok_scratch sc;
  lm_tids out = {0};
  memset(&sc, 0, sizeof sc);
  lm_status s = encode_text(t, text ? text : "", len, &sc, &out);
  if (s == LM_OK && add_special) s = add_specials(t, &out);
  lm_tok_scratch_free(&sc);
  free(fixed);
  if (s != LM_OK) {
    lm_tids_free(&out);
    return s;
  }
  *ids = out.v;
  *n_ids = out.n;
  return LM_OK;
}
