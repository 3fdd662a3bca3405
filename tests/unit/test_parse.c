/* test_parse.c — model-output parsing: every case of parse_cases.json under many splits of the
 * text, a render → parse round trip of every assistant turn of chat_cases.json, malformed and
 * quirky outputs, the call syntax itself, streaming behaviour, and the generic ChatML/Hermes
 * format.
 *
 * Raw outputs are turned into (id, piece) pairs the way a detokenizer would hand them over: each
 * control-token string is one atomic piece with its id (made-up ids from the table below, looked up
 * by text through lm_parser_tokens_gemma4), and the text between them is cut into pieces of varying
 * lengths. The result must not depend on the cut. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "base/status.h"
#include "text/chat.h"
#include "text/jinja.h"
#include "text/parse.h"
#include "text/tokenizer.h"

#define TD LM_SHARED_DIR "/testdata/gemma4/"

static const struct {
  const char *text;
  int32_t id;
} CONTROL[] = {
    {"<|channel>", 1100},
    {"<channel|>", 1101},
    {"<|tool_call>", 1048},
    {"<tool_call|>", 1049},
    {"<|tool_response>", 1050},
    {"<tool_response|>", 1051},
    {"<|\"|>", 1052},
    {"<turn|>", 1106},
    {"<|turn>", 1105},
    {"<eos>", 1001},
    {"<bos>", 1002},
    {"<|think|>", 1098},
    {"<|image|>", 1880},
    {"<|audio|>", 1881},
    {"<|video|>", 1884},
    {"<|tool>", 1046},
    {"<tool|>", 1047},
};
#define NCONTROL (sizeof CONTROL / sizeof *CONTROL)

static int32_t find_token(const void *ctx, const char *text, size_t len) {
  (void)ctx;
  for (size_t i = 0; i < NCONTROL; i++)
    if (strlen(CONTROL[i].text) == len && memcmp(CONTROL[i].text, text, len) == 0)
      return CONTROL[i].id;
  return -1;
}

/* ---- feeding -------------------------------------------------------------------------------- */

typedef struct events {
  char content[8192], reasoning[8192];
  size_t nc, nr;
  int calls;
  int call_before_close; /* a call event arrived while the feed was not at a <tool_call|> */
  int at_close;
} events;

static lm_status on_event(void *user, const lm_parse_event *ev) {
  events *e = user;
  if (ev->kind == LM_PARSE_CONTENT && e->nc + ev->len < sizeof e->content) {
    memcpy(e->content + e->nc, ev->text, ev->len);
    e->nc += ev->len;
  } else if (ev->kind == LM_PARSE_REASONING && e->nr + ev->len < sizeof e->reasoning) {
    memcpy(e->reasoning + e->nr, ev->text, ev->len);
    e->nr += ev->len;
  } else if (ev->kind == LM_PARSE_TOOL_CALL) {
    assert_int_equal(ev->index, e->calls);
    e->calls++;
  }
  return LM_OK;
}

enum { SPLIT_WHOLE, SPLIT_CHAR, SPLIT_BYTE, SPLIT_RANDOM };

/* Feeds text (no control tokens) in pieces according to mode. */
static void feed_text(lm_parser *p, const char *s, size_t n, int mode, lm_rng *rng) {
  size_t i = 0;
  while (i < n) {
    size_t k = n - i;
    if (mode == SPLIT_BYTE)
      k = 1;
    else if (mode == SPLIT_CHAR) {
      k = 1;
      while (i + k < n && ((unsigned char)s[i + k] & 0xC0) == 0x80)
        k++;
    } else if (mode == SPLIT_RANDOM) {
      size_t r = (size_t)(lm_rng_next(rng) % 7);
      k = r == 0 ? n - i : r < k ? r : k;
    }
    assert_int_equal(lm_parser_feed(p, -1, s + i, k), LM_OK);
    i += k;
  }
}

/* Splits raw model output into control pieces (atomic, with ids) and text pieces, and feeds them.
 */
static void feed_raw(lm_parser *p, events *e, const char *raw, int mode, uint64_t seed) {
  lm_rng rng = {seed, 0};
  size_t n = strlen(raw), i = 0, text_start = 0;
  while (i <= n) {
    size_t c = NCONTROL;
    if (i < n)
      for (c = 0; c < NCONTROL; c++)
        if (strncmp(raw + i, CONTROL[c].text, strlen(CONTROL[c].text)) == 0) break;
    if (i < n && c == NCONTROL) {
      i++;
      continue;
    }
    feed_text(p, raw + text_start, i - text_start, mode, &rng);
    if (i == n) break;
    size_t len = strlen(CONTROL[c].text);
    e->at_close = CONTROL[c].id == 1049;
    int before = e->calls;
    assert_int_equal(lm_parser_feed(p, CONTROL[c].id, raw + i, len), LM_OK);
    if (e->calls != before && !e->at_close && CONTROL[c].id != 1106 && CONTROL[c].id != 1001 &&
        CONTROL[c].id != 1050)
      e->call_before_close = 1;
    e->at_close = 0;
    i += len;
    text_start = i;
  }
}

static lm_parser *gemma_parser(events *e, int start_in_reasoning) {
  lm_parser_opts o = {0};
  o.format = LM_PARSER_GEMMA4;
  assert_int_equal(lm_parser_tokens_gemma4(find_token, NULL, &o.tokens), LM_OK);
  o.start_in_reasoning = start_in_reasoning;
  o.emit = on_event;
  o.user = e;
  lm_parser *p;
  assert_int_equal(lm_parser_create(&o, &p), LM_OK);
  return p;
}

/* Streamed deltas must add up to the collected results. */
static void check_events(const lm_parser *p, const events *e) {
  assert_int_equal(e->nc, lm_parser_content_len(p));
  assert_int_equal(e->nr, lm_parser_reasoning_len(p));
  assert_memory_equal(e->content, lm_parser_content(p), e->nc);
  const char *r = lm_parser_reasoning(p);
  assert_int_equal(e->nr, r ? strlen(r) : 0);
  if (r) assert_memory_equal(e->reasoning, r, e->nr);
  assert_int_equal((size_t)e->calls, lm_parser_tool_call_count(p));
  assert_false(e->call_before_close);
}

/* Compares a call's arguments JSON text with an expected jansson value. */
static int args_equal(const char *args, const json_t *want) {
  json_t *got = json_loads(args, 0, NULL);
  int eq = got && json_equal(got, want);
  json_decref(got);
  return eq;
}

/* ---- parse_cases.json ----------------------------------------------------------------------- */

static int run_case(const json_t *c, int mode, uint64_t seed) {
  events e;
  memset(&e, 0, sizeof e);
  lm_parser *p = gemma_parser(&e, json_is_true(json_object_get(c, "start_in_reasoning")));
  feed_raw(p, &e, json_string_value(json_object_get(c, "raw")), mode, seed);
  assert_int_equal(lm_parser_finish(p), LM_OK);
  check_events(p, &e);
  const json_t *want = json_object_get(c, "expected"), *wr = json_object_get(want, "reasoning");
  const json_t *calls = json_object_get(want, "tool_calls");
  int ok = strcmp(lm_parser_content(p), json_string_value(json_object_get(want, "content"))) == 0;
  const char *r = lm_parser_reasoning(p);
  ok &= json_is_null(wr) ? r == NULL : (r && strcmp(r, json_string_value(wr)) == 0);
  ok &= lm_parser_tool_call_count(p) == json_array_size(calls);
  for (size_t k = 0; ok && k < json_array_size(calls); k++) {
    const json_t *wc = json_array_get(calls, k);
    ok &=
        strcmp(lm_parser_tool_call_name(p, k), json_string_value(json_object_get(wc, "name"))) == 0;
    ok &= args_equal(lm_parser_tool_call_arguments(p, k), json_object_get(wc, "arguments"));
  }
  if (!ok)
    print_message("%s (split %d seed %llu): content [%s] reasoning [%s] calls %zu\n",
                  json_string_value(json_object_get(c, "name")), mode, (unsigned long long)seed,
                  lm_parser_content(p), r ? r : "(null)", lm_parser_tool_call_count(p));
  lm_parser_free(p);
  return ok;
}

static void t_parse_cases(void **state) {
  (void)state;
  json_error_t err;
  json_t *cases = json_load_file(TD "parse_cases.json", 0, &err);
  assert_non_null(cases);
  size_t passed = 0, runs = 0, failed_runs = 0;
  for (size_t i = 0; i < json_array_size(cases); i++) {
    const json_t *c = json_array_get(cases, i);
    int all = 1;
    for (int mode = SPLIT_WHOLE; mode <= SPLIT_RANDOM; mode++)
      for (uint64_t seed = 1; seed <= (mode == SPLIT_RANDOM ? 25u : 1u); seed++) {
        int ok = run_case(c, mode, seed);
        runs++;
        failed_runs += !ok;
        all &= ok;
      }
    passed += (size_t)all;
  }
  print_message("parse_cases.json: %zu/%zu cases pass under every split (%zu feeds)\n", passed,
                json_array_size(cases), runs);
  assert_int_equal(failed_runs, 0);
  assert_int_equal(passed, json_array_size(cases));
  assert_int_equal(passed, 7);
  json_decref(cases);
}

/* ---- round trip: render → model part → parse ------------------------------------------------ */

static char *slurp(const char *path) {
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
  return b;
}

static lm_jv get(lm_jv obj, const char *key) {
  lm_jv v = lm_jv_undef();
  if (obj.kind == LM_JV_DICT) lm_jv_dict_gets(obj, key, &v);
  return v;
}

static char *render_prefix(const lm_chat_template *t, lm_jarena *a, lm_jv c, size_t upto, int agp) {
  lm_jv msgs, kw, k;
  lm_jv all = get(c, "messages");
  assert_int_equal(lm_jv_list(a, upto, &msgs), LM_OK);
  for (size_t i = 0; i < upto; i++)
    assert_int_equal(lm_jv_list_push(a, msgs, all.u.l->v[i]), LM_OK);
  assert_int_equal(lm_jv_dict(a, 1, &kw), LM_OK);
  assert_int_equal(lm_jv_cstr(a, "enable_thinking", &k), LM_OK);
  assert_int_equal(lm_jv_dict_set(a, kw, k, get(c, "enable_thinking")), LM_OK);
  char *out = NULL;
  lm_status s = lm_chat_render_values(t, a, msgs, get(c, "tools"), kw, agp, "<bos>", "<eos>", &out);
  if (s != LM_OK) print_message("render: %s\n", lm_errmsg());
  assert_int_equal(s, LM_OK);
  return out;
}

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* What the template made of the message's content: <|channel>…<channel|> spans dropped, then
 * trimmed. */
static void expected_content(lm_jv content, char *out, size_t cap) {
  const char *s = content.kind == LM_JV_STR ? content.u.s->s : "";
  char buf[4096];
  size_t o = 0;
  while (*s && o + 1 < sizeof buf) {
    const char *open = strstr(s, "<|channel>"), *close = open ? strstr(open, "<channel|>") : NULL;
    size_t n = open && close ? (size_t)(open - s) : strlen(s);
    memcpy(buf + o, s, n < sizeof buf - o - 1 ? n : sizeof buf - o - 1);
    o += n;
    s += n;
    if (open && close) s = close + strlen("<channel|>");
  }
  buf[o] = '\0';
  size_t b = lm_py_lspace(buf, o), e = o - lm_py_rspace(buf, o);
  snprintf(out, cap, "%.*s", (int)(e > b ? e - b : 0), buf + b);
}

static char *sorted_json(lm_jarena *a, lm_jv v) {
  lm_jbuf b = {0};
  lm_jv_json_opts o = {-1, 1, 0, NULL, NULL};
  (void)a;
  assert_int_equal(lm_jv_put_json(&b, v, &o), LM_OK);
  char *s;
  assert_int_equal(lm_jbuf_take(&b, &s), LM_OK);
  return s;
}

/* Parses the model part of assistant message `mi` and checks it against the message. */
static int round_trip_turn(const lm_chat_template *t, lm_jarena *a, lm_jv c, size_t mi,
                           uint64_t seed) {
  char *prompt = render_prefix(t, a, c, mi, 1), *full = render_prefix(t, a, c, mi + 1, 0);
  size_t plen = strlen(prompt);
  int in_reasoning = 0;
  /* the model continues the prompt; where the prompt pre-filled a channel the model did not keep
   * (the empty thought of the big family, or the open thought after a tool response), back off.
   * After a tool response followed by content, the template closes the turn that the next assistant
   * message continues (gemma4-chat.md E8): the model part then starts where the <turn|> was. */
  if (strncmp(full, prompt, plen) != 0) {
    static const char *const prefills[] = {"<|channel>thought\n<channel|>", "<|channel>thought\n",
                                           "<turn|>\n"};
    plen = 0;
    for (size_t k = 0; k < 3 && !plen; k++)
      if (ends_with(prompt, prefills[k]) &&
          strncmp(full, prompt, strlen(prompt) - strlen(prefills[k])) == 0)
        plen = strlen(prompt) - strlen(prefills[k]);
    if (!plen) {
      print_message("turn %zu: the full render does not extend the prompt\n", mi);
      free(prompt);
      free(full);
      return 0;
    }
  } else {
    in_reasoning = ends_with(prompt, "<|channel>thought\n");
  }
  events e;
  memset(&e, 0, sizeof e);
  lm_parser *p = gemma_parser(&e, in_reasoning);
  feed_raw(p, &e, full + plen, SPLIT_RANDOM, seed);
  assert_int_equal(lm_parser_finish(p), LM_OK);
  check_events(p, &e);
  lm_jv m = get(c, "messages").u.l->v[mi];
  char want_content[4096];
  expected_content(get(m, "content"), want_content, sizeof want_content);
  lm_jv wr = get(m, "reasoning");
  if (!lm_jv_truthy(wr)) wr = get(m, "reasoning_content");
  const char *r = lm_parser_reasoning(p);
  int ok = strcmp(lm_parser_content(p), want_content) == 0;
  ok &= lm_jv_truthy(wr) ? (r && strcmp(r, wr.u.s->s) == 0) : r == NULL;
  lm_jv calls = get(m, "tool_calls");
  size_t ncalls = calls.kind == LM_JV_LIST ? calls.u.l->n : 0;
  ok &= lm_parser_tool_call_count(p) == ncalls;
  for (size_t k = 0; ok && k < ncalls; k++) {
    lm_jv fn = get(calls.u.l->v[k], "function"), got;
    ok &= strcmp(lm_parser_tool_call_name(p, k), get(fn, "name").u.s->s) == 0;
    const char *args = lm_parser_tool_call_arguments(p, k);
    assert_int_equal(lm_jv_parse_json(a, args, strlen(args), &got), LM_OK);
    char *x = sorted_json(a, got), *y = sorted_json(a, get(fn, "arguments"));
    if (strcmp(x, y) != 0) print_message("arguments differ:\n  %s\n  %s\n", x, y);
    ok &= strcmp(x, y) == 0;
    free(x);
    free(y);
  }
  if (!ok)
    print_message("%s turn %zu: content [%s] want [%s], reasoning [%s]\n", get(c, "name").u.s->s,
                  mi, lm_parser_content(p), want_content, r ? r : "(null)");
  lm_parser_free(p);
  free(prompt);
  free(full);
  return ok;
}

static void t_round_trip(void **state) {
  (void)state;
  static const char *const files[] = {"chat_template.jinja", "chat_template.e2b-e4b.jinja"};
  lm_jarena *a;
  assert_int_equal(lm_jarena_create(0, &a), LM_OK);
  char *text = slurp(TD "chat_cases.json");
  assert_non_null(text);
  lm_jv cases;
  assert_int_equal(lm_jv_parse_json(a, text, strlen(text), &cases), LM_OK);
  free(text);
  size_t turns = 0, ok = 0;
  for (size_t f = 0; f < 2; f++) {
    char path[1024];
    snprintf(path, sizeof path, TD "%s", files[f]);
    char *src = slurp(path);
    lm_chat_template *t;
    assert_int_equal(lm_chat_template_from_string(src, &t), LM_OK);
    free(src);
    for (size_t i = 0; i < cases.u.l->n; i++) {
      lm_jv c = cases.u.l->v[i], msgs = get(c, "messages");
      for (size_t mi = 0; mi < msgs.u.l->n; mi++) {
        lm_jv role = get(msgs.u.l->v[mi], "role");
        if (role.kind != LM_JV_STR || strcmp(role.u.s->s, "assistant") != 0) continue;
        turns++;
        ok += (size_t)round_trip_turn(t, a, c, mi, 1000 * i + mi);
      }
    }
    lm_chat_template_free(t);
  }
  print_message("round trip: %zu/%zu assistant turns of chat_cases.json parse back\n", ok, turns);
  assert_int_equal(ok, turns);
  assert_int_equal(turns, 2 * 12);
  lm_jarena_free(a);
}

/* ---- malformed and quirky output ------------------------------------------------------------ */

typedef struct {
  const char *raw;
  const char *content, *reasoning; /* reasoning NULL: none */
  int calls;
  const char *args0; /* first call's arguments JSON, or NULL */
} quirk;

static void check_quirks(const quirk *rows, size_t n) {
  for (size_t i = 0; i < n; i++)
    for (int mode = SPLIT_WHOLE; mode <= SPLIT_RANDOM; mode++) {
      events e;
      memset(&e, 0, sizeof e);
      lm_parser *p = gemma_parser(&e, 0);
      feed_raw(p, &e, rows[i].raw, mode, 7 + i);
      assert_int_equal(lm_parser_finish(p), LM_OK);
      check_events(p, &e);
      const char *r = lm_parser_reasoning(p);
      int ok = strcmp(lm_parser_content(p), rows[i].content) == 0 &&
               (int)lm_parser_tool_call_count(p) == rows[i].calls;
      ok &= rows[i].reasoning ? (r && strcmp(r, rows[i].reasoning) == 0) : r == NULL;
      if (ok && rows[i].args0) ok = strcmp(lm_parser_tool_call_arguments(p, 0), rows[i].args0) == 0;
      if (!ok)
        print_message("row %zu mode %d: [%s] -> content [%s] reasoning [%s] calls %zu args0 %s\n",
                      i, mode, rows[i].raw, lm_parser_content(p), r ? r : "(null)",
                      lm_parser_tool_call_count(p),
                      lm_parser_tool_call_count(p) ? lm_parser_tool_call_arguments(p, 0) : "-");
      assert_true(ok);
      lm_parser_free(p);
    }
}

static void t_malformed(void **state) {
  (void)state;
  static const quirk rows[] = {
      /* a call that does not parse is returned verbatim as content */
      {"<|tool_call>call:f{a:<|\"|>x}<tool_call|>", "<|tool_call>call:f{a:<|\"|>x}<tool_call|>",
       NULL, 0, NULL},
      {"Hi <|tool_call>nonsense<tool_call|> after", "Hi <|tool_call>nonsense<tool_call|> after",
       NULL, 0, NULL},
      {"<|tool_call>call:{a:1}<tool_call|>", "<|tool_call>call:{a:1}<tool_call|>", NULL, 0, NULL},
      {"<|tool_call>call:f{a:1}junk<tool_call|>", "<|tool_call>call:f{a:1}junk<tool_call|>", NULL,
       0, NULL},
      {"<|tool_call>call:f{a:inf}<tool_call|>", "<|tool_call>call:f{a:inf}<tool_call|>", NULL, 0,
       NULL},
      {"<|tool_call>call:f{a:'single'}<tool_call|>", "<|tool_call>call:f{a:'single'}<tool_call|>",
       NULL, 0, NULL},
      {"<|tool_call>call:f{a:[1,2}<tool_call|>", "<|tool_call>call:f{a:[1,2}<tool_call|>", NULL, 0,
       NULL},
      {"<|tool_call>call:f{a 1}<tool_call|>", "<|tool_call>call:f{a 1}<tool_call|>", NULL, 0, NULL},
      {"<|tool_call>call:f{:1}<tool_call|>", "<|tool_call>call:f{:1}<tool_call|>", NULL, 0, NULL},
      {"<|tool_call>call:f{a:1,}<tool_call|>", "<|tool_call>call:f{a:1,}<tool_call|>", NULL, 0,
       NULL},
      {"<|tool_call>call:f{a:0x10}<tool_call|>", "<|tool_call>call:f{a:0x10}<tool_call|>", NULL, 0,
       NULL},
      /* end of stream inside an unfinished construct */
      {"<|tool_call>call:f{a:1", "<|tool_call>call:f{a:1", NULL, 0, NULL},
      {"<|tool_call>call:f{a:<|\"|>cut off", "<|tool_call>call:f{a:<|\"|>cut off", NULL, 0, NULL},
      {"<|tool_call>call:f{a:1}", "", NULL, 1, "{\"a\": 1}"},
      {"<|channel>thou", "", NULL, 0, NULL},
      {"<|channel>thought\nhalf a thou", "", "half a thou", 0, NULL},
      /* field quirks (gemma4-chat.md §6) */
      {"<|tool_call>call:f{a:1}<turn|>", "", NULL, 1, "{\"a\": 1}"},
      {"<|tool_call>call:f{}<tool_call|><tool_call|><|tool_response>", "", NULL, 1, "{}"},
      {"<|tool_call>call:f{}<tool_call|><eos>", "", NULL, 1, "{}"},
      {"<|channel>thought<channel|>Hi", "Hi", NULL, 0, NULL},
      {"<|channel>thought\nA<channel|>B<|channel>thought\nC<channel|>D", "BD", "AC", 0, NULL},
      {"Hello <|channel>thought\nx<channel|> world", "Hello  world", "x", 0, NULL},
      {"<channel|>stray closer", "stray closer", NULL, 0, NULL},
      {"<|channel>thought\nthinking<|tool_call>call:f{}<tool_call|>", "", "thinking", 1, "{}"},
      {"Done.<turn|>ignored after the stop<|tool_call>call:f{}<tool_call|>", "Done.", NULL, 0,
       NULL},
      /* the value syntax */
      {"<|tool_call>call:f{t:True,f:False,n:None}<tool_call|>", "", NULL, 1,
       "{\"t\": true, \"f\": false, \"n\": null}"},
      {"<|tool_call>call:f{<|\"|>quoted key<|\"|>:1}<tool_call|>", "", NULL, 1,
       "{\"quoted key\": 1}"},
      {"<|tool_call>call:f{ a : 1 , b : [ 1 , 2 ] }<tool_call|>", "", NULL, 1,
       "{\"a\": 1, \"b\": [1, 2]}"},
      {"<|tool_call>call:f{a:-1.5e3,b:007,c:+5,d:.5,e:5.,f:1_000,g:12345678901234567890,h:100.0,i:"
       "1e-07}<tool_call|>",
       "", NULL, 1,
       "{\"a\": -1500.0, \"b\": 7, \"c\": 5, \"d\": 0.5, \"e\": 5.0, \"f\": 1000, \"g\": "
       "12345678901234567890, \"h\": "
       "100.0, \"i\": 1e-07}"},
      {"<|tool_call>call:f{o:{},l:[],n:[[1],[{x:[]}]]}<tool_call|>", "", NULL, 1,
       "{\"o\": {}, \"l\": [], \"n\": [[1], [{\"x\": []}]]}"},
      {"<|tool_call>call:f{s:<|\"|>{a:1}, [b]: \"c\"\n\\d é<|\"|>}<tool_call|>", "", NULL, 1,
       "{\"s\": \"{a:1}, [b]: \\\"c\\\"\\n\\\\d é\"}"},
      {"<|tool_call>call:mcp.server:tool-x_1{}<tool_call|>", "", NULL, 1, "{}"},
      {"<|tool_call>call:f{a:1,a:2}<tool_call|>", "", NULL, 1, "{\"a\": 2}"},
  };
  check_quirks(rows, sizeof rows / sizeof *rows);
  /* nesting deeper than the parser allows is content, not a stack overflow */
  char deep[600], raw[800];
  size_t k = 0;
  for (int i = 0; i < 100; i++)
    deep[k++] = '[';
  for (int i = 0; i < 100; i++)
    deep[k++] = ']';
  deep[k] = '\0';
  snprintf(raw, sizeof raw, "<|tool_call>call:f{a:%s}<tool_call|>", deep);
  quirk row = {raw, raw, NULL, 0, NULL};
  check_quirks(&row, 1);
}

static void t_call_syntax(void **state) {
  (void)state;
  char *name, *args;
  const char *body =
      "call:book{dates:{end:<|\"|>08-04<|\"|>,start:<|\"|>08-01<|\"|>},n:3,ok:true,price:12.5,"
      "tags:[<|\"|>a, \"b\"<|\"|>,<|\"|>x\ny<|\"|>],who:null}";
  assert_int_equal(lm_parse_gemma4_call(body, strlen(body), &name, &args), LM_OK);
  assert_string_equal(name, "book");
  assert_string_equal(args, "{\"dates\": {\"end\": \"08-04\", \"start\": \"08-01\"}, \"n\": 3, "
                            "\"ok\": true, \"price\": 12.5, "
                            "\"tags\": [\"a, \\\"b\\\"\", \"x\\ny\"], \"who\": null}");
  free(name);
  free(args);
  static const char *const bad[] = {"",           "call:",      "call:f",        "call:f{",
                                    "call:f}",    "calls:f{}",  "call:f{a}",     "call:f{a:}",
                                    "call:f{}{}", "call:f g{}", "call:f{a:tru}", "call:f{a:1 2}",
                                    "call:f{a:-}"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    assert_int_equal(lm_parse_gemma4_call(bad[i], strlen(bad[i]), &name, &args), LM_ERR_INVALID);
    assert_null(name);
    assert_null(args);
    assert_non_null(strstr(lm_errmsg(), "tool call: "));
  }
  const char *jc = "{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1.0}\"}";
  assert_int_equal(lm_parse_json_call(jc, strlen(jc), &name, &args), LM_OK);
  assert_string_equal(args, "{\"a\": 1.0}");
  free(name);
  free(args);
  static const char *const bad_json[] = {"",
                                         "[]",
                                         "{\"arguments\": {}}",
                                         "{\"name\": 5}",
                                         "{\"name\": \"f\", \"arguments\": 3}",
                                         "{\"name\": \"f\", \"arguments\": \"[1]\"}",
                                         "{\"name\": \"\"}",
                                         "{\"name\": \"f\""};
  for (size_t i = 0; i < sizeof bad_json / sizeof *bad_json; i++) {
    assert_int_equal(lm_parse_json_call(bad_json[i], strlen(bad_json[i]), &name, &args),
                     LM_ERR_INVALID);
    assert_null(name);
  }
}

static void t_streaming(void **state) {
  (void)state;
  events e;
  memset(&e, 0, sizeof e);
  lm_parser *p = gemma_parser(&e, 0);
  /* leading whitespace is dropped, trailing whitespace waits for what follows */
  assert_int_equal(lm_parser_feed(p, -1, "\n Hello ", 8), LM_OK);
  assert_int_equal(e.nc, 5);
  assert_memory_equal(e.content, "Hello", 5);
  assert_int_equal(lm_parser_feed(p, -1, "wor", 3), LM_OK);
  assert_int_equal(e.nc, 9);
  /* the channel name is held until its newline, and never shows */
  assert_int_equal(lm_parser_feed(p, 1100, "<|channel>", 10), LM_OK);
  assert_int_equal(lm_parser_feed(p, -1, "thou", 4), LM_OK);
  assert_int_equal(lm_parser_feed(p, -1, "ght", 3), LM_OK);
  assert_int_equal(e.nr, 0);
  assert_int_equal(lm_parser_feed(p, -1, "\nWhy", 4), LM_OK);
  assert_int_equal(e.nr, 3);
  assert_int_equal(lm_parser_feed(p, 1101, "<channel|>", 10), LM_OK);
  /* a call is announced only when it closes */
  assert_int_equal(lm_parser_feed(p, 1048, "<|tool_call>", 12), LM_OK);
  assert_int_equal(lm_parser_feed(p, -1, "call:f{a:", 9), LM_OK);
  assert_int_equal(lm_parser_feed(p, 1052, "<|\"|>", 5), LM_OK);
  assert_int_equal(lm_parser_feed(p, -1, "x", 1), LM_OK);
  assert_int_equal(lm_parser_feed(p, 1052, "<|\"|>", 5), LM_OK);
  assert_int_equal(lm_parser_feed(p, -1, "}", 1), LM_OK);
  assert_int_equal(e.calls, 0);
  assert_int_equal(lm_parser_feed(p, 1049, "<tool_call|>", 12), LM_OK);
  assert_int_equal(e.calls, 1);
  assert_false(lm_parser_stopped(p));
  assert_int_equal(lm_parser_feed(p, 1050, "<|tool_response>", 16), LM_OK);
  assert_true(lm_parser_stopped(p));
  assert_int_equal(lm_parser_feed(p, -1, "more", 4), LM_OK); /* ignored after the stop */
  assert_int_equal(lm_parser_finish(p), LM_OK);
  assert_string_equal(lm_parser_content(p), "Hello wor");
  assert_string_equal(lm_parser_reasoning(p), "Why");
  assert_string_equal(lm_parser_tool_call_name(p, 0), "f");
  assert_string_equal(lm_parser_tool_call_arguments(p, 0), "{\"a\": \"x\"}");
  assert_null(lm_parser_tool_call_name(p, 1));
  lm_parser_free(p);
  /* a code point split across pieces is not emitted in halves */
  memset(&e, 0, sizeof e);
  p = gemma_parser(&e, 0);
  assert_int_equal(lm_parser_feed(p, -1, "a\xc3", 2), LM_OK);
  assert_int_equal(e.nc, 1);
  assert_int_equal(lm_parser_feed(p, -1, "\xa9", 1), LM_OK);
  assert_int_equal(e.nc, 3);
  /* an ideographic space split in three is whitespace once complete, so it stays trailing */
  assert_int_equal(lm_parser_feed(p, -1, "\xe3", 1), LM_OK);
  assert_int_equal(lm_parser_feed(p, -1, "\x80", 1), LM_OK);
  assert_int_equal(lm_parser_feed(p, -1, "\x80", 1), LM_OK);
  assert_int_equal(lm_parser_finish(p), LM_OK);
  assert_string_equal(lm_parser_content(p), "a\xc3\xa9");
  assert_int_equal(lm_parser_finish(p), LM_OK); /* idempotent */
  lm_parser_free(p);
  lm_parser_free(NULL);
}

static void t_tokens_and_options(void **state) {
  (void)state;
  lm_parser_tokens t;
  assert_int_equal(lm_parser_tokens_gemma4(find_token, NULL, &t), LM_OK);
  assert_int_equal(t.channel_open, 1100);
  assert_int_equal(t.tool_call_close, 1049);
  assert_int_equal(t.eos, 1001);
  lm_parser_opts o = {0};
  o.format = LM_PARSER_GEMMA4;
  o.tokens = (lm_parser_tokens){-1, -1, -1, -1, -1, -1, -1};
  lm_parser *p = NULL;
  assert_int_equal(lm_parser_create(&o, &p), LM_ERR_INVALID);
  assert_null(p);
  o.format = (lm_parser_format)7;
  assert_int_equal(lm_parser_create(&o, &p), LM_ERR_INVALID);
}

static int32_t find_nothing(const void *ctx, const char *text, size_t len) {
  (void)ctx, (void)text, (void)len;
  return -1;
}

static void t_tokens_missing(void **state) {
  (void)state;
  lm_parser_tokens t;
  assert_int_equal(lm_parser_tokens_gemma4(find_nothing, NULL, &t), LM_ERR_NOT_FOUND);
  assert_non_null(strstr(lm_errmsg(), "<|channel>"));
}

/* Through the real tokenizer: a tiny tokenizer.json whose added tokens are Gemma 4's control tokens
 * at their real ids; raw outputs are encoded, each id decoded alone (as a streaming detokenizer
 * hands them over), and fed with its id. */
static void t_via_tokenizer(void **state) {
  (void)state;
  lm_jbuf j = {0};
  assert_int_equal(lm_jbuf_puts(&j, "{\"added_tokens\": ["), LM_OK);
  static const struct {
    const char *text;
    int id;
  } ctl[] = {{"<eos>", 1},     {"<|tool_call>", 48}, {"<tool_call|>", 49}, {"<|tool_response>", 50},
             {"<|\\\"|>", 52}, {"<|channel>", 100},  {"<channel|>", 101},  {"<turn|>", 106}};
  for (size_t i = 0; i < sizeof ctl / sizeof *ctl; i++)
    assert_int_equal(lm_jbuf_printf(&j, "%s{\"id\": %d, \"content\": \"%s\", \"special\": true}",
                                    i ? ", " : "", ctl[i].id, ctl[i].text),
                     LM_OK);
  /* as in real tokenizer.json files, the added tokens are in the model vocabulary too */
  assert_int_equal(
      lm_jbuf_puts(&j,
                   "], \"model\": {\"type\": \"BPE\", \"merges\": [], \"vocab\": {\"\\n\": 200"),
      LM_OK);
  for (size_t i = 0; i < sizeof ctl / sizeof *ctl; i++)
    assert_int_equal(lm_jbuf_printf(&j, ", \"%s\": %d", ctl[i].text, ctl[i].id), LM_OK);
  for (int c = 0x20; c < 0x7f; c++) {
    char esc[8];
    if (c == '"' || c == '\\')
      snprintf(esc, sizeof esc, "\\%c", c);
    else
      snprintf(esc, sizeof esc, "%c", c);
    assert_int_equal(lm_jbuf_printf(&j, ", \"%s\": %d", esc, 200 + c), LM_OK);
  }
  assert_int_equal(lm_jbuf_puts(&j, "}}}"), LM_OK);
  lm_tokenizer *tok;
  lm_status st = lm_tokenizer_load_json(j.data, j.len, "test tokenizer.json", &tok);
  if (st != LM_OK) print_message("%s\n", lm_errmsg());
  assert_int_equal(st, LM_OK);
  lm_jbuf_free(&j);
  lm_parser_tokens ids;
  assert_int_equal(lm_parser_tokens_from_tokenizer(tok, &ids), LM_OK);
  assert_int_equal(ids.channel_open, 100);
  assert_int_equal(ids.tool_call_close, 49);
  assert_int_equal(ids.turn_close, 106);
  json_t *cases = json_load_file(TD "parse_cases.json", 0, NULL);
  assert_non_null(cases);
  size_t ok = 0;
  for (size_t i = 0; i < json_array_size(cases); i++) {
    const json_t *c = json_array_get(cases, i), *want = json_object_get(c, "expected");
    const char *raw = json_string_value(json_object_get(c, "raw"));
    int32_t *seq;
    size_t n;
    assert_int_equal(lm_tokenizer_encode(tok, raw, strlen(raw), 0, &seq, &n), LM_OK);
    lm_parser_opts o = {0};
    o.format = LM_PARSER_GEMMA4;
    o.tokens = ids;
    o.start_in_reasoning = json_is_true(json_object_get(c, "start_in_reasoning"));
    lm_parser *p;
    assert_int_equal(lm_parser_create(&o, &p), LM_OK);
    for (size_t k = 0; k < n; k++) {
      char *piece;
      size_t len;
      assert_int_equal(lm_tokenizer_decode(tok, &seq[k], 1, 0, &piece, &len), LM_OK);
      assert_int_equal(lm_parser_feed(p, seq[k], piece, len), LM_OK);
      free(piece);
    }
    assert_int_equal(lm_parser_finish(p), LM_OK);
    const json_t *wr = json_object_get(want, "reasoning");
    const char *r = lm_parser_reasoning(p);
    int good =
        strcmp(lm_parser_content(p), json_string_value(json_object_get(want, "content"))) == 0 &&
        (json_is_null(wr) ? r == NULL : r && strcmp(r, json_string_value(wr)) == 0) &&
        lm_parser_tool_call_count(p) == json_array_size(json_object_get(want, "tool_calls"));
    for (size_t k = 0; good && k < lm_parser_tool_call_count(p); k++)
      good = args_equal(
          lm_parser_tool_call_arguments(p, k),
          json_object_get(json_array_get(json_object_get(want, "tool_calls"), k), "arguments"));
    if (!good)
      print_message("via tokenizer: %s: content [%s]\n",
                    json_string_value(json_object_get(c, "name")), lm_parser_content(p));
    ok += (size_t)good;
    lm_parser_free(p);
    free(seq);
  }
  assert_int_equal(ok, json_array_size(cases));
  json_decref(cases);
  lm_tokenizer_free(tok);
}

/* ---- generic ChatML / Hermes ---------------------------------------------------------------- */

static lm_parser *generic_parser(events *e, int start_in_reasoning) {
  lm_parser_opts o = {0};
  o.format = LM_PARSER_GENERIC;
  o.tokens = (lm_parser_tokens){-1, -1, -1, -1, -1, 7, 9};
  o.start_in_reasoning = start_in_reasoning;
  o.emit = on_event;
  o.user = e;
  lm_parser *p;
  assert_int_equal(lm_parser_create(&o, &p), LM_OK);
  return p;
}

static void t_generic(void **state) {
  (void)state;
  static const struct {
    const char *raw;
    int start_in_reasoning;
    const char *content, *reasoning;
    int calls;
    const char *args0;
  } rows[] = {
      {"<think>\nR\n</think>\n\nHello<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1, "
       "\"b\": 2.0}}\n</tool_call>",
       0, "Hello", "R", 1, "{\"a\": 1, \"b\": 2.0}"},
      {"Plan</think>Answer", 1, "Answer", "Plan", 0, NULL},
      {"<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": "
       "\"g\", \"parameters\": "
       "{\"x\": [1]}}\n</tool_call>",
       0, "", NULL, 2, "{}"},
      {"<tool_call>{bad}</tool_call> tail", 0, "<tool_call>{bad}</tool_call> tail", NULL, 0, NULL},
      {"<tool_call>{\"name\": \"f\"", 0, "<tool_call>{\"name\": \"f\"", NULL, 0, NULL},
      {"<tool_call>{\"name\": \"f\"}", 0, "", NULL, 1, "{}"},
      {"a < b and <thin", 0, "a < b and <thin", NULL, 0, NULL},
      {"<think>open to the end", 0, "", "open to the end", 0, NULL},
      {"x</think>y", 0, "xy", NULL, 0, NULL},
  };
  for (size_t i = 0; i < sizeof rows / sizeof *rows; i++)
    for (int mode = SPLIT_WHOLE; mode <= SPLIT_RANDOM; mode++) {
      events e;
      memset(&e, 0, sizeof e);
      lm_parser *p = generic_parser(&e, rows[i].start_in_reasoning);
      lm_rng rng = {3 + i, 0};
      feed_text(p, rows[i].raw, strlen(rows[i].raw), mode, &rng);
      assert_int_equal(lm_parser_finish(p), LM_OK);
      check_events(p, &e);
      const char *r = lm_parser_reasoning(p);
      int ok = strcmp(lm_parser_content(p), rows[i].content) == 0 &&
               (int)lm_parser_tool_call_count(p) == rows[i].calls;
      ok &= rows[i].reasoning ? (r && strcmp(r, rows[i].reasoning) == 0) : r == NULL;
      if (ok && rows[i].args0) ok = strcmp(lm_parser_tool_call_arguments(p, 0), rows[i].args0) == 0;
      if (!ok)
        print_message("generic row %zu mode %d: content [%s] reasoning [%s] calls %zu\n", i, mode,
                      lm_parser_content(p), r ? r : "(null)", lm_parser_tool_call_count(p));
      assert_true(ok);
      lm_parser_free(p);
    }
  /* stops on the eos id */
  events e;
  memset(&e, 0, sizeof e);
  lm_parser *p = generic_parser(&e, 0);
  assert_int_equal(lm_parser_feed(p, -1, "done", 4), LM_OK);
  assert_int_equal(lm_parser_feed(p, 9, "<|im_end|>", 10), LM_OK);
  assert_true(lm_parser_stopped(p));
  assert_int_equal(lm_parser_feed(p, -1, "junk", 4), LM_OK);
  assert_string_equal(lm_parser_content(p), "done");
  lm_parser_free(p);
}

/* The built-in ChatML render of an assistant turn parses back with the generic parser. */
static void t_generic_round_trip(void **state) {
  (void)state;
  lm_chat_template *t;
  assert_int_equal(lm_chat_template_chatml(&t), LM_OK);
  json_t *msgs = json_loads(
      "[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":\"Sure.\","
      "\"reasoning_content\":\"Think.\",\"tool_calls\":[{\"type\":\"function\",\"function\":{"
      "\"name\":"
      "\"f\",\"arguments\":{\"x\":[1,2.5,\"s\\\"q\"]}}},{\"type\":\"function\",\"function\":{"
      "\"name\":"
      "\"g\",\"arguments\":{}}}]}]",
      0, NULL);
  assert_non_null(msgs);
  char *full = NULL;
  assert_int_equal(lm_chat_render(t, msgs, NULL, NULL, 0, NULL, NULL, &full), LM_OK);
  const char *start = strstr(full, "<|im_start|>assistant\n");
  assert_non_null(start);
  start += strlen("<|im_start|>assistant\n");
  const char *end = strstr(start, "<|im_end|>");
  events e;
  memset(&e, 0, sizeof e);
  lm_parser *p = generic_parser(&e, 0);
  lm_rng rng = {11, 0};
  feed_text(p, start, (size_t)(end - start), SPLIT_RANDOM, &rng);
  assert_int_equal(lm_parser_finish(p), LM_OK);
  assert_string_equal(lm_parser_content(p), "Sure.");
  assert_string_equal(lm_parser_reasoning(p), "Think.");
  assert_int_equal(lm_parser_tool_call_count(p), 2);
  assert_string_equal(lm_parser_tool_call_name(p, 0), "f");
  assert_string_equal(lm_parser_tool_call_arguments(p, 0), "{\"x\": [1, 2.5, \"s\\\"q\"]}");
  assert_string_equal(lm_parser_tool_call_arguments(p, 1), "{}");
  lm_parser_free(p);
  free(full);
  json_decref(msgs);
  lm_chat_template_free(t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(t_parse_cases),    cmocka_unit_test(t_round_trip),
      cmocka_unit_test(t_malformed),      cmocka_unit_test(t_call_syntax),
      cmocka_unit_test(t_streaming),      cmocka_unit_test(t_tokens_and_options),
      cmocka_unit_test(t_tokens_missing), cmocka_unit_test(t_via_tokenizer),
      cmocka_unit_test(t_generic),        cmocka_unit_test(t_generic_round_trip),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
