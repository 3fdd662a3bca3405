/* status.c — per-thread error messages. A thread-local buffer (like errno) keeps error
 * reporting out of every signature while staying safe across server threads. */
#include "base/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LM_ERRMSG_CAP 1024
static _Thread_local char lm_errbuf[LM_ERRMSG_CAP];

int lm_version_number(void) { return LUMEN_VERSION_NUMBER; }

int lm_api_version(void) { return LUMEN_API_VERSION; }

void lm_free(void *p) { free(p); }

const char *lm_errmsg(void) { return lm_errbuf; }

void lm_err_clear(void) { lm_errbuf[0] = '\0'; }

lm_status lm_err_set(lm_status s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(lm_errbuf, sizeof lm_errbuf, fmt, ap);
  va_end(ap);
  return s;
}

lm_status lm_err_prefix(lm_status s, const char *fmt, ...) {
  char prefix[256], old[LM_ERRMSG_CAP];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  memcpy(old, lm_errbuf, sizeof old);
  /* Truncation is acceptable for an error message; the length check silences -Wformat-truncation.
   */
  int n = snprintf(lm_errbuf, sizeof lm_errbuf, "%s: ", prefix);
  if (n > 0 && (size_t)n < sizeof lm_errbuf)
    snprintf(lm_errbuf + n, sizeof lm_errbuf - (size_t)n, "%.*s",
             (int)(sizeof lm_errbuf - (size_t)n - 1), old);
  return s;
}

const char *lm_status_name(lm_status s) {
  switch (s) {
  case LM_OK: return "LM_OK";
  case LM_ERR_IO: return "LM_ERR_IO";
  case LM_ERR_CORRUPT: return "LM_ERR_CORRUPT";
  case LM_ERR_INVALID: return "LM_ERR_INVALID";
  case LM_ERR_UNSUPPORTED: return "LM_ERR_UNSUPPORTED";
  case LM_ERR_NOMEM: return "LM_ERR_NOMEM";
  case LM_ERR_NOT_FOUND: return "LM_ERR_NOT_FOUND";
  case LM_ERR_DEVICE: return "LM_ERR_DEVICE";
  case LM_ERR_STATE: return "LM_ERR_STATE";
  case LM_ERR_CANCELLED: return "LM_ERR_CANCELLED";
  case LM_ERR_TIMEOUT: return "LM_ERR_TIMEOUT";
  }
  return "LM_ERR_UNKNOWN";
}
