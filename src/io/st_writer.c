/* st_writer.c — safetensors writer: HF-compatible layout, atomic temp-file + rename, fsync.
 * The header is built with jansson (compact, insertion-ordered) so that escaping of odd names is
 * jansson's job, not ours. */
#include "io/st_writer.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/status.h"
#include "io/safetensors.h"

typedef struct lm_stw_entry {
  char *name;
  lm_dtype dtype;
  int ndim;
  int64_t shape[LM_ST_MAX_DIMS];
  uint64_t nbytes;
  const void *data; /* borrowed bytes, or NULL when fill is set */
  lm_st_fill_fn fill;
  void *user;
} lm_stw_entry;

struct lm_st_writer {
  lm_stw_entry *e;
  size_t n, cap;
  char **meta_k, **meta_v; /* __metadata__, in insertion order */
  size_t n_meta, cap_meta;
  size_t *slots; /* name hash: index into e, or SIZE_MAX; a power of two >= 2 * n */
  size_t n_slots;
};

/* ---- building ------------------------------------------------------------------------------- */

lm_status lm_st_writer_create(lm_st_writer **out) {
  *out = calloc(1, sizeof **out);
  return *out ? LM_OK : LM_ERRF(LM_ERR_NOMEM, "out of memory creating a safetensors writer");
}

void lm_st_writer_free(lm_st_writer *w) {
  if (!w) return;
  for (size_t i = 0; i < w->n; i++)
    free(w->e[i].name);
  for (size_t i = 0; i < w->n_meta; i++) {
    free(w->meta_k[i]);
    free(w->meta_v[i]);
  }
  free(w->e);
  free(w->meta_k);
  free(w->meta_v);
  free(w->slots);
  free(w);
}

size_t lm_st_writer_count(const lm_st_writer *w) { return w ? w->n : 0; }

uint64_t lm_st_writer_bytes(const lm_st_writer *w) {
  uint64_t b = 0;
  for (size_t i = 0; w && i < w->n; i++)
    b += w->e[i].nbytes;
  return b;
}

/* 1 if s is valid UTF-8 by jansson's rules (what the header will have to hold). */
static int lm_stw_utf8_ok(const char *s) {
  json_t *j = json_string(s);
  json_decref(j);
  return j != NULL;
}

/* FNV-1a over the name (a checkpoint may hold tens of thousands of unstacked expert tensors, so
 * duplicate detection must not be quadratic). */
static size_t lm_stw_hash(const char *s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (; *s; s++)
    h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
  return (size_t)h;
}

/* The slot holding name, or the empty slot where it would go. */
static size_t lm_stw_slot(const lm_st_writer *w, const char *name) {
  size_t mask = w->n_slots - 1, i = lm_stw_hash(name) & mask;
  while (w->slots[i] != SIZE_MAX && strcmp(w->e[w->slots[i]].name, name))
    i = (i + 1) & mask;
  return i;
}

/* Keeps the hash at most half full: doubles and reinserts every entry when needed. */
static lm_status lm_stw_grow_slots(lm_st_writer *w) {
  if (w->n_slots >= 2 * (w->n + 1)) return LM_OK;
  size_t ns = w->n_slots ? 2 * w->n_slots : 64;
  size_t *slots = malloc(ns * sizeof *slots);
  if (!slots) return LM_ERRF(LM_ERR_NOMEM, "st_writer: out of memory for the name index");
  memset(slots, 0xff, ns * sizeof *slots); /* SIZE_MAX everywhere */
  free(w->slots);
  w->slots = slots;
  w->n_slots = ns;
  for (size_t i = 0; i < w->n; i++)
    w->slots[lm_stw_slot(w, w->e[i].name)] = i;
  return LM_OK;
}

/* Checks a new tensor's name, dtype and shape, and computes its byte size. */
static lm_status lm_stw_check(const lm_st_writer *w, const char *name, lm_dtype dtype, int ndim,
                              const int64_t *shape, uint64_t *nbytes) {
  if (!name || !name[0]) return LM_ERRF(LM_ERR_INVALID, "st_writer: empty tensor name");
  if (!strcmp(name, "__metadata__"))
    return LM_ERRF(LM_ERR_INVALID, "st_writer: tensor name __metadata__ is reserved");
  if (!lm_stw_utf8_ok(name))
    return LM_ERRF(LM_ERR_INVALID, "st_writer: tensor name is not valid UTF-8");
  if ((unsigned)dtype >= LM_DT_COUNT)
    return LM_ERRF(LM_ERR_INVALID, "st_writer: tensor %s: bad dtype %d", name, dtype);
  if (ndim < 0 || ndim > LM_ST_MAX_DIMS || (ndim > 0 && !shape))
    return LM_ERRF(LM_ERR_INVALID, "st_writer: tensor %s: rank %d is not in 0..%d", name, ndim,
                   LM_ST_MAX_DIMS);
  if (w->n_slots && w->slots[lm_stw_slot(w, name)] != SIZE_MAX)
    return LM_ERRF(LM_ERR_INVALID, "st_writer: tensor %s added twice", name);
  uint64_t n = lm_dtype_size(dtype);
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0)
      return LM_ERRF(LM_ERR_INVALID, "st_writer: tensor %s: shape[%d] is %lld", name, i,
                     (long long)shape[i]);
    if (__builtin_mul_overflow(n, (uint64_t)shape[i], &n))
      return LM_ERRF(LM_ERR_INVALID, "st_writer: tensor %s: byte size overflows 64 bits", name);
  }
  *nbytes = n;
  return LM_OK;
}

static lm_status lm_stw_push(lm_st_writer *w, const char *name, lm_dtype dtype, int ndim,
                             const int64_t *shape, const void *data, lm_st_fill_fn fill,
                             void *user) {
  uint64_t nbytes = 0;
  LM_TRY(lm_stw_check(w, name, dtype, ndim, shape, &nbytes));
  if (!data && !fill && nbytes)
    return LM_ERRF(LM_ERR_INVALID, "st_writer: tensor %s: NULL data for %llu bytes", name,
                   (unsigned long long)nbytes);
  LM_TRY(lm_stw_grow_slots(w));
  if (w->n == w->cap) {
    size_t cap = w->cap ? 2 * w->cap : 16;
    lm_stw_entry *e = realloc(w->e, cap * sizeof *e);
    if (!e) return LM_ERRF(LM_ERR_NOMEM, "st_writer: out of memory adding tensor %s", name);
    w->e = e;
    w->cap = cap;
  }
  lm_stw_entry *e = &w->e[w->n];
  memset(e, 0, sizeof *e);
  if (!(e->name = strdup(name)))
    return LM_ERRF(LM_ERR_NOMEM, "st_writer: out of memory adding tensor %s", name);
  e->dtype = dtype;
  e->ndim = ndim;
  for (int i = 0; i < ndim; i++)
    e->shape[i] = shape[i];
  e->nbytes = nbytes;
  e->data = data;
  e->fill = fill;
  e->user = user;
  w->slots[lm_stw_slot(w, e->name)] = w->n;
  w->n++;
  return LM_OK;
}

lm_status lm_st_writer_add(lm_st_writer *w, const char *name, lm_dtype dtype, int ndim,
                           const int64_t *shape, const void *data) {
  return lm_stw_push(w, name, dtype, ndim, shape, data, NULL, NULL);
}

lm_status lm_st_writer_add_fn(lm_st_writer *w, const char *name, lm_dtype dtype, int ndim,
                              const int64_t *shape, lm_st_fill_fn fill, void *user) {
  if (!fill)
    return LM_ERRF(LM_ERR_INVALID, "st_writer: tensor %s: NULL fill callback", name ? name : "?");
  return lm_stw_push(w, name, dtype, ndim, shape, NULL, fill, user);
}

lm_status lm_st_writer_set_meta(lm_st_writer *w, const char *key, const char *value) {
  if (!key || !value || !lm_stw_utf8_ok(key) || !lm_stw_utf8_ok(value))
    return LM_ERRF(LM_ERR_INVALID, "st_writer: metadata key and value must be UTF-8 strings");
  char *v = strdup(value);
  if (!v) return LM_ERRF(LM_ERR_NOMEM, "st_writer: out of memory for metadata %s", key);
  for (size_t i = 0; i < w->n_meta; i++)
    if (!strcmp(w->meta_k[i], key)) {
      free(w->meta_v[i]);
      w->meta_v[i] = v;
      return LM_OK;
    }
  if (w->n_meta == w->cap_meta) {
    size_t cap = w->cap_meta ? 2 * w->cap_meta : 8;
    char **k = realloc(w->meta_k, cap * sizeof *k);
    if (k) w->meta_k = k;
    char **vv = k ? realloc(w->meta_v, cap * sizeof *vv) : NULL;
    if (vv) w->meta_v = vv;
    if (!k || !vv) {
      free(v);
      return LM_ERRF(LM_ERR_NOMEM, "st_writer: out of memory for metadata %s", key);
    }
    w->cap_meta = cap;
  }
  if (!(w->meta_k[w->n_meta] = strdup(key))) {
    free(v);
    return LM_ERRF(LM_ERR_NOMEM, "st_writer: out of memory for metadata %s", key);
  }
  w->meta_v[w->n_meta++] = v;
  return LM_OK;
}

/* ---- layout --------------------------------------------------------------------------------- */

/* Position of each dtype in huggingface/safetensors' `Dtype` enum, which is declared in
 * increasing alignment order; its writer sorts by this rank descending, then by name. */
static int lm_stw_rank(lm_dtype t) {
  switch (t) {
  case LM_DT_BOOL: return 0;
  case LM_DT_U8: return 1;
  case LM_DT_I8: return 2;
  case LM_DT_I16: return 5;
  case LM_DT_U16: return 6;
  case LM_DT_F16: return 7;
  case LM_DT_BF16: return 8;
  case LM_DT_I32: return 9;
  case LM_DT_U32: return 10;
  case LM_DT_F32: return 11;
  case LM_DT_F64: return 12;
  case LM_DT_I64: return 13;
  case LM_DT_U64: return 14;
  default: return -1;
  }
}

/* qsort has no context argument in C11; sort pointers to entries instead of indices. */
static int lm_stw_cmp_layout(const void *a, const void *b) {
  const lm_stw_entry *x = *(const lm_stw_entry *const *)a, *y = *(const lm_stw_entry *const *)b;
  int rx = lm_stw_rank(x->dtype), ry = lm_stw_rank(y->dtype);
  if (rx != ry) return rx > ry ? -1 : 1;
  return strcmp(x->name, y->name);
}

static int lm_stw_cmp_name(const void *a, const void *b) {
  return strcmp((*(const lm_stw_entry *const *)a)->name, (*(const lm_stw_entry *const *)b)->name);
}

/* Builds the padded header for entries ents[0..n) (already in layout order). *out is malloc'd. */
static lm_status lm_stw_header(const lm_st_writer *w, lm_stw_entry *const *ents, size_t n,
                               char **out, uint64_t *len) {
  json_t *root = json_object();
  int bad = !root;
  if (!bad && w->n_meta) {
    json_t *m = json_object();
    for (size_t i = 0; m && i < w->n_meta; i++)
      bad |= json_object_set_new(m, w->meta_k[i], json_string(w->meta_v[i]));
    bad |= json_object_set_new(root, "__metadata__", m);
  }
  uint64_t off = 0;
  for (size_t i = 0; !bad && i < n; i++) {
    json_t *e = json_object(), *shape = json_array(), *offs = json_array();
    for (int d = 0; shape && d < ents[i]->ndim; d++)
      bad |= json_array_append_new(shape, json_integer(ents[i]->shape[d]));
    bad |= json_array_append_new(offs, json_integer((json_int_t)off));
    bad |= json_array_append_new(offs, json_integer((json_int_t)(off + ents[i]->nbytes)));
    bad |= json_object_set_new(e, "dtype", json_string(lm_dtype_name(ents[i]->dtype)));
    bad |= json_object_set_new(e, "shape", shape);
    bad |= json_object_set_new(e, "data_offsets", offs);
    bad |= json_object_set_new(root, ents[i]->name, e);
    off += ents[i]->nbytes;
  }
  char *s = bad ? NULL : json_dumps(root, JSON_COMPACT);
  json_decref(root);
  if (!s) return LM_ERRF(LM_ERR_NOMEM, "st_writer: out of memory building the header");
  size_t sl = strlen(s), padded = (sl + 7) / 8 * 8; /* safetensors: header padded to 8 bytes */
  if (padded > LM_ST_MAX_HEADER) {
    free(s);
    return LM_ERRF(LM_ERR_INVALID, "st_writer: header of %zu bytes exceeds the %llu-byte limit",
                   padded, (unsigned long long)LM_ST_MAX_HEADER);
  }
  char *p = realloc(s, padded + 1);
  if (!p) {
    free(s);
    return LM_ERRF(LM_ERR_NOMEM, "st_writer: out of memory building the header");
  }
  memset(p + sl, ' ', padded - sl);
  p[padded] = '\0';
  *out = p;
  *len = padded;
  return LM_OK;
}

/* ---- atomic file writing ----------------------------------------------------------------------
 */

static lm_status lm_stw_write_all(int fd, const void *buf, uint64_t len, const char *path) {
  const uint8_t *p = buf;
  while (len) {
    size_t chunk = len > ((size_t)1 << 30) ? ((size_t)1 << 30) : (size_t)len;
    ssize_t r = write(fd, p, chunk);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return LM_ERRF(LM_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    p += r;
    len -= (uint64_t)r;
  }
  return LM_OK;
}

/* Creates a temporary file next to path; *tmp is malloc'd. */
static lm_status lm_stw_tmp_open(const char *path, int *fd, char **tmp) {
  size_t n = strlen(path);
  *tmp = malloc(n + 16);
  if (!*tmp) return LM_ERRF(LM_ERR_NOMEM, "%s: out of memory", path);
  memcpy(*tmp, path, n);
  memcpy(*tmp + n, ".tmp.XXXXXX", 12);
  *fd = mkstemp(*tmp);
  if (*fd < 0) {
    lm_status s =
        LM_ERRF(LM_ERR_IO, "%s: cannot create a temporary file: %s", path, strerror(errno));
    free(*tmp);
    *tmp = NULL;
    return s;
  }
  fchmod(*fd, 0644); /* mkstemp creates 0600; checkpoints are normally world-readable */
  return LM_OK;
}

/* fsyncs the directory holding path, so that the rename itself is durable. */
static lm_status lm_stw_sync_dir(const char *path) {
  const char *slash = strrchr(path, '/');
  char dir[4096];
  if (!slash)
    snprintf(dir, sizeof dir, ".");
  else if (slash == path)
    snprintf(dir, sizeof dir, "/");
  else if ((size_t)(slash - path) < sizeof dir)
    snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
  else
    return LM_OK; /* an absurdly long path: the file is written; skip only the directory sync */
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return LM_ERRF(LM_ERR_IO, "%s: cannot open directory to sync: %s", dir, strerror(errno));
  int r = fsync(fd);
  close(fd);
  return r == 0 ? LM_OK
                : LM_ERRF(LM_ERR_IO, "%s: fsync of directory failed: %s", dir, strerror(errno));
}

/* Finishes a temporary file: on s == LM_OK fsync, close and rename over path; else remove it. */
static lm_status lm_stw_tmp_finish(lm_status s, int fd, char *tmp, const char *path) {
  if (s == LM_OK && fsync(fd) != 0)
    s = LM_ERRF(LM_ERR_IO, "%s: fsync failed: %s", path, strerror(errno));
  if (close(fd) != 0 && s == LM_OK)
    s = LM_ERRF(LM_ERR_IO, "%s: close failed: %s", path, strerror(errno));
  if (s == LM_OK && rename(tmp, path) != 0)
    s = LM_ERRF(LM_ERR_IO, "%s: cannot rename the temporary file into place: %s", path,
                strerror(errno));
  if (s != LM_OK)
    unlink(tmp);
  else
    s = lm_stw_sync_dir(path);
  free(tmp);
  return s;
}

/* Writes one tensor's bytes, calling its fill callback if it has one. */
static lm_status lm_stw_write_data(int fd, const lm_stw_entry *e, const char *path) {
  if (!e->nbytes) return LM_OK;
  if (!e->fill) return lm_stw_write_all(fd, e->data, e->nbytes, path);
  if (e->nbytes > SIZE_MAX)
    return LM_ERRF(LM_ERR_NOMEM, "%s: tensor %s too large to buffer", path, e->name);
  void *buf = malloc((size_t)e->nbytes);
  if (!buf)
    return LM_ERRF(LM_ERR_NOMEM, "%s: out of memory for %llu bytes of tensor %s", path,
                   (unsigned long long)e->nbytes, e->name);
  lm_status s = e->fill(e->user, buf, e->nbytes);
  if (s == LM_OK) s = lm_stw_write_all(fd, buf, e->nbytes, path);
  free(buf);
  return s;
}

/* Writes ents[0..n) (any order; sorted here into the HF layout) as one file at path. */
static lm_status lm_stw_write_set(const lm_st_writer *w, lm_stw_entry **ents, size_t n,
                                  const char *path) {
  qsort(ents, n, sizeof *ents, lm_stw_cmp_layout);
  char *hdr = NULL;
  uint64_t hlen = 0;
  LM_TRY(lm_stw_header(w, ents, n, &hdr, &hlen));
  int fd;
  char *tmp;
  lm_status s = lm_stw_tmp_open(path, &fd, &tmp);
  if (s != LM_OK) {
    free(hdr);
    return s;
  }
  uint8_t len8[8]; /* safetensors: 8-byte little-endian header length */
  for (int i = 0; i < 8; i++)
    len8[i] = (uint8_t)(hlen >> (8 * i));
  s = lm_stw_write_all(fd, len8, 8, path);
  if (s == LM_OK) s = lm_stw_write_all(fd, hdr, hlen, path);
  for (size_t i = 0; s == LM_OK && i < n; i++)
    s = lm_stw_write_data(fd, ents[i], path);
  free(hdr);
  return lm_stw_tmp_finish(s, fd, tmp, path);
}

/* A new array of pointers to every entry. */
static lm_status lm_stw_all(const lm_st_writer *w, lm_stw_entry ***out) {
  *out = malloc((w->n ? w->n : 1) * sizeof **out);
  if (!*out) return LM_ERRF(LM_ERR_NOMEM, "st_writer: out of memory");
  for (size_t i = 0; i < w->n; i++)
    (*out)[i] = &w->e[i];
  return LM_OK;
}

lm_status lm_st_writer_write(const lm_st_writer *w, const char *path) {
  lm_stw_entry **ents;
  LM_TRY(lm_stw_all(w, &ents));
  lm_status s = lm_stw_write_set(w, ents, w->n, path);
  free(ents);
  return s;
}

/* ---- sharded checkpoints
 * ------------------------------------------------------------------------- */

/* Writes an atomically replaced text file. */
static lm_status lm_stw_write_text(const char *path, const char *text) {
  int fd;
  char *tmp;
  LM_TRY(lm_stw_tmp_open(path, &fd, &tmp));
  return lm_stw_tmp_finish(lm_stw_write_all(fd, text, strlen(text), path), fd, tmp, path);
}

static char *lm_stw_shard_name(size_t k, size_t n) {
  char *s = malloc(64);
  if (s) snprintf(s, 64, "model-%05zu-of-%05zu.safetensors", k + 1, n);
  return s;
}

/* Writes model.safetensors.index.json for entries ents[0..n) assigned to shards shard_of[]. */
static lm_status lm_stw_write_index(const lm_st_writer *w, const char *dir, lm_stw_entry **ents,
                                    size_t n, const size_t *shard_of, size_t n_shards) {
  json_t *root = json_object(), *meta = json_object(), *wm = json_object();
  int bad = !root || !meta || !wm;
  bad |= json_object_set_new(meta, "total_size", json_integer((json_int_t)lm_st_writer_bytes(w)));
  for (size_t i = 0; !bad && i < n; i++) {
    char *shard = lm_stw_shard_name(shard_of[i], n_shards);
    bad |= !shard || json_object_set_new(wm, ents[i]->name, json_string(shard));
    free(shard);
  }
  bad |= json_object_set_new(root, "metadata", meta);
  bad |= json_object_set_new(root, "weight_map", wm);
  char *text = bad ? NULL : json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS);
  json_decref(root);
  size_t dl = strlen(dir);
  char *path = malloc(dl + 40);
  lm_status s = LM_OK;
  if (!text || !path)
    s = LM_ERRF(LM_ERR_NOMEM, "%s: out of memory writing the index", dir);
  else {
    snprintf(path, dl + 40, "%s/model.safetensors.index.json", dir);
    size_t tl = strlen(text);
    char *nl = realloc(text, tl + 2); /* transformers ends the file with a newline */
    if (nl) {
      text = nl;
      memcpy(text + tl, "\n", 2);
    }
    s = lm_stw_write_text(path, text);
  }
  free(text);
  free(path);
  return s;
}

/* Assigns shards greedily in name order; returns the shard count. */
static size_t lm_stw_plan_shards(lm_stw_entry **ents, size_t n, uint64_t max_bytes,
                                 size_t *shard_of) {
  size_t k = 0;
  uint64_t used = 0;
  for (size_t i = 0; i < n; i++) {
    if (i > 0 && used + ents[i]->nbytes > max_bytes) {
      k++;
      used = 0;
    }
    shard_of[i] = k;
    used += ents[i]->nbytes;
  }
  return k + 1;
}

/* Writes shard k: the entries of ents with shard_of == k. */
static lm_status lm_stw_write_shard(const lm_st_writer *w, const char *dir, lm_stw_entry **ents,
                                    size_t n, const size_t *shard_of, size_t k, size_t n_shards,
                                    lm_stw_entry **scratch) {
  size_t m = 0;
  for (size_t i = 0; i < n; i++)
    if (shard_of[i] == k) scratch[m++] = ents[i];
  char *name = lm_stw_shard_name(k, n_shards);
  size_t dl = strlen(dir);
  char *path = name ? malloc(dl + strlen(name) + 2) : NULL;
  if (!path) {
    free(name);
    return LM_ERRF(LM_ERR_NOMEM, "%s: out of memory", dir);
  }
  snprintf(path, dl + strlen(name) + 2, "%s/%s", dir, name);
  lm_status s = lm_stw_write_set(w, scratch, m, path);
  free(name);
  free(path);
  return s;
}

lm_status lm_st_writer_write_sharded(const lm_st_writer *w, const char *dir,
                                     uint64_t max_shard_bytes, size_t *n_shards) {
  lm_stw_entry **ents = NULL, **scratch = NULL;
  size_t *shard_of = NULL;
  if (!w->n)
    return LM_ERRF(LM_ERR_INVALID, "%s: a sharded checkpoint needs at least one tensor", dir);
  lm_status s = lm_stw_all(w, &ents);
  if (s != LM_OK) return s;
  scratch = malloc((w->n ? w->n : 1) * sizeof *scratch);
  shard_of = malloc((w->n ? w->n : 1) * sizeof *shard_of);
  if (!scratch || !shard_of) s = LM_ERRF(LM_ERR_NOMEM, "%s: out of memory", dir);
  size_t ns = 1;
  if (s == LM_OK) {
    qsort(ents, w->n, sizeof *ents, lm_stw_cmp_name);
    ns = lm_stw_plan_shards(ents, w->n, max_shard_bytes, shard_of);
  }
  for (size_t k = 0; s == LM_OK && k < ns; k++)
    s = lm_stw_write_shard(w, dir, ents, w->n, shard_of, k, ns, scratch);
  if (s == LM_OK) s = lm_stw_write_index(w, dir, ents, w->n, shard_of, ns);
  if (s == LM_OK && n_shards) *n_shards = ns;
  free(ents);
  free(scratch);
  free(shard_of);
  return s;
}
