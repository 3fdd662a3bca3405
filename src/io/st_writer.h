/* st_writer.h — writing safetensors files (lumen quantize, synthetic models, tests).
 *
 * The layout follows the huggingface/safetensors writer byte for byte: tensors sorted by
 * descending element size, then by name; header entries in that same order (with __metadata__
 * first); compact JSON padded with spaces to a multiple of 8; data packed with no gaps. Because
 * element sizes are powers of two and the data section starts 8-aligned, every tensor is then
 * naturally aligned (its offset is a multiple of its element size) without padding, which the
 * reference reader would reject as a gap.
 *
 * Files are written to a temporary file in the target directory, fsync'd, and renamed into place,
 * so a reader never sees a half-written checkpoint.
 *
 * Usage:
 *   lm_st_writer *w;
 *   LM_TRY(lm_st_writer_create(&w));
 *   int64_t shape[2] = {rows, cols};
 *   lm_status s = lm_st_writer_add(w, "model.embed.weight", LM_DT_BF16, 2, shape, data);
 *   if (s == LM_OK) s = lm_st_writer_set_meta(w, "format", "pt");
 *   if (s == LM_OK) s = lm_st_writer_write(w, "out/model.safetensors");
 *   lm_st_writer_free(w);
 *
 * Thread-safety: a writer is used by one thread at a time. */
#ifndef LM_IO_ST_WRITER_H
#define LM_IO_ST_WRITER_H

#include <stddef.h>
#include <stdint.h>

#include "lumen.h"
#include "tensor/dtype.h"

typedef struct lm_st_writer lm_st_writer;

/* Fills dst[0..nbytes) with a tensor's bytes when the file is written (once per write call).
 * Returning anything but LM_OK aborts the write with that status (the callback sets the message).
 */
typedef lm_status (*lm_st_fill_fn)(void *user, void *dst, uint64_t nbytes);

lm_status lm_st_writer_create(lm_st_writer **out);
/* NULL is a no-op. */
void lm_st_writer_free(lm_st_writer *w);

/* Adds a tensor whose bytes are at `data` (product(shape) * element size bytes, little-endian,
 * row-major). `data` is borrowed: it must stay valid until the last write call; it may be NULL
 * only for an empty tensor. `name` and `shape` are copied. ndim is 0..8 (0: a scalar).
 * Errors (LM_ERR_INVALID): empty, duplicate, reserved ("__metadata__") or non-UTF-8 name, bad
 * dtype, rank, negative dimension, or a byte size that overflows 64 bits. */
lm_status lm_st_writer_add(lm_st_writer *w, const char *name, lm_dtype dtype, int ndim,
                           const int64_t *shape, const void *data);
/* Same, with the bytes produced by fill(user, buffer, nbytes) at write time (the writer allocates
 * a buffer of the tensor's size, calls fill, writes and frees it). */
lm_status lm_st_writer_add_fn(lm_st_writer *w, const char *name, lm_dtype dtype, int ndim,
                              const int64_t *shape, lm_st_fill_fn fill, void *user);

/* Sets a __metadata__ string (copied); setting a key again replaces its value. */
lm_status lm_st_writer_set_meta(lm_st_writer *w, const char *key, const char *value);

/* Number of tensors added, and their total data bytes. */
size_t lm_st_writer_count(const lm_st_writer *w);
uint64_t lm_st_writer_bytes(const lm_st_writer *w);

/* Writes every tensor to one file at `path` (atomically replacing it).
 * Errors: LM_ERR_IO (with the path and errno text), LM_ERR_NOMEM, LM_ERR_INVALID (header over
 * the 100 MB reader limit), or a fill callback's status. */
lm_status lm_st_writer_write(const lm_st_writer *w, const char *path);

/* Writes a sharded checkpoint into the existing directory `dir`, as transformers' save_pretrained
 * does: tensors in name order are packed greedily into shards of at most max_shard_bytes of data
 * (a larger tensor gets a shard of its own), named model-00001-of-0000N.safetensors, each with
 * the writer's __metadata__, plus model.safetensors.index.json ({"metadata": {"total_size": B},
 * "weight_map": {name: shard}}). *n_shards (may be NULL) receives N. Zero tensors is
 * LM_ERR_INVALID (an index with an empty weight_map is not a checkpoint). */
lm_status lm_st_writer_write_sharded(const lm_st_writer *w, const char *dir,
                                     uint64_t max_shard_bytes, size_t *n_shards);

#endif
