/* srv_stop.c — the stop-string matcher of srv_stop.h. */
#include "server/srv_stop.h"

#include <stdlib.h>
#include <string.h>

#include "base/status.h"

void lm_srv_stop_init(lm_srv_stop *s, char **stops, int n_stops) {
  memset(s, 0, sizeof *s);
  s->stops = stops;
  s->n_stops = n_stops;
  s->matched = -1;
}

void lm_srv_stop_clear(lm_srv_stop *s) {
  free(s->hold);
  s->hold = NULL;
  s->n = s->cap = 0;
}

/* Length of the longest suffix of h[0..n) that is a proper prefix of some stop string. */
static size_t held_suffix(const lm_srv_stop *s, const char *h, size_t n) {
  size_t best = 0;
  for (int i = 0; i < s->n_stops; i++) {
    size_t L = strlen(s->stops[i]);
    for (size_t k = L - 1 < n ? L - 1 : n; k > best; k--)
      if (!memcmp(h + n - k, s->stops[i], k)) {
        best = k;
        break;
      }
  }
  return best;
}

/* Earliest start of a stop string in h[0..n) (and which one), or -1. */
static long find_stop(const lm_srv_stop *s, const char *h, size_t n, int *which) {
  long at = -1;
  for (int i = 0; i < s->n_stops; i++) {
    const char *p = memmem(h, n, s->stops[i], strlen(s->stops[i]));
    if (p && (at < 0 || p - h < at)) {
      at = p - h;
      *which = i;
    }
  }
  return at;
}

lm_status lm_srv_stop_push(lm_srv_stop *s, const char *text, size_t len, int final, char **out, size_t *n_out) {
  *out = NULL;
  *n_out = 0;
  if (s->matched >= 0) return LM_OK;
  if (s->n + len + 1 > s->cap) {
    size_t cap = s->cap ? s->cap : 64;
    while (cap < s->n + len + 1) cap *= 2;
    char *h = realloc(s->hold, cap);
    if (!h) return LM_ERRF(LM_ERR_NOMEM, "server: out of memory (stop strings)");
    s->hold = h;
    s->cap = cap;
  }
  if (len) memcpy(s->hold + s->n, text, len);
  s->n += len;
  int which = -1;
  long at = find_stop(s, s->hold, s->n, &which);
  size_t k = at >= 0 ? (size_t)at : final ? s->n : s->n - held_suffix(s, s->hold, s->n);
  if (k) {
    if (!(*out = malloc(k + 1))) return LM_ERRF(LM_ERR_NOMEM, "server: out of memory (stop strings)");
    memcpy(*out, s->hold, k);
    (*out)[k] = '\0';
    *n_out = k;
  }
  if (at >= 0) {
    s->matched = which;
    s->n = 0;
  } else {
    memmove(s->hold, s->hold + k, s->n - k);
    s->n -= k;
  }
  return LM_OK;
}
