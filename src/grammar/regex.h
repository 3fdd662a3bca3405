/* regex.h — the JSON Schema "pattern" subset (ECMA-262 syntax) → grammar IR, for the inside of a
 * JSON string: each character the pattern matches is matched in its JSON-encoded form (a quote
 * as \", a control character as its escape), so the string the model writes decodes to a value
 * the pattern matches.
 *
 * Supported: literals, ., classes [...] / [^...] with ranges, \d \D \w \W \s \S (also inside
 * classes), escapes \t \n \r \f \v \0 \xHH \uHHHH \u{H...} and escaped punctuation, groups
 * (...) (?:...) (?<name>...), alternation |, quantifiers * + ? {n} {n,} {n,m} (a lazy ? after
 * them changes nothing: the language is the same), ^ at the start and $ at the end. Without
 * them the pattern may match anywhere in the string, as JSON Schema says (any characters before
 * and after). Refused with LM_ERR_UNSUPPORTED: backreferences, lookaround, \b \B, \p{...}, ^ or
 * $ elsewhere. */
#ifndef LM_GRAMMAR_REGEX_H
#define LM_GRAMMAR_REGEX_H

#include "grammar/grammar_ir.h"
#include "grammar/grammar_utf8.h"

/* A rule for the JSON-encoded contents (no quotes) of strings matching the pattern. Errors:
 * LM_ERR_INVALID (a syntax error, with its offset), LM_ERR_UNSUPPORTED (the construct named). */
lm_status lm_regex_to_gir(lm_gir *b, const char *pattern, size_t len, const char *name,
                          int32_t *rule);

/* Appends to s one element matching one character of the normalized set `cps` in its JSON
 * string form (raw UTF-8, or the escape where JSON requires one). */
lm_status lm_json_char_class(lm_gir *b, lm_gseq *s, const lm_cpset *cps, const char *name);

#endif
