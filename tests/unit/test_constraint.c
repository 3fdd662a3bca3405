/* test_constraint.c — constrained decoding in the engine:
 *   - the per-sequence state machine (engine/constraint.h) over a small made-up vocabulary: the
 *     mask is the grammar's, the stop ids come only when the text is complete, a finished grammar
 *     ends the answer, the reasoning channel is free until it closes (and may be opened only first,
 *     only once), tool_choice none / auto / required and a call closed only once complete;
 *   - the Gemma 4 call grammar (text/call_grammar.h): what it accepts and refuses, in the call
 *     syntax's value format, and the keywords it refuses;
 *   - on the embedded model, through lumen.h: constrained and unconstrained sequences in one batch
 *     (the unconstrained one answers as it does alone), the mask applied before top-k (top_k 1
 *     still finds an allowed token), a finished grammar ending with LM_FIN_STOP and no stop id,
 *     compile errors naming the field, one compile for many requests of the same schema, and tool
 *     calls held to the offered tool (required) or kept out (none). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/api_impl.h"
#include "engine/constraint.h"
#include "engine/mask_prep.h"
#include "engine/grammar_cache.h"
#include "text/call_grammar.h"

#define TINY LM_SOURCE_DIR "/models/lumen-tiny-kjv"

/* ---- a made-up vocabulary ------------------------------------------------------------------- */

enum { T_PAD, T_EOS, T_CH_OPEN, T_CH_CLOSE, T_CALL_OPEN, T_CALL_CLOSE, T_TEXT };
static const char *const PIECES[] = {"",  "",   "",  "",  "",   "",      "a", "b", "c", "{",
                                     "}", "\"", ":", ",", "ab", "call:", "f", "g", "x", " "};
#define NV ((int32_t)(sizeof PIECES / sizeof *PIECES))
static int32_t id_of(const char *p) {
  for (int32_t i = T_TEXT; i < NV; i++)
    if (!strcmp(PIECES[i], p)) return i;
  fail_msg("no piece '%s'", p);
  return -1;
}

static const int32_t STOPS[] = {T_EOS};

typedef struct mfx {
  lm_grammar_vocab *v;
  lm_grammar_cache *gc;
} mfx;

static int msetup(void **state) {
  mfx *f = calloc(1, sizeof *f);
  size_t lens[NV];
  for (int32_t i = 0; i < NV; i++)
    lens[i] = strlen(PIECES[i]);
  if (lm_grammar_vocab_create(PIECES, lens, NV, &f->v) || lm_grammar_cache_create(8, &f->gc))
    return -1;
  *state = f;
  return 0;
}

static int mteardown(void **state) {
  mfx *f = *state;
  lm_grammar_cache_free(f->gc);
  lm_grammar_vocab_free(f->v);
  free(f);
  return 0;
}

static lm_grammar_ref *gbnf(mfx *f, const char *text) {
  lm_grammar_ref *r = NULL;
  lm_status s = lm_grammar_cache_get(f->gc, LM_GRAMMAR_GBNF, text, strlen(text), &r);
  if (s) fail_msg("%s", lm_errmsg());
  return r;
}

static lm_constraint *make(mfx *f, const char *answer, const char *calls, lm_tool_choice ch,
                           int in_reasoning, int may_reason) {
  lm_constraint_opts o = {.answer = answer ? gbnf(f, answer) : NULL,
                          .calls = calls ? gbnf(f, calls) : NULL,
                          .vocab = f->v,
                          .n_vocab = NV + 3, /* a model row may be wider than the tokenizer */
                          .choice = ch,
                          .channel_open = T_CH_OPEN,
                          .channel_close = T_CH_CLOSE,
                          .call_open = T_CALL_OPEN,
                          .call_close = T_CALL_CLOSE,
                          .stop_ids = STOPS,
                          .n_stop_ids = 1,
                          .start_in_reasoning = in_reasoning,
                          .may_reason = may_reason};
  lm_constraint *c = NULL;
  assert_int_equal(lm_constraint_create(&o, &c), LM_OK);
  return c;
}

/* The allowed ids as a string of '1' / '0' over the whole row. */
static const char *allowed(lm_constraint *c) {
  static char out[64];
  float row[NV + 3];
  for (int32_t i = 0; i < NV + 3; i++)
    row[i] = 0.5f;
  assert_int_equal(lm_constraint_apply(c, row), LM_OK);
  for (int32_t i = 0; i < NV + 3; i++)
    out[i] = row[i] == -INFINITY ? '0' : '1';
  out[NV + 3] = '\0';
  return out;
}

static int ok(lm_constraint *c, int32_t id) { return allowed(c)[id] == '1'; }

static void take(lm_constraint *c, int32_t id) {
  assert_true(ok(c, id)); /* what is accepted was allowed */
  lm_status s = lm_constraint_accept(c, id);
  if (s) fail_msg("accept %d: %s", id, lm_errmsg());
}

static void take_text(lm_constraint *c, const char *piece) { take(c, id_of(piece)); }

static void t_mask_and_stops(void **state) {
  lm_constraint *c = make(*state, "root ::= \"ab\" \"c\"?", NULL, LM_TOOLS_AUTO, 0, 0);
  const char *a = allowed(c);
  for (int32_t i = 0; i < NV + 3; i++) /* only "a" and "ab" start the text; no stop yet */
    assert_int_equal(a[i] == '1', i == id_of("a") || i == id_of("ab"));
  take_text(c, "a");
  assert_false(ok(c, T_EOS));
  assert_false(lm_constraint_finished(c));
  take_text(c, "b");
  assert_true(ok(c, T_EOS)); /* complete: the stop may come, or "c" */
  assert_true(ok(c, id_of("c")));
  assert_false(ok(c, id_of("a")));
  assert_false(ok(c, T_CALL_OPEN)); /* no call grammar: no call */
  assert_false(lm_constraint_finished(c));
  take_text(c, "c");
  assert_true(lm_constraint_finished(c)); /* nothing may follow: the engine ends it */
  lm_constraint_free(c);

  c = make(*state, "root ::= \"ab\"", NULL, LM_TOOLS_AUTO, 0, 0);
  assert_int_equal(lm_constraint_accept(c, id_of("b")), LM_ERR_INVALID);
  assert_int_equal(lm_constraint_accept(c, T_EOS), LM_ERR_INVALID); /* not complete */
  take_text(c, "ab");
  assert_true(lm_constraint_finished(c));
  lm_constraint_free(c);
}

/* Masks filled ahead by the mask helper (as a GPU step does while its forward runs) are the
 * masks the sampling loop would have made itself, state after state. */
static void t_prepared_ahead(void **state) {
  const char *g = "root ::= \"ab\" (\"c\" | \"a\")* \"b\"";
  lm_constraint *ahead[2] = {make(*state, g, NULL, LM_TOOLS_AUTO, 0, 0),
                             make(*state, g, NULL, LM_TOOLS_AUTO, 1, 1)};
  lm_constraint *here[2] = {make(*state, g, NULL, LM_TOOLS_AUTO, 0, 0),
                            make(*state, g, NULL, LM_TOOLS_AUTO, 1, 1)};
  lm_mask_prep *p = NULL;
  assert_int_equal(lm_mask_prep_create(2, &p), LM_OK);
  const int32_t walk[2][6] = {{id_of("ab"), id_of("c"), id_of("a"), id_of("c"), id_of("b"), -1},
                              {T_CH_CLOSE, id_of("a"), id_of("b"), id_of("b"), -1, -1}};
  for (int k = 0; k < 6; k++) {
    double host_s = -1;
    lm_mask_prep_start(p, ahead, 2);
    lm_mask_prep_wait(p, &host_s);
    assert_true(host_s >= 0);
    for (int i = 0; i < 2; i++) {
      if (walk[i][k] < 0) continue;
      char want[64];
      snprintf(want, sizeof want, "%s", allowed(here[i]));
      assert_string_equal(allowed(ahead[i]), want);
      assert_int_equal(lm_constraint_prepare(ahead[i]), LM_OK); /* idempotent until accept */
      assert_string_equal(allowed(ahead[i]), want);
      take(ahead[i], walk[i][k]);
      take(here[i], walk[i][k]);
    }
  }
  double unused;
  lm_mask_prep_wait(p, &unused); /* nothing handed over: returns */
  lm_mask_prep_free(p);
  for (int i = 0; i < 2; i++) {
    lm_constraint_free(ahead[i]);
    lm_constraint_free(here[i]);
  }
}

static void t_reasoning_first(void **state) {
  /* the prompt opened the channel: anything but the stop until it closes */
  lm_constraint *c = make(*state, "root ::= \"{\" \"}\"", NULL, LM_TOOLS_AUTO, 1, 0);
  assert_true(ok(c, id_of("x")));
  assert_true(ok(c, id_of("a")));
  assert_false(ok(c, T_EOS)); /* an answer is still owed */
  take_text(c, "x");
  take_text(c, "ab");
  take(c, T_CH_CLOSE);
  assert_false(ok(c, id_of("x"))); /* now the grammar */
  assert_true(ok(c, id_of("{")));
  assert_false(ok(c, T_CH_OPEN)); /* not a second time */
  take_text(c, "{");
  take_text(c, "}");
  assert_true(lm_constraint_finished(c));
  lm_constraint_free(c);

  /* thinking on: the model may open the channel, first and once */
  c = make(*state, "root ::= \"{\" \"}\"", NULL, LM_TOOLS_AUTO, 0, 1);
  assert_true(ok(c, T_CH_OPEN));
  assert_true(ok(c, id_of("{")));
  assert_false(ok(c, id_of("x")));
  take(c, T_CH_OPEN);
  take_text(c, "x");
  take(c, T_CH_CLOSE);
  assert_false(ok(c, T_CH_OPEN));
  assert_false(ok(c, id_of("x")));
  take_text(c, "{");
  assert_false(ok(c, T_CH_OPEN));
  lm_constraint_free(c);

  /* without thinking the channel token is not part of the answer's grammar */
  c = make(*state, "root ::= \"{\" \"}\"", NULL, LM_TOOLS_AUTO, 0, 0);
  assert_false(ok(c, T_CH_OPEN));
  lm_constraint_free(c);
}

#define CALLS "root ::= \"call:\" (\"f\" \"{\" \"}\" | \"g\" \"{\" \"a\"+ \"}\")"

static void t_tool_choice(void **state) {
  /* required: the answer opens with a call (or the reasoning channel, when thinking is on) */
  lm_constraint *c = make(*state, NULL, CALLS, LM_TOOLS_REQUIRED, 0, 1);
  const char *a = allowed(c);
  for (int32_t i = 0; i < NV + 3; i++)
    assert_int_equal(a[i] == '1', i == T_CALL_OPEN || i == T_CH_OPEN);
  take(c, T_CALL_OPEN);
  assert_false(ok(c, T_CALL_CLOSE));
  assert_false(ok(c, T_EOS));
  take_text(c, "call:");
  assert_true(ok(c, id_of("f")) && ok(c, id_of("g")) && !ok(c, id_of("x")));
  take_text(c, "g");
  take_text(c, "{");
  take_text(c, "a");
  assert_false(ok(c, T_CALL_CLOSE)); /* incomplete */
  take_text(c, "a");
  take_text(c, "}");
  a = allowed(c); /* finished: only the closer */
  for (int32_t i = 0; i < NV + 3; i++)
    assert_int_equal(a[i] == '1', i == T_CALL_CLOSE);
  take(c, T_CALL_CLOSE);
  a = allowed(c); /* after a call: another one, or the end */
  for (int32_t i = 0; i < NV + 3; i++)
    assert_int_equal(a[i] == '1', i == T_CALL_OPEN || i == T_EOS);
  take(c, T_CALL_OPEN);
  take_text(c, "call:");
  take_text(c, "f");
  take_text(c, "{");
  take_text(c, "}");
  take(c, T_CALL_CLOSE);
  take(c, T_EOS);
  lm_constraint_free(c);

  /* none: free text without the call token */
  c = make(*state, NULL, NULL, LM_TOOLS_NONE, 0, 0);
  assert_false(ok(c, T_CALL_OPEN));
  assert_true(ok(c, id_of("x")) && ok(c, T_EOS));
  take_text(c, "x");
  assert_false(ok(c, T_CALL_OPEN));
  lm_constraint_free(c);

  /* auto with an answer grammar: the answer's text, or a call instead */
  c = make(*state, "root ::= \"{\" \"}\"", CALLS, LM_TOOLS_AUTO, 0, 0);
  assert_true(ok(c, T_CALL_OPEN) && ok(c, id_of("{")) && !ok(c, id_of("x")));
  take_text(c, "{");
  assert_false(ok(c, T_CALL_OPEN)); /* the answer has begun */
  lm_constraint_free(c);

  /* auto with free text: a call may start anywhere, and is then constrained */
  c = make(*state, NULL, CALLS, LM_TOOLS_AUTO, 0, 0);
  take_text(c, "x");
  take(c, T_CALL_OPEN);
  assert_false(ok(c, id_of("x")));
  lm_constraint_free(c);
}

/* ---- the Gemma 4 call grammar --------------------------------------------------------------- */

/* A vocabulary of single bytes (and the <|"|> quote as one token), for matching whole texts. */
static lm_grammar_vocab *byte_vocab(void) {
  static char bytes[256][2];
  const char *pieces[257];
  size_t lens[257];
  for (int i = 0; i < 256; i++) {
    bytes[i][0] = (char)i;
    pieces[i] = bytes[i];
    lens[i] = 1;
  }
  pieces[256] = "<|\"|>";
  lens[256] = 5;
  lm_grammar_vocab *v = NULL;
  assert_int_equal(lm_grammar_vocab_create(pieces, lens, 257, &v), LM_OK);
  return v;
}

/* 1 when text is a complete sentence of the grammar. */
static int matches(const lm_grammar *g, const lm_grammar_vocab *v, const char *text) {
  lm_matcher *m = NULL;
  assert_int_equal(lm_matcher_create(g, v, &m), LM_OK);
  int r = lm_matcher_accept_bytes(m, text, strlen(text)) == LM_OK && lm_matcher_complete(m);
  lm_matcher_free(m);
  return r;
}

static lm_grammar *call_grammar(const char *tools, const char *only) {
  char *text = NULL;
  lm_status s = lm_call_grammar_gemma4(tools, only, &text);
  if (s) fail_msg("%s", lm_errmsg());
  lm_grammar *g = NULL;
  s = lm_grammar_from_gbnf(text, strlen(text), &g);
  if (s) fail_msg("%s\n%s", lm_errmsg(), text);
  free(text);
  return g;
}

#define Q "<|\"|>"
static const char *TOOLS =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_verse\",\"parameters\":{\"type\":"
    "\"object\",\"properties\":{\"book\":{\"type\":\"string\",\"maxLength\":8},\"chapter\":{"
    "\"type\":\"integer\",\"minimum\":1,\"maximum\":150},\"tags\":{\"type\":\"array\","
    "\"items\":{\"enum\":[\"a\",\"b\"]},\"maxItems\":2},\"opt\":{\"type\":[\"boolean\","
    "\"null\"]}},\"required\":[\"book\",\"chapter\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"noop\"}},"
    "{\"name\":\"tree\",\"parameters\":{\"$ref\":\"#/$defs/node\",\"$defs\":{\"node\":{"
    "\"type\":\"object\",\"properties\":{\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":"
    "\"#/$defs/node\"}},\"v\":{\"type\":\"number\"}},\"required\":[\"v\"]}}}}]";

static void t_call_grammar(void **state) {
  (void)state;
  lm_grammar_vocab *v = byte_vocab();
  lm_grammar *g = call_grammar(TOOLS, NULL);
  static const char *const good[] = {
      "call:get_verse{book:" Q "Romans" Q ",chapter:8}",
      "call:get_verse{book:" Q Q ",chapter:150,tags:[" Q "a" Q "," Q "b" Q "]}",
      "call:get_verse{book:" Q "John" Q ",chapter:3,opt:null,tags:[]}",
      "call:get_verse{book:" Q "John" Q ",chapter:3,opt:true}",
      "call:noop{}",
      "call:tree{v:1.5}",
      "call:tree{kids:[{v:-2},{kids:[],v:3e2}],v:0}",
  };
  for (size_t i = 0; i < sizeof good / sizeof *good; i++)
    if (!matches(g, v, good[i])) fail_msg("refused: %s", good[i]);
  static const char *const bad[] = {
      "call:lookup_verse{book:" Q "Romans" Q ",chapter:8}",            /* not offered */
      "call:get_verse{chapter:8}",                                     /* book is required */
      "call:get_verse{book:" Q "Romans" Q ",chapter:151}",             /* maximum */
      "call:get_verse{book:" Q "Romans" Q ",chapter:0}",               /* minimum */
      "call:get_verse{book:" Q "Revelation" Q ",chapter:1}",           /* maxLength 8 */
      "call:get_verse{chapter:8,book:" Q "Romans" Q "}",               /* the sorted order */
      "call:get_verse{book:" Q "R" Q ",chapter:1,tags:[" Q "c" Q "]}", /* enum */
      "call:get_verse{book:" Q "R" Q ",chapter:1,tags:[" Q "a" Q "," Q "a" Q "," Q "a" Q "]}",
      "call:get_verse{book:Romans,chapter:8}",       /* a string is quoted */
      "call:get_verse{book:" Q "R" Q ", chapter:8}", /* no whitespace */
      "call:noop{x:1}",
      "call:tree{kids:[{}],v:1}",
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
    if (matches(g, v, bad[i])) fail_msg("accepted: %s", bad[i]);
  lm_grammar_free(g);

  g = call_grammar(TOOLS, "noop"); /* a named tool: only it */
  assert_true(matches(g, v, "call:noop{}"));
  assert_false(matches(g, v, "call:get_verse{book:" Q "R" Q ",chapter:1}"));
  lm_grammar_free(g);

  /* strings: anything but the call syntax's control text */
  g = call_grammar("[{\"name\":\"s\",\"parameters\":{\"type\":\"object\",\"properties\":{\"t\":{"
                   "\"type\":\"string\"}},\"required\":[\"t\"]}}]",
                   NULL);
  assert_true(matches(g, v, "call:s{t:" Q "a < b, {x: [1]}\n\"quoted\"" Q "}"));
  assert_false(matches(g, v, "call:s{t:" Q "a<|tool_call>b" Q "}"));
  lm_grammar_free(g);
  lm_grammar_vocab_free(v);

  char *text = NULL;
  assert_int_equal(lm_call_grammar_gemma4("[{\"name\":\"p\",\"parameters\":{\"type\":\"object\","
                                          "\"properties\":{\"a\":{\"type\":\"string\","
                                          "\"pattern\":\"^x$\"}}}}]",
                                          NULL, &text),
                   LM_ERR_UNSUPPORTED);
  assert_non_null(strstr(lm_errmsg(), "'pattern'"));
  assert_non_null(strstr(lm_errmsg(), "/properties/a"));
  assert_non_null(strstr(lm_errmsg(), "tools[0] (p)"));
  assert_int_equal(lm_call_grammar_gemma4(TOOLS, "nope", &text), LM_ERR_INVALID);
  assert_int_equal(lm_call_grammar_gemma4("{}", NULL, &text), LM_ERR_INVALID);
}

/* ---- on the embedded model ------------------------------------------------------------------ */

typedef struct efx {
  lm_checkpoint *ck;
  lm_engine *e;
} efx;

static int esetup(void **state) {
  efx *f = calloc(1, sizeof *f);
  lm_engine_options o;
  lm_engine_options_init(&o);
  o.backend = "cpu";
  o.precision = "f32";
  o.parallel = 4;
  o.kv_budget = 64 << 20;
  if (lm_checkpoint_open(TINY, &f->ck) || lm_engine_create(f->ck, &o, &f->e)) {
    fprintf(stderr, "%s\n", lm_errmsg());
    return -1;
  }
  *state = f;
  return 0;
}

static int eteardown(void **state) {
  efx *f = *state;
  lm_engine_free(f->e);
  lm_checkpoint_free(f->ck);
  free(f);
  return 0;
}

typedef struct answer {
  char text[4096];
  size_t len;
  int n_calls;
  char call_name[128], call_args[1024];
  lm_event done;
} answer;

static void opts(lm_request_options *o, const char *prompt, float temp, uint64_t seed) {
  lm_request_options_init(o);
  o->prompt = prompt;
  o->sampling.temperature = temp;
  o->sampling.seed = seed;
  o->has_seed = 1;
  o->max_tokens = 120;
}

static void collect(lm_request *r, answer *a) {
  memset(a, 0, sizeof *a);
  lm_event ev;
  while (lm_request_next(r, -1, &ev) == LM_OK && ev.kind != LM_EVENT_DONE) {
    if (ev.kind == LM_EVENT_CONTENT && a->len + ev.len < sizeof a->text) {
      memcpy(a->text + a->len, ev.text, ev.len);
      a->len += ev.len;
    }
    if (ev.kind == LM_EVENT_TOOL_CALL && !a->n_calls++) {
      snprintf(a->call_name, sizeof a->call_name, "%s", ev.tool_name);
      snprintf(a->call_args, sizeof a->call_args, "%s", ev.tool_arguments);
    }
  }
  a->done = ev;
}

static void run1(efx *f, const lm_request_options *o, answer *a) {
  lm_request *r = NULL;
  lm_status s = lm_request_submit(f->e, o, &r);
  if (s) fail_msg("%s", lm_errmsg());
  collect(r, a);
  lm_request_free(r);
}

static const char *SCHEMA =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":10},"
    "\"n\":{\"type\":\"integer\"},\"ok\":{\"type\":\"boolean\"}},\"required\":[\"name\",\"n\","
    "\"ok\"],\"additionalProperties\":false}";

static void check_schema_answer(const answer *a) {
  json_error_t je;
  json_t *j = json_loadb(a->text, a->len, 0, &je);
  if (!j) fail_msg("not JSON (%s): %.*s", je.text, (int)a->len, a->text);
  assert_true(json_is_object(j));
  assert_true(json_is_string(json_object_get(j, "name")));
  assert_true(json_string_length(json_object_get(j, "name")) <= 10);
  assert_true(json_is_integer(json_object_get(j, "n")));
  assert_true(json_is_boolean(json_object_get(j, "ok")));
  assert_int_equal(json_object_size(j), 3);
  json_decref(j);
}

static void t_batch_mixed(void **state) {
  efx *f = *state;
  lm_request_options plain, con;
  opts(&plain, "In the beginning", 0, 1);
  answer alone, mixed_plain, mixed_con[3];
  run1(f, &plain, &alone);
  /* the same request with three constrained ones in the same batch */
  lm_request *r[4];
  opts(&con, "In the beginning", 1.0f, 7);
  con.json_schema = SCHEMA;
  con.max_tokens = 300;
  for (int i = 0; i < 3; i++) {
    con.sampling.seed = 7 + (uint64_t)i;
    assert_int_equal(lm_request_submit(f->e, &con, &r[i]), LM_OK);
  }
  assert_int_equal(lm_request_submit(f->e, &plain, &r[3]), LM_OK);
  for (int i = 0; i < 3; i++)
    collect(r[i], &mixed_con[i]);
  collect(r[3], &mixed_plain);
  for (int i = 0; i < 4; i++)
    lm_request_free(r[i]);
  assert_int_equal(mixed_plain.len, alone.len);
  assert_memory_equal(mixed_plain.text, alone.text, alone.len);
  for (int i = 0; i < 3; i++) {
    if (mixed_con[i].done.finish != LM_FIN_STOP) continue; /* a length cut is allowed */
    assert_int_equal(mixed_con[i].done.stop_id, -1);       /* the grammar ended it */
    check_schema_answer(&mixed_con[i]);
  }
  lm_engine_stats st;
  lm_engine_get_stats(f->e, &st);
  assert_true(st.constrained_tokens > 0);
  assert_true(st.constraint_s > 0 && st.constraint_s < st.busy_s);
}

static void t_mask_before_topk(void **state) {
  efx *f = *state;
  lm_request_options o;
  opts(&o, "In the beginning", 1.0f, 3);
  o.sampling.top_k = 1; /* were the mask applied after top-k, no allowed token would be left */
  o.grammar = "root ::= \" zebra\" | \" quartz\"";
  answer a;
  run1(f, &o, &a);
  assert_int_equal(a.done.finish, LM_FIN_STOP);
  assert_int_equal(a.done.stop_id, -1);
  assert_true((a.len == 6 && !memcmp(a.text, " zebra", 6)) ||
              (a.len == 7 && !memcmp(a.text, " quartz", 7)));

  /* a greedy request with a constraint goes through the logits too */
  opts(&o, "In the beginning", 0, 3);
  o.grammar = "root ::= [0-9]{1,5} \".\"";
  run1(f, &o, &a);
  assert_true(a.len >= 2 && a.text[a.len - 1] == '.');
  for (size_t i = 0; i + 1 < a.len; i++)
    assert_true(a.text[i] >= '0' && a.text[i] <= '9');
}

static void t_errors_and_cache(void **state) {
  efx *f = *state;
  lm_request_options o;
  lm_request *r = NULL;
  opts(&o, "x", 1, 1);
  o.grammar = "root ::= undefined-rule";
  assert_int_not_equal(lm_request_create(f->e, &o, &r), LM_OK);
  assert_null(r);
  assert_memory_equal(lm_errmsg(), "grammar: ", 9);
  opts(&o, "x", 1, 1);
  o.json_schema = "{\"type\":\"object\",\"patternProperties\":{\"^a\":{}}}";
  assert_int_equal(lm_request_create(f->e, &o, &r), LM_ERR_UNSUPPORTED);
  assert_memory_equal(lm_errmsg(), "json_schema: ", 13);
  assert_non_null(strstr(lm_errmsg(), "patternProperties"));
  opts(&o, "x", 1, 1);
  o.json_schema = SCHEMA;
  o.grammar = "root ::= \"a\"";
  assert_int_equal(lm_request_create(f->e, &o, &r), LM_ERR_INVALID);

  /* one compile for many requests of the same schema */
  const char *schema = "{\"type\":\"object\",\"properties\":{\"z\":{\"type\":\"integer\"}},"
                       "\"required\":[\"z\"]}";
  lm_grammar_cache_stats before, after;
  lm_grammar_cache_get_stats(f->e->grammars, &before);
  lm_request *rs[16];
  opts(&o, "x", 1, 1);
  o.json_schema = schema;
  for (int i = 0; i < 16; i++)
    assert_int_equal(lm_request_create(f->e, &o, &rs[i]), LM_OK);
  for (int i = 0; i < 16; i++)
    lm_request_free(rs[i]); /* never started: freed with their grammar references */
  lm_grammar_cache_get_stats(f->e->grammars, &after);
  assert_int_equal(after.compiles - before.compiles, 1);
  assert_int_equal(after.hits - before.hits, 15);
}

static const char *VERSE_TOOLS =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_verse\",\"description\":\"Look up a "
    "verse.\",\"parameters\":{\"type\":\"object\",\"properties\":{\"book\":{\"type\":\"string\","
    "\"maxLength\":16},\"chapter\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":150},"
    "\"verse\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":176}},\"required\":[\"book\","
    "\"chapter\",\"verse\"]}}}]";

static void t_tool_calls(void **state) {
  efx *f = *state;
  lm_request_options o;
  answer a;
  for (int k = 0; k < 3; k++) {
    lm_request_options_init(&o);
    o.messages_json = "[{\"role\":\"user\",\"content\":\"Look up Romans 8:28.\"}]";
    o.tools_json = VERSE_TOOLS;
    o.tool_choice = LM_TOOLS_REQUIRED;
    o.constrain_tools = 1;
    o.sampling.temperature = 1;
    o.sampling.seed = 11 + (uint64_t)k;
    o.has_seed = 1;
    o.max_tokens = 200;
    run1(f, &o, &a);
    if (a.done.finish == LM_FIN_LENGTH) continue;
    assert_true(a.n_calls >= 1);
    assert_string_equal(a.call_name, "get_verse"); /* the model's own habit is lookup_verse */
    json_t *j = json_loads(a.call_args, 0, NULL);
    assert_non_null(j);
    json_int_t ch = json_integer_value(json_object_get(j, "chapter")),
               vs = json_integer_value(json_object_get(j, "verse"));
    assert_true(json_string_length(json_object_get(j, "book")) <= 16);
    assert_true(ch >= 1 && ch <= 150 && vs >= 1 && vs <= 176);
    json_decref(j);
  }
  /* none: no call, even where the model would make one */
  lm_request_options_init(&o);
  o.messages_json = "[{\"role\":\"user\",\"content\":\"Look up Romans 8:28.\"}]";
  o.tool_choice = LM_TOOLS_NONE;
  o.constrain_tools = 1;
  o.sampling.temperature = 0;
  o.max_tokens = 60;
  run1(f, &o, &a);
  assert_int_equal(a.n_calls, 0);
  assert_null(memmem(a.text, a.len, "call:", 5));
  /* required without tools is refused */
  o.tool_choice = LM_TOOLS_REQUIRED;
  lm_request *r = NULL;
  assert_int_equal(lm_request_create(f->e, &o, &r), LM_ERR_INVALID);
}

int main(void) {
  const struct CMUnitTest machine[] = {
      cmocka_unit_test(t_mask_and_stops),
      cmocka_unit_test(t_prepared_ahead),
      cmocka_unit_test(t_reasoning_first),
      cmocka_unit_test(t_tool_choice),
  };
  const struct CMUnitTest grammar[] = {cmocka_unit_test(t_call_grammar)};
  const struct CMUnitTest engine[] = {
      cmocka_unit_test(t_batch_mixed),
      cmocka_unit_test(t_mask_before_topk),
      cmocka_unit_test(t_errors_and_cache),
      cmocka_unit_test(t_tool_calls),
  };
  int r = cmocka_run_group_tests_name("constraint", machine, msetup, mteardown);
  r += cmocka_run_group_tests_name("call_grammar", grammar, NULL, NULL);
  r += cmocka_run_group_tests_name("engine", engine, esetup, eteardown);
  return r;
}
