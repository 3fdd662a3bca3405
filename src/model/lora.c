/* lora.c — loading LoRA adapters onto a model (see lora.h). */
#include "model/lora.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "io/safetensors.h"
#include "model/lora_config.h"
#include "tensor/dtype.h"

/* Module paths inside a layer, as PEFT (the HF module names) and mlx-lm write them. */
static const char *const kind_path[LM_LORA_KINDS] = {
    "self_attn.q_proj", "self_attn.k_proj",     "self_attn.v_proj",
    "self_attn.o_proj", "mlp.gate_proj",        "mlp.up_proj",
    "mlp.down_proj",    "per_layer_input_gate", "per_layer_projection"};

/* One tensor of an adapter, parsed from its name. */
typedef struct lora_name {
  char module[512]; /* the adapted module's path (the name without the LoRA suffix) */
  int layer;
  lm_lora_kind kind;
  int is_b; /* lora_B / lora_b */
} lora_name;

/* "<...>.layers.N.<kind path>.<suffix>": the layer, the kind and which matrix; anything else is
 * refused with what it is. PEFT suffixes are lora_A.weight / lora_B.weight (after
 * base_model.model.), mlx-lm's lora_a / lora_b. */
static lm_status parse_name(const char *name, int peft, lora_name *out) {
  const char *sa = peft ? ".lora_A.weight" : ".lora_a", *sb = peft ? ".lora_B.weight" : ".lora_b";
  size_t n = strlen(name), la = strlen(sa), lb = strlen(sb);
  if (strstr(name, "lora_magnitude_vector") || (!peft && n > 2 && !strcmp(name + n - 2, ".m")))
    return LM_ERRF(LM_ERR_UNSUPPORTED, "adapter tensor %s: DoRA magnitudes are not supported",
                   name);
  if (strstr(name, "lora_embedding_"))
    return LM_ERRF(LM_ERR_UNSUPPORTED,
                   "adapter tensor %s: LoRA on an embedding is not supported (lumen adapts the "
                   "attention, MLP and per-layer-input projections)",
                   name);
  if (n > 5 && !strcmp(name + n - 5, ".bias"))
    return LM_ERRF(LM_ERR_UNSUPPORTED, "adapter tensor %s: trained biases are not supported", name);
  if (n > la && !strcmp(name + n - la, sa))
    out->is_b = 0, n -= la;
  else if (n > lb && !strcmp(name + n - lb, sb))
    out->is_b = 1, n -= lb;
  else
    return LM_ERRF(LM_ERR_UNSUPPORTED, "adapter tensor %s: not a %s LoRA matrix", name,
                   peft ? "PEFT" : "mlx-lm");
  const char *base = name;
  if (peft && !strncmp(base, "base_model.model.", 17)) base += 17, n -= 17;
  if (n >= sizeof out->module)
    return LM_ERRF(LM_ERR_CORRUPT, "adapter tensor %s: name too long", name);
  memcpy(out->module, base, n);
  out->module[n] = 0;
  const char *l = NULL;
  for (const char *p = strstr(out->module, "layers."); p; p = strstr(p + 1, "layers."))
    l = p;
  char *end = NULL;
  long layer = l ? strtol(l + 7, &end, 10) : -1;
  if (layer < 0 || !end || end == l + 7 || *end != '.')
    return LM_ERRF(LM_ERR_UNSUPPORTED,
                   "adapter target %s: not a decoder layer's module (lumen adapts the attention, "
                   "MLP and per-layer-input projections)",
                   out->module);
  for (int k = 0; k < LM_LORA_KINDS; k++)
    if (!strcmp(end + 1, kind_path[k])) {
      out->layer = (int)layer, out->kind = (lm_lora_kind)k;
      return LM_OK;
    }
  return LM_ERRF(LM_ERR_UNSUPPORTED,
                 "adapter target %s: lumen adapts q/k/v/o_proj, mlp gate/up/down_proj and the "
                 "per-layer-input gate and projection%s",
                 out->module, strstr(end + 1, "expert") ? " (not MoE experts)" : "");
}

const lm_weight *lm_lora_target(const lm_model *m, int layer, lm_lora_kind k) {
  const lm_layer_weights *L = &m->layers[layer];
  const lm_weight *w[LM_LORA_KINDS] = {&L->q,  &L->k,    &L->v,        &L->o,       &L->gate,
                                       &L->up, &L->down, &L->ple_gate, &L->ple_proj};
  return w[k]->data ? w[k] : NULL;
}

/* Element i of a 2-D f32/bf16/f16 tensor, as f32 (the data may be unaligned). */
static float elem(const lm_st_tensor *t, int64_t i) {
  const uint8_t *p = (const uint8_t *)t->data;
  if (t->dtype == LM_DT_F32) {
    float f;
    memcpy(&f, p + 4 * i, 4);
    return f;
  }
  uint16_t h;
  memcpy(&h, p + 2 * i, 2);
  return t->dtype == LM_DT_BF16 ? lm_bf16_to_f32(h) : lm_f16_to_f32(h);
}

/* A module's two matrices (a [r][in], b [out][r], dense f32) allocated. */
static lm_status alloc_matrices(lm_lora_module *md, int64_t r, int64_t in, int64_t out) {
  md->a_data = malloc((size_t)(r * in) * sizeof(float));
  md->b_data = malloc((size_t)(out * r) * sizeof(float));
  if (!md->a_data || !md->b_data) return LM_ERRF(LM_ERR_NOMEM, "out of memory for an adapter");
  md->in = in, md->out = out;
  return LM_OK;
}

typedef struct pending {
  lora_name name;
  const lm_st_tensor *t[2]; /* A, B */
} pending;

/* The adapter's matrices of one module as lora.h keeps them: a [r][in], b [out][r] with the
 * scale folded in (mlx-lm stores both transposed). */
static lm_status build_module(const lm_model *m, const lm_lora_cfg *c, const pending *p,
                              float weight, lm_lora_module *out) {
  const lora_name *nm = &p->name;
  const lm_st_tensor *A = p->t[0], *B = p->t[1];
  if (!A || !B)
    return LM_ERRF(LM_ERR_CORRUPT, "adapter: %s has lora_%s but no lora_%s", nm->module,
                   A ? "A" : "B", A ? "B" : "A");
  if (nm->layer >= m->cfg.n_layers)
    return LM_ERRF(LM_ERR_INVALID, "adapter target %s: the model has %lld layers", nm->module,
                   (long long)m->cfg.n_layers);
  const lm_weight *w = lm_lora_target(m, nm->layer, nm->kind);
  if (!w)
    return LM_ERRF(LM_ERR_INVALID, "adapter target %s: layer %d of this model has no such module",
                   nm->module, nm->layer);
  int ok = A->ndim == 2 && B->ndim == 2 &&
           (A->dtype == LM_DT_F32 || A->dtype == LM_DT_BF16 || A->dtype == LM_DT_F16) &&
           B->dtype == A->dtype;
  int64_t r = ok ? (c->peft ? A->shape[0] : A->shape[1]) : 0;
  int64_t in = ok ? (c->peft ? A->shape[1] : A->shape[0]) : 0;
  int64_t bo = ok ? (c->peft ? B->shape[0] : B->shape[1]) : 0;
  int64_t br = ok ? (c->peft ? B->shape[1] : B->shape[0]) : 0;
  if (!ok || r < 1 || r > 65536 || br != r || in != w->cols || bo != w->rows)
    return LM_ERRF(LM_ERR_INVALID,
                   "adapter target %s: lora matrices [%lld][%lld] and [%lld][%lld] (%s) do not fit "
                   "the base's [%lld][%lld]",
                   nm->module, (long long)A->shape[0], (long long)A->shape[1],
                   (long long)B->shape[0], (long long)B->shape[1], lm_dtype_name(A->dtype),
                   (long long)w->rows, (long long)w->cols);
  float scale;
  LM_TRY(lm_lora_cfg_scale(c, nm->module, (int)r, &scale));
  out->layer = nm->layer, out->kind = nm->kind, out->rank = (int)r, out->scale = scale;
  LM_TRY(alloc_matrices(out, r, in, bo));
  for (int64_t i = 0; i < r; i++)
    for (int64_t j = 0; j < in; j++)
      out->a_data[i * in + j] = elem(A, c->peft ? i * in + j : j * r + i);
  for (int64_t i = 0; i < bo; i++)
    for (int64_t j = 0; j < r; j++)
      out->b_data[i * r + j] = elem(B, c->peft ? i * r + j : j * bo + i) * scale * weight;
  return LM_OK;
}

/* Pairs the file's tensors by module. */
static lm_status collect(const lm_safetensors *st, int peft, pending **out, int *n) {
  size_t cnt = lm_st_count(st);
  pending *p = calloc(cnt ? cnt : 1, sizeof *p);
  if (!p) return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  int np = 0;
  for (size_t i = 0; i < cnt; i++) {
    const lm_st_tensor *t = lm_st_at(st, i);
    lora_name nm;
    lm_status s = parse_name(t->name, peft, &nm);
    if (s) return free(p), s;
    int j = 0;
    while (j < np && strcmp(p[j].name.module, nm.module))
      j++;
    if (j == np) p[np++].name = nm;
    if (p[j].t[nm.is_b]) {
      free(p);
      return LM_ERRF(LM_ERR_CORRUPT, "adapter: two lora_%s tensors for %s", nm.is_b ? "B" : "A",
                     nm.module);
    }
    p[j].t[nm.is_b] = t;
  }
  *out = p, *n = np;
  return LM_OK;
}

static lm_status load_modules(const lm_model *m, const lm_lora_cfg *c, const lm_safetensors *st,
                              lm_lora *l) {
  pending *p = NULL;
  int np = 0;
  LM_TRY(collect(st, c->peft, &p, &np));
  lm_status s = np ? LM_OK : LM_ERRF(LM_ERR_CORRUPT, "adapter %s: no LoRA tensors", l->dir);
  l->mods = s ? NULL : calloc((size_t)np, sizeof *l->mods);
  if (!s && !l->mods) s = LM_ERRF(LM_ERR_NOMEM, "out of memory");
  for (int i = 0; !s && i < np; i++) {
    const lora_name *nm = &p[i].name;
    /* a KV-shared layer reads its donor's K/V: its own k/v projections are never computed */
    if ((nm->kind == LM_LORA_K || nm->kind == LM_LORA_V) && nm->layer < m->cfg.n_layers &&
        m->cfg.layers[nm->layer].kv_shared)
      continue;
    s = build_module(m, c, &p[i], l->weight, &l->mods[l->n_mods]);
    l->n_mods++;
    if (!s && l->mods[l->n_mods - 1].rank > l->max_rank) l->max_rank = l->mods[l->n_mods - 1].rank;
  }
  free(p);
  return s;
}

lm_status lm_lora_load(const lm_model *m, const char *dir, float weight, lm_lora **out) {
  *out = NULL;
  lm_lora *l = calloc(1, sizeof *l);
  if (!l || !(l->dir = strdup(dir))) return free(l), LM_ERRF(LM_ERR_NOMEM, "out of memory");
  l->weight = weight;
  lm_lora_cfg c;
  char path[1200];
  lm_status s = lm_lora_cfg_load(dir, &c, path, sizeof path);
  if (s) return lm_lora_free(l), s;
  l->format = c.peft ? "peft" : "mlx-lm";
  lm_safetensors *st = NULL;
  s = lm_st_open(path, &st);
  if (!s) s = load_modules(m, &c, st, l);
  lm_st_close(st);
  lm_lora_cfg_free(&c);
  if (s) return lm_lora_free(l), lm_err_prefix(s, "adapter %s", dir);
  *out = l;
  return LM_OK;
}

/* Module (layer, kind) of rank r with values from the counter generator. */
static lm_status synth_module(const lm_weight *w, int layer, lm_lora_kind k, int r, uint64_t seed,
                              lm_lora_module *out) {
  out->layer = layer, out->kind = k, out->rank = r, out->scale = 1.0f;
  LM_TRY(alloc_matrices(out, r, w->cols, w->rows));
  float sa = 1.0f / sqrtf((float)w->cols), sb = 0.01f;
  uint64_t stream = (uint64_t)layer * LM_LORA_KINDS + (uint64_t)k;
  for (int64_t i = 0; i < r * w->cols; i++)
    out->a_data[i] = sa * (2.0f * lm_rng_uniform(seed, 2 * stream, (uint64_t)i) - 1.0f);
  for (int64_t i = 0; i < w->rows * r; i++)
    out->b_data[i] = sb * (2.0f * lm_rng_uniform(seed, 2 * stream + 1, (uint64_t)i) - 1.0f);
  return LM_OK;
}

lm_status lm_lora_synth(const lm_model *m, int rank, uint64_t seed, lm_lora **out) {
  *out = NULL;
  if (rank < 1 || rank > 4096) return LM_ERRF(LM_ERR_INVALID, "adapter rank %d (1..4096)", rank);
  lm_lora *l = calloc(1, sizeof *l);
  int64_t L = m->cfg.n_layers;
  if (l) l->mods = calloc((size_t)(L * 7), sizeof *l->mods);
  if (!l || !l->mods || !(l->dir = strdup("(synthetic)"))) {
    lm_lora_free(l);
    return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  }
  l->format = "synthetic", l->weight = 1.0f, l->max_rank = rank;
  lm_status s = LM_OK;
  for (int layer = 0; layer < L && !s; layer++)
    for (int k = LM_LORA_Q; k <= LM_LORA_DOWN && !s; k++) {
      const lm_weight *w = lm_lora_target(m, layer, (lm_lora_kind)k); /* NULL: k/v shared */
      if (!w) continue;
      s = synth_module(w, layer, (lm_lora_kind)k, rank, seed, &l->mods[l->n_mods++]);
    }
  if (s) return lm_lora_free(l), s;
  *out = l;
  return LM_OK;
}

/* The backend's copy goes first: it belongs to the backend that made it. */
static void release_copies(lm_lora *l) {
  if (l->prepared && l->dev_mem) l->prepared->ops->free(l->prepared, l->dev_mem);
  for (int i = 0; i < l->n_mods; i++)
    l->mods[i].a_dev = l->mods[i].b_dev = NULL;
  free(l->stage);
  l->stage = l->dev_mem = NULL;
  l->prepared = NULL;
  l->dev_bytes = l->stage_bytes = l->uploaded = 0;
}

void lm_lora_free(lm_lora *l) {
  if (!l) return;
  release_copies(l);
  for (int i = 0; i < l->n_mods; i++)
    free(l->mods[i].a_data), free(l->mods[i].b_data);
  free(l->mods);
  free(l->dir);
  free(l);
}

/* Whether be reads the host matrices themselves (the CPU's f32 run). */
static int reads_host(const lm_backend *be) {
  return !be->ops->prepare_weight && be->act_dtype == LM_DT_F32;
}

static size_t put(void *dst, size_t at, const float *src, int64_t n, int bf16) {
  for (int64_t i = 0; i < n; i++) {
    if (bf16) {
      uint16_t h = lm_f32_to_bf16(src[i]);
      memcpy((char *)dst + at + 2 * (size_t)i, &h, 2);
    } else {
      memcpy((char *)dst + at + 4 * (size_t)i, &src[i], 4);
    }
  }
  return at + (size_t)n * (bf16 ? 2 : 4);
}

lm_status lm_lora_stage(lm_lora *l, lm_dtype act) {
  if (l->stage || l->prepared) return LM_OK;
  int bf16 = act == LM_DT_BF16;
  size_t es = bf16 ? 2 : 4, bytes = 0;
  for (int i = 0; i < l->n_mods; i++) /* 16-byte aligned pieces: the kernels load 16 bytes */
    bytes += (((size_t)(l->mods[i].rank * l->mods[i].in) * es + 15) & ~(size_t)15) +
             (((size_t)(l->mods[i].out * l->mods[i].rank) * es + 15) & ~(size_t)15);
  if (!(l->stage = malloc(bytes ? bytes : 1)))
    return LM_ERRF(LM_ERR_NOMEM, "out of memory for adapter %s", l->dir);
  size_t at = 0;
  for (int i = 0; i < l->n_mods; i++) {
    lm_lora_module *md = &l->mods[i];
    md->a_off = at;
    at = (put(l->stage, at, md->a_data, md->rank * md->in, bf16) + 15) & ~(size_t)15;
    md->b_off = at;
    at = (put(l->stage, at, md->b_data, md->out * md->rank, bf16) + 15) & ~(size_t)15;
  }
  l->stage_bytes = bytes, l->stage_dtype = act;
  return LM_OK;
}

lm_status lm_lora_upload(lm_lora *l, lm_backend *be, size_t max_bytes, int *done) {
  *done = 0;
  if (l->prepared && l->prepared != be)
    return LM_ERRF(LM_ERR_INVALID, "adapter %s: its matrices live on another %s backend", l->dir,
                   be->ops->name);
  if (l->prepared && !l->stage) return *done = 1, LM_OK; /* complete */
  if (reads_host(be)) {
    for (int i = 0; i < l->n_mods; i++)
      l->mods[i].a_dev = l->mods[i].a_data, l->mods[i].b_dev = l->mods[i].b_data;
    free(l->stage); /* (a copy staged before the backend was known) */
    l->stage = NULL, l->stage_bytes = 0;
    l->prepared = be;
    return *done = 1, LM_OK;
  }
  LM_TRY(lm_lora_stage(l, be->act_dtype));
  if (l->stage_dtype != be->act_dtype)
    return LM_ERRF(LM_ERR_INVALID, "adapter %s: staged for another activation dtype", l->dir);
  if (!l->prepared) {
    LM_TRY(lm_err_prefix(be->ops->alloc(be, l->stage_bytes ? l->stage_bytes : 1, &l->dev_mem),
                         "adapter %s", l->dir));
    l->prepared = be, l->dev_bytes = (int64_t)l->stage_bytes;
  }
  size_t n = l->stage_bytes - l->uploaded;
  if (max_bytes && n > max_bytes) n = max_bytes;
  LM_TRY(be->ops->upload(be, (char *)l->dev_mem + l->uploaded, (char *)l->stage + l->uploaded, n));
  l->uploaded += n;
  if (l->uploaded < l->stage_bytes) return LM_OK;
  for (int i = 0; i < l->n_mods; i++) {
    lm_lora_module *md = &l->mods[i];
    md->a_dev = (char *)l->dev_mem + md->a_off, md->b_dev = (char *)l->dev_mem + md->b_off;
  }
  free(l->stage);
  l->stage = NULL;
  return *done = 1, LM_OK;
}

lm_status lm_lora_prepare(lm_lora *l, lm_backend *be) {
  int done = 0;
  lm_status s = lm_lora_upload(l, be, 0, &done);
  if (s && l->prepared == be) release_copies(l);
  return s;
}

const lm_lora_module *lm_lora_find(const lm_lora *l, int layer, lm_lora_kind kind) {
  for (int i = 0; i < l->n_mods; i++)
    if (l->mods[i].layer == layer && l->mods[i].kind == kind) return &l->mods[i];
  return NULL;
}

lm_status lm_lora_parse_arg(const char *arg, char *dir, size_t n, float *weight) {
  const char *at = strrchr(arg, '@');
  size_t len = at ? (size_t)(at - arg) : strlen(arg);
  *weight = 1.0f;
  if (!len || len >= n) return LM_ERRF(LM_ERR_INVALID, "--adapter %s: want PATH[@WEIGHT]", arg);
  char *end = NULL;
  double w = at ? strtod(at + 1, &end) : 1.0;
  if (at && (end == at + 1 || *end || !isfinite(w))) { /* an @ in the path itself */
    len = strlen(arg);
    if (len >= n) return LM_ERRF(LM_ERR_INVALID, "--adapter %s: path too long", arg);
    w = 1.0;
  }
  memcpy(dir, arg, len);
  dir[len] = 0;
  *weight = (float)w;
  return LM_OK;
}
