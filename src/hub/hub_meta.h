/* hub_meta.h — what the hub says about a revision and a file, parsed from untrusted text:
 * the revision API's JSON (GET /api/models/ORG/REPO/revision/REV → "sha" and
 * "siblings"[].rfilename) and the headers of HEAD/GET /ORG/REPO/resolve/REV/PATH. */
#ifndef LM_HUB_META_H
#define LM_HUB_META_H

#include <stddef.h>
#include <stdint.h>

#include "lumen.h"

#define LM_HUB_ETAG_MAX 128

typedef struct lm_hub_head {
  long status;                    /* of the last response whose headers were seen */
  char commit[41];                /* X-Repo-Commit ("" when absent or not a commit) */
  char etag[LM_HUB_ETAG_MAX + 1]; /* X-Linked-Etag if present, else ETag; normalized */
  int lfs;                        /* the etag came from X-Linked-Etag (an LFS file: sha256) */
  int64_t size;                   /* X-Linked-Size, else Content-Length; -1 when unknown */
  int64_t range_start;            /* first byte of Content-Range; -1 when absent */
  char location[2048];            /* Location of a redirect */
  char error_code[64];            /* X-Error-Code (RepoNotFound, GatedRepo, ...) */
  char error_message[256];        /* X-Error-Message */
  char linked_etag[LM_HUB_ETAG_MAX + 1], plain_etag[LM_HUB_ETAG_MAX + 1];
  int64_t linked_size, content_length;
} lm_hub_head;

void lm_hub_head_reset(lm_hub_head *h);
/* Feeds one raw header line (CRLF optional). A status line ("HTTP/1.1 302 ...") starts a new
 * response: headers of a followed redirect do not leak into the final one. Lines that do not
 * parse are ignored. */
void lm_hub_head_line(lm_hub_head *h, const char *line, size_t n);
/* Derives etag, lfs and size from what the lines held (call once the headers are complete). */
void lm_hub_head_finish(lm_hub_head *h);
/* Normalizes an etag as huggingface_hub does (a leading W/ and the quotes dropped) into out;
 * 1 when the result is usable as a file name (1-128 of [A-Za-z0-9_-]), else 0 and out "". */
int lm_hub_etag_normalize(const char *in, size_t n, char *out, size_t cap);

typedef struct lm_hub_revision {
  char sha[41];
  size_t n_files;
  char **files; /* rfilename of each sibling, each lm_hub_file_valid */
} lm_hub_revision;

/* Parses the revision API's answer; LM_ERR_CORRUPT naming what is wrong with it. */
lm_status lm_hub_revision_parse(const char *json, size_t n, lm_hub_revision *out);
void lm_hub_revision_free(lm_hub_revision *r);

#endif
