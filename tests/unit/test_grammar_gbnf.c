/* test_grammar_gbnf.c — GBNF grammars: parse errors with line and column; acceptance and
 * rejection of strings for many grammars (literals, classes, Unicode at the byte level,
 * repetition, recursion, nullable rules); fill_mask against a brute-force mask along random
 * walks; the matcher's accept/complete/finished/reset contract. */
#include "grammar_testlib.h"

typedef struct gcase {
  const char *gbnf;
  const char *yes[8];
  const char *no[8];
} gcase;

static const gcase k_cases[] = {
    {"root ::= \"abc\"", {"abc"}, {"", "ab", "abcd", "abd"}},
    {"root ::= \"a\" | \"b\" | \"\"", {"a", "b", ""}, {"ab", "c"}},
    {"root ::= [a-c]+", {"a", "abcabc", "ccc"}, {"", "d", "abd"}},
    {"root ::= [^a-c]*", {"", "xyz", "日本", "\n"}, {"a", "xa", "\xff", "\xe6\x97"}},
    {"root ::= \"x\"{2,4}", {"xx", "xxx", "xxxx"}, {"x", "xxxxx", ""}},
    {"root ::= \"x\"{3}", {"xxx"}, {"xx", "xxxx"}},
    {"root ::= \"x\"{2,}", {"xx", "xxxxxxxxxx"}, {"x", ""}},
    {"root ::= (\"ab\" | \"a\")* \"c\"", {"c", "abc", "aababc", "ac"}, {"ab", "b", "abbc"}},
    {"root ::= expr\nexpr ::= term (\"+\" term)*\nterm ::= [0-9]+ | \"(\" expr \")\"",
     {"1", "1+2", "(1+2)+3", "((4))"},
     {"", "1+", "(1", "1)", "+1"}},
    {"root ::= \"[\" (item (\",\" item)*)? \"]\"\nitem ::= root | [a-z]",
     {"[]", "[a]", "[a,b]", "[[a],[]]"},
     {"[", "[a,]", "[,]", "a"}},
    {"root ::= a b c\na ::= \"x\"?\nb ::= \"y\"*\nc ::= \"z\" | \"\"",
     {"", "x", "xyyz", "z", "yz"},
     {"zx", "xx", "zz"}},
    {"root ::= .", {"a", "é", "日", "\xf0\x9f\x98\x80"}, {"", "ab", "\xc3", "\xed\xa0\x80"}},
    {"root ::= [\\u00e9\\u65e5-\\u65e6] \"\\x41\"", {"éA", "日A", "旦A"}, {"eA", "é", "旧A"}},
    {"root ::= \"\\\"\" [\\t\\n\\\\]* \"\\\"\"", {"\"\"", "\"\t\n\\\""}, {"\"a\""}},
    {"# a comment\nroot ::= ( # inside\n  \"a\"\n  | \"b\" # more\n) \"c\"\n", {"ac", "bc"}, {"c"}},
    {"root ::=\n  \"a\" |\n  \"b\"", {"a", "b"}, {"ab"}},
    {"root ::= (\"a\"?){0,3} \"b\"", {"b", "ab", "aaab"}, {"aaaab"}},
    {"root ::= x\nx ::= \"(\" x \")\" | \"\"", {"", "()", "((()))"}, {"(()", "())"}},
    {"root ::= [a-z-]+ [-]", {"a-", "--"}, {"a"}},
};

static void t_accept_reject(void **state) {
  (void)state;
  lm_grammar_vocab *v = gt_json_vocab();
  for (size_t c = 0; c < sizeof k_cases / sizeof *k_cases; c++) {
    lm_grammar *g = gt_gbnf(k_cases[c].gbnf);
    for (int k = 0; k < 8 && k_cases[c].yes[k]; k++) {
      const char *s = k_cases[c].yes[k];
      if (!gt_accepts(g, v, s, strlen(s)))
        fail_msg("grammar %zu rejects \"%s\"\n%s", c, s, k_cases[c].gbnf);
    }
    for (int k = 0; k < 8 && k_cases[c].no[k]; k++) {
      const char *s = k_cases[c].no[k];
      if (gt_accepts(g, v, s, strlen(s)))
        fail_msg("grammar %zu accepts \"%s\"\n%s", c, s, k_cases[c].gbnf);
    }
    lm_grammar_free(g);
  }
  /* The empty case's "" is checked separately: gt_accepts("") is the start state complete. */
  lm_grammar_vocab_free(v);
}

typedef struct ecase {
  const char *gbnf;
  const char *where; /* "gbnf:L:C" */
  const char *what;
} ecase;

static const ecase k_errors[] = {
    {"root ::= \"abc", "gbnf:1:10", "unterminated literal"},
    {"root ::= [a-", "gbnf:1:10", "unterminated character class"},
    {"root ::= x", "gbnf:1:10", "undefined rule 'x'"},
    {"\nroot ::= \"a\"\nroot ::= \"b\"", "gbnf:3:1", "defined twice"},
    {"root = \"a\"", "gbnf:1:6", "expected '::='"},
    {"a ::= \"a\"", "gbnf", "no rule named 'root'"},
    {"root ::= (\"a\"", "gbnf:1:10", "unclosed '('"},
    {"root ::= \"a\"{3,1}", "gbnf:1:13", "n < m"},
    {"root ::= \"a\" )", "gbnf:1:14", "unexpected ')'"},
    {"root ::= \"\\q\"", "gbnf:1:11", "unknown escape"},
    {"root ::= [z-a]", "gbnf:1:13", "range end before its start"},
    {"root ::= root \"a\" | \"b\"", "", "left-recursive"},
    {"root ::= x\nx ::= \"a\" x", "", "matches no finite string"},
    {"root ::= \"\\uD800\"", "gbnf:1:11", "not a Unicode scalar value"},
    {"root ::= \"\xff\"", "gbnf:1:11", "invalid UTF-8"},
    {"root ::= (\"a\"?){0,1000}", "", "limited to 64"},
    {"root ::= [^\\x00-\\U0010FFFF]", "gbnf:1:10", "matches nothing"},
};

static void t_errors(void **state) {
  (void)state;
  for (size_t c = 0; c < sizeof k_errors / sizeof *k_errors; c++) {
    lm_grammar *g = NULL;
    lm_status s = lm_grammar_from_gbnf(k_errors[c].gbnf, strlen(k_errors[c].gbnf), &g);
    if (s == LM_OK) fail_msg("case %zu parsed: %s", c, k_errors[c].gbnf);
    assert_null(g);
    gt_assert_msg_has(k_errors[c].where);
    gt_assert_msg_has(k_errors[c].what);
  }
  /* A NUL byte inside the text is named, not read as the end. */
  lm_grammar *g = NULL;
  assert_int_equal(lm_grammar_from_gbnf("root ::= \"a\"\0x", 14, &g), LM_ERR_INVALID);
  gt_assert_msg_has("NUL");
}

/* Masks equal brute force all along random walks, for every grammar above. */
static void t_masks_brute_force(void **state) {
  (void)state;
  lm_grammar_vocab *v = gt_json_vocab();
  char buf[4096];
  for (size_t c = 0; c < sizeof k_cases / sizeof *k_cases; c++) {
    lm_grammar *g = gt_gbnf(k_cases[c].gbnf);
    for (uint64_t seed = 1; seed <= 4; seed++) {
      long n = gt_random_walk(g, v, seed * 7919 + c, 40, 1, buf, sizeof buf);
      if (n >= 0 && !gt_accepts(g, v, buf, (size_t)n))
        fail_msg("grammar %zu: walk made \"%s\", which it rejects", c, buf);
    }
    lm_grammar_free(g);
  }
  lm_grammar_vocab_free(v);
}

static void t_matcher_contract(void **state) {
  (void)state;
  lm_grammar_vocab *v = gt_json_vocab();
  lm_grammar *g = gt_gbnf("root ::= \"ab\" \"c\"?");
  lm_matcher *m = NULL;
  assert_int_equal(lm_matcher_create(g, v, &m), LM_OK);
  assert_false(lm_matcher_complete(m));
  /* 'b' first is refused and leaves the state as it was. */
  assert_int_equal(lm_matcher_accept(m, 'b'), LM_ERR_INVALID);
  gt_assert_msg_has("not allowed");
  assert_int_equal(lm_matcher_accept(m, 'a'), LM_OK);
  assert_int_equal(lm_matcher_accept(m, 'x'), LM_ERR_INVALID);
  assert_int_equal(lm_matcher_accept(m, 'b'), LM_OK);
  assert_true(lm_matcher_complete(m));
  assert_false(lm_matcher_finished(m));
  assert_int_equal(lm_matcher_accept_bytes(m, "c", 1), LM_OK);
  assert_true(lm_matcher_finished(m));
  uint32_t mask[(256 + 80) / 32 + 2];
  assert_int_equal(lm_matcher_fill_mask(m, mask), LM_OK);
  for (int i = 0; i < (v->n + 31) / 32; i++)
    assert_int_equal(mask[i], 0);
  /* The special token (length 0) and ids outside the vocabulary are never allowed. */
  assert_int_equal(lm_matcher_accept(m, v->n - 1), LM_ERR_INVALID);
  assert_int_equal(lm_matcher_accept(m, v->n), LM_ERR_INVALID);
  assert_int_equal(lm_matcher_accept(m, -1), LM_ERR_INVALID);
  lm_matcher_reset(m);
  assert_false(lm_matcher_complete(m));
  assert_int_equal(lm_matcher_accept_bytes(m, "abd", 3), LM_ERR_INVALID);
  assert_int_equal(lm_matcher_accept_bytes(m, "ab", 2), LM_OK);
  assert_true(lm_matcher_complete(m));
  lm_matcher_free(m);
  lm_grammar_free(g);
  lm_grammar_vocab_free(v);
}

/* A byte-fallback token carrying half of a character is judged byte by byte. */
static void t_partial_utf8(void **state) {
  (void)state;
  lm_grammar_vocab *v = gt_json_vocab();
  lm_grammar *g = gt_gbnf("root ::= [\\u65e5]+");
  lm_matcher *m = NULL;
  assert_int_equal(lm_matcher_create(g, v, &m), LM_OK);
  assert_int_equal(lm_matcher_accept(m, 0xe6), LM_OK);
  assert_false(lm_matcher_complete(m));
  gt_check_mask(m);
  assert_int_equal(lm_matcher_accept(m, 0x98), LM_ERR_INVALID);
  assert_int_equal(lm_matcher_accept(m, 0x97), LM_OK);
  assert_int_equal(lm_matcher_accept(m, 0xa5), LM_OK);
  assert_true(lm_matcher_complete(m));
  gt_check_mask(m);
  lm_matcher_free(m);
  lm_grammar_free(g);
  lm_grammar_vocab_free(v);
}

/* Thousands of steps: frames are compacted, the state stays right. */
static void t_long_run(void **state) {
  (void)state;
  lm_grammar_vocab *v = gt_json_vocab();
  lm_grammar *g = gt_gbnf("root ::= (\"(\" root \")\" | [a-z])*");
  lm_matcher *m = NULL;
  assert_int_equal(lm_matcher_create(g, v, &m), LM_OK);
  for (int i = 0; i < 3000; i++)
    assert_int_equal(lm_matcher_accept_bytes(m, "(ab", 3), LM_OK);
  for (int i = 0; i < 3000; i++)
    assert_int_equal(lm_matcher_accept_bytes(m, ")", 1), LM_OK);
  assert_true(lm_matcher_complete(m));
  assert_true(m->pda.fr.n < 100000);
  gt_check_mask(m);
  lm_matcher_free(m);
  lm_grammar_free(g);
  lm_grammar_vocab_free(v);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(t_accept_reject),     cmocka_unit_test(t_errors),
      cmocka_unit_test(t_masks_brute_force), cmocka_unit_test(t_matcher_contract),
      cmocka_unit_test(t_partial_utf8),      cmocka_unit_test(t_long_run),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
