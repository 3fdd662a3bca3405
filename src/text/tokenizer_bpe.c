/* tokenizer_bpe.c — the BPE model on one pre-tokenized piece (HF models/bpe: merge_word +
 * Word::merge_all).
 *
 * Characters become symbols (vocab lookups, else byte-fallback tokens "<0xNN>", else the unk
 * token, fused when fuse_unk), then the pair of adjacent symbols with the lowest merge rank is
 * merged, leftmost first on equal ranks, until no pair has a merge. A binary heap of packed
 * (rank << 32 | position) keys holds the candidates; stale entries (a symbol that was merged
 * away or whose neighbour changed) are skipped when popped, which is exactly HF's check (a
 * position's pair can only change into a different pair, so the rank identifies it).
 * O(n log n) per piece: Gemma's pre-tokenizer leaves whole paragraphs as one piece. */
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer_impl.h"
#include "text/utf8.h"

/* Room for n symbols and a heap of 3n entries (n - 1 initial pairs, at most 2 per merge). */
static lm_status reserve(lm_tok_scratch *sc, size_t n) {
  if (n > SIZE_MAX / 3 / sizeof(uint64_t))
    return LM_ERRF(LM_ERR_NOMEM, "tokenizer: BPE of %zu symbols", n);
  if (n > sc->sym_cap) {
    size_t c = sc->sym_cap ? sc->sym_cap : 64;
    while (c < n)
      c *= 2;
    int32_t *a = realloc(sc->sym_id, c * sizeof *a);
    if (a) sc->sym_id = a;
    int32_t *b = a ? realloc(sc->sym_prev, c * sizeof *b) : NULL;
    if (b) sc->sym_prev = b;
    int32_t *d = b ? realloc(sc->sym_next, c * sizeof *d) : NULL;
    if (d) sc->sym_next = d;
    if (!d) return LM_ERRF(LM_ERR_NOMEM, "tokenizer: out of memory (BPE of %zu symbols)", n);
    sc->sym_cap = c;
  }
  if (n * 3 > sc->heap_cap) {
    size_t c = n * 3;
    uint64_t *h = realloc(sc->heap, c * sizeof *h);
    if (!h) return LM_ERRF(LM_ERR_NOMEM, "tokenizer: out of memory (BPE of %zu symbols)", n);
    sc->heap = h;
    sc->heap_cap = c;
  }
  return LM_OK;
}

/* ---- min-heap of packed keys -------------------------------------------------------------- */
static void sift_down(uint64_t *h, size_t n, size_t i) {
  uint64_t x = h[i];
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= n) break;
    if (c + 1 < n && h[c + 1] < h[c]) c++;
    if (h[c] >= x) break;
    h[i] = h[c];
    i = c;
  }
  h[i] = x;
}

static void heap_push(uint64_t *h, size_t *n, uint64_t x) {
  size_t i = (*n)++;
  while (i > 0 && h[(i - 1) / 2] > x) {
    h[i] = h[(i - 1) / 2];
    i = (i - 1) / 2;
  }
  h[i] = x;
}

static uint64_t heap_pop(uint64_t *h, size_t *n) {
  uint64_t top = h[0];
  h[0] = h[--*n];
  if (*n) sift_down(h, *n, 0);
  return top;
}

/* ---- symbols ------------------------------------------------------------------------------ */
typedef struct word_state {
  size_t n;    /* symbols so far */
  int32_t unk; /* pending unk symbol, -1 if none */
} word_state;

static void add_symbol(lm_tok_scratch *sc, word_state *w, int32_t id) {
  sc->sym_id[w->n] = id;
  sc->sym_prev[w->n] = (int32_t)w->n - 1;
  sc->sym_next[w->n] = (int32_t)w->n + 1;
  w->n++;
}

/* Vocab id of the character s[0..k) at the given position (with prefix / suffix), -1 if none. */
static lm_status char_id(const lm_tokenizer *t, lm_tok_scratch *sc, const char *s, size_t k,
                         int first, int last, int32_t *id, const char **str, size_t *len) {
  int pre = !first && t->cont_prefix, suf = last && t->word_suffix;
  *str = s, *len = k;
  if (!pre && !suf) {
    *id = (k == 1 && (uint8_t)s[0] < 0x80) ? t->ascii_ids[(uint8_t)s[0]]
                                           : lm_tok_smap_get(&t->vocab_map, &t->vocab, s, k);
    return LM_OK;
  }
  sc->word.n = 0;
  if (pre) LM_TRY(lm_tbuf_put(&sc->word, t->cont_prefix, t->cont_prefix_len));
  LM_TRY(lm_tbuf_put(&sc->word, s, k));
  if (suf) LM_TRY(lm_tbuf_put(&sc->word, t->word_suffix, t->word_suffix_len));
  *str = sc->word.p, *len = sc->word.n;
  *id = lm_tok_smap_get(&t->vocab_map, &t->vocab, sc->word.p, sc->word.n);
  return LM_OK;
}

/* An unknown character: its bytes' fallback tokens if all exist, else the unk token. Like HF, a
 * pending (fused) unk is emitted only when a known character or the end of the word follows. */
static lm_status unknown_char(const lm_tokenizer *t, lm_tok_scratch *sc, word_state *w,
                              const char *str, size_t len) {
  if (t->byte_fallback) {
    size_t i = 0;
    while (i < len && t->byte_ids[(uint8_t)str[i]] >= 0)
      i++;
    if (i == len) {
      for (i = 0; i < len; i++)
        add_symbol(sc, w, t->byte_ids[(uint8_t)str[i]]);
      return LM_OK;
    }
  }
  if (t->unk_missing)
    return LM_ERRF(LM_ERR_CORRUPT, "tokenizer: the unk token is not in the vocab, and the text has "
                                   "a character without a token");
  if (t->unk_id < 0) return LM_OK; /* no unk token: HF drops the character */
  if (w->unk >= 0 && !t->fuse_unk) add_symbol(sc, w, w->unk);
  w->unk = t->unk_id;
  return LM_OK;
}

static lm_status make_symbols(const lm_tokenizer *t, const char *s, size_t n, lm_tok_scratch *sc,
                              size_t *count) {
  LM_TRY(reserve(sc, n + 2));
  word_state w = {0, -1};
  for (size_t i = 0; i < n;) {
    int32_t cp, id;
    size_t k = lm_utf8_next(s + i, n - i, &cp), len;
    const char *str;
    if (cp < 0)
      return LM_ERRF(LM_ERR_CORRUPT, "tokenizer: internal error: invalid UTF-8 reached BPE");
    LM_TRY(char_id(t, sc, s + i, k, i == 0, i + k == n, &id, &str, &len));
    /* byte fallback adds one symbol per byte of the (prefixed) character, plus a pending unk */
    if (w.n + len + 2 > sc->sym_cap) LM_TRY(reserve(sc, w.n + len + 2 + (n - i)));
    if (id >= 0) {
      if (w.unk >= 0) add_symbol(sc, &w, w.unk), w.unk = -1;
      add_symbol(sc, &w, id);
    } else
      LM_TRY(unknown_char(t, sc, &w, str, len));
    i += k;
  }
  if (w.unk >= 0) add_symbol(sc, &w, w.unk);
  if (w.n) sc->sym_next[w.n - 1] = -1;
  *count = w.n;
  return LM_OK;
}

static void push_pair(const lm_tokenizer *t, lm_tok_scratch *sc, size_t *hn, int32_t pos) {
  int32_t nx = sc->sym_next[pos];
  if (nx < 0) return;
  const lm_tok_merge *m = lm_tok_pmap_get(&t->merges, sc->sym_id[pos], sc->sym_id[nx]);
  if (m) heap_push(sc->heap, hn, ((uint64_t)m->rank << 32) | (uint32_t)pos);
}

static void merge_all(const lm_tokenizer *t, lm_tok_scratch *sc, size_t count) {
  size_t hn = 0;
  for (size_t i = 0; i + 1 < count; i++) {
    const lm_tok_merge *m = lm_tok_pmap_get(&t->merges, sc->sym_id[i], sc->sym_id[i + 1]);
    if (m) sc->heap[hn++] = ((uint64_t)m->rank << 32) | (uint32_t)i;
  }
  for (size_t i = hn / 2; i-- > 0;)
    sift_down(sc->heap, hn, i);
  while (hn) {
    uint64_t top = heap_pop(sc->heap, &hn);
    int32_t pos = (int32_t)(uint32_t)top, nx = sc->sym_next[pos];
    if (sc->sym_id[pos] < 0 || nx < 0) continue; /* merged away, or the last symbol */
    const lm_tok_merge *m = lm_tok_pmap_get(&t->merges, sc->sym_id[pos], sc->sym_id[nx]);
    if (!m || m->rank != (uint32_t)(top >> 32)) continue; /* stale entry */
    sc->sym_id[pos] = m->id;
    sc->sym_id[nx] = -1;
    int32_t nn = sc->sym_next[nx];
    sc->sym_next[pos] = nn;
    if (nn >= 0) sc->sym_prev[nn] = pos;
    if (sc->sym_prev[pos] >= 0) push_pair(t, sc, &hn, sc->sym_prev[pos]);
    push_pair(t, sc, &hn, pos);
  }
}

lm_status lm_tok_bpe(const lm_tokenizer *t, const char *w, size_t n, lm_tok_scratch *sc,
                     lm_tids *out) {
  if (n == 0) return LM_OK;
  if (t->ignore_merges) { /* HF: a piece that is itself a token is taken whole */
    int32_t id = lm_tok_smap_get(&t->vocab_map, &t->vocab, w, n);
    if (id >= 0) return lm_tids_push(out, id);
  }
  size_t count = 0;
  LM_TRY(make_symbols(t, w, n, sc, &count));
  if (count > INT32_MAX / 2)
    return LM_ERRF(LM_ERR_UNSUPPORTED, "tokenizer: a piece of %zu bytes is too long", n);
  LM_TRY(reserve(sc, count));
  merge_all(t, sc, count);
  for (int32_t i = count ? 0 : -1; i >= 0; i = sc->sym_next[i])
    LM_TRY(lm_tids_push(out, sc->sym_id[i]));
  return LM_OK;
}
