/* quantize.c — MLX affine conversion of a loaded checkpoint (see quantize.h). Tensors are
 * produced while the file is written (fill callbacks), so memory stays at one matrix. */
#include "model/quantize.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/status.h"
#include "io/json_util.h"
#include "io/st_writer.h"
#include "tensor/weight_payload.h"

#define MLX_PREFIX "language_model.model."

/* One output matrix: a source weight (or expert view) quantized with (bits, group). */
typedef struct q_item {
  const lm_weight *w;
  int bits, group;
  int part; /* 0 codes, 1 scales, 2 biases (one item per output tensor) */
} q_item;

typedef struct q_plan {
  q_item **items; /* each item is its own allocation: the writer keeps pointers to them */
  int n, cap;
  json_t *overrides; /* per-module entries for config.json */
} q_plan;

static q_item *plan_push(q_plan *p, q_item it) {
  if (p->n == p->cap) {
    int cap = p->cap ? 2 * p->cap : 256;
    q_item **v = realloc(p->items, (size_t)cap * sizeof *v);
    if (!v) return NULL;
    p->items = v;
    p->cap = cap;
  }
  q_item *x = malloc(sizeof *x);
  if (x) *x = it;
  return x ? (p->items[p->n++] = x) : NULL;
}

/* Rows of all experts, in order, for a (possibly fused-view) stacked weight. */
static int64_t total_rows(const lm_weight *w) {
  return (w->n_experts ? w->n_experts : 1) * w->rows;
}

static void dequant_global_row(const lm_weight *w, int64_t r, float *out) {
  lm_weight_dequant_row(w, r / w->rows, r % w->rows, out);
}

static lm_status fill(void *user, void *dst, uint64_t nbytes) {
  const q_item *it = user;
  const lm_weight *w = it->w;
  int64_t cols = w->cols, ng = cols / it->group, rows = total_rows(w);
  float *row = malloc((size_t)cols * sizeof(float));
  uint16_t *sb = malloc((size_t)ng * 2 * sizeof(uint16_t));
  uint8_t *codes = malloc((size_t)(cols * it->bits / 8));
  if (!row || !sb || !codes) {
    free(row), free(sb), free(codes);
    return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  }
  int64_t rb = it->part == 0 ? cols * it->bits / 8 : ng * 2;
  (void)nbytes;
  for (int64_t r = 0; r < rows; r++) {
    lm_weight_quantize_row_bf16(w, r, it->bits, it->group, row, codes, sb, sb + ng);
    uint8_t *o = (uint8_t *)dst + r * rb;
    memcpy(o, it->part == 0 ? codes : (const uint8_t *)(sb + (it->part - 1) * ng), (size_t)rb);
  }
  free(row), free(sb), free(codes);
  return LM_OK;
}

/* Dense copy of a matrix the rules leave unquantized (bf16 of the f32 dequantized rows). */
static lm_status fill_dense(void *user, void *dst, uint64_t nbytes) {
  const q_item *it = user;
  int64_t cols = it->w->cols;
  float *row = malloc((size_t)cols * sizeof(float));
  if (!row) return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  (void)nbytes;
  for (int64_t r = 0; r < total_rows(it->w); r++) {
    dequant_global_row(it->w, r, row);
    for (int64_t c = 0; c < cols; c++) {
      uint16_t h = lm_f32_to_bf16(row[c]);
      memcpy((uint8_t *)dst + (r * cols + c) * 2, &h, 2);
    }
  }
  free(row);
  return LM_OK;
}

static const lm_quantize_rule *rule_for(const lm_quantize_opts *o, const char *module) {
  for (int i = 0; i < o->n_rules; i++) {
    const lm_quantize_rule *r = &o->rules[i];
    if (r->exact ? !strcmp(module, r->pattern) : !!strstr(module, r->pattern)) return r;
  }
  return NULL;
}

int lm_quantize_forced_bits(const char *module) { return strstr(module, "router.proj") ? 8 : 0; }

/* The (bits, group) a module gets under o (bits 0: kept bf16): the first matching rule, else the
 * forced width or the default, and a width the group does not divide left alone, as mlx-lm
 * does. */
static void module_kind(const lm_quantize_opts *o, const lm_weight *w, const char *module,
                        int *bits, int *group) {
  *bits = o->bits;
  *group = o->group;
  const lm_quantize_rule *r = rule_for(o, module);
  if (lm_quantize_forced_bits(module)) *bits = lm_quantize_forced_bits(module);
  if (r) {
    *bits = r->bits;
    *group = r->group ? r->group : *group;
  }
  if (*bits && w->cols % *group)
    *bits = 0; /* mlx-lm leaves a module alone when its width does not divide */
}

/* Adds the output tensors of one matrix; records per-module overrides for config.json. */
static lm_status add_matrix(lm_st_writer *wr, q_plan *p, const lm_weight *w, const char *module,
                            const lm_quantize_opts *o) {
  int bits, group;
  module_kind(o, w, module, &bits, &group);
  char full[300], name[320];
  snprintf(full, sizeof full, MLX_PREFIX "%s", module);
  int64_t nd = w->n_experts ? 3 : 2, shape[3] = {w->n_experts, w->rows, w->cols};
  int64_t *sh = w->n_experts ? shape : shape + 1;
  if (!bits) {
    json_object_set_new(p->overrides, full, json_false());
    q_item *it = plan_push(p, (q_item){.w = w, .bits = 0, .group = group});
    if (!it) return LM_ERRF(LM_ERR_NOMEM, "out of memory");
    snprintf(name, sizeof name, "%s.weight", full);
    return lm_st_writer_add_fn(wr, name, LM_DT_BF16, (int)nd, sh, fill_dense, it);
  }
  if (bits != o->bits || group != o->group)
    json_object_set_new(p->overrides, full,
                        json_pack("{s:i,s:i}", "group_size", group, "bits", bits));
  static const char *suffix[3] = {".weight", ".scales", ".biases"};
  for (int part = 0; part < 3; part++) {
    q_item *it = plan_push(p, (q_item){.w = w, .bits = bits, .group = group, .part = part});
    if (!it) return LM_ERRF(LM_ERR_NOMEM, "out of memory");
    int64_t s2[3] = {shape[0], shape[1], part ? w->cols / group : w->cols * bits / 32};
    snprintf(name, sizeof name, "%s%s", full, suffix[part]);
    LM_TRY(lm_st_writer_add_fn(wr, name, part ? LM_DT_BF16 : LM_DT_U32, (int)nd,
                               w->n_experts ? s2 : s2 + 1, fill, it));
  }
  return LM_OK;
}

/* A stored vector (norm weight, scale, layer_scalar) is copied byte for byte from the source. */
static lm_status add_vector(lm_st_writer *wr, const lm_model *m, const lm_weight *w) {
  const lm_st_tensor *t = lm_st_find(m->st, w->name);
  if (!t) return LM_ERRF(LM_ERR_NOT_FOUND, "source tensor %s not found", w->name);
  char name[320];
  snprintf(name, sizeof name, MLX_PREFIX "%s", w->name + strlen(m->prefix));
  return lm_st_writer_add(wr, name, t->dtype, t->ndim, t->shape, t->data);
}

/* Module path under the model prefix, without ".weight", in MLX's naming. */
static void module_of(const lm_model *m, const lm_weight *w, const char *mlx_module, char *buf,
                      size_t n) {
  if (mlx_module) {
    snprintf(buf, n, "%s", mlx_module);
    return;
  }
  const char *s = w->name + strlen(m->prefix);
  size_t len = strlen(s);
  if (len > 7 && !strcmp(s + len - 7, ".weight")) len -= 7;
  snprintf(buf, n, "%.*s", (int)len, s);
}

/* The matrices of layer l with their MLX module paths (HF's fused gate_up is split). */
static lm_status layer_modules(const lm_model *m, int l, lm_quant_module_fn fn, void *arg) {
  const lm_layer_weights *L = &m->layers[l];
  char mod[256];
  const lm_weight *mats[] = {&L->q,  &L->k,    &L->v,        &L->o,        &L->gate,
                             &L->up, &L->down, &L->ple_gate, &L->ple_proj, &L->router};
  for (size_t i = 0; i < sizeof mats / sizeof *mats; i++) {
    if (!mats[i]->data) continue;
    module_of(m, mats[i], NULL, mod, sizeof mod);
    LM_TRY(fn(mats[i], mod, arg));
  }
  const lm_weight *exs[3] = {&L->ex_gate, &L->ex_up, &L->ex_down};
  static const char *names[3] = {"gate_proj", "up_proj", "down_proj"};
  for (int i = 0; i < 3; i++) {
    if (!exs[i]->data) continue;
    snprintf(mod, sizeof mod, "layers.%d.experts.switch_glu.%s", l, names[i]);
    LM_TRY(fn(exs[i], mod, arg));
  }
  return LM_OK;
}

/* The matrices outside the layers: the (tied) embedding and the per-layer-input ones. */
static lm_status global_modules(const lm_model *m, lm_quant_module_fn fn, void *arg) {
  LM_TRY(fn(&m->embed, "embed_tokens", arg));
  if (m->embed_ple.data) LM_TRY(fn(&m->embed_ple, "embed_tokens_per_layer", arg));
  if (m->ple_model_proj.data) LM_TRY(fn(&m->ple_model_proj, "per_layer_model_projection", arg));
  return LM_OK;
}

lm_status lm_quantize_foreach_module(const lm_model *m, lm_quant_module_fn fn, void *arg) {
  LM_TRY(global_modules(m, fn, arg));
  for (int l = 0; l < m->cfg.n_layers; l++)
    LM_TRY(layer_modules(m, l, fn, arg));
  return LM_OK;
}

typedef struct add_ctx {
  lm_st_writer *wr;
  q_plan *p;
  const lm_quantize_opts *o;
} add_ctx;

static lm_status add_module(const lm_weight *w, const char *module, void *arg) {
  add_ctx *a = arg;
  return add_matrix(a->wr, a->p, w, module, a->o);
}

static lm_status add_layer(lm_st_writer *wr, q_plan *p, const lm_model *m, int l,
                           const lm_quantize_opts *o) {
  const lm_layer_weights *L = &m->layers[l];
  add_ctx a = {wr, p, o};
  LM_TRY(layer_modules(m, l, add_module, &a));
  const lm_weight *vecs[] = {&L->q_norm,       &L->k_norm,       &L->ln_in,      &L->ln_post_attn,
                             &L->ln_pre_ff,    &L->ln_post_ff,   &L->scalar,     &L->ln_post_ple,
                             &L->router_scale, &L->expert_scale, &L->ln_pre_ff2, &L->ln_post_ff1,
                             &L->ln_post_ff2};
  for (size_t i = 0; i < sizeof vecs / sizeof *vecs; i++)
    if (vecs[i]->data) LM_TRY(add_vector(wr, m, vecs[i]));
  return LM_OK;
}

static lm_status write_config(const lm_model *m, const char *out_dir, const lm_quantize_opts *o,
                              json_t *overrides) {
  char path[4096];
  snprintf(path, sizeof path, "%s/config.json", m->dir);
  json_t *cfg;
  LM_TRY(lm_json_load_file(path, 0, &cfg));
  json_t *q = json_pack("{s:i,s:i,s:s}", "group_size", o->group, "bits", o->bits, "mode", "affine");
  json_object_update(q, overrides);
  json_object_set(cfg, "quantization", q);
  json_object_set_new(cfg, "quantization_config",
                      q); /* the duplicate mlx-lm writes for HF tooling */
  snprintf(path, sizeof path, "%s/config.json", out_dir);
  lm_status s = json_dump_file(cfg, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER)
                    ? LM_ERRF(LM_ERR_IO, "%s: cannot write", path)
                    : LM_OK;
  json_decref(cfg);
  return s;
}

static lm_status copy_file(const char *src_dir, const char *dst_dir, const char *name) {
  char a[4096], b[4096];
  snprintf(a, sizeof a, "%s/%s", src_dir, name);
  snprintf(b, sizeof b, "%s/%s", dst_dir, name);
  FILE *in = fopen(a, "rb");
  if (!in) return LM_OK; /* optional file */
  FILE *out = fopen(b, "wb");
  lm_status s = out ? LM_OK : LM_ERRF(LM_ERR_IO, "%s: cannot write", b);
  char buf[65536];
  size_t n;
  while (!s && (n = fread(buf, 1, sizeof buf, in)) > 0)
    if (fwrite(buf, 1, n, out) != n) s = LM_ERRF(LM_ERR_IO, "%s: write failed", b);
  fclose(in);
  if (out && fclose(out) && !s) s = LM_ERRF(LM_ERR_IO, "%s: write failed", b);
  return s;
}

lm_status lm_model_copy_side_files(const char *src_dir, const char *dst_dir, int with_config) {
  /* the tokenizer, the templates, the generation defaults, the KV-cache plan (--kv-quant config) */
  static const char *files[] = {"config.json",
                                "tokenizer.json",
                                "tokenizer_config.json",
                                "generation_config.json",
                                "chat_template.jinja",
                                "chat_template.json",
                                "special_tokens_map.json",
                                "kv_config.json",
                                "tokenizer.model",
                                "processor_config.json",
                                "preprocessor_config.json"};
  for (size_t i = with_config ? 0 : 1; i < sizeof files / sizeof *files; i++)
    LM_TRY(copy_file(src_dir, dst_dir, files[i]));
  return LM_OK;
}

int lm_quantize_bits_ok(int bits) { return bits >= 2 && bits <= 8 && bits != 7; }
int lm_quantize_group_ok(int group) { return group == 32 || group == 64 || group == 128; }

lm_status lm_model_quantize(const lm_model *m, const char *out_dir, const lm_quantize_opts *o) {
  if (!m->st) return LM_ERRF(LM_ERR_INVALID, "the source must be a checkpoint on disk");
  if (m->quant.present) return LM_ERRF(LM_ERR_UNSUPPORTED, "%s is already quantized", m->dir);
  if (!lm_quantize_bits_ok(o->bits))
    return LM_ERRF(LM_ERR_INVALID, "%d bits: supported are 2, 3, 4, 5, 6 and 8", o->bits);
  if (!lm_quantize_group_ok(o->group))
    return LM_ERRF(LM_ERR_INVALID, "group %d: supported are 32, 64 and 128", o->group);
  if (mkdir(out_dir, 0755) && errno != EEXIST)
    return LM_ERRF(LM_ERR_IO, "%s: cannot create", out_dir);
  lm_st_writer *wr = NULL;
  q_plan p = {.overrides = json_object()};
  lm_status s = lm_st_writer_create(&wr);
  if (!s) s = global_modules(m, add_module, &(add_ctx){wr, &p, o});
  if (!s && m->ple_norm.data) s = add_vector(wr, m, &m->ple_norm);
  if (!s) s = add_vector(wr, m, &m->final_norm);
  for (int l = 0; !s && l < m->cfg.n_layers; l++) {
    s = add_layer(wr, &p, m, l, o);
    if (o->progress) o->progress(o->progress_ctx, l + 1, m->cfg.n_layers + 1);
  }
  char path[4096];
  snprintf(path, sizeof path, "%s/model.safetensors", out_dir);
  if (!s) s = lm_st_writer_write(wr, path);
  if (!s && o->progress) o->progress(o->progress_ctx, m->cfg.n_layers + 1, m->cfg.n_layers + 1);
  if (!s) s = write_config(m, out_dir, o, p.overrides);
  /* everything but the weights and config.json that describes the checkpoint */
  if (!s) s = lm_model_copy_side_files(m->dir, out_dir, 0);
  lm_st_writer_free(wr);
  for (int i = 0; i < p.n; i++)
    free(p.items[i]);
  free(p.items);
  json_decref(p.overrides);
  return s;
}
