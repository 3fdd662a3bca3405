/* fixture.h — reading reference fixtures (tests/fixtures/NAME/, written by
 * tools/oracle/gen_fixtures.py): ids.txt, logits.f32, logits_bf16.f32, meta.json. */
#ifndef LM_TEST_FIXTURE_H
#define LM_TEST_FIXTURE_H

#include <stdint.h>
#include <stddef.h>

/* Reads comma-separated ids. Returns the count (0 on error); *ids malloc'ed. */
int64_t lm_fx_read_ids(const char *path, int32_t **ids);
/* Reads a little-endian f32 file of exactly n floats; NULL on error. */
float *lm_fx_read_f32(const char *path, int64_t n);
/* ids.txt and logits.f32 [T][V] of fixture folder dir: returns T (0 when either is missing or
 * malformed; *ids and *ref are then NULL). */
int64_t lm_fx_load(const char *dir, int64_t V, int32_t **ids, float **ref);
/* Whether dir holds weights (model.safetensors or an index); KV-quantized references reuse
 * another fixture's weights and have none. */
int lm_fx_has_weights(const char *dir);
/* meta.json's tolerance.<key> ("bf16", "fp32"): mean_kl_max and argmax_agree_min. 0 when the
 * fixture has that bound, -1 otherwise. */
int lm_fx_bound(const char *dir, const char *key, double *kl_max, double *argmax_min);
/* A LoRA fixture (tools/oracle/gen_lora_fixtures.py): meta.json's base checkpoint folder and its
 * adapters (folders and weights, at most max), as paths joined to dir. Returns the number of
 * adapters, or -1 when dir is not one. */
typedef struct lm_fx_adapter {
  char path[1024];
  float weight;
} lm_fx_adapter;
int lm_fx_lora(const char *dir, char *base, size_t n, lm_fx_adapter *ad, int max);

/* Names of the fixture folders under dir holding a file `marker`, sorted; returns the count. */
int lm_fx_list(const char *dir, const char *marker, char ***names);
void lm_fx_free_list(char **names, int n);

/* Comparison of logits [T][V] against a reference. */
typedef struct lm_fx_cmp {
  double max_abs_diff, max_abs_ref;
  int64_t argmax_agree, T;
  double mean_kl; /* KL(ref || got) averaged over positions, from softmax of each row */
} lm_fx_cmp;
lm_fx_cmp lm_fx_compare(const float *ref, const float *got, int64_t T, int64_t V);

#endif
