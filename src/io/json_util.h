/* json_util.h — small jansson helpers for lumen's JSON inputs (config.json, generation_config.json,
 * kv_config.json, model.safetensors.index.json): load a file with a clear error, and typed getters
 * that name the field on a type error.
 *
 * Every getter takes `ctx`, a short description of where `obj` lives, used as the message prefix:
 * "config.json" or "config.json: text_config". A type error then reads
 *   config.json: text_config: field "num_hidden_layers": expected an integer, got a string
 *
 * Optional fields (required == 0): when the key is absent or its value is JSON null, the getter
 * returns LM_OK and leaves *out untouched, so the caller writes the default first:
 *   int64_t n = 0;   // default
 *   LM_TRY(lm_json_get_int(cfg, "num_kv_shared_layers", &n, 0, "config.json"));
 * A present value of the wrong type is always an error, required or not.
 *
 * Strings returned by the getters are borrowed from `obj` and live as long as it does.
 * Thread-safety: jansson values are not locked; use one value per thread or read only. */
#ifndef LM_IO_JSON_UTIL_H
#define LM_IO_JSON_UTIL_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "lumen.h"

/* Default size limit for lm_json_load_file: config files are kilobytes, indexes well under 100 MB.
 */
#define LM_JSON_MAX_BYTES ((uint64_t)100 * 1000 * 1000)

/* Reads and parses the JSON file at `path` (at most max_bytes long; 0 means LM_JSON_MAX_BYTES).
 * Duplicate keys are rejected. On success *out is a new reference (json_decref it).
 * Errors: LM_ERR_NOT_FOUND (no such file), LM_ERR_IO (unreadable), LM_ERR_CORRUPT (bad JSON,
 * with line and column; or larger than max_bytes), LM_ERR_NOMEM. */
lm_status lm_json_load_file(const char *path, uint64_t max_bytes, json_t **out);

/* Parses len bytes of JSON from memory; `name` is used in messages in place of a file name.
 * Any JSON value is accepted at the top level, objects and arrays included; duplicate keys are
 * rejected. On success *out is a new reference. */
lm_status lm_json_load_buf(const char *buf, size_t len, const char *name, json_t **out);

/* "an object", "an array", "a string", "an integer", "a real", "a boolean", "null". */
const char *lm_json_type_name(const json_t *v);

/* Typed getters; see the file comment for required/optional and ctx. `obj` must be an object
 * (else LM_ERR_CORRUPT naming ctx). Missing required field: LM_ERR_NOT_FOUND; wrong type or
 * out of range: LM_ERR_CORRUPT. */
lm_status lm_json_get_int(const json_t *obj, const char *key, int64_t *out, int required,
                          const char *ctx);
/* lm_json_get_int plus a range check: a value outside [lo, hi] is LM_ERR_CORRUPT naming the bounds.
 */
lm_status lm_json_get_int_range(const json_t *obj, const char *key, int64_t *out, int required,
                                const char *ctx, int64_t lo, int64_t hi);
/* Accepts integers and reals (JSON does not distinguish 1 from 1.0 for most writers). */
lm_status lm_json_get_double(const json_t *obj, const char *key, double *out, int required,
                             const char *ctx);
/* *out is 0 or 1. */
lm_status lm_json_get_bool(const json_t *obj, const char *key, int *out, int required,
                           const char *ctx);
/* *out is borrowed from obj. */
lm_status lm_json_get_string(const json_t *obj, const char *key, const char **out, int required,
                             const char *ctx);
/* Gets an object-valued field (borrowed), e.g. "text_config" or "rope_parameters". */
lm_status lm_json_get_object(const json_t *obj, const char *key, const json_t **out, int required,
                             const char *ctx);

/* Arrays: on success *out is a new malloc'd array of *n elements (free() it; NULL when *n == 0).
 * When an optional field is absent, *out and *n are left untouched. An element of the wrong type
 * is reported with its index: field "layer_types"[3]: expected a string, got an integer. */
lm_status lm_json_get_int_array(const json_t *obj, const char *key, int64_t **out, size_t *n,
                                int required, const char *ctx);
/* The strings are borrowed from obj; only the pointer array is malloc'd. */
lm_status lm_json_get_string_array(const json_t *obj, const char *key, const char ***out, size_t *n,
                                   int required, const char *ctx);

#endif
