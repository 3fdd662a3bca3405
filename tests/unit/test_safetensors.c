/* test_safetensors.c — safetensors reader and writer: round trips (single file, sharded, every
 * dtype, empty tensors, metadata), byte-exact HF layout, directory resolution, and a table of
 * hand-written bad files, one row per defect, each checked for its status and for a message that
 * names the file and the tensor. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/status.h"
#include "io/json_util.h"
#include "io/safetensors.h"
#include "io/st_writer.h"

/* ---- scratch directory --------------------------------------------------------------------------
 */

typedef struct {
  char dir[512];
} fixture;

static int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  if (!f) return -1;
  snprintf(f->dir, sizeof f->dir, "%s/st_test_XXXXXX", LM_BUILD_DIR);
  if (!mkdtemp(f->dir)) {
    free(f);
    return -1;
  }
  *state = f;
  return 0;
}

/* Removes a directory tree of plain files and subdirectories (our own scratch only). */
static void rm_tree(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  for (struct dirent *e; (e = readdir(d));) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    struct stat st;
    if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode))
      rm_tree(p);
    else
      unlink(p);
  }
  closedir(d);
  rmdir(dir);
}

static int teardown(void **state) {
  fixture *f = *state;
  rm_tree(f->dir);
  free(f);
  return 0;
}

static const char *path_in(const fixture *f, const char *name, char *buf, size_t cap) {
  snprintf(buf, cap, "%s/%s", f->dir, name);
  return buf;
}

static void write_bytes(const char *path, const void *data, size_t len) {
  FILE *fp = fopen(path, "wb");
  assert_non_null(fp);
  if (len) assert_int_equal(fwrite(data, 1, len, fp), len);
  assert_int_equal(fclose(fp), 0);
}

static void write_text(const char *path, const char *text) {
  write_bytes(path, text, strlen(text));
}

/* Builds a safetensors image: 8-byte LE length of `header`, the header, then data_len bytes. */
static uint8_t *st_image(const char *header, uint64_t data_len, size_t *len) {
  size_t hl = strlen(header);
  *len = 8 + hl + (size_t)data_len;
  uint8_t *b = calloc(1, *len ? *len : 1);
  assert_non_null(b);
  for (int i = 0; i < 8; i++)
    b[i] = (uint8_t)((uint64_t)hl >> (8 * i));
  memcpy(b + 8, header, hl);
  for (uint64_t i = 0; i < data_len; i++)
    b[8 + hl + i] = (uint8_t)(i * 7 + 1);
  return b;
}

static void write_st(const char *path, const char *header, uint64_t data_len) {
  size_t len;
  uint8_t *b = st_image(header, data_len, &len);
  write_bytes(path, b, len);
  free(b);
}

static void assert_msg_has(const char *needle) {
  if (!strstr(lm_errmsg(), needle)) fail_msg("message \"%s\" lacks \"%s\"", lm_errmsg(), needle);
}

/* ---- round trips --------------------------------------------------------------------------------
 */

/* Deterministic bytes for tensor number k. */
static void fill_pattern(uint8_t *p, uint64_t n, unsigned k) {
  for (uint64_t i = 0; i < n; i++)
    p[i] = (uint8_t)(i * 31u + k * 17u + 3u);
}

static lm_status fill_cb(void *user, void *dst, uint64_t nbytes) {
  fill_pattern(dst, nbytes, *(unsigned *)user);
  return LM_OK;
}

static lm_status fill_fail(void *user, void *dst, uint64_t nbytes) {
  (void)user, (void)dst, (void)nbytes;
  return LM_ERRF(LM_ERR_CANCELLED, "fill refused");
}

typedef struct {
  const char *name;
  lm_dtype dt;
  int ndim;
  int64_t shape[3];
} spec;

/* One tensor per dtype, plus a scalar and empty tensors. Odd element counts so that sizes are not
 * multiples of 8 and the layout's alignment rule is exercised. */
static const spec k_specs[] = {
    {"f64", LM_DT_F64, 2, {3, 5}},    {"f32", LM_DT_F32, 1, {7}},
    {"f16", LM_DT_F16, 2, {3, 3}},    {"bf16", LM_DT_BF16, 3, {1, 3, 5}},
    {"i64", LM_DT_I64, 1, {3}},       {"i32", LM_DT_I32, 1, {5}},
    {"i16", LM_DT_I16, 1, {3}},       {"i8", LM_DT_I8, 1, {13}},
    {"u64", LM_DT_U64, 1, {1}},       {"u32", LM_DT_U32, 2, {2, 3}},
    {"u16", LM_DT_U16, 1, {9}},       {"u8", LM_DT_U8, 1, {11}},
    {"bool", LM_DT_BOOL, 1, {5}},     {"scalar", LM_DT_F32, 0, {0}},
    {"empty", LM_DT_BF16, 2, {0, 4}}, {"empty.u8", LM_DT_U8, 1, {0}},
    {"z.cb", LM_DT_U32, 2, {3, 4}},
};
#define N_SPECS (sizeof k_specs / sizeof k_specs[0])

typedef struct {
  uint8_t *buf[N_SPECS];
  unsigned ids[N_SPECS];
} spec_data;

static uint64_t spec_bytes(const spec *s) {
  uint64_t n = lm_dtype_size(s->dt);
  for (int i = 0; i < s->ndim; i++)
    n *= (uint64_t)s->shape[i];
  return n;
}

/* Adds every spec to w; the last one through a fill callback. */
static void add_specs(lm_st_writer *w, spec_data *d) {
  for (size_t i = 0; i < N_SPECS; i++) {
    uint64_t n = spec_bytes(&k_specs[i]);
    d->ids[i] = (unsigned)i;
    d->buf[i] = malloc(n ? n : 1);
    fill_pattern(d->buf[i], n, (unsigned)i);
    if (i == N_SPECS - 1)
      assert_int_equal(lm_st_writer_add_fn(w, k_specs[i].name, k_specs[i].dt, k_specs[i].ndim,
                                           k_specs[i].shape, fill_cb, &d->ids[i]),
                       LM_OK);
    else
      assert_int_equal(lm_st_writer_add(w, k_specs[i].name, k_specs[i].dt, k_specs[i].ndim,
                                        k_specs[i].shape, n ? d->buf[i] : NULL),
                       LM_OK);
  }
}

static void free_specs(spec_data *d) {
  for (size_t i = 0; i < N_SPECS; i++)
    free(d->buf[i]);
}

/* Checks that st holds every spec with the right bytes, and returns how many files they span. */
static void check_specs(const lm_safetensors *st, const spec_data *d) {
  assert_int_equal(lm_st_count(st), N_SPECS);
  for (size_t i = 0; i < N_SPECS; i++) {
    const lm_st_tensor *t = lm_st_find(st, k_specs[i].name);
    assert_non_null(t);
    assert_string_equal(t->name, k_specs[i].name);
    assert_int_equal(t->dtype, k_specs[i].dt);
    assert_int_equal(t->ndim, k_specs[i].ndim);
    for (int k = 0; k < t->ndim; k++)
      assert_int_equal(t->shape[k], k_specs[i].shape[k]);
    assert_int_equal(t->nbytes, spec_bytes(&k_specs[i]));
    if (t->nbytes) assert_memory_equal(t->data, d->buf[i], t->nbytes);
    /* HF layout: every tensor naturally aligned inside a page-aligned mapping */
    assert_true(lm_st_tensor_aligned(t, lm_dtype_size(t->dtype)));
    const lm_st_file *f = lm_st_file_at(st, (size_t)t->file);
    assert_non_null(f);
    assert_true(t->offset + t->nbytes <= f->size);
  }
  assert_int_equal(lm_st_numel(lm_st_find(st, "scalar")), 1);
  assert_int_equal(lm_st_numel(lm_st_find(st, "empty")), 0);
  assert_null(lm_st_find(st, "absent"));
  assert_null(lm_st_find(st, ""));
  assert_null(lm_st_at(st, N_SPECS));
}

static void t_roundtrip_single(void **state) {
  fixture *f = *state;
  char p[1024];
  lm_st_writer *w;
  spec_data d;
  assert_int_equal(lm_st_writer_create(&w), LM_OK);
  add_specs(w, &d);
  assert_int_equal(lm_st_writer_set_meta(w, "format", "pt"), LM_OK);
  assert_int_equal(lm_st_writer_set_meta(w, "note", "first"), LM_OK);
  assert_int_equal(lm_st_writer_set_meta(w, "note", "héllo"), LM_OK); /* replaced, UTF-8 kept */
  assert_int_equal(lm_st_writer_write(w, path_in(f, "one.safetensors", p, sizeof p)), LM_OK);

  lm_safetensors *st;
  assert_int_equal(lm_st_open(p, &st), LM_OK);
  check_specs(st, &d);
  assert_int_equal(lm_st_file_count(st), 1);
  const lm_st_file *fi = lm_st_file_at(st, 0);
  assert_string_equal(fi->path, p);
  assert_int_equal(fi->header_len % 8, 0);
  assert_int_equal(strlen(fi->header_json), fi->header_len);
  assert_int_equal(fi->header_json[0], '{');
  assert_string_equal(lm_st_file_meta(st, 0, "format"), "pt");
  assert_string_equal(lm_st_file_meta(st, 0, "note"), "héllo");
  assert_null(lm_st_file_meta(st, 0, "missing"));
  assert_null(lm_st_file_meta(st, 1, "format"));
  assert_null(lm_st_file_at(st, 1));
  /* lm_st_at walks storage order: offsets never decrease and tile the data section */
  uint64_t cursor = 8 + fi->header_len;
  for (size_t i = 0; i < lm_st_count(st); i++) {
    assert_int_equal(lm_st_at(st, i)->offset, cursor);
    cursor += lm_st_at(st, i)->nbytes;
  }
  assert_int_equal(cursor, fi->size);
  lm_st_close(st);
  lm_st_close(NULL);
  free_specs(&d);
  lm_st_writer_free(w);
}

/* The writer's layout equals the reference writer's: dtype rank descending, then name; compact
 * header padded with spaces to 8 bytes. */
static void t_hf_layout(void **state) {
  fixture *f = *state;
  char p[1024];
  lm_st_writer *w;
  float v[6] = {0, 1, 2, 3, 4, 5};
  int64_t sh[3] = {1, 2, 3};
  assert_int_equal(lm_st_writer_create(&w), LM_OK);
  assert_int_equal(lm_st_writer_add(w, "attn.0", LM_DT_F32, 3, sh, v), LM_OK);
  assert_int_equal(lm_st_writer_write(w, path_in(f, "hf.safetensors", p, sizeof p)), LM_OK);
  lm_safetensors *st;
  assert_int_equal(lm_st_open(p, &st), LM_OK);
  const char *want = "{\"attn.0\":{\"dtype\":\"F32\",\"shape\":[1,2,3],\"data_offsets\":[0,24]}}";
  assert_int_equal(lm_st_file_at(st, 0)->header_len, 64);
  assert_string_equal(lm_st_file_at(st, 0)->header_json, want);
  assert_int_equal(lm_st_file_at(st, 0)->size, 8 + 64 + 24);
  lm_st_close(st);
  lm_st_writer_free(w);

  /* no tensors: "{}" padded to 8; with metadata: __metadata__ first */
  assert_int_equal(lm_st_writer_create(&w), LM_OK);
  assert_int_equal(lm_st_writer_write(w, path_in(f, "empty.safetensors", p, sizeof p)), LM_OK);
  assert_int_equal(lm_st_open(p, &st), LM_OK);
  assert_string_equal(lm_st_file_at(st, 0)->header_json, "{}      ");
  assert_int_equal(lm_st_count(st), 0);
  lm_st_close(st);
  assert_int_equal(lm_st_writer_set_meta(w, "framework", "pt"), LM_OK);
  assert_int_equal(lm_st_writer_write(w, p), LM_OK); /* replaces the file atomically */
  assert_int_equal(lm_st_open(p, &st), LM_OK);
  assert_string_equal(lm_st_file_at(st, 0)->header_json,
                      "{\"__metadata__\":{\"framework\":\"pt\"}}     ");
  lm_st_close(st);
  lm_st_writer_free(w);

  /* mixed dtypes: 8-byte types first, then 4, 2, 1; names ascending within a rank */
  assert_int_equal(lm_st_writer_create(&w), LM_OK);
  uint8_t buf[64] = {0};
  int64_t one = 3;
  assert_int_equal(lm_st_writer_add(w, "a.u8", LM_DT_U8, 1, &one, buf), LM_OK);
  assert_int_equal(lm_st_writer_add(w, "b.f64", LM_DT_F64, 1, &one, buf), LM_OK);
  assert_int_equal(lm_st_writer_add(w, "c.bf16", LM_DT_BF16, 1, &one, buf), LM_OK);
  assert_int_equal(lm_st_writer_add(w, "d.f32", LM_DT_F32, 1, &one, buf), LM_OK);
  assert_int_equal(lm_st_writer_add(w, "a.f32", LM_DT_F32, 1, &one, buf), LM_OK);
  assert_int_equal(lm_st_writer_add(w, "e.u64", LM_DT_U64, 1, &one, buf), LM_OK);
  assert_int_equal(lm_st_writer_write(w, p), LM_OK);
  assert_int_equal(lm_st_open(p, &st), LM_OK);
  const char *order[] = {"e.u64", "b.f64", "a.f32", "d.f32", "c.bf16", "a.u8"};
  for (size_t i = 0; i < 6; i++)
    assert_string_equal(lm_st_at(st, i)->name, order[i]);
  lm_st_close(st);
  lm_st_writer_free(w);
}

static void t_writer_errors(void **state) {
  fixture *f = *state;
  char p[1024];
  lm_st_writer *w;
  int64_t sh[2] = {2, 2}, neg[1] = {-1}, huge[2] = {INT64_MAX, 4};
  uint8_t buf[16] = {0};
  assert_int_equal(lm_st_writer_create(&w), LM_OK);
  assert_int_equal(lm_st_writer_add(w, "x", LM_DT_F32, 2, sh, buf), LM_OK);
  assert_int_equal(lm_st_writer_add(w, "x", LM_DT_F32, 2, sh, buf), LM_ERR_INVALID);
  assert_msg_has("added twice");
  assert_int_equal(lm_st_writer_add(w, "", LM_DT_F32, 2, sh, buf), LM_ERR_INVALID);
  assert_int_equal(lm_st_writer_add(w, "__metadata__", LM_DT_F32, 2, sh, buf), LM_ERR_INVALID);
  assert_int_equal(lm_st_writer_add(w, "bad\xff", LM_DT_F32, 2, sh, buf), LM_ERR_INVALID);
  assert_int_equal(lm_st_writer_add(w, "y", LM_DT_COUNT, 2, sh, buf), LM_ERR_INVALID);
  assert_int_equal(lm_st_writer_add(w, "y", LM_DT_F32, 9, sh, buf), LM_ERR_INVALID);
  assert_int_equal(lm_st_writer_add(w, "y", LM_DT_F32, 1, neg, buf), LM_ERR_INVALID);
  assert_int_equal(lm_st_writer_add(w, "y", LM_DT_F32, 2, huge, buf), LM_ERR_INVALID);
  assert_msg_has("overflows");
  assert_int_equal(lm_st_writer_add(w, "y", LM_DT_F32, 2, sh, NULL), LM_ERR_INVALID);
  assert_int_equal(lm_st_writer_add_fn(w, "y", LM_DT_F32, 2, sh, NULL, NULL), LM_ERR_INVALID);
  assert_int_equal(lm_st_writer_count(w), 1);
  assert_int_equal(lm_st_writer_bytes(w), 16);
  /* a failing callback aborts the write and leaves no file (and no temporary) behind */
  assert_int_equal(lm_st_writer_add_fn(w, "z", LM_DT_F32, 2, sh, fill_fail, NULL), LM_OK);
  assert_int_equal(lm_st_writer_write(w, path_in(f, "fail.safetensors", p, sizeof p)),
                   LM_ERR_CANCELLED);
  assert_int_equal(access(p, F_OK), -1);
  DIR *d = opendir(f->dir);
  int entries = 0;
  for (struct dirent *e; (e = readdir(d));)
    entries += e->d_name[0] != '.';
  closedir(d);
  assert_int_equal(entries, 0);
  /* an unwritable destination is an I/O error naming the path */
  assert_int_equal(lm_st_writer_write(w, "/nonexistent-dir/x.safetensors"), LM_ERR_IO);
  assert_msg_has("/nonexistent-dir/x.safetensors");
  lm_st_writer_free(w);
  lm_st_writer_free(NULL);
  /* zero tensors cannot form a sharded checkpoint */
  assert_int_equal(lm_st_writer_create(&w), LM_OK);
  assert_int_equal(lm_st_writer_write_sharded(w, f->dir, 100, NULL), LM_ERR_INVALID);
  lm_st_writer_free(w);
}

static void t_roundtrip_sharded(void **state) {
  fixture *f = *state;
  char p[1024];
  lm_st_writer *w;
  spec_data d;
  assert_int_equal(lm_st_writer_create(&w), LM_OK);
  add_specs(w, &d);
  assert_int_equal(lm_st_writer_set_meta(w, "format", "pt"), LM_OK);
  size_t ns = 0;
  assert_int_equal(lm_st_writer_write_sharded(w, f->dir, 40, &ns), LM_OK);
  assert_true(ns >= 3);

  /* the index as transformers writes it */
  json_t *idx;
  assert_int_equal(
      lm_json_load_file(path_in(f, "model.safetensors.index.json", p, sizeof p), 0, &idx), LM_OK);
  int64_t total = 0;
  assert_int_equal(
      lm_json_get_int(json_object_get(idx, "metadata"), "total_size", &total, 1, "index"), LM_OK);
  assert_int_equal((uint64_t)total, lm_st_writer_bytes(w));
  const char *shard0 = NULL;
  assert_int_equal(
      lm_json_get_string(json_object_get(idx, "weight_map"), "bf16", &shard0, 1, "index"), LM_OK);
  char want[64];
  snprintf(want, sizeof want, "model-00001-of-%05zu.safetensors", ns);
  assert_string_equal(shard0, want); /* name order: "bf16" sorts first */
  json_decref(idx);

  /* open by directory (finds the index) and by index path: same view */
  lm_safetensors *st;
  for (int how = 0; how < 2; how++) {
    assert_int_equal(lm_st_open(how ? p : f->dir, &st), LM_OK);
    check_specs(st, &d);
    assert_int_equal(lm_st_file_count(st), ns);
    for (size_t i = 0; i < ns; i++) {
      snprintf(want, sizeof want, "model-%05zu-of-%05zu.safetensors", i + 1, ns);
      assert_non_null(strstr(lm_st_file_at(st, i)->path, want));
      assert_string_equal(lm_st_file_meta(st, i, "format"), "pt");
    }
    const lm_st_tensor *t = lm_st_find(st, "bf16");
    assert_int_equal(t->file, 0);
    lm_st_close(st);
  }
  free_specs(&d);
  lm_st_writer_free(w);
}

/* A directory without an index: model.safetensors wins; else every *.safetensors in name order. */
static void t_directory_modes(void **state) {
  fixture *f = *state;
  char p[1024];
  lm_safetensors *st;
  assert_int_equal(lm_st_open(f->dir, &st), LM_ERR_NOT_FOUND);
  assert_msg_has(f->dir);
  write_st(path_in(f, "b.safetensors", p, sizeof p),
           "{\"y\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2);
  write_st(path_in(f, "a.safetensors", p, sizeof p),
           "{\"x\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1);
  write_text(path_in(f, ".hidden.safetensors", p, sizeof p), "junk");
  write_text(path_in(f, "notes.txt", p, sizeof p), "junk");
  assert_int_equal(lm_st_open(f->dir, &st), LM_OK);
  assert_int_equal(lm_st_file_count(st), 2);
  assert_non_null(strstr(lm_st_file_at(st, 0)->path, "a.safetensors"));
  assert_string_equal(lm_st_at(st, 0)->name, "x");
  assert_string_equal(lm_st_at(st, 1)->name, "y");
  assert_int_equal(lm_st_find(st, "y")->file, 1);
  lm_st_close(st);

  /* the same tensor in two files of a directory */
  write_st(path_in(f, "c.safetensors", p, sizeof p),
           "{\"x\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1);
  assert_int_equal(lm_st_open(f->dir, &st), LM_ERR_CORRUPT);
  assert_msg_has("c.safetensors");
  assert_msg_has("a.safetensors");
  assert_msg_has("tensor x");
  assert_null(st);

  write_st(path_in(f, "model.safetensors", p, sizeof p),
           "{\"m\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1);
  assert_int_equal(lm_st_open(f->dir, &st), LM_OK);
  assert_int_equal(lm_st_file_count(st), 1);
  assert_non_null(lm_st_find(st, "m"));
  lm_st_close(st);

  assert_int_equal(lm_st_open(path_in(f, "nope.safetensors", p, sizeof p), &st), LM_ERR_NOT_FOUND);
  assert_msg_has("nope.safetensors");
}

/* ---- bad single files
 * ---------------------------------------------------------------------------- */

typedef struct {
  const char *what;   /* the defect */
  const char *header; /* JSON header text, or NULL when raw is used */
  uint64_t data_len;  /* bytes of data after the header */
  const char *raw;    /* raw file bytes (for defects before the JSON) */
  size_t raw_len;
  lm_status want;
  const char *tensor; /* name the message must contain, or NULL */
  const char *phrase; /* words the message must contain */
} bad_row;

#define E(dt, sh, b, e) "{\"dtype\":" dt ",\"shape\":" sh ",\"data_offsets\":[" #b "," #e "]}"

static const bad_row k_bad[] = {
    {"file shorter than 8 bytes", NULL, 0, "\x05\0\0\0", 4, LM_ERR_CORRUPT, NULL,
     "shorter than the 8-byte"},
    {"empty file", NULL, 0, "", 0, LM_ERR_CORRUPT, NULL, "0 bytes"},
    {"header length 0", NULL, 0, "\0\0\0\0\0\0\0\0{}", 10, LM_ERR_CORRUPT, NULL,
     "header length is 0"},
    {"header length absurd", NULL, 0, "\x01\xe1\xf5\x05\0\0\0\0{}", 10, LM_ERR_CORRUPT, NULL,
     "exceeds the limit"},
    {"header length 2^64-1", NULL, 0, "\xff\xff\xff\xff\xff\xff\xff\xff{}", 10, LM_ERR_CORRUPT,
     NULL, "exceeds"},
    {"header past end of file", NULL, 0, "\x20\0\0\0\0\0\0\0{}", 10, LM_ERR_CORRUPT, NULL,
     "past the end of the file"},
    {"header not JSON", "{\"w\": ", 0, NULL, 0, LM_ERR_CORRUPT, NULL, "not valid JSON"},
    {"header not UTF-8", "{\"w\xff\":1}", 0, NULL, 0, LM_ERR_CORRUPT, NULL, "not valid JSON"},
    {"header with NUL", "{\"w\\u0000\":1}", 0, NULL, 0, LM_ERR_CORRUPT, NULL, "not valid JSON"},
    {"trailing garbage in header", "{} x", 0, NULL, 0, LM_ERR_CORRUPT, NULL, "not valid JSON"},
    {"header not an object", "[1, 2]", 0, NULL, 0, LM_ERR_CORRUPT, NULL, "expected a JSON object"},
    {"duplicate names", "{\"w\":" E("\"U8\"", "[1]", 0, 1) ",\"w\":" E("\"U8\"", "[1]", 1, 2) "}",
     2, NULL, 0, LM_ERR_CORRUPT, "\"w\"", "duplicate tensor name"},
    {"entry not an object", "{\"w\": [1]}", 0, NULL, 0, LM_ERR_CORRUPT, "w", "expected an object"},
    {"missing dtype", "{\"w\":{\"shape\":[1],\"data_offsets\":[0,1]}}", 1, NULL, 0, LM_ERR_CORRUPT,
     "w", "missing \"dtype\""},
    {"dtype mistyped", "{\"w\":" E("7", "[1]", 0, 1) "}", 1, NULL, 0, LM_ERR_CORRUPT, "w",
     "expected a string"},
    {"dtype unknown", "{\"w\":" E("\"Q4\"", "[1]", 0, 1) "}", 1, NULL, 0, LM_ERR_CORRUPT, "w",
     "unknown dtype"},
    {"dtype F8 refused", "{\"w\":" E("\"F8_E4M3\"", "[1]", 0, 1) "}", 1, NULL, 0,
     LM_ERR_UNSUPPORTED, "w", "F8_E4M3 is not supported"},
    {"missing shape", "{\"w\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", 1, NULL, 0,
     LM_ERR_CORRUPT, "w", "missing \"shape\""},
    {"shape mistyped", "{\"w\":" E("\"U8\"", "{}", 0, 1) "}", 1, NULL, 0, LM_ERR_CORRUPT, "w",
     "\"shape\" is an object"},
    {"shape element mistyped", "{\"w\":" E("\"U8\"", "[1.5]", 0, 1) "}", 1, NULL, 0, LM_ERR_CORRUPT,
     "w", "shape[0] is a real"},
    {"shape negative", "{\"w\":" E("\"U8\"", "[2,-1]", 0, 1) "}", 1, NULL, 0, LM_ERR_CORRUPT, "w",
     "shape[1] is -1"},
    {"shape count overflows", "{\"w\":" E("\"U8\"", "[4294967296,4294967296,4]", 0, 1) "}", 1, NULL,
     0, LM_ERR_CORRUPT, "w", "overflows 64 bits at shape[1]"},
    {"shape bytes overflow", "{\"w\":" E("\"F64\"", "[2305843009213693952,2]", 0, 1) "}", 1, NULL,
     0, LM_ERR_CORRUPT, "w", "overflows 64 bits"},
    {"rank above 8", "{\"w\":" E("\"U8\"", "[1,1,1,1,1,1,1,1,1]", 0, 1) "}", 1, NULL, 0,
     LM_ERR_UNSUPPORTED, "w", "rank 9"},
    {"missing data_offsets", "{\"w\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1, NULL, 0, LM_ERR_CORRUPT,
     "w", "missing \"data_offsets\""},
    {"data_offsets mistyped", "{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":\"0-1\"}}",
     1, NULL, 0, LM_ERR_CORRUPT, "w", "\"data_offsets\" is a string"},
    {"data_offsets wrong length",
     "{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1,2]}}", 2, NULL, 0,
     LM_ERR_CORRUPT, "w", "has 3 elements, expected 2"},
    {"data_offsets element mistyped",
     "{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,\"1\"]}}", 1, NULL, 0,
     LM_ERR_CORRUPT, "w", "data_offsets[1] is a string"},
    {"data_offsets negative", "{\"w\":" E("\"U8\"", "[1]", -1, 0) "}", 1, NULL, 0, LM_ERR_CORRUPT,
     "w", "data_offsets[0] is -1"},
    {"begin > end", "{\"w\":" E("\"U8\"", "[1]", 2, 1) "}", 2, NULL, 0, LM_ERR_CORRUPT, "w",
     "begin 2 > end 1"},
    {"end past end of file", "{\"w\":" E("\"U8\"", "[4]", 0, 4) "}", 3, NULL, 0, LM_ERR_CORRUPT,
     "w", "end 4 is past the end of the file (data section is 3 bytes)"},
    {"shape x dtype != end - begin", "{\"w\":" E("\"F32\"", "[2]", 0, 4) "}", 4, NULL, 0,
     LM_ERR_CORRUPT, "w", "needs 8 bytes, data_offsets span 4"},
    {"overlapping ranges",
     "{\"a\":" E("\"F32\"", "[2]", 0, 8) ",\"b\":" E("\"F32\"", "[2]", 4, 12) "}", 12, NULL, 0,
     LM_ERR_CORRUPT, "b", "overlap tensor a"},
    {"empty tensor inside another",
     "{\"a\":" E("\"F32\"", "[2]", 0, 8) ",\"e\":" E("\"F32\"", "[0]", 4, 4) "}", 8, NULL, 0,
     LM_ERR_CORRUPT, "e", "overlap tensor a"},
    {"gap between tensors",
     "{\"a\":" E("\"F32\"", "[1]", 0, 4) ",\"b\":" E("\"F32\"", "[1]", 8, 12) "}", 12, NULL, 0,
     LM_ERR_CORRUPT, "b", "gap after a"},
    {"gap at the data start", "{\"a\":" E("\"U8\"", "[1]", 1, 2) "}", 2, NULL, 0, LM_ERR_CORRUPT,
     "a", "gap after the data start"},
    {"trailing data bytes", "{\"a\":" E("\"F32\"", "[1]", 0, 4) "}", 8, NULL, 0, LM_ERR_CORRUPT,
     "a", "trailing bytes"},
    {"__metadata__ not an object", "{\"__metadata__\":[\"x\"]}", 0, NULL, 0, LM_ERR_CORRUPT,
     "__metadata__", "expected an object of strings"},
    {"__metadata__ value not a string", "{\"__metadata__\":{\"format\":1}}", 0, NULL, 0,
     LM_ERR_CORRUPT, "format", "value is an integer, expected a string"},
    {"control characters in a name are hidden", "{\"a\\nb\":" E("\"U8\"", "[1]", 0, 2) "}", 2, NULL,
     0, LM_ERR_CORRUPT, "a?b", "needs 1 bytes"},
};

static void t_bad_files(void **state) {
  fixture *f = *state;
  char p[1024];
  path_in(f, "bad.safetensors", p, sizeof p);
  for (size_t i = 0; i < sizeof k_bad / sizeof k_bad[0]; i++) {
    const bad_row *r = &k_bad[i];
    size_t len;
    uint8_t *img;
    if (r->header)
      img = st_image(r->header, r->data_len, &len);
    else {
      len = r->raw_len;
      img = malloc(len ? len : 1);
      memcpy(img, r->raw, len);
    }
    /* from memory, as the fuzz target calls it */
    lm_st_header *h = (lm_st_header *)1;
    lm_err_clear();
    lm_status s = lm_st_parse_header(img, len, "mem.safetensors", &h);
    if (s != r->want) fail_msg("%s: parse got %s (%s)", r->what, lm_status_name(s), lm_errmsg());
    assert_null(h);
    assert_msg_has("mem.safetensors");
    if (r->tensor) assert_msg_has(r->tensor);
    assert_msg_has(r->phrase);
    assert_null(strchr(lm_errmsg(), '\n'));
    if (getenv("LM_ST_SHOW")) printf("%-40s %s\n", r->what, lm_errmsg());
    /* from a file */
    write_bytes(p, img, len);
    free(img);
    lm_safetensors *st = (lm_safetensors *)1;
    s = lm_st_open(p, &st);
    if (s != r->want) fail_msg("%s: open got %s (%s)", r->what, lm_status_name(s), lm_errmsg());
    assert_null(st);
    assert_msg_has(p);
    if (r->tensor) assert_msg_has(r->tensor);
    assert_msg_has(r->phrase);
  }
}

/* Boundary rows that must be accepted. */
static void t_good_edges(void **state) {
  (void)state;
  static const char *ok[] = {
      "{}",                                    /* no tensors, no data */
      "{}    ",                                /* space padding */
      "{\"__metadata__\":{}}",                 /* empty metadata */
      "{\"s\":" E("\"BF16\"", "[]", 0, 2) "}", /* scalar */
      "{\"e\":" E("\"BF16\"", "[3,0]", 0, 0) ",\"f\":" E("\"U8\"", "[0]", 0,
                                                         0) "}", /* empties share offset 0 */
      "{\"b\":" E("\"U8\"", "[1]", 2, 3) ",\"a\":" E(
          "\"U16\"", "[1]", 0,
          2) ",\"x\":{\"dtype\":\"U8\",\"shape\":[0],"
             "\"data_offsets\":[3,3],\"extra\":true}}", /* any order; unknown keys ignored */
  };
  static const uint64_t data_len[] = {0, 0, 0, 2, 0, 3};
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    size_t len;
    uint8_t *img = st_image(ok[i], data_len[i], &len);
    lm_st_header *h = NULL;
    lm_status s = lm_st_parse_header(img, len, "ok", &h);
    if (s != LM_OK) fail_msg("row %zu: %s", i, lm_errmsg());
    assert_int_equal(h->data_start, 8 + strlen(ok[i]));
    for (size_t k = 0; k < h->n_tensors; k++)
      assert_ptr_equal(h->tensors[k].data, img + h->tensors[k].offset);
    lm_st_header_free(h);
    free(img);
  }
  lm_st_header_free(NULL);
}

/* ---- bad sharded indexes ------------------------------------------------------------------------
 */

typedef struct {
  const char *what;
  const char *index; /* model.safetensors.index.json text */
  lm_status want;
  const char *tensor; /* must be in the message (with the index's or a shard's path) */
  const char *phrase;
} bad_index_row;

static const bad_index_row k_bad_index[] = {
    {"index not JSON", "{\"weight_map\": ", LM_ERR_CORRUPT, NULL, "invalid JSON"},
    {"index not an object", "[]", LM_ERR_CORRUPT, NULL, "expected a JSON object"},
    {"weight_map missing", "{\"metadata\":{}}", LM_ERR_NOT_FOUND, NULL,
     "\"weight_map\" is missing"},
    {"weight_map mistyped", "{\"weight_map\":[]}", LM_ERR_CORRUPT, NULL, "expected an object"},
    {"weight_map empty", "{\"weight_map\":{}}", LM_ERR_CORRUPT, NULL, "weight_map is empty"},
    {"weight_map value mistyped", "{\"weight_map\":{\"x\":1}}", LM_ERR_CORRUPT, "x",
     "expected a shard file name"},
    {"shard outside the directory", "{\"weight_map\":{\"x\":\"../s1.safetensors\"}}",
     LM_ERR_CORRUPT, "x", "expected a file name"},
    {"shard missing", "{\"weight_map\":{\"x\":\"s1.safetensors\",\"q\":\"gone.safetensors\"}}",
     LM_ERR_NOT_FOUND, "q", "gone.safetensors, which is missing"},
    {"tensor not in its shard",
     "{\"weight_map\":{\"x\":\"s1.safetensors\",\"y\":\"s2.safetensors\","
     "\"zz\":\"s1.safetensors\"}}",
     LM_ERR_CORRUPT, "zz", "does not contain it"},
    {"tensor in another shard",
     "{\"weight_map\":{\"x\":\"s2.safetensors\",\"y\":\"s1.safetensors\"}}", LM_ERR_CORRUPT, "x",
     "but it is in s1.safetensors"},
    {"shard tensor not in weight_map", "{\"weight_map\":{\"x\":\"s3.safetensors\"}}",
     LM_ERR_CORRUPT, "y", "not in the weight_map"},
    {"tensor in two shards", "{\"weight_map\":{\"x\":\"s1.safetensors\",\"y\":\"s3.safetensors\"}}",
     LM_ERR_CORRUPT, "x", "also present in"},
};

static void t_bad_index(void **state) {
  fixture *f = *state;
  char p[1024], idx[1024];
  write_st(path_in(f, "s1.safetensors", p, sizeof p), "{\"x\":" E("\"U8\"", "[1]", 0, 1) "}", 1);
  write_st(path_in(f, "s2.safetensors", p, sizeof p), "{\"y\":" E("\"U8\"", "[1]", 0, 1) "}", 1);
  write_st(path_in(f, "s3.safetensors", p, sizeof p),
           "{\"x\":" E("\"U8\"", "[1]", 0, 1) ",\"y\":" E("\"U8\"", "[1]", 1, 2) "}", 2);
  path_in(f, "model.safetensors.index.json", idx, sizeof idx);
  for (size_t i = 0; i < sizeof k_bad_index / sizeof k_bad_index[0]; i++) {
    const bad_index_row *r = &k_bad_index[i];
    write_text(idx, r->index);
    lm_safetensors *st = (lm_safetensors *)1;
    lm_status s = lm_st_open(idx, &st);
    if (s != r->want) fail_msg("%s: got %s (%s)", r->what, lm_status_name(s), lm_errmsg());
    if (getenv("LM_ST_SHOW")) printf("%-40s %s\n", r->what, lm_errmsg());
    assert_null(st);
    assert_msg_has(f->dir); /* the index or shard path */
    if (r->tensor) assert_msg_has(r->tensor);
    assert_msg_has(r->phrase);
  }
  /* and a good index over the same shards, found through the directory */
  write_text(idx, "{\"metadata\":{\"total_size\":2},\"weight_map\":{\"x\":\"s1.safetensors\",\"y\":"
                  "\"s2.safetensors\"}}");
  lm_safetensors *st;
  assert_int_equal(lm_st_open(f->dir, &st), LM_OK);
  assert_int_equal(lm_st_file_count(st), 2);
  assert_int_equal(lm_st_find(st, "y")->file, 1);
  assert_int_equal(*(const uint8_t *)lm_st_find(st, "y")->data, 1);
  lm_st_close(st);
}

/* Many tensors: the hash finds every one of them. */
static void t_many_tensors(void **state) {
  fixture *f = *state;
  char p[1024], name[64];
  enum { N = 3000 };
  lm_st_writer *w;
  uint16_t *vals = malloc(N * sizeof *vals);
  assert_int_equal(lm_st_writer_create(&w), LM_OK);
  for (int i = 0; i < N; i++) {
    vals[i] = (uint16_t)(i * 3);
    snprintf(name, sizeof name, "model.layers.%d.weight", i);
    int64_t one = 1;
    assert_int_equal(lm_st_writer_add(w, name, LM_DT_BF16, 1, &one, &vals[i]), LM_OK);
  }
  int64_t one = 1;
  assert_int_equal(lm_st_writer_add(w, "model.layers.1234.weight", LM_DT_BF16, 1, &one, vals),
                   LM_ERR_INVALID);
  assert_int_equal(lm_st_writer_count(w), N);
  assert_int_equal(lm_st_writer_write(w, path_in(f, "many.safetensors", p, sizeof p)), LM_OK);
  lm_safetensors *st;
  assert_int_equal(lm_st_open(p, &st), LM_OK);
  for (int i = 0; i < N; i++) {
    snprintf(name, sizeof name, "model.layers.%d.weight", i);
    const lm_st_tensor *t = lm_st_find(st, name);
    assert_non_null(t);
    uint16_t v;
    memcpy(&v, t->data, 2);
    assert_int_equal(v, vals[i]);
  }
  assert_null(lm_st_find(st, "model.layers.3000.weight"));
  lm_st_close(st);
  lm_st_writer_free(w);
  free(vals);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(t_roundtrip_single, setup, teardown),
      cmocka_unit_test_setup_teardown(t_hf_layout, setup, teardown),
      cmocka_unit_test_setup_teardown(t_writer_errors, setup, teardown),
      cmocka_unit_test_setup_teardown(t_roundtrip_sharded, setup, teardown),
      cmocka_unit_test_setup_teardown(t_directory_modes, setup, teardown),
      cmocka_unit_test_setup_teardown(t_bad_files, setup, teardown),
      cmocka_unit_test_setup_teardown(t_good_edges, setup, teardown),
      cmocka_unit_test_setup_teardown(t_bad_index, setup, teardown),
      cmocka_unit_test_setup_teardown(t_many_tensors, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
