/* tokenizer_added.c — finding added tokens in text (HF AddedVocabulary::find_matches).
 *
 * The tokens live in a byte trie; the scan takes, at the leftmost position where any token
 * starts, the longest token there (Aho-Corasick "leftmost-longest", what HF's daachorse does),
 * then continues after it. The matching flags then apply: single_word discards a match glued to
 * a word character (the scan still resumes after the discarded match, as HF's iterator does),
 * lstrip / rstrip widen the match over adjacent whitespace (Rust regex \s). Cost: O(n x longest
 * token) in the worst case, O(n) for text where few bytes can start a token. */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "text/tokenizer_impl.h"
#include "text/utf8.h"

void lm_tok_trie_init(lm_tok_trie *tr) {
  memset(tr, 0, sizeof *tr);
  for (int i = 0; i < 256; i++)
    tr->root[i] = -1;
}

void lm_tok_trie_free(lm_tok_trie *tr) {
  free(tr->v);
  lm_tok_trie_init(tr);
}

static lm_status new_node(lm_tok_trie *tr, uint8_t byte, int32_t *out) {
  if (tr->n == tr->cap) {
    size_t c = tr->cap ? tr->cap * 2 : 256;
    lm_tok_trie_node *v = realloc(tr->v, c * sizeof *v);
    if (!v) return LM_ERRF(LM_ERR_NOMEM, "tokenizer: out of memory (added-token trie)");
    tr->v = v;
    tr->cap = c;
  }
  tr->v[tr->n] = (lm_tok_trie_node){-1, -1, -1, byte};
  *out = (int32_t)tr->n++;
  return LM_OK;
}

static int32_t find_child(const lm_tok_trie *tr, int32_t node, uint8_t byte) {
  for (int32_t c = tr->v[node].child; c >= 0; c = tr->v[c].sibling)
    if (tr->v[c].byte == byte) return c;
  return -1;
}

lm_status lm_tok_trie_insert(lm_tok_trie *tr, const char *s, size_t n, int32_t token) {
  if (n == 0) return LM_OK;
  const uint8_t *p = (const uint8_t *)s;
  if (tr->root[p[0]] < 0) LM_TRY(new_node(tr, p[0], &tr->root[p[0]]));
  int32_t node = tr->root[p[0]];
  for (size_t i = 1; i < n; i++) {
    int32_t c = find_child(tr, node, p[i]);
    if (c < 0) {
      LM_TRY(new_node(tr, p[i], &c));
      tr->v[c].sibling = tr->v[node].child;
      tr->v[node].child = c;
    }
    node = c;
  }
  tr->v[node].token = token;
  return LM_OK;
}

/* Longest token starting at s[0]; returns its length (0: none) and sets *tok. */
static size_t longest_at(const lm_tok_trie *tr, const uint8_t *s, size_t n, int32_t *tok) {
  int32_t node = tr->root[s[0]];
  size_t best = 0;
  for (size_t k = 1; node >= 0; k++) {
    if (tr->v[node].token >= 0) best = k, *tok = tr->v[node].token;
    if (k >= n) break;
    node = find_child(tr, node, s[k]);
  }
  return best;
}

/* Rust regex \s: the Unicode White_Space property. */
static int is_space(int32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

/* Rust regex \w: Alphabetic, marks, decimal digits, connector punctuation, joiners. */
static int is_word(int32_t c) {
  if (c < 0x80)
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  if (c == 0x200C || c == 0x200D || (c >= 0x24B6 && c <= 0x24E9) || (c >= 0x1F130 && c <= 0x1F189))
    return 1;
  switch (utf8proc_category(c)) {
  case UTF8PROC_CATEGORY_LU:
  case UTF8PROC_CATEGORY_LL:
  case UTF8PROC_CATEGORY_LT:
  case UTF8PROC_CATEGORY_LM:
  case UTF8PROC_CATEGORY_LO:
  case UTF8PROC_CATEGORY_MN:
  case UTF8PROC_CATEGORY_MC:
  case UTF8PROC_CATEGORY_ME:
  case UTF8PROC_CATEGORY_ND:
  case UTF8PROC_CATEGORY_NL:
  case UTF8PROC_CATEGORY_PC: return 1;
  default: return 0;
  }
}

/* The code point ending at s[i) (i > 0), and its start. s is valid UTF-8. */
static int32_t char_before(const char *s, size_t i, size_t *start) {
  size_t j = i - 1;
  while (j > 0 && ((uint8_t)s[j] & 0xC0) == 0x80)
    j--;
  int32_t cp;
  lm_utf8_next(s + j, i - j, &cp);
  *start = j;
  return cp;
}

static int32_t char_at(const char *s, size_t n, size_t i, size_t *len) {
  int32_t cp;
  *len = lm_utf8_next(s + i, n - i, &cp);
  return cp;
}

/* Applies a match's flags; returns 0 if single_word discards it. */
static int adjust_match(const lm_tok_added *a, const char *s, size_t n, size_t done, size_t *start,
                        size_t *stop) {
  size_t k;
  if (a->single_word) {
    size_t dummy;
    if (*start > 0 && is_word(char_before(s, *start, &dummy))) return 0;
    if (*stop < n && is_word(char_at(s, n, *stop, &k))) return 0;
  }
  if (a->lstrip) {
    size_t b = *start, j;
    while (b > 0 && is_space(char_before(s, b, &j)))
      b = j;
    *start = b > done ? b : done; /* spaces an earlier match already took stay with it */
  }
  if (a->rstrip)
    while (*stop < n && is_space(char_at(s, n, *stop, &k)))
      *stop += k;
  return 1;
}

lm_status lm_tok_added_split(const lm_tokenizer *t, const lm_tok_trie *tr, const char *s, size_t n,
                             size_t base_off, lm_tspans *out) {
  const uint8_t *p = (const uint8_t *)s;
  size_t done = 0; /* end of the last emitted span */
  size_t i = 0;
  while (i < n) {
    int32_t tok;
    size_t len;
    if (tr->root[p[i]] < 0 || !(len = longest_at(tr, p + i, n - i, &tok))) {
      i++;
      continue;
    }
    size_t start = i, stop = i + len;
    i = stop; /* the scan resumes after the raw match, whatever the flags do */
    if (!adjust_match(&t->added[tok], s, n, done, &start, &stop)) continue;
    if (start > done) LM_TRY(lm_tspans_push(out, base_off + done, start - done, -1));
    LM_TRY(lm_tspans_push(out, base_off + start, stop - start, t->added[tok].id));
    done = stop;
    if (i < done) i = done; /* rstrip took text past the match */
  }
  if (done < n) LM_TRY(lm_tspans_push(out, base_off + done, n - done, -1));
  return LM_OK;
}
