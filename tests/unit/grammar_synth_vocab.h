/* grammar_synth_vocab.h — a synthetic tokenizer vocabulary for mask benchmarks, shaped like a
 * large real one (Gemma's 262144 pieces): the 256 byte-fallback bytes, ASCII words with and
 * without a leading space and capitalized, numbers, punctuation runs and JSON-ish combinations,
 * whitespace runs, and random UTF-8 (accented words, CJK, emoji). Pieces are distinct; the same
 * seed gives the same vocabulary. Also a greedy longest-match tokenizer over it, to force a
 * given text through a matcher token by token. Static functions for the tests that include it. */
#ifndef LM_TESTS_GRAMMAR_SYNTH_VOCAB_H
#define LM_TESTS_GRAMMAR_SYNTH_VOCAB_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "grammar/vocab.h"

typedef struct sv_set {
  char **p;
  size_t *l;
  int n, cap;
  uint64_t *slot; /* hash + 1, open addressing over pieces */
  int *idx;
  size_t mask;
} sv_set;

static inline uint64_t sv_hash(const char *s, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; i++)
    h = (h ^ (uint8_t)s[i]) * 0x100000001b3ull;
  return lm_mix64(h) | 1;
}

static inline void sv_add(sv_set *v, const char *s, size_t n) {
  if (n == 0 || v->n >= v->cap) return;
  uint64_t h = sv_hash(s, n);
  size_t k = h & v->mask;
  for (; v->slot[k]; k = (k + 1) & v->mask)
    if (v->slot[k] == h && v->l[v->idx[k]] == n && !memcmp(v->p[v->idx[k]], s, n)) return;
  v->slot[k] = h;
  v->idx[k] = v->n;
  v->p[v->n] = malloc(n);
  memcpy(v->p[v->n], s, n);
  v->l[v->n++] = n;
}

static inline int sv_utf8(uint32_t cp, char *o) {
  if (cp < 0x80) return o[0] = (char)cp, 1;
  if (cp < 0x800) return o[0] = (char)(0xC0 | cp >> 6), o[1] = (char)(0x80 | (cp & 63)), 2;
  if (cp < 0x10000)
    return o[0] = (char)(0xE0 | cp >> 12), o[1] = (char)(0x80 | ((cp >> 6) & 63)),
           o[2] = (char)(0x80 | (cp & 63)), 3;
  o[0] = (char)(0xF0 | cp >> 18), o[1] = (char)(0x80 | ((cp >> 12) & 63));
  o[2] = (char)(0x80 | ((cp >> 6) & 63)), o[3] = (char)(0x80 | (cp & 63));
  return 4;
}

/* n pieces (n >= 512). Byte-fallback pieces are ids 0..255. */
static inline lm_grammar_vocab *sv_make(int n, uint64_t seed) {
  sv_set v = {0};
  v.cap = n;
  v.p = calloc((size_t)n, sizeof *v.p);
  v.l = calloc((size_t)n, sizeof *v.l);
  v.mask = 1;
  while (v.mask < (size_t)n * 2)
    v.mask <<= 1;
  v.slot = calloc(v.mask, sizeof *v.slot);
  v.idx = calloc(v.mask, sizeof *v.idx);
  v.mask--;
  for (int b = 0; b < 256; b++) { /* byte fallback: never deduplicated against others */
    char c = (char)b;
    v.p[v.n] = malloc(1);
    v.p[v.n][0] = c;
    v.l[v.n++] = 1;
  }
  static const char *const punct = "{}[]\":,.;!?'()-_/\\ <>=+*&%$#@|~`^\n\t";
  size_t np = strlen(punct);
  char t[64];
  for (size_t i = 0; i < np; i++)
    for (size_t j = 0; j < np; j++) {
      t[0] = punct[i], t[1] = punct[j];
      sv_add(&v, t, 2);
      for (size_t k = 0; k < 12; k++) {
        t[2] = punct[(i * 7 + j * 3 + k) % np];
        sv_add(&v, t, 3);
      }
    }
  for (int k = 1; k <= 32; k++) { /* whitespace runs, newline + indentation */
    memset(t, ' ', (size_t)k);
    sv_add(&v, t, (size_t)k);
    t[0] = '\n';
    sv_add(&v, t, (size_t)k);
  }
  static const char *const json[] = {
      "{\"",   "\":",  "\": ", "\",",   "\", \"", "\"}", "}}",  "},",  "[{",  "\"]",  "true",
      "false", "null", ": \"", "\":\"", "\"\n",   ",\n", "{\n", "[\n", "\\n", "\\\"", "\\u"};
  for (size_t i = 0; i < sizeof json / sizeof *json; i++)
    sv_add(&v, json[i], strlen(json[i]));
  for (int i = 0; i < 20000 && v.n < n; i++) { /* numbers */
    int len = snprintf(t, sizeof t, "%d", i % 1000 + (i / 1000) * 1000 * (i % 7));
    sv_add(&v, t, (size_t)len);
    t[0] = ' ';
    len = snprintf(t + 1, sizeof t - 1, "%d", i % 1000);
    sv_add(&v, t, (size_t)len + 1);
  }
  static const char *const syl[] = {"a",   "e",   "i",  "o",   "u",  "an",   "en",   "in",  "on",
                                    "er",  "th",  "st", "ing", "ed", "re",   "ch",   "sh",  "al",
                                    "is",  "or",  "ar", "le",  "ti", "co",   "de",   "ma",  "ne",
                                    "pro", "con", "ex", "ab",  "ly", "tion", "ment", "ous", "qu"};
  size_t ns = sizeof syl / sizeof *syl;
  lm_rng rng = {seed, 0};
  int utf8_quota = n / 8;
  while (v.n < n - utf8_quota) { /* words */
    int k = 1 + (int)(lm_rng_next(&rng) % 4), len = 0;
    uint64_t r = lm_rng_next(&rng);
    if (r % 3 == 0) t[len++] = ' ';
    int cap0 = len;
    for (int s = 0; s < k; s++) {
      const char *y = syl[lm_rng_next(&rng) % ns];
      size_t yl = strlen(y);
      memcpy(t + len, y, yl);
      len += (int)yl;
    }
    if (r % 5 == 1) t[cap0] = (char)(t[cap0] - 'a' + 'A');
    if (r % 11 == 2) t[len++] = punct[r % np];
    sv_add(&v, t, (size_t)len);
  }
  while (v.n < n) { /* UTF-8: accented words, CJK, emoji, partial runs */
    uint64_t r = lm_rng_next(&rng);
    int len = 0, k = 1 + (int)(r % 3);
    if (r % 4 == 0) t[len++] = ' ';
    for (int s = 0; s < k; s++) {
      uint64_t q = lm_rng_next(&rng);
      uint32_t cp;
      switch (q % 4) {
      case 0: cp = 0xE0 + (uint32_t)(q >> 8) % 0x20; break;     /* Latin-1 letters */
      case 1: cp = 0x4E00 + (uint32_t)(q >> 8) % 0x5000; break; /* CJK */
      case 2: cp = 0x1F300 + (uint32_t)(q >> 8) % 0x300; break; /* emoji */
      default: cp = 'a' + (uint32_t)(q >> 8) % 26; break;
      }
      len += sv_utf8(cp, t + len);
    }
    sv_add(&v, t, (size_t)len);
  }
  lm_grammar_vocab *out = NULL;
  lm_grammar_vocab_create((const char *const *)v.p, v.l, v.n, &out);
  for (int i = 0; i < v.n; i++)
    free(v.p[i]);
  free(v.p);
  free(v.l);
  free(v.slot);
  free(v.idx);
  return out;
}

/* The id of the longest piece that prefixes s[0..n) (the trie walked down), -1 if none. */
static inline int32_t sv_longest(const lm_grammar_vocab *v, const char *s, size_t n, size_t *len) {
  uint32_t node = 0;
  int32_t best = -1;
  *len = 0;
  for (size_t i = 0; i < n; i++) {
    uint32_t c = node + 1, found = 0;
    while (c < v->nend[node]) {
      if (v->nbyte[c] == (uint8_t)s[i]) {
        found = c;
        break;
      }
      c = v->nend[c];
    }
    if (!found) break;
    node = found;
    if (v->ntok[node + 1] > v->ntok[node]) {
      best = v->tok[v->ntok[node]];
      *len = i + 1;
    }
  }
  return best;
}

#endif
