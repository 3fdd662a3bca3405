/* model.h — a loaded Gemma 4 checkpoint: resolved config plus every weight bound to its
 * tensor (mmapped, used in place on the CPU). Immutable after load and shared by sessions. */
#ifndef LM_MODEL_MODEL_H
#define LM_MODEL_MODEL_H

#include "io/safetensors.h"
#include "model/config.h"
#include "tensor/weight.h"

typedef struct lm_layer_weights {
  lm_weight q, k, v, o;     /* k, v absent on KV-shared layers; v absent on k_eq_v layers */
  lm_weight q_norm, k_norm; /* [hd] */
  lm_weight ln_in, ln_post_attn, ln_pre_ff, ln_post_ff; /* [H] */
  lm_weight gate, up, down;                  /* dense GeGLU MLP (the shared expert on MoE models) */
  lm_weight ple_gate, ple_proj, ln_post_ple; /* per-layer-input block (PLE models) */
  float layer_scalar;
  lm_weight scalar;                  /* layer_scalar as stored, [1] */
  lm_weight router;                  /* MoE: router.proj [E][H] */
  lm_weight router_scale;            /* router.scale * H^-0.5, f32 [H] */
  lm_weight expert_scale;            /* router.per_expert_scale, f32 [E] */
  lm_weight ex_gate, ex_up, ex_down; /* stacked experts [E] */
  lm_weight ln_pre_ff2, ln_post_ff1, ln_post_ff2;
} lm_layer_weights;

/* One module's quantization as resolved from config.json + the tensors found. */
typedef struct lm_quant_entry {
  char *path;      /* module path as in the checkpoint, without ".weight" */
  int bits, group; /* 0, 0: explicitly not quantized (false) */
} lm_quant_entry;

typedef struct lm_quant_config {
  int present;     /* a quantization block exists */
  int bits, group; /* defaults */
  int n;
  lm_quant_entry *entries; /* per-module overrides */
} lm_quant_config;

typedef struct lm_model {
  char *dir;
  lm_model_config cfg;
  lm_quant_config quant;
  lm_safetensors *st;
  const char *prefix; /* "model.language_model." (HF) or "language_model.model." (MLX) ... */
  int mlx_naming;
  lm_weight embed;                    /* [V][H]; also the tied LM head */
  lm_weight embed_ple;                /* [Vple][NL*Pd] */
  lm_weight ple_model_proj;           /* [NL*Pd][H] */
  lm_weight ple_norm;                 /* [Pd] */
  lm_weight final_norm;               /* [H] */
  lm_weight rope_inv[LM_LAYER_TYPES]; /* f32 inverse frequencies [hd/2] per layer type */
  lm_layer_weights *layers;
  int *last_reader;     /* [n_caches]: last layer that attends over cache c */
  int64_t n_params;     /* parameters bound (text decoder) */
  int64_t weight_bytes; /* bytes of the bound weights as stored */
  struct {              /* a synthetic model (benchmarks): weights generated, not read */
    int on, bits, group;
    uint64_t seed;
  } synth;
  void **owned; /* buffers the model allocated (converted vectors, aligned copies) */
  int n_owned, cap_owned;
} lm_model;

/* Opens a checkpoint directory: config.json + safetensors (single, sharded or MLX). */
lm_status lm_model_load(const char *dir, lm_model **out);
void lm_model_free(lm_model *m);

/* Calls fn on every weight the model bound (for backends that upload or repack weights). */
lm_status lm_model_foreach_weight(lm_model *m, lm_status (*fn)(lm_weight *w, void *arg), void *arg);

/* Builds a model of the geometry in a config.json-shaped preset with random weights from the
 * counter RNG (seed, hash of the tensor name, element index): every backend that generates
 * them gets identical weights. bits 0 = bf16; else MLX affine bits/group for every matrix
 * (router.proj at 8 bits, as the converters force). */
lm_status lm_model_synth(const char *preset_path, int bits, int group, uint64_t seed,
                         lm_model **out);

/* Parses the "quantization" (or "quantization_config") block of a config.json. */
lm_status lm_quant_config_parse(const char *config_path, lm_quant_config *q);
void lm_quant_config_free(lm_quant_config *q);

#endif
