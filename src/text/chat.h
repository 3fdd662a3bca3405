/* chat.h — chat formatting: render OpenAI-shaped messages into a prompt by running the checkpoint's
 * own chat template (Jinja, see jinja.h), the way transformers' apply_chat_template does.
 *
 * Typical use (server):
 *   lm_chat_template *t;  LM_TRY(lm_chat_template_load(model_dir, &t));   // t == NULL: no template
 *   json_t *msgs, *tools;  LM_TRY(lm_chat_normalize(req_messages, req_tools, &msgs, &tools));
 *   char *prompt;  LM_TRY(lm_chat_render(t, msgs, tools, kwargs, 1, "<bos>", "<eos>", &prompt));
 *   ... tokenize prompt with special-token matching on and no extra BOS ...
 *
 * Thread safety: a loaded template is immutable; renders may run concurrently on one template. */
#ifndef LM_TEXT_CHAT_H
#define LM_TEXT_CHAT_H

#include <jansson.h>

#include "lumen.h"
#include "text/jinja_value.h"

typedef struct lm_chat_template lm_chat_template;

/* Loads the chat template of a model directory, in transformers' order of preference:
 * chat_template.jinja, else chat_template.json {"chat_template": …}, else tokenizer_config.json
 * "chat_template" (a string, or a list of {name, template}: "default" is used, and "tool_use" when
 * the request has tools). *out = NULL with LM_OK when the checkpoint ships none (callers then run
 * raw). Errors: LM_ERR_IO / LM_ERR_CORRUPT (unreadable file, bad JSON, template syntax),
 * LM_ERR_UNSUPPORTED (a template using a Jinja feature this interpreter lacks). */
lm_status lm_chat_template_load(const char *model_dir, lm_chat_template **out);
/* Compiles a template from source text (NUL-terminated). */
/* One template file: Jinja text, or a JSON file (.json: chat_template.json, tokenizer_config.json)
 * whose "chat_template" member holds it. LM_ERR_NOT_FOUND when the file (or the member) is absent.
 */
lm_status lm_chat_template_load_file(const char *path, lm_chat_template **out);
lm_status lm_chat_template_from_string(const char *src, lm_chat_template **out);
/* The built-in ChatML formatter (<|im_start|>role … <|im_end|>, Hermes-style <tool_call> JSON,
 * <think> reasoning), for families that need chat but ship no template. Its output parses with the
 * generic parser of parse.h. */
lm_status lm_chat_template_chatml(lm_chat_template **out);
void lm_chat_template_free(lm_chat_template *t);

/* Renders a prompt.
 *   messages: JSON array of OpenAI-shaped messages ({role, content: string | [{type:"text", text},
 * …], tool_calls, tool_call_id, name, reasoning_content | reasoning}); tools:    JSON array of tool
 * schemas, or NULL (the template sees None); kwargs:   JSON object of extra template variables
 * (e.g. {"enable_thinking": true}), or NULL; bos_token / eos_token: the tokenizer's strings (NULL =
 * ""). The template sees messages, tools, add_generation_prompt, bos_token, eos_token, then the
 * kwargs entries the template refers to (lm_jinja_refers_to; a name of lm_chat_reserved_var()
 * is LM_ERR_INVALID: a request must not replace the messages, tools or special tokens). Nothing is
 * normalized here: call lm_chat_normalize() first. On LM_OK *out is malloc'd (free() it). A
 * template error (raise_exception, bad input shape, a runaway loop) is LM_ERR_INVALID with the
 * template line/column in lm_errmsg(). */
lm_status lm_chat_render(const lm_chat_template *t, const json_t *messages, const json_t *tools,
                         const json_t *kwargs, int add_generation_prompt, const char *bos_token,
                         const char *eos_token, char **out);

/* 1 for the variables the renderer or the interpreter provides (messages, tools, bos_token,
 * eos_token, add_generation_prompt, the builtins), which kwargs may not set. */
int lm_chat_reserved_var(const char *name);

/* The same over interpreter values built in `arena` (e.g. by lm_jv_parse_json(), which keeps
 * integers beyond 64 bits that jansson cannot hold). tools/kwargs may be LM_JV_UNDEF or None. */
lm_status lm_chat_render_values(const lm_chat_template *t, lm_jarena *arena, lm_jv messages,
                                lm_jv tools, lm_jv kwargs, int add_generation_prompt,
                                const char *bos_token, const char *eos_token, char **out);

/* What a server must do to an OpenAI request before rendering (gemma4-chat.md §5); returns new
 * copies
 * (*messages_out, *tools_out: json_decref() them; *tools_out is NULL when tools is NULL):
 *   - assistant tool_calls[].function.arguments given as a JSON string is decoded into an object,
 * keeping int vs float ("" means {}). Invalid JSON, or JSON that is not an object, is
 * LM_ERR_INVALID naming the message and call (answer 400; never pass the string through: templates
 * either paste it verbatim or raise). Integers beyond 64 bits are LM_ERR_INVALID too (jansson
 * cannot hold them);
 *   - a tool message's content that is neither a string nor a parts list (an object, a number) is
 *     replaced by its compact JSON text, and null content by "" (the Gemma template raises on
 * objects); a tool message without `name` gets the name of the call its tool_call_id answers;
 *   - every schema in tools (function.parameters, and recursively properties / items) that lacks
 *     "type" gets one: "object" if it has properties, "array" if it has items, the JSON type of its
 *     first enum value, else "string" (the Gemma declaration syntax needs a type on each level).
 * Reasoning fields (reasoning_content / reasoning) pass through: templates decide what survives. */
lm_status lm_chat_normalize(const json_t *messages, const json_t *tools, json_t **messages_out,
                            json_t **tools_out);

#endif
