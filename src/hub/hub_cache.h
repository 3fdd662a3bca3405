/* hub_cache.h — the Hugging Face cache layout, as huggingface_hub writes and reads it:
 *   {cache}/models--ORG--REPO/blobs/ETAG            file contents, named by their etag
 *   {cache}/models--ORG--REPO/snapshots/COMMIT/PATH relative symlink to ../../blobs/ETAG
 *   {cache}/models--ORG--REPO/refs/REV              the commit REV pointed to, no newline
 *   {cache}/.locks/models--ORG--REPO/ETAG.lock      serializes downloads of one blob
 * so a model fetched by either tool is found by the other. */
#ifndef LM_HUB_CACHE_H
#define LM_HUB_CACHE_H

#include <stddef.h>

#include "hub/hub_ref.h"
#include "lumen.h"

#if defined(__GNUC__)
#define LM_HUB_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define LM_HUB_PRINTF(a, b)
#endif

/* snprintf into buf; LM_ERR_INVALID ("path too long") when it does not fit. */
lm_status lm_hub_path(char *buf, size_t n, const char *fmt, ...) LM_HUB_PRINTF(3, 4);
/* mkdir -p (existing folders are fine). */
lm_status lm_hub_mkdirs(const char *path);
/* The commit refs/REV names; LM_ERR_NOT_FOUND when the ref is absent or not a commit. */
lm_status lm_hub_read_ref(const char *repo_dir, const char *rev, char commit[41]);
/* Writes refs/REV = commit, atomically (a temporary file renamed over it). */
lm_status lm_hub_write_ref(const char *repo_dir, const char *rev, const char *commit);
/* Points snapshots/COMMIT/FILE at blobs/BLOB with a relative symlink (replaced atomically). */
lm_status lm_hub_link(const char *repo_dir, const char *commit, const char *file, const char *blob);
/* The snapshot folder of r in the cache at root: a commit revision directly, else refs/REV.
 * LM_ERR_NOT_FOUND with a message that says how to download it. */
lm_status lm_hub_snapshot(const char *root, const lm_hub_ref *r, char *dir, size_t n);
/* A MODEL argument → a path: an existing path is itself; ORG/REPO[@REV] is its snapshot in the
 * cache. LM_ERR_NOT_FOUND says which of the two was missing (no such directory, or not in the
 * cache and the `lumen get` that fetches it). */
lm_status lm_hub_resolve(const char *name, char *dir, size_t n);

#endif
