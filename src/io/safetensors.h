/* safetensors.h — read-only, memory-mapped access to safetensors checkpoints: one file, the
 * shards of a model.safetensors.index.json, or a model directory.
 *
 * Format (huggingface/safetensors): 8-byte little-endian header length N, then N bytes of UTF-8
 * JSON (may be space-padded), then the data section. Each JSON entry is
 *   "name": {"dtype": "BF16", "shape": [a, b], "data_offsets": [begin, end]}
 * with offsets relative to the data section (file offset 8 + N); an optional "__metadata__" maps
 * strings to strings.
 *
 * Validation is strict and mirrors the reference reader: every header field is checked before
 * use, in 64-bit arithmetic, and the data ranges must tile the data section exactly (no overlap,
 * no gap, no trailing bytes). LM_OK means that no defect was detected, not that the weights are
 * meaningful.
 *
 * Alignment: a tensor's data pointer is NOT guaranteed to be aligned. The HF writer makes it
 * naturally aligned (header padded to 8 bytes, tensors ordered by descending element size), but
 * other writers need not. Read elements with memcpy or unaligned loads, or check with
 * lm_st_tensor_aligned() before casting to a typed pointer.
 *
 * Lifetime: files are mapped PROT_READ, MAP_PRIVATE when opened; pages are read lazily on first
 * touch. Every pointer handed out (names, data, header bytes) lives until lm_st_close(). If a
 * mapped file is truncated on disk while open, touching its pages raises SIGBUS, as with any mmap.
 *
 * Thread-safety: an open lm_safetensors is immutable; any number of threads may read it. */
#ifndef LM_IO_SAFETENSORS_H
#define LM_IO_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "lumen.h"
#include "tensor/dtype.h"

#define LM_ST_MAX_DIMS 8
/* The reference reader's limit on the JSON header (100 MB). */
#define LM_ST_MAX_HEADER ((uint64_t)100 * 1000 * 1000)

typedef struct lm_st_tensor {
  const char *name;
  lm_dtype dtype;
  int ndim;                      /* 0..LM_ST_MAX_DIMS; 0 is a scalar (one element) */
  int64_t shape[LM_ST_MAX_DIMS]; /* entries past ndim are 0 */
  const void *data;              /* first byte, inside the mapping; not necessarily aligned */
  uint64_t nbytes;               /* product(shape) * dtype size; 0 for an empty tensor */
  int file;                      /* index of the shard holding it (lm_st_file_at) */
  uint64_t offset;               /* file offset of the first byte (8 + N + begin) */
} lm_st_tensor;

typedef struct lm_st_file {
  const char *path;        /* as opened (directory + shard name for an index) */
  uint64_t size;           /* file size in bytes */
  const char *header_json; /* the header_len JSON bytes (padding included), NUL-terminated copy */
  uint64_t header_len;     /* N */
} lm_st_file;

/* ---- one header, parsed from memory --------------------------------------------------------- */

/* The parsed header of one file. Tensors are sorted by data offset (storage order). */
typedef struct lm_st_header {
  uint64_t header_len; /* N */
  uint64_t data_start; /* 8 + N: file offset of the data section */
  size_t n_tensors;
  lm_st_tensor *tensors; /* names point into this object; data into the caller's buffer; file = 0 */
  size_t n_meta;         /* __metadata__ entries, in header order */
  const char **meta_keys;
  const char **meta_values;
  char *strings; /* storage for every name, key and value above */
} lm_st_header;

/* Parses and validates the header of a safetensors file whose complete contents are
 * buf[0..file_size). `path` only names the file in messages. On success *out is a new header (free
 * with lm_st_header_free) whose tensor data pointers point into buf. Errors (one message per
 * defect, naming path and tensor): LM_ERR_CORRUPT for a malformed file, LM_ERR_UNSUPPORTED for a
 * valid dtype that lumen does not load (F8_*, F4, F6_*) or a rank above LM_ST_MAX_DIMS,
 * LM_ERR_NOMEM. */
lm_status lm_st_parse_header(const uint8_t *buf, uint64_t file_size, const char *path,
                             lm_st_header **out);
void lm_st_header_free(lm_st_header *h);

/* ---- a set of mapped files ------------------------------------------------------------------- */

typedef struct lm_safetensors lm_safetensors;

/* Opens `path`, which is one of:
 *   - a .safetensors file;
 *   - a model.safetensors.index.json (any *.json): its weight_map's shards, which live next to it,
 *     are opened and checked against the map (missing shard, a tensor the shard lacks, a shard
 *     tensor the map does not list, a tensor in two shards: all errors);
 *   - a directory: its model.safetensors.index.json if present, else model.safetensors, else
 *     every *.safetensors in it in byte-wise name order.
 * A tensor name that appears in two files is an error. On success *out must be closed with
 * lm_st_close. Errors: LM_ERR_NOT_FOUND, LM_ERR_IO, LM_ERR_CORRUPT, LM_ERR_UNSUPPORTED,
 * LM_ERR_NOMEM. */
lm_status lm_st_open(const char *path, lm_safetensors **out);
/* Unmaps everything; NULL is a no-op. Every pointer obtained from st becomes invalid. */
void lm_st_close(lm_safetensors *st);

/* Tensors in file order, and within a file in storage (data offset) order. */
size_t lm_st_count(const lm_safetensors *st);
const lm_st_tensor *lm_st_at(const lm_safetensors *st, size_t i); /* NULL if i >= count */
/* O(1) hash lookup; NULL if absent. */
const lm_st_tensor *lm_st_find(const lm_safetensors *st, const char *name);

/* The mapped files (shards in name order). Their header bytes and sizes identify the checkpoint. */
size_t lm_st_file_count(const lm_safetensors *st);
const lm_st_file *lm_st_file_at(const lm_safetensors *st, size_t i); /* NULL if i >= count */
/* Value of key in file i's __metadata__, or NULL. */
const char *lm_st_file_meta(const lm_safetensors *st, size_t file, const char *key);

/* 1 if t's data pointer is a multiple of align (a power of two), else 0. */
static inline int lm_st_tensor_aligned(const lm_st_tensor *t, size_t align) {
  return ((uintptr_t)t->data & (uintptr_t)(align - 1)) == 0;
}

/* Number of elements: product of the shape (1 for a scalar). Validated not to overflow at open. */
int64_t lm_st_numel(const lm_st_tensor *t);

#endif
