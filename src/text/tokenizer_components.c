/* tokenizer_components.c — the small parts of tokenizer.json, parsed from jansson values:
 * normalizer, pre_tokenizer, decoder, post_processor and added_tokens. Sequences are flattened
 * into one list per stage. A component lumen does not implement is an LM_ERR_UNSUPPORTED naming
 * it, so a file never loads into a tokenizer that would silently encode differently from HF. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer_impl.h"
#include "text/utf8.h"

#define LM_TOK_MAX_STAGES 64 /* components per stage, after flattening Sequences */

static const char *type_of(const json_t *v) {
  const json_t *ty = json_object_get(v, "type");
  return json_is_string(ty) ? json_string_value(ty) : NULL;
}

static lm_status need_object(const json_t *v, const char *what, const char *name,
                             const char **type) {
  if (!json_is_object(v)) return LM_ERRF(LM_ERR_CORRUPT, "%s: %s is not an object", name, what);
  *type = type_of(v);
  if (!*type) return LM_ERRF(LM_ERR_CORRUPT, "%s: %s has no \"type\" string", name, what);
  return LM_OK;
}

static lm_status get_str(const json_t *o, const char *key, const char *what, const char *name,
                         const char **s, size_t *n) {
  const json_t *v = json_object_get(o, key);
  if (!json_is_string(v))
    return LM_ERRF(LM_ERR_CORRUPT, "%s: %s: \"%s\" is missing or not a string", name, what, key);
  *s = json_string_value(v);
  *n = json_string_length(v);
  return LM_OK;
}

static lm_status get_bool(const json_t *o, const char *key, int dflt, const char *what,
                          const char *name, int *out) {
  const json_t *v = json_object_get(o, key);
  *out = dflt;
  if (!v || json_is_null(v)) return LM_OK;
  if (!json_is_boolean(v))
    return LM_ERRF(LM_ERR_CORRUPT, "%s: %s: \"%s\" is not a boolean", name, what, key);
  *out = json_is_true(v);
  return LM_OK;
}

static lm_status dup_bytes(const char *s, size_t n, char **out) {
  *out = malloc(n + 1);
  if (!*out) return LM_ERRF(LM_ERR_NOMEM, "tokenizer: out of memory");
  memcpy(*out, s, n);
  (*out)[n] = '\0';
  return LM_OK;
}

/* {"String": s} or {"Regex": r} (HF SplitPattern / ReplacePattern). */
static lm_status parse_pattern(const json_t *o, const char *what, const char *name,
                               lm_tok_pattern *p) {
  const json_t *pat = json_object_get(o, "pattern");
  const json_t *str = json_object_get(pat, "String"), *re = json_object_get(pat, "Regex");
  if (json_is_string(str))
    return lm_tok_pattern_literal(p, json_string_value(str), json_string_length(str));
  if (json_is_string(re)) {
    char where[160];
    snprintf(where, sizeof where, "%s: %s", name, what);
    return lm_tok_pattern_regex(p, json_string_value(re), json_string_length(re), where);
  }
  return LM_ERRF(LM_ERR_CORRUPT,
                 "%s: %s: \"pattern\" must be {\"String\": ...} or {\"Regex\": ...}", name, what);
}

/* ---- normalizers -------------------------------------------------------------------------- */
static lm_status add_norm(lm_tokenizer *t, const json_t *v, const char *name, int depth);

static lm_status add_norm_list(lm_tokenizer *t, const json_t *list, const char *name, int depth) {
  if (!json_is_array(list))
    return LM_ERRF(LM_ERR_CORRUPT, "%s: normalizer Sequence: \"normalizers\" is not an array",
                   name);
  for (size_t i = 0; i < json_array_size(list); i++)
    LM_TRY(add_norm(t, json_array_get(list, i), name, depth + 1));
  return LM_OK;
}

static lm_status add_norm(lm_tokenizer *t, const json_t *v, const char *name, int depth) {
  const char *ty;
  LM_TRY(need_object(v, "normalizer", name, &ty));
  if (!strcmp(ty, "Sequence")) {
    if (depth > 8)
      return LM_ERRF(LM_ERR_UNSUPPORTED, "%s: normalizer Sequences nested too deep", name);
    return add_norm_list(t, json_object_get(v, "normalizers"), name, depth);
  }
  if (t->n_norm >= LM_TOK_MAX_STAGES)
    return LM_ERRF(LM_ERR_UNSUPPORTED, "%s: more than %d normalizers", name, LM_TOK_MAX_STAGES);
  lm_tok_norm *n = &t->norm[t->n_norm];
  memset(n, 0, sizeof *n);
  const char *s;
  size_t len;
  if (!strcmp(ty, "NFC"))
    n->kind = LM_TN_NFC;
  else if (!strcmp(ty, "NFD"))
    n->kind = LM_TN_NFD;
  else if (!strcmp(ty, "NFKC"))
    n->kind = LM_TN_NFKC;
  else if (!strcmp(ty, "NFKD"))
    n->kind = LM_TN_NFKD;
  else if (!strcmp(ty, "Replace")) {
    n->kind = LM_TN_REPLACE;
    LM_TRY(get_str(v, "content", "normalizer Replace", name, &s, &len));
    LM_TRY(dup_bytes(s, len, &n->content));
    n->content_len = len;
    t->n_norm++; /* counted before the pattern so that free() sees the content */
    return parse_pattern(v, "normalizer Replace", name, &n->pat);
  } else if (!strcmp(ty, "Prepend")) {
    n->kind = LM_TN_PREPEND;
    LM_TRY(get_str(v, "prepend", "normalizer Prepend", name, &s, &len));
    LM_TRY(dup_bytes(s, len, &n->content));
    n->content_len = len;
  } else
    return LM_ERRF(LM_ERR_UNSUPPORTED,
                   "%s: normalizer '%s' is not supported (lumen has Replace, NFC, NFD, NFKC, NFKD, "
                   "Prepend, Sequence)",
                   name, ty);
  t->n_norm++;
  return LM_OK;
}

lm_status lm_tok_parse_normalizer(lm_tokenizer *t, const json_t *v, const char *name) {
  if (!v || json_is_null(v)) return LM_OK;
  t->norm = calloc(LM_TOK_MAX_STAGES, sizeof *t->norm);
  if (!t->norm) return LM_ERRF(LM_ERR_NOMEM, "tokenizer: out of memory");
  return add_norm(t, v, name, 0);
}

/* ---- pre-tokenizers ----------------------------------------------------------------------- */
/* GPT-2's pattern, used by ByteLevel with use_regex (HF pre_tokenizers/byte_level.rs). */
static const char gpt2_regex[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static lm_status parse_behavior(const json_t *v, const char *name, lm_split_behavior *b) {
  static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext",
                                      "Contiguous"};
  const json_t *bv = json_object_get(v, "behavior");
  if (!json_is_string(bv))
    return LM_ERRF(LM_ERR_CORRUPT, "%s: pre_tokenizer Split: \"behavior\" is missing", name);
  for (int i = 0; i < 5; i++)
    if (!strcmp(json_string_value(bv), names[i])) {
      *b = (lm_split_behavior)i;
      return LM_OK;
    }
  return LM_ERRF(LM_ERR_UNSUPPORTED, "%s: pre_tokenizer Split: behavior '%s' is not supported",
                 name, json_string_value(bv));
}

static lm_status add_pretok(lm_tokenizer *t, const json_t *v, const char *name, int depth) {
  const char *ty;
  LM_TRY(need_object(v, "pre_tokenizer", name, &ty));
  if (!strcmp(ty, "Sequence")) {
    const json_t *list = json_object_get(v, "pretokenizers");
    if (depth > 8)
      return LM_ERRF(LM_ERR_UNSUPPORTED, "%s: pre_tokenizer Sequences nested too deep", name);
    if (!json_is_array(list))
      return LM_ERRF(LM_ERR_CORRUPT,
                     "%s: pre_tokenizer Sequence: \"pretokenizers\" is not an array", name);
    for (size_t i = 0; i < json_array_size(list); i++)
      LM_TRY(add_pretok(t, json_array_get(list, i), name, depth + 1));
    return LM_OK;
  }
  if (t->n_pretok >= LM_TOK_MAX_STAGES)
    return LM_ERRF(LM_ERR_UNSUPPORTED, "%s: more than %d pre-tokenizers", name, LM_TOK_MAX_STAGES);
  lm_tok_pretok *p = &t->pretok[t->n_pretok];
  memset(p, 0, sizeof *p);
  if (!strcmp(ty, "Split")) {
    p->kind = LM_TP_SPLIT;
    LM_TRY(parse_behavior(v, name, &p->behavior));
    LM_TRY(get_bool(v, "invert", 0, "pre_tokenizer Split", name, &p->invert));
    t->n_pretok++;
    return parse_pattern(v, "pre_tokenizer Split", name, &p->pat);
  }
  if (!strcmp(ty, "ByteLevel")) {
    p->kind = LM_TP_BYTELEVEL;
    LM_TRY(
        get_bool(v, "add_prefix_space", 1, "pre_tokenizer ByteLevel", name, &p->add_prefix_space));
    LM_TRY(get_bool(v, "use_regex", 1, "pre_tokenizer ByteLevel", name, &p->use_regex));
    t->n_pretok++;
    if (p->use_regex)
      return lm_tok_pattern_regex(&p->pat, gpt2_regex, sizeof gpt2_regex - 1,
                                  "ByteLevel GPT-2 regex");
    return LM_OK;
  }
  return LM_ERRF(LM_ERR_UNSUPPORTED,
                 "%s: pre_tokenizer '%s' is not supported (lumen has Split, ByteLevel, Sequence)",
                 name, ty);
}

lm_status lm_tok_parse_pretokenizer(lm_tokenizer *t, const json_t *v, const char *name) {
  if (!v || json_is_null(v)) return LM_OK;
  t->pretok = calloc(LM_TOK_MAX_STAGES, sizeof *t->pretok);
  if (!t->pretok) return LM_ERRF(LM_ERR_NOMEM, "tokenizer: out of memory");
  return add_pretok(t, v, name, 0);
}

/* ---- decoders ----------------------------------------------------------------------------- */
static lm_status parse_strip(const json_t *v, const char *name, lm_tok_dec *d) {
  const char *s;
  size_t len;
  int32_t cp;
  LM_TRY(get_str(v, "content", "decoder Strip", name, &s, &len));
  if (len == 0 || lm_utf8_next(s, len, &cp) != len)
    return LM_ERRF(LM_ERR_CORRUPT, "%s: decoder Strip: \"content\" must be one character", name);
  const json_t *start = json_object_get(v, "start"), *stop = json_object_get(v, "stop");
  if (!json_is_integer(start) || !json_is_integer(stop) || json_integer_value(start) < 0 ||
      json_integer_value(stop) < 0)
    return LM_ERRF(LM_ERR_CORRUPT,
                   "%s: decoder Strip: \"start\" and \"stop\" must be non-negative integers", name);
  d->start = (size_t)json_integer_value(start);
  d->stop = (size_t)json_integer_value(stop);
  d->content_len = len;
  return dup_bytes(s, len, &d->content);
}

static lm_status add_dec(lm_tokenizer *t, const json_t *v, const char *name, int depth) {
  const char *ty;
  LM_TRY(need_object(v, "decoder", name, &ty));
  if (!strcmp(ty, "Sequence")) {
    const json_t *list = json_object_get(v, "decoders");
    if (depth > 8)
      return LM_ERRF(LM_ERR_UNSUPPORTED, "%s: decoder Sequences nested too deep", name);
    if (!json_is_array(list))
      return LM_ERRF(LM_ERR_CORRUPT, "%s: decoder Sequence: \"decoders\" is not an array", name);
    for (size_t i = 0; i < json_array_size(list); i++)
      LM_TRY(add_dec(t, json_array_get(list, i), name, depth + 1));
    return LM_OK;
  }
  if (t->n_dec >= LM_TOK_MAX_STAGES)
    return LM_ERRF(LM_ERR_UNSUPPORTED, "%s: more than %d decoders", name, LM_TOK_MAX_STAGES);
  lm_tok_dec *d = &t->dec[t->n_dec];
  memset(d, 0, sizeof *d);
  t->n_dec++;
  if (!strcmp(ty, "ByteFallback"))
    d->kind = LM_TD_BYTEFALLBACK;
  else if (!strcmp(ty, "Fuse"))
    d->kind = LM_TD_FUSE;
  else if (!strcmp(ty, "ByteLevel"))
    d->kind = LM_TD_BYTELEVEL;
  else if (!strcmp(ty, "Strip")) {
    d->kind = LM_TD_STRIP;
    return parse_strip(v, name, d);
  } else if (!strcmp(ty, "Replace")) {
    const char *s;
    size_t len;
    d->kind = LM_TD_REPLACE;
    LM_TRY(get_str(v, "content", "decoder Replace", name, &s, &len));
    LM_TRY(dup_bytes(s, len, &d->content));
    d->content_len = len;
    return parse_pattern(v, "decoder Replace", name, &d->pat);
  } else {
    t->n_dec--;
    return LM_ERRF(LM_ERR_UNSUPPORTED,
                   "%s: decoder '%s' is not supported (lumen has Replace, ByteFallback, Fuse, "
                   "Strip, ByteLevel, Sequence)",
                   name, ty);
  }
  return LM_OK;
}

lm_status lm_tok_parse_decoder(lm_tokenizer *t, const json_t *v, const char *name) {
  if (!v || json_is_null(v)) return LM_OK;
  t->has_decoder = 1;
  t->dec = calloc(LM_TOK_MAX_STAGES, sizeof *t->dec);
  if (!t->dec) return LM_ERRF(LM_ERR_NOMEM, "tokenizer: out of memory");
  return add_dec(t, v, name, 0);
}

/* ---- post-processors ---------------------------------------------------------------------- */
/* Ids of one TemplateProcessing piece {"SpecialToken": {"id": NAME}}, from "special_tokens". */
static lm_status template_special(const json_t *v, const json_t *piece, const char *name,
                                  lm_tids *out) {
  const json_t *id = json_object_get(json_object_get(piece, "SpecialToken"), "id");
  if (!json_is_string(id))
    return LM_ERRF(LM_ERR_CORRUPT,
                   "%s: TemplateProcessing: a piece is neither SpecialToken nor Sequence", name);
  const json_t *ids = json_object_get(
      json_object_get(json_object_get(v, "special_tokens"), json_string_value(id)), "ids");
  if (!json_is_array(ids))
    return LM_ERRF(LM_ERR_CORRUPT,
                   "%s: TemplateProcessing: special token '%s' has no \"ids\" in special_tokens",
                   name, json_string_value(id));
  for (size_t i = 0; i < json_array_size(ids); i++) {
    const json_t *x = json_array_get(ids, i);
    if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= LM_TOK_MAX_ID)
      return LM_ERRF(LM_ERR_CORRUPT, "%s: TemplateProcessing: special token '%s' has a bad id",
                     name, json_string_value(id));
    LM_TRY(lm_tids_push(out, (int32_t)json_integer_value(x)));
  }
  return LM_OK;
}

/* Wraps the current prefix/suffix: a later processor in a Sequence sees the earlier output. */
static lm_status wrap(lm_tokenizer *t, const lm_tids *pre, const lm_tids *suf) {
  lm_tids np = {0};
  lm_status s = lm_tids_append(&np, pre->v, pre->n);
  if (s == LM_OK) s = lm_tids_append(&np, t->prefix.v, t->prefix.n);
  if (s == LM_OK) s = lm_tids_append(&t->suffix, suf->v, suf->n);
  if (s != LM_OK) {
    lm_tids_free(&np);
    return s;
  }
  lm_tids_free(&t->prefix);
  t->prefix = np;
  t->has_template = 1;
  return LM_OK;
}

static lm_status parse_template(lm_tokenizer *t, const json_t *v, const char *name) {
  const json_t *single = json_object_get(v, "single");
  lm_tids pre = {0}, suf = {0};
  int seen_a = 0;
  lm_status s = LM_OK;
  if (!json_is_array(single))
    return LM_ERRF(LM_ERR_CORRUPT, "%s: TemplateProcessing: \"single\" is not an array", name);
  for (size_t i = 0; i < json_array_size(single) && s == LM_OK; i++) {
    const json_t *piece = json_array_get(single, i);
    if (json_object_get(piece, "Sequence")) {
      if (seen_a)
        s = LM_ERRF(LM_ERR_UNSUPPORTED, "%s: TemplateProcessing: \"single\" repeats the sequence",
                    name);
      seen_a = 1;
    } else
      s = template_special(v, piece, name, seen_a ? &suf : &pre);
  }
  if (s == LM_OK && !seen_a)
    s = LM_ERRF(LM_ERR_CORRUPT, "%s: TemplateProcessing: \"single\" has no Sequence piece", name);
  if (s == LM_OK) s = wrap(t, &pre, &suf);
  lm_tids_free(&pre);
  lm_tids_free(&suf);
  return s;
}

/* BertProcessing / RobertaProcessing: {"cls": [text, id], "sep": [text, id]} -> cls A sep. */
static lm_status parse_cls_sep(lm_tokenizer *t, const json_t *v, const char *ty, const char *name) {
  const json_t *cls = json_array_get(json_object_get(v, "cls"), 1),
               *sep = json_array_get(json_object_get(v, "sep"), 1);
  if (!json_is_integer(cls) || !json_is_integer(sep) || json_integer_value(cls) < 0 ||
      json_integer_value(sep) < 0 || json_integer_value(cls) >= LM_TOK_MAX_ID ||
      json_integer_value(sep) >= LM_TOK_MAX_ID)
    return LM_ERRF(LM_ERR_CORRUPT, "%s: post_processor %s: \"cls\" / \"sep\" must be [token, id]",
                   name, ty);
  int32_t c = (int32_t)json_integer_value(cls), e = (int32_t)json_integer_value(sep);
  lm_tids pre = {&c, 1, 1}, suf = {&e, 1, 1};
  return wrap(t, &pre, &suf);
}

static lm_status add_post(lm_tokenizer *t, const json_t *v, const char *name, int depth) {
  const char *ty;
  LM_TRY(need_object(v, "post_processor", name, &ty));
  if (!strcmp(ty, "Sequence")) {
    const json_t *list = json_object_get(v, "processors");
    if (depth > 8)
      return LM_ERRF(LM_ERR_UNSUPPORTED, "%s: post_processor Sequences nested too deep", name);
    if (!json_is_array(list))
      return LM_ERRF(LM_ERR_CORRUPT, "%s: post_processor Sequence: \"processors\" is not an array",
                     name);
    for (size_t i = 0; i < json_array_size(list); i++)
      LM_TRY(add_post(t, json_array_get(list, i), name, depth + 1));
    return LM_OK;
  }
  if (!strcmp(ty, "TemplateProcessing")) return parse_template(t, v, name);
  if (!strcmp(ty, "ByteLevel")) return LM_OK; /* only trims offsets; ids are unchanged */
  if (!strcmp(ty, "BertProcessing") || !strcmp(ty, "RobertaProcessing"))
    return parse_cls_sep(t, v, ty, name);
  return LM_ERRF(LM_ERR_UNSUPPORTED,
                 "%s: post_processor '%s' is not supported (lumen has TemplateProcessing, "
                 "ByteLevel, BertProcessing, RobertaProcessing, Sequence)",
                 name, ty);
}

lm_status lm_tok_parse_postprocessor(lm_tokenizer *t, const json_t *v, const char *name) {
  if (!v || json_is_null(v)) return LM_OK;
  return add_post(t, v, name, 0);
}

/* ---- added tokens ------------------------------------------------------------------------- */
typedef struct added_json {
  const char *content;
  size_t len;
  int flags[5]; /* special, normalized, lstrip, rstrip, single_word */
} added_json;

static lm_status read_added(const json_t *a, size_t i, const char *name, added_json *out) {
  static const char *const keys[5] = {"special", "normalized", "lstrip", "rstrip", "single_word"};
  char what[48];
  snprintf(what, sizeof what, "added_tokens[%zu]", i);
  if (!json_is_object(a)) return LM_ERRF(LM_ERR_CORRUPT, "%s: %s is not an object", name, what);
  const json_t *id = json_object_get(a, "id");
  if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) > UINT32_MAX)
    return LM_ERRF(LM_ERR_CORRUPT, "%s: %s: \"id\" is missing or not a u32", name, what);
  LM_TRY(get_str(a, "content", what, name, &out->content, &out->len));
  for (int k = 0; k < 5; k++) {
    /* HF AddedToken defaults: normalized true, the others false (the serde default) */
    LM_TRY(get_bool(a, keys[k], k == 1, what, name, &out->flags[k]));
  }
  return LM_OK;
}

/* Registers one token like HF AddedVocabulary::add_tokens: its id is the model's id for the same
 * text, else the next free id after the model vocabulary (the file's "id" is only a hint there,
 * as in HF). A repeated text updates the earlier entry. */
static lm_status register_added(lm_tokenizer *t, const added_json *a, int32_t *next_id) {
  int32_t idx = lm_tok_smap_get(&t->added_map, &t->added_text, a->content, a->len);
  if (idx < 0) {
    int32_t id = lm_tok_smap_get(&t->vocab_map, &t->vocab, a->content, a->len);
    if (id < 0) {
      if (*next_id >= LM_TOK_MAX_ID)
        return LM_ERRF(LM_ERR_UNSUPPORTED, "tokenizer: more than %d ids", LM_TOK_MAX_ID);
      id = (*next_id)++;
    }
    idx = (int32_t)t->n_added++;
    LM_TRY(lm_tok_strtab_set(&t->added_text, (size_t)idx, a->content, a->len));
    LM_TRY(lm_tok_smap_put(&t->added_map, &t->added_text, idx, NULL));
    t->added[idx].id = id;
  }
  lm_tok_added *e = &t->added[idx];
  e->special = (uint8_t)a->flags[0], e->normalized = (uint8_t)a->flags[1];
  e->lstrip = (uint8_t)a->flags[2], e->rstrip = (uint8_t)a->flags[3],
  e->single_word = (uint8_t)a->flags[4];
  return LM_OK;
}

/* Tries, the normalized forms, and the per-id tables, once all tokens are known. */
static lm_status index_added(lm_tokenizer *t) {
  for (size_t i = 0; i < t->n_added; i++)
    if (t->added[i].id + 1 > t->vocab_size) t->vocab_size = t->added[i].id + 1;
  t->added_of_id = malloc((size_t)(t->vocab_size ? t->vocab_size : 1) * sizeof *t->added_of_id);
  if (!t->added_of_id) return LM_ERRF(LM_ERR_NOMEM, "tokenizer: out of memory");
  for (int32_t i = 0; i < t->vocab_size; i++)
    t->added_of_id[i] = -1;
  LM_TRY(lm_tok_strtab_resize(&t->added_norm, t->n_added));
  for (size_t i = 0; i < t->n_added; i++) {
    const lm_tok_added *a = &t->added[i];
    size_t len = 0;
    const char *s = lm_tok_strtab_get(&t->added_text, i, &len);
    t->added_of_id[a->id] = (int32_t)i;
    if (!a->normalized) {
      LM_TRY(lm_tok_trie_insert(&t->trie_raw, s, len, (int32_t)i));
      continue;
    }
    char *ns;
    size_t nn;
    LM_TRY(lm_tok_normalize_str(t, s, len, &ns, &nn));
    lm_status st = LM_OK;
    if (nn != len || memcmp(ns, s, len)) st = lm_tok_strtab_set(&t->added_norm, i, ns, nn);
    if (st == LM_OK && nn > 0) st = lm_tok_trie_insert(&t->trie_norm, ns, nn, (int32_t)i);
    free(ns);
    LM_TRY(st);
  }
  return LM_OK;
}

lm_status lm_tok_parse_added(lm_tokenizer *t, const json_t *v, const char *name) {
  size_t n = json_is_array(v) ? json_array_size(v) : 0;
  if (v && !json_is_null(v) && !json_is_array(v))
    return LM_ERRF(LM_ERR_CORRUPT, "%s: added_tokens is not an array", name);
  t->added = calloc(n ? n : 1, sizeof *t->added);
  if (!t->added) return LM_ERRF(LM_ERR_NOMEM, "tokenizer: out of memory");
  LM_TRY(lm_tok_smap_init(&t->added_map, n));
  /* HF: next_id starts at the model's vocabulary size (its number of entries) */
  int32_t next_id = (int32_t)t->vocab_map.n;
  for (size_t i = 0; i < n; i++) {
    added_json a;
    LM_TRY(read_added(json_array_get(v, i), i, name, &a));
    if (a.len == 0) continue; /* HF ignores empty added tokens */
    LM_TRY(register_added(t, &a, &next_id));
  }
  return index_added(t);
}

void lm_tok_components_free(lm_tokenizer *t) {
  for (size_t i = 0; i < t->n_norm; i++) {
    lm_tok_pattern_free(&t->norm[i].pat);
    free(t->norm[i].content);
  }
  free(t->norm);
  for (size_t i = 0; i < t->n_pretok; i++)
    lm_tok_pattern_free(&t->pretok[i].pat);
  free(t->pretok);
  for (size_t i = 0; i < t->n_dec; i++) {
    lm_tok_pattern_free(&t->dec[i].pat);
    free(t->dec[i].content);
  }
  free(t->dec);
  free(t->added);
  lm_tok_strtab_free(&t->added_text);
  lm_tok_strtab_free(&t->added_norm);
  lm_tok_smap_free(&t->added_map);
  lm_tok_trie_free(&t->trie_raw);
  lm_tok_trie_free(&t->trie_norm);
  free(t->added_of_id);
  lm_tids_free(&t->prefix);
  lm_tids_free(&t->suffix);
}
