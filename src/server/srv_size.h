/* srv_size.h — refusing a prompt by its size before any expensive work. A token covers at most
 * the tokenizer's longest piece in bytes (its best case: lm_checkpoint_info.longest_piece), so a
 * prompt of B text bytes has at least B / longest tokens; when that exceeds the context, rendering
 * and tokenizing it would only cost memory and CPU before the same context_length_exceeded answer.
 */
#ifndef LM_SERVER_SRV_SIZE_H
#define LM_SERVER_SRV_SIZE_H

#include <jansson.h>
#include <stddef.h>

#include "server/srv_ctx.h"
#include "server/srv_error.h"

/* Before parsing: a body more than 6 (the widest JSON escape, \u00XX for one byte) times the
 * bytes the context could hold, plus 64 KiB for the request's other fields, is refused. */
int lm_srv_size_check_body(const lm_server *s, size_t len, lm_srv_err *e);
/* After parsing: the text the prompt will be rendered from (message contents, an Anthropic
 * system prompt, a completions prompt, a Responses input and instructions; token-id prompts by
 * their count) against the context. The error names the field the prompt came in. */
int lm_srv_size_check_prompt(const lm_server *s, const json_t *body, lm_srv_err *e);

#endif
