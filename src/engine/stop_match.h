/* stop_match.h — the two questions stop strings with hold-back ask of decoded text: where
 * does a stop string start, and how much of the tail might still become one. Shared by the
 * generation session and the server's streams. */
#ifndef LM_ENGINE_STOP_MATCH_H
#define LM_ENGINE_STOP_MATCH_H

#include <stddef.h>
#include <stdint.h>

/* Earliest start of any of the stop strings in h[0..n), or -1; *which (may be NULL) gets
 * the index of the string found there. */
int64_t lm_stop_find(char *const *stops, int n_stops, const char *h, size_t n, int *which);

/* Length of the longest suffix of h[0..n) that is a proper prefix of some stop string: the
 * text that must be held back until the next piece decides. */
size_t lm_stop_held_suffix(char *const *stops, int n_stops, const char *h, size_t n);

#endif
