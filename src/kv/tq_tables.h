/* tq_tables.h — the TurboQuant KV cache's constant tables (../shared/docs/turboquant-kvstore.md
 * §2.2), defined in the generated tq_tables.c (tools/turboquant/gen_tables.py).
 *
 * lm_tq_signs_<d>: the ±1 vector the value rotation multiplies by, one per head_dim, shared by
 * every layer, head and token. lm_tq_centroids_<b> / lm_tq_boundaries_<b>: the Lloyd-Max
 * codebook of a unit normal at b bits (2^b centroids, 2^b - 1 strictly rising boundaries). The
 * codec reaches them through lm_tq_params (tq_codec.h), not by name. */
#ifndef LM_KV_TQ_TABLES_H
#define LM_KV_TQ_TABLES_H

#include <stdint.h>

extern const int8_t lm_tq_signs_64[64];
extern const int8_t lm_tq_signs_128[128];
extern const int8_t lm_tq_signs_256[256];
extern const int8_t lm_tq_signs_512[512];

extern const float lm_tq_centroids_2[4];
extern const float lm_tq_boundaries_2[3];
extern const float lm_tq_centroids_3[8];
extern const float lm_tq_boundaries_3[7];
extern const float lm_tq_centroids_4[16];
extern const float lm_tq_boundaries_4[15];
extern const float lm_tq_centroids_5[32];
extern const float lm_tq_boundaries_5[31];

#endif
