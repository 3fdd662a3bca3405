/* gen_config.h — a checkpoint's generation_config.json as sampling defaults and stop ids.
 *
 * Fields read (the rest is ignored): temperature, top_k, top_p, min_p, repetition_penalty,
 * do_sample, eos_token_id (an int or a list), suppress_tokens, max_new_tokens.
 * Rules:
 *   - the defaults start from lm_sampling_init() (temperature 1, every processor off) and the
 *     file's fields overlay them;
 *   - do_sample: false means greedy (temperature 0), as in transformers; an absent do_sample keeps
 *     the file's temperature, as serving engines (vLLM, mlx-lm servers) read these files;
 *   - no file at all: found = 0 and the neutral defaults.
 * Each value is range-checked; a bad one is LM_ERR_CORRUPT naming the file and the field.
 *
 * The stop set of a model is config.json's eos ids ∪ generation_config's ∪ the tokenizer's EOS
 * (for Gemma 4: {1, 106} ∪ {1, 106, 50} ∪ {1}; 50 = <|tool_response> ends a tool-call turn). */
#ifndef LM_SAMPLE_GEN_CONFIG_H
#define LM_SAMPLE_GEN_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "sample/sampler.h"

typedef struct lm_gen_config {
  int found;            /* 1 when generation_config.json exists */
  lm_sampling sampling; /* the defaults (owns its suppress list) */
  int32_t n_eos;
  int32_t *eos;           /* [n_eos] eos_token_id, as listed */
  int64_t max_new_tokens; /* 0: not set */
} lm_gen_config;

/* Reads model_dir/generation_config.json. A missing file is LM_OK with found = 0.
 * Errors: LM_ERR_IO, LM_ERR_CORRUPT (bad JSON or a bad field), LM_ERR_NOMEM. On error *g is
 * left cleared. */
lm_status lm_gen_config_load(const char *model_dir, lm_gen_config *g);
/* The same over len bytes of JSON; `name` is used in messages. */
lm_status lm_gen_config_parse(const char *json, size_t len, const char *name, lm_gen_config *g);
/* Frees what *g owns and leaves it as after a load of a missing file. NULL is a no-op. */
void lm_gen_config_clear(lm_gen_config *g);

/* The sorted, duplicate-free union of cfg_eos[0..n_cfg), g's eos ids (g may be NULL) and
 * tokenizer_eos (ignored when < 0). *ids is malloc'ed (free it; NULL when *n is 0). */
lm_status lm_gen_stop_ids(const int *cfg_eos, int n_cfg, const lm_gen_config *g,
                          int32_t tokenizer_eos, int32_t **ids, int32_t *n);

#endif
