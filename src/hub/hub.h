/* hub.h — models by name: what the CLI uses of src/hub/. `lm_hub_get` downloads a revision of
 * a Hugging Face repository into the standard cache (the protocol and layout of huggingface_hub,
 * so either tool finds what the other fetched); `lm_hub_resolve` (hub_cache.h) turns ORG/REPO
 * into its snapshot folder; `lm_hub_scan` lists what the cache holds. Nothing above this module
 * sees HTTP or the hub's JSON. */
#ifndef LM_HUB_H
#define LM_HUB_H

#include <stddef.h>
#include <stdint.h>

#include "hub/hub_cache.h"
#include "lumen.h"

/* What a download tells its caller as it goes; either callback may be NULL. The module itself
 * prints nothing. */
typedef struct lm_hub_events {
  void (*progress)(void *ctx, int64_t done, int64_t total); /* bytes of this run's transfers */
  void (*note)(void *ctx, const char *line); /* the summary, a wait for a lock, a retry */
  void *ctx;
} lm_hub_events;

typedef struct lm_hub_get_opts {
  const char *name;           /* ORG/REPO[@REV] */
  const char *const *include; /* fnmatch globs; a file is fetched when one matches (all: none) */
  size_t n_include;
  int retries; /* further attempts of a broken transfer (resumed) */
  lm_hub_events events;
} lm_hub_get_opts;

/* Fetches the files, links the snapshot, then writes refs/REV; snapshot receives its folder. */
lm_status lm_hub_get(const lm_hub_get_opts *o, char *snapshot, size_t n);

typedef struct lm_hub_rev {
  char name[LM_HUB_REV_MAX + 1]; /* the ref ("main", "v1.0"); "" for a snapshot no ref names */
  char commit[41];
} lm_hub_rev;

typedef struct lm_hub_cached {
  char id[LM_HUB_ID_MAX + 1];
  char dir[4096]; /* the repository's folder in the cache */
  int64_t size;   /* bytes of its complete blobs */
  int partial;    /* .incomplete files: an unfinished download */
  size_t n_revs;
  lm_hub_rev *revs; /* refs first (main first of them), then unnamed snapshots */
} lm_hub_cached;

typedef struct lm_hub_cache_list {
  char root[4096];
  size_t n;
  lm_hub_cached *repos; /* sorted by id */
} lm_hub_cache_list;

/* Lists the model repositories of the cache (an absent cache is an empty list). */
lm_status lm_hub_scan(lm_hub_cache_list *out);
void lm_hub_cache_list_free(lm_hub_cache_list *l);

#endif
