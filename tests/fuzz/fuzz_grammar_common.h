/* fuzz_grammar_common.h — what the grammar fuzz targets share: a small vocabulary (every byte
 * plus multi-byte pieces) and a walk that checks the matcher's invariants: every mask equals a
 * brute-force mask (each token stepped from the state), a token the mask allows is accepted and
 * one it refuses is not (leaving the state unchanged). Aborts on a violation. */
#ifndef LM_FUZZ_GRAMMAR_COMMON_H
#define LM_FUZZ_GRAMMAR_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "grammar/matcher_impl.h"

static lm_grammar_vocab *fz_vocab(void) {
  static const char *const extra[] = {
      "{\"", "\":",   "\",", "\"}",  "[{",   "true",     "null", "12", " \"", "ab", "abc",
      "\\n", "\\u00", "é",   "日本", "\n  ", "\xe6\x97", "\xa5", "]}", "},",  "0.", "-1",
      "e+",  "a\"",   "xyz", "(",    ")",    "((",       "))",   " ",  "  ",  "\t"};
  int n = 256 + (int)(sizeof extra / sizeof *extra) + 1;
  const char *p[512];
  size_t l[512];
  char bytes[256];
  for (int i = 0; i < 256; i++)
    bytes[i] = (char)i, p[i] = &bytes[i], l[i] = 1;
  for (int i = 256; i < n - 1; i++)
    p[i] = extra[i - 256], l[i] = strlen(extra[i - 256]);
  p[n - 1] = "", l[n - 1] = 0;
  lm_grammar_vocab *v = NULL;
  if (lm_grammar_vocab_create(p, l, n, &v) != LM_OK) abort();
  return v;
}

/* 1 when token t is accepted from m's state (stepped on a copy, rolled back); -1 when the step
 * is refused as too ambiguous (grammar.h allows accept to fail so for an allowed token). */
static int fz_takes(lm_matcher *m, int32_t t) {
  const lm_grammar_vocab *v = m->v;
  uint32_t len = v->len[t], mark = m->pda.fr.n;
  if (!len) return 0;
  lm_gstate a = {0}, b = {0};
  int ok = lm_gstate_copy(&a, &m->cur) == LM_OK;
  for (uint32_t i = 0; i < len && ok; i++) {
    lm_status s = a.n ? lm_gpda_step(&m->pda, &a, (uint8_t)v->bytes[v->off[t] + i], &b) : LM_OK;
    if (s == LM_ERR_UNSUPPORTED) ok = -1;
    if (s != LM_OK || a.n == 0) {
      ok = ok < 0 ? -1 : 0;
      break;
    }
    lm_gstate sw = a;
    a = b;
    b = sw;
  }
  if (ok > 0) ok = a.n || a.accept;
  lm_gstate_free(&a);
  lm_gstate_free(&b);
  lm_gframes_rollback(&m->pda.fr, mark);
  return ok;
}

/* Walks up to `steps` tokens picked by the choice bytes; returns the text in out (cap bytes) and
 * whether it ended complete. */
static int fz_walk(const lm_grammar *g, const lm_grammar_vocab *v, const uint8_t *choice,
                   size_t n_choice, int steps, char *out, size_t cap, size_t *out_len) {
  lm_matcher *m = NULL;
  *out_len = 0;
  if (lm_matcher_create(g, v, &m) != LM_OK) return 0;
  uint32_t mask[(512 + 31) / 32];
  int32_t allowed[512];
  size_t len = 0;
  for (int s = 0; s < steps; s++) {
    lm_status st = lm_matcher_fill_mask(m, mask);
    if (st != LM_OK) break; /* e.g. too ambiguous: refused, not crashed */
    int n = 0, ambiguous = 0;
    for (int32_t t = 0; t < v->n; t++) {
      int bit = (mask[t >> 5] >> (t & 31)) & 1, takes = fz_takes(m, t);
      if (takes < 0)
        ambiguous = 1;
      else if (bit != takes) {
        fprintf(stderr, "mask bit %d for token %d disagrees with brute force\n", bit, t);
        abort();
      }
      if (bit) allowed[n++] = t;
    }
    /* A state of hundreds of parses is a pathological grammar: its invariants were checked. */
    if (n == 0 || ambiguous || m->cur.n > 256) break;
    uint8_t c = n_choice ? choice[s % n_choice] : (uint8_t)s;
    /* A refused token leaves the state as it was. */
    for (int32_t t = c; t < v->n; t++)
      if (!((mask[t >> 5] >> (t & 31)) & 1)) {
        if (lm_matcher_accept(m, t) == LM_OK) abort();
        break;
      }
    int32_t t = allowed[(c * 7 + (uint8_t)s) % n];
    if (len + v->len[t] > cap) break; /* out always holds exactly what was accepted */
    lm_status as = lm_matcher_accept(m, t);
    if (as == LM_ERR_UNSUPPORTED) break; /* too ambiguous: refused cleanly */
    if (as != LM_OK) abort();
    memcpy(out + len, v->bytes + v->off[t], v->len[t]);
    len += v->len[t];
    if (lm_matcher_complete(m) && c % 3 == 0) break;
  }
  int complete = lm_matcher_complete(m);
  lm_matcher_free(m);
  *out_len = len;
  return complete;
}

#endif
