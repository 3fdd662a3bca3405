/* chat.c — loading a checkpoint's chat template and rendering messages through it. */
#include "text/chat.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "io/file_util.h"
#include "text/jinja.h"

struct lm_chat_template {
  lm_jinja_template *main;
  lm_jinja_template *tool_use; /* optional: tokenizer_config's "tool_use" template */
};

#define LM_CHAT_MAX_FILE (16u << 20)

/* Reads a whole file; LM_ERR_NOT_FOUND when it does not exist. */
static lm_status read_file(const char *path, char **out, size_t *len) {
  FILE *f;
  LM_TRY(lm_file_fopen_regular(path, &f));
  lm_jbuf b = {0};
  b.cap_limit = LM_CHAT_MAX_FILE;
  char chunk[65536];
  size_t n;
  lm_status s = LM_OK;
  while (s == LM_OK && (n = fread(chunk, 1, sizeof chunk, f)) > 0)
    s = lm_jbuf_put(&b, chunk, n);
  if (s == LM_OK && ferror(f)) s = LM_ERRF(LM_ERR_IO, "%s: read error", path);
  fclose(f);
  if (s != LM_OK) {
    lm_jbuf_free(&b);
    return lm_err_prefix(s, "%s", path);
  }
  *len = b.len;
  return lm_jbuf_take(&b, out);
}

static lm_status compile(const char *src, size_t len, const char *origin, lm_jinja_template **out) {
  lm_status s = lm_jinja_compile(src, len, NULL, out);
  if (s != LM_OK) lm_err_prefix(s, "%s", origin);
  return s;
}

lm_status lm_chat_template_from_string(const char *src, lm_chat_template **out) {
  *out = calloc(1, sizeof **out);
  if (!*out) return LM_ERRF(LM_ERR_NOMEM, "out of memory (chat template)");
  lm_status s = compile(src, strlen(src), "chat template", &(*out)->main);
  if (s != LM_OK) {
    free(*out);
    *out = NULL;
  }
  return s;
}

void lm_chat_template_free(lm_chat_template *t) {
  if (!t) return;
  lm_jinja_free(t->main);
  lm_jinja_free(t->tool_use);
  free(t);
}

/* tokenizer_config.json "chat_template": a string, or [{name, template}, …]. */
static lm_status from_config_value(const json_t *v, const char *path, lm_chat_template **out) {
  if (json_is_string(v)) return lm_chat_template_from_string(json_string_value(v), out);
  if (!json_is_array(v))
    return LM_ERRF(LM_ERR_CORRUPT, "%s: chat_template is neither a string nor a list", path);
  const json_t *def = NULL, *tool = NULL, *item;
  size_t i;
  json_array_foreach(v, i, item) {
    const json_t *name = json_object_get(item, "name"), *tpl = json_object_get(item, "template");
    if (!json_is_string(name) || !json_is_string(tpl))
      return LM_ERRF(LM_ERR_CORRUPT, "%s: chat_template[%zu] needs string name and template", path,
                     i);
    if (!strcmp(json_string_value(name), "default")) def = tpl;
    if (!strcmp(json_string_value(name), "tool_use")) tool = tpl;
  }
  if (!def) return LM_ERRF(LM_ERR_CORRUPT, "%s: chat_template list has no \"default\" entry", path);
  LM_TRY(lm_chat_template_from_string(json_string_value(def), out));
  if (tool) {
    lm_status s =
        compile(json_string_value(tool), strlen(json_string_value(tool)), path, &(*out)->tool_use);
    if (s != LM_OK) {
      lm_chat_template_free(*out);
      *out = NULL;
      return s;
    }
  }
  return LM_OK;
}

/* A JSON file's "chat_template" member; LM_ERR_NOT_FOUND when the file or the member is absent. */
static lm_status from_json_file(const char *path, lm_chat_template **out) {
  char *text;
  size_t len;
  LM_TRY(read_file(path, &text, &len));
  json_error_t err;
  json_t *root = json_loadb(text, len, 0, &err);
  free(text);
  if (!root) return LM_ERRF(LM_ERR_CORRUPT, "%s: line %d: %s", path, err.line, err.text);
  const json_t *v = json_object_get(root, "chat_template");
  lm_status s = v && !json_is_null(v) ? from_config_value(v, path, out)
                                      : LM_ERRF(LM_ERR_NOT_FOUND, "%s: no chat_template", path);
  json_decref(root);
  return s;
}

/* A Jinja file; LM_ERR_NOT_FOUND when it does not exist. */
static lm_status from_jinja_file(const char *path, lm_chat_template **out) {
  char *src;
  size_t len;
  LM_TRY(read_file(path, &src, &len));
  lm_chat_template *t = calloc(1, sizeof *t);
  if (!t) {
    free(src);
    return LM_ERRF(LM_ERR_NOMEM, "out of memory (chat template)");
  }
  lm_status s = compile(src, len, path, &t->main);
  free(src);
  if (s != LM_OK) {
    free(t);
    return s;
  }
  *out = t;
  return LM_OK;
}

lm_status lm_chat_template_load_file(const char *path, lm_chat_template **out) {
  *out = NULL;
  size_t n = strlen(path);
  return n > 5 && !strcmp(path + n - 5, ".json") ? from_json_file(path, out)
                                                 : from_jinja_file(path, out);
}

lm_status lm_chat_template_load(const char *model_dir, lm_chat_template **out) {
  char path[4096];
  *out = NULL;
  snprintf(path, sizeof path, "%s/chat_template.jinja", model_dir);
  lm_status s = from_jinja_file(path, out);
  if (s == LM_OK) return LM_OK;
  if (s != LM_ERR_NOT_FOUND) return s;
  static const char *const json_files[] = {"chat_template.json", "tokenizer_config.json"};
  for (size_t i = 0; i < 2; i++) {
    snprintf(path, sizeof path, "%s/%s", model_dir, json_files[i]);
    s = from_json_file(path, out);
    if (s != LM_ERR_NOT_FOUND) return s;
  }
  lm_err_clear();
  return LM_OK; /* no template shipped */
}

/* ---- rendering ------------------------------------------------------------------------------ */

static lm_status set_var(lm_jarena *a, lm_jv vars, const char *name, lm_jv v) {
  lm_jv k;
  LM_TRY(lm_jv_cstr(a, name, &k));
  return lm_jv_dict_set(a, vars, k, v);
}

int lm_chat_reserved_var(const char *name) {
  static const char *const own[] = {"messages",     "tools",     "add_generation_prompt",
                                    "bos_token",    "eos_token", "range",
                                    "namespace",    "dict",      "raise_exception",
                                    "strftime_now", "loop",      "caller",
                                    "true",         "false",     "none",
                                    "True",         "False",     "None"};
  for (size_t i = 0; i < sizeof own / sizeof *own; i++)
    if (!strcmp(name, own[i])) return 1;
  return 0;
}

/* Extra variables: never one the renderer owns, and only those the template reads (others could
 * not change the prompt, so they are dropped). */
static lm_status set_kwargs(lm_jarena *a, const lm_jinja_template *tpl, lm_jv vars, lm_jv kw) {
  if (kw.kind != LM_JV_DICT) return LM_OK;
  for (size_t i = 0; i < kw.u.d->n; i++) {
    lm_jv k = kw.u.d->k[i];
    if (k.kind != LM_JV_STR) continue;
    if (lm_chat_reserved_var(k.u.s->s))
      return LM_ERRF(LM_ERR_INVALID, "chat: template variable '%.64s' is set by the server",
                     k.u.s->s);
    if (lm_jinja_refers_to(tpl, k.u.s->s)) LM_TRY(lm_jv_dict_set(a, vars, k, kw.u.d->v[i]));
  }
  return LM_OK;
}

lm_status lm_chat_render_values(const lm_chat_template *t, lm_jarena *a, lm_jv messages,
                                lm_jv tools, lm_jv kwargs, int add_generation_prompt,
                                const char *bos_token, const char *eos_token, char **out) {
  *out = NULL;
  if (!t) return LM_ERRF(LM_ERR_INVALID, "no chat template");
  if (messages.kind != LM_JV_LIST)
    return LM_ERRF(LM_ERR_INVALID, "chat: messages must be an array");
  if (tools.kind == LM_JV_UNDEF) tools = lm_jv_none();
  lm_jv vars, bos, eos;
  LM_TRY(lm_jv_dict(a, 8, &vars));
  LM_TRY(lm_jv_cstr(a, bos_token ? bos_token : "", &bos));
  LM_TRY(lm_jv_cstr(a, eos_token ? eos_token : "", &eos));
  LM_TRY(set_var(a, vars, "messages", messages));
  LM_TRY(set_var(a, vars, "tools", tools));
  LM_TRY(set_var(a, vars, "add_generation_prompt", lm_jv_bool(add_generation_prompt)));
  LM_TRY(set_var(a, vars, "bos_token", bos));
  LM_TRY(set_var(a, vars, "eos_token", eos));
  const lm_jinja_template *tpl = t->tool_use && lm_jv_truthy(tools) ? t->tool_use : t->main;
  LM_TRY(set_kwargs(a, tpl, vars, kwargs));
  return lm_jinja_render(tpl, a, vars, NULL, out, NULL);
}

lm_status lm_chat_render(const lm_chat_template *t, const json_t *messages, const json_t *tools,
                         const json_t *kwargs, int add_generation_prompt, const char *bos_token,
                         const char *eos_token, char **out) {
  *out = NULL;
  lm_jinja_limits lim = lm_jinja_limits_default();
  lm_jarena *a;
  LM_TRY(lm_jarena_create(lim.max_memory, &a));
  lm_jv m, tl = lm_jv_none(), kw = lm_jv_undef();
  lm_status s = lm_jv_from_json(a, messages, &m);
  if (s == LM_OK && tools) s = lm_jv_from_json(a, tools, &tl);
  if (s == LM_OK && kwargs) {
    s = lm_jv_from_json(a, kwargs, &kw);
    if (s == LM_OK && kw.kind != LM_JV_DICT)
      s = LM_ERRF(LM_ERR_INVALID, "chat: template kwargs must be an object");
  }
  if (s == LM_OK)
    s = lm_chat_render_values(t, a, m, tl, kw, add_generation_prompt, bos_token, eos_token, out);
  lm_jarena_free(a);
  return s;
}
