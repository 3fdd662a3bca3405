/* call_grammar.h — the grammar of a Gemma 4 tool call, as GBNF text (llama.cpp's notation, root
 * rule "root"), made from the tools a request offers: the text between <|tool_call> and
 * <tool_call|>, "call:NAME{ARGS}", where NAME is one of the tools and ARGS follows that tool's
 * parameters schema in the call syntax's own value format (the one parse_call.c reads and the chat
 * template writes): <|"|>-quoted strings without escapes, bare keys in the schema's sorted order,
 * bare numbers, true / false / null, [a,b] lists, no whitespace.
 *
 * The schema subset: type (and type lists, nullable), properties, required, additionalProperties
 * (an object with properties holds only those; without properties, any keys), items, minItems,
 * maxItems, enum, const, anyOf, oneOf (as anyOf), allOf of object schemas, $ref into $defs or
 * definitions (recursion allowed), string minLength / maxLength, integer minimum / maximum /
 * exclusiveMinimum / exclusiveMaximum, number minimum 0. Annotations (description, title,
 * examples, default, format, $comment, ...) are ignored. Any other keyword is LM_ERR_UNSUPPORTED
 * naming it, its JSON pointer and the tool.
 *
 * Bounds that keep a small model from running away: strings never contain "<|" (the call syntax's
 * control tokens start so) nor end in "<", and a bounded string (maxLength) holds no "<" at all;
 * integers have at most 16 digits, fractions 16 and exponents 3. */
#ifndef LM_TEXT_CALL_GRAMMAR_H
#define LM_TEXT_CALL_GRAMMAR_H

#include "lumen.h"

/* tools_json: a JSON array of {"type": "function", "function": {"name", "parameters"}} (or bare
 * function objects); only_name: when not NULL, the one tool that may be called. *gbnf is malloc'ed.
 * Errors: LM_ERR_INVALID (bad JSON, no tool, a tool without a name, only_name not among them),
 * LM_ERR_UNSUPPORTED (a schema keyword outside the subset), LM_ERR_NOMEM. */
lm_status lm_call_grammar_gemma4(const char *tools_json, const char *only_name, char **gbnf);

#endif
