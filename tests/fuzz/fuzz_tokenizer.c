/* fuzz_tokenizer.c — libFuzzer target for the tokenizer.
 *
 * The first byte picks the mode:
 *   0..63    the rest is a tokenizer.json: load it (and, if it loads, encode and decode a little)
 *   64..255  the rest is text: encode it with two small built-in tokenizers (SentencePiece-style
 *            with byte fallback and flagged added tokens; byte-level with Llama 3's regex and NFC),
 *            then decode the ids in one call and through the streaming detokenizer, and decode
 *            the raw bytes read as ids.
 * Invariants checked (abort on violation): decoded text and every streamed piece are valid UTF-8,
 * the stream equals the batch decode when the latter has no U+FFFD, and encoding valid UTF-8 text
 * gives the same ids as encoding its repaired form. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer.h"
#include "text/utf8.h"

static const char sp_json[] =
    "{\"version\":\"1.0\",\"added_tokens\":["
    "{\"id\":0,\"content\":\"<unk>\",\"special\":true,\"normalized\":false},"
    "{\"id\":1,\"content\":\"<bos>\",\"special\":true,\"normalized\":false},"
    "{\"id\":40,\"content\":\"<L>\",\"lstrip\":true,\"normalized\":false},"
    "{\"id\":41,\"content\":\"<R>\",\"rstrip\":true,\"normalized\":false},"
    "{\"id\":42,\"content\":\"ab\",\"single_word\":true,\"normalized\":false},"
    "{\"id\":43,\"content\":\"a b\",\"normalized\":true}],"
    "\"normalizer\":{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\\u2581\"},"
    "\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"String\":\" "
    "\"},\"behavior\":\"MergedWithPrevious\"},"
    "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<"
    "bos>\"}},"
    "{\"Sequence\":{\"id\":\"A\"}}],\"special_tokens\":{\"<bos>\":{\"id\":\"<bos>\",\"ids\":[1]}}},"
    "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{"
    "\"String\":\"\\u2581\"},"
    "\"content\":\" "
    "\"},{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"},{\"type\":\"Strip\",\"content\":\" "
    "\",\"start\":1,\"stop\":0}]},"
    "\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"fuse_unk\":true,\"byte_fallback\":true,"
    "\"vocab\":{\"<unk>\":0,\"<bos>\":1,\"<0x00>\":2,\"<0x0A>\":3,\"<0x20>\":4,\"<0xC3>\":5,\"<"
    "0xA9>\":6,\"<0xE6>\":7,"
    "\"<0x97>\":8,\"<0xA5>\":9,\"\\u2581\":10,\"a\":11,\"b\":12,\"c\":13,\"ab\":14,\"abc\":15,"
    "\"\\u2581a\":16,"
    "\"\\u2581\\u2581\":17,\"\\u00e9\":18,\"<L>\":40,\"<R>\":41},"
    "\"merges\":[[\"a\",\"b\"],[\"ab\",\"c\"],[\"\\u2581\",\"a\"],[\"\\u2581\",\"\\u2581\"]]}}";

static const char bl_json[] =
    "{\"added_tokens\":[{\"id\":300,\"content\":\"<|s|>\",\"special\":true,\"normalized\":false}],"
    "\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFC\"}]},"
    "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{"
    "\"Regex\":"
    "\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}| "
    "?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|"
    "\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},\"behavior\":\"Isolated\"},"
    "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}]},"
    "\"decoder\":{\"type\":\"ByteLevel\"},"
    "\"model\":{\"type\":\"BPE\",\"ignore_merges\":true,\"vocab\":{VOCAB},\"merges\":[\"\\u0120 "
    "t\",\"h e\"]}}";

/* bl_json with {VOCAB} replaced by the 256 GPT-2 byte characters and the merge results. */
static char *byte_level_json(void) {
  size_t cap = sizeof bl_json + 256 * 24 + 64, w = 0;
  char *out = malloc(cap), *vocab = malloc(256 * 24 + 64);
  const char *at = strstr(bl_json, "{VOCAB}");
  int k = 0;
  w += (size_t)sprintf(vocab + w, "{");
  for (int b = 0; b < 256; b++) {
    int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    unsigned cp = printable ? (unsigned)b : 256u + (unsigned)k++;
    w += (size_t)sprintf(vocab + w, "%s\"\\u%04x\":%d", b ? "," : "", cp, b);
  }
  w += (size_t)sprintf(vocab + w, ",\"\\u0120t\":256,\"he\":257}");
  size_t head = (size_t)(at - bl_json);
  memcpy(out, bl_json, head);
  memcpy(out + head, vocab, w);
  strcpy(out + head + w, at + 7);
  free(vocab);
  return out;
}

static void check_utf8(const char *s, size_t n, const char *what) {
  if (!lm_utf8_valid(s, n)) {
    fprintf(stderr, "fuzz_tokenizer: %s produced invalid UTF-8\n", what);
    abort();
  }
}

/* Decodes ids in one call and through the stream; checks the invariants. */
static void decode_both(const lm_tokenizer *t, const int32_t *ids, size_t n, int skip) {
  char *text;
  size_t len;
  if (lm_tokenizer_decode(t, ids, n, skip, &text, &len) != LM_OK) return;
  check_utf8(text, len, "decode");
  lm_detok *d;
  if (lm_detok_create(t, skip, &d) == LM_OK) {
    char *acc = malloc(len * 4 + 16 + n * 64);
    size_t w = 0;
    for (size_t i = 0; i <= n; i++) {
      const char *p;
      size_t pl;
      if ((i < n ? lm_detok_push(d, ids[i], &p, &pl) : lm_detok_flush(d, &p, &pl)) != LM_OK) break;
      check_utf8(p, pl, "stream");
      if (acc && w + pl < len * 4 + 16 + n * 64) memcpy(acc + w, p, pl), w += pl;
    }
    if (acc && !memmem(text, len, LM_UTF8_REPLACEMENT, 3) && (w != len || memcmp(acc, text, len))) {
      fprintf(stderr, "fuzz_tokenizer: stream and batch decode differ\n");
      abort();
    }
    free(acc);
    lm_detok_free(d);
  }
  free(text);
}

static void exercise(const lm_tokenizer *t, const uint8_t *data, size_t size) {
  int32_t *ids = NULL;
  size_t n = 0;
  if (lm_tokenizer_encode(t, (const char *)data, size, 1, &ids, &n) == LM_OK) {
    decode_both(t, ids, n, 0);
    decode_both(t, ids, n, 1);
    if (lm_utf8_valid((const char *)data, size) == 0) {
      char *fixed;
      size_t fl;
      int32_t *ids2;
      size_t n2;
      if (lm_utf8_sanitize((const char *)data, size, &fixed, &fl) == LM_OK) {
        if (lm_tokenizer_encode(t, fixed, fl, 1, &ids2, &n2) == LM_OK) {
          if (n2 != n || memcmp(ids, ids2, n * sizeof *ids))
            abort(); /* repair is what encode does */
          free(ids2);
        }
        free(fixed);
      }
    }
  }
  free(ids);
  /* the raw bytes as ids, some out of range */
  size_t m = size / 2;
  int32_t *raw = malloc((m ? m : 1) * sizeof *raw);
  for (size_t i = 0; raw && i < m; i++)
    raw[i] = (int32_t)(data[2 * i] | (data[2 * i + 1] << 8)) % 320;
  if (raw) decode_both(t, raw, m, 0);
  free(raw);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static lm_tokenizer *sp, *bl;
  if (!sp) {
    char *bj = byte_level_json();
    if (lm_tokenizer_load_json(sp_json, sizeof sp_json - 1, "sp", &sp) != LM_OK ||
        lm_tokenizer_load_json(bj, strlen(bj), "bl", &bl) != LM_OK) {
      fprintf(stderr, "fuzz_tokenizer: built-in tokenizer failed to load: %s\n", lm_errmsg());
      abort();
    }
    free(bj);
  }
  if (size == 0) return 0;
  if (data[0] < 64) {
    lm_tokenizer *t = NULL;
    if (lm_tokenizer_load_json((const char *)data + 1, size - 1, "fuzz.json", &t) == LM_OK) {
      static const uint8_t probe[] = "Hello  w\xc3\xb6rld \xf0\x9f\xa6\x80 <s> 123\n\t";
      exercise(t, probe, sizeof probe - 1);
    }
    lm_tokenizer_free(t);
    return 0;
  }
  exercise(data[0] < 160 ? sp : bl, data + 1, size - 1);
  return 0;
}
