/* test_chat_render.c — chat formatting against the Gemma 4 goldens (rendered by Python jinja2 from
 * the checkpoints' own templates), the jansson request path, template loading from a model
 * directory, request normalization and the built-in ChatML format. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/status.h"
#include "text/chat.h"
#include "text/jinja.h"

#define TD LM_SHARED_DIR "/testdata/gemma4/"

/* Which template each rendered* field of chat_cases.json comes from
 * (tools/gemma4_chat/gemma4_chat_cases.py). */
static const struct {
  const char *field, *file;
} FIELDS[] = {
    {"rendered", "chat_template.jinja"},
    {"rendered_e2b_e4b", "chat_template.e2b-e4b.jinja"},
    {"rendered_v1", "chat_template.v1.jinja"},
};

static char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  rewind(f);
  char *b = malloc((size_t)n + 1);
  if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
    free(b);
    b = NULL;
  }
  fclose(f);
  if (b) b[n] = '\0';
  if (len) *len = (size_t)n;
  return b;
}

static lm_chat_template *load_template(const char *file) {
  char path[1024];
  snprintf(path, sizeof path, TD "%s", file);
  char *src = slurp(path, NULL);
  assert_non_null(src);
  lm_chat_template *t = NULL;
  lm_status s = lm_chat_template_from_string(src, &t);
  if (s != LM_OK) print_message("%s: %s\n", file, lm_errmsg());
  assert_int_equal(s, LM_OK);
  free(src);
  return t;
}

/* Reads chat_cases.json with the exact JSON reader (case 05 has an integer beyond 64 bits). */
static lm_jv load_cases(lm_jarena *a, const char *file) {
  char path[1024];
  size_t n;
  snprintf(path, sizeof path, TD "%s", file);
  char *text = slurp(path, &n);
  assert_non_null(text);
  lm_jv cases;
  assert_int_equal(lm_jv_parse_json(a, text, n, &cases), LM_OK);
  free(text);
  return cases;
}

static lm_jv get(lm_jv obj, const char *key) {
  lm_jv v = lm_jv_undef();
  lm_jv_dict_gets(obj, key, &v);
  return v;
}

static lm_jv thinking_kwargs(lm_jarena *a, lm_jv c) {
  lm_jv kw, k;
  assert_int_equal(lm_jv_dict(a, 1, &kw), LM_OK);
  assert_int_equal(lm_jv_cstr(a, "enable_thinking", &k), LM_OK);
  assert_int_equal(lm_jv_dict_set(a, kw, k, get(c, "enable_thinking")), LM_OK);
  return kw;
}

static void t_chat_cases_golden(void **state) {
  (void)state;
  lm_jarena *a;
  assert_int_equal(lm_jarena_create(0, &a), LM_OK);
  lm_jv cases = load_cases(a, "chat_cases.json");
  size_t ok = 0, total = 0;
  for (size_t f = 0; f < sizeof FIELDS / sizeof *FIELDS; f++) {
    lm_chat_template *t = load_template(FIELDS[f].file);
    for (size_t i = 0; i < cases.u.l->n; i++) {
      lm_jv c = cases.u.l->v[i], want = get(c, FIELDS[f].field);
      if (want.kind != LM_JV_STR) continue;
      total++;
      char *out = NULL;
      lm_status s = lm_chat_render_values(
          t, a, get(c, "messages"), get(c, "tools"), thinking_kwargs(a, c),
          lm_jv_truthy(get(c, "add_generation_prompt")), "<bos>", "<eos>", &out);
      if (s != LM_OK)
        print_message("%s %s: %s\n", FIELDS[f].file, get(c, "name").u.s->s, lm_errmsg());
      else if (strcmp(out, want.u.s->s) != 0)
        print_message("%s %s:\n got:  %s\n want: %s\n", FIELDS[f].file, get(c, "name").u.s->s, out,
                      want.u.s->s);
      else
        ok++;
      free(out);
    }
    lm_chat_template_free(t);
  }
  print_message("chat_cases.json: %zu/%zu renders byte-exact\n", ok, total);
  assert_int_equal(total, 30);
  assert_int_equal(ok, total);
  lm_jarena_free(a);
}

/* The server path: the same cases through jansson values. jansson cannot hold 12345678901234567890,
 * so the one case carrying it is checked only above. */
static void t_chat_cases_jansson(void **state) {
  (void)state;
  lm_jarena *a;
  assert_int_equal(lm_jarena_create(0, &a), LM_OK);
  lm_jv cases = load_cases(a, "chat_cases.json");
  size_t ok = 0, skipped = 0;
  for (size_t f = 0; f < sizeof FIELDS / sizeof *FIELDS; f++) {
    lm_chat_template *t = load_template(FIELDS[f].file);
    for (size_t i = 0; i < cases.u.l->n; i++) {
      lm_jv c = cases.u.l->v[i];
      lm_jbuf b = {0};
      lm_jv_json_opts o = {-1, 0, 0, NULL, NULL};
      assert_int_equal(lm_jv_put_json(&b, c, &o), LM_OK);
      json_t *jc = json_loads(b.data, 0, NULL);
      lm_jbuf_free(&b);
      if (!jc) {
        skipped++;
        continue;
      }
      json_t *kw = json_pack("{s:O}", "enable_thinking", json_object_get(jc, "enable_thinking"));
      char *out = NULL;
      lm_status s = lm_chat_render(t, json_object_get(jc, "messages"), json_object_get(jc, "tools"),
                                   kw, json_is_true(json_object_get(jc, "add_generation_prompt")),
                                   "<bos>", "<eos>", &out);
      if (s == LM_OK && strcmp(out, json_string_value(json_object_get(jc, FIELDS[f].field))) == 0)
        ok++;
      else
        print_message("%s %s: %s\n", FIELDS[f].file, json_string_value(json_object_get(jc, "name")),
                      s ? lm_errmsg() : out);
      free(out);
      json_decref(kw);
      json_decref(jc);
    }
    lm_chat_template_free(t);
  }
  print_message("chat_cases.json via jansson: %zu byte-exact, %zu not representable in jansson\n",
                ok, skipped);
  assert_int_equal(skipped, 3);
  assert_int_equal(ok, 27);
  lm_jarena_free(a);
}

static void t_chat_template_cases(void **state) {
  (void)state;
  char *text = slurp(TD "chat_template_cases.json", NULL);
  assert_non_null(text);
  json_t *root = json_loads(text, 0, NULL);
  free(text);
  assert_non_null(root);
  lm_chat_template *t = load_template("chat_template.jinja");
  json_t *cases = json_object_get(root, "cases"), *c;
  size_t i, ok = 0;
  json_array_foreach(cases, i, c) {
    char *out = NULL;
    assert_int_equal(
        lm_chat_render(t, json_object_get(c, "messages"), NULL, NULL, 1, "<bos>", "<eos>", &out),
        LM_OK);
    if (strcmp(out, json_string_value(json_object_get(c, "rendered"))) == 0) ok++;
    free(out);
  }
  print_message("chat_template_cases.json: %zu/%zu renders byte-exact\n", ok,
                json_array_size(cases));
  assert_int_equal(ok, json_array_size(cases));
  assert_int_equal(ok, 2);
  lm_chat_template_free(t);
  json_decref(root);
}

/* The launch-day template has no golden field; it must run every case, and gemma4-chat.md states
 * its form for E1 and for the thinking switch (`<|think|>` without a newline). */
static void t_v0_release_template(void **state) {
  (void)state;
  lm_jarena *a;
  assert_int_equal(lm_jarena_create(0, &a), LM_OK);
  lm_jv cases = load_cases(a, "chat_cases.json");
  lm_chat_template *t = load_template("chat_template.v0-release.jinja");
  for (size_t i = 0; i < cases.u.l->n; i++) {
    lm_jv c = cases.u.l->v[i];
    char *out = NULL;
    assert_int_equal(lm_chat_render_values(
                         t, a, get(c, "messages"), get(c, "tools"), thinking_kwargs(a, c),
                         lm_jv_truthy(get(c, "add_generation_prompt")), "<bos>", "<eos>", &out),
                     LM_OK);
    if (i == 0) assert_string_equal(out, "<bos><|turn>user\nWhat is 2+2?<turn|>\n<|turn>model\n");
    if (i == 1) assert_non_null(strstr(out, "<|turn>system\n<|think|>You are terse.<turn|>"));
    free(out);
  }
  lm_chat_template_free(t);
  lm_jarena_free(a);
}

static json_t *parse(const char *text) {
  json_error_t err;
  json_t *j = json_loads(text, 0, &err);
  if (!j) print_message("bad test JSON: %s\n", err.text);
  assert_non_null(j);
  return j;
}

static void t_string_arguments(void **state) {
  (void)state;
  json_t *msgs = parse("[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"tool_"
                       "calls\":[{\"id\":\"a\","
                       "\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{"
                       "\\\"a\\\": 1, \\\"b\\\": 2.0}\"}}]}]");
  lm_chat_template *canon = load_template("chat_template.jinja"),
                   *v1 = load_template("chat_template.v1.jinja");
  char *out = NULL;
  /* the canonical template refuses string arguments (raise_exception), with a position */
  assert_int_equal(lm_chat_render(canon, msgs, NULL, NULL, 0, "<bos>", "<eos>", &out),
                   LM_ERR_INVALID);
  assert_non_null(strstr(lm_errmsg(), "must be a JSON object"));
  assert_non_null(strstr(lm_errmsg(), "line "));
  assert_null(out);
  /* v1 pastes them verbatim: the unbalanced call:f{{...}} the canonical revision fixed */
  assert_int_equal(lm_chat_render(v1, msgs, NULL, NULL, 0, "<bos>", "<eos>", &out), LM_OK);
  assert_non_null(strstr(out, "<|tool_call>call:f{{\"a\": 1, \"b\": 2.0}}<tool_call|>"));
  free(out);
  /* after normalization both render the decoded object, keeping 2.0 a float */
  json_t *nm, *nt;
  assert_int_equal(lm_chat_normalize(msgs, NULL, &nm, &nt), LM_OK);
  assert_null(nt);
  assert_int_equal(lm_chat_render(canon, nm, NULL, NULL, 0, "<bos>", "<eos>", &out), LM_OK);
  assert_non_null(strstr(out, "<|tool_call>call:f{a:1,b:2.0}<tool_call|><|tool_response>"));
  free(out);
  json_decref(nm);
  json_decref(msgs);
  lm_chat_template_free(canon);
  lm_chat_template_free(v1);
}

static void t_normalize(void **state) {
  (void)state;
  json_t *msgs = parse("[{\"role\":\"user\",\"content\":\"q\"},"
                       "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\","
                       "\"type\":\"function\",\"function\":"
                       "{\"name\":\"get\",\"arguments\":\"\"}}]},"
                       "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":{\"temp\":18}},"
                       "{\"role\":\"tool\",\"tool_call_id\":\"zz\",\"content\":null}]");
  json_t *tools =
      parse("[{\"type\":\"function\",\"function\":{\"name\":\"get\",\"parameters\":{\"properties\":"
            "{\"city\":{\"description\":\"c\"},\"n\":{\"enum\":[1,2]},\"tags\":{\"items\":{"
            "\"enum\":[\"a\"]}},"
            "\"opts\":{\"properties\":{\"x\":{}}}}}}}]");
  json_t *nm, *nt;
  assert_int_equal(lm_chat_normalize(msgs, tools, &nm, &nt), LM_OK);
  json_t *fn = json_object_get(
      json_array_get(json_object_get(json_array_get(nm, 1), "tool_calls"), 0), "function");
  assert_true(json_is_object(json_object_get(fn, "arguments")));
  assert_string_equal(json_string_value(json_object_get(json_array_get(nm, 2), "content")),
                      "{\"temp\":18}");
  assert_string_equal(json_string_value(json_object_get(json_array_get(nm, 2), "name")), "get");
  assert_string_equal(json_string_value(json_object_get(json_array_get(nm, 3), "content")), "");
  assert_null(json_object_get(json_array_get(nm, 3), "name"));
  json_t *params =
      json_object_get(json_object_get(json_array_get(nt, 0), "function"), "parameters");
  json_t *props = json_object_get(params, "properties");
  assert_string_equal(json_string_value(json_object_get(params, "type")), "object");
  assert_string_equal(json_string_value(json_object_get(json_object_get(props, "city"), "type")),
                      "string");
  assert_string_equal(json_string_value(json_object_get(json_object_get(props, "n"), "type")),
                      "integer");
  assert_string_equal(json_string_value(json_object_get(json_object_get(props, "tags"), "type")),
                      "array");
  assert_string_equal(json_string_value(json_object_get(
                          json_object_get(json_object_get(props, "tags"), "items"), "type")),
                      "string");
  json_t *opts = json_object_get(props, "opts");
  assert_string_equal(json_string_value(json_object_get(opts, "type")), "object");
  assert_string_equal(json_string_value(json_object_get(
                          json_object_get(json_object_get(opts, "properties"), "x"), "type")),
                      "string");
  /* the normalized request renders a balanced declaration (no "},}") and the string result */
  lm_chat_template *t = load_template("chat_template.jinja");
  char *out = NULL;
  assert_int_equal(lm_chat_render(t, nm, nt, NULL, 1, "<bos>", "<eos>", &out), LM_OK);
  assert_null(strstr(out, "},}"));
  assert_non_null(strstr(out, "city:{description:<|\"|>c<|\"|>,type:<|\"|>STRING<|\"|>}"));
  assert_non_null(strstr(out, "<|tool_call>call:get{}<tool_call|><|tool_response>response:get{"
                              "value:<|\"|>{\"temp\":18}<|\"|>}"));
  free(out);
  lm_chat_template_free(t);
  json_decref(nm);
  json_decref(nt);
  json_decref(tools);
  json_decref(msgs);
  /* bad requests: one row per defect */
  static const struct {
    const char *msgs, *msg;
  } bad[] = {
      {"{}", "messages: must be an array"},
      {"[5]", "messages[0]: needs a string role"},
      {"[{\"content\":\"x\"}]", "needs a string role"},
      {"[{\"role\":\"assistant\",\"tool_calls\":{}}]", "tool_calls: must be an array"},
      {"[{\"role\":\"assistant\",\"tool_calls\":[{\"id\":1}]}]", "needs a function object"},
      {"[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"arguments\":\"{}\"}}]}]",
       "name: must be a string"},
      {"[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":\"{"
       "bad\"}}]}]",
       "invalid JSON"},
      {"[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":\"[1]"
       "\"}}]}]",
       "must be a JSON object"},
      {"[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":\"{"
       "\\\"n\\\": "
       "123456789012345678901234}\"}}]}]",
       "invalid JSON"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    json_t *m = parse(bad[i].msgs);
    assert_int_equal(lm_chat_normalize(m, NULL, &nm, &nt), LM_ERR_INVALID);
    assert_non_null(strstr(lm_errmsg(), bad[i].msg));
    assert_null(nm);
    json_decref(m);
  }
  json_t *m = parse("[]"), *badtools = parse("[{\"type\":\"function\"}]");
  assert_int_equal(lm_chat_normalize(m, badtools, &nm, &nt), LM_ERR_INVALID);
  assert_non_null(strstr(lm_errmsg(), "tools[0]: needs a function object"));
  json_decref(m);
  json_decref(badtools);
}

static void write_file(const char *dir, const char *name, const char *text) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

static void remove_file(const char *dir, const char *name) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  unlink(path);
}

static char *render_simple(const lm_chat_template *t, const char *tools_json) {
  json_t *msgs = parse("[{\"role\":\"user\",\"content\":\"hi\"}]"),
         *tools = tools_json ? parse(tools_json) : NULL;
  char *out = NULL;
  assert_int_equal(lm_chat_render(t, msgs, tools, NULL, 1, "<s>", "</s>", &out), LM_OK);
  json_decref(msgs);
  json_decref(tools);
  return out;
}

static void t_load_model_dir(void **state) {
  (void)state;
  char dir[] = "/tmp/lm_chat_XXXXXX";
  assert_non_null(mkdtemp(dir));
  lm_chat_template *t = (lm_chat_template *)1;
  /* nothing shipped: NULL, LM_OK */
  assert_int_equal(lm_chat_template_load(dir, &t), LM_OK);
  assert_null(t);
  write_file(dir, "tokenizer_config.json", "{\"bos_token\": \"<s>\"}");
  assert_int_equal(lm_chat_template_load(dir, &t), LM_OK);
  assert_null(t);
  /* tokenizer_config.json string */
  write_file(dir, "tokenizer_config.json",
             "{\"chat_template\": \"{{ bos_token }}{% for m in messages %}[{{ m.content }}]{% "
             "endfor %}\"}");
  assert_int_equal(lm_chat_template_load(dir, &t), LM_OK);
  char *out = render_simple(t, NULL);
  assert_string_equal(out, "<s>[hi]");
  free(out);
  lm_chat_template_free(t);
  /* a list of named templates: default, and tool_use when tools are given */
  write_file(
      dir, "tokenizer_config.json",
      "{\"chat_template\": [{\"name\": \"default\", \"template\": \"D{{ messages|length }}\"},"
      " {\"name\": \"tool_use\", \"template\": \"T{{ tools|length }}\"}]}");
  assert_int_equal(lm_chat_template_load(dir, &t), LM_OK);
  out = render_simple(t, NULL);
  assert_string_equal(out, "D1");
  free(out);
  out = render_simple(t, "[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]");
  assert_string_equal(out, "T1");
  free(out);
  lm_chat_template_free(t);
  /* chat_template.json beats tokenizer_config.json, chat_template.jinja beats both */
  write_file(dir, "chat_template.json", "{\"chat_template\": \"J\"}");
  assert_int_equal(lm_chat_template_load(dir, &t), LM_OK);
  out = render_simple(t, NULL);
  assert_string_equal(out, "J");
  free(out);
  lm_chat_template_free(t);
  write_file(dir, "chat_template.jinja", "{{ eos_token }}jinja\n");
  assert_int_equal(lm_chat_template_load(dir, &t), LM_OK);
  out = render_simple(t, NULL);
  assert_string_equal(out, "</s>jinja");
  free(out);
  lm_chat_template_free(t);
  /* defects: a syntax error names the file and position; bad JSON; a list without default */
  write_file(dir, "chat_template.jinja", "{% if x %}");
  assert_int_equal(lm_chat_template_load(dir, &t), LM_ERR_CORRUPT);
  assert_non_null(strstr(lm_errmsg(), "chat_template.jinja"));
  assert_non_null(strstr(lm_errmsg(), "line 1"));
  assert_null(t);
  remove_file(dir, "chat_template.jinja");
  remove_file(dir, "chat_template.json");
  write_file(dir, "tokenizer_config.json", "{\"chat_template\": ");
  assert_int_equal(lm_chat_template_load(dir, &t), LM_ERR_CORRUPT);
  write_file(dir, "tokenizer_config.json",
             "{\"chat_template\": [{\"name\": \"x\", \"template\": \"\"}]}");
  assert_int_equal(lm_chat_template_load(dir, &t), LM_ERR_CORRUPT);
  assert_non_null(strstr(lm_errmsg(), "default"));
  write_file(dir, "tokenizer_config.json", "{\"chat_template\": 5}");
  assert_int_equal(lm_chat_template_load(dir, &t), LM_ERR_CORRUPT);
  remove_file(dir, "tokenizer_config.json");
  rmdir(dir);
  lm_chat_template_free(NULL);
}

static void t_chatml_builtin(void **state) {
  (void)state;
  lm_chat_template *t;
  assert_int_equal(lm_chat_template_chatml(&t), LM_OK);
  json_t *msgs = parse("[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                       "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Weather "
                       "\"},{\"type\":\"image\"},"
                       "{\"type\":\"text\",\"text\":\"in Paris?\"}]},"
                       "{\"role\":\"assistant\",\"content\":\"Let me "
                       "check.\",\"reasoning_content\":\"old\",\"tool_calls\":["
                       "{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"get_"
                       "weather\",\"arguments\":{\"city\":\"Paris\",\"n\":1.0}}}]},"
                       "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"18C\"},{\"role\":"
                       "\"tool\",\"tool_call_id\":\"c1\",\"content\":\"dry\"},"
                       "{\"role\":\"user\",\"content\":\"Thanks\"},"
                       "{\"role\":\"assistant\",\"content\":\"You are "
                       "welcome.\",\"reasoning_content\":\" Polite. \"}]");
  json_t *tools = parse("[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
                        "\"parameters\":{\"type\":\"object\"}}}]");
  char *out = NULL;
  assert_int_equal(lm_chat_render(t, msgs, tools, NULL, 1, NULL, NULL, &out), LM_OK);
  assert_string_equal(
      out,
      "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call the functions below. Their JSON "
      "schemas, one "
      "per line, are inside <tools></tools>:\n<tools>\n{\"type\": \"function\", \"function\": "
      "{\"name\": "
      "\"get_weather\", \"parameters\": {\"type\": \"object\"}}}\n</tools>\n\nTo call a function, "
      "reply with "
      "a JSON object that names it and gives its arguments, inside <tool_call></tool_call> tags:\n"
      "<tool_call>\n{\"name\": \"function_name\", \"arguments\": {\"argument\": "
      "\"value\"}}\n</tool_call>"
      "<|im_end|>\n<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\nLet me "
      "check.\n"
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"n\": 1.0}}\n"
      "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n18C\n</"
      "tool_response>\n<tool_response>\n"
      "dry\n</"
      "tool_response><|im_end|>\n<|im_start|>user\nThanks<|im_end|>\n<|im_start|>assistant\n<think>"
      "\n"
      "Polite.\n</think>\n\nYou are welcome.<|im_end|>\n<|im_start|>assistant\n");
  free(out);
  json_t *plain = parse("[{\"role\":\"user\",\"content\":\"hi\"}]");
  assert_int_equal(lm_chat_render(t, plain, NULL, NULL, 0, NULL, NULL, &out), LM_OK);
  assert_string_equal(out, "<|im_start|>user\nhi<|im_end|>\n");
  free(out);
  json_decref(plain);
  json_decref(msgs);
  json_decref(tools);
  lm_chat_template_free(t);
}

static void t_render_errors(void **state) {
  (void)state;
  lm_chat_template *t;
  assert_int_equal(lm_chat_template_from_string("{{ messages[0].content }}", &t), LM_OK);
  json_t *obj = parse("{}"), *msgs = parse("[{\"role\":\"user\",\"content\":\"x\"}]");
  char *out = NULL;
  assert_int_equal(lm_chat_render(t, obj, NULL, NULL, 0, NULL, NULL, &out), LM_ERR_INVALID);
  assert_int_equal(lm_chat_render(t, msgs, NULL, msgs, 0, NULL, NULL, &out),
                   LM_ERR_INVALID); /* kwargs not an object */
  assert_int_equal(lm_chat_render(NULL, msgs, NULL, NULL, 0, NULL, NULL, &out), LM_ERR_INVALID);
  /* kwargs cannot replace what the server renders with */
  static const char *const owned[] = {
      "messages", "tools", "bos_token", "eos_token", "add_generation_prompt", "raise_exception"};
  for (size_t i = 0; i < sizeof owned / sizeof *owned; i++) {
    char js[128];
    snprintf(js, sizeof js, "{\"%s\": [{\"content\": \"overridden\"}]}", owned[i]);
    json_t *bad = parse(js);
    assert_int_equal(lm_chat_render(t, msgs, NULL, bad, 0, NULL, NULL, &out), LM_ERR_INVALID);
    assert_null(out);
    assert_non_null(strstr(lm_errmsg(), owned[i]));
    json_decref(bad);
  }
  lm_chat_template_free(t);
  /* only the variables the template refers to reach it */
  assert_int_equal(
      lm_chat_template_from_string("{{ a is defined }}{{ b is defined }}{% set c = 1 %}", &t),
      LM_OK);
  json_t *kw = parse("{\"a\": 1, \"b\": 2, \"zz\": 3}");
  assert_int_equal(lm_chat_render(t, msgs, NULL, kw, 0, NULL, NULL, &out), LM_OK);
  assert_string_equal(out, "TrueTrue");
  free(out);
  lm_chat_template_free(t);
  assert_int_equal(lm_chat_template_from_string("{{ zz is defined }}{{ a is defined }}", &t),
                   LM_OK);
  json_t *kw2 = parse("{\"a\": 1}");
  assert_int_equal(lm_chat_render(t, msgs, NULL, kw2, 0, NULL, NULL, &out), LM_OK);
  assert_string_equal(out, "FalseTrue");
  free(out);
  json_decref(kw2);
  lm_chat_template_free(t);
  assert_int_equal(lm_chat_template_from_string("{% for %}", &t), LM_ERR_CORRUPT);
  assert_null(t);
  json_decref(obj);
  json_decref(msgs);
  json_decref(kw);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(t_chat_cases_golden),   cmocka_unit_test(t_chat_cases_jansson),
      cmocka_unit_test(t_chat_template_cases), cmocka_unit_test(t_v0_release_template),
      cmocka_unit_test(t_string_arguments),    cmocka_unit_test(t_normalize),
      cmocka_unit_test(t_load_model_dir),      cmocka_unit_test(t_chatml_builtin),
      cmocka_unit_test(t_render_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
