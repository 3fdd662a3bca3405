/* lora_merge.c — `lumen merge-lora`: a checkpoint whose adapted modules hold W + Σ B A (lora.h:
 * each B carries its scale and weight), in the base's own layout. Every other tensor is copied
 * as it is stored; a dense module is rounded back to its dtype, an MLX-quantized one quantized
 * again with its own bits and group (scales and biases in its scale dtype), so transformers
 * (bf16 bases) and mlx-lm (MLX bases) load the result as they load the base. */
#include "model/lora_merge.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io/safetensors.h"
#include "io/st_writer.h"
#include "model/quantize.h"
#include "tensor/dtype.h"
#include "tensor/quant.h"

/* One merged module: the new tensors for its name(s). */
typedef struct merged {
  const lm_weight *w;
  char names[3][512]; /* weight, scales, biases (the last two for MLX-quantized bases) */
  void *data[3];
} merged;

/* The set's modules adapting (layer, kind): mods[0..*n). */
static void modules_at(lm_lora *const *set, int n, int layer, int kind, const lm_lora_module **mods,
                       int *nm) {
  *nm = 0;
  for (int i = 0; i < n; i++) {
    const lm_lora_module *md = lm_lora_find(set[i], layer, (lm_lora_kind)kind);
    if (md) mods[(*nm)++] = md;
  }
}

/* Adds Σ B A of the modules to row r of w (f32, dequantized). */
static void add_delta(const lm_lora_module *const *mods, int n, const lm_weight *w, int64_t r,
                      float *row) {
  for (int i = 0; i < n; i++) {
    const lm_lora_module *md = mods[i];
    const float *b = md->b_data + r * md->rank;
    for (int k = 0; k < md->rank; k++) {
      const float *a = md->a_data + (int64_t)k * w->cols;
      for (int64_t c = 0; c < w->cols; c++)
        row[c] += b[k] * a[c];
    }
  }
}

/* Stores f32 v as element c of a dense row or a scale/bias vector of dtype dt. */
static void store(void *dst, lm_dtype dt, int64_t c, float v) {
  if (dt == LM_DT_F32)
    ((float *)dst)[c] = v;
  else if (dt == LM_DT_BF16)
    ((uint16_t *)dst)[c] = lm_f32_to_bf16(v);
  else
    ((uint16_t *)dst)[c] = lm_f32_to_f16(v);
}

/* The merged payload of weight w with the modules mods[0..nm) adapting it, in w's layout. */
static lm_status merge_module(const lm_lora_module *const *mods, int nm, const lm_weight *w,
                              merged *out) {
  out->w = w;
  size_t len = strlen(w->name);
  if (len < 7 || strcmp(w->name + len - 7, ".weight") || len >= sizeof out->names[0])
    return LM_ERRF(LM_ERR_UNSUPPORTED, "merge-lora: %s is not a .weight tensor", w->name);
  for (int i = 0; i < 3; i++)
    snprintf(out->names[i], sizeof out->names[i], "%.*s%s", (int)(len - 7), w->name,
             i == 0   ? ".weight"
             : i == 1 ? ".scales"
                      : ".biases");
  int64_t rb = lm_weight_row_bytes(w), ng = w->bits ? w->cols / w->group : 0;
  size_t ss = w->bits ? lm_dtype_size(w->sdtype) : 0;
  if (w->dtype != LM_DT_F32 && w->dtype != LM_DT_BF16 && w->dtype != LM_DT_F16 && !w->bits)
    return LM_ERRF(LM_ERR_UNSUPPORTED, "merge-lora: %s is stored as %s", w->name,
                   lm_dtype_name(w->dtype));
  out->data[0] = malloc((size_t)(w->rows * rb));
  out->data[1] = w->bits ? malloc((size_t)(w->rows * ng) * ss) : NULL;
  out->data[2] = w->bits ? malloc((size_t)(w->rows * ng) * ss) : NULL;
  float *row = malloc((size_t)w->cols * sizeof(float));
  uint16_t *sc = malloc((size_t)(ng ? ng : 1) * 2), *bi = malloc((size_t)(ng ? ng : 1) * 2);
  lm_status s = out->data[0] && row && sc && bi && (!w->bits || (out->data[1] && out->data[2]))
                    ? LM_OK
                    : LM_ERRF(LM_ERR_NOMEM, "out of memory merging %s", w->name);
  for (int64_t r = 0; !s && r < w->rows; r++) {
    lm_weight_dequant_row(w, 0, r, row);
    add_delta(mods, nm, w, r, row);
    uint8_t *dst = (uint8_t *)out->data[0] + r * rb;
    if (!w->bits) {
      for (int64_t c = 0; c < w->cols; c++)
        store(dst, w->dtype, c, row[c]);
      continue;
    }
    lm_affine_quantize_row_bf16(row, w->cols, w->bits, w->group, dst, sc, bi, NULL);
    for (int64_t g = 0; g < ng; g++) { /* bf16 scales into the base's scale dtype */
      store((uint8_t *)out->data[1] + (size_t)(r * ng) * ss, w->sdtype, g, lm_bf16_to_f32(sc[g]));
      store((uint8_t *)out->data[2] + (size_t)(r * ng) * ss, w->sdtype, g, lm_bf16_to_f32(bi[g]));
    }
  }
  free(row), free(sc), free(bi);
  return s;
}

/* The merged module whose tensor is named `name`, and which of its tensors; NULL if none. */
static const merged *find(const merged *mg, int n, const char *name, int *which) {
  for (int i = 0; i < n; i++)
    for (int k = 0; k < (mg[i].w->bits ? 3 : 1); k++)
      if (!strcmp(mg[i].names[k], name)) {
        *which = k;
        return &mg[i];
      }
  return NULL;
}

/* Every tensor of the base, the merged ones replaced. */
static lm_status add_tensors(const lm_model *m, lm_st_writer *wr, const merged *mg, int n) {
  for (size_t i = 0; i < lm_st_count(m->st); i++) {
    const lm_st_tensor *t = lm_st_at(m->st, i);
    int which = 0;
    const merged *x = find(mg, n, t->name, &which);
    LM_TRY(
        lm_st_writer_add(wr, t->name, t->dtype, t->ndim, t->shape, x ? x->data[which] : t->data));
  }
  return LM_OK;
}

lm_status lm_lora_merge(const lm_model *m, lm_lora *const *set, int n, const char *out_dir) {
  if (!m->st) return LM_ERRF(LM_ERR_INVALID, "merge-lora: the base must be a checkpoint on disk");
  if (n < 0 || n > 8) return LM_ERRF(LM_ERR_INVALID, "merge-lora: 0..8 adapters (got %d)", n);
  if (mkdir(out_dir, 0755) && errno != EEXIST)
    return LM_ERRF(LM_ERR_IO, "%s: cannot create", out_dir);
  int cap = (int)m->cfg.n_layers * LM_LORA_KINDS, nm = 0;
  merged *mg = calloc((size_t)cap, sizeof *mg);
  lm_st_writer *wr = NULL;
  lm_status s = mg ? lm_st_writer_create(&wr) : LM_ERRF(LM_ERR_NOMEM, "out of memory");
  for (int l = 0; !s && l < m->cfg.n_layers; l++)
    for (int k = 0; !s && k < LM_LORA_KINDS; k++) {
      const lm_lora_module *mods[8];
      int nmods;
      modules_at(set, n, l, k, mods, &nmods);
      if (nmods) s = merge_module(mods, nmods, lm_lora_target(m, l, (lm_lora_kind)k), &mg[nm++]);
    }
  if (!s) s = add_tensors(m, wr, mg, nm);
  char path[4096];
  snprintf(path, sizeof path, "%s/model.safetensors", out_dir);
  size_t shards;
  if (!s)
    s = lm_st_file_count(m->st) > 1
            ? lm_st_writer_write_sharded(wr, out_dir, (uint64_t)5 << 30, &shards)
            : lm_st_writer_write(wr, path);
  /* the layout is the base's: its config.json describes the merged checkpoint as it is */
  if (!s) s = lm_model_copy_side_files(m->dir, out_dir, 1);
  lm_st_writer_free(wr);
  for (int i = 0; mg && i < nm; i++)
    for (int k = 0; k < 3; k++)
      free(mg[i].data[k]);
  free(mg);
  return s;
}
