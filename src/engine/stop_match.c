/* stop_match.c — stop-string search and hold-back length (stop_match.h). O(stops × text),
 * fine: a request carries a handful of short stop strings. */
#include "engine/stop_match.h"

#include <string.h>

int64_t lm_stop_find(char *const *stops, int n_stops, const char *h, size_t n, int *which) {
  int64_t at = -1;
  for (int i = 0; i < n_stops; i++) {
    const char *p = memmem(h, n, stops[i], strlen(stops[i]));
    if (p && (at < 0 || p - h < at)) {
      at = p - h;
      if (which) *which = i;
    }
  }
  return at;
}

size_t lm_stop_held_suffix(char *const *stops, int n_stops, const char *h, size_t n) {
  size_t best = 0;
  for (int i = 0; i < n_stops; i++) {
    size_t L = strlen(stops[i]);
    for (size_t k = L - 1 < n ? L - 1 : n; k > best; k--)
      if (!memcmp(h + n - k, stops[i], k)) {
        best = k;
        break;
      }
  }
  return best;
}
