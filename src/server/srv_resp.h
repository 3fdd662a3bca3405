/* srv_resp.h — the Responses API's request, translated into the chat completions shape that the
 * rest of the server reads (srv_req.h):
 *   - input: a string (one user message) or items: `message` (role user / system / developer /
 *     assistant; content a string or input_text / output_text parts), `function_call` (an
 *     assistant tool call; consecutive ones join one message), `function_call_output` (a tool
 *     message), `reasoning` (its text goes with the next assistant message);
 *   - instructions: a system message first (never carried over from a previous response);
 *   - tools: function tools in the flat shape {type, name, description, parameters};
 *     tool_choice auto / none / required / {type: "function", name};
 *   - max_output_tokens, temperature, top_p, reasoning.effort, stream, and lumen's sampling
 *     extensions (top_k, min_p, seed, penalties, ignore_eos, chat_template_kwargs).
 * What the server cannot do is refused with a 400 naming the field: other tool types, image and
 * file inputs, item references, background mode, conversations, prompt templates, and
 * text.format json_schema / json_object (structured output is not available yet). */
#ifndef LM_SERVER_SRV_RESP_H
#define LM_SERVER_SRV_RESP_H

#include <jansson.h>

#include "server/srv_error.h"

/* Translates req. *turn gets the chat messages of its input (owned, may be set on failure too),
 * *chat the chat completions request: the instructions, then `history` (the conversation a
 * previous response ended, or NULL), then *turn (owned). Parameter names in errors are the
 * Responses API's (input[2].content[0], max_output_tokens). Returns 0 or the HTTP status. */
int lm_srv_resp_request(const json_t *req, const json_t *history, json_t **turn, json_t **chat,
                        lm_srv_err *e);

/* Renames a chat field in an error's param to the Responses API's (messages -> input,
 * max_tokens -> max_output_tokens). */
void lm_srv_resp_param(lm_srv_err *e);

#endif
