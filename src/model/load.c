/* load.c — binds a Gemma 4 checkpoint's tensors to lm_model (gemma4-spec §2.11, §8).
 * Naming: HF (`model.language_model.*`, experts `gate_up_proj`/`down_proj`) or MLX
 * (`language_model.model.*`, experts `switch_glu.{gate,up,down}_proj`). A module is quantized
 * iff its `.scales` tensor exists; bits/group come from config.json's override or defaults and
 * are cross-checked against the shapes. Norm vectors are converted to f32 once. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "base/status.h"
#include "model/model.h"

#define LM_NAME_MAX 256

static void *model_keep(lm_model *m, void *p) {
  if (!p) return NULL;
  if (m->n_owned == m->cap_owned) {
    int cap = m->cap_owned ? 2 * m->cap_owned : 64;
    void **o = realloc(m->owned, (size_t)cap * sizeof *o);
    if (!o) {
      free(p);
      return NULL;
    }
    m->owned = o;
    m->cap_owned = cap;
  }
  return m->owned[m->n_owned++] = p;
}

static const lm_st_tensor *find(const lm_model *m, const char *module, const char *suffix) {
  if (!m->st) return NULL; /* synthetic model */
  char name[LM_NAME_MAX];
  snprintf(name, sizeof name, "%s%s%s", m->prefix, module, suffix);
  return lm_st_find(m->st, name);
}

static const lm_quant_entry *quant_override(const lm_model *m, const char *full) {
  for (int i = 0; i < m->quant.n; i++)
    if (!strcmp(m->quant.entries[i].path, full)) return &m->quant.entries[i];
  return NULL;
}

/* Shape check with the message the issue asks for: file, tensor, expected and actual. */
static lm_status shape_error(const lm_model *m, const lm_st_tensor *t, const int64_t *exp, int nd) {
  char e[96] = "", a[96] = "";
  for (int i = 0; i < nd; i++)
    snprintf(e + strlen(e), sizeof e - strlen(e), "%s%lld", i ? ", " : "", (long long)exp[i]);
  for (int i = 0; i < t->ndim; i++)
    snprintf(a + strlen(a), sizeof a - strlen(a), "%s%lld", i ? ", " : "", (long long)t->shape[i]);
  return LM_ERRF(LM_ERR_CORRUPT, "%s: tensor %s: expected shape [%s], found [%s]",
                 lm_st_file_at(m->st, (size_t)t->file)->path, t->name, e, a);
}

static lm_status expect_shape(const lm_model *m, const lm_st_tensor *t, const int64_t *exp,
                              int nd) {
  if (t->ndim != nd) return shape_error(m, t, exp, nd);
  for (int i = 0; i < nd; i++)
    if (t->shape[i] != exp[i]) return shape_error(m, t, exp, nd);
  return LM_OK;
}

/* Tensors may sit at unaligned offsets (safetensors does not promise alignment); kernels read
 * typed elements, so an unaligned one is copied once into an aligned buffer. */
static lm_status aligned_data(lm_model *m, const lm_st_tensor *t, const void **out) {
  size_t al = lm_dtype_size(t->dtype);
  if (lm_st_tensor_aligned(t, al ? al : 1)) {
    *out = t->data;
    return LM_OK;
  }
  void *p = model_keep(m, malloc(t->nbytes ? t->nbytes : 1));
  if (!p) return LM_ERRF(LM_ERR_NOMEM, "out of memory copying %s", t->name);
  memcpy(p, t->data, t->nbytes);
  *out = p;
  return LM_OK;
}

static int float_dtype(lm_dtype d) { return d == LM_DT_F32 || d == LM_DT_BF16 || d == LM_DT_F16; }

static lm_status missing(const lm_model *m, const char *module, const char *suffix) {
  return LM_ERRF(LM_ERR_NOT_FOUND, "%s: missing tensor %s%s%s", m->dir, m->prefix, module, suffix);
}

/* ---- synthetic weights ------------------------------------------------------------------ */

static uint64_t name_hash(const char *s) { /* FNV-1a: the RNG stream of a tensor */
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++)
    h = (h ^ (uint8_t)*s) * 1099511628211ull;
  return h;
}

/* Uniform values in [-a, a], a = 1/sqrt(cols), so activations keep unit scale. Quantized:
 * random codes with scale 2a/(2^bits-1) and bias -a; dense: bf16 values. */
static lm_status synth_matrix(lm_model *m, const char *module, int64_t n_experts, int64_t rows,
                              int64_t cols, lm_weight *w) {
  char full[LM_NAME_MAX];
  snprintf(full, sizeof full, "%s%s", m->prefix, module);
  int bits = strstr(module, "router.proj") && m->synth.bits ? 8 : m->synth.bits,
      group = m->synth.group;
  int64_t ne = n_experts ? n_experts : 1, nrow = ne * rows;
  uint64_t stream = name_hash(full), seed = m->synth.seed;
  float a = (float)(1.0 / sqrt((double)cols));
  memset(w, 0, sizeof *w);
  w->name = model_keep(m, strdup(full));
  w->n_experts = n_experts;
  w->rows = w->expert_rows = rows;
  w->cols = cols;
  if (!w->name) return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  if (!bits) {
    uint16_t *d = model_keep(m, malloc((size_t)(nrow * cols) * 2));
    if (!d) return LM_ERRF(LM_ERR_NOMEM, "synthetic %s: out of memory", full);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < nrow * cols; i++)
      d[i] = lm_f32_to_bf16((2.0f * lm_rng_uniform(seed, stream, (uint64_t)i) - 1.0f) * a);
    w->dtype = LM_DT_BF16;
    w->data = d;
    m->weight_bytes += nrow * cols * 2;
  } else {
    if (cols % group || (cols * bits) % 64)
      return LM_ERRF(LM_ERR_INVALID, "synthetic %s: %lld columns do not fit %d-bit groups of %d",
                     full, (long long)cols, bits, group);
    int64_t words = nrow * cols * bits / 64, ng = nrow * cols / group;
    uint64_t *q = model_keep(m, malloc((size_t)words * 8));
    uint16_t *sb = model_keep(m, malloc((size_t)ng * 4));
    if (!q || !sb) return LM_ERRF(LM_ERR_NOMEM, "synthetic %s: out of memory", full);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < words; i++)
      q[i] = lm_rng_u64(seed, stream, (uint64_t)i);
    uint16_t sc = lm_f32_to_bf16(2.0f * a / (float)((1 << bits) - 1)), bi = lm_f32_to_bf16(-a);
    for (int64_t i = 0; i < ng; i++)
      sb[i] = sc, sb[ng + i] = bi;
    w->dtype = LM_DT_U32;
    w->bits = bits;
    w->group = group;
    w->sdtype = LM_DT_BF16;
    w->data = q;
    w->scales = sb;
    w->biases = sb + ng;
    m->weight_bytes += words * 8 + ng * 4;
  }
  m->n_params += nrow * cols;
  return LM_OK;
}

/* Binds a matrix (or a stack of n_experts matrices) of shape [rows, cols]. `suffix` is
 * ".weight" for modules, "" for HF's bare expert parameters. */
static lm_status bind_matrix(lm_model *m, const char *module, const char *suffix, int64_t n_experts,
                             int64_t rows, int64_t cols, lm_weight *w) {
  if (m->synth.on) return synth_matrix(m, module, n_experts, rows, cols, w);
  const lm_st_tensor *t = find(m, module, suffix), *sc = find(m, module, ".scales"),
                     *bi = find(m, module, ".biases");
  if (!t) return missing(m, module, suffix);
  char full[LM_NAME_MAX];
  snprintf(full, sizeof full, "%s%s", m->prefix, module);
  const lm_quant_entry *ov = quant_override(m, full);
  memset(w, 0, sizeof *w);
  w->name = t->name;
  w->n_experts = n_experts;
  w->rows = rows;
  w->cols = cols;
  w->expert_rows = rows;
  int nd = n_experts ? 3 : 2;
  int64_t exp[3];
  if (!sc) { /* dense */
    if (ov && ov->bits)
      return LM_ERRF(LM_ERR_NOT_FOUND,
                     "%s: config.json quantizes %s (%d bits) but %s.scales is missing", m->dir,
                     full, ov->bits, full);
    if (!float_dtype(t->dtype))
      return LM_ERRF(
          LM_ERR_CORRUPT,
          "%s: tensor %s has dtype %s; expected F32, F16 or BF16 (or .scales for a quantized "
          "module)",
          m->dir, t->name, lm_dtype_name(t->dtype));
    exp[0] = n_experts;
    exp[nd - 2] = rows;
    exp[nd - 1] = cols;
    LM_TRY(expect_shape(m, t, exp, nd));
    w->dtype = t->dtype;
    LM_TRY(aligned_data(m, t, &w->data));
    m->weight_bytes += (int64_t)t->nbytes;
  } else {
    if (!m->quant.present)
      return LM_ERRF(LM_ERR_CORRUPT,
                     "%s: %s.scales exists but config.json has no quantization block", m->dir,
                     full);
    if (ov && !ov->bits)
      return LM_ERRF(LM_ERR_CORRUPT,
                     "%s: config.json marks %s as not quantized but %s.scales exists", m->dir, full,
                     full);
    int bits = ov ? ov->bits : m->quant.bits, group = ov ? ov->group : m->quant.group;
    if (!bi) return missing(m, module, ".biases");
    if (t->dtype != LM_DT_U32)
      return LM_ERRF(LM_ERR_CORRUPT, "%s: tensor %s: quantized weights must be U32, found %s",
                     m->dir, t->name, lm_dtype_name(t->dtype));
    if (!float_dtype(sc->dtype) || sc->dtype != bi->dtype)
      return LM_ERRF(LM_ERR_CORRUPT, "%s: tensor %s: scales/biases must share a float dtype",
                     m->dir, sc->name);
    if (cols % group || (cols * bits) % 32)
      return LM_ERRF(LM_ERR_CORRUPT,
                     "%s: tensor %s: %lld input features do not fit %d-bit groups of %d", m->dir,
                     t->name, (long long)cols, bits, group);
    exp[0] = n_experts;
    exp[nd - 2] = rows;
    exp[nd - 1] = cols * bits / 32;
    LM_TRY(expect_shape(m, t, exp, nd));
    exp[nd - 1] = cols / group;
    LM_TRY(expect_shape(m, sc, exp, nd));
    LM_TRY(expect_shape(m, bi, exp, nd));
    w->dtype = LM_DT_U32;
    w->bits = bits;
    w->group = group;
    w->sdtype = sc->dtype;
    LM_TRY(aligned_data(m, t, &w->data));
    LM_TRY(aligned_data(m, sc, &w->scales));
    LM_TRY(aligned_data(m, bi, &w->biases));
    m->weight_bytes += (int64_t)(t->nbytes + sc->nbytes + bi->nbytes);
  }
  m->n_params += (n_experts ? n_experts : 1) * rows * cols;
  return LM_OK;
}

/* A vector of n values (norm weights, scales), converted to f32 and owned by the model. */
static lm_status synth_vector(lm_model *m, const char *name, int64_t n, float mul, lm_weight *w) {
  float *v = model_keep(m, malloc((size_t)n * sizeof(float)));
  if (!v) return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  uint64_t stream = name_hash(name);
  /* norms near 1 (a layer_scalar exactly 1) keep the synthetic residual stream finite */
  for (int64_t i = 0; i < n; i++)
    v[i] = mul * (strstr(name, "layer_scalar")
                      ? 1.0f
                      : 0.8f + 0.4f * lm_rng_uniform(m->synth.seed, stream, (uint64_t)i));
  memset(w, 0, sizeof *w);
  char full[LM_NAME_MAX];
  snprintf(full, sizeof full, "%s%s", m->prefix, name);
  if (!(w->name = model_keep(m, strdup(full)))) return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  w->rows = w->expert_rows = 1;
  w->cols = n;
  w->dtype = LM_DT_F32;
  w->data = v;
  m->n_params += n;
  m->weight_bytes += n * 2;
  return LM_OK;
}

static lm_status bind_vector_scaled(lm_model *m, const char *name_in_module, int64_t n, float mul,
                                    lm_weight *w) {
  if (m->synth.on) return synth_vector(m, name_in_module, n, mul, w);
  const lm_st_tensor *t = find(m, name_in_module, "");
  if (!t) return missing(m, name_in_module, "");
  int64_t exp[1] = {n};
  LM_TRY(expect_shape(m, t, exp, 1));
  if (!float_dtype(t->dtype))
    return LM_ERRF(LM_ERR_CORRUPT, "%s: tensor %s has dtype %s; expected a float type", m->dir,
                   t->name, lm_dtype_name(t->dtype));
  float *v = model_keep(m, malloc((size_t)n * sizeof(float)));
  if (!v) return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  for (int64_t i = 0; i < n; i++) {
    uint32_t raw = 0;
    memcpy(&raw, (const char *)t->data + i * (int64_t)lm_dtype_size(t->dtype),
           lm_dtype_size(t->dtype));
    float f = t->dtype == LM_DT_F32    ? (memcpy(&f, &raw, 4), f)
              : t->dtype == LM_DT_BF16 ? lm_bf16_to_f32((uint16_t)raw)
                                       : lm_f16_to_f32((uint16_t)raw);
    v[i] = f * mul;
  }
  memset(w, 0, sizeof *w);
  w->name = t->name;
  w->rows = w->expert_rows = 1;
  w->cols = n;
  w->dtype = LM_DT_F32;
  w->data = v;
  m->n_params += n;
  m->weight_bytes += (int64_t)t->nbytes;
  return LM_OK;
}

static lm_status bind_vector(lm_model *m, const char *name, int64_t n, lm_weight *w) {
  return bind_vector_scaled(m, name, n, 1.0f, w);
}

#define MOD(buf, ...) (snprintf(buf, sizeof buf, __VA_ARGS__), buf)

static lm_status bind_attention(lm_model *m, int l, lm_layer_weights *L) {
  const lm_layer_config *c = &m->cfg.layers[l];
  int64_t H = m->cfg.hidden, qd = m->cfg.n_heads * c->head_dim,
          kvd = (int64_t)c->n_kv_heads * c->head_dim;
  char b[LM_NAME_MAX];
  LM_TRY(bind_matrix(m, MOD(b, "layers.%d.self_attn.q_proj", l), ".weight", 0, qd, H, &L->q));
  LM_TRY(bind_matrix(m, MOD(b, "layers.%d.self_attn.o_proj", l), ".weight", 0, H, qd, &L->o));
  LM_TRY(bind_vector(m, MOD(b, "layers.%d.self_attn.q_norm.weight", l), c->head_dim, &L->q_norm));
  if (c->kv_shared) return LM_OK; /* HF ignores a shared layer's k/v tensors; so do we */
  LM_TRY(bind_matrix(m, MOD(b, "layers.%d.self_attn.k_proj", l), ".weight", 0, kvd, H, &L->k));
  if (!c->k_eq_v)
    LM_TRY(bind_matrix(m, MOD(b, "layers.%d.self_attn.v_proj", l), ".weight", 0, kvd, H, &L->v));
  return bind_vector(m, MOD(b, "layers.%d.self_attn.k_norm.weight", l), c->head_dim, &L->k_norm);
}

static lm_status bind_norms(lm_model *m, int l, lm_layer_weights *L) {
  int64_t H = m->cfg.hidden;
  char b[LM_NAME_MAX];
  LM_TRY(bind_vector(m, MOD(b, "layers.%d.input_layernorm.weight", l), H, &L->ln_in));
  LM_TRY(
      bind_vector(m, MOD(b, "layers.%d.post_attention_layernorm.weight", l), H, &L->ln_post_attn));
  LM_TRY(bind_vector(m, MOD(b, "layers.%d.pre_feedforward_layernorm.weight", l), H, &L->ln_pre_ff));
  LM_TRY(
      bind_vector(m, MOD(b, "layers.%d.post_feedforward_layernorm.weight", l), H, &L->ln_post_ff));
  LM_TRY(bind_vector(m, MOD(b, "layers.%d.layer_scalar", l), 1, &L->scalar));
  L->layer_scalar = ((const float *)L->scalar.data)[0];
  return LM_OK;
}

static lm_status bind_mlp(lm_model *m, int l, lm_layer_weights *L) {
  int64_t H = m->cfg.hidden, I = m->cfg.layers[l].ffn_dim;
  char b[LM_NAME_MAX];
  LM_TRY(bind_matrix(m, MOD(b, "layers.%d.mlp.gate_proj", l), ".weight", 0, I, H, &L->gate));
  LM_TRY(bind_matrix(m, MOD(b, "layers.%d.mlp.up_proj", l), ".weight", 0, I, H, &L->up));
  return bind_matrix(m, MOD(b, "layers.%d.mlp.down_proj", l), ".weight", 0, H, I, &L->down);
}

static lm_status bind_ple(lm_model *m, int l, lm_layer_weights *L) {
  int64_t H = m->cfg.hidden, P = m->cfg.ple_dim;
  char b[LM_NAME_MAX];
  LM_TRY(bind_matrix(m, MOD(b, "layers.%d.per_layer_input_gate", l), ".weight", 0, P, H,
                     &L->ple_gate));
  LM_TRY(bind_matrix(m, MOD(b, "layers.%d.per_layer_projection", l), ".weight", 0, H, P,
                     &L->ple_proj));
  return bind_vector(m, MOD(b, "layers.%d.post_per_layer_input_norm.weight", l), H,
                     &L->ln_post_ple);
}

/* HF keeps gate and up fused in one [E, 2*I, H] parameter (gate = first half); MLX splits them. */
static lm_status bind_experts(lm_model *m, int l, lm_layer_weights *L) {
  int64_t H = m->cfg.hidden, I = m->cfg.moe_dim, E = m->cfg.n_experts;
  char b[LM_NAME_MAX];
  if (find(m, MOD(b, "layers.%d.experts.gate_up_proj", l), "")) {
    LM_TRY(bind_matrix(m, b, "", E, 2 * I, H, &L->ex_gate));
    L->ex_gate.rows = I;
    L->ex_up = L->ex_gate;
    L->ex_up.data = lm_weight_row_ptr(&L->ex_gate, 0, I);
    if (L->ex_gate.bits) {
      L->ex_up.scales = lm_weight_scale_ptr(&L->ex_gate, 0, I);
      L->ex_up.biases = lm_weight_bias_ptr(&L->ex_gate, 0, I);
    }
    LM_TRY(bind_matrix(m, MOD(b, "layers.%d.experts.down_proj", l), "", E, H, I, &L->ex_down));
  } else {
    LM_TRY(bind_matrix(m, MOD(b, "layers.%d.experts.switch_glu.gate_proj", l), ".weight", E, I, H,
                       &L->ex_gate));
    LM_TRY(bind_matrix(m, MOD(b, "layers.%d.experts.switch_glu.up_proj", l), ".weight", E, I, H,
                       &L->ex_up));
    LM_TRY(bind_matrix(m, MOD(b, "layers.%d.experts.switch_glu.down_proj", l), ".weight", E, H, I,
                       &L->ex_down));
  }
  return LM_OK;
}

static lm_status bind_moe(lm_model *m, int l, lm_layer_weights *L) {
  int64_t H = m->cfg.hidden, E = m->cfg.n_experts;
  char b[LM_NAME_MAX];
  LM_TRY(bind_matrix(m, MOD(b, "layers.%d.router.proj", l), ".weight", 0, E, H, &L->router));
  /* Gemma4TextRouter: norm(x) * scale * H^-0.5; the two factors are folded into one vector. */
  LM_TRY(bind_vector_scaled(m, MOD(b, "layers.%d.router.scale", l), H,
                            (float)(1.0 / sqrt((double)H)), &L->router_scale));
  LM_TRY(bind_vector(m, MOD(b, "layers.%d.router.per_expert_scale", l), E, &L->expert_scale));
  LM_TRY(
      bind_vector(m, MOD(b, "layers.%d.pre_feedforward_layernorm_2.weight", l), H, &L->ln_pre_ff2));
  LM_TRY(bind_vector(m, MOD(b, "layers.%d.post_feedforward_layernorm_1.weight", l), H,
                     &L->ln_post_ff1));
  LM_TRY(bind_vector(m, MOD(b, "layers.%d.post_feedforward_layernorm_2.weight", l), H,
                     &L->ln_post_ff2));
  return bind_experts(m, l, L);
}

/* inv[i] = 1 / θ^(2i/d) in f32 as torch computes it; proportional RoPE rotates only the first
 * int(prf*d/2) pairs, with the exponent's denominator the FULL head dim (spec §2.4). */
static lm_status build_rope(lm_model *m, lm_layer_type t) {
  const lm_rope_config *r = &m->cfg.rope[t];
  int d = r->dim, half = d / 2;
  if (!d) return LM_OK; /* no layer of this type */
  float *inv = model_keep(m, calloc((size_t)half, sizeof(float)));
  if (!inv) return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  int rot = r->proportional ? (int)(r->partial_rotary_factor * d / 2) : half;
  if (rot > half) rot = half;
  for (int i = 0; i < rot; i++)
    inv[i] = 1.0f / powf((float)r->theta, (float)(2 * i) / (float)d);
  for (int i = 0; i < half; i++)
    inv[i] /= (float)r->factor;
  lm_weight *w = &m->rope_inv[t];
  memset(w, 0, sizeof *w);
  w->name = t == LM_LAYER_FULL ? "rope.full_attention.inv_freq" : "rope.sliding_attention.inv_freq";
  w->rows = w->expert_rows = 1;
  w->cols = half;
  w->dtype = LM_DT_F32;
  w->data = inv;
  return LM_OK;
}

static lm_status detect_prefix(lm_model *m) {
  if (m->synth.on) {
    m->prefix = "model.language_model.";
    return LM_OK;
  }
  static const char *prefixes[] = {"model.language_model.", "language_model.model.", "model.", ""};
  for (size_t i = 0; i < sizeof prefixes / sizeof *prefixes; i++) {
    m->prefix = prefixes[i];
    if (find(m, "embed_tokens", ".weight")) {
      m->mlx_naming = i == 1;
      return LM_OK;
    }
  }
  return LM_ERRF(LM_ERR_NOT_FOUND,
                 "%s: no embed_tokens.weight under any known prefix (model.language_model., "
                 "language_model.model., model.)",
                 m->dir);
}

static lm_status bind_all(lm_model *m) {
  const lm_model_config *c = &m->cfg;
  LM_TRY(detect_prefix(m));
  LM_TRY(bind_matrix(m, "embed_tokens", ".weight", 0, c->vocab_size, c->hidden, &m->embed));
  LM_TRY(bind_vector(m, "norm.weight", c->hidden, &m->final_norm));
  if (c->ple_dim) {
    LM_TRY(bind_matrix(m, "embed_tokens_per_layer", ".weight", 0, c->ple_vocab,
                       c->n_layers * c->ple_dim, &m->embed_ple));
    LM_TRY(bind_matrix(m, "per_layer_model_projection", ".weight", 0, c->n_layers * c->ple_dim,
                       c->hidden, &m->ple_model_proj));
    LM_TRY(bind_vector(m, "per_layer_projection_norm.weight", c->ple_dim, &m->ple_norm));
  }
  for (int t = 0; t < LM_LAYER_TYPES; t++)
    LM_TRY(build_rope(m, (lm_layer_type)t));
  m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
  m->last_reader = calloc((size_t)c->n_caches, sizeof *m->last_reader);
  if (!m->layers || !m->last_reader) return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  for (int l = 0; l < c->n_layers; l++) {
    lm_layer_weights *L = &m->layers[l];
    LM_TRY(bind_attention(m, l, L));
    LM_TRY(bind_norms(m, l, L));
    LM_TRY(bind_mlp(m, l, L));
    if (c->ple_dim) LM_TRY(bind_ple(m, l, L));
    if (c->moe) LM_TRY(bind_moe(m, l, L));
    m->last_reader[c->layers[l].cache] = l;
  }
  return LM_OK;
}

lm_status lm_model_load(const char *dir, lm_model **out) {
  *out = NULL;
  lm_model *m = calloc(1, sizeof *m);
  if (!m || !(m->dir = strdup(dir))) {
    free(m);
    return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  }
  char path[4096];
  snprintf(path, sizeof path, "%s/config.json", dir);
  lm_status s = lm_config_load(path, &m->cfg);
  if (!s) s = lm_quant_config_parse(path, &m->quant);
  if (!s) s = lm_st_open(dir, &m->st);
  if (!s) s = bind_all(m);
  if (s) {
    lm_model_free(m);
    return s;
  }
  *out = m;
  return LM_OK;
}

lm_status lm_model_foreach_weight(lm_model *m, lm_status (*fn)(lm_weight *w, void *arg),
                                  void *arg) {
  lm_weight *top[] = {&m->embed,      &m->embed_ple,   &m->ple_model_proj, &m->ple_norm,
                      &m->final_norm, &m->rope_inv[0], &m->rope_inv[1]};
  for (size_t i = 0; i < sizeof top / sizeof *top; i++)
    if (top[i]->data) LM_TRY(fn(top[i], arg));
  for (int l = 0; l < m->cfg.n_layers; l++) {
    lm_layer_weights *L = &m->layers[l];
    lm_weight *ws[] = {&L->q,
                       &L->k,
                       &L->v,
                       &L->o,
                       &L->q_norm,
                       &L->k_norm,
                       &L->ln_in,
                       &L->ln_post_attn,
                       &L->ln_pre_ff,
                       &L->ln_post_ff,
                       &L->scalar,
                       &L->gate,
                       &L->up,
                       &L->down,
                       &L->ple_gate,
                       &L->ple_proj,
                       &L->ln_post_ple,
                       &L->router,
                       &L->router_scale,
                       &L->expert_scale,
                       &L->ex_gate,
                       &L->ex_up,
                       &L->ex_down,
                       &L->ln_pre_ff2,
                       &L->ln_post_ff1,
                       &L->ln_post_ff2};
    for (size_t i = 0; i < sizeof ws / sizeof *ws; i++)
      if (ws[i]->data) LM_TRY(fn(ws[i], arg));
  }
  return LM_OK;
}

lm_status lm_model_synth(const char *preset_path, int bits, int group, uint64_t seed,
                         lm_model **out) {
  *out = NULL;
  if (bits && (bits < 2 || bits > 8 || bits == 7 || (group != 32 && group != 64 && group != 128)))
    return LM_ERRF(LM_ERR_INVALID,
                   "synthetic model: bits must be 0 (bf16) or 2..8 (not 7), group 32/64/128");
  lm_model *m = calloc(1, sizeof *m);
  if (!m || !(m->dir = strdup(preset_path))) {
    free(m);
    return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  }
  m->synth.on = 1;
  m->synth.bits = bits;
  m->synth.group = group;
  m->synth.seed = seed;
  lm_status s = lm_config_load(preset_path, &m->cfg);
  if (!s) s = bind_all(m);
  if (s) {
    lm_model_free(m);
    return s;
  }
  *out = m;
  return LM_OK;
}

static lm_status free_owned_payload(lm_weight *w, void *arg) {
  (void)arg;
  free(w->owned); /* a payload exchanged in (lm_exchange_weight) */
  w->owned = NULL;
  return LM_OK;
}

void lm_model_free(lm_model *m) {
  if (!m) return;
  if (m->layers) lm_model_foreach_weight(m, free_owned_payload, NULL);
  for (int i = 0; i < m->n_owned; i++)
    free(m->owned[i]);
  free(m->owned);
  free(m->layers);
  free(m->last_reader);
  lm_st_close(m->st);
  lm_quant_config_free(&m->quant);
  lm_config_free(&m->cfg);
  free(m->dir);
  free(m);
}
