/* checkpoint.c — lm_checkpoint of lumen.h: a model directory opened for use (weights, tokenizer,
 * chat template, generation defaults, stop ids, the output parser's control tokens), and the
 * text functions over it (tokenize, detokenize, render). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/buf.h"
#include "base/status.h"
#include "engine/api_impl.h"
#include "text/utf8.h"

static char *base_name(const char *path) {
  size_t n = strlen(path);
  while (n > 1 && path[n - 1] == '/')
    n--;
  size_t b = n;
  while (b > 0 && path[b - 1] != '/')
    b--;
  return strndup(path + b, n - b);
}

static char *token_string(const lm_tokenizer *tok, int32_t id) {
  size_t n = 0;
  const char *s = tok && id >= 0 ? lm_tokenizer_piece(tok, id, &n) : NULL;
  return s ? strndup(s, n) : strdup("");
}

/* max_position_embeddings of a config.json (text_config first); 0 when absent. */
static int64_t max_positions_of(const char *path) {
  json_t *j = json_load_file(path, 0, NULL);
  json_t *tc = json_object_get(j, "text_config");
  json_t *v = json_object_get(tc ? tc : j, "max_position_embeddings");
  if (!v) v = json_object_get(j, "max_position_embeddings");
  int64_t n = json_is_integer(v) && json_integer_value(v) > 1 ? json_integer_value(v) : 0;
  json_decref(j);
  return n;
}

static int64_t max_positions(const char *dir) {
  char path[4096];
  snprintf(path, sizeof path, "%s/config.json", dir);
  return max_positions_of(path);
}

static int file_exists(const char *dir, const char *name) {
  char path[4096];
  struct stat st;
  snprintf(path, sizeof path, "%s/%s", dir, name);
  return stat(path, &st) == 0;
}

/* The parser's control tokens, and the ids among them that are streamed as text. */
static void parser_tokens(lm_checkpoint *ck) {
  ck->gemma4 = ck->tok && lm_parser_tokens_from_tokenizer(ck->tok, &ck->ptok) == LM_OK;
  if (!ck->gemma4) {
    memset(&ck->ptok, 0xff, sizeof ck->ptok); /* every id -1 */
    ck->ptok.eos = ck->tok ? lm_tokenizer_eos(ck->tok) : -1;
  }
  lm_err_clear();
  if (!ck->tok) return;
  const int32_t ct[] = {ck->ptok.channel_open,       ck->ptok.channel_close,
                        ck->ptok.tool_call_open,     ck->ptok.tool_call_close,
                        ck->ptok.tool_response_open, lm_tokenizer_find(ck->tok, "<|\"|>", 5)};
  for (int i = 0; i < 6; i++)
    if (ct[i] >= 0) ck->keep[ck->n_keep++] = ct[i];
  if (ck->gemma4) {
    ck->quote_id = ct[5];
    ck->think_id = lm_tokenizer_find(ck->tok, "<|think|>", 9);
  }
}

/* The bytes of every id as a grammar sees them: a token's decoded bytes; special tokens none, but
 * for <|"|>, which is the call syntax's quote and so part of a call's text. */
static lm_status build_grammar_vocab(lm_checkpoint *ck) {
  int32_t n = lm_tokenizer_vocab_size(ck->tok);
  const char **pieces = calloc((size_t)(n ? n : 1), sizeof *pieces);
  size_t *lens = calloc((size_t)(n ? n : 1), sizeof *lens), *offs = NULL, total = 0, cap = 0;
  lm_detok *d = NULL;
  lm_status s = pieces && lens ? lm_detok_create(ck->tok, 0, &d)
                               : LM_ERRF(LM_ERR_NOMEM, "out of memory (grammar vocabulary)");
  if (!s && !(offs = calloc((size_t)(n ? n : 1), sizeof *offs)))
    s = LM_ERRF(LM_ERR_NOMEM, "out of memory (grammar vocabulary)");
  for (int32_t i = 0; !s && i < n; i++) {
    const char *b = NULL;
    size_t k = 0;
    if (lm_tokenizer_is_special(ck->tok, i) && i != ck->quote_id) {
      offs[i] = total;
      continue;
    }
    if (lm_detok_token_bytes(d, i, &b, &k)) { /* an id without a token: never allowed */
      lm_err_clear();
      k = 0;
    }
    offs[i] = total;
    lens[i] = k;
    if (k && lm_buf_append(&ck->gv_bytes, &total, &cap, 1 << 16, b, k))
      s = LM_ERRF(LM_ERR_NOMEM, "out of memory (grammar vocabulary)");
  }
  for (int32_t i = 0; !s && i < n; i++)
    pieces[i] = ck->gv_bytes ? ck->gv_bytes + offs[i] : "";
  if (!s)
    s = lm_err_prefix(lm_grammar_vocab_create(pieces, lens, n, &ck->gv), "grammar vocabulary");
  lm_detok_free(d);
  free(pieces);
  free(lens);
  free(offs);
  return s;
}

lm_status lm_checkpoint_grammar_vocab(lm_checkpoint *ck, const lm_grammar_vocab **out) {
  *out = NULL;
  if (!ck->tok)
    return LM_ERRF(LM_ERR_STATE, "%s has no tokenizer: constrained decoding needs one", ck->name);
  pthread_mutex_lock(&ck->gv_mu);
  lm_status s = ck->gv ? LM_OK : build_grammar_vocab(ck);
  pthread_mutex_unlock(&ck->gv_mu);
  *out = ck->gv;
  return s;
}

static size_t longest_piece(const lm_tokenizer *tok) {
  size_t best = 1;
  int32_t n = lm_tokenizer_vocab_size(tok);
  for (int32_t i = 0; i < n; i++) {
    size_t k = 0;
    if (lm_tokenizer_piece(tok, i, &k) && k > best) best = k;
  }
  return best;
}

/* The text side: tokenizer (optional), template, generation defaults, stop ids. */
static lm_status load_text(lm_checkpoint *ck, const char *tok_dir) {
  if (tok_dir && file_exists(tok_dir, "tokenizer.json")) {
    LM_TRY(lm_tokenizer_load(tok_dir, &ck->tok));
    if (lm_tokenizer_vocab_size(ck->tok) > ck->m->cfg.vocab_size)
      return LM_ERRF(LM_ERR_INVALID, "%s: the tokenizer has %d ids, the model %lld", tok_dir,
                     lm_tokenizer_vocab_size(ck->tok), (long long)ck->m->cfg.vocab_size);
    if (lm_chat_template_load(tok_dir, &ck->tmpl))
      return lm_err_prefix(LM_ERR_CORRUPT, "chat template");
    ck->longest_piece = longest_piece(ck->tok);
  }
  if (ck->dir) LM_TRY(lm_gen_config_load(ck->dir, &ck->gc));
  LM_TRY(lm_gen_stop_ids(ck->m->cfg.eos_ids, ck->m->cfg.n_eos, &ck->gc,
                         ck->tok ? lm_tokenizer_eos(ck->tok) : -1, &ck->stop_ids, &ck->n_stop_ids));
  ck->bos = token_string(ck->tok, ck->tok ? lm_tokenizer_bos(ck->tok) : -1);
  ck->eos = token_string(ck->tok, ck->tok ? lm_tokenizer_eos(ck->tok) : -1);
  if (!ck->bos || !ck->eos) return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  parser_tokens(ck);
  return LM_OK;
}

static lm_status finish_open(lm_checkpoint *ck, const char *tok_dir, lm_checkpoint **out) {
  lm_status s = ck->name ? LM_OK : LM_ERRF(LM_ERR_NOMEM, "out of memory");
  if (!s) s = load_text(ck, tok_dir);
  if (s) {
    lm_checkpoint_free(ck);
    return s;
  }
  *out = ck;
  return LM_OK;
}

static lm_checkpoint *new_checkpoint(void) {
  lm_checkpoint *ck = calloc(1, sizeof *ck);
  if (!ck) return NULL;
  lm_gen_config_clear(&ck->gc);
  atomic_init(&ck->engines, 0);
  ck->think_id = ck->quote_id = -1;
  pthread_mutex_init(&ck->gv_mu, NULL);
  return ck;
}

lm_status lm_checkpoint_open(const char *dir, lm_checkpoint **out) {
  *out = NULL;
  if (!dir || !*dir) return LM_ERRF(LM_ERR_INVALID, "lm_checkpoint_open: no directory");
  lm_checkpoint *ck = new_checkpoint();
  if (!ck) return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  lm_status s = lm_model_load(dir, &ck->m);
  if (s) {
    lm_checkpoint_free(ck);
    return s;
  }
  ck->dir = strdup(dir);
  ck->name = base_name(dir);
  ck->max_positions = max_positions(dir);
  return finish_open(ck, dir, out);
}

lm_status lm_checkpoint_open_synthetic(const char *config_path, const char *tokenizer_dir, int bits,
                                       int group, uint64_t seed, lm_checkpoint **out) {
  *out = NULL;
  if (!config_path) return LM_ERRF(LM_ERR_INVALID, "lm_checkpoint_open_synthetic: no preset");
  lm_checkpoint *ck = new_checkpoint();
  if (!ck) return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  lm_status s = lm_model_synth(config_path, bits, group > 0 ? group : 64, seed, &ck->m);
  if (s) {
    lm_checkpoint_free(ck);
    return s;
  }
  ck->name = strdup("synthetic");
  ck->max_positions = max_positions_of(config_path);
  if (tokenizer_dir && !file_exists(tokenizer_dir, "tokenizer.json")) {
    lm_checkpoint_free(ck);
    return LM_ERRF(LM_ERR_NOT_FOUND, "%s/tokenizer.json: not found", tokenizer_dir);
  }
  return finish_open(ck, tokenizer_dir, out);
}

void lm_checkpoint_free(lm_checkpoint *ck) {
  if (!ck) return;
  lm_grammar_vocab_free(ck->gv);
  free(ck->gv_bytes);
  pthread_mutex_destroy(&ck->gv_mu);
  lm_chat_template_free(ck->tmpl);
  lm_tokenizer_free(ck->tok);
  lm_gen_config_clear(&ck->gc);
  free(ck->stop_ids);
  free(ck->bos);
  free(ck->eos);
  lm_model_free(ck->m);
  free(ck->dir);
  free(ck->name);
  free(ck);
}

void lm_checkpoint_describe(const lm_checkpoint *ck, lm_checkpoint_info *info) {
  const lm_model *m = ck->m;
  *info = (lm_checkpoint_info){.name = ck->name,
                               .model_type = m->cfg.model_type,
                               .n_layers = (int)m->cfg.n_layers,
                               .vocab_size = m->cfg.vocab_size,
                               .n_params = m->n_params,
                               .weight_bytes = m->weight_bytes,
                               .max_positions = ck->max_positions,
                               .quant_bits = m->quant.present ? m->quant.bits : 0,
                               .quant_group = m->quant.present ? m->quant.group : 0,
                               .has_tokenizer = ck->tok != NULL,
                               .has_chat_template = ck->tmpl != NULL,
                               .gemma4_format = ck->gemma4,
                               .n_stop_ids = ck->n_stop_ids,
                               .stop_ids = ck->stop_ids,
                               .defaults = &ck->gc.sampling,
                               .default_max_tokens = ck->gc.max_new_tokens,
                               .longest_piece = ck->longest_piece};
}

/* ---- text ------------------------------------------------------------------------------------ */

static lm_status need_tokenizer(const lm_checkpoint *ck) {
  return ck->tok ? LM_OK
                 : LM_ERRF(LM_ERR_STATE, "%s has no tokenizer.json: give token ids",
                           ck->name ? ck->name : "the checkpoint");
}

lm_status lm_checkpoint_tokenize(const lm_checkpoint *ck, const char *text, size_t len, int add_bos,
                                 int32_t **ids, int64_t *n) {
  *ids = NULL;
  *n = 0;
  LM_TRY(need_tokenizer(ck));
  if (!text) return LM_ERRF(LM_ERR_INVALID, "tokenize: no text");
  if (!lm_utf8_valid(text, len))
    return LM_ERRF(LM_ERR_INVALID, "tokenize: the text is not valid UTF-8");
  size_t k = 0;
  LM_TRY(lm_tokenizer_encode(ck->tok, text, len, add_bos, ids, &k));
  *n = (int64_t)k;
  return LM_OK;
}

lm_status lm_checkpoint_detokenize(const lm_checkpoint *ck, const int32_t *ids, int64_t n,
                                   int skip_special, char **text, size_t *len) {
  *text = NULL;
  if (len) *len = 0;
  LM_TRY(need_tokenizer(ck));
  if (n < 0 || (n && !ids)) return LM_ERRF(LM_ERR_INVALID, "detokenize: bad id list");
  for (int64_t i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] >= lm_tokenizer_vocab_size(ck->tok))
      return LM_ERRF(LM_ERR_INVALID, "detokenize: id %d is outside the vocabulary", ids[i]);
  size_t k = 0;
  LM_TRY(lm_tokenizer_decode(ck->tok, ids, (size_t)n, skip_special, text, &k));
  if (len) *len = k;
  return LM_OK;
}

/* Parses an optional JSON argument of the given type. */
static lm_status parse_json(const char *what, const char *text, int want_array, json_t **out) {
  *out = NULL;
  if (!text) return LM_OK;
  json_error_t err;
  json_t *j = json_loads(text, 0, &err);
  if (!j) return LM_ERRF(LM_ERR_INVALID, "%s: bad JSON (%s, at %d)", what, err.text, err.position);
  if (want_array ? !json_is_array(j) : !json_is_object(j)) {
    json_decref(j);
    return LM_ERRF(LM_ERR_INVALID, "%s must be a JSON %s", what, want_array ? "array" : "object");
  }
  *out = j;
  return LM_OK;
}

lm_status lm_checkpoint_set_chat_template(lm_checkpoint *ck, const char *path) {
  if (atomic_load(&ck->engines))
    return LM_ERRF(LM_ERR_STATE, "chat template: set it before creating an engine");
  if (!ck->tok) return LM_ERRF(LM_ERR_STATE, "chat template: %s has no tokenizer", ck->name);
  lm_chat_template *t = NULL;
  LM_TRY(lm_chat_template_load_file(path, &t)); /* the message names the file */
  lm_chat_template_free(ck->tmpl);
  ck->tmpl = t;
  return LM_OK;
}

lm_status lm_checkpoint_render(const lm_checkpoint *ck, const char *messages_json,
                               const char *tools_json, const char *kwargs_json,
                               int add_generation_prompt, char **prompt) {
  *prompt = NULL;
  if (!ck->tmpl)
    return LM_ERRF(LM_ERR_STATE, "%s has no chat template", ck->name ? ck->name : "the checkpoint");
  json_t *msgs = NULL, *tools = NULL, *kwargs = NULL, *nm = NULL, *nt = NULL;
  lm_status s = parse_json("messages", messages_json, 1, &msgs);
  if (!s) s = parse_json("tools", tools_json, 1, &tools);
  if (!s) s = parse_json("template kwargs", kwargs_json, 0, &kwargs);
  if (!s && !msgs) s = LM_ERRF(LM_ERR_INVALID, "render: no messages");
  if (!s) s = lm_chat_normalize(msgs, tools, &nm, &nt);
  if (!s)
    s = lm_chat_render(ck->tmpl, nm, nt, kwargs, add_generation_prompt, ck->bos, ck->eos, prompt);
  json_decref(msgs);
  json_decref(tools);
  json_decref(kwargs);
  json_decref(nm);
  json_decref(nt);
  return s;
}
