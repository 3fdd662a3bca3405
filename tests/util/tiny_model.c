/* tiny_model.c — test checkpoints written through lm_model_synth + the safetensors writer. */
#include "util/tiny_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/status.h"
#include "io/st_writer.h"
#include "model/model.h"

const char *lm_test_tiny_config =
    "{\"model_type\":\"gemma4\",\"text_config\":{\"model_type\":\"gemma4_text\",\"vocab_size\":64,"
    "\"hidden_size\":32,\"intermediate_size\":64,\"num_hidden_layers\":5,\"num_attention_heads\":2,"
    "\"num_key_value_heads\":1,\"head_dim\":16,\"global_head_dim\":32,\"sliding_window\":4,"
    "\"final_logit_softcapping\":30.0,\"hidden_size_per_layer_input\":8,\"vocab_size_per_layer_"
    "input\":64,"
    "\"num_kv_shared_layers\":2,\"use_double_wide_mlp\":true,"
    "\"layer_types\":[\"sliding_attention\",\"sliding_attention\",\"full_attention\",\"sliding_"
    "attention\","
    "\"full_attention\"]}}";

const char *lm_test_tiny_quant_config =
    "{\"model_type\":\"gemma4\",\"text_config\":{\"model_type\":\"gemma4_text\",\"vocab_size\":64,"
    "\"hidden_size\":32,\"intermediate_size\":64,\"num_hidden_layers\":5,\"num_attention_heads\":2,"
    "\"num_key_value_heads\":1,\"head_dim\":32,\"global_head_dim\":64,\"sliding_window\":4,"
    "\"final_logit_softcapping\":30.0,\"hidden_size_per_layer_input\":8,\"vocab_size_per_layer_"
    "input\":64,"
    "\"num_kv_shared_layers\":2,\"use_double_wide_mlp\":true,"
    "\"layer_types\":[\"sliding_attention\",\"sliding_attention\",\"full_attention\",\"sliding_"
    "attention\","
    "\"full_attention\"]}}";

typedef struct add_ctx {
  lm_st_writer *wr;
  const lm_test_tiny_opts *o;
  void *keep[8];
  int n_keep;
} add_ctx;

/* Writes w as 4-bit g32 codes of zeros with unit scales (the values do not matter here). */
static lm_status add_quant(add_ctx *c, lm_weight *w) {
  char name[512];
  int64_t words = w->cols / 8, groups = w->cols / 32 - (c->o->bad_scales ? 1 : 0);
  uint32_t *q = calloc((size_t)(w->rows * words), 4);
  uint16_t *sb = calloc((size_t)(w->rows * (w->cols / 32)) * 2, 2);
  c->keep[c->n_keep++] = q;
  c->keep[c->n_keep++] = sb;
  int64_t qs[2] = {w->rows, words}, ss[2] = {w->rows, groups};
  snprintf(name, sizeof name, "%s.weight", w->name);
  LM_TRY(lm_st_writer_add(c->wr, name, LM_DT_U32, 2, qs, q));
  snprintf(name, sizeof name, "%s.scales", w->name);
  LM_TRY(lm_st_writer_add(c->wr, name, LM_DT_BF16, 2, ss, sb));
  snprintf(name, sizeof name, "%s.biases", w->name);
  return lm_st_writer_add(c->wr, name, LM_DT_BF16, 2, ss, sb + w->rows * (w->cols / 32));
}

static lm_status add_weight(lm_weight *w, void *arg) {
  add_ctx *c = arg;
  lm_st_writer *wr = c->wr;
  char name[512];
  if (c->o && c->o->skip && strstr(w->name, c->o->skip)) return LM_OK;
  if (c->o && c->o->quant && strstr(w->name, c->o->quant) && w->rows > 1 && c->n_keep < 8)
    return add_quant(c, w);
  if (w->rows == 1 && w->dtype == LM_DT_F32) { /* a vector: its name is the tensor name */
    if (strstr(w->name, "rope.")) return LM_OK;
    int64_t shape[1] = {w->cols};
    return lm_st_writer_add(wr, w->name, LM_DT_F32, 1, shape, w->data);
  }
  snprintf(name, sizeof name, "%s.weight", w->name);
  int64_t shape[3] = {w->n_experts, w->rows, w->cols};
  int nd = w->n_experts ? 3 : 2;
  return lm_st_writer_add(wr, name, w->dtype, nd, w->n_experts ? shape : shape + 1, w->data);
}

lm_status lm_test_write_tiny(const char *config_json, const char *dir) {
  return lm_test_write_tiny_ex(config_json, dir, NULL);
}

lm_status lm_test_write_tiny_ex(const char *config_json, const char *dir,
                                const lm_test_tiny_opts *o) {
  char p[1024];
  snprintf(p, sizeof p, "%s", dir);
  for (char *q = p + 1; *q; q++) /* mkdir -p */
    if (*q == '/') {
      *q = '\0';
      mkdir(p, 0755);
      *q = '/';
    }
  mkdir(dir, 0755);
  snprintf(p, sizeof p, "%s/config.json", dir);
  FILE *f = fopen(p, "wb");
  if (!f) return LM_ERRF(LM_ERR_IO, "%s: cannot write", p);
  fputs(config_json, f);
  fclose(f);
  lm_model *m = NULL;
  lm_st_writer *wr = NULL;
  lm_status s = lm_model_synth(p, 0, 0, 7, &m);
  if (!s) s = lm_st_writer_create(&wr);
  add_ctx c = {.wr = wr, .o = o};
  if (!s) s = lm_model_foreach_weight(m, add_weight, &c);
  snprintf(p, sizeof p, "%s/model.safetensors", dir);
  if (!s) s = lm_st_writer_write(wr, p);
  lm_st_writer_free(wr);
  for (int i = 0; i < c.n_keep; i++)
    free(c.keep[i]);
  lm_model_free(m);
  return s;
}
