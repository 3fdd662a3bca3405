/* kv_plan.c — per-cache kinds from --kv-quant and kv_config.json (see kv_plan.h). */
#include "model/kv_plan.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "io/json_util.h"
#include "model/forward.h"

lm_status lm_kv_spec_quantize(lm_kv_spec *s, int bits, int group, const char *where) {
  if (bits != 4 && bits != 8)
    return LM_ERRF(LM_ERR_UNSUPPORTED, "%s: %d-bit KV caches are not supported (4 or 8)", where,
                   bits);
  if (group != 32 && group != 64 && group != 128)
    return LM_ERRF(LM_ERR_UNSUPPORTED, "%s: KV group size %d is not supported (32, 64, 128)", where,
                   group);
  if (s->head_dim % group)
    return LM_ERRF(LM_ERR_UNSUPPORTED, "%s: group %d does not divide head dim %d", where, group,
                   s->head_dim);
  s->kind = s->kind == LM_KV_ROTATING_PLAIN ? LM_KV_ROTATING_QUANT : LM_KV_QUANT;
  s->bits = bits;
  s->group = group;
  return LM_OK;
}

static lm_status apply_config(const lm_model *m, const char *path, lm_kv_spec *specs) {
  /* path comes from the caller's 4096-byte buffer */
  json_t *root;
  LM_TRY(lm_json_load_file(path, 1 << 20, &root));
  lm_status s = LM_OK;
  if (!json_is_array(root))
    s = LM_ERRF(LM_ERR_CORRUPT, "%s: expected a list of {layer_idx, bits, group_size}", path);
  size_t i;
  json_t *e;
  json_array_foreach(root, i, e) {
    if (s) break;
    char where[4200];
    snprintf(where, sizeof where, "%.4096s: entry %zu", path, i);
    int64_t layer = -1, bits = 0, group = 64;
    if (!json_is_object(e)) s = LM_ERRF(LM_ERR_CORRUPT, "%s: not an object", where);
    if (!s) s = lm_json_get_int(e, "layer_idx", &layer, 1, where);
    if (!s) s = lm_json_get_int(e, "bits", &bits, 1, where);
    if (!s) s = lm_json_get_int(e, "group_size", &group, 0, where);
    if (s) break;
    if (layer < 0 || layer >= m->cfg.n_layers)
      s = LM_ERRF(LM_ERR_INVALID, "%s: layer_idx %lld does not exist (%lld layers)", where,
                  (long long)layer, (long long)m->cfg.n_layers);
    else if (m->cfg.layers[layer].kv_shared)
      s = LM_ERRF(LM_ERR_INVALID, "%s: layer %lld has no cache of its own (it reads layer %d's)",
                  where, (long long)layer, m->cfg.layers[layer].donor);
    else
      s = lm_kv_spec_quantize(&specs[m->cfg.layers[layer].cache], (int)bits, (int)group, where);
  }
  json_decref(root);
  return s;
}

/* "turboquant" (k8v3, the width mlx-bun ships) or "turboquant:K:V"; 0 if mode is neither. */
static int parse_turboquant(const char *mode, int *k, int *v) {
  const char *p = "turboquant";
  if (strncmp(mode, p, strlen(p))) return 0;
  mode += strlen(p);
  *k = 8, *v = 3;
  if (!*mode) return 1;
  char *end, *end2;
  if (*mode != ':') return 0;
  long kb = strtol(mode + 1, &end, 10);
  if (end == mode + 1 || *end != ':') return 0;
  long vb = strtol(end + 1, &end2, 10);
  if (end2 == end + 1 || *end2 || kb < 0 || kb > 64 || vb < 0 || vb > 64) return 0;
  *k = (int)kb, *v = (int)vb;
  return 1;
}

/* TurboQuant on every full-attention cache; sliding layers keep their plain rings (there is
 * no rotating TurboQuant, as in mlx-bun). A head dim the codec lacks is refused by name. */
static lm_status plan_turboquant(const lm_model *m, const char *mode, int k, int v,
                                 lm_kv_spec *specs) {
  lm_tq_params p;
  lm_status s = lm_tq_params_init(&p, 64, k, v); /* the widths, whatever the caches */
  if (s) return lm_err_prefix(s, "--kv-quant %s", mode);
  for (int i = 0; i < m->cfg.n_caches; i++) {
    if (specs[i].kind != LM_KV_PLAIN) continue;
    s = lm_tq_params_init(&p, specs[i].head_dim, k, v);
    if (s)
      return lm_err_prefix(s, "--kv-quant %s: cache %d (layer %d)", mode, i, m->cfg.cache_layer[i]);
    specs[i].kind = LM_KV_TURBOQUANT;
    specs[i].bits = k, specs[i].v_bits = v, specs[i].group = LM_TQ_BLOCK;
  }
  return LM_OK;
}

static lm_status plan(const lm_model *m, const lm_kv_options *o, lm_kv_spec *specs);

lm_status lm_model_kv_plan(const lm_model *m, const lm_kv_options *o, lm_kv_spec *specs) {
  LM_TRY(plan(m, o, specs));
  if (o && o->quant_start < 0) return LM_ERRF(LM_ERR_INVALID, "--kv-quant-start must be >= 0");
  for (int i = 0; o && o->quant_start > 0 && i < m->cfg.n_caches; i++)
    if (lm_kv_kind_tq(specs[i].kind))
      return LM_ERRF(LM_ERR_UNSUPPORTED,
                     "--kv-quant-start delays the affine kinds only; a turboquant cache "
                     "quantizes from its first token");
  for (int i = 0; o && i < m->cfg.n_caches; i++)
    if (lm_kv_kind_quant(specs[i].kind)) specs[i].quant_start = o->quant_start;
  return LM_OK;
}

static lm_status plan(const lm_model *m, const lm_kv_options *o, lm_kv_spec *specs) {
  lm_model_kv_specs(m, specs);
  const char *mode = o && o->mode ? o->mode : "off";
  if (!strcmp(mode, "off")) return LM_OK;
  if (!strcmp(mode, "4") || !strcmp(mode, "8")) {
    int group = o->group ? o->group : 64;
    for (int i = 0; i < m->cfg.n_caches; i++) {
      char where[64];
      snprintf(where, sizeof where, "--kv-quant %s (cache %d)", mode, i);
      LM_TRY(lm_kv_spec_quantize(&specs[i], mode[0] - '0', group, where));
    }
    return LM_OK;
  }
  int tk, tv;
  if (parse_turboquant(mode, &tk, &tv)) return plan_turboquant(m, mode, tk, tv, specs);
  if (!strcmp(mode, "config")) {
    char path[4096];
    if (o->config_path)
      snprintf(path, sizeof path, "%s", o->config_path);
    else
      snprintf(path, sizeof path, "%s/kv_config.json", m->dir);
    return apply_config(m, path, specs);
  }
  return LM_ERRF(LM_ERR_INVALID,
                 "--kv-quant must be off, 4, 8, config or turboquant[:K:V] (got '%s')", mode);
}
