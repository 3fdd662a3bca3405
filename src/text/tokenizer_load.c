/* tokenizer_load.c — tokenizer.json -> lm_tokenizer: the file, the top-level object (HF
 * `TokenizerImpl` deserialization), the public load / free functions. The "model" object is
 * tokenizer_model.c's, the other parts tokenizer_components.c's. `truncation` and `padding` are
 * ignored: lumen never truncates or pads an encoding. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/file_util.h"
#include "text/tokenizer_impl.h"
#include "text/utf8.h"

/* Maps the file read-only (MAP_POPULATE: one fault-in pass instead of one fault per page, which
 * matters at 33 MB), or reads it where mapping is impossible. */
lm_status lm_tok_file_open(const char *path, lm_tok_file *f) {
  memset(f, 0, sizeof *f);
  int fd;
  struct stat st;
  LM_TRY(lm_file_open_regular(path, &fd, &st));
  lm_status s = LM_OK;
  if ((uint64_t)st.st_size > LM_TOK_MAX_FILE)
    s = LM_ERRF(LM_ERR_UNSUPPORTED, "%s: %lld bytes is larger than the 2 GiB limit", path,
                (long long)st.st_size);
  size_t n = s == LM_OK ? (size_t)st.st_size : 0;
  if (s == LM_OK && n > 0) {
    void *p = mmap(NULL, n, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
    if (p != MAP_FAILED) f->data = p, f->len = n, f->mapped = 1;
  }
  if (s == LM_OK && !f->mapped) {
    char *p = malloc(n + 1);
    ssize_t got = 0;
    size_t done = 0;
    while (p && done < n && (got = read(fd, p + done, n - done)) > 0)
      done += (size_t)got;
    if (!p)
      s = LM_ERRF(LM_ERR_NOMEM, "%s: out of memory reading %zu bytes", path, n);
    else if (done != n)
      s = LM_ERRF(LM_ERR_IO, "%s: short read (%zu of %zu bytes)", path, done, n);
    if (s == LM_OK)
      f->data = p, f->len = n;
    else
      free(p);
  }
  close(fd);
  return s;
}

void lm_tok_file_close(lm_tok_file *f) {
  if (f->mapped)
    munmap(f->data, f->len);
  else
    free(f->data);
  memset(f, 0, sizeof *f);
}

/* ---- the top-level object ----------------------------------------------------------------- */
enum { PART_NORMALIZER, PART_PRETOK, PART_DECODER, PART_POST, PART_ADDED, PART_VERSION, N_PARTS };
static const char *const part_names[N_PARTS] = {"normalizer",     "pre_tokenizer", "decoder",
                                                "post_processor", "added_tokens",  "version"};

static lm_status parse_root(lm_tjs *j, lm_tok_model_state *mp, json_t **parts) {
  int more;
  lm_tbuf key = {0};
  lm_status s;
  if (lm_tjs_peek(j) != '{')
    return LM_ERRF(LM_ERR_CORRUPT, "%s: not a JSON object (expected a tokenizer.json)", j->name);
  LM_TRY(lm_tjs_obj_begin(j, &more));
  for (s = LM_OK; more && s == LM_OK;) {
    key.n = 0;
    if (lm_tjs_peek(j) != '"')
      s = LM_ERRF(LM_ERR_CORRUPT, "%s: invalid JSON at byte %zu: expected a key", j->name,
                  lm_tjs_offset(j));
    if (s == LM_OK) s = lm_tjs_string(j, &key);
    if (s == LM_OK) s = lm_tjs_expect(j, ':');
    if (s != LM_OK) break;
    int part = -1;
    for (int i = 0; i < N_PARTS; i++)
      if (strlen(part_names[i]) == key.n && !memcmp(part_names[i], key.p, key.n)) part = i;
    if (key.n == 5 && !memcmp(key.p, "model", 5))
      s = lm_tok_model_parse(j, mp);
    else if (part >= 0) {
      json_decref(parts[part]), parts[part] = NULL;
      s = lm_tjs_value(j, &parts[part]);
    } else
      s = lm_tjs_skip(j);
    if (s == LM_OK) s = lm_tjs_next(j, '}', &more);
  }
  lm_tbuf_free(&key);
  return s == LM_OK ? lm_tjs_end(j) : s;
}

static lm_status build_parts(lm_tokenizer *t, json_t **parts, const char *name) {
  const json_t *ver = parts[PART_VERSION];
  if (ver && (!json_is_string(ver) || strcmp(json_string_value(ver), "1.0")))
    return LM_ERRF(LM_ERR_UNSUPPORTED,
                   "%s: tokenizer.json version %s is not supported (expected \"1.0\")", name,
                   json_is_string(ver) ? json_string_value(ver) : "(not a string)");
  /* The normalizer comes before the added tokens: normalized tokens are matched in normalized form.
   */
  LM_TRY(lm_tok_parse_normalizer(t, parts[PART_NORMALIZER], name));
  LM_TRY(lm_tok_parse_pretokenizer(t, parts[PART_PRETOK], name));
  LM_TRY(lm_tok_parse_decoder(t, parts[PART_DECODER], name));
  LM_TRY(lm_tok_parse_added(t, parts[PART_ADDED], name));
  return lm_tok_parse_postprocessor(t, parts[PART_POST], name);
}

static size_t first_invalid_utf8(const char *s, size_t n) {
  for (size_t i = 0; i < n;) {
    int32_t cp;
    size_t k = lm_utf8_next(s + i, n - i, &cp);
    if (cp < 0) return i;
    i += k;
  }
  return n;
}

lm_status lm_tok_parse_json(lm_tokenizer *t, const char *name, const char *data, size_t len) {
  if (!lm_utf8_valid(data, len))
    return LM_ERRF(LM_ERR_CORRUPT, "%s: not valid UTF-8 (byte %zu)", name,
                   first_invalid_utf8(data, len));
  lm_tjs j = {data, data, data + len, name};
  lm_tok_model_state *mp;
  json_t *parts[N_PARTS] = {0};
  LM_TRY(lm_tok_model_new(t, name, &mp));
  lm_status s = parse_root(&j, mp, parts);
  if (s == LM_OK) s = lm_tok_model_finish(mp);
  if (s == LM_OK) s = build_parts(t, parts, name);
  lm_tok_model_free(mp);
  for (int i = 0; i < N_PARTS; i++)
    json_decref(parts[i]);
  return s;
}

/* ---- public entry points ------------------------------------------------------------------ */
static lm_status join_path(const char *dir, const char *file, char **out) {
  size_t n = strlen(dir) + strlen(file) + 2;
  *out = malloc(n);
  if (!*out) return LM_ERRF(LM_ERR_NOMEM, "tokenizer: out of memory");
  snprintf(*out, n, "%s/%s", dir, file);
  return LM_OK;
}

static lm_status load_into(lm_tokenizer *t, const char *path) {
  struct stat st;
  char *json_path = NULL, *config_path = NULL;
  lm_tok_file f = {0};
  lm_status s = LM_OK;
  if (stat(path, &st) != 0)
    return LM_ERRF(errno == ENOENT ? LM_ERR_NOT_FOUND : LM_ERR_IO, "%s: %s", path, strerror(errno));
  if (S_ISDIR(st.st_mode)) {
    s = join_path(path, "tokenizer.json", &json_path);
    if (s == LM_OK) s = join_path(path, "tokenizer_config.json", &config_path);
  }
  const char *jp = json_path ? json_path : path;
  if (s == LM_OK) s = lm_tok_file_open(jp, &f);
  if (s == LM_OK) s = lm_tok_parse_json(t, jp, f.data, f.len);
  lm_tok_file_close(&f);
  if (s == LM_OK)
    s = lm_tok_apply_config(t, config_path && stat(config_path, &st) == 0 ? config_path : NULL);
  free(json_path);
  free(config_path);
  return s;
}

static lm_status new_tokenizer(lm_tokenizer **out) {
  lm_tokenizer *t = calloc(1, sizeof *t);
  if (!t) return LM_ERRF(LM_ERR_NOMEM, "tokenizer: out of memory");
  t->unk_id = t->bos = t->eos = -1;
  lm_tok_trie_init(&t->trie_raw);
  lm_tok_trie_init(&t->trie_norm);
  *out = t;
  return LM_OK;
}

lm_status lm_tokenizer_load(const char *path, lm_tokenizer **out) {
  if (!path || !out) return LM_ERRF(LM_ERR_INVALID, "lm_tokenizer_load: NULL argument");
  *out = NULL;
  lm_tokenizer *t;
  LM_TRY(new_tokenizer(&t));
  lm_status s = load_into(t, path);
  if (s != LM_OK) {
    lm_tokenizer_free(t);
    return s;
  }
  *out = t;
  return LM_OK;
}

lm_status lm_tokenizer_load_json(const char *json, size_t len, const char *name,
                                 lm_tokenizer **out) {
  if ((!json && len) || !out)
    return LM_ERRF(LM_ERR_INVALID, "lm_tokenizer_load_json: NULL argument");
  *out = NULL;
  lm_tokenizer *t;
  LM_TRY(new_tokenizer(&t));
  lm_status s = lm_tok_parse_json(t, name ? name : "tokenizer.json", json ? json : "", len);
  if (s == LM_OK) s = lm_tok_apply_config(t, NULL);
  if (s != LM_OK) {
    lm_tokenizer_free(t);
    return s;
  }
  *out = t;
  return LM_OK;
}

void lm_tokenizer_free(lm_tokenizer *t) {
  if (!t) return;
  lm_tok_strtab_free(&t->vocab);
  lm_tok_smap_free(&t->vocab_map);
  lm_tok_pmap_free(&t->merges);
  free(t->cont_prefix);
  free(t->word_suffix);
  lm_tok_components_free(t);
  free(t);
}

int32_t lm_tokenizer_vocab_size(const lm_tokenizer *t) { return t ? t->vocab_size : 0; }
int32_t lm_tokenizer_bos(const lm_tokenizer *t) { return t ? t->bos : -1; }
int32_t lm_tokenizer_eos(const lm_tokenizer *t) { return t ? t->eos : -1; }
