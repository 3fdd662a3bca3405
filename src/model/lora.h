/* lora.h — LoRA adapters over a loaded model, in the two formats people train them in:
 *   PEFT:   adapter_config.json + adapter_model.safetensors, lora_A [r][in] and lora_B [out][r]
 *           per module, scale lora_alpha / r (rsLoRA: lora_alpha / sqrt(r)), with rank_pattern /
 *           alpha_pattern overrides per module;
 *   mlx-lm: adapter_config.json + adapters.safetensors, lora_a [in][r] and lora_b [r][out], one
 *           `scale` for every module.
 * An adapter is kept as two dense f32 matrices per adapted module, A [r][in] and B [out][r] with
 * the module's scale and the caller's weight folded into B, so the forward applies it as the
 * residual y = W x + B (A x) (two products, the second accumulating) and the base weights are
 * never rewritten. The modules lumen adapts are each layer's attention and MLP projections
 * (q, k, v, o, gate, up, down) and the per-layer-input gate and projection. Anything else is
 * refused with the cause named: DoRA, modules_to_save, trained biases, embedding or expert
 * targets, a module the model does not have, shapes that disagree with the base. */
#ifndef LM_MODEL_LORA_H
#define LM_MODEL_LORA_H

#include "backend/backend.h"
#include "model/model.h"

/* The modules of a layer an adapter may target, in the order the forward meets them. */
typedef enum lm_lora_kind {
  LM_LORA_Q = 0,
  LM_LORA_K,
  LM_LORA_V,
  LM_LORA_O,
  LM_LORA_GATE,
  LM_LORA_UP,
  LM_LORA_DOWN,
  LM_LORA_PLE_GATE,
  LM_LORA_PLE_PROJ,
  LM_LORA_KINDS
} lm_lora_kind;

typedef struct lm_lora_module {
  int layer;
  lm_lora_kind kind;
  int rank;
  int64_t in, out;
  float scale;            /* the module's own (alpha / r, or the mlx-lm scale), before the weight */
  float *a_data, *b_data; /* dense f32: a [rank][in], b [out][rank] times scale × weight */
  void *a_dev, *b_dev;    /* the same in the prepared backend's memory and activation dtype */
  size_t a_off, b_off;    /* their places in the staged copy (lm_lora_stage) */
} lm_lora_module;

typedef struct lm_lora {
  char *dir;
  const char *format; /* "peft" or "mlx-lm" */
  float weight;       /* the caller's multiplier (stacking), folded into every b */
  int max_rank;
  int n_mods;
  lm_lora_module *mods;
  lm_backend *prepared; /* the backend holding its copy (lm_lora_prepare), or NULL */
  int64_t dev_bytes;    /* its bytes (0 where the backend reads the host matrices) */
  void *dev_mem;        /* every matrix in one allocation of the backend's */
  void *stage;          /* lm_lora_stage: the same bytes on the host, until uploaded */
  size_t stage_bytes, uploaded;
  lm_dtype stage_dtype;
} lm_lora;

/* Loads the adapter in dir for model m (its format from the files present) with weight w. */
lm_status lm_lora_load(const lm_model *m, const char *dir, float weight, lm_lora **out);
void lm_lora_free(lm_lora *l);

/* A random adapter of rank r on every attention and MLP projection of m (benchmarks: lumen
 * bench --adapter-rank), scale 1; the values come from seed. */
lm_status lm_lora_synth(const lm_model *m, int rank, uint64_t seed, lm_lora **out);

/* Copies the adapter's matrices into be's memory in its activation dtype (a_dev, b_dev; the
 * CPU's f32 run reads the host matrices). The copies belong to be: preparing the adapter for
 * another backend is LM_ERR_INVALID (load the adapter again for that one); lm_lora_free frees
 * them, so an adapter is freed before its backend. */
lm_status lm_lora_prepare(lm_lora *l, lm_backend *be);
/* The same in parts, so that a running engine copies a large adapter between several steps:
 * stage converts every matrix into one host buffer of the activation dtype `act` (any thread;
 * nothing of a backend's), upload copies up to max_bytes more of it (0: the rest) into be's
 * memory, *done once all is there. */
lm_status lm_lora_stage(lm_lora *l, lm_dtype act);
lm_status lm_lora_upload(lm_lora *l, lm_backend *be, size_t max_bytes, int *done);

/* The model's weight an adapter of (layer, kind) adapts; NULL where the layer has none (the
 * per-layer-input kinds without PLE, k and v of a KV-shared layer, v of a k_eq_v layer). */
const lm_weight *lm_lora_target(const lm_model *m, int layer, lm_lora_kind kind);

/* The module of l adapting (layer, kind), or NULL. */
const lm_lora_module *lm_lora_find(const lm_lora *l, int layer, lm_lora_kind kind);

/* Splits "PATH@WEIGHT" (the CLI's --adapter): the path into dir (NUL-terminated) and the weight
 * (1 when absent). What follows the last @ is the weight when it is a finite number, else part
 * of the path. LM_ERR_INVALID for an empty or too long path. */
lm_status lm_lora_parse_arg(const char *arg, char *dir, size_t n, float *weight);

#endif
