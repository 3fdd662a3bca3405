/* kv_plan.h — choosing each cache's kind: plain/ring by layer type, quantized per
 * `--kv-quant off|4|8|config|turboquant[:K:V]` (config: the checkpoint's kv_config.json,
 * [{layer_idx, bits, group_size}] indexed by cache = donor-layer index; caches not listed
 * stay plain; turboquant: kv:turboquant:K:V on every full-attention cache, K 2/4/5/8 and V 2-5
 * bits, 8 and 3 when not given, sliding rings left plain). KV-shared layers have no cache: they
 * read their donor's, quantized or not. */
#ifndef LM_MODEL_KV_PLAN_H
#define LM_MODEL_KV_PLAN_H

#include "kv/kv.h"
#include "model/model.h"

typedef struct lm_kv_options {
  const char *mode;        /* NULL/"off", "4", "8", "config" or "turboquant[:K:V]" */
  int group;               /* uniform 4/8: group size (0 → 64) */
  const char *config_path; /* "config": kv_config.json (NULL → MODEL_DIR/kv_config.json) */
  int64_t quant_start;     /* quantized caches convert once they hold this many tokens (0: from the
                              start) */
} lm_kv_options;

/* Fills specs[m->cfg.n_caches]. Errors name the file and entry (unknown layer, a KV-shared
 * layer, unsupported bits/group, a group that does not divide the head dim). */
lm_status lm_model_kv_plan(const lm_model *m, const lm_kv_options *o, lm_kv_spec *specs);

/* Turns one plain or ring spec into its quantized kind (4 or 8 bits; groups 32, 64, 128 that
 * divide the head dim); errors say so, prefixed by `where`. */
lm_status lm_kv_spec_quantize(lm_kv_spec *s, int bits, int group, const char *where);

#endif
