/* tokenizer_impl.h — internals shared by the tokenizer_*.c files (not a public header).
 *
 * Data flow of one encode, mirroring HF `TokenizerImpl::encode_single_sequence`:
 *   text --(non-normalized added tokens, raw trie)--> segments
 *        --(normalizers)--> --(normalized added tokens, normalized trie)--> segments
 *        --(pre-tokenizers)--> pieces --(BPE)--> ids --(post-processor)--> ids
 * Files: tokenizer_tables.c (buffers, string table, hash maps), tokenizer_json.c (a strict
 * streaming JSON scanner for the big vocab/merges arrays), tokenizer_load.c (file, top level,
 * load/free), tokenizer_model.c (the BPE model), tokenizer_config.c (BOS/EOS,
 * tokenizer_config.json), tokenizer_components.c (normalizer / pre-tokenizer / decoder /
 * post-processor / added-token specs), tokenizer_added.c (added-token trie and matching),
 * tokenizer_normalize.c, tokenizer_pretok.c (Split, ByteLevel, regex), tokenizer_bpe.c,
 * tokenizer_encode.c, tokenizer_decode.c, tokenizer_detok.c. */
#ifndef LM_TEXT_TOKENIZER_IMPL_H
#define LM_TEXT_TOKENIZER_IMPL_H

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <jansson.h>
#include <pcre2.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "text/tokenizer.h"

/* Hard limits on untrusted files: ids index arrays, so they are bounded before allocation. */
#define LM_TOK_MAX_ID (1 << 24)           /* 16.7M ids: 64x the largest real vocabularies */
#define LM_TOK_MAX_FILE ((size_t)1 << 31) /* 2 GiB tokenizer.json */
#define LM_TOK_NONE UINT32_MAX            /* strtab length of an id that has no string */

/* ---- growable containers (tokenizer_tables.c) --------------------------------------------- */
typedef struct lm_tbuf { /* bytes */
  char *p;
  size_t n, cap;
} lm_tbuf;
typedef struct lm_tids { /* int32 ids */
  int32_t *v;
  size_t n, cap;
} lm_tids;
typedef struct lm_tspan { /* a piece of some buffer; id >= 0 marks an added token */
  size_t off, len;
  int32_t id;
} lm_tspan;
typedef struct lm_tspans {
  lm_tspan *v;
  size_t n, cap;
} lm_tspans;

lm_status lm_tbuf_reserve(lm_tbuf *b, size_t extra);
lm_status lm_tbuf_put(lm_tbuf *b, const void *s, size_t n);
void lm_tbuf_free(lm_tbuf *b);
lm_status lm_tids_push(lm_tids *v, int32_t id);
lm_status lm_tids_append(lm_tids *v, const int32_t *ids, size_t n);
void lm_tids_free(lm_tids *v);
lm_status lm_tspans_push(lm_tspans *v, size_t off, size_t len, int32_t id);
void lm_tspans_free(lm_tspans *v);

/* Strings indexed by a dense number (a token id, an added-token index), in one arena. */
typedef struct lm_tok_strtab {
  lm_tbuf bytes;
  uint32_t *off, *len; /* len == LM_TOK_NONE: no string at this index */
  size_t n;
} lm_tok_strtab;
lm_status lm_tok_strtab_resize(lm_tok_strtab *st, size_t n); /* new slots have no string */
lm_status lm_tok_strtab_set(lm_tok_strtab *st, size_t idx, const char *s, size_t n);
static inline const char *lm_tok_strtab_get(const lm_tok_strtab *st, size_t idx, size_t *len) {
  if (idx >= st->n || st->len[idx] == LM_TOK_NONE) return NULL;
  *len = st->len[idx];
  return st->bytes.p + st->off[idx];
}
void lm_tok_strtab_free(lm_tok_strtab *st);

/* Open-addressing (linear probing) map from a string to an index of a strtab. A slot keeps the
 * key's hash, its first bytes and its place in the strtab arena, so most lookups touch one cache
 * line (resolving Gemma's 515k merges takes 1.5M lookups, which bounds the load time). */
typedef struct lm_tok_sslot {
  uint64_t head; /* the key's first 8 bytes, zero-padded: short keys compare without the arena */
  uint32_t hash;
  int32_t idx; /* -1: empty */
  uint32_t off, len;
} lm_tok_sslot;
typedef struct lm_tok_smap {
  lm_tok_sslot *slot;
  size_t mask, n;
} lm_tok_smap;
uint32_t lm_tok_hash(const char *s, size_t n);
lm_status lm_tok_smap_init(lm_tok_smap *m, size_t expected);
/* Maps the string of index idx to idx. If the string was present, *prev (if non-NULL) gets the
 * index it mapped to (which is replaced), else -1. */
lm_status lm_tok_smap_put(lm_tok_smap *m, const lm_tok_strtab *st, int32_t idx, int32_t *prev);
/* The same with the string's lm_tok_hash computed by the caller. */
lm_status lm_tok_smap_put_h(lm_tok_smap *m, const lm_tok_strtab *st, int32_t idx, uint32_t h,
                            int32_t *prev);
int32_t lm_tok_smap_get(const lm_tok_smap *m, const lm_tok_strtab *st, const char *s, size_t n);
/* The same with the hash computed by the caller, who may prefetch its slot first (bulk lookups
 * at load overlap their cache misses this way). */
int32_t lm_tok_smap_get_h(const lm_tok_smap *m, const lm_tok_strtab *st, const char *s, size_t n,
                          uint32_t h);
static inline void lm_tok_smap_prefetch(const lm_tok_smap *m, uint32_t h) {
  if (m->slot) __builtin_prefetch(&m->slot[h & m->mask]);
}
void lm_tok_smap_free(lm_tok_smap *m);

/* Map from a token-id pair to its merge (rank, resulting id). */
typedef struct lm_tok_merge {
  uint64_t key; /* (left << 32) | right; UINT64_MAX is empty */
  uint32_t rank;
  int32_t id;
} lm_tok_merge;
typedef struct lm_tok_pmap {
  lm_tok_merge *slot;
  size_t mask, n;
} lm_tok_pmap;
lm_status lm_tok_pmap_init(lm_tok_pmap *m, size_t expected);
lm_status lm_tok_pmap_put(lm_tok_pmap *m, int32_t a, int32_t b, uint32_t rank, int32_t id);
/* Home slot of a pair: the splitmix64 finalizer spreads (left, right) over all index bits. */
static inline size_t lm_tok_pmap_home(uint64_t key, size_t mask) {
  key ^= key >> 30;
  key *= 0xbf58476d1ce4e5b9ull;
  key ^= key >> 27;
  key *= 0x94d049bb133111ebull;
  key ^= key >> 31;
  return (size_t)key & mask;
}
static inline const lm_tok_merge *lm_tok_pmap_get(const lm_tok_pmap *m, int32_t a, int32_t b) {
  uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
  if (!m->slot) return NULL;
  for (size_t i = lm_tok_pmap_home(key, m->mask);; i = (i + 1) & m->mask) {
    if (m->slot[i].key == key) return &m->slot[i];
    if (m->slot[i].key == UINT64_MAX) return NULL;
  }
}
static inline void lm_tok_pmap_prefetch(const lm_tok_pmap *m, int32_t a, int32_t b) {
  uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
  if (m->slot) __builtin_prefetch(&m->slot[lm_tok_pmap_home(key, m->mask)], 1);
}
void lm_tok_pmap_free(lm_tok_pmap *m);

/* ---- patterns: a literal string or a PCRE2 regex (tokenizer_pretok.c) ----------------------- */
typedef struct lm_tok_pattern {
  char *lit; /* literal when re == NULL (may be empty: matches nothing) */
  size_t lit_len;
  pcre2_code *re;
} lm_tok_pattern;
/* Compiles a regex in HF's dialect (PCRE2_UTF | PCRE2_UCP, JIT when available). */
lm_status lm_tok_pattern_regex(lm_tok_pattern *p, const char *src, size_t n, const char *where);
lm_status lm_tok_pattern_literal(lm_tok_pattern *p, const char *s, size_t n);
void lm_tok_pattern_free(lm_tok_pattern *p);
/* Appends the non-overlapping leftmost matches in s[0..n) as spans (id = 1 for a match, 0 for the
 * text between), covering s exactly, as HF `Pattern::find_matches`. Empty matches are skipped. */
lm_status lm_tok_pattern_find(const lm_tok_pattern *p, const char *s, size_t n, lm_tspans *out);

/* ---- pipeline components (tokenizer_components.c) ------------------------------------------- */
typedef enum {
  LM_TN_REPLACE,
  LM_TN_NFC,
  LM_TN_NFD,
  LM_TN_NFKC,
  LM_TN_NFKD,
  LM_TN_PREPEND
} lm_tn_kind;
typedef struct lm_tok_norm {
  lm_tn_kind kind;
  lm_tok_pattern pat;
  char *content; /* replacement / prepended text */
  size_t content_len;
} lm_tok_norm;

typedef enum { LM_TP_SPLIT, LM_TP_BYTELEVEL } lm_tp_kind;
typedef enum {
  LM_SPLIT_REMOVED,
  LM_SPLIT_ISOLATED,
  LM_SPLIT_MERGED_PREV,
  LM_SPLIT_MERGED_NEXT,
  LM_SPLIT_CONTIGUOUS
} lm_split_behavior;
typedef struct lm_tok_pretok {
  lm_tp_kind kind;
  lm_tok_pattern pat; /* Split's pattern, or ByteLevel's GPT-2 regex when use_regex */
  lm_split_behavior behavior;
  int invert, add_prefix_space, use_regex;
} lm_tok_pretok;

typedef enum {
  LM_TD_REPLACE,
  LM_TD_BYTEFALLBACK,
  LM_TD_FUSE,
  LM_TD_STRIP,
  LM_TD_BYTELEVEL
} lm_td_kind;
typedef struct lm_tok_dec {
  lm_td_kind kind;
  lm_tok_pattern pat; /* Replace */
  char *content;      /* Replace: replacement; Strip: the stripped character (UTF-8) */
  size_t content_len;
  size_t start, stop; /* Strip: at most this many leading / trailing characters */
} lm_tok_dec;

typedef struct lm_tok_added {
  int32_t id;
  uint8_t special, normalized, lstrip, rstrip, single_word;
} lm_tok_added;

/* Byte-level trie over added-token texts; `token` is an added-token index or -1. */
typedef struct lm_tok_trie_node {
  int32_t child, sibling, token;
  uint8_t byte;
} lm_tok_trie_node;
typedef struct lm_tok_trie {
  lm_tok_trie_node *v;
  size_t n, cap;
  int32_t root[256];
} lm_tok_trie;

struct lm_tokenizer {
  /* BPE model */
  lm_tok_strtab vocab;   /* by id */
  lm_tok_smap vocab_map; /* text -> id */
  lm_tok_pmap merges;
  int32_t unk_id;  /* -1: no unk token */
  int unk_missing; /* an unk_token is named but absent from the vocab */
  int byte_fallback, fuse_unk, ignore_merges;
  char *cont_prefix, *word_suffix; /* continuing_subword_prefix, end_of_word_suffix (or NULL) */
  size_t cont_prefix_len, word_suffix_len;
  int32_t byte_ids[256];  /* id of "<0xNN>", -1 if absent */
  int32_t ascii_ids[128]; /* id of each one-character ASCII token, -1 if absent */

  /* added tokens */
  lm_tok_added *added;
  size_t n_added;
  lm_tok_strtab added_text; /* content, by added index */
  lm_tok_strtab added_norm; /* normalized content of normalized tokens, when it differs */
  lm_tok_smap added_map;    /* content -> added index */
  lm_tok_trie trie_raw, trie_norm;
  int32_t *added_of_id; /* [vocab_size] added index or -1 */

  /* pipeline */
  lm_tok_norm *norm;
  size_t n_norm;
  lm_tok_pretok *pretok;
  size_t n_pretok;
  lm_tok_dec *dec;
  size_t n_dec;
  int has_decoder;
  lm_tids prefix, suffix; /* post-processor ids around the text (add_special) */
  int32_t bos, eos, vocab_size;
  int has_template; /* the post-processor defines prefix/suffix ids */
};

/* ---- JSON scanner (tokenizer_json.c) -------------------------------------------------------- */
typedef struct lm_tjs {
  const char *base, *p, *end;
  const char *name; /* file name for messages */
} lm_tjs;
int lm_tjs_peek(lm_tjs *j); /* next non-space byte, -1 at the end */
lm_status lm_tjs_expect(lm_tjs *j, char c);
lm_status lm_tjs_string(lm_tjs *j, lm_tbuf *out); /* appends the decoded bytes */
lm_status lm_tjs_int(lm_tjs *j, int64_t *v);      /* an integer literal */
lm_status lm_tjs_skip(lm_tjs *j);                 /* any value */
/* Skips a value and parses its bytes with jansson (JSON_DECODE_ANY | JSON_ALLOW_NUL). */
lm_status lm_tjs_value(lm_tjs *j, json_t **out);
lm_status lm_tjs_obj_begin(lm_tjs *j, int *more); /* consumes '{' (and '}' if empty) */
lm_status lm_tjs_arr_begin(lm_tjs *j, int *more);
lm_status lm_tjs_next(lm_tjs *j, char close, int *more); /* consumes ',' or the closing byte */
lm_status lm_tjs_end(lm_tjs *j);                         /* only whitespace remains */
size_t lm_tjs_offset(const lm_tjs *j);

/* ---- loading (tokenizer_load.c, tokenizer_components.c) ------------------------------------- */
typedef struct lm_tok_file {
  char *data;
  size_t len;
  int mapped;
} lm_tok_file;
lm_status lm_tok_file_open(const char *path, lm_tok_file *f);
void lm_tok_file_close(lm_tok_file *f);
lm_status lm_tok_parse_json(lm_tokenizer *t, const char *name, const char *data, size_t len);
/* The "model" object (tokenizer_model.c): created per load, fed the value of "model", finished
 * once the whole file is read (the vocab and merges may come in either order). */
typedef struct lm_tok_model_state lm_tok_model_state;
lm_status lm_tok_model_new(lm_tokenizer *t, const char *name, lm_tok_model_state **out);
lm_status lm_tok_model_parse(lm_tjs *j, lm_tok_model_state *mp);
lm_status lm_tok_model_finish(lm_tok_model_state *mp);
void lm_tok_model_free(lm_tok_model_state *mp); /* NULL is a no-op */
lm_status lm_tok_parse_normalizer(lm_tokenizer *t, const json_t *v, const char *name);
lm_status lm_tok_parse_pretokenizer(lm_tokenizer *t, const json_t *v, const char *name);
lm_status lm_tok_parse_decoder(lm_tokenizer *t, const json_t *v, const char *name);
lm_status lm_tok_parse_postprocessor(lm_tokenizer *t, const json_t *v, const char *name);
lm_status lm_tok_parse_added(lm_tokenizer *t, const json_t *v, const char *name);
lm_status lm_tok_apply_config(lm_tokenizer *t, const char *config_path);
void lm_tok_components_free(lm_tokenizer *t);

/* ---- added tokens (tokenizer_added.c) ------------------------------------------------------- */
lm_status lm_tok_trie_insert(lm_tok_trie *tr, const char *s, size_t n, int32_t token);
void lm_tok_trie_init(lm_tok_trie *tr);
void lm_tok_trie_free(lm_tok_trie *tr);
/* Splits s[0..n) at the added tokens of trie tr (HF AddedVocabulary::find_matches): appends spans
 * relative to base_off, with id >= 0 for a token. */
lm_status lm_tok_added_split(const lm_tokenizer *t, const lm_tok_trie *tr, const char *s, size_t n,
                             size_t base_off, lm_tspans *out);

/* ---- encode stages ------------------------------------------------------------------------ */
/* Normalizers: in[0..n) -> out (cleared first). */
lm_status lm_tok_normalize(const lm_tokenizer *t, const char *in, size_t n, lm_tbuf *out);
/* Applies the normalizers to one added token's text (for normalized added tokens). */
lm_status lm_tok_normalize_str(const lm_tokenizer *t, const char *in, size_t n, char **out,
                               size_t *out_len);
/* Pre-tokenizers: in[0..n) -> sc->pieces[sc->cur] over sc->pre[sc->cur]. */
typedef struct lm_tok_scratch lm_tok_scratch;
lm_status lm_tok_pretokenize(const lm_tokenizer *t, const char *in, size_t n, lm_tok_scratch *sc);
/* BPE of one piece, appending ids. */
lm_status lm_tok_bpe(const lm_tokenizer *t, const char *w, size_t n, lm_tok_scratch *sc,
                     lm_tids *out);
/* GPT-2's byte -> code point table (printable bytes map to themselves, others to U+0100 + k). */
uint32_t lm_tok_byte_char(uint8_t b);
int lm_tok_char_byte(uint32_t cp); /* inverse, -1 when cp is not in the table */

/* Per-call working memory: one per encode call (a tokenizer is shared between threads). */
struct lm_tok_scratch {
  lm_tbuf norm, pre[2], tmp;
  lm_tspans segs, segs2, pieces[2], found;
  int cur; /* pieces[cur] over pre[cur] hold the pre-tokenizer output */
  /* BPE symbols and heap */
  int32_t *sym_id, *sym_prev, *sym_next;
  uint64_t *heap;
  size_t sym_cap, heap_cap;
  lm_tbuf word; /* a character with continuing_subword_prefix / end_of_word_suffix */
};
void lm_tok_scratch_free(lm_tok_scratch *sc);

/* ---- decoding ----------------------------------------------------------------------------- */
/* The text a decoder sees for id (HF simple_id_to_token, else the model's), NULL if none. */
const char *lm_tok_decode_text(const lm_tokenizer *t, int32_t id, size_t *len);
/* ByteLevel decoding of one token: its GPT-2 characters as bytes, or its raw text if any character
 * is outside the table. Appends to out. */
lm_status lm_tok_bytelevel_bytes(const char *p, size_t n, lm_tbuf *out);
/* Parses "<0xNN>" (exactly 6 bytes); returns the byte or -1. */
int lm_tok_byte_token(const char *s, size_t n);

#endif
