/* test_server_api.c — the server's newer API surface over real HTTP, on the embedded model
 * (models/lumen-tiny-kjv, whose greedy answers are known: models/lumen-tiny-kjv/samples.txt):
 *   - served ids: aliases and the model's own name in /v1/models, echoed back; a request naming
 *     another model is a 404 model_not_found in the OpenAI and the Anthropic shapes, one naming
 *     none gets the default;
 *   - CORS: preflights (204, no API key needed), the origin's header on answers, errors and
 *     streams, refused origins, and OPTIONS without --cors;
 *   - n > 1 on chat and completions, plain and streamed, with the prompt prefilled once (/stats);
 *   - a context overflow blames the prompt (messages / prompt / input), or max_tokens when it is
 *     max_tokens that does not fit;
 *   - /tokenize, /detokenize, /apply-template and /v1/messages/count_tokens;
 *   - the Responses API: text, the streamed event grammar, incomplete answers, reasoning items,
 *     function calls and their outputs through previous_response_id, store: false, GET and
 *     DELETE, the refusals, and the store's bounds (entries, bytes, age);
 *   - speculative decoding: --spec as the default, the "speculative" field, the counters. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "test_server_util.h"

#define WHO_ANSWER "I am lumen-tiny-kjv, a small language model trained on the King James Bible."
#define ORIGIN "http://app.example"

static const char *const FLAT_TOOLS =
    "[{\"type\":\"function\",\"name\":\"lookup_verse\",\"description\":\"Look up one verse of the "
    "King James Bible.\",\"parameters\":{\"type\":\"object\",\"properties\":{\"book\":{\"type\":"
    "\"string\",\"description\":\"Name of the book, e.g. John\"},\"chapter\":{\"type\":"
    "\"integer\",\"description\":\"Chapter number\"},\"verse\":{\"type\":\"integer\","
    "\"description\":\"Verse number\"}},\"required\":[\"book\",\"chapter\",\"verse\"]}}]";

static test_server S;
static const char *const ALIASES[] = {"kjv", "bible"};

static int setup(void **state) {
  (void)state;
  lm_server_opts o;
  lm_server_opts_init(&o);
  o.parallel = 4;
  o.aliases = ALIASES;
  o.n_aliases = 2;
  o.cors = ORIGIN ", http://localhost:3000";
  return test_server_start(&S, &o);
}

static int teardown(void **state) {
  (void)state;
  test_server_stop(&S);
  return 0;
}

static const char *str(const json_t *j, const char *k) {
  return json_string_value(json_object_get(j, k));
}
static long long num(const json_t *j, const char *k) {
  return json_integer_value(json_object_get(j, k));
}

static json_t *call(int port, const char *method, const char *path, const char *headers,
                    const char *body, int want, http_resp *keep) {
  http_resp r;
  assert_int_equal(http_do(port, method, path, headers, body, body ? strlen(body) : 0, &r), 0);
  if (r.status != want)
    fprintf(stderr, "%s %s %s -> %d %s\n", method, path, body, r.status, r.body);
  assert_int_equal(r.status, want);
  json_t *j = r.len ? json_loads(r.body, 0, NULL) : NULL;
  if (keep)
    *keep = r;
  else
    http_resp_free(&r);
  return j;
}

static json_t *post(const char *path, const char *body, int want) {
  return call(S.port, "POST", path, NULL, body, want, NULL);
}

static void check_openai_error(const json_t *j, const char *code, const char *param) {
  const json_t *e = json_object_get(j, "error");
  assert_non_null(e);
  assert_true(json_is_string(json_object_get(e, "message")));
  if (code) assert_string_equal(str(e, "code"), code);
  if (param) assert_string_equal(str(e, "param"), param);
}

/* ---- served ids ------------------------------------------------------------------------------ */

static void t_models(void **state) {
  (void)state;
  json_t *j = call(S.port, "GET", "/v1/models", NULL, NULL, 200, NULL);
  json_t *d = json_object_get(j, "data");
  assert_int_equal(json_array_size(d), 3);
  assert_string_equal(str(json_array_get(d, 0), "id"), "kjv");
  assert_string_equal(str(json_array_get(d, 1), "id"), "bible");
  assert_string_equal(str(json_array_get(d, 2), "id"), "lumen-tiny-kjv");
  json_decref(j);
  json_decref(call(S.port, "GET", "/v1/models/bible", NULL, NULL, 200, NULL));
  /* each served id is echoed back; none (or "") gets the first */
  static const char *const names[][2] = {{"\"model\":\"bible\",", "bible"},
                                         {"\"model\":\"lumen-tiny-kjv\",", "lumen-tiny-kjv"},
                                         {"", "kjv"},
                                         {"\"model\":\"\",", "kjv"},
                                         {"\"model\":null,", "kjv"}};
  for (int i = 0; i < 5; i++) {
    char b[256];
    snprintf(b, sizeof b,
             "{%s\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":2}",
             names[i][0]);
    j = post("/v1/chat/completions", b, 200);
    assert_string_equal(str(j, "model"), names[i][1]);
    json_decref(j);
  }
  /* another id: 404 in each API's shape, before any work */
  j = post("/v1/chat/completions",
           "{\"model\":\"gpt-4o\",\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}", 404);
  check_openai_error(j, "model_not_found", "model");
  assert_string_equal(str(json_object_get(j, "error"), "type"), "invalid_request_error");
  json_decref(j);
  j = post("/v1/completions", "{\"model\":\"davinci\",\"prompt\":\"x\"}", 404);
  check_openai_error(j, "model_not_found", "model");
  json_decref(j);
  j = post("/v1/responses", "{\"model\":\"gpt-5\",\"input\":\"x\"}", 404);
  check_openai_error(j, "model_not_found", "model");
  json_decref(j);
  j = post(
      "/v1/messages",
      "{\"model\":\"x\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}",
      404);
  assert_string_equal(str(j, "type"), "error");
  assert_string_equal(str(json_object_get(j, "error"), "type"), "not_found_error");
  json_decref(j);
  j = post("/v1/messages/count_tokens",
           "{\"model\":\"claude-3\",\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}", 404);
  assert_string_equal(str(json_object_get(j, "error"), "type"), "not_found_error");
  json_decref(j);
  j = post("/v1/chat/completions", "{\"model\":7,\"messages\":[]}", 400);
  check_openai_error(j, NULL, "model");
  json_decref(j);
}

/* ---- CORS ------------------------------------------------------------------------------------ */

static void t_cors(void **state) {
  (void)state;
  http_resp r;
  /* a preflight from an allowed origin */
  call(S.port, "OPTIONS", "/v1/chat/completions",
       "Origin: " ORIGIN "\r\nAccess-Control-Request-Method: POST\r\n"
       "Access-Control-Request-Headers: authorization, content-type, x-stainless-os\r\n",
       NULL, 204, &r);
  assert_non_null(strcasestr(r.head, "\nAccess-Control-Allow-Origin: " ORIGIN "\r"));
  assert_non_null(strcasestr(r.head, "\nAccess-Control-Allow-Methods: GET, POST, DELETE, OPTIONS"));
  const char *h = strcasestr(r.head, "\nAccess-Control-Allow-Headers: ");
  assert_non_null(h);
  assert_non_null(strstr(h, "Authorization, Content-Type, x-api-key, anthropic-version"));
  assert_non_null(strstr(h, "x-stainless-os"));
  assert_non_null(strcasestr(r.head, "\nAccess-Control-Max-Age: 86400"));
  assert_non_null(strcasestr(r.head, "\nVary: Origin"));
  assert_non_null(strcasestr(r.head, "\nAllow: POST, OPTIONS"));
  assert_int_equal(r.len, 0);
  http_resp_free(&r);
  /* another origin: answered, but without the header that lets the browser through */
  call(S.port, "OPTIONS", "/v1/models", "Origin: http://evil.example\r\n", NULL, 204, &r);
  assert_null(strcasestr(r.head, "Access-Control-Allow-Origin"));
  http_resp_free(&r);
  /* answers, errors and streams carry it */
  json_decref(
      call(S.port, "GET", "/v1/models", "Origin: http://localhost:3000\r\n", NULL, 200, &r));
  assert_non_null(strcasestr(r.head, "\nAccess-Control-Allow-Origin: http://localhost:3000\r"));
  http_resp_free(&r);
  json_decref(call(S.port, "POST", "/v1/chat/completions", "Origin: " ORIGIN "\r\n",
                   "{\"model\":\"nope\",\"messages\":[]}", 404, &r));
  assert_non_null(strcasestr(r.head, "\nAccess-Control-Allow-Origin: " ORIGIN "\r"));
  http_resp_free(&r);
  const char *sb = "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":3,"
                   "\"stream\":true}";
  assert_int_equal(
      http_do(S.port, "POST", "/v1/chat/completions", "Origin: " ORIGIN "\r\n", sb, strlen(sb), &r),
      0);
  assert_int_equal(r.status, 200);
  assert_non_null(strcasestr(r.head, "content-type: text/event-stream"));
  assert_non_null(strcasestr(r.head, "\nAccess-Control-Allow-Origin: " ORIGIN "\r"));
  assert_non_null(strstr(r.body, "data: [DONE]"));
  http_resp_free(&r);
  /* unknown paths stay 404 */
  json_decref(call(S.port, "OPTIONS", "/nowhere", "Origin: " ORIGIN "\r\n", NULL, 404, NULL));
}

static void t_cors_key_and_off(void **state) {
  (void)state;
  test_server k;
  lm_server_opts o;
  lm_server_opts_init(&o);
  o.api_key = "sekrit";
  o.cors = "*";
  assert_int_equal(test_server_start(&k, &o), 0);
  http_resp r;
  /* the preflight carries no key and must not need one; the request itself does */
  call(k.port, "OPTIONS", "/v1/responses", "Origin: http://any.example\r\n", NULL, 204, &r);
  assert_non_null(strcasestr(r.head, "\nAccess-Control-Allow-Origin: *\r"));
  assert_null(strcasestr(r.head, "\nVary: Origin"));
  http_resp_free(&r);
  json_decref(call(k.port, "POST", "/v1/responses", "Origin: http://any.example\r\n",
                   "{\"input\":\"Hi\",\"max_output_tokens\":2}", 401, &r));
  assert_non_null(strcasestr(r.head, "\nAccess-Control-Allow-Origin: *\r")); /* errors too */
  http_resp_free(&r);
  test_server_stop(&k);
  /* without --cors: OPTIONS is 204 (not 405) and no CORS header appears anywhere */
  lm_server_opts_init(&o);
  assert_int_equal(test_server_start(&k, &o), 0);
  call(k.port, "OPTIONS", "/v1/chat/completions", "Origin: " ORIGIN "\r\n", NULL, 204, &r);
  assert_null(strcasestr(r.head, "Access-Control-"));
  assert_non_null(strcasestr(r.head, "\nAllow: POST, OPTIONS"));
  http_resp_free(&r);
  json_decref(call(k.port, "GET", "/v1/models", "Origin: " ORIGIN "\r\n", NULL, 200, &r));
  assert_null(strcasestr(r.head, "Access-Control-"));
  http_resp_free(&r);
  test_server_stop(&k);
  /* a bad origin list is refused at creation, naming --cors */
  lm_checkpoint *ck;
  assert_int_equal(lm_checkpoint_open(TINY_MODEL, &ck), LM_OK);
  static const char *const bad[] = {"", "http://a.example,,http://b.example", "http://a b",
                                    "http://a.example/"};
  for (int i = 0; i < 4; i++) {
    lm_server *s = NULL;
    lm_server_opts_init(&o);
    o.model_dir = TINY_MODEL;
    o.backend = "cpu";
    o.cors = bad[i];
    assert_int_equal(lm_server_create(ck, &o, &s), LM_ERR_INVALID);
    assert_non_null(strstr(lm_errmsg(), "--cors"));
    assert_null(s);
  }
  lm_checkpoint_free(ck);
}

/* ---- n > 1 ----------------------------------------------------------------------------------- */

static long long prefill_tokens(void) {
  assert_true(wait_idle(S.port, 30));
  json_t *st = test_stats(S.port);
  long long n = stats_int(st, "batch", "prefill_tokens");
  json_decref(st);
  return n;
}

static void t_n_choices(void **state) {
  (void)state;
  /* a prompt no earlier request left in the prompt cache */
  const char *b = "{\"messages\":[{\"role\":\"user\",\"content\":\"Who are you, and what do you "
                  "know?\"}],\"n\":3,\"max_tokens\":6,\"temperature\":1,\"seed\":7}";
  long long before = prefill_tokens();
  json_t *j = post("/v1/chat/completions", b, 200);
  long long prefilled = prefill_tokens() - before;
  json_t *ch = json_object_get(j, "choices"), *u = json_object_get(j, "usage");
  assert_int_equal(json_array_size(ch), 3);
  long long prompt = num(u, "prompt_tokens");
  for (int i = 0; i < 3; i++) {
    json_t *c = json_array_get(ch, (size_t)i);
    assert_int_equal(num(c, "index"), i);
    assert_string_equal(str(c, "finish_reason"), "length");
    assert_true(strlen(str(json_object_get(c, "message"), "content")) > 0);
  }
  assert_int_equal(num(u, "completion_tokens"), 18); /* summed; the prompt counted once */
  assert_int_equal(num(u, "total_tokens"), prompt + 18);
  /* one prefill of the prompt (less what the prompt cache already held of it), then one token
   * for each of the other two */
  long long cached = num(json_object_get(u, "prompt_tokens_details"), "cached_tokens");
  assert_true(cached < prompt - 1);
  assert_int_equal(prefilled, prompt - cached + 2);
  json_decref(j);
  /* streamed: every choice gets its role, its text and its finish; usage once */
  j = NULL;
  http_resp r;
  const char *sb = "{\"messages\":[{\"role\":\"user\",\"content\":\"Who are you?\"}],\"n\":2,"
                   "\"temperature\":0,\"stream\":true,\"stream_options\":{\"include_usage\":true}}";
  assert_int_equal(http_post(S.port, "/v1/chat/completions", sb, &r), 0);
  assert_int_equal(r.status, 200);
  char text[2][512] = {"", ""};
  int finishes[2] = {0, 0}, roles[2] = {0, 0}, usage = 0;
  for (char *p = strstr(r.body, "data: {"); p; p = strstr(p + 1, "data: {")) {
    char *end = strstr(p, "\n\n");
    json_t *c = json_loadb(p + 6, (size_t)(end - p - 6), 0, NULL);
    assert_non_null(c);
    if (json_object_get(c, "usage") && !json_is_null(json_object_get(c, "usage"))) {
      usage++;
      assert_int_equal(num(json_object_get(c, "usage"), "prompt_tokens"), 14);
    }
    json_t *c0 = json_array_get(json_object_get(c, "choices"), 0);
    if (c0) {
      int i = (int)num(c0, "index");
      assert_true(i == 0 || i == 1);
      json_t *d = json_object_get(c0, "delta");
      if (str(d, "role")) roles[i]++;
      if (str(d, "content")) strcat(text[i], str(d, "content"));
      if (str(c0, "finish_reason")) finishes[i]++;
    }
    json_decref(c);
  }
  assert_non_null(strstr(r.body, "data: [DONE]\n\n"));
  http_resp_free(&r);
  for (int i = 0; i < 2; i++) {
    assert_int_equal(roles[i], 1);
    assert_int_equal(finishes[i], 1);
    assert_string_equal(text[i], WHO_ANSWER);
  }
  assert_int_equal(usage, 1);
  /* completions */
  j = post("/v1/completions",
           "{\"prompt\":\"In the beginning\",\"n\":2,\"max_tokens\":8,\"temperature\":0}", 200);
  ch = json_object_get(j, "choices");
  assert_int_equal(json_array_size(ch), 2);
  assert_string_equal(str(json_array_get(ch, 0), "text"), str(json_array_get(ch, 1), "text"));
  assert_int_equal(num(json_array_get(ch, 1), "index"), 1);
  json_decref(j);
  json_decref(post("/v1/chat/completions",
                   "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":0}", 400));
}

/* ---- context overflow ------------------------------------------------------------------------ */

static char *ids_prompt(int n, const char *extra) {
  char *b = malloc((size_t)n * 3 + 256);
  int k = sprintf(b, "{\"prompt\":[");
  for (int i = 0; i < n; i++)
    k += sprintf(b + k, "%s50", i ? "," : "");
  sprintf(b + k, "]%s}", extra);
  return b;
}

static void t_overflow(void **state) {
  (void)state;
  struct {
    int n;
    const char *extra, *param;
  } cases[] = {
      {2048, ",\"max_tokens\":5", "prompt"}, /* the prompt alone fills the context */
      {2048, "", "prompt"},
      {2040, ",\"max_tokens\":100", "max_tokens"}, /* it fits; max_tokens does not */
  };
  for (int i = 0; i < 3; i++) {
    char *b = ids_prompt(cases[i].n, cases[i].extra);
    json_t *j = post("/v1/completions", b, 400);
    check_openai_error(j, "context_length_exceeded", cases[i].param);
    if (!strcmp(cases[i].param, "prompt"))
      assert_non_null(strstr(str(json_object_get(j, "error"), "message"), "the prompt has 2048"));
    json_decref(j);
    free(b);
  }
  json_t *j =
      post("/v1/chat/completions",
           "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":5000}", 400);
  check_openai_error(j, "context_length_exceeded", "max_tokens");
  json_decref(j);
}

/* ---- tokenizer endpoints --------------------------------------------------------------------- */

static void t_tokens(void **state) {
  (void)state;
  json_t *j = post("/tokenize", "{\"content\":\"In the beginning\"}", 200);
  json_t *t = json_object_get(j, "tokens");
  assert_int_equal(json_array_size(t), 3);
  char b[256];
  snprintf(b, sizeof b, "{\"tokens\":[%lld,%lld,%lld]}", json_integer_value(json_array_get(t, 0)),
           json_integer_value(json_array_get(t, 1)), json_integer_value(json_array_get(t, 2)));
  json_decref(j);
  j = post("/detokenize", b, 200);
  assert_string_equal(str(j, "content"), "In the beginning");
  json_decref(j);
  j = post("/tokenize",
           "{\"content\":\"In the beginning\",\"add_special\":true,\"with_pieces\":true}", 200);
  t = json_object_get(j, "tokens");
  assert_int_equal(json_array_size(t), 4); /* BOS first */
  assert_string_equal(str(json_array_get(t, 0), "piece"), "<bos>");
  assert_string_equal(str(json_array_get(t, 2), "piece"), " the");
  assert_true(json_is_integer(json_object_get(json_array_get(t, 2), "id")));
  json_decref(j);
  j = post("/apply-template", "{\"messages\":[{\"role\":\"user\",\"content\":\"Who are you?\"}]}",
           200);
  assert_string_equal(str(j, "prompt"), "<bos><|turn>user\nWho are you?<turn|>\n<|turn>model\n");
  json_decref(j);
  j = post("/v1/messages/count_tokens",
           "{\"model\":\"kjv\",\"messages\":[{\"role\":\"user\",\"content\":\"Who are you?\"}]}",
           200);
  assert_int_equal(num(j, "input_tokens"), 14); /* what chat counts for the same prompt */
  json_decref(j);
  j = post("/v1/messages/count_tokens",
           "{\"system\":\"Be brief.\",\"messages\":[{\"role\":\"user\",\"content\":\"Who are "
           "you?\"}],\"tools\":[{\"name\":\"f\",\"input_schema\":{\"type\":\"object\"}}]}",
           200);
  assert_true(num(j, "input_tokens") > 14);
  json_decref(j);
  /* refusals */
  static const char *const bad[][3] = {
      {"/tokenize", "{}", "content"},
      {"/tokenize", "{\"content\":\"x\",\"with_pieces\":1}", "with_pieces"},
      {"/tokenize", "{\"content\":\"x\",\"parse_special\":false}", "parse_special"},
      {"/detokenize", "{\"tokens\":\"x\"}", "tokens"},
      {"/detokenize", "{\"tokens\":[1,99999]}", "tokens"},
      {"/apply-template", "{\"messages\":[]}", "messages"},
  };
  for (int i = 0; i < 6; i++) {
    j = post(bad[i][0], bad[i][1], 400);
    check_openai_error(j, NULL, bad[i][2]);
    json_decref(j);
  }
  j = post("/v1/messages/count_tokens", "{\"messages\":[{\"role\":\"robot\",\"content\":\"x\"}]}",
           400);
  assert_string_equal(str(j, "type"), "error");
  json_decref(j);
}

/* ---- Responses ------------------------------------------------------------------------------- */

/* The events of a Responses stream, each checked: its event name is its type, and the sequence
 * numbers count up from 0. */
static json_t *resp_events(const char *body) {
  json_t *a = json_array();
  for (const char *p = strstr(body, "event: "); p; p = strstr(p, "\nevent: ")) {
    if (*p == '\n') p++;
    char name[96];
    assert_int_equal(sscanf(p + 7, "%95s", name), 1);
    const char *d = strstr(p, "\ndata: "), *end = d ? strstr(d, "\n\n") : NULL;
    assert_non_null(end);
    json_t *j = json_loadb(d + 7, (size_t)(end - d - 7), 0, NULL);
    assert_non_null(j);
    assert_string_equal(str(j, "type"), name);
    assert_int_equal(num(j, "sequence_number"), (long long)json_array_size(a));
    json_array_append_new(a, j);
    p = end;
  }
  return a;
}

static json_t *resp_stream(const char *body) {
  http_resp r;
  assert_int_equal(http_post(S.port, "/v1/responses", body, &r), 0);
  assert_int_equal(r.status, 200);
  assert_non_null(strcasestr(r.head, "content-type: text/event-stream"));
  assert_null(strstr(r.body, "[DONE]"));
  json_t *a = resp_events(r.body);
  http_resp_free(&r);
  return a;
}

static const char *output_text(const json_t *resp) {
  const json_t *it;
  size_t i;
  json_array_foreach(json_object_get(resp, "output"), i, it) {
    if (!strcmp(str(it, "type"), "message"))
      return str(json_array_get(json_object_get(it, "content"), 0), "text");
  }
  return NULL;
}

static void t_responses_text(void **state) {
  (void)state;
  json_t *j = post("/v1/responses",
                   "{\"model\":\"bible\",\"input\":\"Who are you?\",\"temperature\":0}", 200);
  assert_string_equal(str(j, "object"), "response");
  assert_memory_equal(str(j, "id"), "resp_", 5);
  assert_string_equal(str(j, "status"), "completed");
  assert_string_equal(str(j, "model"), "bible");
  assert_true(json_is_null(json_object_get(j, "incomplete_details")));
  json_t *out = json_object_get(j, "output"), *m = json_array_get(out, 0);
  assert_int_equal(json_array_size(out), 1);
  assert_string_equal(str(m, "type"), "message");
  assert_string_equal(str(m, "role"), "assistant");
  assert_string_equal(str(m, "status"), "completed");
  assert_string_equal(str(json_array_get(json_object_get(m, "content"), 0), "type"), "output_text");
  assert_string_equal(output_text(j), WHO_ANSWER);
  json_t *u = json_object_get(j, "usage");
  assert_int_equal(num(u, "input_tokens"), 14);
  assert_int_equal(num(u, "total_tokens"), 14 + num(u, "output_tokens"));
  assert_true(json_is_integer(
      json_object_get(json_object_get(u, "input_tokens_details"), "cached_tokens")));
  assert_true(json_real_value(json_object_get(j, "temperature")) == 0.0);
  json_decref(j);
  /* input items, instructions: a system message, the same answer as chat gives */
  j = post("/v1/responses",
           "{\"instructions\":\"You quote scripture.\",\"input\":[{\"type\":\"message\",\"role\":"
           "\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"Who are you?\"}]}],"
           "\"temperature\":0,\"max_output_tokens\":30}",
           200);
  json_t *c = post("/v1/chat/completions",
                   "{\"messages\":[{\"role\":\"system\",\"content\":\"You quote scripture.\"},"
                   "{\"role\":\"user\",\"content\":\"Who are you?\"}],\"temperature\":0,"
                   "\"max_tokens\":30}",
                   200);
  assert_string_equal(
      output_text(j),
      str(json_object_get(json_array_get(json_object_get(c, "choices"), 0), "message"), "content"));
  assert_string_equal(str(j, "instructions"), "You quote scripture.");
  json_decref(c);
  json_decref(j);
  /* text.format json_schema: the answer is JSON of the schema, and the response repeats the format
   */
  j = post("/v1/responses",
           "{\"input\":\"Who are you?\",\"temperature\":1,\"seed\":3,\"max_output_tokens\":200,"
           "\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"who\",\"schema\":{"
           "\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":20},"
           "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":99}},\"required\":[\"name\","
           "\"age\"],\"additionalProperties\":false}}}}",
           200);
  assert_string_equal(str(j, "status"), "completed");
  json_t *doc = json_loads(output_text(j), 0, NULL);
  assert_non_null(doc);
  assert_true(json_is_string(json_object_get(doc, "name")));
  assert_true(json_is_integer(json_object_get(doc, "age")));
  json_decref(doc);
  assert_string_equal(str(json_object_get(json_object_get(j, "text"), "format"), "type"),
                      "json_schema");
  json_decref(j);
  /* the token limit: incomplete, with its reason */
  j = post("/v1/responses",
           "{\"input\":\"Who are you?\",\"temperature\":0,\"max_output_tokens\":4}", 200);
  assert_string_equal(str(j, "status"), "incomplete");
  assert_string_equal(str(json_object_get(j, "incomplete_details"), "reason"), "max_output_tokens");
  assert_int_equal(num(json_object_get(j, "usage"), "output_tokens"), 4);
  json_decref(j);
}

static void t_responses_stream(void **state) {
  (void)state;
  json_t *ev = resp_stream("{\"input\":\"Who are you?\",\"temperature\":0,\"stream\":true}");
  size_t n = json_array_size(ev);
  static const char *const head[] = {"response.created", "response.in_progress",
                                     "response.output_item.added", "response.content_part.added"};
  static const char *const tail[] = {"response.output_text.done", "response.content_part.done",
                                     "response.output_item.done", "response.completed"};
  assert_true(n > 8);
  for (int i = 0; i < 4; i++) {
    assert_string_equal(str(json_array_get(ev, (size_t)i), "type"), head[i]);
    assert_string_equal(str(json_array_get(ev, n - 4 + (size_t)i), "type"), tail[i]);
  }
  json_t *created = json_object_get(json_array_get(ev, 0), "response");
  assert_string_equal(str(created, "status"), "in_progress");
  assert_int_equal(json_array_size(json_object_get(created, "output")), 0);
  const char *item = str(json_object_get(json_array_get(ev, 2), "item"), "id");
  char text[512] = "";
  for (size_t i = 4; i < n - 4; i++) {
    json_t *e = json_array_get(ev, i);
    assert_string_equal(str(e, "type"), "response.output_text.delta");
    assert_string_equal(str(e, "item_id"), item);
    assert_int_equal(num(e, "output_index"), 0);
    assert_int_equal(num(e, "content_index"), 0);
    strcat(text, str(e, "delta"));
  }
  assert_string_equal(text, WHO_ANSWER);
  assert_string_equal(str(json_array_get(ev, n - 4), "text"), WHO_ANSWER);
  json_t *done = json_object_get(json_array_get(ev, n - 1), "response");
  assert_string_equal(str(done, "status"), "completed");
  assert_string_equal(output_text(done), WHO_ANSWER);
  assert_string_equal(str(done, "id"), str(created, "id"));
  assert_int_equal(num(json_object_get(done, "usage"), "input_tokens"), 14);
  json_decref(ev);
  /* cut by max_output_tokens: response.incomplete */
  ev = resp_stream(
      "{\"input\":\"Who are you?\",\"temperature\":0,\"stream\":true,\"max_output_tokens\":3}");
  json_t *last = json_array_get(ev, json_array_size(ev) - 1);
  assert_string_equal(str(last, "type"), "response.incomplete");
  assert_string_equal(
      str(json_object_get(json_object_get(last, "response"), "incomplete_details"), "reason"),
      "max_output_tokens");
  json_decref(ev);
}

static void check_romans(const char *args) {
  json_t *a = json_loads(args, 0, NULL);
  assert_non_null(a);
  assert_string_equal(str(a, "book"), "Romans");
  assert_int_equal(num(a, "chapter"), 8);
  assert_int_equal(num(a, "verse"), 28);
  json_decref(a);
}

static void t_responses_tools(void **state) {
  (void)state;
  char b[4096];
  snprintf(b, sizeof b, "{\"input\":\"Look up Romans 8:28.\",\"temperature\":0,\"tools\":%s}",
           FLAT_TOOLS);
  json_t *j = post("/v1/responses", b, 200);
  json_t *fc = json_array_get(json_object_get(j, "output"), 0);
  assert_int_equal(json_array_size(json_object_get(j, "output")), 1);
  assert_string_equal(str(fc, "type"), "function_call");
  assert_string_equal(str(fc, "name"), "lookup_verse");
  assert_string_equal(str(fc, "status"), "completed");
  assert_memory_equal(str(fc, "call_id"), "call_", 5);
  assert_memory_equal(str(fc, "id"), "fc_", 3);
  check_romans(str(fc, "arguments"));
  char id[64], call_id[64];
  snprintf(id, sizeof id, "%s", str(j, "id"));
  snprintf(call_id, sizeof call_id, "%s", str(fc, "call_id"));
  json_decref(j);
  /* the result goes back through previous_response_id; the model answers in text */
  snprintf(b, sizeof b,
           "{\"previous_response_id\":\"%s\",\"input\":[{\"type\":\"function_call_output\","
           "\"call_id\":\"%s\",\"output\":\"And we know that all things work together for good "
           "to them that love God.\"}],\"temperature\":0,\"max_output_tokens\":60,\"tools\":%s}",
           id, call_id, FLAT_TOOLS);
  j = post("/v1/responses", b, 200);
  assert_string_equal(str(j, "previous_response_id"), id);
  const char *with_prev = output_text(j);
  assert_non_null(with_prev);
  assert_true(strlen(with_prev) > 0);
  char want[1024];
  snprintf(want, sizeof want, "%s", with_prev);
  json_decref(j);
  /* the same conversation sent whole (no previous_response_id) answers the same */
  snprintf(b, sizeof b,
           "{\"input\":[{\"role\":\"user\",\"content\":\"Look up Romans 8:28.\"},{\"type\":"
           "\"function_call\",\"call_id\":\"%s\",\"name\":\"lookup_verse\",\"arguments\":"
           "\"{\\\"book\\\": \\\"Romans\\\", \\\"chapter\\\": 8, \\\"verse\\\": 28}\"},{\"type\":"
           "\"function_call_output\",\"call_id\":\"%s\",\"output\":\"And we know that all things "
           "work together for good to them that love God.\"}],\"temperature\":0,"
           "\"max_output_tokens\":60,\"tools\":%s}",
           call_id, call_id, FLAT_TOOLS);
  j = post("/v1/responses", b, 200);
  assert_string_equal(output_text(j), want);
  json_decref(j);
  /* streamed: the call's item, its argument events, then completed */
  snprintf(b, sizeof b,
           "{\"input\":\"Look up Romans 8:28.\",\"temperature\":0,\"stream\":true,\"tools\":%s}",
           FLAT_TOOLS);
  json_t *ev = resp_stream(b);
  char names[1024] = "";
  for (size_t i = 2; i < json_array_size(ev); i++) {
    strcat(names, str(json_array_get(ev, i), "type") + 9); /* without "response." */
    strcat(names, " ");
  }
  assert_string_equal(names, "output_item.added function_call_arguments.delta "
                             "function_call_arguments.done output_item.done completed ");
  json_t *added = json_object_get(json_array_get(ev, 2), "item");
  assert_string_equal(str(added, "type"), "function_call");
  assert_string_equal(str(added, "arguments"), "");
  assert_string_equal(str(added, "status"), "in_progress");
  json_t *argsdone = json_array_get(ev, 4);
  assert_string_equal(str(argsdone, "item_id"), str(added, "id"));
  assert_string_equal(str(argsdone, "name"), "lookup_verse");
  check_romans(str(argsdone, "arguments"));
  check_romans(
      str(json_array_get(
              json_object_get(json_object_get(json_array_get(ev, 6), "response"), "output"), 0),
          "arguments"));
  json_decref(ev);
  /* a named tool_choice in the flat shape forces the call */
  snprintf(b, sizeof b,
           "{\"input\":\"Who are you?\",\"temperature\":0,\"max_output_tokens\":40,\"tools\":%s,"
           "\"tool_choice\":{\"type\":\"function\",\"name\":\"lookup_verse\"}}",
           FLAT_TOOLS);
  j = post("/v1/responses", b, 200);
  assert_string_equal(str(json_array_get(json_object_get(j, "output"), 0), "type"),
                      "function_call");
  json_decref(j);
}

static void t_responses_reasoning(void **state) {
  (void)state;
  /* after a tool result with thinking on, the model writes reasoning (as in chat) */
  const char *input =
      "[{\"role\":\"user\",\"content\":\"Look up Romans 8:28.\"},{\"type\":\"function_call\","
      "\"call_id\":\"c\",\"name\":\"lookup_verse\",\"arguments\":\"{\\\"book\\\":\\\"Romans\\\","
      "\\\"chapter\\\":8,\\\"verse\\\":28}\"},{\"type\":\"function_call_output\",\"call_id\":\"c\","
      "\"output\":\"And we know.\"}]";
  char b[4096];
  snprintf(b, sizeof b,
           "{\"input\":%s,\"temperature\":0,\"max_output_tokens\":30,\"reasoning\":{\"effort\":"
           "\"high\"}}",
           input);
  json_t *j = post("/v1/responses", b, 200);
  json_t *rs = json_array_get(json_object_get(j, "output"), 0);
  assert_string_equal(str(rs, "type"), "reasoning");
  const char *text = str(json_array_get(json_object_get(rs, "content"), 0), "text");
  assert_non_null(text);
  assert_true(strlen(text) > 0);
  char want[2048];
  snprintf(want, sizeof want, "%s", text);
  assert_true(num(json_object_get(json_object_get(j, "usage"), "output_tokens_details"),
                  "reasoning_tokens") > 0);
  assert_string_equal(str(json_object_get(j, "reasoning"), "effort"), "high");
  json_decref(j);
  snprintf(b, sizeof b,
           "{\"input\":%s,\"temperature\":0,\"max_output_tokens\":30,\"stream\":true,"
           "\"reasoning\":{\"effort\":\"high\"}}",
           input);
  json_t *ev = resp_stream(b);
  char got[2048] = "";
  int parts = 0;
  for (size_t i = 0; i < json_array_size(ev); i++) {
    json_t *e = json_array_get(ev, i);
    if (!strcmp(str(e, "type"), "response.reasoning_text.delta")) strcat(got, str(e, "delta"));
    if (!strcmp(str(e, "type"), "response.content_part.added") &&
        !strcmp(str(json_object_get(e, "part"), "type"), "reasoning_text"))
      parts++;
  }
  assert_int_equal(parts, 1);
  assert_string_equal(got, want);
  json_decref(ev);
}

static void t_responses_store(void **state) {
  (void)state;
  json_t *j = post("/v1/responses",
                   "{\"input\":\"Who are you?\",\"temperature\":0,\"max_output_tokens\":3}", 200);
  char path[128], b[256];
  snprintf(path, sizeof path, "/v1/responses/%s", str(j, "id"));
  json_t *g = call(S.port, "GET", path, NULL, NULL, 200, NULL);
  assert_true(json_equal(g, j));
  json_decref(g);
  json_t *d = call(S.port, "DELETE", path, NULL, NULL, 200, NULL);
  assert_true(json_is_true(json_object_get(d, "deleted")));
  json_decref(d);
  json_decref(call(S.port, "GET", path, NULL, NULL, 404, NULL));
  snprintf(b, sizeof b, "{\"previous_response_id\":\"%s\",\"input\":\"Hi\"}", str(j, "id"));
  json_decref(j);
  j = post("/v1/responses", b, 404);
  check_openai_error(j, "previous_response_not_found", "previous_response_id");
  json_decref(j);
  /* store: false keeps it out */
  j = post("/v1/responses", "{\"input\":\"Who are you?\",\"store\":false,\"max_output_tokens\":2}",
           200);
  assert_true(json_is_false(json_object_get(j, "store")));
  snprintf(path, sizeof path, "/v1/responses/%s", str(j, "id"));
  json_decref(j);
  json_decref(call(S.port, "GET", path, NULL, NULL, 404, NULL));
}

static void t_responses_refused(void **state) {
  (void)state;
  static const char *const bad[][2] = {
      {"{}", "input"},
      {"{\"input\":[]}", "input"},
      {"{\"input\":5}", "input"},
      {"{\"input\":[{\"type\":\"message\",\"role\":\"wizard\",\"content\":\"x\"}]}",
       "input[0].role"},
      {"{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_image\",\"image_url\":"
       "\"x\"}]}]}",
       "input[0].content[0]"},
      {"{\"input\":[{\"type\":\"item_reference\",\"id\":\"msg_1\"}]}", "input[0]"},
      {"{\"input\":[{\"type\":\"function_call\",\"name\":\"f\"}]}", "input[0]"},
      {"{\"input\":\"x\",\"tools\":[{\"type\":\"web_search\"}]}", "tools[0]"},
      {"{\"input\":\"x\",\"tool_choice\":{\"type\":\"allowed_tools\"}}", "tool_choice"},
      {"{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"xml\"}}}", "text.format.type"},
      {"{\"input\":\"x\",\"text\":{\"format\":5}}", "text.format"},
      {"{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"a\","
       "\"schema\":5}}}",
       "text.format.schema"},
      {"{\"input\":\"x\",\"background\":true}", "background"},
      {"{\"input\":\"x\",\"max_output_tokens\":0}", "max_output_tokens"},
      {"{\"input\":\"x\",\"temperature\":\"hot\"}", "temperature"},
      {"{\"input\":\"x\",\"reasoning\":{\"effort\":\"extreme\"}}", "reasoning.effort"},
      {"{\"input\":\"x\",\"store\":\"yes\"}", "store"},
      {"{\"input\":\"x\",\"previous_response_id\":5}", "previous_response_id"},
      {"{\"input\":\"x\",\"instructions\":[1]}", "instructions"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    json_t *j = post("/v1/responses", bad[i][0], 400);
    check_openai_error(j, NULL, bad[i][1]);
    json_decref(j);
  }
  /* a prompt over the context is the input's fault */
  char *b = malloc(30000);
  int k = sprintf(b, "{\"input\":\"");
  for (int i = 0; i < 2100; i++)
    k += sprintf(b + k, "Amen. ");
  sprintf(b + k, "\",\"max_output_tokens\":5}");
  json_t *j = post("/v1/responses", b, 400);
  check_openai_error(j, "context_length_exceeded", "input");
  json_decref(j);
  free(b);
}

/* The store's bounds: entries, bytes and age, on servers of their own. */
static void t_store_bounds(void **state) {
  (void)state;
  test_server t;
  lm_server_opts o;
  lm_server_opts_init(&o);
  o.store_entries = 2;
  o.store_ttl_s = 1.0;
  assert_int_equal(test_server_start(&t, &o), 0);
  char ids[3][64], path[256];
  const char *b = "{\"input\":\"Hi\",\"max_output_tokens\":1}";
  for (int i = 0; i < 3; i++) {
    json_t *j = call(t.port, "POST", "/v1/responses", NULL, b, 200, NULL);
    snprintf(ids[i], sizeof ids[i], "%s", str(j, "id"));
    json_decref(j);
  }
  int want[3] = {404, 200, 200}; /* two entries: the oldest went */
  for (int i = 0; i < 3; i++) {
    snprintf(path, sizeof path, "/v1/responses/%s", ids[i]);
    json_decref(call(t.port, "GET", path, NULL, NULL, want[i], NULL));
  }
  usleep(1200000); /* past the age limit */
  json_decref(call(t.port, "GET", path, NULL, NULL, 404, NULL));
  test_server_stop(&t);
  /* bytes: an entry over the cap is not kept; no store at all is a 404 too */
  lm_server_opts_init(&o);
  o.store_bytes = 256;
  assert_int_equal(test_server_start(&t, &o), 0);
  json_t *j = call(t.port, "POST", "/v1/responses", NULL, b, 200, NULL);
  snprintf(path, sizeof path, "/v1/responses/%s", str(j, "id"));
  json_decref(j);
  json_decref(call(t.port, "GET", path, NULL, NULL, 404, NULL));
  test_server_stop(&t);
  lm_server_opts_init(&o);
  o.store_entries = -1;
  assert_int_equal(test_server_start(&t, &o), 0);
  j = call(t.port, "POST", "/v1/responses", NULL, b, 200, NULL);
  snprintf(path, sizeof path, "{\"previous_response_id\":\"%s\",\"input\":\"x\"}", str(j, "id"));
  json_decref(j);
  json_decref(call(t.port, "POST", "/v1/responses", NULL, path, 404, NULL));
  test_server_stop(&t);
}

/* ---- speculative decoding -------------------------------------------------------------------- */

static const char *completion_text(const json_t *j) {
  return str(json_array_get(json_object_get(j, "choices"), 0), "text");
}

/* --spec ngram: requests speculate unless they say otherwise, answer as they would without, and
 * /stats and /metrics count the drafts; bad "speculative" fields are 400s naming the field. */
static void t_speculative(void **state) {
  (void)state;
  test_server k;
  lm_server_opts o;
  lm_server_opts_init(&o);
  o.speculative = "ngram";
  o.speculative_tokens = 4;
  assert_int_equal(test_server_start(&k, &o), 0);
  const char *head = "{\"prompt\":\"And God said, Let there be light: and there was light. And God "
                     "said, Let there be light: and there was\",\"max_tokens\":40,"
                     "\"temperature\":0,\"ignore_eos\":true";
  char body[1024];
  snprintf(body, sizeof body, "%s}", head);
  json_t *a = call(k.port, "POST", "/v1/completions", NULL, body, 200, NULL);
  json_t *st = test_stats(k.port);
  const json_t *sp = json_object_get(json_object_get(st, "batch"), "speculative");
  char *dump = json_dumps(sp, JSON_COMPACT);
  printf("speculative: %s\n", dump);
  free(dump);
  assert_string_equal(str(sp, "default"), "ngram");
  assert_true(num(sp, "drafted_tokens") > 0 && num(sp, "accepted_tokens") > 0);
  assert_true(json_real_value(json_object_get(sp, "tokens_per_step")) > 1.0);
  json_decref(st);
  const char *variants[] = {"\"speculative\":false", "\"speculative\":true",
                            "\"speculative\":\"ngram\"",
                            "\"speculative\":{\"source\":\"ngram\",\"tokens\":2}"};
  for (int i = 0; i < 4; i++) {
    snprintf(body, sizeof body, "%s,%s}", head, variants[i]);
    json_t *b = call(k.port, "POST", "/v1/completions", NULL, body, 200, NULL);
    assert_string_equal(completion_text(a), completion_text(b));
    json_decref(b);
  }
  json_decref(a);
  const char *bad[] = {"\"speculative\":\"lookahead\"", "\"speculative\":7",
                       "\"speculative\":{\"source\":\"ngram\",\"tokens\":99}",
                       "\"speculative\":{\"source\":\"ngram\",\"tokens\":8}",
                       "\"speculative\":\"draft\""}; /* no draft model */
  for (int i = 0; i < 5; i++) {
    snprintf(body, sizeof body, "%s,%s}", head, bad[i]);
    json_t *j = call(k.port, "POST", "/v1/completions", NULL, body, 400, NULL);
    check_openai_error(j, NULL, i == 2 ? "speculative.tokens" : "speculative");
    json_decref(j);
  }
  json_decref(call(k.port, "POST", "/v1/messages", NULL,
                   "{\"max_tokens\":8,\"speculative\":false,\"messages\":[{\"role\":\"user\","
                   "\"content\":\"Hi\"}]}",
                   200, NULL));
  http_resp r;
  assert_int_equal(http_get(k.port, "/metrics", &r), 0);
  assert_non_null(strstr(r.body, "\nlumen_spec_drafted_tokens_total "));
  assert_non_null(strstr(r.body, "\nlumen_spec_accepted_tokens_total "));
  http_resp_free(&r);
  test_server_stop(&k);
  /* without --spec: a request may not speculate (no room was made) */
  lm_server_opts_init(&o);
  assert_int_equal(test_server_start(&k, &o), 0);
  snprintf(body, sizeof body, "%s,\"speculative\":true}", head);
  json_t *j = call(k.port, "POST", "/v1/completions", NULL, body, 400, NULL);
  check_openai_error(j, NULL, "speculative");
  json_decref(j);
  test_server_stop(&k);
  /* an unknown default source fails the start, naming --spec */
  lm_checkpoint *ck;
  assert_int_equal(lm_checkpoint_open(TINY_MODEL, &ck), LM_OK);
  lm_server *s = NULL;
  lm_server_opts_init(&o);
  o.model_dir = TINY_MODEL;
  o.backend = "cpu";
  o.speculative = "lookahead";
  assert_int_equal(lm_server_create(ck, &o, &s), LM_ERR_INVALID);
  assert_non_null(strstr(lm_errmsg(), "--spec"));
  assert_null(s);
  lm_checkpoint_free(ck);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(t_models),           cmocka_unit_test(t_cors),
      cmocka_unit_test(t_cors_key_and_off), cmocka_unit_test(t_n_choices),
      cmocka_unit_test(t_overflow),         cmocka_unit_test(t_tokens),
      cmocka_unit_test(t_responses_text),   cmocka_unit_test(t_responses_stream),
      cmocka_unit_test(t_responses_tools),  cmocka_unit_test(t_responses_reasoning),
      cmocka_unit_test(t_responses_store),  cmocka_unit_test(t_responses_refused),
      cmocka_unit_test(t_store_bounds),     cmocka_unit_test(t_speculative),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
