/* json_util.c — JSON file loading and typed field getters over jansson. The getters exist so that
 * every config loader reports a wrong or missing field the same way, naming file and field. */
#include "io/json_util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/status.h"
#include "io/file_util.h"

/* Reads exactly len bytes from fd into buf, retrying on EINTR and short reads. */
static lm_status lm_read_all(int fd, char *buf, size_t len, const char *path) {
  size_t got = 0;
  while (got < len) {
    ssize_t r = read(fd, buf + got, len - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return LM_ERRF(LM_ERR_IO, "%s: read failed: %s", path, strerror(errno));
    if (r == 0)
      return LM_ERRF(LM_ERR_IO, "%s: file shrank while reading (%zu of %zu bytes)", path, got, len);
    got += (size_t)r;
  }
  return LM_OK;
}

lm_status lm_json_load_buf(const char *buf, size_t len, const char *name, json_t **out) {
  json_error_t err;
  /* JSON_DECODE_ANY: callers check the top-level type themselves and say what they expected. */
  json_t *v = json_loadb(buf, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &err);
  if (!v)
    return LM_ERRF(LM_ERR_CORRUPT, "%s:%d:%d: invalid JSON: %s", name, err.line, err.column,
                   err.text);
  *out = v;
  return LM_OK;
}

lm_status lm_json_load_file(const char *path, uint64_t max_bytes, json_t **out) {
  if (max_bytes == 0) max_bytes = LM_JSON_MAX_BYTES;
  int fd;
  struct stat st;
  LM_TRY(lm_file_open_regular(path, &fd, &st));
  lm_status s = LM_OK;
  char *buf = NULL;
  if ((uint64_t)st.st_size > max_bytes) {
    s = LM_ERRF(LM_ERR_CORRUPT,
                "%s: file is %lld bytes, more than the %llu-byte limit for a JSON file", path,
                (long long)st.st_size, (unsigned long long)max_bytes);
    goto done;
  }
  size_t len = (size_t)st.st_size;
  buf = malloc(len ? len : 1);
  if (!buf) {
    s = LM_ERRF(LM_ERR_NOMEM, "%s: out of memory reading %zu bytes", path, len);
    goto done;
  }
  s = lm_read_all(fd, buf, len, path);
  if (s == LM_OK) s = lm_json_load_buf(buf, len, path, out);
done:
  free(buf);
  close(fd);
  return s;
}

const char *lm_json_type_name(const json_t *v) {
  switch (json_typeof(v)) {
  case JSON_OBJECT: return "an object";
  case JSON_ARRAY: return "an array";
  case JSON_STRING: return "a string";
  case JSON_INTEGER: return "an integer";
  case JSON_REAL: return "a real";
  case JSON_TRUE:
  case JSON_FALSE: return "a boolean";
  case JSON_NULL: return "null";
  }
  return "an unknown value";
}

/* Looks up key in obj. Returns LM_OK with *v set, or with *v == NULL when an optional field is
 * absent or null; a missing required field and a non-object `obj` are errors. */
static lm_status lm_json_field(const json_t *obj, const char *key, int required, const char *ctx,
                               const json_t **v) {
  *v = NULL;
  if (!json_is_object(obj))
    return LM_ERRF(LM_ERR_CORRUPT, "%s: expected an object holding field \"%s\", got %s", ctx, key,
                   obj ? lm_json_type_name(obj) : "nothing");
  const json_t *f = json_object_get(obj, key);
  if (f && !json_is_null(f)) {
    *v = f;
    return LM_OK;
  }
  if (!required) return LM_OK;
  return LM_ERRF(LM_ERR_NOT_FOUND, "%s: required field \"%s\" is %s", ctx, key,
                 f ? "null" : "missing");
}

static lm_status lm_json_type_err(const char *ctx, const char *key, const char *want,
                                  const json_t *got) {
  return LM_ERRF(LM_ERR_CORRUPT, "%s: field \"%s\": expected %s, got %s", ctx, key, want,
                 lm_json_type_name(got));
}

lm_status lm_json_get_int(const json_t *obj, const char *key, int64_t *out, int required,
                          const char *ctx) {
  const json_t *v;
  LM_TRY(lm_json_field(obj, key, required, ctx, &v));
  if (!v) return LM_OK;
  if (!json_is_integer(v)) return lm_json_type_err(ctx, key, "an integer", v);
  *out = (int64_t)json_integer_value(v);
  return LM_OK;
}

lm_status lm_json_get_int_range(const json_t *obj, const char *key, int64_t *out, int required,
                                const char *ctx, int64_t lo, int64_t hi) {
  int64_t v = 0;
  const json_t *f;
  LM_TRY(lm_json_field(obj, key, required, ctx, &f));
  if (!f) return LM_OK; /* optional and absent: the default is not range-checked */
  LM_TRY(lm_json_get_int(obj, key, &v, required, ctx));
  if (v < lo || v > hi)
    return LM_ERRF(LM_ERR_CORRUPT, "%s: field \"%s\": %lld is out of range [%lld, %lld]", ctx, key,
                   (long long)v, (long long)lo, (long long)hi);
  *out = v;
  return LM_OK;
}

lm_status lm_json_get_double(const json_t *obj, const char *key, double *out, int required,
                             const char *ctx) {
  const json_t *v;
  LM_TRY(lm_json_field(obj, key, required, ctx, &v));
  if (!v) return LM_OK;
  if (!json_is_number(v)) return lm_json_type_err(ctx, key, "a number", v);
  *out = json_number_value(v);
  return LM_OK;
}

lm_status lm_json_get_bool(const json_t *obj, const char *key, int *out, int required,
                           const char *ctx) {
  const json_t *v;
  LM_TRY(lm_json_field(obj, key, required, ctx, &v));
  if (!v) return LM_OK;
  if (!json_is_boolean(v)) return lm_json_type_err(ctx, key, "a boolean", v);
  *out = json_is_true(v);
  return LM_OK;
}

lm_status lm_json_get_string(const json_t *obj, const char *key, const char **out, int required,
                             const char *ctx) {
  const json_t *v;
  LM_TRY(lm_json_field(obj, key, required, ctx, &v));
  if (!v) return LM_OK;
  if (!json_is_string(v)) return lm_json_type_err(ctx, key, "a string", v);
  *out = json_string_value(v);
  return LM_OK;
}

lm_status lm_json_get_object(const json_t *obj, const char *key, const json_t **out, int required,
                             const char *ctx) {
  const json_t *v;
  LM_TRY(lm_json_field(obj, key, required, ctx, &v));
  if (!v) return LM_OK;
  if (!json_is_object(v)) return lm_json_type_err(ctx, key, "an object", v);
  *out = v;
  return LM_OK;
}

/* Fetches an array field and allocates room for its elements; *arr == NULL means "absent". */
static lm_status lm_json_array_field(const json_t *obj, const char *key, int required,
                                     const char *ctx, size_t elem_size, const json_t **arr,
                                     void **mem) {
  *mem = NULL;
  LM_TRY(lm_json_field(obj, key, required, ctx, arr));
  if (!*arr) return LM_OK;
  if (!json_is_array(*arr)) return lm_json_type_err(ctx, key, "an array", *arr);
  size_t n = json_array_size(*arr);
  if (n && !(*mem = calloc(n, elem_size)))
    return LM_ERRF(LM_ERR_NOMEM, "%s: field \"%s\": out of memory for %zu elements", ctx, key, n);
  return LM_OK;
}

static lm_status lm_json_elem_err(const char *ctx, const char *key, size_t i, const char *want,
                                  const json_t *got) {
  return LM_ERRF(LM_ERR_CORRUPT, "%s: field \"%s\"[%zu]: expected %s, got %s", ctx, key, i, want,
                 lm_json_type_name(got));
}

lm_status lm_json_get_int_array(const json_t *obj, const char *key, int64_t **out, size_t *n,
                                int required, const char *ctx) {
  const json_t *arr;
  void *mem;
  LM_TRY(lm_json_array_field(obj, key, required, ctx, sizeof(int64_t), &arr, &mem));
  if (!arr) return LM_OK;
  int64_t *vals = mem;
  for (size_t i = 0; i < json_array_size(arr); i++) {
    const json_t *e = json_array_get(arr, i);
    if (!json_is_integer(e)) {
      free(vals);
      return lm_json_elem_err(ctx, key, i, "an integer", e);
    }
    vals[i] = (int64_t)json_integer_value(e);
  }
  *out = vals;
  *n = json_array_size(arr);
  return LM_OK;
}

lm_status lm_json_get_string_array(const json_t *obj, const char *key, const char ***out, size_t *n,
                                   int required, const char *ctx) {
  const json_t *arr;
  void *mem;
  LM_TRY(lm_json_array_field(obj, key, required, ctx, sizeof(const char *), &arr, &mem));
  if (!arr) return LM_OK;
  const char **vals = mem;
  for (size_t i = 0; i < json_array_size(arr); i++) {
    const json_t *e = json_array_get(arr, i);
    if (!json_is_string(e)) {
      free(vals);
      return lm_json_elem_err(ctx, key, i, "a string", e);
    }
    vals[i] = json_string_value(e);
  }
  *out = vals;
  *n = json_array_size(arr);
  return LM_OK;
}
