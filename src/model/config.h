/* config.h — the resolved geometry of a Gemma 4 text decoder (gemma4-spec §1), read from
 * config.json. Everything the forward pass needs per layer is computed once here, so the
 * model code never re-derives donors, head dims or MLP widths. */
#ifndef LM_MODEL_CONFIG_H
#define LM_MODEL_CONFIG_H

#include <stdint.h>
#include "lumen.h"

typedef enum lm_layer_type {
  LM_LAYER_SLIDING = 0,
  LM_LAYER_FULL = 1,
  LM_LAYER_TYPES
} lm_layer_type;

typedef struct lm_layer_config {
  lm_layer_type type;
  int head_dim;    /* hd_l: head_dim (sliding) or the full-layer head dim */
  int n_kv_heads;  /* kv_l */
  int k_eq_v;      /* full layer of an attention_k_eq_v model: V = v_norm(raw k_proj output) */
  int kv_shared;   /* reads its donor's K/V instead of computing its own */
  int donor;       /* layer whose cache it reads (itself when not shared) */
  int cache;       /* index of the cache it reads in a session's cache set */
  int64_t ffn_dim; /* I_l: doubled on KV-shared layers when use_double_wide_mlp */
} lm_layer_config;

typedef struct lm_rope_config {
  double theta;
  double partial_rotary_factor; /* 1.0 for "default" */
  double factor;                /* divides the inverse frequencies (default 1) */
  int proportional;             /* rope_type "proportional" (frequencies over the full head dim) */
  int dim;                      /* head dim the table is built for */
} lm_rope_config;

/* The largest context a config may declare (16M positions). */
#define LM_CFG_MAX_POSITIONS ((int64_t)1 << 24)

typedef struct lm_model_config {
  char model_type[48];      /* top-level model_type (gemma4, gemma4_unified, gemma4_text, ...) */
  char text_model_type[48]; /* text_config's model_type (or the top-level one when flat) */
  int64_t vocab_size, hidden, n_layers, n_heads, n_kv_heads, head_dim, global_head_dim;
  int64_t ffn_dim;
  double rms_eps;
  int64_t max_positions;  /* max_position_embeddings (0: absent), at most LM_CFG_MAX_POSITIONS */
  int64_t sliding_window; /* at most max_positions */
  double final_softcap;   /* 0: none */
  int64_t ple_vocab, ple_dim; /* ple_dim 0: no per-layer embeddings */
  int k_eq_v, n_kv_shared, double_wide, moe;
  int64_t n_experts, top_k, moe_dim;
  int tie_embeddings;
  lm_rope_config rope[LM_LAYER_TYPES];
  int bos_id, pad_id;
  int n_eos;
  int eos_ids[16];
  int n_caches;            /* caches a session needs: one per donor layer */
  int *cache_layer;        /* [n_caches]: the donor layer that writes cache c */
  lm_layer_config *layers; /* [n_layers] */
} lm_model_config;

/* Parses config.json (nested text_config or flat). The message names the file and field. */
lm_status lm_config_load(const char *path, lm_model_config *out);
/* Same from a JSON string (tests, fuzzing); `name` is used in messages. */
lm_status lm_config_parse(const char *json, size_t len, const char *name, lm_model_config *out);
void lm_config_free(lm_model_config *c);

/* Layer-type names as written in config.json. */
const char *lm_layer_type_name(lm_layer_type t);

#endif
