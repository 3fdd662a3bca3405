/* gen_config.c — generation_config.json → lm_gen_config (see gen_config.h for the rules). */
#include "sample/gen_config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "io/json_util.h"

void lm_gen_config_clear(lm_gen_config *g) {
  if (!g) return;
  lm_sampling_clear(&g->sampling);
  free(g->eos);
  memset(g, 0, sizeof *g);
  lm_sampling_init(&g->sampling);
}

/* A token id list: an int or an array of ints, each in [0, INT32_MAX]. */
static lm_status get_ids(const json_t *root, const char *key, const char *name, int32_t **out,
                         int32_t *n) {
  const json_t *v = json_object_get(root, key);
  if (!v || json_is_null(v)) return LM_OK;
  size_t cnt = json_is_array(v) ? json_array_size(v) : 1;
  if (!json_is_array(v) && !json_is_integer(v))
    return LM_ERRF(LM_ERR_CORRUPT,
                   "%s: field \"%s\": expected an integer or a list of integers, got %s", name, key,
                   lm_json_type_name(v));
  if (cnt > 1u << 20)
    return LM_ERRF(LM_ERR_CORRUPT, "%s: field \"%s\": %zu ids is too many", name, key, cnt);
  int32_t *ids = malloc((cnt ? cnt : 1) * sizeof *ids);
  if (!ids) return LM_ERRF(LM_ERR_NOMEM, "%s: out of memory", name);
  for (size_t i = 0; i < cnt; i++) {
    const json_t *e = json_is_array(v) ? json_array_get(v, i) : v;
    json_int_t x = json_is_integer(e) ? json_integer_value(e) : -1;
    if (!json_is_integer(e) || x < 0 || x > INT32_MAX) {
      free(ids);
      if (!json_is_integer(e))
        return LM_ERRF(LM_ERR_CORRUPT, "%s: field \"%s\"[%zu]: expected an integer, got %s", name,
                       key, i, lm_json_type_name(e));
      return LM_ERRF(LM_ERR_CORRUPT, "%s: field \"%s\"[%zu]: token id %lld is outside [0, %d]",
                     name, key, i, (long long)x, INT32_MAX);
    }
    ids[i] = (int32_t)x;
  }
  *out = ids;
  *n = (int32_t)cnt;
  return LM_OK;
}

/* An optional number in [lo, hi] (open at lo when lo_open). */
static lm_status get_num(const json_t *root, const char *key, const char *name, double lo,
                         int lo_open, double hi, float *out) {
  double x = *out;
  LM_TRY(lm_json_get_double(root, key, &x, 0, name));
  float f = (float)x; /* checked after the rounding to float: 1e-50 is not a top_p > 0 */
  if (!isfinite(x) || f < lo || (lo_open && f == lo) || f > hi)
    return LM_ERRF(LM_ERR_CORRUPT, "%s: field \"%s\": %g is outside %c%g, %g]", name, key, x,
                   lo_open ? '(' : '[', lo, hi);
  *out = f;
  return LM_OK;
}

static lm_status parse_sampling(const json_t *root, const char *name, lm_gen_config *g) {
  lm_sampling *s = &g->sampling;
  LM_TRY(get_num(root, "temperature", name, 0, 0, 1e6, &s->temperature));
  LM_TRY(get_num(root, "top_p", name, 0, 1, 1, &s->top_p));
  LM_TRY(get_num(root, "min_p", name, 0, 0, 1, &s->min_p));
  LM_TRY(get_num(root, "repetition_penalty", name, 0, 1, 1e6, &s->repeat_penalty));
  int64_t k = 0;
  LM_TRY(lm_json_get_int_range(root, "top_k", &k, 0, name, 0, INT32_MAX));
  s->top_k = (int32_t)k;
  int do_sample = 1;
  LM_TRY(lm_json_get_bool(root, "do_sample", &do_sample, 0, name));
  if (!do_sample) s->temperature = 0;
  LM_TRY(lm_json_get_int_range(root, "max_new_tokens", &g->max_new_tokens, 0, name, 1, INT64_MAX));
  return get_ids(root, "suppress_tokens", name, &s->suppress, &s->n_suppress);
}

/* Fills *g (already cleared) from a parsed file; consumes root. */
static lm_status parse_root(json_t *root, const char *name, lm_gen_config *g) {
  lm_status s = LM_OK;
  if (!json_is_object(root))
    s = LM_ERRF(LM_ERR_CORRUPT, "%s: expected a JSON object, got %s", name,
                lm_json_type_name(root));
  if (!s) s = parse_sampling(root, name, g);
  if (!s) s = get_ids(root, "eos_token_id", name, &g->eos, &g->n_eos);
  json_decref(root);
  if (s)
    lm_gen_config_clear(g);
  else
    g->found = 1;
  return s;
}

lm_status lm_gen_config_parse(const char *json, size_t len, const char *name, lm_gen_config *g) {
  memset(g, 0, sizeof *g);
  lm_gen_config_clear(g);
  json_t *root = NULL;
  LM_TRY(lm_json_load_buf(json, len, name, &root));
  return parse_root(root, name, g);
}

lm_status lm_gen_config_load(const char *model_dir, lm_gen_config *g) {
  memset(g, 0, sizeof *g);
  lm_gen_config_clear(g);
  char path[4096];
  if (snprintf(path, sizeof path, "%s/generation_config.json", model_dir) >= (int)sizeof path)
    return LM_ERRF(LM_ERR_INVALID, "%s: path too long", model_dir);
  json_t *root = NULL;
  lm_status s = lm_json_load_file(path, 1u << 20, &root);
  if (s == LM_ERR_NOT_FOUND) return LM_OK;
  if (s) return s;
  return parse_root(root, path, g);
}

static int cmp_i32(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

lm_status lm_gen_stop_ids(const int *cfg_eos, int n_cfg, const lm_gen_config *g,
                          int32_t tokenizer_eos, int32_t **ids, int32_t *n) {
  *ids = NULL;
  *n = 0;
  int64_t cap = (int64_t)n_cfg + (g ? g->n_eos : 0) + 1;
  int32_t *v = malloc((size_t)cap * sizeof *v);
  if (!v) return LM_ERRF(LM_ERR_NOMEM, "stop ids: out of memory");
  int32_t k = 0;
  for (int i = 0; i < n_cfg; i++)
    if (cfg_eos[i] >= 0) v[k++] = cfg_eos[i];
  for (int32_t i = 0; g && i < g->n_eos; i++)
    v[k++] = g->eos[i];
  if (tokenizer_eos >= 0) v[k++] = tokenizer_eos;
  qsort(v, (size_t)k, sizeof *v, cmp_i32);
  int32_t u = 0;
  for (int32_t i = 0; i < k; i++)
    if (!u || v[i] != v[u - 1]) v[u++] = v[i];
  if (!u) {
    free(v);
    return LM_OK;
  }
  *ids = v;
  *n = u;
  return LM_OK;
}
