/* lora_save.c — an adapter written as PEFT writes one (lora_save.h). */
#include "model/lora_save.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/status.h"
#include "io/st_writer.h"
#include "tensor/dtype.h"

/* The module paths of lora.c's kinds, under PEFT's prefix. */
static const char *const kind_path[LM_LORA_KINDS] = {
    "self_attn.q_proj", "self_attn.k_proj",     "self_attn.v_proj",
    "self_attn.o_proj", "mlp.gate_proj",        "mlp.up_proj",
    "mlp.down_proj",    "per_layer_input_gate", "per_layer_projection"};

typedef struct fill_arg {
  const float *src;
  int64_t n;
  lm_dtype dt;
} fill_arg;

static lm_status fill(void *user, void *dst, uint64_t nbytes) {
  const fill_arg *f = user;
  (void)nbytes;
  for (int64_t i = 0; i < f->n; i++) {
    if (f->dt == LM_DT_BF16) {
      uint16_t h = lm_f32_to_bf16(f->src[i]);
      memcpy((char *)dst + 2 * i, &h, 2);
    } else {
      memcpy((char *)dst + 4 * i, &f->src[i], 4);
    }
  }
  return LM_OK;
}

static lm_status write_config(const lm_lora *l, const char *dir) {
  int used[LM_LORA_KINDS] = {0};
  for (int i = 0; i < l->n_mods; i++)
    used[l->mods[i].kind] = 1;
  char targets[512] = "", path[4200];
  for (int k = 0; k < LM_LORA_KINDS; k++)
    if (used[k]) {
      const char *leaf = strrchr(kind_path[k], '.');
      size_t at = strlen(targets);
      snprintf(targets + at, sizeof targets - at, "%s\"%s\"", at ? ", " : "",
               leaf ? leaf + 1 : kind_path[k]);
    }
  snprintf(path, sizeof path, "%s/adapter_config.json", dir);
  FILE *f = fopen(path, "w");
  if (!f) return LM_ERRF(LM_ERR_IO, "%s: cannot write", path);
  /* the scale is folded into the stored B: alpha = r makes PEFT's alpha / r exactly 1 */
  fprintf(
      f,
      "{\"peft_type\": \"LORA\", \"r\": %d, \"lora_alpha\": %d, \"target_modules\": [%s], "
      "\"lora_dropout\": 0.0, \"bias\": \"none\", \"use_dora\": false, \"use_rslora\": false}\n",
      l->max_rank, l->max_rank, targets);
  return fclose(f) ? LM_ERRF(LM_ERR_IO, "%s: write failed", path) : LM_OK;
}

lm_status lm_lora_save_peft(const lm_lora *l, const char *dir, lm_dtype dt) {
  if (dt != LM_DT_F32 && dt != LM_DT_BF16)
    return LM_ERRF(LM_ERR_INVALID, "save adapter: f32 or bf16 only");
  for (int i = 0; i < l->n_mods; i++)
    if (l->mods[i].rank != l->max_rank)
      return LM_ERRF(LM_ERR_UNSUPPORTED, "save adapter: modules of different ranks");
  if (mkdir(dir, 0755) && access(dir, W_OK))
    return LM_ERRF(LM_ERR_IO, "%s: cannot create the directory", dir);
  lm_st_writer *w = NULL;
  LM_TRY(lm_st_writer_create(&w));
  fill_arg *args = calloc((size_t)(2 * l->n_mods + 1), sizeof *args);
  lm_status s = args ? LM_OK : LM_ERRF(LM_ERR_NOMEM, "out of memory");
  for (int i = 0; i < l->n_mods && !s; i++) {
    const lm_lora_module *md = &l->mods[i];
    for (int ab = 0; ab < 2 && !s; ab++) {
      char name[256];
      snprintf(name, sizeof name,
               "base_model.model.model.language_model.layers.%d.%s.lora_%c.weight", md->layer,
               kind_path[md->kind], ab ? 'B' : 'A');
      int64_t shape[2] = {ab ? md->out : md->rank, ab ? md->rank : md->in};
      args[2 * i + ab] = (fill_arg){ab ? md->b_data : md->a_data, shape[0] * shape[1], dt};
      s = lm_st_writer_add_fn(w, name, dt, 2, shape, fill, &args[2 * i + ab]);
    }
  }
  char path[4200];
  snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
  if (!s) s = lm_st_writer_write(w, path);
  if (!s) s = write_config(l, dir);
  lm_st_writer_free(w);
  free(args);
  return s;
}
