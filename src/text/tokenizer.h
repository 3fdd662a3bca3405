/* tokenizer.h — Hugging Face `tokenizer.json` tokenizers (BPE models), in C.
 *
 * Supported, matching HF `tokenizers` id for id:
 *   model          BPE: merges as "a b" strings or [a, b] pairs, byte_fallback, fuse_unk,
 * unk_token, ignore_merges, continuing_subword_prefix, end_of_word_suffix (dropout must be null or
 * 0). normalizer     Replace (String or Regex pattern), NFC, NFD, NFKC, NFKD, Prepend, Sequence.
 *   pre_tokenizer  Split (String or Regex; every behavior; invert), ByteLevel (GPT-2 byte table,
 *                  add_prefix_space, use_regex), Sequence.
 *   post_processor TemplateProcessing, ByteLevel (no effect on ids), BertProcessing,
 *                  RobertaProcessing, Sequence.
 *   decoder        Replace, ByteFallback, Fuse, Strip, ByteLevel, Sequence.
 *   added_tokens   matched before the model, leftmost-longest, with HF's special / normalized /
 *                  lstrip / rstrip / single_word semantics.
 * Anything else (a Unigram model, a Lowercase normalizer, a Metaspace pre-tokenizer ...) fails
 * to load with LM_ERR_UNSUPPORTED and a message naming it. `truncation` and `padding` are ignored
 * (lumen never truncates or pads). Regexes run on PCRE2 (UTF, UCP, JIT) where HF uses Oniguruma;
 * \s and \S are rewritten to Oniguruma's White_Space meaning (PCRE2 10.42 adds U+180E). Unicode
 * normalization uses utf8proc (Unicode 15). Known deviation: HF resumes its added-token scan
 * right after a token whose rstrip took following spaces, lumen after those spaces (they only
 * differ when an added token starts with whitespace).
 * The golden test (tests/cli/test_tokenizer_goldens.sh) checks all of this against HF
 * tokenizers 0.23.2 on the Gemma 2/3/4, Llama 3 and Qwen 3 files.
 *
 * Text handling: input that is not valid UTF-8 is repaired before encoding, each invalid
 * sequence becoming U+FFFD (maximal subparts, as Python's errors="replace" would hand HF a
 * string); callers that must reject such input check lm_utf8_valid() first (the CLI does).
 *
 * Special tokens: like HF, added tokens (special or not) written in the text are always
 * recognised; `add_special` only controls the post-processor's BOS/EOS. The BOS is never
 * doubled: when the text itself starts with the BOS token, the automatic one is not added.
 *
 * Thread safety: a loaded tokenizer is immutable; every function taking a const lm_tokenizer *
 * may be called from any number of threads at once. A lm_detok belongs to one thread at a time. */
#ifndef LM_TEXT_TOKENIZER_H
#define LM_TEXT_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "lumen.h"

typedef struct lm_tokenizer lm_tokenizer;

/* Loads `path`: a tokenizer.json file, or a directory holding tokenizer.json and optionally
 * tokenizer_config.json (read only in the directory form). From the config: add_bos_token /
 * add_eos_token override the post-processor's template; bos_token / eos_token name the ids that
 * lm_tokenizer_bos/eos report. On success *out owns the tokenizer (free with lm_tokenizer_free).
 * Errors: LM_ERR_IO / LM_ERR_NOT_FOUND (file), LM_ERR_CORRUPT (bad JSON, bad vocab or merges),
 * LM_ERR_UNSUPPORTED (a component lumen does not implement), LM_ERR_NOMEM. */
lm_status lm_tokenizer_load(const char *path, lm_tokenizer **out);
/* The same from the bytes of a tokenizer.json in memory (no tokenizer_config.json); `name` is
 * used in error messages. */
lm_status lm_tokenizer_load_json(const char *json, size_t len, const char *name,
                                 lm_tokenizer **out);
void lm_tokenizer_free(lm_tokenizer *t); /* NULL is a no-op */

/* Max id + 1 over the model vocabulary and the added tokens. */
int32_t lm_tokenizer_vocab_size(const lm_tokenizer *t);

/* Encodes text[0..len) (see "Text handling" and "Special tokens" above). *ids is malloc'ed
 * (caller frees; may be NULL when *n_ids is 0). Errors: LM_ERR_INVALID (NULL arguments),
 * LM_ERR_NOMEM, LM_ERR_CORRUPT (a regex engine failure or an unk token missing from the vocab). */
lm_status lm_tokenizer_encode(const lm_tokenizer *t, const char *text, size_t len, int add_special,
                              int32_t **ids, size_t *n_ids);

/* Decodes ids through the tokenizer's decoder, as HF `decode(ids, skip_special)`: ids without a
 * token are dropped, special tokens are dropped when skip_special is set. *text is malloc'ed,
 * NUL-terminated, valid UTF-8 (caller frees). Errors: LM_ERR_INVALID, LM_ERR_NOMEM. */
lm_status lm_tokenizer_decode(const lm_tokenizer *t, const int32_t *ids, size_t n, int skip_special,
                              char **text, size_t *len);

/* Exact token text -> id (added tokens first, then the model vocabulary), -1 if none. */
int32_t lm_tokenizer_find(const lm_tokenizer *t, const char *token, size_t len);
/* Raw vocabulary string of id (as HF id_to_token: not NUL-terminated), NULL if id has none. */
const char *lm_tokenizer_piece(const lm_tokenizer *t, int32_t id, size_t *len);
/* 1 if id is an added token marked special, else 0. */
int lm_tokenizer_is_special(const lm_tokenizer *t, int32_t id);
/* BOS / EOS ids (tokenizer_config.json, else the post-processor template, else a token named
 * <bos>/<s>/<|begin_of_text|> resp. <eos>/</s>/<|end_of_text|>/<|endoftext|>); -1 if none. */
int32_t lm_tokenizer_bos(const lm_tokenizer *t);
int32_t lm_tokenizer_eos(const lm_tokenizer *t);
/* 1 if lm_tokenizer_encode(..., add_special = 1, ...) prepends the BOS id. */
int lm_tokenizer_adds_bos(const lm_tokenizer *t);

/* Streaming detokenizer: turns ids, one at a time, into text that never ends inside a UTF-8
 * sequence. An unfinished multi-byte tail is held back until it completes; bytes that can never
 * complete become U+FFFD (one per maximal subpart), and lm_detok_flush turns a dangling tail into
 * U+FFFD. For input whose batch decode contains no U+FFFD, the concatenated pieces equal
 * lm_tokenizer_decode of the same ids. (HF's ByteFallback decoder turns an invalid run of byte
 * tokens into one U+FFFD per byte; the stream may use fewer, one per maximal subpart.) */
typedef struct lm_detok lm_detok;

/* Errors: LM_ERR_INVALID, LM_ERR_NOMEM, LM_ERR_UNSUPPORTED (a Strip decoder that strips the end
 * of the whole text, which a stream cannot know). The tokenizer must outlive the detokenizer. */
lm_status lm_detok_create(const lm_tokenizer *t, int skip_special, lm_detok **out);
void lm_detok_free(lm_detok *d); /* NULL is a no-op */
/* Feeds one id; *text and *len give the newly completed valid UTF-8 (may be empty), valid until the
 * next call on d. An id without a token adds nothing. Errors: LM_ERR_INVALID, LM_ERR_NOMEM. */
lm_status lm_detok_push(lm_detok *d, int32_t id, const char **text, size_t *len);
/* Ends the stream: returns what was held back (a dangling tail as U+FFFD) and resets d. */
lm_status lm_detok_flush(lm_detok *d, const char **text, size_t *len);
/* Drops held-back bytes and starts a new stream. */
void lm_detok_reset(lm_detok *d);
/* The bytes one id contributes on its own, through the decoder's per-token steps (a byte-fallback
 * token is its one byte, which may be part of a UTF-8 sequence): what a grammar over the output's
 * bytes sees of it. Leaves the stream as it is. *bytes is valid until the next call on d. Errors:
 * LM_ERR_INVALID (an id without a token), LM_ERR_NOMEM. */
lm_status lm_detok_token_bytes(lm_detok *d, int32_t id, const char **bytes, size_t *len);

#endif
