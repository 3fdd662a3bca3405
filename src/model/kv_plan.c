/* kv_plan.c — per-cache kinds from --kv-quant and kv_config.json (see kv_plan.h). */
#include "model/kv_plan.h"

#include <jansson.h>
#include <stdio.h>
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

static lm_status plan(const lm_model *m, const lm_kv_options *o, lm_kv_spec *specs);

lm_status lm_model_kv_plan(const lm_model *m, const lm_kv_options *o, lm_kv_spec *specs) {
  LM_TRY(plan(m, o, specs));
  if (o && o->quant_start < 0) return LM_ERRF(LM_ERR_INVALID, "--kv-quant-start must be >= 0");
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
  if (!strcmp(mode, "config")) {
    char path[4096];
    if (o->config_path)
      snprintf(path, sizeof path, "%s", o->config_path);
    else
      snprintf(path, sizeof path, "%s/kv_config.json", m->dir);
    return apply_config(m, path, specs);
  }
  return LM_ERRF(LM_ERR_INVALID, "--kv-quant must be off, 4, 8 or config (got '%s')", mode);
}
