/* safetensors.c — strict safetensors header parsing, file mapping, sharded indexes and the
 * name → tensor hash.
 *
 * The parse follows the SQLite btree discipline: compute the legal range first (the data section
 * is [8 + N, file_size)), then check every value taken from the header against it before use, one
 * error per defect. The checks mirror huggingface/safetensors `Metadata::validate` (ranges must
 * tile the data section exactly) so that lumen accepts what the reference accepts and no more. */
#include "io/safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/status.h"
#include "io/file_util.h"
#include "io/json_util.h"

/* ---- message helpers --------------------------------------------------------------------------
 */

/* Names come from untrusted bytes: clip them and hide control characters so that an error stays
 * one readable line and the reason after the name survives the message buffer. */
typedef struct {
  char s[104];
} lm_st_label;

static lm_st_label lm_st_lbl(const char *name) {
  lm_st_label l;
  size_t i = 0, cap = sizeof l.s - 4;
  for (; name[i] && i < cap; i++)
    l.s[i] = ((unsigned char)name[i] < 0x20 || name[i] == 0x7f) ? '?' : name[i];
  if (name[i])
    memcpy(l.s + i, "...", 4);
  else
    l.s[i] = '\0';
  return l;
}

#define LBL(x) (lm_st_lbl(x).s)
#define ULL(x) ((unsigned long long)(x))

/* Formats a shape as "[a, b, c]" into buf (for size-mismatch messages). */
static const char *lm_st_shape_str(const int64_t *shape, int ndim, char *buf, size_t cap) {
  size_t k = 0;
  k += (size_t)snprintf(buf + k, cap - k, "[");
  for (int i = 0; i < ndim && k < cap; i++)
    k += (size_t)snprintf(buf + k, cap - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
  if (k < cap) snprintf(buf + k, cap - k, "]");
  return buf;
}

/* ---- one header entry --------------------------------------------------------------------------
 */

/* Element types that safetensors defines but lumen does not load. */
static int lm_st_dtype_known_unsupported(const char *s) {
  return !strncmp(s, "F8_", 3) || !strcmp(s, "F4") || !strncmp(s, "F6_", 3) || !strcmp(s, "C64") ||
         !strcmp(s, "F8");
}

/* Parses "dtype" of entry e into t->dtype. */
static lm_status lm_st_entry_dtype(const char *path, const char *name, const json_t *e,
                                   lm_st_tensor *t) {
  const json_t *d = json_object_get(e, "dtype");
  if (!d) return LM_ERRF(LM_ERR_CORRUPT, "%s: tensor %s: missing \"dtype\"", path, LBL(name));
  if (!json_is_string(d))
    return LM_ERRF(LM_ERR_CORRUPT, "%s: tensor %s: \"dtype\" is %s, expected a string", path,
                   LBL(name), lm_json_type_name(d));
  const char *s = json_string_value(d);
  t->dtype = lm_dtype_parse(s);
  if (t->dtype != LM_DT_COUNT) return LM_OK;
  if (lm_st_dtype_known_unsupported(s))
    return LM_ERRF(LM_ERR_UNSUPPORTED,
                   "%s: tensor %s: dtype %s is not supported (supported: F64 F32 F16 BF16 I64 I32 "
                   "I16 I8 U64 U32 "
                   "U16 U8 BOOL)",
                   path, LBL(name), LBL(s));
  return LM_ERRF(LM_ERR_CORRUPT, "%s: tensor %s: unknown dtype \"%s\"", path, LBL(name), LBL(s));
}

/* Parses "shape" into t->ndim/t->shape and t->nbytes, with checked 64-bit products. */
static lm_status lm_st_entry_shape(const char *path, const char *name, const json_t *e,
                                   lm_st_tensor *t) {
  const json_t *a = json_object_get(e, "shape");
  if (!a) return LM_ERRF(LM_ERR_CORRUPT, "%s: tensor %s: missing \"shape\"", path, LBL(name));
  if (!json_is_array(a))
    return LM_ERRF(LM_ERR_CORRUPT, "%s: tensor %s: \"shape\" is %s, expected an array of integers",
                   path, LBL(name), lm_json_type_name(a));
  size_t nd = json_array_size(a);
  if (nd > LM_ST_MAX_DIMS)
    return LM_ERRF(LM_ERR_UNSUPPORTED, "%s: tensor %s: rank %zu exceeds the maximum of %d", path,
                   LBL(name), nd, LM_ST_MAX_DIMS);
  int64_t numel = 1;
  for (size_t i = 0; i < nd; i++) {
    const json_t *d = json_array_get(a, i);
    if (!json_is_integer(d))
      return LM_ERRF(LM_ERR_CORRUPT, "%s: tensor %s: shape[%zu] is %s, expected an integer", path,
                     LBL(name), i, lm_json_type_name(d));
    int64_t v = (int64_t)json_integer_value(d);
    if (v < 0)
      return LM_ERRF(LM_ERR_CORRUPT, "%s: tensor %s: shape[%zu] is %lld, expected >= 0", path,
                     LBL(name), i, (long long)v);
    if (__builtin_mul_overflow(numel, v, &numel))
      return LM_ERRF(LM_ERR_CORRUPT,
                     "%s: tensor %s: shape element count overflows 64 bits at shape[%zu]", path,
                     LBL(name), i);
    t->shape[i] = v;
  }
  t->ndim = (int)nd;
  if (__builtin_mul_overflow((uint64_t)numel, (uint64_t)lm_dtype_size(t->dtype), &t->nbytes))
    return LM_ERRF(LM_ERR_CORRUPT,
                   "%s: tensor %s: byte size (%lld elements of %s) overflows 64 bits", path,
                   LBL(name), (long long)numel, lm_dtype_name(t->dtype));
  return LM_OK;
}

/* Parses "data_offsets" [begin, end] and checks them against the data section [0, data_size). */
static lm_status lm_st_entry_offsets(const char *path, const char *name, const json_t *e,
                                     uint64_t data_size, uint64_t *begin, uint64_t *end) {
  const json_t *a = json_object_get(e, "data_offsets");
  if (!a)
    return LM_ERRF(LM_ERR_CORRUPT, "%s: tensor %s: missing \"data_offsets\"", path, LBL(name));
  if (!json_is_array(a))
    return LM_ERRF(LM_ERR_CORRUPT, "%s: tensor %s: \"data_offsets\" is %s, expected [begin, end]",
                   path, LBL(name), lm_json_type_name(a));
  if (json_array_size(a) != 2)
    return LM_ERRF(LM_ERR_CORRUPT, "%s: tensor %s: \"data_offsets\" has %zu elements, expected 2",
                   path, LBL(name), json_array_size(a));
  uint64_t v[2];
  for (size_t i = 0; i < 2; i++) {
    const json_t *d = json_array_get(a, i);
    if (!json_is_integer(d))
      return LM_ERRF(LM_ERR_CORRUPT, "%s: tensor %s: data_offsets[%zu] is %s, expected an integer",
                     path, LBL(name), i, lm_json_type_name(d));
    if (json_integer_value(d) < 0)
      return LM_ERRF(LM_ERR_CORRUPT, "%s: tensor %s: data_offsets[%zu] is %lld, expected >= 0",
                     path, LBL(name), i, (long long)json_integer_value(d));
    v[i] = (uint64_t)json_integer_value(d);
  }
  /* safetensors: begin <= end <= length of the data section */
  if (v[0] > v[1])
    return LM_ERRF(LM_ERR_CORRUPT, "%s: tensor %s: data_offsets begin %llu > end %llu", path,
                   LBL(name), ULL(v[0]), ULL(v[1]));
  if (v[1] > data_size)
    return LM_ERRF(LM_ERR_CORRUPT,
                   "%s: tensor %s: data_offsets end %llu is past the end of the file (data section "
                   "is %llu bytes)",
                   path, LBL(name), ULL(v[1]), ULL(data_size));
  *begin = v[0];
  *end = v[1];
  return LM_OK;
}

/* Parses one tensor entry into t (everything but the name, data pointer and file). */
static lm_status lm_st_entry(const char *path, const char *name, const json_t *e,
                             uint64_t data_size, lm_st_tensor *t, uint64_t *begin) {
  if (!json_is_object(e))
    return LM_ERRF(LM_ERR_CORRUPT, "%s: tensor %s: entry is %s, expected an object", path,
                   LBL(name), lm_json_type_name(e));
  uint64_t end = 0;
  LM_TRY(lm_st_entry_dtype(path, name, e, t));
  LM_TRY(lm_st_entry_shape(path, name, e, t));
  LM_TRY(lm_st_entry_offsets(path, name, e, data_size, begin, &end));
  /* safetensors: shape × dtype size == end − begin */
  if (t->nbytes != end - *begin) {
    char sh[160];
    return LM_ERRF(
        LM_ERR_CORRUPT,
        "%s: tensor %s: shape %s x %s (%zu bytes) needs %llu bytes, data_offsets span %llu", path,
        LBL(name), lm_st_shape_str(t->shape, t->ndim, sh, sizeof sh), lm_dtype_name(t->dtype),
        lm_dtype_size(t->dtype), ULL(t->nbytes), ULL(end - *begin));
  }
  return LM_OK;
}

/* ---- the whole header -------------------------------------------------------------------------
 */

void lm_st_header_free(lm_st_header *h) {
  if (!h) return;
  free(h->tensors);
  free(h->meta_keys);
  free(h->meta_values);
  free(h->strings);
  free(h);
}

/* Copies s into the string pool at *pos and returns the copy. */
static const char *lm_st_pool_put(char *pool, size_t *pos, const char *s) {
  size_t n = strlen(s) + 1;
  char *d = pool + *pos;
  memcpy(d, s, n);
  *pos += n;
  return d;
}

/* Validates __metadata__ (an object of strings) and copies it into h. */
static lm_status lm_st_parse_meta(const char *path, const json_t *m, lm_st_header *h, size_t *pos) {
  if (!json_is_object(m))
    return LM_ERRF(LM_ERR_CORRUPT, "%s: __metadata__ is %s, expected an object of strings", path,
                   lm_json_type_name(m));
  const char *k;
  const json_t *v;
  json_object_foreach((json_t *)m, k, v) {
    if (!json_is_string(v))
      return LM_ERRF(LM_ERR_CORRUPT, "%s: __metadata__ key %s: value is %s, expected a string",
                     path, LBL(k), lm_json_type_name(v));
    h->meta_keys[h->n_meta] = lm_st_pool_put(h->strings, pos, k);
    h->meta_values[h->n_meta] = lm_st_pool_put(h->strings, pos, json_string_value(v));
    h->n_meta++;
  }
  return LM_OK;
}

/* Bytes of pool needed for every name and metadata string of root. */
static size_t lm_st_pool_size(const json_t *root) {
  size_t total = 1;
  const char *k;
  const json_t *v;
  json_object_foreach((json_t *)root, k, v) {
    total += strlen(k) + 1;
    if (strcmp(k, "__metadata__") || !json_is_object(v)) continue;
    const char *mk;
    const json_t *mv;
    json_object_foreach((json_t *)v, mk, mv) total +=
        strlen(mk) + 1 + (json_is_string(mv) ? strlen(json_string_value(mv)) + 1 : 0);
  }
  return total;
}

static lm_status lm_st_header_alloc(const char *path, const json_t *root, lm_st_header **out) {
  const json_t *meta = json_object_get(root, "__metadata__");
  size_t n_obj = json_object_size(root), n_meta = json_is_object(meta) ? json_object_size(meta) : 0;
  lm_st_header *h = calloc(1, sizeof *h);
  if (h) {
    h->tensors = calloc(n_obj ? n_obj : 1, sizeof *h->tensors);
    h->meta_keys = calloc(n_meta ? n_meta : 1, sizeof *h->meta_keys);
    h->meta_values = calloc(n_meta ? n_meta : 1, sizeof *h->meta_values);
    h->strings = malloc(lm_st_pool_size(root));
  }
  if (!h || !h->tensors || !h->meta_keys || !h->meta_values || !h->strings) {
    lm_st_header_free(h);
    return LM_ERRF(LM_ERR_NOMEM, "%s: out of memory for a header of %zu entries", path, n_obj);
  }
  *out = h;
  return LM_OK;
}

static int lm_st_cmp_offset(const void *a, const void *b) {
  const lm_st_tensor *x = a, *y = b;
  if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
  if (x->nbytes != y->nbytes) return x->nbytes < y->nbytes ? -1 : 1;
  return strcmp(x->name, y->name);
}

/* Sorts by begin and checks that the ranges tile [0, data_size): no overlap, no gap, no tail.
 * The walk needs strictly monotone cursors, so it ends and catches every defect. */
static lm_status lm_st_check_tiling(const char *path, lm_st_header *h, uint64_t data_size) {
  qsort(h->tensors, h->n_tensors, sizeof *h->tensors, lm_st_cmp_offset);
  uint64_t cursor = 0; /* end of the bytes covered so far, relative to the data section */
  const lm_st_tensor *prev = NULL;
  for (size_t i = 0; i < h->n_tensors; i++) {
    const lm_st_tensor *t = &h->tensors[i];
    uint64_t b = t->offset - h->data_start;
    if (b < cursor)
      return LM_ERRF(LM_ERR_CORRUPT,
                     "%s: tensor %s: data_offsets [%llu, %llu] overlap tensor %s ending at %llu",
                     path, LBL(t->name), ULL(b), ULL(b + t->nbytes), LBL(prev->name), ULL(cursor));
    if (b > cursor)
      return LM_ERRF(LM_ERR_CORRUPT,
                     "%s: tensor %s: data_offsets begin %llu leaves a gap after %s (expected %llu)",
                     path, LBL(t->name), ULL(b), prev ? LBL(prev->name) : "the data start",
                     ULL(cursor));
    cursor = b + t->nbytes;
    prev = t;
  }
  if (cursor != data_size)
    return LM_ERRF(LM_ERR_CORRUPT,
                   "%s: tensor %s: data section is %llu bytes but the tensors cover %llu "
                   "(trailing bytes after the last tensor)",
                   path, prev ? LBL(prev->name) : "(none)", ULL(data_size), ULL(cursor));
  return LM_OK;
}

/* Fills h from the parsed JSON root. */
static lm_status lm_st_parse_root(const char *path, const json_t *root, const uint8_t *buf,
                                  uint64_t file_size, lm_st_header *h) {
  uint64_t data_size = file_size - h->data_start;
  size_t pos = 0;
  const char *k;
  const json_t *v;
  json_object_foreach((json_t *)root, k, v) {
    if (!strcmp(k, "__metadata__")) {
      LM_TRY(lm_st_parse_meta(path, v, h, &pos));
      continue;
    }
    lm_st_tensor *t = &h->tensors[h->n_tensors];
    uint64_t begin = 0;
    LM_TRY(lm_st_entry(path, k, v, data_size, t, &begin));
    t->name = lm_st_pool_put(h->strings, &pos, k);
    t->offset = h->data_start + begin;
    t->data = buf + t->offset;
    t->file = 0;
    h->n_tensors++;
  }
  return lm_st_check_tiling(path, h, data_size);
}

static uint64_t lm_le64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--)
    v = (v << 8) | p[i];
  return v;
}

lm_status lm_st_parse_header(const uint8_t *buf, uint64_t file_size, const char *path,
                             lm_st_header **out) {
  *out = NULL;
  /* safetensors: 8-byte little-endian header length N, then N bytes of UTF-8 JSON */
  if (file_size < 8)
    return LM_ERRF(LM_ERR_CORRUPT, "%s: file is %llu bytes, shorter than the 8-byte header length",
                   path, ULL(file_size));
  uint64_t n = lm_le64(buf);
  if (n == 0) return LM_ERRF(LM_ERR_CORRUPT, "%s: header length is 0", path);
  if (n > LM_ST_MAX_HEADER)
    return LM_ERRF(LM_ERR_CORRUPT, "%s: header length %llu exceeds the limit of %llu bytes", path,
                   ULL(n), ULL(LM_ST_MAX_HEADER));
  if (n > file_size - 8)
    return LM_ERRF(
        LM_ERR_CORRUPT,
        "%s: header length %llu runs past the end of the file (%llu bytes, expected <= %llu)", path,
        ULL(n), ULL(file_size), ULL(file_size - 8));
  json_error_t err;
  json_t *root = json_loadb((const char *)buf + 8, (size_t)n, JSON_REJECT_DUPLICATES, &err);
  if (!root && json_error_code(&err) == json_error_duplicate_key) /* jansson's text names the key */
    return LM_ERRF(LM_ERR_CORRUPT, "%s: header has a duplicate tensor name at byte %d: %s", path,
                   err.position, LBL(err.text));
  if (!root)
    return LM_ERRF(LM_ERR_CORRUPT,
                   "%s: header is not valid JSON at byte %d (line %d, column %d): %s", path,
                   err.position, err.line, err.column, LBL(err.text));
  lm_status s;
  lm_st_header *h = NULL;
  if (!json_is_object(root)) {
    s = LM_ERRF(LM_ERR_CORRUPT, "%s: header is %s, expected a JSON object", path,
                lm_json_type_name(root));
    goto done;
  }
  s = lm_st_header_alloc(path, root, &h);
  if (s != LM_OK) goto done;
  h->header_len = n;
  h->data_start = 8 + n;
  s = lm_st_parse_root(path, root, buf, file_size, h);
done:
  json_decref(root);
  if (s != LM_OK)
    lm_st_header_free(h);
  else
    *out = h;
  return s;
}

int64_t lm_st_numel(const lm_st_tensor *t) {
  int64_t n = 1;
  for (int i = 0; i < t->ndim; i++)
    n *= t->shape[i];
  return n;
}

/* ---- mapped files ------------------------------------------------------------------------------
 */

typedef struct lm_st_map {
  void *base; /* mmap of the whole file, or NULL for an empty file */
  uint64_t size;
  lm_st_header *hdr;
  char *header_copy; /* NUL-terminated copy of the JSON bytes, for lm_st_file */
} lm_st_map;

struct lm_safetensors {
  size_t n_files;
  lm_st_map *maps;
  lm_st_file *files;
  char **paths;
  size_t n_tensors;
  lm_st_tensor *tensors; /* all files, file order then storage order */
  size_t cap;            /* hash slots: a power of two >= 2 * n_tensors */
  size_t *slots;         /* index into tensors, or SIZE_MAX when empty */
  uint64_t seed;         /* hash seed, chosen at open */
};

/* Opens, maps and parses one file. */
static lm_status lm_st_map_file(const char *path, lm_st_map *m) {
  int fd;
  struct stat st;
  LM_TRY(lm_file_open_regular(path, &fd, &st));
  lm_status s = LM_OK;
  if ((uint64_t)st.st_size > SIZE_MAX) s = LM_ERRF(LM_ERR_IO, "%s: too large to map", path);
  if (s == LM_OK && st.st_size > 0) {
    m->base = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m->base == MAP_FAILED) {
      m->base = NULL;
      s = LM_ERRF(LM_ERR_IO, "%s: mmap of %lld bytes failed: %s", path, (long long)st.st_size,
                  strerror(errno));
    }
  }
  close(fd); /* the mapping keeps the file alive */
  if (s != LM_OK) return s;
  m->size = (uint64_t)st.st_size;
  const uint8_t none[8] = {0}; /* parse rejects a file under 8 bytes before reading it */
  LM_TRY(lm_st_parse_header(m->base ? m->base : none, m->size, path, &m->hdr));
  m->header_copy = malloc((size_t)m->hdr->header_len + 1);
  if (!m->header_copy) return LM_ERRF(LM_ERR_NOMEM, "%s: out of memory copying the header", path);
  memcpy(m->header_copy, (const uint8_t *)m->base + 8, (size_t)m->hdr->header_len);
  m->header_copy[m->hdr->header_len] = '\0';
  return LM_OK;
}

void lm_st_close(lm_safetensors *st) {
  if (!st) return;
  for (size_t i = 0; i < st->n_files; i++) {
    if (st->maps) {
      if (st->maps[i].base) munmap(st->maps[i].base, (size_t)st->maps[i].size);
      lm_st_header_free(st->maps[i].hdr);
      free(st->maps[i].header_copy);
    }
    if (st->paths) free(st->paths[i]);
  }
  free(st->maps);
  free(st->files);
  free(st->paths);
  free(st->tensors);
  free(st->slots);
  free(st);
}

/* FNV-1a from a per-object seed, then a splitmix64 finalizer. The names come from the file, so
 * the seed (heap address and clock, unknown to whoever wrote the file) keeps a crafted header of
 * colliding names from turning open into O(n^2); it is not a cryptographic guarantee. */
static uint64_t lm_st_hash(uint64_t seed, const char *s) {
  uint64_t h = 0xcbf29ce484222325ull ^ seed;
  for (; *s; s++)
    h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
  h ^= seed;
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

static uint64_t lm_st_make_seed(const void *self) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ((uint64_t)(uintptr_t)self * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)ts.tv_sec << 32) ^
         (uint64_t)ts.tv_nsec;
}

/* Slot of name: the slot holding it, or the empty slot where it would go. */
static size_t lm_st_slot(const lm_safetensors *st, const char *name) {
  size_t mask = st->cap - 1, i = (size_t)lm_st_hash(st->seed, name) & mask;
  while (st->slots[i] != SIZE_MAX && strcmp(st->tensors[st->slots[i]].name, name))
    i = (i + 1) & mask;
  return i;
}

/* Concatenates the files' tensors and indexes them by name; a name in two files is an error. */
static lm_status lm_st_build_index(lm_safetensors *st) {
  size_t n = 0;
  for (size_t f = 0; f < st->n_files; f++)
    n += st->maps[f].hdr->n_tensors;
  st->seed = lm_st_make_seed(st);
  st->cap = 16;
  while (st->cap < 2 * n)
    st->cap *= 2;
  st->tensors = calloc(n ? n : 1, sizeof *st->tensors);
  st->slots = malloc(st->cap * sizeof *st->slots);
  if (!st->tensors || !st->slots)
    return LM_ERRF(LM_ERR_NOMEM, "out of memory indexing %zu tensors", n);
  memset(st->slots, 0xff, st->cap * sizeof *st->slots); /* SIZE_MAX everywhere */
  for (size_t f = 0; f < st->n_files; f++) {
    const lm_st_header *h = st->maps[f].hdr;
    for (size_t i = 0; i < h->n_tensors; i++) {
      lm_st_tensor *t = &st->tensors[st->n_tensors];
      *t = h->tensors[i];
      t->file = (int)f;
      size_t slot = lm_st_slot(st, t->name);
      if (st->slots[slot] != SIZE_MAX)
        return LM_ERRF(LM_ERR_CORRUPT, "%s: tensor %s: also present in %s", st->paths[f],
                       LBL(t->name), st->paths[st->tensors[st->slots[slot]].file]);
      st->slots[slot] = st->n_tensors++;
    }
  }
  return LM_OK;
}

/* Opens the n files of paths (taking ownership of the array and its strings, even on error). */
static lm_status lm_st_open_files(char **paths, size_t n, lm_safetensors **out) {
  lm_safetensors *st = calloc(1, sizeof *st);
  if (!st) {
    for (size_t i = 0; i < n; i++)
      free(paths[i]);
    free(paths);
    return LM_ERRF(LM_ERR_NOMEM, "out of memory opening %zu files", n);
  }
  st->paths = paths;
  st->n_files = n;
  st->maps = calloc(n, sizeof *st->maps);
  st->files = calloc(n, sizeof *st->files);
  lm_status s =
      (st->maps && st->files) ? LM_OK : LM_ERRF(LM_ERR_NOMEM, "out of memory opening %zu files", n);
  for (size_t i = 0; i < n && s == LM_OK; i++) {
    s = lm_st_map_file(paths[i], &st->maps[i]);
    if (s != LM_OK) break;
    st->files[i] = (lm_st_file){.path = paths[i],
                                .size = st->maps[i].size,
                                .header_json = st->maps[i].header_copy,
                                .header_len = st->maps[i].hdr->header_len};
  }
  if (s == LM_OK) s = lm_st_build_index(st);
  if (s != LM_OK) {
    lm_st_close(st);
    return s;
  }
  *out = st;
  return LM_OK;
}

/* ---- paths -------------------------------------------------------------------------------------
 */

/* Returns a new "dir/name" (dir may be "" for the current directory). */
static char *lm_path_join(const char *dir, size_t dir_len, const char *name) {
  size_t nl = strlen(name);
  char *p = malloc(dir_len + 1 + nl + 1);
  if (!p) return NULL;
  memcpy(p, dir, dir_len);
  size_t k = dir_len;
  if (k && p[k - 1] != '/') p[k++] = '/';
  memcpy(p + k, name, nl + 1);
  return p;
}

static int lm_is_regular(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static int lm_ends_with(const char *s, const char *suffix) {
  size_t a = strlen(s), b = strlen(suffix);
  return a >= b && !strcmp(s + a - b, suffix);
}

static int lm_cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Opens one file given by path (copied). */
static lm_status lm_st_open_one(const char *path, lm_safetensors **out) {
  char **paths = malloc(sizeof *paths);
  char *p = paths ? strdup(path) : NULL;
  if (!p) {
    free(paths);
    return LM_ERRF(LM_ERR_NOMEM, "%s: out of memory", path);
  }
  paths[0] = p;
  return lm_st_open_files(paths, 1, out);
}

/* ---- sharded index -----------------------------------------------------------------------------
 */

/* A shard name from an index must be a plain file name next to the index: no directories, so a
 * hostile index cannot point outside the model folder. */
static lm_status lm_st_check_shard_name(const char *index, const char *tensor, const char *shard) {
  if (!shard[0] || !strcmp(shard, ".") || !strcmp(shard, "..") || strchr(shard, '/'))
    return LM_ERRF(LM_ERR_CORRUPT,
                   "%s: tensor %s: weight_map names shard \"%s\", expected a file name in the "
                   "index's directory",
                   index, LBL(tensor), LBL(shard));
  return LM_OK;
}

/* Collects the distinct shard names of weight_map, sorted (borrowed strings; free only the array).
 */
static lm_status lm_st_index_shards(const char *index, const json_t *wm, const char ***out,
                                    size_t *n_out) {
  size_t n = 0, cap = json_object_size(wm);
  const char **names = malloc((cap ? cap : 1) * sizeof *names);
  if (!names) return LM_ERRF(LM_ERR_NOMEM, "%s: out of memory", index);
  const char *k;
  const json_t *v;
  json_object_foreach((json_t *)wm, k, v) {
    lm_status s = LM_OK;
    if (!json_is_string(v))
      s = LM_ERRF(LM_ERR_CORRUPT,
                  "%s: tensor %s: weight_map value is %s, expected a shard file name", index,
                  LBL(k), lm_json_type_name(v));
    if (s == LM_OK) s = lm_st_check_shard_name(index, k, json_string_value(v));
    if (s != LM_OK) {
      free(names);
      return s;
    }
    names[n++] = json_string_value(v);
  }
  qsort(names, n, sizeof *names, lm_cmp_str);
  size_t u = 0;
  for (size_t i = 0; i < n; i++)
    if (!u || strcmp(names[u - 1], names[i])) names[u++] = names[i];
  *out = names;
  *n_out = u;
  return LM_OK;
}

/* A tensor of weight_map that is mapped to `shard`, for messages about a missing shard. */
static const char *lm_st_tensor_of_shard(const json_t *wm, const char *shard) {
  const char *k;
  const json_t *v;
  json_object_foreach((json_t *)wm, k, v) if (!strcmp(json_string_value(v), shard)) return k;
  return "?";
}

/* Builds the shard paths (dir of index + shard name); a missing shard is reported here, naming a
 * tensor that the index puts in it. */
static lm_status lm_st_index_paths(const char *index, const json_t *wm, const char **shards,
                                   size_t n, char ***out) {
  const char *slash = strrchr(index, '/');
  size_t dir_len = slash ? (size_t)(slash - index) + 1 : 0;
  char **paths = calloc(n, sizeof *paths);
  if (!paths) return LM_ERRF(LM_ERR_NOMEM, "%s: out of memory", index);
  lm_status s = LM_OK;
  for (size_t i = 0; i < n && s == LM_OK; i++) {
    paths[i] = lm_path_join(index, dir_len, shards[i]);
    if (!paths[i])
      s = LM_ERRF(LM_ERR_NOMEM, "%s: out of memory", index);
    else if (!lm_is_regular(paths[i]))
      s = LM_ERRF(LM_ERR_NOT_FOUND,
                  "%s: tensor %s: weight_map names shard %s, which is missing (%s)", index,
                  LBL(lm_st_tensor_of_shard(wm, shards[i])), LBL(shards[i]), paths[i]);
  }
  if (s != LM_OK) {
    for (size_t i = 0; i < n; i++)
      free(paths[i]);
    free(paths);
    return s;
  }
  *out = paths;
  return LM_OK;
}

/* Checks that weight_map and the shards agree in both directions. shards[i] is file i. */
static lm_status lm_st_index_verify(const char *index, const json_t *wm, const char **shards,
                                    const lm_safetensors *st) {
  const char *k;
  const json_t *v;
  json_object_foreach((json_t *)wm, k, v) {
    const lm_st_tensor *t = lm_st_find(st, k);
    if (!t)
      return LM_ERRF(LM_ERR_CORRUPT,
                     "%s: tensor %s: weight_map puts it in %s, which does not contain it", index,
                     LBL(k), LBL(json_string_value(v)));
    if (strcmp(shards[t->file], json_string_value(v)))
      return LM_ERRF(LM_ERR_CORRUPT, "%s: tensor %s: weight_map puts it in %s, but it is in %s",
                     index, LBL(k), LBL(json_string_value(v)), LBL(shards[t->file]));
  }
  for (size_t i = 0; st->n_tensors != json_object_size(wm) && i < st->n_tensors; i++)
    if (!json_object_get(wm, st->tensors[i].name))
      return LM_ERRF(LM_ERR_CORRUPT, "%s: tensor %s: present in shard %s but not in the weight_map",
                     index, LBL(st->tensors[i].name), LBL(shards[st->tensors[i].file]));
  return LM_OK;
}

static lm_status lm_st_open_index(const char *index, lm_safetensors **out) {
  json_t *root = NULL;
  const json_t *wm = NULL;
  const char **shards = NULL;
  size_t n = 0;
  char **paths = NULL;
  lm_safetensors *st = NULL;
  lm_status s = lm_json_load_file(index, LM_ST_MAX_HEADER, &root);
  if (s == LM_OK && !json_is_object(root))
    s = LM_ERRF(LM_ERR_CORRUPT, "%s: index is %s, expected a JSON object", index,
                lm_json_type_name(root));
  if (s == LM_OK) s = lm_json_get_object(root, "weight_map", &wm, 1, index);
  if (s == LM_OK && json_object_size(wm) == 0)
    s = LM_ERRF(LM_ERR_CORRUPT, "%s: weight_map is empty", index);
  if (s == LM_OK) s = lm_st_index_shards(index, wm, &shards, &n);
  if (s == LM_OK) s = lm_st_index_paths(index, wm, shards, n, &paths);
  if (s == LM_OK) s = lm_st_open_files(paths, n, &st); /* takes paths */
  if (s == LM_OK) s = lm_st_index_verify(index, wm, shards, st);
  if (s == LM_OK)
    *out = st;
  else
    lm_st_close(st);
  free(shards);
  json_decref(root);
  return s;
}

/* ---- directories -------------------------------------------------------------------------------
 */

/* Lists dir's *.safetensors (not hidden files) in byte-wise order and opens them all. */
static lm_status lm_st_open_glob(const char *dir, lm_safetensors **out) {
  DIR *d = opendir(dir);
  if (!d) return LM_ERRF(LM_ERR_IO, "%s: cannot list directory: %s", dir, strerror(errno));
  size_t n = 0, cap = 0;
  char **paths = NULL;
  lm_status s = LM_OK;
  for (struct dirent *e; s == LM_OK && (e = readdir(d));) {
    if (e->d_name[0] == '.' || !lm_ends_with(e->d_name, ".safetensors")) continue;
    if (n == cap) {
      char **np = realloc(paths, (cap = cap ? 2 * cap : 8) * sizeof *paths);
      if (!np) {
        s = LM_ERRF(LM_ERR_NOMEM, "%s: out of memory", dir);
        break;
      }
      paths = np;
    }
    if (!(paths[n] = lm_path_join(dir, strlen(dir), e->d_name)))
      s = LM_ERRF(LM_ERR_NOMEM, "%s: out of memory", dir);
    else
      n++;
  }
  closedir(d);
  if (s == LM_OK && n == 0)
    s = LM_ERRF(LM_ERR_NOT_FOUND,
                "%s: no model.safetensors.index.json, model.safetensors or *.safetensors here",
                dir);
  if (s != LM_OK) {
    for (size_t i = 0; i < n; i++)
      free(paths[i]);
    free(paths);
    return s;
  }
  qsort(paths, n, sizeof *paths, lm_cmp_str);
  return lm_st_open_files(paths, n, out);
}

static lm_status lm_st_open_dir(const char *dir, lm_safetensors **out) {
  size_t dl = strlen(dir);
  char *index = lm_path_join(dir, dl, "model.safetensors.index.json");
  char *single = lm_path_join(dir, dl, "model.safetensors");
  lm_status s;
  if (!index || !single)
    s = LM_ERRF(LM_ERR_NOMEM, "%s: out of memory", dir);
  else if (lm_is_regular(index))
    s = lm_st_open_index(index, out);
  else if (lm_is_regular(single))
    s = lm_st_open_one(single, out);
  else
    s = lm_st_open_glob(dir, out);
  free(index);
  free(single);
  return s;
}

lm_status lm_st_open(const char *path, lm_safetensors **out) {
  *out = NULL;
  struct stat st;
  if (stat(path, &st) != 0)
    return LM_ERRF(errno == ENOENT ? LM_ERR_NOT_FOUND : LM_ERR_IO, "%s: %s", path, strerror(errno));
  if (S_ISDIR(st.st_mode)) return lm_st_open_dir(path, out);
  if (lm_ends_with(path, ".json")) return lm_st_open_index(path, out);
  return lm_st_open_one(path, out);
}

/* ---- accessors ---------------------------------------------------------------------------------
 */

size_t lm_st_count(const lm_safetensors *st) { return st ? st->n_tensors : 0; }

const lm_st_tensor *lm_st_at(const lm_safetensors *st, size_t i) {
  return st && i < st->n_tensors ? &st->tensors[i] : NULL;
}

const lm_st_tensor *lm_st_find(const lm_safetensors *st, const char *name) {
  if (!st || !name) return NULL;
  size_t slot = lm_st_slot(st, name);
  return st->slots[slot] == SIZE_MAX ? NULL : &st->tensors[st->slots[slot]];
}

size_t lm_st_file_count(const lm_safetensors *st) { return st ? st->n_files : 0; }

const lm_st_file *lm_st_file_at(const lm_safetensors *st, size_t i) {
  return st && i < st->n_files ? &st->files[i] : NULL;
}

const char *lm_st_file_meta(const lm_safetensors *st, size_t file, const char *key) {
  if (!st || file >= st->n_files || !key) return NULL;
  const lm_st_header *h = st->maps[file].hdr;
  for (size_t i = 0; i < h->n_meta; i++)
    if (!strcmp(h->meta_keys[i], key)) return h->meta_values[i];
  return NULL;
}
