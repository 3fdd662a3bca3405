/* kv_state.h — saving a session's caches to one file and restoring them (docs/kv-state-format.md).
 *
 * A state file holds: a versioned fixed header (magic, version, byte-order mark, sizes), the
 * model fingerprint (model/fingerprint.h), one entry per cache (plan, layout, geometry, token
 * count, where each storage array lies and its checksum), the token ids the caches encode, then
 * each array's rows as stored, every block starting on a 4096-byte boundary. The header, the
 * cache table and the token ids carry their own checksums; each data block has one.
 *
 * Saving is atomic: the file is written under a temporary name in the target's directory,
 * fsynced and renamed over the target; on any failure the temporary file is removed and the
 * target is untouched. Loading maps the file read-only, validates every field against the file
 * size (64-bit arithmetic) before using it, checks the model fingerprint and each cache's plan
 * against the session's, verifies every checksum, and uploads into fresh caches.
 *
 * Errors (lm_errmsg names the file and, where it applies, the cache and both sides):
 *   LM_ERR_CORRUPT      not a state file, truncated, a bad field, a checksum mismatch
 *   LM_ERR_UNSUPPORTED  another format version, or the other byte order
 *   LM_ERR_INVALID      written for another model (fingerprint) or another cache plan
 *   LM_ERR_IO / LM_ERR_NOT_FOUND  the file cannot be opened, mapped or written
 * Thread-safety: no shared state; the caches passed in must not be in use by a running step. */
#ifndef LM_KV_KV_STATE_H
#define LM_KV_KV_STATE_H

#include <stdint.h>

#include "kv/kv.h"
#include "model/fingerprint.h"
#include "model/model.h"

#define LM_KV_STATE_VERSION 2
#define LM_KV_STATE_ALIGN 4096
#define LM_KV_STATE_HEADER_BYTES 128
#define LM_KV_STATE_ENTRY_BYTES 256
#define LM_KV_STATE_MAX_CACHES 4096
#define LM_KV_STATE_MAX_TOKENS ((int64_t)1 << 31)

/* Writes the state of kv (every cache holding exactly n tokens: tokens[0..n)) to path.
 * fp: the model fingerprint (lm_model_fingerprint). Errors: LM_ERR_INVALID (caches that
 * disagree with n), LM_ERR_IO (no temporary file, a write, fsync or rename failed), backend
 * download errors. The target is replaced only once the new file is complete on disk. */
lm_status lm_kv_state_save(const char *path, const uint8_t fp[LM_FINGERPRINT_BYTES],
                           const lm_kv_set *kv, const int32_t *tokens, int64_t n);

/* What a loaded file must match. */
typedef struct lm_kv_state_expect {
  const uint8_t *fingerprint; /* LM_FINGERPRINT_BYTES */
  const lm_kv_spec *specs;    /* the session's cache plan (lm_model_kv_plan) */
  int n_specs;
  int64_t vocab_size; /* token ids must lie in [0, vocab_size); 0: not checked */
} lm_kv_state_expect;

/* Restores a file written by lm_kv_state_save into a new cache set on `be` (*out, free with
 * lm_kv_set_free) and the token ids (*tokens, malloc'd, free(); NULL when n is 0; *n_tokens).
 * Caches whose element dtype differs from be's (a state saved on another backend) are converted
 * (f32/bf16/f16). On error nothing is returned and nothing is left allocated. */
lm_status lm_kv_state_load_ex(const char *path, const lm_kv_state_expect *e, lm_backend *be,
                              lm_kv_set **out, int32_t **tokens, int64_t *n_tokens);
/* The same for model m with plan specs[m->cfg.n_caches] (fingerprint computed from m). */
lm_status lm_kv_state_load(const char *path, const lm_model *m, const lm_kv_spec *specs,
                           lm_backend *be, lm_kv_set **out, int32_t **tokens, int64_t *n_tokens);

/* ---- the parsed header (the loader's first stage; the fuzz target drives it) --------------- */

typedef struct lm_kv_state_block {
  uint64_t offset, bytes, checksum; /* file offset, length, lm_hash64 of the bytes */
} lm_kv_state_block;

typedef struct lm_kv_state_cache {
  lm_kv_spec plan;   /* the spec the cache was created from */
  lm_kv_spec layout; /* what it stored when saved */
  int has_pending;   /* still plain, converting to plan at plan.quant_start */
  lm_dtype dtype;    /* K/V element type of a plain layout (LM_DT_COUNT for quantized ones) */
  int64_t n, rows;   /* tokens appended; rows stored per array (slot order, from slot 0) */
  int64_t high;      /* the cache's high-water mark (lm_kv_high; n for plain kinds) */
  lm_kv_state_block arrays[LM_KV_ARRAYS];
} lm_kv_state_cache;

typedef struct lm_kv_state_info {
  uint32_t version;
  uint8_t fingerprint[LM_FINGERPRINT_BYTES];
  int n_caches;
  lm_kv_state_cache *caches;
  int64_t n_tokens;
  int32_t *tokens; /* a copy */
  uint64_t data_offset, file_size;
} lm_kv_state_info;

enum { LM_KV_STATE_VERIFY_HEADER = 1, LM_KV_STATE_VERIFY_DATA = 2, LM_KV_STATE_VERIFY_ALL = 3 };

/* Parses and validates the complete contents of a state file buf[0..size); `name` names it in
 * messages. verify: which checksums to check (the fuzz target turns them off to reach the
 * structural checks behind them). LM_OK means no defect was detected: every block lies inside
 * the buffer, blocks are aligned, in order and disjoint, and each has the size its cache's
 * geometry implies. *out is freed with lm_kv_state_info_free. */
lm_status lm_kv_state_parse(const uint8_t *buf, uint64_t size, const char *name, int verify,
                            lm_kv_state_info **out);
void lm_kv_state_info_free(lm_kv_state_info *info);

#endif
