/* quant_config.c — the MLX quantization map of config.json (gemma4-spec §8.2):
 *   "quantization": {"group_size": 64, "bits": 4, "mode": "affine",
 *                    "<module path>": {"group_size": 64, "bits": 8} | false, ...}
 * Top-level group_size/bits/mode are defaults; every other key names a module. Whether a
 * module is quantized at all is decided by the presence of its ".scales" tensor. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "io/json_util.h"
#include "model/model.h"

static int valid_bits(int64_t b) { return b >= 2 && b <= 8 && b != 7; }
static int valid_group(int64_t g) { return g == 32 || g == 64 || g == 128; }

static lm_status check_mode(const json_t *o, const char *path, const char *where) {
  const json_t *mode = json_object_get(o, "mode");
  if (!mode) return LM_OK;
  if (!json_is_string(mode))
    return LM_ERRF(LM_ERR_CORRUPT, "%s: quantization %s: mode must be a string", path, where);
  if (strcmp(json_string_value(mode), "affine"))
    return LM_ERRF(
        LM_ERR_UNSUPPORTED,
        "%s: quantization mode '%s' (%s) is not supported; lumen reads MLX affine quantization",
        path, json_string_value(mode), where);
  return LM_OK;
}

static lm_status parse_params(const json_t *o, const char *path, const char *where, int *bits,
                              int *group) {
  int64_t b = *bits, g = *group;
  LM_TRY(check_mode(o, path, where));
  LM_TRY(lm_json_get_int(o, "bits", &b, 0, where));
  LM_TRY(lm_json_get_int(o, "group_size", &g, 0, where));
  if (!valid_bits(b))
    return LM_ERRF(LM_ERR_UNSUPPORTED,
                   "%s: quantization %s: %lld bits is not supported (2, 3, 4, 5, 6, 8)", path,
                   where, (long long)b);
  if (!valid_group(g))
    return LM_ERRF(LM_ERR_UNSUPPORTED,
                   "%s: quantization %s: group size %lld is not supported (32, 64, 128)", path,
                   where, (long long)g);
  *bits = (int)b;
  *group = (int)g;
  return LM_OK;
}

static lm_status parse_block(const json_t *blk, const char *path, lm_quant_config *q) {
  if (!json_is_object(blk))
    return LM_ERRF(LM_ERR_CORRUPT, "%s: quantization must be an object", path);
  const json_t *qm = json_object_get(blk, "quant_method");
  if (qm) /* transformers-style quantizers (gptq, awq, fp8, bitsandbytes, ...) */
    return LM_ERRF(LM_ERR_UNSUPPORTED,
                   "%s: quant_method '%s' is not supported; lumen reads MLX affine quantization",
                   path, json_is_string(qm) ? json_string_value(qm) : "?");
  q->present = 1;
  q->bits = 4;
  q->group = 64;
  LM_TRY(parse_params(blk, path, "defaults", &q->bits, &q->group));
  q->entries = calloc(json_object_size(blk) + 1, sizeof *q->entries);
  if (!q->entries) return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  const char *key;
  const json_t *v;
  json_object_foreach((json_t *)blk, key, v) {
    if (!strcmp(key, "bits") || !strcmp(key, "group_size") || !strcmp(key, "mode")) continue;
    lm_quant_entry *e = &q->entries[q->n];
    if (json_is_false(v)) {
      e->bits = e->group = 0;
    } else if (json_is_object(v)) {
      e->bits = q->bits;
      e->group = q->group;
      LM_TRY(parse_params(v, path, key, &e->bits, &e->group));
    } else {
      continue; /* other scalar keys some converters write (e.g. "quant_method") carry no module */
    }
    if (!(e->path = strdup(key))) return LM_ERRF(LM_ERR_NOMEM, "out of memory");
    q->n++;
  }
  return LM_OK;
}

lm_status lm_quant_config_parse(const char *config_path, lm_quant_config *q) {
  memset(q, 0, sizeof *q);
  json_t *root;
  LM_TRY(lm_json_load_file(config_path, 0, &root));
  const json_t *blk = json_object_get(root, "quantization");
  if (!blk) blk = json_object_get(root, "quantization_config");
  lm_status s = LM_OK;
  if (blk && !json_is_null(blk)) s = parse_block(blk, config_path, q);
  json_decref(root);
  if (s) lm_quant_config_free(q);
  return s;
}

void lm_quant_config_free(lm_quant_config *q) {
  if (!q) return;
  for (int i = 0; i < q->n; i++)
    free(q->entries[i].path);
  free(q->entries);
  memset(q, 0, sizeof *q);
}
