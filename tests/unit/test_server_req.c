/* test_server_req.c — the server's pure parts, without a model or sockets: request validation
 * (a table of bad requests, each with the status and the param it must name, and the values good
 * requests produce), the stop-string matcher with hold-back, KV admission arithmetic, SSE framing,
 * the two error shapes and the Prometheus text. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/admit.h"
#include "server/srv_error.h"
#include "server/srv_metrics.h"
#include "server/srv_req.h"
#include "server/srv_sse.h"
#include "engine/stop_hold.h"

#define VOCAB 4096

/* Parses body as a chat (kind 'c') or completion ('p') request; returns the HTTP status (0: ok). */
static int parse(const char *body, int kind, lm_srv_params *p, lm_srv_err *e) {
  lm_sampling d;
  lm_sampling_init(&d);
  json_t *j;
  memset(e, 0, sizeof *e);
  lm_srv_params_init(p);
  int r = lm_srv_parse_body(body, strlen(body), &j, e);
  if (!r) r = lm_srv_parse_common(j, &d, VOCAB, p, e);
  if (!r) r = kind == 'c' ? lm_srv_parse_chat(j, p, e) : lm_srv_parse_completion(j, VOCAB, p, e);
  json_decref(j);
  return r;
}

typedef struct bad_case {
  int kind;
  const char *body;
  int status;
  const char *param; /* NULL: the error names none */
} bad_case;

static const bad_case bad_cases[] = {
    {'c', "", 400, NULL},
    {'c', "{\"messages\":", 400, NULL},
    {'c', "[1,2,3]", 400, NULL},
    {'c', "\"text\"", 400, NULL},
    {'c', "{\"a\":1,\"a\":2}", 400, NULL},
    {'c', "{}", 400, "messages"},
    {'c', "{\"messages\":[]}", 400, "messages"},
    {'c', "{\"messages\":{}}", 400, "messages"},
    {'c', "{\"messages\":[1]}", 400, "messages[0]"},
    {'c', "{\"messages\":[{\"content\":\"x\"}]}", 400, "messages[0].role"},
    {'c', "{\"messages\":[{\"role\":7,\"content\":\"x\"}]}", 400, "messages[0].role"},
    {'c', "{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", 400, "messages[0].role"},
    {'c', "{\"messages\":[{\"role\":\"user\"}]}", 400, "messages[0].content"},
    {'c', "{\"messages\":[{\"role\":\"user\",\"content\":5}]}", 400, "messages[0].content"},
    {'c', "{\"messages\":[{\"role\":\"user\",\"content\":[]}]}", 400, "messages[0].content"},
    {'c', "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}", 400,
     "messages[0].content[0]"},
    {'c',
     "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{}}]}]}",
     400, "messages[0].content[0]"},
    {'c', "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"hologram\"}]}]}", 400,
     "messages[0].content[0]"},
    {'c', "{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"name\":3}]}", 400,
     "messages[0].name"},
    {'c',
     "{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"name\":\"f\","
     "\"arguments\":\"{bad\"}}]}]}",
     400, "messages"},
    {'c', "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":\"hot\"}", 400,
     "temperature"},
    {'c', "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":-1}", 400,
     "temperature"},
    {'c', "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_p\":0}", 400, "top_p"},
    {'c', "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_p\":1.5}", 400, "top_p"},
    {'c', "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_k\":1.5}", 400, "top_k"},
    {'c', "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"min_p\":2}", 400, "min_p"},
    {'c', "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"seed\":\"s\"}", 400, "seed"},
    {'c', "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":0}", 400,
     "max_tokens"},
    {'c', "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":-5}", 400,
     "max_tokens"},
    {'c', "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_completion_tokens\":0}", 400,
     "max_completion_tokens"},
    {'c', "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":\"10\"}", 400,
     "max_tokens"},
    {'c', "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream\":1}", 400, "stream"},
    {'c',
     "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream_options\":{\"include_usage\":"
     "\"y\"}}",
     400, "stream_options.include_usage"},
    {'c', "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":5}", 400, "stop"},
    {'c', "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":[\"\"]}", 400, "stop"},
    {'c', "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logit_bias\":[1]}", 400,
     "logit_bias"},
    {'c', "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logit_bias\":{\"abc\":1}}", 400,
     "logit_bias"},
    {'c', "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logit_bias\":{\"4096\":1}}", 400,
     "logit_bias"},
    {'c', "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logit_bias\":{\"5\":101}}", 400,
     "logit_bias"},
    {'c', "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":17}", 400, "n"},
    {'c', "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"presence_penalty\":3}", 400,
     "presence_penalty"},
    {'c', "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"repetition_penalty\":0}", 400,
     "repetition_penalty"},
    {'c', "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":\"yes\"}", 400,
     "logprobs"},
    {'c', "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":3}", 400,
     "top_logprobs"},
    {'c',
     "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,\"top_logprobs\":21}",
     400, "top_logprobs"},
    {'c', "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":{}}", 400, "tools"},
    {'c',
     "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\"}]}",
     400, "tools[0]"},
    {'c',
     "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\","
     "\"function\":{\"name\":\"a b\"}}]}",
     400, "tools[0]"},
    {'c', "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"always\"}", 400,
     "tool_choice"},
    {'c', "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"required\"}",
     400, "tool_choice"},
    {'c',
     "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\","
     "\"function\":{\"name\":\"f\"}}],"
     "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"g\"}}}",
     400, "tool_choice"},
    {'c', "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"reasoning_effort\":\"extreme\"}",
     400, "reasoning_effort"},
    {'c', "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"chat_template_kwargs\":[]}", 400,
     "chat_template_kwargs"},
    {'c',
     "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"chat_template_kwargs\":{\"messages\":"
     "[{\"role\":\"evil\",\"content\":\"x\"}]}}",
     400, "chat_template_kwargs"},
    {'c',
     "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"chat_template_kwargs\":{\"bos_"
     "token\":"
     "\"<bos>\"}}",
     400, "chat_template_kwargs"},
    {'c',
     "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"chat_template_kwargs\":{\"enable_"
     "thinking\":1}}",
     400, "chat_template_kwargs.enable_thinking"},
    {'c',
     "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"json_"
     "schema\"}}",
     400, "response_format"},
    {'c', "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"model\":5}", 400, "model"},
    {'p', "{}", 400, "prompt"},
    {'p', "{\"prompt\":\"\"}", 400, "prompt"},
    {'p', "{\"prompt\":[\"a\",\"b\"]}", 400, "prompt"},
    {'p', "{\"prompt\":[1,-2]}", 400, "prompt"},
    {'p', "{\"prompt\":[1,4096]}", 400, "prompt"},
    {'p', "{\"prompt\":\"x\",\"echo\":true}", 400, "echo"},
    {'p', "{\"prompt\":\"x\",\"suffix\":\"y\"}", 400, "suffix"},
    {'p', "{\"prompt\":\"x\",\"logprobs\":30}", 400, "logprobs"},
};

static void t_bad_requests(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof bad_cases / sizeof *bad_cases; i++) {
    const bad_case *c = &bad_cases[i];
    lm_srv_params p;
    lm_srv_err e;
    int r = parse(c->body, c->kind, &p, &e);
    if (r != c->status || strcmp(e.param, c->param ? c->param : "")) {
      fprintf(stderr, "case %zu: %s\n  -> status %d, param '%s', message '%s'\n", i, c->body, r,
              e.param, e.message);
      fail();
    }
    assert_true(e.message[0] != '\0');
    assert_string_equal(e.type, "invalid_request_error");
    lm_srv_params_clear(&p);
  }
}

static void t_invalid_utf8(void **state) {
  (void)state;
  const char body[] = "{\"messages\":[{\"role\":\"user\",\"content\":\"a\xC3\x28\"}]}";
  json_t *j;
  lm_srv_err e;
  assert_int_equal(lm_srv_parse_body(body, strlen(body), &j, &e), 400);
  assert_string_equal(e.code, "invalid_utf8");
  assert_non_null(strstr(e.message, "byte 40"));
}

static void t_good_chat(void **state) {
  (void)state;
  lm_srv_params p;
  lm_srv_err e;
  const char *body =
      "{\"model\":\"m\",\"messages\":[{\"role\":\"developer\",\"content\":\"be brief\"},"
      "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"hi\"}]},"
      "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":"
      "\"function\","
      "\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\": 1.0, \\\"b\\\": 2}\"}}]},"
      "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"ok\"}],"
      "\"temperature\":0.5,\"top_p\":0.9,\"top_k\":-1,\"min_p\":0.1,\"seed\":7,\"max_tokens\":12,"
      "\"stop\":[\"END\",\"\\n\\n\"],\"logit_bias\":{\"5\":-100,\"9\":2.5},\"presence_penalty\":0."
      "5,"
      "\"stream\":true,\"stream_options\":{\"include_usage\":true},\"logprobs\":true,\"top_"
      "logprobs\":3,"
      "\"reasoning_effort\":\"high\",\"ignore_eos\":true,"
      "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{"
      "\"properties\":{\"a\":{}}}}},"
      "{\"type\":\"function\",\"function\":{\"name\":\"g\"}}],"
      "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}}}";
  assert_int_equal(parse(body, 'c', &p, &e), 0);
  assert_float_equal(p.sampling.temperature, 0.5, 1e-6);
  assert_float_equal(p.sampling.top_p, 0.9, 1e-6);
  assert_int_equal(p.sampling.top_k, 0);
  assert_float_equal(p.sampling.min_p, 0.1, 1e-6);
  assert_float_equal(p.sampling.presence_penalty, 0.5, 1e-6);
  assert_true(p.has_seed);
  assert_int_equal(p.sampling.seed, 7);
  assert_int_equal(p.max_tokens, 12);
  assert_int_equal(p.n_stops, 2);
  assert_string_equal(p.stops[1], "\n\n");
  assert_int_equal(p.sampling.n_bias, 2);
  assert_true(p.stream && p.include_usage && p.ignore_eos);
  assert_int_equal(p.top_logprobs, 3);
  assert_true(json_is_true(json_object_get(p.kwargs, "enable_thinking")));
  /* developer -> system, text parts kept, string arguments decoded with int vs float kept */
  assert_string_equal(json_string_value(json_object_get(json_array_get(p.messages, 0), "role")),
                      "system");
  json_t *args = json_object_get(
      json_object_get(
          json_array_get(json_object_get(json_array_get(p.messages, 2), "tool_calls"), 0),
          "function"),
      "arguments");
  assert_true(json_is_real(json_object_get(args, "a")));
  assert_true(json_is_integer(json_object_get(args, "b")));
  /* the named tool_choice declares only that tool; the schema got its missing type */
  assert_int_equal(p.tool_choice, LM_SRV_TOOLS_NAMED);
  assert_int_equal(json_array_size(p.tools), 1);
  json_t *params =
      json_object_get(json_object_get(json_array_get(p.tools, 0), "function"), "parameters");
  assert_string_equal(json_string_value(json_object_get(params, "type")), "object");
  lm_srv_params_clear(&p);
}

static void t_defaults_and_overrides(void **state) {
  (void)state;
  lm_srv_params p;
  lm_srv_err e;
  assert_int_equal(
      parse("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"reasoning_effort\":\"none\","
            "\"chat_template_kwargs\":{\"enable_thinking\":true,\"x\":1},\"tool_choice\":\"none\","
            "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"max_tokens\":5.0}",
            'c', &p, &e),
      0);
  /* chat_template_kwargs wins over reasoning_effort; tool_choice none declares no tools */
  assert_true(json_is_true(json_object_get(p.kwargs, "enable_thinking")));
  assert_int_equal(json_integer_value(json_object_get(p.kwargs, "x")), 1);
  assert_null(p.tools);
  assert_int_equal(p.max_tokens, 5);
  assert_false(p.has_seed);
  assert_int_equal(p.top_logprobs, -1);
  lm_srv_params_clear(&p);
  assert_int_equal(parse("{\"prompt\":[2,10,11],\"logprobs\":2}", 'p', &p, &e), 0);
  assert_int_equal(p.n_prompt_ids, 3);
  assert_int_equal(p.prompt_ids[2], 11);
  assert_int_equal(p.top_logprobs, 2);
  lm_srv_params_clear(&p);
  assert_int_equal(parse("{\"prompt\":[\"In the beginning\"],\"stop\":\"x\"}", 'p', &p, &e), 0);
  assert_string_equal(p.prompt, "In the beginning");
  assert_int_equal(p.n_stops, 1);
  lm_srv_params_clear(&p);
}

/* ---- stop strings ---------------------------------------------------------------------------- */

/* Feeds pieces; returns everything released, and the matched index. */
static char *run_stop(char **stops, int n, const char *const *pieces, int np, int *matched) {
  lm_stop_hold s;
  lm_stop_hold_init(&s, stops, n);
  char *all = calloc(1, 256);
  for (int i = 0; i < np; i++) {
    char *out;
    size_t k;
    assert_int_equal(lm_stop_hold_push(&s, pieces[i], strlen(pieces[i]), i == np - 1, &out, &k),
                     LM_OK);
    if (k) strncat(all, out, k);
    free(out);
  }
  *matched = s.matched;
  lm_stop_hold_clear(&s);
  return all;
}

static void t_stop_strings(void **state) {
  (void)state;
  char *stops[] = {"END", "\n\n"};
  int m;
  const char *a[] = {"hello E", "N", "D and more"};
  char *r = run_stop(stops, 2, a, 3, &m);
  assert_string_equal(r, "hello ");
  assert_int_equal(m, 0);
  free(r);
  const char *b[] = {"one\n", "\ntwo"};
  r = run_stop(stops, 2, b, 2, &m);
  assert_string_equal(r, "one");
  assert_int_equal(m, 1);
  free(r);
  const char *c[] = {"EN", "x",
                     "E"}; /* a partial match that turns out not to be one, then the end */
  r = run_stop(stops, 2, c, 3, &m);
  assert_string_equal(r, "ENxE");
  assert_int_equal(m, -1);
  free(r);
  /* hold-back: nothing that could start a stop string is released before it is decided */
  lm_stop_hold s;
  lm_stop_hold_init(&s, stops, 2);
  char *out;
  size_t k;
  assert_int_equal(lm_stop_hold_push(&s, "abcEN", 5, 0, &out, &k), LM_OK);
  assert_int_equal(k, 3);
  free(out);
  lm_stop_hold_clear(&s);
}

/* ---- admission ------------------------------------------------------------------------------- */

static void t_admission(void **state) {
  (void)state;
  lm_kv_spec specs[2] = {
      {.kind = LM_KV_ROTATING_PLAIN, .n_kv_heads = 1, .head_dim = 64, .window = 128},
      {.kind = LM_KV_PLAIN, .n_kv_heads = 1, .head_dim = 128}};
  lm_admit a;
  assert_int_equal(lm_admit_init(&a, specs, 2, LM_DT_F32, 1 << 20, 4096), LM_OK);
  assert_int_equal(lm_admit_bytes_per_token(&a), 512 + 1024);
  assert_int_equal(lm_admit_bytes(&a, 100), 100 * 1536);
  /* past the ring (the window and its spare slots) only the plain cache grows */
  const int64_t ring = lm_kv_ring_slots(128);
  assert_int_equal(lm_admit_bytes(&a, 1000), ring * 512 + 1000 * 1024);
  int64_t mc = lm_admit_max_context(&a);
  assert_true(lm_admit_bytes(&a, mc) <= a.budget);
  assert_true(lm_admit_bytes(&a, mc + 1) > a.budget);
  assert_int_equal(mc, (1048576 - ring * 512) / 1024);
  a.budget = INT64_MAX;
  assert_int_equal(lm_admit_max_context(&a), 4096);
}

/* ---- SSE, errors, metrics -------------------------------------------------------------------- */

static void t_sse_and_errors(void **state) {
  (void)state;
  lm_srv_buf b = {0};
  assert_int_equal(lm_srv_sse_data(&b, json_pack("{s:i}", "a", 1)), LM_OK);
  assert_int_equal(lm_srv_sse_event(&b, "ping", json_pack("{s:s}", "type", "ping")), LM_OK);
  assert_int_equal(lm_srv_sse_raw(&b, "data: [DONE]\n\n"), LM_OK);
  assert_string_equal(
      b.p, "data: {\"a\":1}\n\nevent: ping\ndata: {\"type\":\"ping\"}\n\ndata: [DONE]\n\n");
  lm_srv_buf_free(&b);
  lm_srv_err e;
  lm_srv_err_set(&e, 400, "memory_admission", "context_over_budget", NULL, "too big: %d", 5);
  char *j = lm_srv_err_openai_json(&e);
  assert_string_equal(
      j, "{\"error\":{\"message\":\"too big: 5\",\"type\":\"memory_admission\",\"param\":null,"
         "\"code\":\"context_over_budget\"}}");
  free(j);
  lm_srv_err_bad(&e, "messages[0].role", "bad role");
  j = lm_srv_err_anthropic_json(&e);
  assert_string_equal(j, "{\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\","
                         "\"message\":\"bad role\"}}");
  free(j);
  lm_srv_err_set(&e, 400, "invalid_request_error", NULL, NULL, "bytes \xff here");
  j = lm_srv_err_openai_json(&e); /* invalid UTF-8 in a message must not lose the body */
  assert_non_null(j);
  free(j);
}

static void t_metrics(void **state) {
  (void)state;
  lm_srv_metrics m;
  lm_srv_metrics_init(&m);
  lm_srv_metrics_request(&m, lm_srv_metrics_endpoint("/v1/chat/completions"), 200);
  lm_srv_metrics_request(&m, lm_srv_metrics_endpoint("/nope"), 404);
  lm_srv_metrics_request(&m, lm_srv_metrics_endpoint("/v1/models"), 405);
  lm_srv_metrics_request(&m, lm_srv_metrics_endpoint("/v1/messages"), 413);
  lm_srv_metrics_generation(&m, 10, 4, 20, 0.03, 0.5);
  lm_srv_metrics_generation(&m, 10, 0, 20, 0.2, 1.5);
  assert_float_equal(lm_srv_metrics_percentile(&m, &m.ttft, 0), 0.03, 1e-9);
  assert_float_equal(lm_srv_metrics_percentile(&m, &m.ttft, 100), 0.2, 1e-9);
  lm_engine_stats st = {.active = 3, .queue_cap = 8};
  char *t = lm_srv_metrics_render(&m, &st);
  assert_non_null(
      strstr(t, "lumen_requests_total{endpoint=\"/v1/chat/completions\",status=\"2xx\"} 1\n"));
  assert_non_null(strstr(t, "lumen_requests_total{endpoint=\"other\",status=\"404\"} 1\n"));
  assert_non_null(strstr(t, "lumen_requests_total{endpoint=\"/v1/models\",status=\"405\"} 1\n"));
  assert_non_null(strstr(t, "lumen_requests_total{endpoint=\"/v1/messages\",status=\"413\"} 1\n"));
  assert_non_null(strstr(t, "lumen_time_to_first_token_seconds_bucket{le=\"0.05\"} 1\n"));
  assert_non_null(strstr(t, "lumen_time_to_first_token_seconds_bucket{le=\"+Inf\"} 2\n"));
  assert_non_null(strstr(t, "lumen_completion_tokens_total 40\n"));
  assert_non_null(strstr(t, "lumen_sequences_active 3\n"));
  assert_non_null(strstr(t, "# TYPE lumen_request_latency_seconds histogram\n"));
  free(t);
  lm_srv_metrics_destroy(&m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(t_bad_requests),   cmocka_unit_test(t_invalid_utf8),
      cmocka_unit_test(t_good_chat),      cmocka_unit_test(t_defaults_and_overrides),
      cmocka_unit_test(t_stop_strings),   cmocka_unit_test(t_admission),
      cmocka_unit_test(t_sse_and_errors), cmocka_unit_test(t_metrics),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
