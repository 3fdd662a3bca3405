/* config.c — config.json → lm_model_config for Gemma 4 (transformers
 * configuration_gemma4.py Gemma4TextConfig.__post_init__ and Gemma4TextAttention.__init__).
 * Defaults are HF 5.17's; the geometry fields real checkpoints always carry are required. */
#include "model/config.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "io/file_util.h"

const char *lm_layer_type_name(lm_layer_type t) {
  return t == LM_LAYER_FULL ? "full_attention" : "sliding_attention";
}

/* ---- typed field access with messages naming the file and the field ---------------------- */

typedef struct cfg_ctx {
  const char *name;   /* file name for messages */
  const json_t *text; /* text_config, or the root when flat */
  const json_t *root;
} cfg_ctx;

/* Looks a key up in text_config first, then at the top level (mlx-lm's rule). */
static const json_t *cfg_get(const cfg_ctx *c, const char *key) {
  const json_t *v = json_object_get(c->text, key);
  if (!v && c->text != c->root) v = json_object_get(c->root, key);
  return v;
}

static lm_status cfg_int(const cfg_ctx *c, const char *key, int required, int64_t def,
                         int64_t *out) {
  const json_t *v = cfg_get(c, key);
  if (!v || json_is_null(v)) {
    if (required) return LM_ERRF(LM_ERR_NOT_FOUND, "%s: missing required field '%s'", c->name, key);
    *out = def;
    return LM_OK;
  }
  if (!json_is_integer(v))
    return LM_ERRF(LM_ERR_CORRUPT, "%s: field '%s' must be an integer", c->name, key);
  *out = json_integer_value(v);
  return LM_OK;
}

static lm_status cfg_num(const cfg_ctx *c, const char *key, double def, double *out) {
  const json_t *v = cfg_get(c, key);
  if (!v || json_is_null(v)) {
    *out = def;
    return LM_OK;
  }
  if (!json_is_number(v))
    return LM_ERRF(LM_ERR_CORRUPT, "%s: field '%s' must be a number", c->name, key);
  *out = json_number_value(v);
  return LM_OK;
}

static lm_status cfg_bool(const cfg_ctx *c, const char *key, int def, int *out) {
  const json_t *v = cfg_get(c, key);
  if (!v || json_is_null(v)) {
    *out = def;
    return LM_OK;
  }
  if (!json_is_boolean(v))
    return LM_ERRF(LM_ERR_CORRUPT, "%s: field '%s' must be a boolean", c->name, key);
  *out = json_is_true(v);
  return LM_OK;
}

/* Checks a geometry value against a sane range; a hostile config must not size allocations. */
static lm_status cfg_range(const cfg_ctx *c, const char *key, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi)
    return LM_ERRF(LM_ERR_CORRUPT, "%s: field '%s' = %lld is outside [%lld, %lld]", c->name, key,
                   (long long)v, (long long)lo, (long long)hi);
  return LM_OK;
}

/* ---- sections ------------------------------------------------------------------------------ */

static lm_status cfg_model_type(const cfg_ctx *c, lm_model_config *m) {
  const json_t *rt = json_object_get(c->root, "model_type"),
               *tt = json_object_get(c->text, "model_type");
  if (!rt && !tt)
    return LM_ERRF(LM_ERR_NOT_FOUND, "%s: missing required field 'model_type'", c->name);
  if ((rt && !json_is_string(rt)) || (tt && !json_is_string(tt)))
    return LM_ERRF(LM_ERR_CORRUPT, "%s: field 'model_type' must be a string", c->name);
  snprintf(m->model_type, sizeof m->model_type, "%s", json_string_value(rt ? rt : tt));
  snprintf(m->text_model_type, sizeof m->text_model_type, "%s", json_string_value(tt ? tt : rt));
  static const char *ok[] = {"gemma4", "gemma4_text", "gemma4_unified", "gemma4_unified_text"};
  for (size_t i = 0; i < 4; i++)
    if (!strcmp(m->model_type, ok[i])) return LM_OK;
  return LM_ERRF(
      LM_ERR_UNSUPPORTED,
      "%s: model_type '%s' is not supported (lumen runs gemma4, gemma4_text, gemma4_unified, "
      "gemma4_unified_text)",
      c->name, m->model_type);
}

static lm_status cfg_scalars(const cfg_ctx *c, lm_model_config *m) {
  /* Gemma4UnifiedTextConfig (the 12B) has no PLE and no MoE fields at all and a 1024 window
   * by default; its model ignores such keys if a config carries them, and so do we. */
  int unified = strstr(m->model_type, "unified") || strstr(m->text_model_type, "unified");
  LM_TRY(cfg_int(c, "vocab_size", 1, 0, &m->vocab_size));
  LM_TRY(cfg_range(c, "vocab_size", m->vocab_size, 1, 1 << 24));
  LM_TRY(cfg_int(c, "hidden_size", 1, 0, &m->hidden));
  LM_TRY(cfg_range(c, "hidden_size", m->hidden, 1, 1 << 16));
  LM_TRY(cfg_int(c, "intermediate_size", 1, 0, &m->ffn_dim));
  LM_TRY(cfg_range(c, "intermediate_size", m->ffn_dim, 1, 1 << 20));
  LM_TRY(cfg_int(c, "num_hidden_layers", 1, 0, &m->n_layers));
  LM_TRY(cfg_range(c, "num_hidden_layers", m->n_layers, 1, 1024));
  LM_TRY(cfg_int(c, "num_attention_heads", 1, 0, &m->n_heads));
  LM_TRY(cfg_range(c, "num_attention_heads", m->n_heads, 1, 1024));
  LM_TRY(cfg_int(c, "num_key_value_heads", 1, 0, &m->n_kv_heads));
  LM_TRY(cfg_range(c, "num_key_value_heads", m->n_kv_heads, 1, m->n_heads));
  LM_TRY(cfg_int(c, "head_dim", 1, 0, &m->head_dim));
  LM_TRY(cfg_range(c, "head_dim", m->head_dim, 2, 8192));
  LM_TRY(cfg_int(c, "global_head_dim", 0, 512, &m->global_head_dim));
  LM_TRY(cfg_range(c, "global_head_dim", m->global_head_dim, 2, 8192));
  LM_TRY(cfg_num(c, "rms_norm_eps", 1e-6, &m->rms_eps));
  /* the context limit sizes every cache: 0, negative or beyond 16M positions is a broken file */
  LM_TRY(cfg_int(c, "max_position_embeddings", 0, 0, &m->max_positions));
  const json_t *mp = cfg_get(c, "max_position_embeddings");
  if (mp && !json_is_null(mp))
    LM_TRY(cfg_range(c, "max_position_embeddings", m->max_positions, 1, LM_CFG_MAX_POSITIONS));
  LM_TRY(cfg_int(c, "sliding_window", 0, unified ? 1024 : 512, &m->sliding_window));
  LM_TRY(cfg_range(c, "sliding_window", m->sliding_window, 1,
                   m->max_positions > 0 ? m->max_positions : LM_CFG_MAX_POSITIONS));
  LM_TRY(cfg_num(c, "final_logit_softcapping", 0.0, &m->final_softcap));
  if (!(m->final_softcap >= 0 && m->final_softcap < 1e30))
    return LM_ERRF(LM_ERR_CORRUPT,
                   "%s: field 'final_logit_softcapping' = %g must be 0 (none) or positive", c->name,
                   m->final_softcap);
  LM_TRY(cfg_int(c, "vocab_size_per_layer_input", 0, 262144, &m->ple_vocab));
  LM_TRY(cfg_int(c, "hidden_size_per_layer_input", 0, 256, &m->ple_dim));
  LM_TRY(cfg_range(c, "hidden_size_per_layer_input", m->ple_dim, 0, 1 << 16));
  if (unified) m->ple_dim = 0;
  if (m->ple_dim) LM_TRY(cfg_range(c, "vocab_size_per_layer_input", m->ple_vocab, 1, 1 << 24));
  LM_TRY(cfg_bool(c, "attention_k_eq_v", 0, &m->k_eq_v));
  int64_t v;
  LM_TRY(cfg_int(c, "num_kv_shared_layers", 0, 0, &v));
  LM_TRY(cfg_range(c, "num_kv_shared_layers", v, 0, m->n_layers - 1));
  m->n_kv_shared = (int)v;
  LM_TRY(cfg_bool(c, "use_double_wide_mlp", 0, &m->double_wide));
  LM_TRY(cfg_bool(c, "enable_moe_block", 0, &m->moe));
  if (unified) m->moe = 0;
  LM_TRY(cfg_bool(c, "tie_word_embeddings", 1, &m->tie_embeddings));
  if (!m->tie_embeddings)
    return LM_ERRF(LM_ERR_UNSUPPORTED, "%s: tie_word_embeddings=false is not a Gemma 4 layout",
                   c->name);
  if (m->moe) {
    LM_TRY(cfg_int(c, "num_experts", 1, 0, &m->n_experts));
    LM_TRY(cfg_range(c, "num_experts", m->n_experts, 1, 4096));
    LM_TRY(cfg_int(c, "top_k_experts", 1, 0, &m->top_k));
    LM_TRY(cfg_range(c, "top_k_experts", m->top_k, 1, m->n_experts));
    LM_TRY(cfg_int(c, "moe_intermediate_size", 1, 0, &m->moe_dim));
    LM_TRY(cfg_range(c, "moe_intermediate_size", m->moe_dim, 1, 1 << 20));
  }
  const json_t *bidi = cfg_get(c, "use_bidirectional_attention");
  if (bidi && json_is_string(bidi) && !strcmp(json_string_value(bidi), "all"))
    return LM_ERRF(LM_ERR_UNSUPPORTED,
                   "%s: use_bidirectional_attention='all' (an encoder) is not supported", c->name);
  return LM_OK;
}

/* eos_token_id may be an int or a list, in text_config or at the top level. */
static lm_status cfg_tokens(const cfg_ctx *c, lm_model_config *m) {
  int64_t v;
  LM_TRY(cfg_int(c, "bos_token_id", 0, 2, &v));
  m->bos_id = (int)v;
  LM_TRY(cfg_int(c, "pad_token_id", 0, 0, &v));
  m->pad_id = (int)v;
  const json_t *e = cfg_get(c, "eos_token_id");
  m->n_eos = 0;
  if (!e || json_is_null(e)) {
    m->eos_ids[m->n_eos++] = 1;
  } else if (json_is_integer(e)) {
    m->eos_ids[m->n_eos++] = (int)json_integer_value(e);
  } else if (json_is_array(e)) {
    size_t i;
    const json_t *x;
    json_array_foreach(e, i, x) {
      if (!json_is_integer(x))
        return LM_ERRF(LM_ERR_CORRUPT, "%s: eos_token_id[%zu] is not an integer", c->name, i);
      if (m->n_eos < 16) m->eos_ids[m->n_eos++] = (int)json_integer_value(x);
    }
  } else {
    return LM_ERRF(LM_ERR_CORRUPT, "%s: eos_token_id must be an integer or a list", c->name);
  }
  return LM_OK;
}

static lm_status cfg_rope_one(const cfg_ctx *c, const json_t *rp, lm_layer_type t,
                              lm_rope_config *r) {
  const char *tn = lm_layer_type_name(t);
  /* HF defaults (configuration_gemma4.py __post_init__). */
  r->theta = t == LM_LAYER_FULL ? 1e6 : 1e4;
  r->partial_rotary_factor = t == LM_LAYER_FULL ? 0.25 : 1.0;
  r->factor = 1.0;
  r->proportional = t == LM_LAYER_FULL;
  const json_t *p = rp ? json_object_get(rp, tn) : NULL;
  if (!p) return LM_OK;
  if (!json_is_object(p))
    return LM_ERRF(LM_ERR_CORRUPT, "%s: rope_parameters.%s must be an object", c->name, tn);
  const json_t *ty = json_object_get(p, "rope_type"), *th = json_object_get(p, "rope_theta"),
               *pf = json_object_get(p, "partial_rotary_factor"),
               *fa = json_object_get(p, "factor");
  if (ty && !json_is_string(ty))
    return LM_ERRF(LM_ERR_CORRUPT, "%s: rope_parameters.%s.rope_type", c->name, tn);
  const char *tys = ty ? json_string_value(ty) : "default";
  if (!strcmp(tys, "default")) {
    r->proportional = 0;
    r->partial_rotary_factor =
        1.0; /* the default init ignores it (compute_default_rope_parameters) */
  } else if (!strcmp(tys, "proportional")) {
    r->proportional = 1;
    r->partial_rotary_factor = 1.0;
  } else {
    return LM_ERRF(LM_ERR_UNSUPPORTED, "%s: rope_parameters.%s.rope_type '%s' is not supported",
                   c->name, tn, tys);
  }
  if (th) {
    if (!json_is_number(th))
      return LM_ERRF(LM_ERR_CORRUPT, "%s: rope_parameters.%s.rope_theta", c->name, tn);
    r->theta = json_number_value(th);
  }
  if (pf && r->proportional) {
    if (!json_is_number(pf))
      return LM_ERRF(LM_ERR_CORRUPT, "%s: rope_parameters.%s.partial_rotary_factor", c->name, tn);
    r->partial_rotary_factor = json_number_value(pf);
  }
  if (fa) {
    if (!json_is_number(fa) || json_number_value(fa) <= 0)
      return LM_ERRF(LM_ERR_CORRUPT, "%s: rope_parameters.%s.factor must be a positive number",
                     c->name, tn);
    r->factor = json_number_value(fa);
  }
  if (!(r->theta > 0) || !(r->partial_rotary_factor >= 0 && r->partial_rotary_factor <= 1))
    return LM_ERRF(LM_ERR_CORRUPT,
                   "%s: rope_parameters.%s has an invalid theta or partial_rotary_factor", c->name,
                   tn);
  return LM_OK;
}

static lm_status cfg_layer_types(const cfg_ctx *c, lm_model_config *m) {
  const json_t *lt = cfg_get(c, "layer_types");
  for (int64_t l = 0; l < m->n_layers; l++) /* HF default: 5 sliding : 1 full */
    m->layers[l].type = ((l + 1) % 6) ? LM_LAYER_SLIDING : LM_LAYER_FULL;
  if (lt && !json_is_null(lt)) {
    if (!json_is_array(lt) || (int64_t)json_array_size(lt) != m->n_layers)
      return LM_ERRF(LM_ERR_CORRUPT,
                     "%s: layer_types must be a list of num_hidden_layers (%lld) strings", c->name,
                     (long long)m->n_layers);
    for (int64_t l = 0; l < m->n_layers; l++) {
      const char *s = json_string_value(json_array_get(lt, (size_t)l));
      if (s && !strcmp(s, "sliding_attention"))
        m->layers[l].type = LM_LAYER_SLIDING;
      else if (s && !strcmp(s, "full_attention"))
        m->layers[l].type = LM_LAYER_FULL;
      else
        return LM_ERRF(LM_ERR_CORRUPT,
                       "%s: layer_types[%lld] must be sliding_attention or full_attention", c->name,
                       (long long)l);
    }
  }
  m->layers[m->n_layers - 1].type = LM_LAYER_FULL; /* HF forces the last layer to full attention */
  return LM_OK;
}

/* per_layer_config (the form transformers 5.17 writes) wins over global_head_dim /
 * num_global_key_value_heads (the published form). Keys are layer indices as strings. */
static lm_status cfg_per_layer(const cfg_ctx *c, lm_model_config *m) {
  int64_t n_global_kv = 0;
  LM_TRY(cfg_int(c, "num_global_key_value_heads", 0, 0, &n_global_kv));
  for (int64_t l = 0; l < m->n_layers; l++) {
    lm_layer_config *L = &m->layers[l];
    int full = L->type == LM_LAYER_FULL;
    L->head_dim = (int)(full ? m->global_head_dim : m->head_dim);
    L->n_kv_heads = (int)((full && m->k_eq_v && n_global_kv) ? n_global_kv : m->n_kv_heads);
  }
  const json_t *plc = cfg_get(c, "per_layer_config");
  if (!plc || json_is_null(plc)) return LM_OK;
  if (!json_is_object(plc))
    return LM_ERRF(LM_ERR_CORRUPT, "%s: per_layer_config must be an object", c->name);
  for (int64_t l = 0; l < m->n_layers; l++) /* present: it is the whole truth for full layers */
    if (m->layers[l].type == LM_LAYER_FULL) {
      m->layers[l].head_dim = (int)m->head_dim;
      m->layers[l].n_kv_heads = (int)m->n_kv_heads;
    }
  const char *key;
  const json_t *o;
  json_object_foreach((json_t *)plc, key, o) {
    char *end;
    long idx = strtol(key, &end, 10);
    if (*key == '\0' || *end != '\0' || idx < 0 || idx >= m->n_layers)
      return LM_ERRF(LM_ERR_CORRUPT, "%s: per_layer_config key '%s' is not a layer index", c->name,
                     key);
    if (!json_is_object(o))
      return LM_ERRF(LM_ERR_CORRUPT, "%s: per_layer_config.%s must be an object", c->name, key);
    const char *f;
    const json_t *v;
    json_object_foreach((json_t *)o, f, v) {
      if (!json_is_integer(v))
        return LM_ERRF(LM_ERR_CORRUPT, "%s: per_layer_config.%s.%s must be an integer", c->name,
                       key, f);
      int64_t x = json_integer_value(v);
      if (!strcmp(f, "head_dim") && x >= 2 && x <= 8192)
        m->layers[idx].head_dim = (int)x;
      else if (!strcmp(f, "num_key_value_heads") && x >= 1 && x <= m->n_heads)
        m->layers[idx].n_kv_heads = (int)x;
      else
        return LM_ERRF(LM_ERR_UNSUPPORTED, "%s: per_layer_config.%s.%s = %lld is not supported",
                       c->name, key, f, (long long)x);
    }
  }
  return LM_OK;
}

/* Donors, caches and MLP widths (gemma4-spec §1.2). */
static lm_status cfg_resolve(const cfg_ctx *c, lm_model_config *m) {
  int64_t first_shared = m->n_layers - m->n_kv_shared;
  int last_of[LM_LAYER_TYPES] = {-1, -1};
  m->n_caches = 0;
  for (int64_t l = 0; l < m->n_layers; l++) {
    lm_layer_config *L = &m->layers[l];
    if (m->n_heads % L->n_kv_heads)
      return LM_ERRF(LM_ERR_CORRUPT,
                     "%s: layer %lld: num_attention_heads %lld is not a multiple of %d KV heads",
                     c->name, (long long)l, (long long)m->n_heads, L->n_kv_heads);
    if (L->head_dim % 2)
      return LM_ERRF(LM_ERR_CORRUPT, "%s: layer %lld: head_dim %d is odd", c->name, (long long)l,
                     L->head_dim);
    L->k_eq_v = m->k_eq_v && L->type == LM_LAYER_FULL;
    L->kv_shared = m->n_kv_shared > 0 && l >= first_shared;
    L->ffn_dim = m->ffn_dim * ((m->double_wide && L->kv_shared && first_shared > 0) ? 2 : 1);
    if (!L->kv_shared) {
      L->donor = (int)l;
      L->cache = m->n_caches++;
      last_of[L->type] = (int)l;
    } else {
      if (last_of[L->type] < 0)
        return LM_ERRF(LM_ERR_CORRUPT,
                       "%s: KV-shared layer %lld has no earlier %s layer to share with", c->name,
                       (long long)l, lm_layer_type_name(L->type));
      L->donor = last_of[L->type];
      L->cache = m->layers[L->donor].cache;
      if (m->layers[L->donor].head_dim != L->head_dim ||
          m->layers[L->donor].n_kv_heads != L->n_kv_heads)
        return LM_ERRF(LM_ERR_CORRUPT,
                       "%s: KV-shared layer %lld and its donor %d differ in geometry", c->name,
                       (long long)l, L->donor);
    }
  }
  m->cache_layer = calloc((size_t)m->n_caches, sizeof *m->cache_layer);
  if (!m->cache_layer) return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  for (int64_t l = 0; l < m->n_layers; l++)
    if (!m->layers[l].kv_shared) m->cache_layer[m->layers[l].cache] = (int)l;
  /* One RoPE table per layer type: all layers of a type must share a head dim. */
  for (int t = 0; t < LM_LAYER_TYPES; t++) {
    m->rope[t].dim = 0;
    for (int64_t l = 0; l < m->n_layers; l++) {
      if ((int)m->layers[l].type != t) continue;
      if (!m->rope[t].dim)
        m->rope[t].dim = m->layers[l].head_dim;
      else if (m->rope[t].dim != m->layers[l].head_dim)
        return LM_ERRF(LM_ERR_UNSUPPORTED, "%s: %s layers with different head dims", c->name,
                       lm_layer_type_name((lm_layer_type)t));
    }
  }
  return LM_OK;
}

lm_status lm_config_parse(const char *json, size_t len, const char *name, lm_model_config *m) {
  memset(m, 0, sizeof *m);
  json_error_t jerr;
  json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
  if (!root)
    return LM_ERRF(LM_ERR_CORRUPT, "%s: invalid JSON at line %d column %d: %s", name, jerr.line,
                   jerr.column, jerr.text);
  lm_status s = LM_OK;
  if (!json_is_object(root)) {
    s = LM_ERRF(LM_ERR_CORRUPT, "%s: top level is not a JSON object", name);
    goto done;
  }
  cfg_ctx c = {name, root, root};
  const json_t *tc = json_object_get(root, "text_config");
  if (tc && json_is_object(tc))
    c.text = tc;
  else if (tc && !json_is_null(tc)) {
    s = LM_ERRF(LM_ERR_CORRUPT, "%s: text_config must be an object", name);
    goto done;
  }
  if ((s = cfg_model_type(&c, m)) || (s = cfg_scalars(&c, m)) || (s = cfg_tokens(&c, m))) goto done;
  const json_t *rp = cfg_get(&c, "rope_parameters");
  if (rp && !json_is_null(rp) && !json_is_object(rp)) {
    s = LM_ERRF(LM_ERR_CORRUPT, "%s: rope_parameters must be an object", name);
    goto done;
  }
  for (int t = 0; t < LM_LAYER_TYPES && !s; t++)
    s = cfg_rope_one(&c, rp, (lm_layer_type)t, &m->rope[t]);
  if (s) goto done;
  m->layers = calloc((size_t)m->n_layers, sizeof *m->layers);
  if (!m->layers) {
    s = LM_ERRF(LM_ERR_NOMEM, "out of memory");
    goto done;
  }
  if ((s = cfg_layer_types(&c, m)) || (s = cfg_per_layer(&c, m)) || (s = cfg_resolve(&c, m)))
    goto done;
done:
  json_decref(root);
  if (s) lm_config_free(m);
  return s;
}

lm_status lm_config_load(const char *path, lm_model_config *out) {
  memset(out, 0, sizeof *out);
  FILE *f;
  LM_TRY(lm_file_fopen_regular(path, &f));
  char *buf = NULL;
  long n = -1;
  if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && n <= (64l << 20) &&
      fseek(f, 0, SEEK_SET) == 0)
    buf = malloc((size_t)n + 1);
  lm_status s;
  if (!buf)
    s = LM_ERRF(n > (64l << 20) ? LM_ERR_CORRUPT : LM_ERR_IO,
                "%s: cannot read (or larger than 64 MB)", path);
  else if (fread(buf, 1, (size_t)n, f) != (size_t)n)
    s = LM_ERRF(LM_ERR_IO, "%s: read failed", path);
  else
    s = lm_config_parse(buf, (size_t)n, path, out);
  free(buf);
  fclose(f);
  return s;
}

void lm_config_free(lm_model_config *c) {
  if (!c) return;
  free(c->layers);
  free(c->cache_layer);
  c->layers = NULL;
  c->cache_layer = NULL;
}
