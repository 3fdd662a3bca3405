/* quantize.h — `lumen quantize`: converts a checkpoint to an MLX affine-quantized one
 * (mlx-community layout: `language_model.model.*` names, U32 codes + bf16 scales/biases, a
 * "quantization" block in config.json), as mlx-lm's converter does for Gemma 4: every matrix
 * and embedding whose input width divides the group is quantized, router.proj at 8 bits,
 * norms and scalars stay as stored. */
#ifndef LM_MODEL_QUANTIZE_H
#define LM_MODEL_QUANTIZE_H

#include "model/model.h"

typedef struct lm_quantize_rule {
  const char *pattern; /* substring of the module path (e.g. "layers.0.mlp.down_proj") */
  int bits, group;     /* bits 0: leave this module unquantized; group 0: the default */
  int exact;           /* the pattern is the whole module path (a per-module plan) */
} lm_quantize_rule;

typedef struct lm_quantize_opts {
  int bits, group;               /* defaults: 4, 64 */
  const lm_quantize_rule *rules; /* first match wins */
  int n_rules;
  /* called after each layer and after the file is written: done of total steps (may be NULL) */
  void (*progress)(void *ctx, int done, int total);
  void *progress_ctx;
} lm_quantize_opts;

/* The MLX affine kinds lumen writes: 2, 3, 4, 5, 6 or 8 bits; groups of 32, 64 or 128. */
int lm_quantize_bits_ok(int bits);
int lm_quantize_group_ok(int group);

/* The quantizable matrices in the order they are written, each with its MLX module path under
 * the model prefix (e.g. "layers.3.self_attn.q_proj", "embed_tokens"). */
typedef lm_status (*lm_quant_module_fn)(const lm_weight *w, const char *module, void *arg);
lm_status lm_quantize_foreach_module(const lm_model *m, lm_quant_module_fn fn, void *arg);

/* The width the MLX converters force on a module whatever the defaults (8 for the MoE router),
 * or 0. */
int lm_quantize_forced_bits(const char *module);

/* Writes out_dir (created if needed): model.safetensors, config.json, and copies of the
 * tokenizer / generation / chat-template files of the source. */
lm_status lm_model_quantize(const lm_model *m, const char *out_dir, const lm_quantize_opts *o);

/* Copies what a checkpoint holds besides its weights (the tokenizer, templates, generation
 * defaults, kv_config.json; config.json too when with_config) from src_dir to dst_dir; files
 * the source lacks are skipped. */
lm_status lm_model_copy_side_files(const char *src_dir, const char *dst_dir, int with_config);

#endif
