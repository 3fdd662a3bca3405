/* lora_config.c — adapter_config.json of PEFT and mlx-lm adapters (see lora_config.h). */
#include "model/lora_config.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <math.h>
#include <pcre2.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "io/json_util.h"

static int exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* A field that must be absent, false, "none" or empty for lumen to apply the adapter. */
static lm_status refuse_peft(const json_t *root, const char *dir) {
  const json_t *v;
  if ((v = json_object_get(root, "peft_type")) && json_is_string(v) &&
      strcmp(json_string_value(v), "LORA"))
    return LM_ERRF(LM_ERR_UNSUPPORTED, "adapter %s: peft_type %s (lumen applies LORA adapters)",
                   dir, json_string_value(v));
  if ((v = json_object_get(root, "use_dora")) && json_is_true(v))
    return LM_ERRF(LM_ERR_UNSUPPORTED,
                   "adapter %s: DoRA (use_dora) is not supported: its magnitude vectors rescale "
                   "the merged weight, which lumen never forms",
                   dir);
  if ((v = json_object_get(root, "modules_to_save")) && !json_is_null(v) &&
      !(json_is_array(v) && json_array_size(v) == 0))
    return LM_ERRF(LM_ERR_UNSUPPORTED,
                   "adapter %s: modules_to_save (fully trained copies of modules) is not "
                   "supported",
                   dir);
  if ((v = json_object_get(root, "bias")) && json_is_string(v) &&
      strcmp(json_string_value(v), "none"))
    return LM_ERRF(LM_ERR_UNSUPPORTED,
                   "adapter %s: trained biases (bias: \"%s\") are not supported", dir,
                   json_string_value(v));
  if ((v = json_object_get(root, "lora_bias")) && json_is_true(v))
    return LM_ERRF(LM_ERR_UNSUPPORTED, "adapter %s: lora_bias (a bias on lora_B) is not supported",
                   dir);
  if ((v = json_object_get(root, "fan_in_fan_out")) && json_is_true(v))
    return LM_ERRF(LM_ERR_UNSUPPORTED,
                   "adapter %s: fan_in_fan_out (transposed Conv1D weights) is not a Gemma layout",
                   dir);
  return LM_OK;
}

static lm_status load_peft(const char *dir, lm_lora_cfg *c) {
  LM_TRY(refuse_peft(c->root, dir));
  char ctx[1100];
  snprintf(ctx, sizeof ctx, "%s/adapter_config.json", dir);
  LM_TRY(lm_json_get_int_range(c->root, "r", &c->r, 1, ctx, 1, 65536));
  LM_TRY(lm_json_get_double(c->root, "lora_alpha", &c->alpha, 1, ctx));
  c->rslora = 0;
  LM_TRY(lm_json_get_bool(c->root, "use_rslora", &c->rslora, 0, ctx));
  const json_t *rp = json_object_get(c->root, "rank_pattern"),
               *ap = json_object_get(c->root, "alpha_pattern");
  if ((rp && !json_is_null(rp) && !json_is_object(rp)) ||
      (ap && !json_is_null(ap) && !json_is_object(ap)))
    return LM_ERRF(LM_ERR_CORRUPT, "%s: rank_pattern and alpha_pattern must be objects", ctx);
  c->rank_pattern = json_is_object(rp) ? rp : NULL;
  c->alpha_pattern = json_is_object(ap) ? ap : NULL;
  return LM_OK;
}

/* mlx-lm: {"fine_tune_type": "lora", "lora_parameters": {"rank", "scale", ...}}; older files
 * say "use_dora" instead of the type. A missing scale is mlx-lm's default, 20. */
static lm_status load_mlx(const char *dir, lm_lora_cfg *c) {
  const json_t *v = json_object_get(c->root, "fine_tune_type"), *lp;
  const char *type = json_is_string(v) ? json_string_value(v) : "lora";
  if ((v = json_object_get(c->root, "use_dora")) && json_is_true(v)) type = "dora";
  if (!strcmp(type, "dora"))
    return LM_ERRF(LM_ERR_UNSUPPORTED, "adapter %s: DoRA (fine_tune_type dora) is not supported",
                   dir);
  if (strcmp(type, "lora"))
    return LM_ERRF(LM_ERR_UNSUPPORTED,
                   "adapter %s: fine_tune_type %s is not a LoRA adapter (lumen applies lora)", dir,
                   type);
  c->scale = 20.0;
  if ((lp = json_object_get(c->root, "lora_parameters")) && json_is_object(lp)) {
    char ctx[1100];
    snprintf(ctx, sizeof ctx, "%s/adapter_config.json lora_parameters", dir);
    LM_TRY(lm_json_get_double(lp, "scale", &c->scale, 0, ctx));
  }
  if (!isfinite(c->scale))
    return LM_ERRF(LM_ERR_CORRUPT, "adapter %s: lora_parameters.scale is not finite", dir);
  return LM_OK;
}

lm_status lm_lora_cfg_load(const char *dir, lm_lora_cfg *c, char *weights, size_t n) {
  memset(c, 0, sizeof *c);
  char path[1100];
  snprintf(path, sizeof path, "%s/adapter_config.json", dir);
  if (!exists(path))
    return LM_ERRF(LM_ERR_NOT_FOUND,
                   "adapter %s: no adapter_config.json (a PEFT or mlx-lm "
                   "adapter directory holds one)",
                   dir);
  LM_TRY(lm_json_load_file(path, 0, &c->root));
  if (!json_is_object(c->root)) {
    lm_lora_cfg_free(c);
    return LM_ERRF(LM_ERR_CORRUPT, "%s: not a JSON object", path);
  }
  snprintf(weights, n, "%s/adapter_model.safetensors", dir);
  c->peft = exists(weights);
  if (!c->peft) snprintf(weights, n, "%s/adapters.safetensors", dir);
  lm_status s = LM_OK;
  if (!c->peft && !exists(weights))
    s = LM_ERRF(LM_ERR_NOT_FOUND,
                "adapter %s: neither adapter_model.safetensors (PEFT) nor adapters.safetensors "
                "(mlx-lm); a PEFT adapter saved as .bin must be saved again with safetensors",
                dir);
  if (!s) s = c->peft ? load_peft(dir, c) : load_mlx(dir, c);
  if (s) lm_lora_cfg_free(c);
  return s;
}

void lm_lora_cfg_free(lm_lora_cfg *c) {
  json_decref(c->root);
  memset(c, 0, sizeof *c);
}

/* PEFT's get_pattern_key: the first key of the pattern object for which module matches the
 * regular expression (.*\.)?(KEY)$ from its start; NULL when none does (or the key is not a
 * valid expression, which PEFT would reject too). */
static const char *pattern_key(const json_t *pat, const char *module) {
  const char *key;
  const json_t *val;
  json_object_foreach((json_t *)pat, key, val) {
    char re[1024];
    snprintf(re, sizeof re, "(.*\\.)?(%s)$", key);
    int err;
    PCRE2_SIZE at;
    pcre2_code *code =
        pcre2_compile((PCRE2_SPTR)re, PCRE2_ZERO_TERMINATED, PCRE2_ANCHORED, &err, &at, NULL);
    if (!code) continue;
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(code, NULL);
    int rc = md ? pcre2_match(code, (PCRE2_SPTR)module, strlen(module), 0, 0, md, NULL) : -1;
    pcre2_match_data_free(md);
    pcre2_code_free(code);
    (void)val;
    if (rc >= 0) return key;
  }
  return NULL;
}

lm_status lm_lora_cfg_scale(const lm_lora_cfg *c, const char *module, int rank, float *scale) {
  if (!c->peft) {
    *scale = (float)c->scale;
    return LM_OK;
  }
  double r = (double)c->r, alpha = c->alpha;
  const char *k;
  if (c->rank_pattern && (k = pattern_key(c->rank_pattern, module))) {
    const json_t *v = json_object_get(c->rank_pattern, k);
    if (!json_is_integer(v) || json_integer_value(v) < 1)
      return LM_ERRF(LM_ERR_CORRUPT, "adapter_config.json rank_pattern[\"%s\"]: not a rank", k);
    r = (double)json_integer_value(v);
  }
  if (c->alpha_pattern && (k = pattern_key(c->alpha_pattern, module))) {
    const json_t *v = json_object_get(c->alpha_pattern, k);
    if (!json_is_number(v))
      return LM_ERRF(LM_ERR_CORRUPT, "adapter_config.json alpha_pattern[\"%s\"]: not a number", k);
    alpha = json_number_value(v);
  }
  if ((double)rank != r)
    return LM_ERRF(LM_ERR_CORRUPT,
                   "adapter: %s has rank %d in its tensors but %g in adapter_config.json", module,
                   rank, r);
  *scale = (float)(c->rslora ? alpha / sqrt(r) : alpha / r);
  return LM_OK;
}
