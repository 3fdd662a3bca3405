/* test_tokenizer.c — the tokenizer on two small hand-made tokenizer.json files
 * (tests/data/tokenizer/): sp_bpe.json (SentencePiece-style BPE: "▁" normalizer, pair merges,
 * byte fallback with some byte tokens missing, fuse_unk, added tokens with lstrip / rstrip /
 * single_word / normalized, a Strip decoder) and byte_bpe.json (byte-level BPE: "a b" merges,
 * Llama 3's regex, NFC, ignore_merges, a Sequence post-processor). Expected ids and texts were
 * produced by HF tokenizers 0.23.2 on the same files (the golden test re-checks both files against
 * it on generated strings). Also: BOS rules, streaming, UTF-8 repair, and bad files. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "text/tokenizer.h"
#include "text/utf8.h"

#define SP_BPE LM_SOURCE_DIR "/tests/data/tokenizer/sp_bpe.json"
#define BYTE_BPE LM_SOURCE_DIR "/tests/data/tokenizer/byte_bpe.json"
#define TMP_DIR LM_BUILD_DIR "/tokenizer_unit"

static lm_tokenizer *load(const char *path) {
  lm_tokenizer *t = NULL;
  lm_status s = lm_tokenizer_load(path, &t);
  if (s != LM_OK) fail_msg("load %s: %s", path, lm_errmsg());
  return t;
}

static void expect_ids(const lm_tokenizer *t, const char *text, size_t len, int add_special,
                       const int32_t *want, size_t n) {
  int32_t *ids;
  size_t got;
  assert_int_equal(lm_tokenizer_encode(t, text, len, add_special, &ids, &got), LM_OK);
  if (got != n || (n && memcmp(ids, want, n * sizeof *ids))) {
    printf("encode(%s, special=%d): got", text, add_special);
    for (size_t i = 0; i < got; i++)
      printf(" %d", ids[i]);
    printf("\n");
    free(ids);
    fail_msg("ids differ for '%s'", text);
  }
  free(ids);
}
#define EXPECT(t, text, sp, ...)                                                                   \
  do {                                                                                             \
    static const int32_t want_[] = {__VA_ARGS__};                                                  \
    expect_ids(t, text, strlen(text), sp, want_, sizeof want_ / sizeof want_[0]);                  \
  } while (0)

static void expect_text(const lm_tokenizer *t, const int32_t *ids, size_t n, int skip,
                        const char *want) {
  char *text;
  size_t len;
  assert_int_equal(lm_tokenizer_decode(t, ids, n, skip, &text, &len), LM_OK);
  assert_int_equal(len, strlen(want));
  assert_string_equal(text, want);
  free(text);
}
#define DECODES(t, skip, want, ...)                                                                \
  do {                                                                                             \
    static const int32_t ids_[] = {__VA_ARGS__};                                                   \
    expect_text(t, ids_, sizeof ids_ / sizeof ids_[0], skip, want);                                \
  } while (0)

/* ---- SentencePiece-style BPE ------------------------------------------------------------ */
static void t_sp_lookup(void **state) {
  (void)state;
  lm_tokenizer *t = load(SP_BPE);
  assert_int_equal(lm_tokenizer_vocab_size(t), 282);
  assert_int_equal(lm_tokenizer_find(t, "<|turn>", 7), 276);
  assert_int_equal(lm_tokenizer_find(t, "▁hello", strlen("▁hello")), 266);
  assert_int_equal(lm_tokenizer_find(t, "<0x41>", 6), 4 + 0x41);
  assert_int_equal(lm_tokenizer_find(t, "nope", 4), -1);
  size_t len;
  const char *p = lm_tokenizer_piece(t, 281, &len);
  assert_non_null(p);
  assert_int_equal(len, 11);
  assert_memory_equal(p, "hello world", 11);
  assert_null(lm_tokenizer_piece(t, 282, &len));
  assert_null(lm_tokenizer_piece(t, -1, &len));
  assert_true(lm_tokenizer_is_special(t, 276));  /* <|turn> */
  assert_false(lm_tokenizer_is_special(t, 277)); /* <tool> */
  assert_false(lm_tokenizer_is_special(t, 265)); /* hello */
  assert_int_equal(lm_tokenizer_bos(t), 2);
  assert_int_equal(lm_tokenizer_eos(t), 1);
  assert_true(lm_tokenizer_adds_bos(t));
  lm_tokenizer_free(t);
  lm_tokenizer_free(NULL);
}

static void t_sp_encode(void **state) {
  (void)state;
  lm_tokenizer *t = load(SP_BPE);
  EXPECT(t, "hello world", 1, 2, 281); /* a normalized added token, matched after "▁" */
  EXPECT(t, " hello world", 0, 244, 281);
  EXPECT(t, "  hello", 0, 261, 265);           /* pair merges: ▁▁, then h e l l o */
  EXPECT(t, "Hello", 0, 76, 249, 264);         /* 'H' has no token: byte fallback <0x48> */
  EXPECT(t, "日本", 0, 260, 234, 160, 176);    /* 日 is a token, 本 falls back to 3 bytes */
  EXPECT(t, "😀😀a😀", 0, 3, 245, 3);             /* no <0xF0>: unk, fused over the first two */
  EXPECT(t, "a <L> b", 0, 245, 278, 244, 246); /* lstrip takes the space before <L> */
  EXPECT(t, "<R>  <L>x", 0, 279, 278, 124);    /* rstrip takes the spaces after <R> */
  EXPECT(t, "xdog dog dogx", 0, 124, 248, 252, 107, 244, 280, 244, 248, 252, 107,
         124); /* single_word */
  EXPECT(t, "<|turn>cat<tool>", 1, 2, 276, 273, 277);
  EXPECT(t, "cat  dog", 0, 273, 261, 280);
  EXPECT(t, "é\xcc\x81", 0, 259, 208, 133); /* no normalization form here: the mark stays */
  EXPECT(t, "<bos>hello", 1, 2, 265);       /* never a double BOS (HF gives 2, 2, 265) */
  EXPECT(t, "<bos>hello", 0, 2, 265);
  int32_t *ids;
  size_t n;
  assert_int_equal(lm_tokenizer_encode(t, "", 0, 0, &ids, &n), LM_OK);
  assert_int_equal(n, 0);
  free(ids);
  EXPECT(t, "", 1, 2);
  assert_int_equal(lm_tokenizer_encode(t, NULL, 3, 0, &ids, &n), LM_ERR_INVALID);
  lm_tokenizer_free(t);
}

static void t_sp_decode(void **state) {
  (void)state;
  lm_tokenizer *t = load(SP_BPE);
  DECODES(t, 0, "hello world", 266, 271); /* Strip drops the leading space */
  DECODES(t, 0, "<bos> hello<|turn> world", 2, 266, 276, 271);
  DECODES(t, 1, "hello world", 2, 266, 276, 271);
  DECODES(t, 0, "日", 234, 155, 169); /* byte tokens joined into UTF-8 */
  DECODES(t, 0,
          "\xef\xbf\xbd\xef\xbf\xbd"
          "a",
          234, 155, 245);          /* a broken run: U+FFFD per byte */
  DECODES(t, 0, " a", 261, 245);   /* Strip removes one space only */
  DECODES(t, 0, "", 282, 9999999); /* ids without a token are dropped */
  char *text;
  size_t len;
  assert_int_equal(lm_tokenizer_decode(t, NULL, 0, 0, &text, &len), LM_OK);
  assert_int_equal(len, 0);
  assert_string_equal(text, "");
  free(text);
  lm_tokenizer_free(t);
}

/* ---- byte-level BPE ---------------------------------------------------------------------- */
static void t_byte_encode_decode(void **state) {
  (void)state;
  lm_tokenizer *t = load(BYTE_BPE);
  EXPECT(t, "the and 123", 1, 274, 83, 257, 263, 220, 265); /* "a b" merges, digits in threes */
  EXPECT(t, "hello", 0, 273);                               /* ignore_merges: the word is a token */
  EXPECT(t, "hellos", 0, 257, 266, 78, 82);
  EXPECT(t, " the\n\nworld", 0, 258, 272, 86, 267, 270);
  EXPECT(t, "🦀", 0, 172, 253, 99, 222);
  EXPECT(t, "e\xcc\x81", 0, 127, 102);                /* NFC composes e + U+0301 into é */
  EXPECT(t, "\xe1\xa0\x8e a", 0, 157, 254, 236, 260); /* U+180E is not \s (Oniguruma) */
  EXPECT(t, "I'M here", 0, 40, 6, 44, 220, 257, 81, 68);
  EXPECT(t, "<|begin|>hi", 1, 274, 71, 72);
  assert_int_equal(lm_tokenizer_bos(t), 274);
  DECODES(t, 0, "<|begin|>the and 123", 274, 83, 257, 263, 220, 265);
  DECODES(t, 1, "the and 123", 274, 83, 257, 263, 220, 265);
  DECODES(t, 0, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbdr", 106, 107, 113,
          81); /* lossy: 3 lone continuation bytes */
  lm_tokenizer_free(t);
}

/* ---- tokenizer_config.json --------------------------------------------------------------- */
static void write_file(const char *path, const char *text, size_t n) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(text, 1, n, f), n);
  fclose(f);
}

static void copy_file(const char *from, const char *to) {
  FILE *f = fopen(from, "rb");
  assert_non_null(f);
  char *buf = malloc(1 << 16);
  size_t n = fread(buf, 1, 1 << 16, f);
  fclose(f);
  write_file(to, buf, n);
  free(buf);
}

static lm_tokenizer *load_with_config(const char *config) {
  mkdir(TMP_DIR, 0755);
  mkdir(TMP_DIR "/cfg", 0755);
  copy_file(SP_BPE, TMP_DIR "/cfg/tokenizer.json");
  write_file(TMP_DIR "/cfg/tokenizer_config.json", config, strlen(config));
  return load(TMP_DIR "/cfg");
}

static void t_bos_config(void **state) {
  (void)state;
  lm_tokenizer *t = load_with_config("{\"add_bos_token\": false}");
  EXPECT(t, "hello", 1, 265);
  assert_false(lm_tokenizer_adds_bos(t));
  assert_int_equal(lm_tokenizer_bos(t), 2);
  lm_tokenizer_free(t);
  t = load_with_config("{\"add_bos_token\": true, \"add_eos_token\": true, \"bos_token\": "
                       "{\"content\": \"<bos>\"}, \"eos_token\": \"<eos>\"}");
  EXPECT(t, "hello", 1, 2, 265, 1);
  EXPECT(t, "<bos>hello", 1, 2, 265, 1);
  EXPECT(t, "hello", 0, 265);
  lm_tokenizer_free(t);
  t = load_with_config("{\"eos_token\": \"<|turn>\", \"bos_token\": null}");
  assert_int_equal(lm_tokenizer_eos(t), 276);
  assert_int_equal(lm_tokenizer_bos(t), -1);
  EXPECT(t, "hello", 1, 2, 265); /* the template still adds its BOS */
  lm_tokenizer_free(t);
  lm_tokenizer *bad = NULL;
  mkdir(TMP_DIR, 0755);
  mkdir(TMP_DIR "/cfg", 0755);
  write_file(TMP_DIR "/cfg/tokenizer_config.json", "{\"add_bos_token\": 3}", 20);
  assert_int_equal(lm_tokenizer_load(TMP_DIR "/cfg", &bad), LM_ERR_CORRUPT);
  assert_non_null(strstr(lm_errmsg(), "add_bos_token"));
  assert_null(bad);
}

/* ---- streaming detokenizer ---------------------------------------------------------------- */
static void push_expect(lm_detok *d, int32_t id, const char *want) {
  const char *text;
  size_t len;
  assert_int_equal(lm_detok_push(d, id, &text, &len), LM_OK);
  assert_int_equal(len, strlen(want));
  assert_memory_equal(text, want, len);
}

static void flush_expect(lm_detok *d, const char *want) {
  const char *text;
  size_t len;
  assert_int_equal(lm_detok_flush(d, &text, &len), LM_OK);
  assert_int_equal(len, strlen(want));
  assert_memory_equal(text, want, len);
}

static void t_detok(void **state) {
  (void)state;
  lm_tokenizer *sp = load(SP_BPE), *bb = load(BYTE_BPE);
  lm_detok *d;
  assert_int_equal(lm_detok_create(sp, 0, &d), LM_OK);
  push_expect(d, 266, "hello"); /* the leading space is stripped, as in the batch decode */
  push_expect(d, 271, " world");
  push_expect(d, 234, ""); /* 日 = E6 97 A5, one byte token at a time */
  push_expect(d, 155, "");
  push_expect(d, 169, "日");
  push_expect(d, 234, "");
  flush_expect(d, "\xef\xbf\xbd"); /* a dangling tail becomes U+FFFD */
  push_expect(d, 261, " ");        /* "▁▁": flush started a new stream, so strip one again */
  push_expect(d, 234, "");
  push_expect(d, 245,
              "\xef\xbf\xbd"
              "a"); /* a byte run broken by text */
  lm_detok_reset(d);
  push_expect(d, 2, "<bos>");
  lm_detok_free(d);
  assert_int_equal(lm_detok_create(sp, 1, &d), LM_OK);
  push_expect(d, 2, ""); /* skip_special */
  push_expect(d, 276, "");
  push_expect(d, 277, "<tool>"); /* added but not special */
  lm_detok_free(d);

  assert_int_equal(lm_detok_create(bb, 0, &d), LM_OK);
  push_expect(d, 172, ""); /* 🦀 = F0 9F A6 80 as four byte-level tokens */
  push_expect(d, 253, "");
  push_expect(d, 99, "");
  push_expect(d, 222, "🦀");
  push_expect(d, 258, " the");
  push_expect(d, 106, "\xef\xbf\xbd"); /* a continuation byte alone can never complete */
  push_expect(d, 99999, "");           /* no such id */
  flush_expect(d, "");
  lm_detok_free(d);
  lm_detok_free(NULL);
  lm_tokenizer_free(sp);
  lm_tokenizer_free(bb);
}

/* A tokenizer without a decoder joins tokens with spaces (HF); the stream does too. */
static void t_no_decoder(void **state) {
  (void)state;
  static const char json[] = "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, "
                             "\"ab\": 2}, \"merges\": [\"a b\"]}}";
  mkdir(TMP_DIR, 0755);
  write_file(TMP_DIR "/plain.json", json, sizeof json - 1);
  lm_tokenizer *t = load(TMP_DIR "/plain.json");
  EXPECT(t, "abab a", 0, 2, 2, 0); /* no pre-tokenizer: the space has no token and is dropped */
  DECODES(t, 0, "ab a b", 2, 0, 1);
  assert_int_equal(lm_tokenizer_bos(t), -1);
  lm_detok *d;
  assert_int_equal(lm_detok_create(t, 0, &d), LM_OK);
  push_expect(d, 2, "ab");
  push_expect(d, 0, " a");
  lm_detok_free(d);
  lm_tokenizer_free(t);
}

/* ---- UTF-8 -------------------------------------------------------------------------------- */
static void t_utf8(void **state) {
  (void)state;
  static const struct {
    const char *s;
    int valid;
    const char *repaired;
  } cases[] = {
      {"plain ascii", 1, "plain ascii"},
      {"caf\xc3\xa9 \xe6\x97\xa5 \xf0\x9f\xa6\x80", 1, "caf\xc3\xa9 \xe6\x97\xa5 \xf0\x9f\xa6\x80"},
      {"\xc3", 0, "\xef\xbf\xbd"},                                 /* truncated */
      {"\xe6\x97x", 0, "\xef\xbf\xbdx"},                           /* one maximal subpart */
      {"\xc0\x80", 0, "\xef\xbf\xbd\xef\xbf\xbd"},                 /* overlong NUL */
      {"\xe0\x80\x80", 0, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"}, /* overlong */
      {"\xed\xa0\x80", 0, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"}, /* a surrogate */
      {"\xf4\x90\x80\x80", 0, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"}, /* > U+10FFFF */
      {"\xf5", 0, "\xef\xbf\xbd"},
      {"a\x80"
       "b",
       0,
       "a\xef\xbf\xbd"
       "b"},
      {"\xf0\x9f\xa6", 0, "\xef\xbf\xbd"},
      {"\xf4\x8f\xbf\xbf", 1, "\xf4\x8f\xbf\xbf"}, /* U+10FFFF */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    size_t n = strlen(cases[i].s), m;
    char *out;
    assert_int_equal(lm_utf8_valid(cases[i].s, n), cases[i].valid);
    assert_int_equal(lm_utf8_sanitize(cases[i].s, n, &out, &m), LM_OK);
    assert_string_equal(out, cases[i].repaired);
    free(out);
  }
  assert_true(lm_utf8_valid(NULL, 0));
  assert_int_equal(lm_utf8_incomplete_tail("a\xe6\x97", 3), 2);
  assert_int_equal(lm_utf8_incomplete_tail("a\xe6\x97\xa5", 4), 0);
  assert_int_equal(lm_utf8_incomplete_tail("a\x97", 2), 0);
  assert_int_equal(lm_utf8_incomplete_tail("\xf0\x9f\xa6", 3), 3);
  assert_int_equal(lm_utf8_incomplete_tail("\xe0\x80", 2), 0); /* can never complete */

  /* the tokenizer encodes invalid input as its repaired text */
  lm_tokenizer *t = load(BYTE_BPE);
  int32_t *a, *b;
  size_t na, nb;
  assert_int_equal(lm_tokenizer_encode(t, "x\xff\xe6\x97y", 5, 0, &a, &na), LM_OK);
  assert_int_equal(lm_tokenizer_encode(t, "x\xef\xbf\xbd\xef\xbf\xbdy", 8, 0, &b, &nb), LM_OK);
  assert_int_equal(na, nb);
  assert_memory_equal(a, b, na * sizeof *a);
  free(a);
  free(b);
  lm_tokenizer_free(t);
}

/* ---- bad files ---------------------------------------------------------------------------- */
#define MODEL_OK                                                                                   \
  "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": "        \
  "[[\"a\", \"b\"]]}"

static void t_bad_files(void **state) {
  (void)state;
  static const struct {
    const char *json, *msg;
    lm_status want;
  } cases[] = {
      {"", "not a JSON object", LM_ERR_CORRUPT},
      {"not json", "not a JSON object", LM_ERR_CORRUPT},
      {"[]", "not a JSON object", LM_ERR_CORRUPT},
      {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0", "invalid JSON", LM_ERR_CORRUPT},
      {"{" MODEL_OK "} trailing", "trailing data", LM_ERR_CORRUPT},
      {"{" MODEL_OK ",}", "expected a key", LM_ERR_CORRUPT},
      {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\\q\": 0}, \"merges\": []}}", "bad escape",
       LM_ERR_CORRUPT},
      {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"\\ud800\": 0}, \"merges\": []}}", "surrogate",
       LM_ERR_CORRUPT},
      {"{\"x\": \"\xff\", " MODEL_OK "}", "not valid UTF-8", LM_ERR_CORRUPT},
      {"{\"model\": {\"type\": \"Unigram\", \"vocab\": [[\"a\", 0.0]]}}", "model type 'Unigram'",
       LM_ERR_UNSUPPORTED},
      {"{\"model\": {\"type\": \"WordPiece\", \"vocab\": {\"a\": 0}}}", "model type 'WordPiece'",
       LM_ERR_UNSUPPORTED},
      {"{\"model\": {\"type\": \"BPE\", \"merges\": []}}", "model.vocab is missing",
       LM_ERR_CORRUPT},
      {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}}", "model.merges is missing",
       LM_ERR_CORRUPT},
      {"{\"version\": \"1.0\"}", "no \"model\"", LM_ERR_CORRUPT},
      {"{\"model\": {\"type\": \"BPE\", \"vocab\": [\"a\"], \"merges\": []}}", "not an object",
       LM_ERR_CORRUPT},
      {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -1}, \"merges\": []}}", "outside",
       LM_ERR_CORRUPT},
      {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 99999999}, \"merges\": []}}", "outside",
       LM_ERR_CORRUPT},
      {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": \"0\"}, \"merges\": []}}",
       "not an integer", LM_ERR_CORRUPT},
      {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 1.5}, \"merges\": []}}",
       "not an integer", LM_ERR_CORRUPT},
      {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 0}, \"merges\": []}}",
       "two tokens", LM_ERR_CORRUPT},
      {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": "
       "[\"a b c\"]}}",
       "one space", LM_ERR_CORRUPT},
      {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": "
       "[\"ab\"]}}",
       "one space", LM_ERR_CORRUPT},
      {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [[\"a\", "
       "\"c\"]]}}",
       "token 'c' is not in the vocab", LM_ERR_CORRUPT},
      {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [[\"a\", "
       "\"b\"]]}}",
       "token 'ab' is not in the vocab", LM_ERR_CORRUPT},
      {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": "
       "[[\"a\", \"b\", \"c\"]]}}",
       "pair of strings", LM_ERR_CORRUPT},
      {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": "
       "[[\"a\", \"b\"], \"a b\"]}}",
       "like the others", LM_ERR_CORRUPT},
      {"{\"model\": {\"merges\": [\"a b\"], \"vocab\": {\"a\": 0, \"b\": 1}}}",
       "token 'ab' is not in the vocab", LM_ERR_CORRUPT},
      {"{\"model\": {\"type\": \"BPE\", \"dropout\": 0.1, \"vocab\": {\"a\": 0}, \"merges\": []}}",
       "dropout", LM_ERR_UNSUPPORTED},
      {"{\"version\": \"2.0\", " MODEL_OK "}", "version 2.0", LM_ERR_UNSUPPORTED},
      {"{\"normalizer\": {\"type\": \"Lowercase\"}, " MODEL_OK "}", "normalizer 'Lowercase'",
       LM_ERR_UNSUPPORTED},
      {"{\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFC\"}, "
       "{\"type\": \"Precompiled\"}]}, " MODEL_OK "}",
       "normalizer 'Precompiled'", LM_ERR_UNSUPPORTED},
      {"{\"normalizer\": {\"pattern\": 1}, " MODEL_OK "}", "no \"type\"", LM_ERR_CORRUPT},
      {"{\"normalizer\": {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}}, " MODEL_OK "}",
       "\"content\"", LM_ERR_CORRUPT},
      {"{\"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"_\"}, " MODEL_OK "}",
       "pre_tokenizer 'Metaspace'", LM_ERR_UNSUPPORTED},
      {"{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(a\"}, \"behavior\": "
       "\"Isolated\"}, " MODEL_OK "}",
       "regex", LM_ERR_UNSUPPORTED},
      {"{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Glob\": \"a\"}, \"behavior\": "
       "\"Isolated\"}, " MODEL_OK "}",
       "\"pattern\"", LM_ERR_CORRUPT},
      {"{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"String\": \"a\"}, \"behavior\": "
       "\"Sideways\"}, " MODEL_OK "}",
       "behavior 'Sideways'", LM_ERR_UNSUPPORTED},
      {"{\"decoder\": {\"type\": \"WordPiece\"}, " MODEL_OK "}", "decoder 'WordPiece'",
       LM_ERR_UNSUPPORTED},
      {"{\"decoder\": {\"type\": \"Strip\", \"content\": \"ab\", \"start\": 1, \"stop\": "
       "0}, " MODEL_OK "}",
       "one character", LM_ERR_CORRUPT},
      {"{\"post_processor\": {\"type\": \"Unknown\"}, " MODEL_OK "}", "post_processor 'Unknown'",
       LM_ERR_UNSUPPORTED},
      {"{\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": "
       "{\"id\": \"<s>\"}}], \"special_tokens\": {}}, " MODEL_OK "}",
       "special_tokens", LM_ERR_CORRUPT},
      {"{\"added_tokens\": {}, " MODEL_OK "}", "added_tokens is not an array", LM_ERR_CORRUPT},
      {"{\"added_tokens\": [{\"id\": 3}], " MODEL_OK "}", "\"content\"", LM_ERR_CORRUPT},
      {"{\"added_tokens\": [{\"content\": \"x\"}], " MODEL_OK "}", "\"id\"", LM_ERR_CORRUPT},
      {"{\"added_tokens\": [{\"id\": 3, \"content\": \"x\", \"special\": \"yes\"}], " MODEL_OK "}",
       "\"special\"", LM_ERR_CORRUPT},
      {"{\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": [], \"fuse_unk\": 1}}",
       "fuse_unk", LM_ERR_CORRUPT},
  };
  mkdir(TMP_DIR, 0755);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    write_file(TMP_DIR "/bad.json", cases[i].json, strlen(cases[i].json));
    lm_tokenizer *t = (lm_tokenizer *)1;
    lm_status s = lm_tokenizer_load(TMP_DIR "/bad.json", &t);
    if (s != cases[i].want || !strstr(lm_errmsg(), cases[i].msg))
      fail_msg("case %zu (%s): got %s '%s', want %s '%s'", i, cases[i].json, lm_status_name(s),
               lm_errmsg(), lm_status_name(cases[i].want), cases[i].msg);
    assert_null(t);
  }
  /* deep nesting in an ignored key is bounded */
  char deep[600];
  int k = snprintf(deep, sizeof deep, "{\"x\": ");
  for (int i = 0; i < 200; i++)
    deep[k++] = '[';
  deep[k] = '\0';
  write_file(TMP_DIR "/bad.json", deep, strlen(deep));
  lm_tokenizer *t = NULL;
  assert_int_equal(lm_tokenizer_load(TMP_DIR "/bad.json", &t), LM_ERR_CORRUPT);
  assert_non_null(strstr(lm_errmsg(), "nesting too deep"));
  assert_int_equal(lm_tokenizer_load(TMP_DIR "/does-not-exist.json", &t), LM_ERR_NOT_FOUND);
  assert_int_equal(lm_tokenizer_load(TMP_DIR, &t),
                   LM_ERR_NOT_FOUND); /* a directory without tokenizer.json */
  assert_int_equal(lm_tokenizer_load(NULL, &t), LM_ERR_INVALID);
}

/* An unk token named but missing from the vocab fails only when a character needs it (HF). */
static void t_unk_missing(void **state) {
  (void)state;
  static const char json[] = "{\"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"vocab\": "
                             "{\"a\": 0}, \"merges\": []}}";
  mkdir(TMP_DIR, 0755);
  write_file(TMP_DIR "/unk.json", json, sizeof json - 1);
  lm_tokenizer *t = load(TMP_DIR "/unk.json");
  EXPECT(t, "aa", 0, 0, 0);
  int32_t *ids;
  size_t n;
  assert_int_equal(lm_tokenizer_encode(t, "ab", 2, 0, &ids, &n), LM_ERR_CORRUPT);
  assert_non_null(strstr(lm_errmsg(), "unk"));
  lm_tokenizer_free(t);
}

/* continuing_subword_prefix / end_of_word_suffix, with the keys in either order: merges before the
 * vocab, and the prefix after the merges (ids from HF tokenizers 0.23.2). */
static void t_subword_prefix(void **state) {
  (void)state;
  static const char *const json[2] = {
      "{\"model\": {\"type\": \"BPE\", \"merges\": [[\"a\", \"##b\"], [\"ab\", \"##c\"]], "
      "\"continuing_subword_prefix\": \"##\", "
      "\"end_of_word_suffix\": \"</w>\", \"vocab\": {\"a\": 0, \"##b\": 1, \"ab\": 2, \"##c\": 3, "
      "\"abc\": 4, \"##c</w>\": 5, "
      "\"c\": 6, \"##a\": 7, \"##b</w>\": 8, \"ab</w>\": 9}}, \"pre_tokenizer\": {\"type\": "
      "\"Split\", \"pattern\": "
      "{\"String\": \" \"}, \"behavior\": \"Removed\", \"invert\": false}}",
      "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"##b\": 1, \"ab\": 2, \"##c\": 3, "
      "\"abc\": 4, \"##c</w>\": 5, "
      "\"c\": 6, \"##a\": 7, \"##b</w>\": 8, \"ab</w>\": 9}, \"merges\": [[\"a\", \"##b\"], "
      "[\"ab\", \"##c\"]], "
      "\"continuing_subword_prefix\": \"##\", \"end_of_word_suffix\": \"</w>\"}, "
      "\"pre_tokenizer\": {\"type\": \"Split\", "
      "\"pattern\": {\"String\": \" \"}, \"behavior\": \"Removed\", \"invert\": false}}"};
  for (int k = 0; k < 2; k++) {
    lm_tokenizer *t = NULL;
    assert_int_equal(lm_tokenizer_load_json(json[k], strlen(json[k]), "prefix.json", &t), LM_OK);
    EXPECT(t, "abc", 0, 2, 5);
    EXPECT(t, "abcab", 0, 4, 7, 8);
    EXPECT(t, "cab ab", 0, 6, 7, 8, 0, 8);
    lm_tokenizer_free(t);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(t_sp_lookup),      cmocka_unit_test(t_sp_encode),
      cmocka_unit_test(t_sp_decode),      cmocka_unit_test(t_byte_encode_decode),
      cmocka_unit_test(t_bos_config),     cmocka_unit_test(t_detok),
      cmocka_unit_test(t_no_decoder),     cmocka_unit_test(t_utf8),
      cmocka_unit_test(t_bad_files),      cmocka_unit_test(t_unk_missing),
      cmocka_unit_test(t_subword_prefix),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
