/* vocab.c — lm_grammar_vocab: the pieces copied, sorted, and laid out as a preorder trie. */
#include "grammar/vocab.h"

#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "base/status.h"

typedef struct piece {
  const uint8_t *p;
  uint32_t len;
  int32_t id;
} piece;

static int piece_cmp(const void *a, const void *b) {
  const piece *x = a, *y = b;
  uint32_t n = x->len < y->len ? x->len : y->len;
  int c = n ? memcmp(x->p, y->p, n) : 0;
  if (c) return c;
  if (x->len != y->len) return x->len < y->len ? -1 : 1;
  return x->id < y->id ? -1 : x->id > y->id;
}

void lm_grammar_vocab_free(lm_grammar_vocab *v) {
  if (!v) return;
  free(v->bytes);
  free(v->off);
  free(v->len);
  free(v->nbyte);
  free(v->nend);
  free(v->ntok);
  free(v->tok);
  free(v->nsum);
  free(v->nflags);
  free(v);
}

static lm_status copy_pieces(lm_grammar_vocab *v, const char *const *pieces, const size_t *lens) {
  size_t total = 0;
  for (int32_t i = 0; i < v->n; i++) {
    size_t l = lens[i];
    if (l > 0 && !pieces[i])
      return LM_ERRF(LM_ERR_INVALID, "grammar vocab: token %d has a length but no bytes", i);
    if (l > LM_GV_MAX_PIECE) l = 0;
    total += l;
  }
  v->bytes = malloc(total ? total : 1);
  v->off = malloc((size_t)v->n * sizeof *v->off + 1);
  v->len = malloc((size_t)v->n * sizeof *v->len + 1);
  if (!v->bytes || !v->off || !v->len) return LM_ERRF(LM_ERR_NOMEM, "grammar vocab: out of memory");
  uint64_t h = lm_mix64((uint64_t)v->n);
  size_t o = 0;
  for (int32_t i = 0; i < v->n; i++) {
    uint32_t l = lens[i] > LM_GV_MAX_PIECE ? 0 : (uint32_t)lens[i];
    v->off[i] = o;
    v->len[i] = l;
    if (l) memcpy(v->bytes + o, pieces[i], l);
    h = lm_mix64(h ^ l);
    for (uint32_t k = 0; k < l; k++)
      h = (h ^ (uint8_t)pieces[i][k]) * 0x100000001b3ull;
    o += l;
    if (l > v->max_len) v->max_len = l;
  }
  v->hash = lm_mix64(h);
  return LM_OK;
}

/* Ends the subtree of the node at path[d]: its end, and its bytes folded into its parent's. */
static void close_node(lm_grammar_vocab *v, const uint32_t *path, uint32_t d, uint32_t end) {
  uint32_t i = path[d], up = path[d - 1];
  v->nend[i] = end;
  v->nsum[up][0] |= v->nsum[i][0];
  v->nsum[up][1] |= v->nsum[i][1];
  v->nflags[up] |= (uint8_t)(v->nflags[i] & LM_GV_NONASCII);
}

/* ok[i] = 1 when p[i..n) is well-formed UTF-8 that may stop inside its last character. */
static void utf8_suffixes(const uint8_t *p, uint32_t n, uint8_t *ok) {
  ok[n] = 1;
  for (uint32_t i = n; i-- > 0;) {
    uint8_t c = p[i];
    uint32_t len = c < 0x80                 ? 1
                   : c >= 0xC2 && c <= 0xDF ? 2
                   : c >= 0xE0 && c <= 0xEF ? 3
                   : c >= 0xF0 && c <= 0xF4 ? 4
                                            : 0;
    int good = len > 0;
    for (uint32_t k = 1; good && k < len && i + k < n; k++) {
      uint8_t x = p[i + k], lo = 0x80, hi = 0xBF;
      if (k == 1 && c == 0xE0) lo = 0xA0;
      if (k == 1 && c == 0xED) hi = 0x9F;
      if (k == 1 && c == 0xF0) lo = 0x90;
      if (k == 1 && c == 0xF4) hi = 0x8F;
      good = x >= lo && x <= hi;
    }
    ok[i] = (uint8_t)(good && (i + len >= n || ok[i + len]));
  }
}

/* One preorder pass over the sorted pieces: the path from the root is a stack; a piece shares
 * its longest common prefix with the previous one, so nodes past that prefix are closed. */
static lm_status build_trie(lm_grammar_vocab *v, const piece *ps, uint32_t np) {
  size_t cap = 1;
  for (uint32_t i = 0; i < np; i++)
    cap += ps[i].len;
  v->nbyte = malloc(cap);
  v->nend = malloc(cap * sizeof *v->nend);
  v->ntok = malloc((cap + 1) * sizeof *v->ntok);
  v->tok = malloc((np + 1) * sizeof *v->tok);
  v->nsum = calloc(cap, sizeof *v->nsum);
  v->nflags = malloc(cap);
  uint32_t *path = malloc((LM_GV_MAX_PIECE + 1) * sizeof *path);
  uint8_t ok[LM_GV_MAX_PIECE + 1];
  if (!v->nbyte || !v->nend || !v->ntok || !v->tok || !v->nsum || !v->nflags || !path) {
    free(path);
    return LM_ERRF(LM_ERR_NOMEM, "grammar vocab: out of memory");
  }
  uint32_t nn = 1, depth = 0, nt = 0;
  v->nbyte[0] = 0;
  v->nflags[0] = LM_GV_UTF8;
  v->ntok[0] = 0;
  path[0] = 0;
  const piece *prev = NULL;
  for (uint32_t i = 0; i < np; i++) {
    const piece *c = &ps[i];
    uint32_t lcp = 0;
    if (prev)
      while (lcp < prev->len && lcp < c->len && prev->p[lcp] == c->p[lcp])
        lcp++;
    while (depth > lcp)
      close_node(v, path, depth--, nn);
    /* A node's UTF-8 flag must hold for every piece below it: the nodes of the shared prefix
     * learn this piece's. */
    utf8_suffixes(c->p, c->len, ok);
    for (uint32_t d = 1; d <= depth; d++)
      if (!ok[d - 1]) v->nflags[path[d]] &= (uint8_t)~LM_GV_UTF8;
    for (; depth < c->len; depth++) {
      uint8_t b = c->p[depth];
      v->nbyte[nn] = b;
      v->ntok[nn] = nt;
      if (b < 0x80) v->nsum[nn][b >> 6] |= 1ull << (b & 63);
      v->nflags[nn] = (uint8_t)((b >= 0x80 ? LM_GV_NONASCII : 0) | (ok[depth] ? LM_GV_UTF8 : 0));
      path[depth + 1] = nn++;
    }
    v->tok[nt++] = c->id;
    prev = c;
  }
  while (depth > 0)
    close_node(v, path, depth--, nn);
  v->nend[0] = nn;
  v->ntok[nn] = nt;
  v->n_nodes = nn;
  v->n_tok = nt;
  free(path);
  return LM_OK;
}

lm_status lm_grammar_vocab_create(const char *const *pieces, const size_t *lens, int32_t n,
                                  lm_grammar_vocab **out) {
  if (n < 0 || (n > 0 && (!pieces || !lens)))
    return LM_ERRF(LM_ERR_INVALID, "grammar vocab: bad arguments (n %d)", n);
  lm_grammar_vocab *v = calloc(1, sizeof *v);
  if (!v) return LM_ERRF(LM_ERR_NOMEM, "grammar vocab: out of memory");
  v->n = n;
  piece *ps = NULL;
  lm_status s = copy_pieces(v, pieces, lens);
  if (s != LM_OK) goto fail;
  ps = malloc(((size_t)n + 1) * sizeof *ps);
  if (!ps) {
    s = LM_ERRF(LM_ERR_NOMEM, "grammar vocab: out of memory");
    goto fail;
  }
  uint32_t np = 0;
  for (int32_t i = 0; i < n; i++)
    if (v->len[i]) ps[np++] = (piece){(const uint8_t *)v->bytes + v->off[i], v->len[i], i};
  qsort(ps, np, sizeof *ps, piece_cmp);
  s = build_trie(v, ps, np);
  if (s != LM_OK) goto fail;
  free(ps);
  *out = v;
  return LM_OK;
fail:
  free(ps);
  lm_grammar_vocab_free(v);
  return s;
}
