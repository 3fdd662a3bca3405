/* test_hub_meta.c — what src/hub/ reads from the network and the user, and the cache it writes:
 * header lines (etags normalized as huggingface_hub does, sizes, a redirect's headers not leaking
 * into the final answer, garbage ignored), the revision JSON (garbage and unsafe file names
 * refused), ORG/REPO[@REV] names, URL encoding, and the cache layout (refs, relative snapshot
 * links, resolution and its messages). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/status.h"
#include "hub/hub.h"
#include "hub/hub_http.h"
#include "hub/hub_meta.h"
#include "hub/hub_ref.h"

#define SHA1 "0123456789abcdef0123456789abcdef01234567"
#define SHA256 "3657f7f79c8c5a0607e3d307be858d722d7db1ddb7ef7856d971c7dcd5d43a0d"

static void assert_msg_has(const char *needle) {
  if (!strstr(lm_errmsg(), needle)) fail_msg("message \"%s\" lacks \"%s\"", lm_errmsg(), needle);
}

static void feed(lm_hub_head *h, const char *line) { lm_hub_head_line(h, line, strlen(line)); }

static void t_etag(void **state) {
  (void)state;
  char out[200];
  assert_true(lm_hub_etag_normalize("\"abc123\"", 8, out, sizeof out));
  assert_string_equal(out, "abc123");
  assert_true(lm_hub_etag_normalize("W/\"abc-1\"", 9, out, sizeof out));
  assert_string_equal(out, "abc-1");
  assert_true(lm_hub_etag_normalize(" abc ", 5, out, sizeof out));
  assert_string_equal(out, "abc");
  /* nothing that could leave the blobs folder or hide a file */
  assert_false(lm_hub_etag_normalize("\"../x\"", 6, out, sizeof out));
  assert_string_equal(out, "");
  assert_false(lm_hub_etag_normalize("\"\"", 2, out, sizeof out));
  assert_false(lm_hub_etag_normalize("a/b", 3, out, sizeof out));
  assert_false(lm_hub_etag_normalize(".hidden", 7, out, sizeof out));
  char big[300];
  memset(big, 'a', sizeof big);
  assert_false(lm_hub_etag_normalize(big, sizeof big, out, sizeof out));
}

static void t_head_lfs_redirect(void **state) {
  (void)state;
  lm_hub_head h;
  lm_hub_head_reset(&h);
  feed(&h, "HTTP/1.1 302 Found\r\n");
  feed(&h, "x-repo-commit: " SHA1 "\r\n");
  feed(&h, "ETag: \"" SHA1 "\"\r\n");
  feed(&h, "X-Linked-Etag: \"" SHA256 "\"\r\n");
  feed(&h, "X-Linked-Size: 22986604\r\n");
  feed(&h, "Content-Length: 1234\r\n");
  feed(&h, "Location: https://cdn.example/x?sig=1\r\n");
  feed(&h, "\r\n");
  lm_hub_head_finish(&h);
  assert_int_equal(h.status, 302);
  assert_string_equal(h.commit, SHA1);
  assert_true(h.lfs);
  assert_string_equal(h.etag, SHA256);
  assert_int_equal(h.size, 22986604);
  assert_string_equal(h.location, "https://cdn.example/x?sig=1");
  /* a followed redirect: the final answer's headers start afresh */
  feed(&h, "HTTP/2 206\r\n");
  feed(&h, "content-range: bytes 5000000-22986603/22986604\r\n");
  feed(&h, "content-length: 17986604\r\n");
  lm_hub_head_finish(&h);
  assert_int_equal(h.status, 206);
  assert_false(h.lfs);
  assert_string_equal(h.commit, "");
  assert_int_equal(h.range_start, 5000000);
  assert_int_equal(h.size, 17986604);
}

static void t_head_plain_and_errors(void **state) {
  (void)state;
  lm_hub_head h;
  lm_hub_head_reset(&h);
  feed(&h, "HTTP/1.1 200 OK");
  feed(&h, "ETag: W/\"" SHA1 "\"");
  feed(&h, "Content-Length: 202");
  lm_hub_head_finish(&h);
  assert_false(h.lfs);
  assert_string_equal(h.etag, SHA1);
  assert_int_equal(h.size, 202);
  lm_hub_head_reset(&h);
  feed(&h, "HTTP/1.1 404 Not Found");
  feed(&h, "X-Error-Code: RevisionNotFound");
  feed(&h, "X-Error-Message: Invalid rev id: v9\x1b[31m");
  lm_hub_head_finish(&h);
  assert_int_equal(h.status, 404);
  assert_string_equal(h.error_code, "RevisionNotFound");
  assert_null(strchr(h.error_message, '\x1b')); /* no terminal escapes reach a message */
}

static void t_head_garbage(void **state) {
  (void)state;
  static const char *junk[] = {"",
                               ":",
                               "HTTP/",
                               "HTTP/1.1 2x0",
                               "HTTP/1.1",
                               "no colon here",
                               "X-Repo-Commit: nothex",
                               "X-Repo-Commit: " SHA1 "ff",
                               "Content-Length: -5",
                               "Content-Length: 99999999999999999999999",
                               "Content-Length: 12abc",
                               "X-Linked-Size:",
                               "Content-Range: bytes x-y/z",
                               "Content-Range: items 1-2/3",
                               "ETag: \"a b\""};
  lm_hub_head h;
  lm_hub_head_reset(&h);
  for (size_t i = 0; i < sizeof junk / sizeof *junk; i++)
    feed(&h, junk[i]);
  lm_hub_head_finish(&h);
  assert_string_equal(h.commit, "");
  assert_string_equal(h.etag, "");
  assert_int_equal(h.size, -1);
  assert_int_equal(h.range_start, -1);
  char big[5000];
  memset(big, 'x', sizeof big);
  memcpy(big, "Location: ", 10);
  lm_hub_head_line(&h, big, sizeof big); /* longer than the field: cut, not overrun */
  assert_int_equal(strlen(h.location), sizeof h.location - 1);
}

static void t_revision(void **state) {
  (void)state;
  lm_hub_revision r;
  const char *ok = "{\"id\":\"org/tiny\",\"sha\":\"" SHA1 "\",\"siblings\":[{\"rfilename\":"
                   "\"config.json\"},{\"rfilename\":\"sub dir/model.safetensors\"}]}";
  assert_int_equal(lm_hub_revision_parse(ok, strlen(ok), &r), LM_OK);
  assert_string_equal(r.sha, SHA1);
  assert_int_equal(r.n_files, 2);
  assert_string_equal(r.files[1], "sub dir/model.safetensors");
  lm_hub_revision_free(&r);
  static const struct {
    const char *json, *why;
  } bad[] = {
      {"", "does not parse"},
      {"[1,2]", "not an object"},
      {"{\"sha\":12}", "\"sha\""},
      {"{\"sha\":\"abc\"}", "\"sha\""},
      {"{\"sha\":\"" SHA1 "\"}", "siblings"},
      {"{\"sha\":\"" SHA1 "\",\"siblings\":{}}", "siblings"},
      {"{\"sha\":\"" SHA1 "\",\"siblings\":[{}]}", "rfilename"},
      {"{\"sha\":\"" SHA1 "\",\"siblings\":[{\"rfilename\":7}]}", "rfilename"},
      {"{\"sha\":\"" SHA1 "\",\"siblings\":[{\"rfilename\":\"../../etc/passwd\"}]}", "not a safe"},
      {"{\"sha\":\"" SHA1 "\",\"siblings\":[{\"rfilename\":\"/abs\"}]}", "not a safe"},
      {"{\"sha\":\"" SHA1 "\",\"siblings\":[{\"rfilename\":\"a//b\"}]}", "not a safe"},
      {"{\"sha\":\"" SHA1 "\",\"siblings\":[{\"rfilename\":\"a\\u0000b\"}]}", "parse"},
      {"{\"sha\":\"" SHA1 "\",\"siblings\":[\"x\"]}", "rfilename"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    assert_int_not_equal(lm_hub_revision_parse(bad[i].json, strlen(bad[i].json), &r), LM_OK);
    assert_msg_has(bad[i].why);
    assert_null(r.files);
  }
}

static void t_names(void **state) {
  (void)state;
  lm_hub_ref r;
  assert_int_equal(lm_hub_ref_parse("google/gemma-4-E2B-it", &r), LM_OK);
  assert_string_equal(r.id, "google/gemma-4-E2B-it");
  assert_string_equal(r.rev, "main");
  assert_int_equal(lm_hub_ref_parse("mlx-community/gemma.4_x@refs/pr/1", &r), LM_OK);
  assert_string_equal(r.rev, "refs/pr/1");
  static const char *bad[] = {"gemma",
                              "./nope",
                              "../a/b",
                              "/abs/path",
                              "a/b/c",
                              "a--b/c",
                              "a/b..c",
                              "-a/b",
                              "a/b-",
                              "a/b.git",
                              "a b/c",
                              "a/b@",
                              "a/b@../x",
                              "a/b@x y",
                              "a/b@/x",
                              "",
                              "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa/"
                              "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
    if (lm_hub_ref_parse(bad[i], &r) == LM_OK) fail_msg("'%s' parsed as a name", bad[i]);
  assert_true(lm_hub_is_commit(SHA1));
  assert_false(lm_hub_is_commit("0123456789ABCDEF0123456789abcdef01234567"));
  char f[64];
  lm_hub_repo_folder("org/tiny", f, sizeof f);
  assert_string_equal(f, "models--org--tiny");
  assert_true(lm_hub_file_valid("a/b/c.json"));
  assert_false(lm_hub_file_valid("a/./b"));
  assert_false(lm_hub_file_valid("a\\b"));
  assert_false(lm_hub_file_valid("a/"));
  char url[64] = "x/";
  assert_int_equal(lm_hub_url_append(url, sizeof url, "refs/pr 1%", 0), LM_OK);
  assert_string_equal(url, "x/refs%2Fpr%201%25");
  url[0] = '\0';
  assert_int_equal(lm_hub_url_append(url, sizeof url, "sub/a+b.json", 1), LM_OK);
  assert_string_equal(url, "sub/a%2Bb.json");
  char tiny[8] = "";
  assert_int_not_equal(lm_hub_url_append(tiny, sizeof tiny, "abcdefgh", 0), LM_OK);
}

/* A cache made by hand: refs, links and resolution, in a folder of the build tree. */
static void t_cache(void **state) {
  (void)state;
  char root[512], repo[600], blob[700], dir[4096], link[800], target[256];
  snprintf(root, sizeof root, "%s/hub_cache_%d", LM_BUILD_DIR, (int)getpid());
  snprintf(repo, sizeof repo, "%s/models--org--tiny", root);
  setenv("HF_HUB_CACHE", root, 1);
  assert_int_equal(lm_hub_mkdirs(repo), LM_OK);
  snprintf(blob, sizeof blob, "%s/blobs/" SHA1, repo);
  assert_int_equal(lm_hub_mkdirs(strcat(strcpy(dir, repo), "/blobs")), LM_OK);
  FILE *fp = fopen(blob, "w");
  assert_non_null(fp);
  fputs("{}", fp);
  fclose(fp);
  assert_int_equal(lm_hub_link(repo, SHA1, "config.json", SHA1), LM_OK);
  assert_int_equal(lm_hub_link(repo, SHA1, "sub/deep/x.json", SHA1), LM_OK);
  assert_int_equal(lm_hub_link(repo, SHA1, "config.json", SHA1), LM_OK); /* again: kept */
  snprintf(link, sizeof link, "%s/snapshots/" SHA1 "/sub/deep/x.json", repo);
  ssize_t n = readlink(link, target, sizeof target - 1);
  assert_true(n > 0);
  target[n] = '\0';
  assert_string_equal(target, "../../../../blobs/" SHA1);
  struct stat st;
  assert_int_equal(stat(link, &st), 0); /* the relative link reaches the blob */
  /* not resolvable until refs/main exists */
  assert_int_equal(lm_hub_resolve("org/tiny", dir, sizeof dir), LM_ERR_NOT_FOUND);
  assert_msg_has("not its revision 'main'");
  assert_int_equal(lm_hub_resolve("org/tiny@" SHA1, dir, sizeof dir), LM_OK);
  assert_int_equal(lm_hub_write_ref(repo, "main", SHA1), LM_OK);
  assert_int_equal(lm_hub_write_ref(repo, "refs/pr/1", SHA1), LM_OK);
  char commit[41];
  assert_int_equal(lm_hub_read_ref(repo, "refs/pr/1", commit), LM_OK);
  assert_string_equal(commit, SHA1);
  assert_int_equal(lm_hub_resolve("org/tiny", dir, sizeof dir), LM_OK);
  assert_non_null(strstr(dir, "/models--org--tiny/snapshots/" SHA1));
  assert_int_equal(lm_hub_resolve("org/other", dir, sizeof dir), LM_ERR_NOT_FOUND);
  assert_msg_has("lumen get org/other");
  assert_int_equal(lm_hub_resolve("org/tiny@v2", dir, sizeof dir), LM_ERR_NOT_FOUND);
  assert_msg_has("lumen get org/tiny@v2");
  assert_int_equal(lm_hub_resolve("./nope", dir, sizeof dir), LM_ERR_NOT_FOUND);
  assert_msg_has("no such directory");
  assert_int_equal(lm_hub_resolve(root, dir, sizeof dir), LM_OK); /* a path is itself */
  assert_string_equal(dir, root);
  lm_hub_cache_list l;
  assert_int_equal(lm_hub_scan(&l), LM_OK);
  assert_int_equal(l.n, 1);
  assert_string_equal(l.repos[0].id, "org/tiny");
  assert_int_equal(l.repos[0].size, 2);
  assert_int_equal(l.repos[0].n_revs, 2);
  assert_string_equal(l.repos[0].revs[0].name, "main");
  lm_hub_cache_list_free(&l);
  char cmd[700];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
  assert_int_equal(system(cmd), 0);
  unsetenv("HF_HUB_CACHE");
}

static void t_env(void **state) {
  (void)state;
  char buf[4096];
  unsetenv("HF_HUB_CACHE");
  unsetenv("HUGGINGFACE_HUB_CACHE");
  setenv("HF_HOME", "/h", 1);
  assert_int_equal(lm_hub_cache_root(buf, sizeof buf), LM_OK);
  assert_string_equal(buf, "/h/hub");
  unsetenv("HF_HOME");
  setenv("XDG_CACHE_HOME", "/x", 1);
  assert_int_equal(lm_hub_cache_root(buf, sizeof buf), LM_OK);
  assert_string_equal(buf, "/x/huggingface/hub");
  unsetenv("XDG_CACHE_HOME");
  setenv("HF_HUB_CACHE", "/c", 1);
  assert_int_equal(lm_hub_cache_root(buf, sizeof buf), LM_OK);
  assert_string_equal(buf, "/c");
  lm_hub_env e;
  setenv("HF_ENDPOINT", "http://127.0.0.1:9/", 1);
  setenv("HF_TOKEN", "hf_abc", 1);
  assert_int_equal(lm_hub_env_load(&e), LM_OK);
  assert_string_equal(e.endpoint, "http://127.0.0.1:9");
  assert_string_equal(e.token, "hf_abc");
  setenv("HF_TOKEN", "a\r\nX-Injected: 1", 1);
  assert_int_equal(lm_hub_env_load(&e), LM_ERR_INVALID);
  setenv("HF_ENDPOINT", "file:///etc", 1);
  unsetenv("HF_TOKEN");
  assert_int_equal(lm_hub_env_load(&e), LM_ERR_INVALID);
  assert_msg_has("HF_ENDPOINT");
  unsetenv("HF_ENDPOINT");
  unsetenv("HF_HUB_CACHE");
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(t_etag),
                                     cmocka_unit_test(t_head_lfs_redirect),
                                     cmocka_unit_test(t_head_plain_and_errors),
                                     cmocka_unit_test(t_head_garbage),
                                     cmocka_unit_test(t_revision),
                                     cmocka_unit_test(t_names),
                                     cmocka_unit_test(t_cache),
                                     cmocka_unit_test(t_env)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
