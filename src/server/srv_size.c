/* srv_size.c — the prompt-size refusal (srv_size.h). */
#include "server/srv_size.h"

#include <string.h>

#define LM_SRV_SIZE_SLACK ((size_t)64 << 10)
#define LM_SRV_SIZE_DEPTH 64 /* content nests a few levels; deeper is not rendered text */

/* Bytes the context holds at the tokenizer's best case. */
static double capacity(const lm_server *s) {
  return (double)s->ei.context * (double)(s->ci.longest_piece ? s->ci.longest_piece : 1);
}

static int refuse(const lm_server *s, double tokens, const char *param, lm_srv_err *e) {
  return lm_srv_err_set(e, 400, "invalid_request_error", "context_length_exceeded", param,
                        "the prompt has at least %.0f tokens; the context limit is %lld", tokens,
                        (long long)s->ei.context);
}

int lm_srv_size_check_body(const lm_server *s, size_t len, lm_srv_err *e) {
  if ((double)len <= 6.0 * capacity(s) + (double)LM_SRV_SIZE_SLACK) return 0;
  return refuse(s, ((double)len - (double)LM_SRV_SIZE_SLACK) / 6.0 / (double)s->ci.longest_piece,
                "messages", e);
}

static int text_key(const char *k) {
  return !strcmp(k, "content") || !strcmp(k, "text") || !strcmp(k, "reasoning_content") ||
         !strcmp(k, "reasoning") || !strcmp(k, "thinking") || !strcmp(k, "arguments") ||
         !strcmp(k, "output"); /* a Responses function_call_output */
}

/* String bytes under the text keys of v (all of a string that is itself content). */
static double text_bytes(const json_t *v, int is_text, int depth) {
  if (depth > LM_SRV_SIZE_DEPTH) return 0;
  if (json_is_string(v)) return is_text ? (double)json_string_length(v) : 0;
  double n = 0;
  if (json_is_array(v)) {
    size_t i;
    const json_t *x;
    json_array_foreach(v, i, x) n += text_bytes(x, is_text, depth + 1);
  } else if (json_is_object(v)) {
    const char *k;
    const json_t *x;
    json_object_foreach((json_t *)v, k, x) n += text_bytes(x, text_key(k), depth + 1);
  }
  return n;
}

int lm_srv_size_check_prompt(const lm_server *s, const json_t *body, lm_srv_err *e) {
  const json_t *prompt = json_object_get(body, "prompt"), *input = json_object_get(body, "input");
  double tokens = 0;
  if (json_is_array(prompt) && json_is_integer(json_array_get(prompt, 0)))
    tokens = (double)json_array_size(prompt);
  else {
    double bytes = text_bytes(json_object_get(body, "messages"), 0, 0) +
                   text_bytes(json_object_get(body, "system"), 1, 0) + text_bytes(prompt, 1, 0) +
                   text_bytes(input, json_is_string(input), 0) +
                   text_bytes(json_object_get(body, "instructions"), 1, 0);
    tokens = bytes / (double)(s->ci.longest_piece ? s->ci.longest_piece : 1);
  }
  /* the field the prompt came in: completions' prompt, Responses' input, else messages */
  const char *param = prompt ? "prompt" : input ? "input" : "messages";
  return tokens > (double)s->ei.context ? refuse(s, tokens, param, e) : 0;
}
