/* grammar.h — constrained decoding: a grammar (from GBNF or from a JSON Schema) and a per-sequence
 * matcher that says which tokens may come next, in the spirit of XGrammar / llguidance: masks are
 * precomputed per grammar state (cached by state), not recomputed from scratch per token step.
 * Immutable objects (lm_grammar, lm_grammar_vocab) are shared across threads; an lm_matcher belongs
 * to one sequence. No knowledge of HTTP, JSON requests or tensors. */
#ifndef LM_GRAMMAR_H
#define LM_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

typedef struct lm_grammar lm_grammar;

/* llama.cpp GBNF (root rule "root"): rules, alternation, grouping, literals, char classes with
 * ranges and negation, repetition * + ? {m,n}, comments. Errors: LM_ERR_INVALID naming line and
 * column. */
lm_status lm_grammar_from_gbnf(const char *text, size_t len, lm_grammar **out);

/* A JSON Schema (draft 2020-12 subset; what OpenAI strict mode accepts, plus more): type,
 * properties, required, additionalProperties, items / prefixItems, minItems / maxItems, enum,
 * const, anyOf / oneOf, allOf of objects, $ref / $defs / definitions, string minLength / maxLength
 * / pattern (a regex subset) / format (date, time, date-time, uuid, email where practical), integer
 * / number with minimum / maximum where practical, nullable types. Unsupported keywords:
 * LM_ERR_UNSUPPORTED naming the keyword and its JSON pointer. Output JSON has no insignificant
 * whitespace beyond what the grammar allows (a single optional space after ':' and ',' is fine). */
lm_status lm_grammar_from_json_schema(const char *schema, size_t len, lm_grammar **out);

/* Any JSON object (response_format json_object). */
lm_status lm_grammar_json_object(lm_grammar **out);

void lm_grammar_free(lm_grammar *g);

/* (Added) The byte budget of each of g's mask caches (one per vocabulary it is used with;
 * default 64 MiB, about two thousand masks of a 262144-token vocabulary); least recently used
 * masks are dropped past it. Thread-safe. */
void lm_grammar_set_cache_limit(lm_grammar *g, size_t bytes);

/* The tokenizer's vocabulary as the matcher sees it: the bytes of each token (special/control
 * tokens get len 0 and are never allowed by a grammar; the caller decides about EOS). Built once
 * per tokenizer, shared by every matcher. */
typedef struct lm_grammar_vocab lm_grammar_vocab;
lm_status lm_grammar_vocab_create(const char *const *pieces, const size_t *lens, int32_t n,
                                  lm_grammar_vocab **out);
void lm_grammar_vocab_free(lm_grammar_vocab *v);

typedef struct lm_matcher lm_matcher;
lm_status lm_matcher_create(const lm_grammar *g, const lm_grammar_vocab *v, lm_matcher **out);
void lm_matcher_free(lm_matcher *m);

/* The allowed next tokens as a bitset of ceil(n/32) words (bit i of word i/32: token i allowed).
 * Thread-safe for distinct matchers (a shared per-grammar mask cache takes its own lock). */
lm_status lm_matcher_fill_mask(lm_matcher *m, uint32_t *mask);
/* Advances by one token; LM_ERR_INVALID when the token is not allowed (the matcher is unchanged).
 */
/* (Added) Both accept calls and fill_mask may also fail with LM_ERR_UNSUPPORTED when the grammar
 * is too ambiguous at this point (thousands of parses at once; no JSON schema's grammar gets
 * near) and LM_ERR_NOMEM; the matcher is then unchanged. An accept can fail that way for a token
 * fill_mask allowed: the caller ends the sequence with the error. */
lm_status lm_matcher_accept(lm_matcher *m, int32_t id);
/* Advances by raw bytes (text that is forced, e.g. a tool name chosen by the caller). */
lm_status lm_matcher_accept_bytes(lm_matcher *m, const char *bytes, size_t n);
/* 1 when the text so far is a complete sentence of the grammar (EOS may be allowed). */
int lm_matcher_complete(const lm_matcher *m);
/* 1 when no token can extend the text (complete and nothing may follow: the caller ends it). */
int lm_matcher_finished(const lm_matcher *m);
/* Back to the start state. */
void lm_matcher_reset(lm_matcher *m);

#endif
