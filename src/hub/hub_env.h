/* hub_env.h — the settings huggingface_hub reads from the environment, read the same way:
 *   cache   HF_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub,
 *           else ~/.cache/huggingface/hub
 *   server  HF_ENDPOINT (default https://huggingface.co)
 *   token   HF_TOKEN, else the file HF_TOKEN_PATH, else $HF_HOME/token
 *   limits  HF_HUB_ETAG_TIMEOUT (connect and metadata requests, seconds, default 10),
 *           HF_HUB_DOWNLOAD_TIMEOUT (seconds without a byte before a download gives up, 10)
 *   offline HF_HUB_OFFLINE=1: nothing is downloaded */
#ifndef LM_HUB_ENV_H
#define LM_HUB_ENV_H

#include <stddef.h>

#include "lumen.h"

#define LM_HUB_PATH_MAX 4096

typedef struct lm_hub_env {
  char cache[LM_HUB_PATH_MAX];
  char endpoint[1024];                   /* no trailing '/' */
  char token[1024];                      /* "" when none */
  char token_from[LM_HUB_PATH_MAX + 16]; /* "HF_TOKEN" or the token file, for messages */
  long etag_timeout, download_timeout;
  int offline;
} lm_hub_env;

/* The cache root alone (resolution needs nothing else). */
lm_status lm_hub_cache_root(char *buf, size_t n);
/* Everything a download needs; LM_ERR_INVALID when HF_ENDPOINT is not an http(s) URL. */
lm_status lm_hub_env_load(lm_hub_env *e);

#endif
