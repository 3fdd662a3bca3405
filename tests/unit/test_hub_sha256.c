/* test_hub_sha256.c — the SHA-256 that checks LFS downloads: the FIPS 180-4 / NIST example
 * vectors (empty, "abc", the 448- and 896-bit messages, a million 'a'), the same digests fed in
 * every split of the input, and a file's digest against sha256sum's. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hub/hub_sha256.h"

static void hex_of(const void *data, size_t n, char hex[65]) {
  lm_sha256 s;
  uint8_t d[32];
  lm_sha256_init(&s);
  lm_sha256_update(&s, data, n);
  lm_sha256_final(&s, d);
  lm_sha256_hex(d, hex);
}

static void t_vectors(void **state) {
  (void)state;
  static const struct {
    const char *msg, *hex;
  } v[] = {
      {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
      {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
      {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
       "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
      {"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlm"
       "nopqrsmnopqrstnopqrstu",
       "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"},
      {"The quick brown fox jumps over the lazy dog",
       "d7a8fbb307d7809469ca9abcb0082e4f8d5651e46d3cdb762d02d0bf37c9e592"},
  };
  for (size_t i = 0; i < sizeof v / sizeof *v; i++) {
    char hex[65];
    hex_of(v[i].msg, strlen(v[i].msg), hex);
    assert_string_equal(hex, v[i].hex);
  }
}

static void t_million_a(void **state) {
  (void)state;
  char *a = malloc(1000000);
  assert_non_null(a);
  memset(a, 'a', 1000000);
  char hex[65];
  hex_of(a, 1000000, hex);
  assert_string_equal(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  /* the same in odd-sized pieces (a download's chunks never align with 64-byte blocks) */
  lm_sha256 s;
  uint8_t d[32];
  lm_sha256_init(&s);
  for (size_t off = 0, k = 1; off < 1000000; off += k, k = k * 7 % 997 + 1)
    lm_sha256_update(&s, a + off, off + k > 1000000 ? 1000000 - off : k);
  lm_sha256_final(&s, d);
  lm_sha256_hex(d, hex);
  assert_string_equal(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  free(a);
}

/* Every split point of messages around the padding boundaries (55, 56, 63, 64 bytes). */
static void t_splits(void **state) {
  (void)state;
  unsigned char msg[130];
  for (size_t i = 0; i < sizeof msg; i++)
    msg[i] = (unsigned char)(i * 31 + 7);
  for (size_t n = 0; n <= sizeof msg; n++) {
    char whole[65];
    hex_of(msg, n, whole);
    for (size_t cut = 0; cut <= n; cut++) {
      lm_sha256 s;
      uint8_t d[32];
      char hex[65];
      lm_sha256_init(&s);
      lm_sha256_update(&s, msg, cut);
      lm_sha256_update(&s, msg + cut, n - cut);
      lm_sha256_final(&s, d);
      lm_sha256_hex(d, hex);
      assert_string_equal(hex, whole);
    }
  }
}

/* lm_sha256_file agrees with sha256sum on a real file of the tree. */
static void t_file_vs_sha256sum(void **state) {
  (void)state;
  const char *path = LM_SOURCE_DIR "/models/lumen-tiny-kjv/tokenizer.json";
  char cmd[4200], want[65] = "", hex[65];
  snprintf(cmd, sizeof cmd, "sha256sum '%s'", path);
  FILE *p = popen(cmd, "r");
  if (!p || fscanf(p, "%64s", want) != 1) {
    if (p) pclose(p);
    skip();
  }
  pclose(p);
  lm_sha256 s;
  uint8_t d[32];
  lm_sha256_init(&s);
  assert_int_equal(lm_sha256_file(&s, path), LM_OK);
  lm_sha256_final(&s, d);
  lm_sha256_hex(d, hex);
  assert_string_equal(hex, want);
  lm_sha256_init(&s);
  assert_int_not_equal(lm_sha256_file(&s, LM_SOURCE_DIR "/no/such/file"), LM_OK);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(t_vectors), cmocka_unit_test(t_million_a),
                                     cmocka_unit_test(t_splits),
                                     cmocka_unit_test(t_file_vs_sha256sum)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
