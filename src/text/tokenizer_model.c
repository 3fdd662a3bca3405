/* tokenizer_model.c — the BPE model of tokenizer.json ("model": type, options, vocab, merges),
 * streamed from the JSON scanner into the tokenizer's own tables (see tokenizer_json.c for why).
 * Mirrors HF BPE deserialization and `BpeBuilder::build`: every merge's parts and its
 * concatenation must be in the vocab, a pair listed twice keeps its last rank, "#version" lines
 * of legacy "a b" merges are skipped. Merges are resolved while they are read when the vocab came
 * first (the usual key order), else once the whole object has been read. */
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer_impl.h"

/* items ahead: enough misses in flight, within the CPU's fill buffers */
#define LM_TOK_PREFETCH 12
typedef struct vocab_entry {
  uint32_t off, len;
  int32_t id;
  uint32_t hash;
} vocab_entry;
typedef struct merge_entry { /* a merge whose strings wait for the vocab */
  uint32_t a_off, a_len, b_off, b_len;
} merge_entry;
typedef struct merge_pair {
  int32_t a, b;
} merge_pair;
struct lm_tok_model_state {
  lm_tokenizer *t;
  const char *name;
  lm_tbuf keys; /* vocab strings, then moved into t->vocab */
  vocab_entry *ents;
  size_t n_ents, cap_ents;
  lm_tbuf mbytes;    /* merge strings (of one batch once the vocab is known) */
  lm_tbuf cat;       /* a merge's concatenation */
  merge_entry *late; /* the current batch, or every merge when the vocab comes later */
  merge_pair *pairs; /* resolved merges, by rank */
  size_t n_merges;
  int merge_form; /* 0 unknown, 1 "a b" strings, 2 [a, b] pairs */
  int have_vocab, have_merges;
  int early;          /* the merges were resolved while parsing (the vocab came first) */
  size_t batch_rank0; /* rank of the first merge of the current batch */
  char *early_prefix; /* continuing_subword_prefix the merges were resolved with (NULL: none) */
  size_t n_missing;   /* early merges whose concatenation was not in the vocab */
  json_t *scalars;    /* the other keys of "model", as an object */
};
typedef struct lm_tok_model_state model_state;

static lm_status build_vocab(lm_tokenizer *t, model_state *mp, const char *name);

static lm_status grow_array(void **p, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return LM_OK;
  size_t c = *cap ? *cap * 2 : 1024;
  while (c < need)
    c *= 2;
  void *q = realloc(*p, c * elem);
  if (!q) return LM_ERRF(LM_ERR_NOMEM, "tokenizer: out of memory (%zu entries)", c);
  *p = q;
  *cap = c;
  return LM_OK;
}

static lm_status parse_vocab(lm_tjs *j, model_state *mp) {
  int more;
  if (mp->have_vocab) return LM_ERRF(LM_ERR_CORRUPT, "%s: model.vocab appears twice", j->name);
  if (lm_tjs_peek(j) != '{')
    return LM_ERRF(LM_ERR_CORRUPT, "%s: model.vocab is not an object (BPE needs a token -> id map)",
                   j->name);
  LM_TRY(lm_tjs_obj_begin(j, &more));
  mp->keys.n = 0, mp->n_ents = 0;
  while (more) {
    size_t off = mp->keys.n;
    if (lm_tjs_peek(j) != '"')
      return LM_ERRF(LM_ERR_CORRUPT, "%s: invalid JSON at byte %zu: expected a key", j->name,
                     lm_tjs_offset(j));
    LM_TRY(lm_tjs_string(j, &mp->keys));
    LM_TRY(lm_tjs_expect(j, ':'));
    int64_t id;
    size_t at = lm_tjs_offset(j);
    if (lm_tjs_int(j, &id) != LM_OK)
      return LM_ERRF(LM_ERR_CORRUPT, "%s: byte %zu: model.vocab: id of '%.*s' is not an integer",
                     j->name, at, (int)(mp->keys.n - off > 64 ? 64 : mp->keys.n - off),
                     mp->keys.p + off);
    if (id < 0 || id >= LM_TOK_MAX_ID)
      return LM_ERRF(LM_ERR_CORRUPT, "%s: model.vocab: id %lld of '%.*s' is outside [0, %d)",
                     j->name, (long long)id, (int)(mp->keys.n - off > 64 ? 64 : mp->keys.n - off),
                     mp->keys.p + off, LM_TOK_MAX_ID);
    if (mp->keys.n >= UINT32_MAX)
      return LM_ERRF(LM_ERR_UNSUPPORTED, "%s: vocab strings exceed 4 GiB", j->name);
    LM_TRY(grow_array((void **)&mp->ents, &mp->cap_ents, mp->n_ents + 1, sizeof *mp->ents));
    mp->ents[mp->n_ents++] =
        (vocab_entry){(uint32_t)off, (uint32_t)(mp->keys.n - off), (int32_t)id, 0};
    LM_TRY(lm_tjs_next(j, '}', &more));
  }
  mp->have_vocab = 1;
  return build_vocab(mp->t, mp, j->name);
}

#define LM_TOK_MERGE_BATCH 256

static lm_status merge_missing(const model_state *mp, size_t rank, const char *s, size_t n) {
  return LM_ERRF(LM_ERR_CORRUPT, "%s: model.merges: entry %zu: token '%.*s' is not in the vocab",
                 mp->name, rank + 1, (int)(n > 64 ? 64 : n), s);
}

/* Resolves k merges (strings in mp->mbytes) with ranks rank0..: each one's tokens and their
 * concatenation (a + b without b's continuing_subword_prefix, as BpeBuilder::build) must be in the
 * vocab. Hashes first, then lookups that prefetch their slots a few merges ahead so that the cache
 * misses of neighbouring merges can overlap. These lookups are most of the load time of a
 * 515k-merge file; on the busy 2-core development VM the prefetch's gain was within noise. */
static lm_status resolve_batch(model_state *mp, const char *prefix, size_t plen,
                               const merge_entry *e, size_t k, size_t rank0) {
  lm_tokenizer *t = mp->t;
  uint32_t h[2 * LM_TOK_MERGE_BATCH], hc[LM_TOK_MERGE_BATCH];
  size_t coff[LM_TOK_MERGE_BATCH + 1];
  const char *base = mp->mbytes.p;
  for (size_t i = 0; i < k; i++) {
    h[2 * i] = lm_tok_hash(base + e[i].a_off, e[i].a_len);
    h[2 * i + 1] = lm_tok_hash(base + e[i].b_off, e[i].b_len);
    if (i < LM_TOK_PREFETCH)
      lm_tok_smap_prefetch(&t->vocab_map, h[2 * i]),
          lm_tok_smap_prefetch(&t->vocab_map, h[2 * i + 1]);
  }
  mp->cat.n = 0;
  for (size_t i = 0; i < k; i++) {
    if (i + LM_TOK_PREFETCH < k) {
      lm_tok_smap_prefetch(&t->vocab_map, h[2 * (i + LM_TOK_PREFETCH)]);
      lm_tok_smap_prefetch(&t->vocab_map, h[2 * (i + LM_TOK_PREFETCH) + 1]);
    }
    const char *a = base + e[i].a_off, *b = base + e[i].b_off;
    int32_t ia = lm_tok_smap_get_h(&t->vocab_map, &t->vocab, a, e[i].a_len, h[2 * i]);
    int32_t ib = lm_tok_smap_get_h(&t->vocab_map, &t->vocab, b, e[i].b_len, h[2 * i + 1]);
    if (ia < 0) return merge_missing(mp, rank0 + i, a, e[i].a_len);
    if (ib < 0) return merge_missing(mp, rank0 + i, b, e[i].b_len);
    size_t cut = prefix && e[i].b_len >= plen && !memcmp(b, prefix, plen) ? plen : 0;
    coff[i] = mp->cat.n;
    LM_TRY(lm_tbuf_put(&mp->cat, a, e[i].a_len));
    LM_TRY(lm_tbuf_put(&mp->cat, b + cut, e[i].b_len - cut));
    hc[i] = lm_tok_hash(mp->cat.p + coff[i], mp->cat.n - coff[i]);
    mp->pairs[rank0 + i] = (merge_pair){ia, ib};
  }
  coff[k] = mp->cat.n;
  for (size_t i = 0; i < k && i < LM_TOK_PREFETCH; i++) {
    lm_tok_smap_prefetch(&t->vocab_map, hc[i]);
    lm_tok_pmap_prefetch(&t->merges, mp->pairs[rank0 + i].a, mp->pairs[rank0 + i].b);
  }
  for (size_t i = 0; i < k; i++) {
    size_t ahead = i + LM_TOK_PREFETCH;
    if (ahead < k) {
      lm_tok_smap_prefetch(&t->vocab_map, hc[ahead]);
      lm_tok_pmap_prefetch(&t->merges, mp->pairs[rank0 + ahead].a, mp->pairs[rank0 + ahead].b);
    }
    const char *c = mp->cat.p + coff[i];
    int32_t id = lm_tok_smap_get_h(&t->vocab_map, &t->vocab, c, coff[i + 1] - coff[i], hc[i]);
    if (id < 0 && mp->early) { /* a continuing_subword_prefix may still come: judged at the end */
      mp->n_missing++;
      continue;
    }
    if (id < 0) return merge_missing(mp, rank0 + i, c, coff[i + 1] - coff[i]);
    LM_TRY(lm_tok_pmap_put(&t->merges, mp->pairs[rank0 + i].a, mp->pairs[rank0 + i].b,
                           (uint32_t)(rank0 + i), id));
  }
  return LM_OK;
}

/* The continuing_subword_prefix seen so far in the model object. */
static const char *prefix_so_far(const model_state *mp, size_t *len) {
  const json_t *v = json_object_get(mp->scalars, "continuing_subword_prefix");
  *len = json_is_string(v) ? json_string_length(v) : 0;
  return json_is_string(v) ? json_string_value(v) : NULL;
}

/* A merge's two strings, decoded into mp->mbytes from *off on. */
static lm_status merge_strings(lm_tjs *j, model_state *mp, size_t off, size_t at, size_t *alen,
                               size_t *blen, int *skip) {
  int c = lm_tjs_peek(j), form = c == '"' ? 1 : c == '[' ? 2 : 0, more;
  *skip = 0;
  if (!form || (mp->merge_form && form != mp->merge_form))
    return LM_ERRF(LM_ERR_CORRUPT,
                   "%s: byte %zu: model.merges: entry %zu is neither a \"a b\" string nor an [a, "
                   "b] pair like the others",
                   j->name, at, mp->n_merges + 1);
  mp->merge_form = form;
  if (form == 1) { /* "a b": exactly one space, as HF's convert_merges_to_hashmap */
    LM_TRY(lm_tjs_string(j, &mp->mbytes));
    size_t len = mp->mbytes.n - off;
    const char *s = mp->mbytes.p + off, *sp = memchr(s, ' ', len);
    if (len >= 8 && !memcmp(s, "#version", 8)) return *skip = 1, LM_OK;
    if (!sp || memchr(sp + 1, ' ', len - (size_t)(sp - s) - 1))
      return LM_ERRF(
          LM_ERR_CORRUPT,
          "%s: model.merges: entry %zu (\"%.*s\") is not two tokens separated by one space",
          j->name, mp->n_merges + 1, (int)(len > 64 ? 64 : len), s);
    *alen = (size_t)(sp - s), *blen = len - *alen - 1;
    memmove((char *)sp, sp + 1, *blen); /* a and b back to back, like the pair form */
    mp->mbytes.n--;
    return LM_OK;
  }
  size_t part[3] = {off, 0, 0}, n = 0;
  LM_TRY(lm_tjs_arr_begin(j, &more));
  while (more) {
    if (n == 2 || lm_tjs_peek(j) != '"')
      return LM_ERRF(LM_ERR_CORRUPT,
                     "%s: byte %zu: model.merges: entry %zu is not a pair of strings", j->name, at,
                     mp->n_merges + 1);
    LM_TRY(lm_tjs_string(j, &mp->mbytes));
    part[++n] = mp->mbytes.n;
    LM_TRY(lm_tjs_next(j, ']', &more));
  }
  if (n != 2)
    return LM_ERRF(LM_ERR_CORRUPT, "%s: byte %zu: model.merges: entry %zu is not a pair of strings",
                   j->name, at, mp->n_merges + 1);
  *alen = part[1] - part[0], *blen = part[2] - part[1];
  return LM_OK;
}

/* Resolves the merges batched so far (the vocab is known: the usual key order). */
static lm_status flush_batch(model_state *mp) {
  size_t plen, k = mp->n_merges - mp->batch_rank0;
  const char *prefix = prefix_so_far(mp, &plen);
  lm_status s = resolve_batch(mp, prefix, plen, mp->late, k, mp->batch_rank0);
  mp->batch_rank0 = mp->n_merges;
  mp->mbytes.n = 0;
  return s;
}

/* One merge: its strings join the current batch (all merges, when the vocab comes later). */
static lm_status parse_merge(lm_tjs *j, model_state *mp) {
  size_t at = lm_tjs_offset(j), off = mp->mbytes.n, alen = 0, blen = 0;
  int skip;
  LM_TRY(merge_strings(j, mp, off, at, &alen, &blen, &skip));
  if (skip) {
    mp->mbytes.n = off;
    return LM_OK;
  }
  if (mp->mbytes.n >= UINT32_MAX)
    return LM_ERRF(LM_ERR_UNSUPPORTED, "%s: merge strings exceed 4 GiB", j->name);
  size_t slot = mp->have_vocab ? mp->n_merges - mp->batch_rank0 : mp->n_merges;
  mp->late[slot] =
      (merge_entry){(uint32_t)off, (uint32_t)alen, (uint32_t)(off + alen), (uint32_t)blen};
  mp->n_merges++;
  if (mp->have_vocab && mp->n_merges - mp->batch_rank0 == LM_TOK_MERGE_BATCH)
    return flush_batch(mp);
  return LM_OK;
}

/* Counts the elements of the array at the cursor without moving it (sizes the tables once). */
static lm_status count_elements(const lm_tjs *j, size_t *n) {
  lm_tjs c = *j;
  int more;
  *n = 0;
  LM_TRY(lm_tjs_arr_begin(&c, &more));
  while (more) {
    LM_TRY(lm_tjs_skip(&c));
    ++*n;
    LM_TRY(lm_tjs_next(&c, ']', &more));
  }
  return LM_OK;
}

static lm_status parse_merges(lm_tjs *j, model_state *mp) {
  int more;
  size_t count;
  if (mp->have_merges) return LM_ERRF(LM_ERR_CORRUPT, "%s: model.merges appears twice", j->name);
  if (lm_tjs_peek(j) != '[')
    return LM_ERRF(LM_ERR_CORRUPT, "%s: model.merges is not an array", j->name);
  LM_TRY(count_elements(j, &count));
  mp->pairs = malloc((count ? count : 1) * sizeof *mp->pairs);
  mp->late = malloc((mp->have_vocab ? LM_TOK_MERGE_BATCH : count ? count : 1) * sizeof *mp->late);
  if (!mp->pairs || !mp->late)
    return LM_ERRF(LM_ERR_NOMEM, "tokenizer: out of memory (%zu merges)", count);
  if (mp->have_vocab) {
    size_t plen;
    const char *p = prefix_so_far(mp, &plen);
    if (p && !(mp->early_prefix = strdup(p)))
      return LM_ERRF(LM_ERR_NOMEM, "tokenizer: out of memory");
    LM_TRY(lm_tok_pmap_init(&mp->t->merges, count));
    mp->early = 1;
  }
  LM_TRY(lm_tjs_arr_begin(j, &more));
  while (more) {
    LM_TRY(parse_merge(j, mp));
    LM_TRY(lm_tjs_next(j, ']', &more));
  }
  mp->have_merges = 1;
  return mp->have_vocab ? flush_batch(mp) : LM_OK;
}

lm_status lm_tok_model_parse(lm_tjs *j, model_state *mp) {
  int more;
  lm_tbuf key = {0};
  lm_status s = LM_OK;
  if (lm_tjs_peek(j) != '{')
    return LM_ERRF(LM_ERR_CORRUPT, "%s: \"model\" is not an object", j->name);
  if (mp->scalars) return LM_ERRF(LM_ERR_CORRUPT, "%s: \"model\" appears twice", j->name);
  LM_TRY(lm_tjs_obj_begin(j, &more));
  mp->scalars = json_object();
  if (!mp->scalars) return LM_ERRF(LM_ERR_NOMEM, "tokenizer: out of memory");
  while (more && s == LM_OK) {
    key.n = 0;
    if (lm_tjs_peek(j) != '"')
      s = LM_ERRF(LM_ERR_CORRUPT, "%s: invalid JSON at byte %zu: expected a key", j->name,
                  lm_tjs_offset(j));
    if (s == LM_OK) s = lm_tjs_string(j, &key);
    if (s == LM_OK) s = lm_tjs_expect(j, ':');
    if (s != LM_OK) break;
    if (key.n == 5 && !memcmp(key.p, "vocab", 5))
      s = parse_vocab(j, mp);
    else if (key.n == 6 && !memcmp(key.p, "merges", 6))
      s = parse_merges(j, mp);
    else if (key.n < 64 && !memchr(key.p, 0, key.n)) {
      json_t *v;
      s = lm_tjs_value(j, &v);
      if (s == LM_OK) {
        key.p[key.n] = '\0'; /* lm_tbuf keeps room for the NUL */
        json_object_set_new(mp->scalars, key.p, v);
        /* the type comes first in HF files: refuse other models before parsing their vocab */
        if (!strcmp(key.p, "type") && json_is_string(v) && strcmp(json_string_value(v), "BPE"))
          s = LM_ERRF(LM_ERR_UNSUPPORTED,
                      "%s: model type '%s' is not supported (lumen implements BPE)", j->name,
                      json_string_value(v));
      }
    } else
      s = lm_tjs_skip(j);
    if (s == LM_OK) s = lm_tjs_next(j, '}', &more);
  }
  lm_tbuf_free(&key);
  return s;
}

/* Moves the parsed vocab into t->vocab (indexed by id) and builds the text -> id map. */
static lm_status build_vocab(lm_tokenizer *t, model_state *mp, const char *name) {
  int32_t max_id = -1;
  for (size_t i = 0; i < mp->n_ents; i++)
    if (mp->ents[i].id > max_id) max_id = mp->ents[i].id;
  LM_TRY(lm_tok_strtab_resize(&t->vocab, (size_t)max_id + 1));
  t->vocab.bytes = mp->keys;
  memset(&mp->keys, 0, sizeof mp->keys);
  LM_TRY(lm_tok_smap_init(&t->vocab_map, mp->n_ents));
  /* hashes first, then inserts that prefetch their slots a few entries ahead (see resolve_batch) */
  for (size_t i = 0; i < mp->n_ents; i++)
    mp->ents[i].hash = lm_tok_hash(t->vocab.bytes.p + mp->ents[i].off, mp->ents[i].len);
  for (size_t i = 0; i < mp->n_ents; i++) {
    const vocab_entry *e = &mp->ents[i];
    if (i + LM_TOK_PREFETCH < mp->n_ents)
      lm_tok_smap_prefetch(&t->vocab_map, mp->ents[i + LM_TOK_PREFETCH].hash);
    if (t->vocab.len[e->id] != LM_TOK_NONE &&
        (t->vocab.len[e->id] != e->len ||
         memcmp(t->vocab.bytes.p + t->vocab.off[e->id], t->vocab.bytes.p + e->off, e->len)))
      return LM_ERRF(LM_ERR_CORRUPT,
                     "%s: model.vocab: id %d is given to two tokens ('%.*s' and '%.*s')", name,
                     e->id, (int)(t->vocab.len[e->id] > 64 ? 64 : t->vocab.len[e->id]),
                     t->vocab.bytes.p + t->vocab.off[e->id], (int)(e->len > 64 ? 64 : e->len),
                     t->vocab.bytes.p + e->off);
    t->vocab.off[e->id] = e->off, t->vocab.len[e->id] = e->len;
    int32_t prev;
    LM_TRY(lm_tok_smap_put_h(&t->vocab_map, &t->vocab, e->id, e->hash, &prev));
    if (prev >= 0 && prev != e->id)
      t->vocab.len[prev] = LM_TOK_NONE; /* a repeated key: the last one wins */
  }
  t->vocab_size = max_id + 1;
  for (int b = 0; b < 256; b++) {
    char code[7];
    snprintf(code, sizeof code, "<0x%02X>", b);
    t->byte_ids[b] = lm_tok_smap_get(&t->vocab_map, &t->vocab, code, 6);
  }
  for (int c = 0; c < 128; c++) {
    char ch = (char)c;
    t->ascii_ids[c] = lm_tok_smap_get(&t->vocab_map, &t->vocab, &ch, 1);
  }
  return LM_OK;
}

/* After the whole model object: resolves merges that came before the vocab, or re-resolves them
 * if continuing_subword_prefix turned out to come after them. */
static lm_status finish_merges(lm_tokenizer *t, model_state *mp) {
  const char *fp = t->cont_prefix;
  if (!mp->early) {
    LM_TRY(lm_tok_pmap_init(&t->merges, mp->n_merges));
    for (size_t r = 0; r < mp->n_merges; r += LM_TOK_MERGE_BATCH) {
      size_t k = mp->n_merges - r < LM_TOK_MERGE_BATCH ? mp->n_merges - r : LM_TOK_MERGE_BATCH;
      LM_TRY(resolve_batch(mp, fp, t->cont_prefix_len, mp->late + r, k, r));
    }
    return LM_OK;
  }
  if ((!fp && !mp->early_prefix) || (fp && mp->early_prefix && !strcmp(fp, mp->early_prefix))) {
    if (!mp->n_missing) return LM_OK;
    fp = mp->early_prefix; /* the slow path below stops at, and names, the first missing one */
  }
  /* rare: rebuild from the token pairs, with the prefix the file gave after its merges */
  mp->early = 0;
  lm_tok_pmap_free(&t->merges);
  LM_TRY(lm_tok_pmap_init(&t->merges, mp->n_merges));
  for (size_t i = 0; i < mp->n_merges; i++) {
    size_t alen = 0, blen = 0;
    const char *a = lm_tok_strtab_get(&t->vocab, (size_t)mp->pairs[i].a, &alen);
    const char *b = lm_tok_strtab_get(&t->vocab, (size_t)mp->pairs[i].b, &blen);
    if (!a || !b)
      return LM_ERRF(LM_ERR_CORRUPT, "%s: model.merges: entry %zu names a replaced vocab entry",
                     mp->name, i + 1);
    mp->mbytes.n = 0;
    LM_TRY(lm_tbuf_put(&mp->mbytes, a, alen));
    LM_TRY(lm_tbuf_put(&mp->mbytes, b, blen));
    merge_entry e = {0, (uint32_t)alen, (uint32_t)alen, (uint32_t)blen};
    LM_TRY(resolve_batch(mp, fp, fp ? strlen(fp) : 0, &e, 1, i));
  }
  return LM_OK;
}

static lm_status dup_string(const json_t *v, const char *what, const char *name, char **out,
                            size_t *len) {
  *out = NULL, *len = 0;
  if (!v || json_is_null(v)) return LM_OK;
  if (!json_is_string(v))
    return LM_ERRF(LM_ERR_CORRUPT, "%s: model.%s is not a string", name, what);
  *len = json_string_length(v);
  *out = malloc(*len + 1);
  if (!*out) return LM_ERRF(LM_ERR_NOMEM, "tokenizer: out of memory");
  memcpy(*out, json_string_value(v), *len + 1);
  return LM_OK;
}

static lm_status flag(const json_t *obj, const char *key, const char *name, int *out) {
  const json_t *v = json_object_get(obj, key);
  *out = 0;
  if (!v || json_is_null(v)) return LM_OK;
  if (!json_is_boolean(v))
    return LM_ERRF(LM_ERR_CORRUPT, "%s: model.%s is not a boolean", name, key);
  *out = json_is_true(v);
  return LM_OK;
}

static lm_status model_options(lm_tokenizer *t, const json_t *sc, const char *name) {
  const json_t *type = json_object_get(sc, "type");
  if (type && !json_is_string(type))
    return LM_ERRF(LM_ERR_CORRUPT, "%s: model.type is not a string", name);
  if (type && strcmp(json_string_value(type), "BPE"))
    return LM_ERRF(LM_ERR_UNSUPPORTED,
                   "%s: model type '%s' is not supported (lumen implements BPE)", name,
                   json_string_value(type));
  const json_t *dropout = json_object_get(sc, "dropout");
  if (dropout && !json_is_null(dropout) &&
      !(json_is_number(dropout) && json_number_value(dropout) == 0.0))
    return LM_ERRF(LM_ERR_UNSUPPORTED,
                   "%s: BPE dropout is not supported (lumen tokenizes deterministically)", name);
  LM_TRY(flag(sc, "fuse_unk", name, &t->fuse_unk));
  LM_TRY(flag(sc, "byte_fallback", name, &t->byte_fallback));
  LM_TRY(flag(sc, "ignore_merges", name, &t->ignore_merges));
  LM_TRY(dup_string(json_object_get(sc, "continuing_subword_prefix"), "continuing_subword_prefix",
                    name, &t->cont_prefix, &t->cont_prefix_len));
  LM_TRY(dup_string(json_object_get(sc, "end_of_word_suffix"), "end_of_word_suffix", name,
                    &t->word_suffix, &t->word_suffix_len));
  return LM_OK;
}

static lm_status resolve_unk(lm_tokenizer *t, const json_t *sc, const char *name) {
  const json_t *unk = json_object_get(sc, "unk_token");
  t->unk_id = -1;
  if (!unk || json_is_null(unk)) return LM_OK;
  if (!json_is_string(unk))
    return LM_ERRF(LM_ERR_CORRUPT, "%s: model.unk_token is not a string", name);
  t->unk_id =
      lm_tok_smap_get(&t->vocab_map, &t->vocab, json_string_value(unk), json_string_length(unk));
  t->unk_missing = t->unk_id < 0; /* HF fails only when an unknown character needs it */
  return LM_OK;
}

lm_status lm_tok_model_finish(model_state *mp) {
  lm_tokenizer *t = mp->t;
  const char *name = mp->name;
  if (!mp->scalars) return LM_ERRF(LM_ERR_CORRUPT, "%s: no \"model\" object", name);
  LM_TRY(model_options(t, mp->scalars, name));
  if (!mp->have_vocab) return LM_ERRF(LM_ERR_CORRUPT, "%s: model.vocab is missing", name);
  if (!mp->have_merges) return LM_ERRF(LM_ERR_CORRUPT, "%s: model.merges is missing", name);
  LM_TRY(finish_merges(t, mp));
  return resolve_unk(t, mp->scalars, name);
}

lm_status lm_tok_model_new(lm_tokenizer *t, const char *name, model_state **out) {
  *out = calloc(1, sizeof **out);
  if (!*out) return LM_ERRF(LM_ERR_NOMEM, "tokenizer: out of memory");
  (*out)->t = t;
  (*out)->name = name;
  return LM_OK;
}

void lm_tok_model_free(model_state *mp) {
  if (!mp) return;
  lm_tbuf_free(&mp->keys);
  lm_tbuf_free(&mp->mbytes);
  lm_tbuf_free(&mp->cat);
  free(mp->ents);
  free(mp->late);
  free(mp->pairs);
  free(mp->early_prefix);
  json_decref(mp->scalars);
  free(mp);
}
