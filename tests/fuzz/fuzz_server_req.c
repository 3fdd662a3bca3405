/* fuzz_server_req.c — libFuzzer target for the server's request parsing: any bytes as the body of
 * /v1/chat/completions, /v1/completions and /v1/messages (byte 0 picks which), through body
 * validation (UTF-8, JSON), the shared generation fields, chat messages / tools / tool_choice
 * normalization, completion prompts and the Anthropic translation. Checks the contract: an error
 * always has a status and a message; a chat parse that succeeds has messages and kwargs. */
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "server/srv_req.h"

static void check_error(int status, const lm_srv_err *e) {
  if (status != 400 && status != 500) abort();
  if (!e->message[0]) abort();
  char *j = lm_srv_err_openai_json(e);
  if (!j) abort();
  free(j);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  int kind = data[0] % 3;
  lm_srv_err e = {0};
  json_t *body = NULL, *req = NULL;
  int r = lm_srv_parse_body((const char *)data + 1, size - 1, &body, &e);
  if (r) {
    check_error(r, &e);
    return 0;
  }
  lm_sampling d;
  lm_sampling_init(&d);
  lm_srv_params p;
  lm_srv_params_init(&p);
  if (kind == 2) {
    r = lm_srv_anthropic_request(body, &req, &e);
  } else {
    req = json_incref(body);
  }
  if (!r) r = lm_srv_parse_common(req, &d, 4096, &p, &e);
  if (!r)
    r = kind == 1 ? lm_srv_parse_completion(req, 4096, &p, &e) : lm_srv_parse_chat(req, &p, &e);
  if (r)
    check_error(r, &e);
  else if (kind != 1 && (!json_is_array(p.messages) || !json_is_object(p.kwargs)))
    abort();
  else if (kind == 1 && !p.prompt && !p.prompt_ids)
    abort();
  lm_srv_params_clear(&p);
  json_decref(req);
  json_decref(body);
  return 0;
}
