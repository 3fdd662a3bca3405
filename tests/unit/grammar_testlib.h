/* grammar_testlib.h — what the grammar tests share: small vocabularies, whole-string acceptance,
 * a brute-force mask (every token stepped from the current state) to hold fill_mask against,
 * and a random walk through the masks that generates strings of the grammar. Static functions:
 * each test file includes it once. */
#ifndef LM_TESTS_GRAMMAR_TESTLIB_H
#define LM_TESTS_GRAMMAR_TESTLIB_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "base/status.h"
#include "grammar/grammar.h"
#include "grammar/matcher_impl.h"

/* Every single byte, then the pieces given, then one special token (length 0). */
static inline lm_grammar_vocab *gt_vocab(const char *const *extra, int n_extra) {
  int n = 256 + n_extra + 1;
  const char **p = calloc((size_t)n, sizeof *p);
  size_t *l = calloc((size_t)n, sizeof *l);
  char bytes[256]; /* the vocabulary copies its pieces */
  for (int i = 0; i < 256; i++) {
    bytes[i] = (char)i;
    p[i] = &bytes[i];
    l[i] = 1;
  }
  for (int i = 0; i < n_extra; i++) {
    p[256 + i] = extra[i];
    l[256 + i] = strlen(extra[i]);
  }
  p[n - 1] = "";
  l[n - 1] = 0;
  lm_grammar_vocab *v = NULL;
  assert_int_equal(lm_grammar_vocab_create(p, l, n, &v), LM_OK);
  free(p);
  free(l);
  return v;
}

/* A vocabulary of JSON-ish pieces: the bytes plus common multi-byte tokens. */
static inline lm_grammar_vocab *gt_json_vocab(void) {
  static const char *const extra[] = {
      "{\"",    "\":",   "\": ", "\",",  "\", \"", "\"}", "}}",  "},",    "[{",   "\"]",
      "true",   "false", "null", "nul",  "tr",     "12",  "123", "0.",    "-1",   "e+",
      " \"",    "\"\"",  "\\n",  "\\\"", "\\u00",  "ab",  "abc", "hello", " the", "name",
      "\"name", "age",   "\n  ", "\n",   "  ",     ", ",  ": ",  "é",     "日本", "\xe6\x97",
      "\xa5",   "],",    "]}",   "[]",   "{}",     "1,",  "0,",  "\":\"", ".5",   "00",
      "\"a",    "a\"",   "x\"}", "\\\\", "\\/",    "\\t", "\\u", "2024-", "-01",  "T12:",
  };
  return gt_vocab(extra, (int)(sizeof extra / sizeof *extra));
}

static inline lm_grammar *gt_gbnf(const char *text) {
  lm_grammar *g = NULL;
  lm_status s = lm_grammar_from_gbnf(text, strlen(text), &g);
  if (s != LM_OK) fail_msg("gbnf failed: %s\n%s", lm_errmsg(), text);
  return g;
}

/* 1 when the whole string is a sentence of g. */
static inline int gt_accepts(const lm_grammar *g, const lm_grammar_vocab *v, const char *s,
                             size_t n) {
  lm_matcher *m = NULL;
  assert_int_equal(lm_matcher_create(g, v, &m), LM_OK);
  int ok = lm_matcher_accept_bytes(m, s, n) == LM_OK && lm_matcher_complete(m);
  lm_matcher_free(m);
  return ok;
}

/* Every token stepped from m's state, rolled back after. */
static inline void gt_brute_mask(lm_matcher *m, uint32_t *mask) {
  const lm_grammar_vocab *v = m->v;
  memset(mask, 0, ((size_t)v->n + 31) / 32 * sizeof *mask);
  lm_gstate a = {0}, b = {0};
  for (int32_t t = 0; t < v->n; t++) {
    uint32_t len = v->len[t];
    if (!len) continue;
    uint32_t mark = m->pda.fr.n;
    assert_int_equal(lm_gstate_copy(&a, &m->cur), LM_OK);
    const uint8_t *p = (const uint8_t *)v->bytes + v->off[t];
    int ok = 1;
    for (uint32_t i = 0; i < len && ok; i++) {
      if (a.n == 0)
        ok = 0;
      else {
        assert_int_equal(lm_gpda_step(&m->pda, &a, p[i], &b), LM_OK);
        lm_gstate t2 = a;
        a = b;
        b = t2;
      }
    }
    if (ok && (a.n || a.accept)) mask[t >> 5] |= 1u << (t & 31);
    lm_gframes_rollback(&m->pda.fr, mark);
  }
  lm_gstate_free(&a);
  lm_gstate_free(&b);
}

static inline void gt_check_mask(lm_matcher *m) {
  size_t nw = ((size_t)m->v->n + 31) / 32;
  uint32_t *a = calloc(nw, 4), *b = calloc(nw, 4);
  assert_int_equal(lm_matcher_fill_mask(m, a), LM_OK);
  gt_brute_mask(m, b);
  for (size_t i = 0; i < nw * 32 && i < (size_t)m->v->n; i++) {
    int x = (a[i >> 5] >> (i & 31)) & 1, y = (b[i >> 5] >> (i & 31)) & 1;
    if (x != y) {
      const lm_grammar_vocab *v = m->v;
      fail_msg("mask differs at token %zu ('%.*s'): fill_mask %d, brute force %d", i,
               (int)v->len[i], v->bytes + v->off[i], x, y);
    }
  }
  free(a);
  free(b);
}

/* Generates one sentence by a random walk through the masks (stopping with probability 1/4 once
 * complete, or when nothing may follow); checks every mask against brute force when `brute`.
 * Tokens holding a byte of `closers` are 16 times as likely (so strings and arrays end).
 * Returns the length written to out (NUL-terminated), or -1 when the walk passed max_tokens
 * without completing. */
static inline long gt_walk(const lm_grammar *g, const lm_grammar_vocab *v, uint64_t seed,
                           int max_tokens, int brute, const char *closers, char *out, size_t cap) {
  lm_matcher *m = NULL;
  assert_int_equal(lm_matcher_create(g, v, &m), LM_OK);
  size_t nw = ((size_t)v->n + 31) / 32, len = 0;
  uint32_t *mask = calloc(nw, 4);
  int32_t *allowed = calloc((size_t)v->n * 16 + 1, sizeof *allowed);
  lm_rng rng = {seed, 0};
  long result = -1;
  for (int step = 0; step < max_tokens; step++) {
    if (lm_matcher_complete(m) && (lm_matcher_finished(m) || lm_rng_next(&rng) % 4 == 0)) {
      result = (long)len;
      break;
    }
    if (brute) gt_check_mask(m);
    assert_int_equal(lm_matcher_fill_mask(m, mask), LM_OK);
    int n = 0;
    for (int32_t t = 0; t < v->n; t++) {
      if (!((mask[t >> 5] >> (t & 31)) & 1)) continue;
      int w = 1;
      for (uint32_t k = 0; closers && k < v->len[t]; k++)
        if (strchr(closers, v->bytes[v->off[t] + k])) w = 16;
      for (int k = 0; k < w; k++)
        allowed[n++] = t;
    }
    if (n == 0) fail_msg("no token allowed in an incomplete state after '%.*s'", (int)len, out);
    int32_t t = allowed[lm_rng_next(&rng) % (uint64_t)n];
    assert_int_equal(lm_matcher_accept(m, t), LM_OK);
    if (len + v->len[t] + 1 > cap) break;
    memcpy(out + len, v->bytes + v->off[t], v->len[t]);
    len += v->len[t];
    out[len] = '\0';
  }
  out[len] = '\0';
  free(mask);
  free(allowed);
  lm_matcher_free(m);
  return result;
}

static inline long gt_random_walk(const lm_grammar *g, const lm_grammar_vocab *v, uint64_t seed,
                                  int max_tokens, int brute, char *out, size_t cap) {
  return gt_walk(g, v, seed, max_tokens, brute, NULL, out, cap);
}

static inline void gt_assert_msg_has(const char *needle) {
  if (!strstr(lm_errmsg(), needle)) fail_msg("message \"%s\" lacks \"%s\"", lm_errmsg(), needle);
}

#endif
