/* tokenizer_config.c — BOS/EOS: which ids they are and whether encode adds them.
 *
 * The post-processor template gives the default ids around the text. tokenizer_config.json, when
 * the tokenizer was loaded from a directory, overrides it the way transformers' fast tokenizers
 * rebuild the template (`update_post_processor`): add_bos_token / add_eos_token switch the BOS
 * at the front / the EOS at the end on or off; bos_token / eos_token name the tokens. */
#include <string.h>

#include "io/file_util.h"
#include "text/tokenizer_impl.h"

/* A token named in the config: "text", {"content": "text", ...} or null. */
static lm_status config_token(const lm_tokenizer *t, const json_t *cfg, const char *key,
                              const char *path, int *present, int32_t *id) {
  const json_t *v = json_object_get(cfg, key);
  *present = v != NULL;
  *id = -1;
  if (!v || json_is_null(v)) return LM_OK;
  if (json_is_object(v)) v = json_object_get(v, "content");
  if (!json_is_string(v))
    return LM_ERRF(LM_ERR_CORRUPT, "%s: \"%s\" is neither a string nor {\"content\": ...}", path,
                   key);
  *id = lm_tokenizer_find(t, json_string_value(v), json_string_length(v));
  return LM_OK;
}

static int32_t find_first(const lm_tokenizer *t, const char *const *names) {
  for (; *names; names++) {
    int32_t id = lm_tokenizer_find(t, *names, strlen(*names));
    if (id >= 0) return id;
  }
  return -1;
}

static lm_status config_flag(const json_t *cfg, const char *key, const char *path, int *flag) {
  const json_t *v = json_object_get(cfg, key);
  *flag = -1; /* absent: keep the template */
  if (!v || json_is_null(v)) return LM_OK;
  if (!json_is_boolean(v)) return LM_ERRF(LM_ERR_CORRUPT, "%s: \"%s\" is not a boolean", path, key);
  *flag = json_is_true(v);
  return LM_OK;
}

static lm_status set_front(lm_tids *v, int32_t id, int on) {
  int has = v->n > 0 && v->v[0] == id;
  if (on && !has) {
    LM_TRY(lm_tids_push(v, id));
    memmove(v->v + 1, v->v, (v->n - 1) * sizeof *v->v);
    v->v[0] = id;
  } else if (!on && has) {
    memmove(v->v, v->v + 1, (v->n - 1) * sizeof *v->v);
    v->n--;
  }
  return LM_OK;
}

static lm_status set_back(lm_tids *v, int32_t id, int on) {
  int has = v->n > 0 && v->v[v->n - 1] == id;
  if (on && !has) return lm_tids_push(v, id);
  if (!on && has) v->n--;
  return LM_OK;
}

static lm_status apply_flags(lm_tokenizer *t, const json_t *cfg, const char *path) {
  int add_bos, add_eos;
  LM_TRY(config_flag(cfg, "add_bos_token", path, &add_bos));
  LM_TRY(config_flag(cfg, "add_eos_token", path, &add_eos));
  if (add_bos >= 0 && t->bos >= 0) LM_TRY(set_front(&t->prefix, t->bos, add_bos));
  if (add_eos >= 0 && t->eos >= 0) LM_TRY(set_back(&t->suffix, t->eos, add_eos));
  return LM_OK;
}

lm_status lm_tok_apply_config(lm_tokenizer *t, const char *config_path) {
  static const char *const bos_names[] = {"<bos>", "<s>", "<|begin_of_text|>", NULL};
  static const char *const eos_names[] = {"<eos>", "</s>", "<|end_of_text|>", "<|endoftext|>",
                                          NULL};
  json_t *cfg = NULL;
  int has_bos = 0, has_eos = 0;
  lm_status s = LM_OK;
  if (config_path) {
    json_error_t e;
    FILE *f;
    LM_TRY(lm_file_fopen_regular(config_path, &f));
    cfg = json_loadf(f, JSON_ALLOW_NUL, &e);
    fclose(f);
    if (!cfg)
      return LM_ERRF(LM_ERR_CORRUPT, "%s: invalid JSON at line %d: %s", config_path, e.line,
                     e.text);
    if (!json_is_object(cfg)) s = LM_ERRF(LM_ERR_CORRUPT, "%s: not a JSON object", config_path);
    if (s == LM_OK) s = config_token(t, cfg, "bos_token", config_path, &has_bos, &t->bos);
    if (s == LM_OK) s = config_token(t, cfg, "eos_token", config_path, &has_eos, &t->eos);
  }
  /* without the config: the template's first / last special token, else a conventional name */
  if (!has_bos) t->bos = t->prefix.n ? t->prefix.v[0] : find_first(t, bos_names);
  if (!has_eos) t->eos = t->suffix.n ? t->suffix.v[t->suffix.n - 1] : find_first(t, eos_names);
  if (s == LM_OK && cfg) s = apply_flags(t, cfg, config_path);
  json_decref(cfg);
  return s;
}

int lm_tokenizer_adds_bos(const lm_tokenizer *t) {
  return t && t->bos >= 0 && t->prefix.n > 0 && t->prefix.v[0] == t->bos;
}
