/* test_json_util.c — JSON file loading (errors with file, line, column; size limit) and the typed
 * getters (required/optional, null, type errors that name context and field). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/status.h"
#include "io/json_util.h"

static void assert_msg_has(const char *needle) {
  if (!strstr(lm_errmsg(), needle)) fail_msg("message \"%s\" lacks \"%s\"", lm_errmsg(), needle);
}

static const char *scratch(const char *name, const char *text, char *buf, size_t cap) {
  snprintf(buf, cap, "%s/json_util_%d_%s", LM_BUILD_DIR, (int)getpid(), name);
  FILE *f = fopen(buf, "wb");
  assert_non_null(f);
  fputs(text, f);
  assert_int_equal(fclose(f), 0);
  return buf;
}

static void t_load_file(void **state) {
  (void)state;
  char p[1024];
  json_t *v = NULL;
  assert_int_equal(lm_json_load_file(scratch("ok.json", "{\"a\": 1}\n", p, sizeof p), 0, &v),
                   LM_OK);
  assert_true(json_is_object(v));
  json_decref(v);
  unlink(p);

  /* bad JSON: file, line and column */
  assert_int_equal(
      lm_json_load_file(scratch("bad.json", "{\n  \"a\": 1,\n  \"b\": ]\n}\n", p, sizeof p), 0, &v),
      LM_ERR_CORRUPT);
  assert_msg_has(p);
  assert_msg_has(":3:");
  unlink(p);

  assert_int_equal(
      lm_json_load_file(scratch("dup.json", "{\"a\": 1, \"a\": 2}", p, sizeof p), 0, &v),
      LM_ERR_CORRUPT);
  assert_msg_has("duplicate");
  unlink(p);

  assert_int_equal(lm_json_load_file(scratch("big.json", "[1, 2, 3, 4, 5, 6]", p, sizeof p), 8, &v),
                   LM_ERR_CORRUPT);
  assert_msg_has("limit");
  unlink(p);

  assert_int_equal(lm_json_load_file(scratch("empty.json", "", p, sizeof p), 0, &v),
                   LM_ERR_CORRUPT);
  assert_msg_has(p);
  unlink(p);

  assert_int_equal(lm_json_load_file(LM_BUILD_DIR "/no-such-file.json", 0, &v), LM_ERR_NOT_FOUND);
  assert_msg_has("no-such-file.json");
  assert_int_equal(lm_json_load_file(LM_BUILD_DIR, 0, &v), LM_ERR_IO);
  assert_msg_has("not a regular file");

  assert_int_equal(lm_json_load_buf("3.5", 3, "inline", &v), LM_OK);
  assert_true(json_is_real(v));
  json_decref(v);
  assert_int_equal(lm_json_load_buf("{", 1, "inline", &v), LM_ERR_CORRUPT);
  assert_msg_has("inline:1:");
}

static const char *k_doc =
    "{\"n\": 42, \"big\": 9007199254740993, \"r\": 0.5, \"t\": true, \"f\": false, \"s\": "
    "\"gelu\", \"nul\": null,"
    " \"o\": {\"x\": 1}, \"ia\": [1, -2, 3], \"sa\": [\"sliding\", \"full\"], \"ea\": [],"
    " \"bad_ia\": [1, \"2\"], \"bad_sa\": [\"a\", 3], \"ints_real\": 1.0}";

static void t_getters_ok(void **state) {
  (void)state;
  json_t *d;
  assert_int_equal(lm_json_load_buf(k_doc, strlen(k_doc), "cfg", &d), LM_OK);
  int64_t i = 0;
  double r = 0;
  int b = -1;
  const char *s = NULL;
  const json_t *o = NULL;
  assert_int_equal(lm_json_get_int(d, "n", &i, 1, "cfg"), LM_OK);
  assert_int_equal(i, 42);
  assert_int_equal(lm_json_get_int(d, "big", &i, 1, "cfg"), LM_OK);
  assert_true(i == 9007199254740993LL); /* 64-bit exact, not through a double */
  assert_int_equal(lm_json_get_double(d, "r", &r, 1, "cfg"), LM_OK);
  assert_true(r == 0.5);
  assert_int_equal(lm_json_get_double(d, "n", &r, 1, "cfg"), LM_OK); /* integers are numbers */
  assert_true(r == 42.0);
  assert_int_equal(lm_json_get_bool(d, "t", &b, 1, "cfg"), LM_OK);
  assert_int_equal(b, 1);
  assert_int_equal(lm_json_get_bool(d, "f", &b, 1, "cfg"), LM_OK);
  assert_int_equal(b, 0);
  assert_int_equal(lm_json_get_string(d, "s", &s, 1, "cfg"), LM_OK);
  assert_string_equal(s, "gelu");
  assert_int_equal(lm_json_get_object(d, "o", &o, 1, "cfg"), LM_OK);
  assert_int_equal(json_object_size(o), 1);

  /* optional and absent, or null: LM_OK and the default stays */
  i = 7;
  assert_int_equal(lm_json_get_int(d, "absent", &i, 0, "cfg"), LM_OK);
  assert_int_equal(lm_json_get_int(d, "nul", &i, 0, "cfg"), LM_OK);
  assert_int_equal(i, 7);
  assert_int_equal(lm_json_get_int_range(d, "absent", &i, 0, "cfg", 100, 200),
                   LM_OK); /* default kept as is */
  assert_int_equal(i, 7);
  assert_int_equal(lm_json_get_int_range(d, "n", &i, 1, "cfg", 42, 42), LM_OK);
  assert_int_equal(i, 42);
  i = 7;
  s = "default";
  assert_int_equal(lm_json_get_string(d, "absent", &s, 0, "cfg"), LM_OK);
  assert_string_equal(s, "default");

  int64_t *ia = NULL;
  size_t n = 99;
  assert_int_equal(lm_json_get_int_array(d, "ia", &ia, &n, 1, "cfg"), LM_OK);
  assert_int_equal(n, 3);
  assert_int_equal(ia[1], -2);
  free(ia);
  const char **sa = NULL;
  assert_int_equal(lm_json_get_string_array(d, "sa", &sa, &n, 1, "cfg"), LM_OK);
  assert_int_equal(n, 2);
  assert_string_equal(sa[1], "full");
  free(sa);
  ia = (int64_t *)&i; /* must be overwritten with NULL for an empty array */
  assert_int_equal(lm_json_get_int_array(d, "ea", &ia, &n, 1, "cfg"), LM_OK);
  assert_int_equal(n, 0);
  assert_null(ia);
  ia = NULL;
  n = 5;
  assert_int_equal(lm_json_get_int_array(d, "absent", &ia, &n, 0, "cfg"), LM_OK);
  assert_null(ia);
  assert_int_equal(n, 5);
  json_decref(d);
}

/* One row per error a getter can report. */
typedef struct {
  int kind; /* 0 int, 1 double, 2 bool, 3 string, 4 object, 5 int array, 6 string array, 7 int in
               [0, 41] */
  const char *key;
  int required;
  lm_status want;
  const char *phrase;
} getter_row;

static const getter_row k_errors[] = {
    {0, "absent", 1, LM_ERR_NOT_FOUND, "required field \"absent\" is missing"},
    {0, "nul", 1, LM_ERR_NOT_FOUND, "required field \"nul\" is null"},
    {0, "s", 1, LM_ERR_CORRUPT, "field \"s\": expected an integer, got a string"},
    {0, "s", 0, LM_ERR_CORRUPT, "field \"s\": expected an integer, got a string"},
    {0, "ints_real", 1, LM_ERR_CORRUPT, "expected an integer, got a real"},
    {1, "t", 1, LM_ERR_CORRUPT, "field \"t\": expected a number, got a boolean"},
    {2, "n", 1, LM_ERR_CORRUPT, "field \"n\": expected a boolean, got an integer"},
    {3, "o", 1, LM_ERR_CORRUPT, "field \"o\": expected a string, got an object"},
    {4, "ia", 1, LM_ERR_CORRUPT, "field \"ia\": expected an object, got an array"},
    {5, "n", 1, LM_ERR_CORRUPT, "field \"n\": expected an array, got an integer"},
    {5, "bad_ia", 1, LM_ERR_CORRUPT, "field \"bad_ia\"[1]: expected an integer, got a string"},
    {6, "bad_sa", 0, LM_ERR_CORRUPT, "field \"bad_sa\"[1]: expected a string, got an integer"},
    {6, "absent", 1, LM_ERR_NOT_FOUND, "\"absent\" is missing"},
    {7, "n", 1, LM_ERR_CORRUPT, "field \"n\": 42 is out of range [0, 41]"},
    {7, "s", 0, LM_ERR_CORRUPT, "expected an integer, got a string"},
};

static lm_status call_getter(const json_t *d, const getter_row *r, const char *ctx) {
  int64_t i = 0;
  double x;
  int b;
  const char *s;
  const json_t *o;
  int64_t *ia = NULL;
  const char **sa = NULL;
  size_t n;
  lm_status st = LM_OK;
  switch (r->kind) {
  case 0: st = lm_json_get_int(d, r->key, &i, r->required, ctx); break;
  case 1: st = lm_json_get_double(d, r->key, &x, r->required, ctx); break;
  case 2: st = lm_json_get_bool(d, r->key, &b, r->required, ctx); break;
  case 3: st = lm_json_get_string(d, r->key, &s, r->required, ctx); break;
  case 4: st = lm_json_get_object(d, r->key, &o, r->required, ctx); break;
  case 5: st = lm_json_get_int_array(d, r->key, &ia, &n, r->required, ctx); break;
  case 6: st = lm_json_get_string_array(d, r->key, &sa, &n, r->required, ctx); break;
  case 7: st = lm_json_get_int_range(d, r->key, &i, r->required, ctx, 0, 41); break;
  }
  free(ia);
  free(sa);
  return st;
}

static void t_getter_errors(void **state) {
  (void)state;
  json_t *d;
  assert_int_equal(lm_json_load_buf(k_doc, strlen(k_doc), "cfg", &d), LM_OK);
  for (size_t i = 0; i < sizeof k_errors / sizeof k_errors[0]; i++) {
    lm_status s = call_getter(d, &k_errors[i], "config.json: text_config");
    if (s != k_errors[i].want)
      fail_msg("row %zu (%s): got %s", i, k_errors[i].key, lm_status_name(s));
    assert_msg_has("config.json: text_config: ");
    assert_msg_has(k_errors[i].phrase);
  }
  /* obj that is not an object (a caller passing a sub-value that had the wrong type) */
  int64_t v;
  assert_int_equal(lm_json_get_int(json_object_get(d, "ia"), "x", &v, 1, "config.json: ia"),
                   LM_ERR_CORRUPT);
  assert_msg_has("expected an object holding field \"x\", got an array");
  assert_int_equal(lm_json_get_int(NULL, "x", &v, 0, "config.json"), LM_ERR_CORRUPT);
  json_decref(d);
  assert_string_equal(lm_json_type_name(json_null()), "null");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(t_load_file),
      cmocka_unit_test(t_getters_ok),
      cmocka_unit_test(t_getter_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
