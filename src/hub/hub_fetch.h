/* hub_fetch.h — one file of a revision into the cache: its blob downloaded under the blob's lock
 * into blobs/ETAG.incomplete (resumed with a Range request when a previous attempt left part of
 * it), checked (the size the hub announced; an LFS file's SHA-256 against its etag), then renamed
 * to blobs/ETAG. A blob already there is kept as it is, as huggingface_hub does. */
#ifndef LM_HUB_FETCH_H
#define LM_HUB_FETCH_H

#include <stdint.h>

#include "hub/hub_http.h"
#include "hub/hub.h"
#include "lumen.h"

typedef struct lm_hub_file {
  const char *path;               /* in the repository */
  char etag[LM_HUB_ETAG_MAX + 1]; /* names the blob */
  int lfs;                        /* etag is the SHA-256 of the content */
  int64_t size;                   /* -1: the hub did not say */
  int64_t had;                    /* bytes present when the download started (progress) */
} lm_hub_file;

/* Bytes moved by this run against the bytes it set out to move, reported as they change. */
typedef struct lm_hub_meter {
  int64_t done, total;
  const lm_hub_events *ev;
} lm_hub_meter;

void lm_hub_meter_add(lm_hub_meter *m, int64_t n);
/* A line for the caller (printf-style). */
void lm_hub_note(const lm_hub_events *ev, const char *fmt, ...) LM_HUB_PRINTF(2, 3);

typedef struct lm_hub_fetch_ctx {
  lm_hub_http *http;
  lm_hub_meter *meter;
  const char *id, *rev; /* for messages */
  const char *blobs;    /* the repository's blobs/ folder */
  const char *locks;    /* its folder under .locks/ */
  int retries;          /* further attempts after a broken or stalled transfer */
} lm_hub_fetch_ctx;

/* url: the file's resolve URL at the commit. */
lm_status lm_hub_fetch(const lm_hub_fetch_ctx *c, const char *url, lm_hub_file *f);

#endif
