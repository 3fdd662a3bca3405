/* test_generate.c — generation through the public API (lumen.h) on a tiny random model (vocab 64)
 * paired with a 64-token tokenizer written here (single characters, a few merges, Gemma-style
 * control tokens), on the cpu backend in f32:
 *   - stop ids (the stop id's event is marked and its text not streamed), max_tokens, usage,
 *     cancellation;
 *   - stop strings split across tokens with hold-back, a false alarm, a stop string that is the
 *     first token's text;
 *   - prefix reuse: a request extending a finished one's context reuses its caches (cached_tokens)
 *     and its log-probabilities equal teacher-forced logits from scratch (lm_engine_logits); a
 *     context diverging after the sliding rings wrapped reuses nothing, a short one rolls back;
 *   - state files: saved by one engine, loaded by another, continued exactly;
 *   - seeded sampling, a sampler failure reported with its own message from parallel rows,
 *     requests created and started in two calls, and bad input.
 *
 * `test_generate --write-model DIR [--vocab N] [--window N]` writes the same checkpoint
 * (config.json, model.safetensors, tokenizer.json, tokenizer_config.json, generation_config.json,
 * chat_template.jinja) for the CLI script tests; with --vocab N (> 64) the model has N ids and no
 * tokenizer is written (pair it with another tokenizer.json); --window N sets the sliding window.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/status.h" /* LM_ERRF for the checkpoint writer's messages */
#include "lumen.h"
#include "util/tiny_model.h"

#define TMP LM_BUILD_DIR "/tmp/test_generate"

/* ---- the test checkpoint --------------------------------------------------------------------- */

static const char *const specials[] = {"<pad>",
                                       "<eos>",
                                       "<bos>",
                                       "<unk>",
                                       "<|turn>",
                                       "<turn|>",
                                       "<|think|>",
                                       "<|channel>",
                                       "<channel|>",
                                       "<|tool_call>",
                                       "<tool_call|>",
                                       "<|tool_response>",
                                       "<tool_response|>",
                                       "<|\"|>"};
enum { N_SPECIALS = 14 };
static const char *const plain[] = {"\n", "\xE2\x96\x81",
                                    "a",  "b",
                                    "c",  "d",
                                    "e",  "f",
                                    "g",  "h",
                                    "i",  "j",
                                    "k",  "l",
                                    "m",  "n",
                                    "o",  "p",
                                    "q",  "r",
                                    "s",  "t",
                                    "u",  "v",
                                    "w",  "x",
                                    "y",  "z",
                                    ".",  ",",
                                    "!",  "?",
                                    ":",  "{",
                                    "}",  "0",
                                    "1",  "2",
                                    "3",  "'",
                                    "-",  "th",
                                    "he", "ll",
                                    "in", "\xE2\x96\x81t",
                                    "er", "an",
                                    "on", "\xC3\xA9"};
static const char *const merges[][2] = {
    {"t", "h"}, {"h", "e"}, {"l", "l"}, {"i", "n"}, {"\xE2\x96\x81", "t"},
    {"e", "r"}, {"a", "n"}, {"o", "n"}};

static json_t *added_token(int id, const char *content) {
  return json_pack("{s:i,s:s,s:b,s:b,s:b,s:b,s:b}", "id", id, "content", content, "single_word", 0,
                   "lstrip", 0, "rstrip", 0, "normalized", 0, "special", 1);
}

static json_t *tokenizer_json(void) {
  json_t *added = json_array(), *vocab = json_object(), *mg = json_array();
  for (int i = 0; i < N_SPECIALS; i++) {
    json_array_append_new(added, added_token(i, specials[i]));
    json_object_set_new(vocab, specials[i], json_integer(i));
  }
  for (int i = 0; i < (int)(sizeof plain / sizeof *plain); i++)
    json_object_set_new(vocab, plain[i], json_integer(N_SPECIALS + i));
  for (int i = 0; i < (int)(sizeof merges / sizeof *merges); i++)
    json_array_append_new(mg, json_pack("[s,s]", merges[i][0], merges[i][1]));
  json_t *bos = json_pack("{s:{s:s,s:i}}", "SpecialToken", "id", "<bos>", "type_id", 0);
  json_t *seq = json_pack("{s:{s:s,s:i}}", "Sequence", "id", "A", "type_id", 0);
  return json_pack("{s:s,s:n,s:n,s:o,s:{s:s,s:{s:s},s:s},s:n,"
                   "s:{s:s,s:[o,o],s:{s:{s:s,s:[i],s:[s]}}},"
                   "s:{s:s,s:[{s:s,s:{s:s},s:s},{s:s},{s:s}]},"
                   "s:{s:s,s:n,s:s,s:n,s:n,s:b,s:b,s:b,s:o,s:o}}",
                   "version", "1.0", "truncation", "padding", "added_tokens", added, "normalizer",
                   "type", "Replace", "pattern", "String", " ", "content", "\xE2\x96\x81",
                   "pre_tokenizer", "post_processor", "type", "TemplateProcessing", "single", bos,
                   seq, "special_tokens", "<bos>", "id", "<bos>", "ids", 2, "tokens", "<bos>",
                   "decoder", "type", "Sequence", "decoders", "type", "Replace", "pattern",
                   "String", "\xE2\x96\x81", "content", " ", "type", "ByteFallback", "type", "Fuse",
                   "model", "type", "BPE", "dropout", "unk_token", "<unk>",
                   "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk", 1,
                   "byte_fallback", 0, "ignore_merges", 0, "vocab", vocab, "merges", mg);
}

/* A small template in the Gemma 4 turn format; enable_thinking=false pre-closes an empty channel.
 */
static const char *chat_template =
    "{{- bos_token -}}\n"
    "{%- for m in messages -%}\n"
    "{%- set role = 'model' if m['role'] == 'assistant' else m['role'] -%}\n"
    "{{- '<|turn>' ~ role ~ '\\n' ~ (m['content'] | trim) ~ '<turn|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "{{- '<|turn>model\\n' -}}\n"
    "{%- if enable_thinking is defined and not enable_thinking -%}{{- "
    "'<|channel>thought\\n<channel|>' -}}{%- endif -%}\n"
    "{%- endif -%}\n";

static int write_text(const char *dir, const char *name, const char *text) {
  char p[1024];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  FILE *f = fopen(p, "wb");
  if (!f) return -1;
  fputs(text, f);
  return fclose(f);
}

/* lm_test_tiny_config with vocab_size and vocab_size_per_layer_input set to `vocab` and
 * sliding_window to `window`. */
static char *tiny_config(int64_t vocab, int64_t window) {
  const char *c = lm_test_tiny_config;
  const char *keys[] = {"\"vocab_size\":64,", "\"sliding_window\":4,",
                        "\"vocab_size_per_layer_input\":64,"};
  const int64_t vals[] = {vocab, window, vocab};
  char *out = malloc(strlen(c) + 96), *w = out;
  const char *p = c;
  for (int i = 0; i < 3; i++) {
    const char *k = strstr(p, keys[i]);
    if (!k) { /* the preset changed shape: keep it as it is */
      free(out);
      return strdup(c);
    }
    size_t kl = strchr(keys[i], ':') - keys[i] + 1;
    w += sprintf(w, "%.*s%lld,", (int)(k - p + (ptrdiff_t)kl), p, (long long)vals[i]);
    p = k + strlen(keys[i]);
  }
  sprintf(w, "%s", p);
  return out;
}

static lm_status write_checkpoint(const char *dir, int64_t vocab, int64_t window) {
  char *cfg = tiny_config(vocab, window);
  lm_status s = lm_test_write_tiny(cfg, dir);
  free(cfg);
  if (s) return s;
  char p[1024];
  if (vocab == 64) {
    json_t *t = tokenizer_json();
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    int rc = json_dump_file(t, p, JSON_INDENT(1));
    json_decref(t);
    if (rc) return LM_ERRF(LM_ERR_IO, "%s: cannot write", p);
    if (write_text(dir, "tokenizer_config.json",
                   "{\"bos_token\":\"<bos>\",\"eos_token\":\"<eos>\"}\n") ||
        write_text(dir, "chat_template.jinja", chat_template))
      return LM_ERRF(LM_ERR_IO, "%s: cannot write", dir);
  }
  if (vocab == 64 &&
      write_text(dir, "generation_config.json", "{\"do_sample\":false,\"eos_token_id\":[1,5]}\n"))
    return LM_ERRF(LM_ERR_IO, "%s: cannot write", dir);
  return LM_OK;
}

/* ---- fixtures -------------------------------------------------------------------------------- */

enum { V = 64, MAXT = 128, MAXC = 1024 };

typedef struct fx {
  lm_checkpoint *ck;
  lm_engine *live[4]; /* the running test's engines: a failed test's are freed by its teardown */
} fx;

static int setup(void **st) {
  static fx f;
  if (write_checkpoint(TMP "/model", 64, 4) || lm_checkpoint_open(TMP "/model", &f.ck))
    return fprintf(stderr, "%s\n", lm_errmsg()), -1;
  *st = &f;
  return 0;
}

static int teardown(void **st) {
  fx *f = *st;
  lm_checkpoint_free(f->ck);
  return 0;
}

static void drop(fx *f, lm_engine *e) {
  for (int i = 0; i < 4; i++)
    if (f->live[i] == e) f->live[i] = NULL;
  lm_engine_free(e);
}

static int test_teardown(void **st) {
  fx *f = *st;
  for (int i = 0; i < 4; i++)
    drop(f, f->live[i]);
  return 0;
}

/* cpu, f32, caches that grow as needed. */
static lm_engine_options engine_opts(void) {
  lm_engine_options o;
  lm_engine_options_init(&o);
  o.backend = "cpu";
  o.precision = "f32";
  o.kv_budget = -1;
  return o;
}

static lm_engine *engine(fx *f, lm_checkpoint *ck, const lm_engine_options *o) {
  lm_engine *e = NULL;
  lm_status s = lm_engine_create(ck, o, &e);
  if (s) fprintf(stderr, "%s\n", lm_errmsg());
  assert_int_equal(s, LM_OK);
  int i = 0;
  while (i < 4 && f->live[i])
    i++;
  assert_true(i < 4);
  f->live[i] = e;
  return e;
}

static lm_engine *default_engine(fx *f) {
  lm_engine_options o = engine_opts();
  return engine(f, f->ck, &o);
}

/* A greedy request on ids[0..n) for max_tokens, the checkpoint's stop ids ignored. */
static lm_request_options ids_opts(const int32_t *ids, int64_t n, int64_t max_tokens) {
  lm_request_options o;
  lm_request_options_init(&o);
  o.ids = ids;
  o.n_ids = n;
  o.max_tokens = max_tokens;
  o.sampling.temperature = 0;
  o.ignore_eos = 1;
  return o;
}

/* What one request produced: its TOKEN events (id, log-probabilities, the bytes of text each
 * released and the cumulative text after it), the CONTENT text, the end, the final context. */
typedef struct run {
  int n;
  int32_t id[MAXT];
  int is_stop[MAXT];
  float lp[MAXT];
  int n_top[MAXT];
  int32_t top_id[MAXT][LM_TOP_LOGPROBS_MAX];
  float top_lp[MAXT][LM_TOP_LOGPROBS_MAX];
  size_t piece[MAXT], cum[MAXT];
  char text[4096];
  size_t len;
  char content[4096];
  size_t n_content;
  lm_finish_kind finish;
  int32_t stop_id;
  int stop_index;
  lm_usage usage;
  char error[512];
  int32_t ctx[MAXC];
  int64_t n_ctx, n_prompt;
} run;

static void on_token(run *o, const lm_event *ev) {
  int k = o->n++;
  assert_true(k < MAXT && o->len + ev->len < sizeof o->text);
  o->id[k] = ev->token;
  o->is_stop[k] = ev->is_stop;
  o->lp[k] = ev->logprob;
  o->n_top[k] = ev->n_top;
  memcpy(o->top_id[k], ev->top_ids, sizeof ev->top_ids);
  memcpy(o->top_lp[k], ev->top_logprobs, sizeof ev->top_logprobs);
  if (ev->len) memcpy(o->text + o->len, ev->text, ev->len);
  o->len += ev->len;
  o->text[o->len] = '\0';
  o->piece[k] = ev->len;
  o->cum[k] = o->len;
}

/* Takes r's events until the end, waiting for each (or polling every millisecond when `poll`),
 * and cancels r after `cancel_after` tokens when that is > 0. */
static run *drain_ex(lm_request *r, int cancel_after, int poll) {
  run *o = calloc(1, sizeof *o);
  assert_non_null(o);
  lm_event ev;
  for (long waits = 0;; waits++) {
    assert_int_equal(lm_request_next(r, poll ? 0 : -1, &ev), LM_OK);
    if (ev.kind == LM_EVENT_DONE) break;
    if (ev.kind == LM_EVENT_NONE) { /* only a 0 ms poll may come back empty */
      assert_true(poll && waits < 100000);
      usleep(1000);
    } else if (ev.kind == LM_EVENT_TOKEN) {
      on_token(o, &ev);
      if (cancel_after > 0 && o->n == cancel_after) lm_request_cancel(r);
    } else {
      assert_int_equal(ev.kind, LM_EVENT_CONTENT); /* ids without parse_output: plain content */
      assert_true(ev.len > 0 && o->n_content + ev.len < sizeof o->content);
      memcpy(o->content + o->n_content, ev.text, ev.len);
      o->n_content += ev.len;
    }
  }
  o->finish = ev.finish;
  o->stop_id = ev.stop_id;
  o->stop_index = ev.stop_index;
  o->usage = ev.usage;
  snprintf(o->error, sizeof o->error, "%s", ev.error ? ev.error : "");
  const int32_t *c = lm_request_tokens(r, &o->n_ctx, &o->n_prompt);
  assert_true(o->n_ctx <= MAXC);
  memcpy(o->ctx, c, (size_t)o->n_ctx * sizeof *c);
  size_t n;
  const char *content = lm_request_content(r, &n);
  assert_int_equal(n, o->n_content);
  assert_memory_equal(content, o->content, n);
  return o;
}

static run *drain(lm_request *r) { return drain_ex(r, 0, 0); }

/* Submits o and takes every event (cancelling after `cancel_after` tokens when > 0). */
static run *go_ex(lm_engine *e, const lm_request_options *o, int cancel_after) {
  lm_request *r = NULL;
  lm_status s = lm_request_submit(e, o, &r);
  if (s) fprintf(stderr, "%s\n", lm_errmsg());
  assert_int_equal(s, LM_OK);
  run *out = drain_ex(r, cancel_after, 0);
  lm_request_free(r);
  return out;
}

static run *go(lm_engine *e, const lm_request_options *o) { return go_ex(e, o, 0); }

static void encode(fx *f, const char *text, int add_bos, int32_t **ids, int64_t *n) {
  assert_int_equal(lm_checkpoint_tokenize(f->ck, text, strlen(text), add_bos, ids, n), LM_OK);
}

/* A greedy baseline: the first n tokens after the prompt, stop ids ignored. */
static run *baseline(lm_engine *e, const int32_t *p, int64_t np, int n) {
  lm_request_options o = ids_opts(p, np, n);
  run *b = go(e, &o);
  assert_int_equal(b->finish, LM_FIN_LENGTH);
  assert_int_equal(b->n, n);
  assert_int_equal(b->n_content, b->len); /* the content is the tokens' text */
  assert_memory_equal(b->content, b->text, b->len);
  return b;
}

/* ---- stop ids, max tokens, cancellation ------------------------------------------------------ */

static int is_stop_id(const lm_checkpoint *ck, int32_t id) {
  lm_checkpoint_info ci;
  lm_checkpoint_describe(ck, &ci);
  for (int i = 0; i < ci.n_stop_ids; i++)
    if (ci.stop_ids[i] == id) return 1;
  return 0;
}

/* The same checkpoint in dir, with `extra` added to generation_config.json's stop ids. */
static lm_checkpoint *checkpoint_with_stop(const char *dir, int32_t extra) {
  char gc[128];
  snprintf(gc, sizeof gc, "{\"do_sample\":false,\"eos_token_id\":[1,5,%d]}\n", extra);
  assert_int_equal(write_checkpoint(dir, 64, 4), LM_OK);
  assert_int_equal(write_text(dir, "generation_config.json", gc), 0);
  lm_checkpoint *ck = NULL;
  assert_int_equal(lm_checkpoint_open(dir, &ck), LM_OK);
  assert_true(is_stop_id(ck, extra));
  return ck;
}

static void t_stop_id_and_length(void **st) {
  fx *f = *st;
  lm_engine *e = default_engine(f);
  int32_t *p;
  int64_t np;
  encode(f, "the cat sat on the mat", 1, &p, &np);
  run *b = baseline(e, p, np, 24);
  printf("baseline: \"%s\"\n", b->text);
  /* the stop id: an id with text that appears first at index k >= 3, no stop id before it */
  int k = -1;
  for (int i = 0; i < b->n && k < 0 && !is_stop_id(f->ck, b->id[i]); i++) {
    int first = 1;
    for (int j = 0; j < i; j++)
      first &= b->id[j] != b->id[i];
    if (i >= 3 && first && b->piece[i] > 0) k = i;
  }
  assert_true(k > 0);
  lm_checkpoint *ck2 = checkpoint_with_stop(TMP "/model-stop", b->id[k]);
  lm_engine_options eo = engine_opts();
  lm_engine *e2 = engine(f, ck2, &eo);
  lm_request_options o = ids_opts(p, np, 0);
  o.ignore_eos = 0;
  run *t = go(e2, &o);
  assert_int_equal(t->finish, LM_FIN_STOP);
  assert_int_equal(t->stop_id, b->id[k]);
  assert_int_equal(t->n, k + 1); /* the stop id has its TOKEN event too, marked */
  assert_memory_equal(t->id, b->id, (size_t)(k + 1) * sizeof *t->id);
  for (int i = 0; i < k; i++)
    assert_false(t->is_stop[i]);
  assert_true(t->is_stop[k]);
  assert_int_equal(t->piece[k], 0); /* its text is not streamed */
  assert_int_equal(t->len, b->cum[k - 1]);
  assert_memory_equal(t->text, b->text, t->len);
  assert_int_equal(t->n_content, t->len);
  assert_int_equal(t->usage.prompt_tokens, np);
  assert_int_equal(t->usage.completion_tokens, k + 1); /* counts the stop id */
  assert_int_equal(t->n_prompt, np);
  assert_int_equal(t->n_ctx, np + k); /* the stop id stays out of the context */
  assert_memory_equal(t->ctx + np, b->id, (size_t)k * sizeof *t->ctx);
  /* the step that sampled the stop id fed the token before it: all of the context is cached */
  int32_t next[MAXC];
  memcpy(next, t->ctx, (size_t)t->n_ctx * sizeof *next);
  next[t->n_ctx] = 20;
  o = ids_opts(next, t->n_ctx + 1, 1);
  run *u = go(e2, &o);
  assert_int_equal(u->usage.cached_tokens, t->n_ctx);
  free(u);
  free(t);
  drop(f, e2);
  lm_checkpoint_free(ck2);

  /* max tokens: exactly that many, the text of all of them streamed by the end */
  o = ids_opts(p, np, 7);
  run *m = go(e, &o);
  assert_int_equal(m->finish, LM_FIN_LENGTH);
  assert_int_equal(m->n, 7);
  assert_memory_equal(m->id, b->id, 7 * sizeof *m->id);
  assert_int_equal(m->usage.prompt_tokens, np);
  assert_int_equal(m->usage.completion_tokens, 7);
  assert_int_equal(m->usage.decode_steps, 6);
  /* the baseline's caches cannot go back to its prompt: the sliding rings (window 4) wrapped */
  assert_int_equal(m->usage.cached_tokens, 0);
  assert_int_equal(m->len, b->cum[6]);
  assert_memory_equal(m->text, b->text, m->len);
  /* continuing after a length stop: the pending 7th token is fed, the rest reused */
  o = ids_opts(m->ctx, m->n_ctx, 7);
  run *c = go(e, &o);
  assert_int_equal(c->usage.cached_tokens, np + 6);
  assert_int_equal(c->usage.prompt_tokens, np + 7);
  assert_memory_equal(c->id, b->id + 7, 7 * sizeof *c->id); /* = the baseline's 8th to 14th */
  free(c);
  free(m);

  /* cancellation after 3 tokens of an unbounded request */
  o = ids_opts(p, np, 0);
  run *x = go_ex(e, &o, 3);
  assert_int_equal(x->finish, LM_FIN_CANCELLED);
  assert_true(x->n >= 3);
  assert_memory_equal(x->id, b->id, 3 * sizeof *x->id);
  assert_true(strlen(x->error) > 0);
  free(x);
  free(b);
  lm_free(p);
  drop(f, e);
}

/* ---- stop strings ---------------------------------------------------------------------------- */

static void t_stop_strings(void **st) {
  fx *f = *st;
  lm_engine *e = default_engine(f);
  int32_t *p;
  int64_t np;
  encode(f, "hello there, in the end", 1, &p, &np);
  run *b = baseline(e, p, np, 40);
  /* a boundary between two tokens with text whose 2-byte string first occurs across it */
  int k = -1;
  char stop[3] = {0};
  for (int i = 2; i + 1 < b->n && k < 0; i++) {
    size_t end = b->cum[i - 1];
    if (end < 2 || !b->piece[i - 1] || !b->piece[i]) continue;
    if ((unsigned char)b->text[end - 1] >= 0x80 || (unsigned char)b->text[end] >= 0x80) continue;
    stop[0] = b->text[end - 1];
    stop[1] = b->text[end];
    if ((size_t)(strstr(b->text, stop) - b->text) == end - 1) k = i;
  }
  if (k < 0) fprintf(stderr, "no usable boundary in \"%s\"\n", b->text);
  assert_true(k > 0);
  size_t at = b->cum[k - 1] - 1; /* where the stop string starts */
  printf("stop string \"%s\" at byte %zu of \"%s\"\n", stop, at, b->text);

  const char *stops[] = {"never-seen", stop};
  lm_request_options o = ids_opts(p, np, 40);
  o.stop = stops;
  o.n_stop = 2;
  run *t = go(e, &o);
  assert_int_equal(t->finish, LM_FIN_STOP_STR);
  assert_int_equal(t->stop_index, 1);
  assert_int_equal(t->n, k + 1); /* ends on the token that completes it */
  assert_int_equal(t->len, at);  /* the text before it, nothing of it or after */
  assert_memory_equal(t->text, b->text, at);
  assert_int_equal(t->cum[k - 1], at); /* its first byte was held back */
  assert_int_equal(t->n_content, at);
  assert_memory_equal(t->content, b->text, at);
  free(t);

  /* a false alarm: the held byte is released by the next token, nothing is lost */
  char fake[3] = {stop[0], '#', 0};
  const char *stops2[] = {fake};
  o.stop = stops2;
  o.n_stop = 1;
  t = go(e, &o);
  assert_int_equal(t->finish, LM_FIN_LENGTH);
  assert_string_equal(t->text, b->text);
  assert_int_equal(t->cum[k - 1], at);
  assert_true(t->cum[k] >= at + 1);
  free(t);

  /* a stop string that is the whole first token's text stops with nothing streamed */
  char first[8] = {0};
  memcpy(first, b->text, b->cum[0] < 7 ? b->cum[0] : 7);
  if (first[0]) {
    const char *stops3[] = {first};
    o.stop = stops3;
    t = go(e, &o);
    assert_int_equal(t->finish, LM_FIN_STOP_STR);
    assert_int_equal(t->stop_index, 0);
    assert_int_equal(t->len, 0);
    assert_int_equal(t->n_content, 0);
    free(t);
  }
  free(b);
  lm_free(p);
  drop(f, e);
}

/* ---- prefix reuse ---------------------------------------------------------------------------- */

/* Each token of r is the argmax of teacher-forced logits of its context from scratch
 * (lm_engine_logits: a fresh context), and its log-probabilities are theirs within 1e-4 of the
 * logits' scale. */
static void expect_scratch(lm_engine *e, const run *r) {
  int64_t n = r->n_prompt + r->n - 1; /* the last token's logits come from the one before it */
  assert_true(r->n >= 1 && n <= r->n_ctx);
  float *lg = malloc((size_t)(n * V) * sizeof *lg), worst = 0;
  assert_non_null(lg);
  assert_int_equal(lm_engine_logits(e, r->ctx, n, 0, 0, lg), LM_OK);
  for (int i = 0; i < r->n; i++) {
    const float *row = lg + (r->n_prompt - 1 + i) * V;
    float mx = -INFINITY, scale = 0;
    int arg = 0;
    for (int v = 0; v < V; v++) {
      if (row[v] > mx) mx = row[v], arg = v;
      scale = fmaxf(scale, fabsf(row[v]));
    }
    double sum = 0;
    for (int v = 0; v < V; v++)
      sum += exp((double)row[v] - mx);
    double lse = mx + log(sum);
    assert_true(scale > 0.1f);
    assert_int_equal(r->id[i], arg);
    float d = fabsf(r->lp[i] - (float)(row[r->id[i]] - lse));
    assert_int_equal(r->n_top[i], LM_TOP_LOGPROBS_MAX);
    assert_int_equal(r->top_id[i][0], arg);
    for (int j = 0; j < r->n_top[i]; j++)
      d = fmaxf(d, fabsf(r->top_lp[i][j] - (float)(row[r->top_id[i][j]] - lse)));
    assert_true(d <= 1e-4f * scale);
    worst = fmaxf(worst, d / scale);
  }
  printf("context %lld: %d tokens, max |Δlogprob| / max |logit| vs from scratch %.3g\n",
         (long long)r->n_ctx, r->n, worst);
  free(lg);
}

/* A greedy request with 20 log-probabilities per token, checked against a from-scratch run. */
static run *go_checked(lm_engine *e, const int32_t *ids, int64_t n, int64_t max_tokens) {
  lm_request_options o = ids_opts(ids, n, max_tokens);
  o.logprobs = LM_TOP_LOGPROBS_MAX;
  run *r = go(e, &o);
  assert_int_equal(r->finish, LM_FIN_LENGTH);
  assert_int_equal(r->n, max_tokens);
  expect_scratch(e, r);
  return r;
}

static void t_prefix_reuse(void **st) {
  fx *f = *st;
  lm_engine_options eo = engine_opts();
  eo.chunk = 4; /* several prefill chunks */
  lm_engine *e = engine(f, f->ck, &eo);
  int32_t *p1, *p2, ctx[MAXC];
  int64_t n1, n2, n;
  encode(f, "<|turn>user\nhi there<turn|>\n<|turn>model\n", 1, &p1, &n1);
  encode(f, "<turn|>\n<|turn>user\nand then?<turn|>\n<|turn>model\n", 0, &p2, &n2);
  run *a = go_checked(e, p1, n1, 5);
  assert_int_equal(a->usage.cached_tokens, 0);
  /* the next turn: A's caches hold all but its pending last token */
  n = a->n_ctx;
  memcpy(ctx, a->ctx, (size_t)n * sizeof *ctx);
  memcpy(ctx + n, p2, (size_t)n2 * sizeof *ctx);
  n += n2;
  run *b = go_checked(e, ctx, n, 5);
  assert_int_equal(b->usage.cached_tokens, a->n_ctx - 1);
  assert_int_equal(b->usage.prompt_tokens, n);
  /* B's context and a suffix */
  n = b->n_ctx;
  memcpy(ctx, b->ctx, (size_t)n * sizeof *ctx);
  ctx[n] = 20, ctx[n + 1] = 21, ctx[n + 2] = 22;
  n += 3;
  run *c = go_checked(e, ctx, n, 3);
  assert_int_equal(c->usage.cached_tokens, b->n_ctx - 1);
  /* a context that diverges early: every cached entry's sliding rings (window 4) have wrapped,
   * so none can go back to the common prefix and everything is prefilled again */
  ctx[3] = (ctx[3] + 1) % V;
  run *d = go_checked(e, ctx, n, 3);
  assert_int_equal(d->usage.cached_tokens, 0);
  /* a short context (no ring has wrapped) rolls back to the common prefix */
  int32_t s1[] = {2, 20, 21}, s2[] = {2, 20, 30};
  run *r1 = go_checked(e, s1, 3, 1), *r2 = go_checked(e, s2, 3, 1);
  assert_int_equal(r2->usage.cached_tokens, 2);
  /* the same context again: its last token is fed again for its logits */
  run *r3 = go_checked(e, s2, 3, 1);
  assert_int_equal(r3->usage.cached_tokens, 2);
  assert_int_equal(r3->id[0], r2->id[0]);
  lm_engine_stats es;
  lm_engine_get_stats(e, &es);
  assert_true(es.prefix_hits >= 4);
  assert_true(es.prefix_entries >= 1 && es.prefix_entries <= eo.prefix_cache);
  free(a);
  free(b);
  free(c);
  free(d);
  free(r1);
  free(r2);
  free(r3);
  lm_free(p1);
  lm_free(p2);
  drop(f, e);
}

/* ---- state files ----------------------------------------------------------------------------- */

static void t_state_files(void **st) {
  fx *f = *st;
  const char *path = TMP "/state.lmstate";
  unlink(path);
  lm_engine *e = default_engine(f);
  int32_t *p;
  int64_t np, saved = -1;
  encode(f, "in the beginning", 1, &p, &np);
  lm_request_options o = ids_opts(p, np, 6);
  run *a = go(e, &o);
  assert_int_equal(lm_engine_save_state(e, a->ctx, a->n_ctx, path, &saved), LM_OK);
  assert_int_equal(saved, a->n_ctx - 1); /* the last token was pending */
  int32_t other[] = {2, 30, 31};
  assert_int_equal(lm_engine_save_state(e, other, 3, TMP "/none.lmstate", NULL), LM_ERR_NOT_FOUND);
  /* how this engine continues A */
  o = ids_opts(a->ctx, a->n_ctx, 8);
  o.logprobs = 5;
  run *ref = go(e, &o);
  assert_int_equal(ref->usage.cached_tokens, saved);
  drop(f, e);

  /* a new engine, the state loaded: the same continuation from the saved caches */
  e = default_engine(f);
  int32_t *ids = NULL;
  int64_t n = 0;
  assert_int_equal(lm_engine_load_state(e, path, &ids, &n), LM_OK);
  assert_int_equal(n, saved);
  assert_memory_equal(ids, a->ctx, (size_t)n * sizeof *ids);
  lm_free(ids);
  run *c = go(e, &o);
  assert_int_equal(c->usage.cached_tokens, saved);
  assert_int_equal(c->finish, LM_FIN_LENGTH);
  assert_int_equal(c->n, 8);
  assert_memory_equal(c->id, ref->id, 8 * sizeof *c->id);
  for (int i = 0; i < 8; i++)
    assert_true(fabsf(c->lp[i] - ref->lp[i]) <= 1e-5f);
  /* files that are not states */
  assert_int_equal(lm_engine_load_state(e, TMP "/missing.lmstate", NULL, NULL), LM_ERR_NOT_FOUND);
  assert_non_null(strstr(lm_errmsg(), "missing.lmstate"));
  assert_int_equal(write_text(TMP, "junk.lmstate", "not a state file"), 0);
  assert_int_equal(lm_engine_load_state(e, TMP "/junk.lmstate", NULL, NULL), LM_ERR_CORRUPT);
  free(a);
  free(ref);
  free(c);
  lm_free(p);
  drop(f, e);
}

/* ---- seeded sampling ------------------------------------------------------------------------- */

static void t_seeded(void **st) {
  fx *f = *st;
  lm_engine_options eo = engine_opts();
  eo.prefix_cache = 0; /* every run from scratch: the same logits bit for bit */
  lm_engine *e = engine(f, f->ck, &eo);
  int32_t *p;
  int64_t np;
  encode(f, "once upon a time", 1, &p, &np);
  lm_request_options o = ids_opts(p, np, 16);
  o.sampling.temperature = 1.5f;
  o.sampling.seed = 1234;
  o.has_seed = 1;
  run *a = go(e, &o), *b = go(e, &o);
  assert_int_equal(a->n, 16);
  assert_memory_equal(a->id, b->id, 16 * sizeof *a->id);
  o.sampling.seed = 99;
  run *c = go(e, &o);
  assert_memory_not_equal(a->id, c->id, 16 * sizeof *a->id);
  free(a);
  free(b);
  free(c);
  lm_free(p);
  drop(f, e);
}

/* ---- a sampler failure ----------------------------------------------------------------------- */

/* Every id banned: with temperature 1 the sampler runs (not the backend's argmax) and finds no
 * finite logit. Two requests run together (parallel 2), failing ones and a working one, so their
 * rows are sampled on the OpenMP threads; each failure must carry the sampler's message, not what
 * the scheduler thread's last error happened to be (an unrelated command failure is left there on
 * purpose before each round). Rounds repeat until both prompts were sampled in one step often
 * enough. */
static void t_sampler_error(void **st) {
  fx *f = *st;
  lm_engine_options eo = engine_opts();
  eo.parallel = 2;
  lm_engine *e = engine(f, f->ck, &eo);
  int32_t *p;
  int64_t np;
  encode(f, "banned", 1, &p, &np);
  lm_request_options bad = ids_opts(p, np, 4), ok = ids_opts(p, np, 1);
  bad.sampling.temperature = ok.sampling.temperature = 1;
  bad.has_seed = ok.has_seed = 1;
  for (int32_t id = 0; id < V; id++)
    assert_int_equal(lm_sampling_add_bias(&bad.sampling, id, -INFINITY), LM_OK);
  int32_t none[] = {2, 33, 34};
  int together = 0, rounds = 0;
  for (; rounds < 60 && together < 6; rounds++) {
    assert_int_equal(lm_engine_save_state(e, none, 3, TMP "/none.lmstate", NULL), LM_ERR_NOT_FOUND);
    lm_engine_stats s0, s1;
    lm_engine_get_stats(e, &s0);
    int pair = rounds % 3; /* 0: bad, ok; 1: ok, bad; 2: bad, bad */
    const lm_request_options *o[2] = {pair == 1 ? &ok : &bad, pair == 0 ? &ok : &bad};
    lm_request *r[2];
    for (int i = 0; i < 2; i++)
      assert_int_equal(lm_request_create(e, o[i], &r[i]), LM_OK);
    for (int i = 0; i < 2; i++)
      assert_int_equal(lm_request_start(r[i]), LM_OK);
    for (int i = 0; i < 2; i++) {
      run *x = drain(r[i]);
      if (o[i] == &bad) {
        if (!strstr(x->error, "no token has a finite logit"))
          fprintf(stderr, "round %d, request %d: \"%s\"\n", rounds, i, x->error);
        assert_int_equal(x->finish, LM_FIN_ERROR);
        assert_non_null(strstr(x->error, "sample: no token has a finite logit"));
        assert_int_equal(x->n, 0);
      } else {
        assert_int_equal(x->finish, LM_FIN_LENGTH);
        assert_int_equal(x->n, 1);
      }
      free(x);
      lm_request_free(r[i]);
    }
    /* a command runs between steps: after it, the step of this round is counted */
    assert_int_equal(lm_engine_save_state(e, none, 3, TMP "/none.lmstate", NULL), LM_ERR_NOT_FOUND);
    lm_engine_get_stats(e, &s1);
    together += s1.steps - s0.steps == 1;
  }
  printf("%d rounds, %d with both prompts sampled in one step\n", rounds, together);
  assert_true(together > 0);
  lm_engine_stats es;
  lm_engine_get_stats(e, &es);
  assert_true(es.requests_failed >= rounds);
  lm_sampling_clear(&bad.sampling);
  lm_free(p);
  drop(f, e);
}

/* ---- create, then start ---------------------------------------------------------------------- */

static void t_create_start(void **st) {
  fx *f = *st;
  lm_engine *e = default_engine(f);
  int32_t *p;
  int64_t np, n, n_prompt;
  encode(f, "the end", 1, &p, &np);
  lm_request_options o = ids_opts(p, np, 3);
  lm_request *r = NULL;
  assert_int_equal(lm_request_create(e, &o, &r), LM_OK);
  const int32_t *t = lm_request_tokens(r, &n, &n_prompt);
  assert_int_equal(n, np);
  assert_int_equal(n_prompt, np);
  assert_memory_equal(t, p, (size_t)np * sizeof *p);
  lm_event ev;
  assert_int_equal(lm_request_next(r, 0, &ev), LM_OK); /* nothing runs before the start */
  assert_int_equal(ev.kind, LM_EVENT_NONE);
  assert_int_equal(lm_request_set_max_tokens(r, -1), LM_ERR_INVALID);
  assert_int_equal(lm_request_set_max_tokens(r, 5), LM_OK);
  assert_int_equal(lm_request_start(r), LM_OK);
  assert_int_equal(lm_request_start(r), LM_ERR_STATE);
  assert_int_equal(lm_request_set_max_tokens(r, 2), LM_ERR_STATE);
  run *x = drain_ex(r, 0, 1); /* 0 ms polls: LM_EVENT_NONE until something arrives */
  assert_int_equal(x->finish, LM_FIN_LENGTH);
  assert_int_equal(x->n, 5);
  assert_int_equal(x->usage.completion_tokens, 5);
  assert_int_equal(x->n_ctx, np + 5);
  assert_int_equal(lm_request_next(r, 0, &ev), LM_OK); /* after the end, the end again */
  assert_int_equal(ev.kind, LM_EVENT_DONE);
  assert_int_equal(ev.finish, LM_FIN_LENGTH);
  free(x);
  lm_request_free(r);
  /* a request created and never started is freed without running */
  assert_int_equal(lm_request_create(e, &o, &r), LM_OK);
  lm_request_free(r);
  lm_request_free(NULL);
  lm_engine_stats es;
  lm_engine_get_stats(e, &es);
  assert_int_equal(es.requests_done, 1);
  lm_free(p);
  drop(f, e);
}

/* ---- bad input ------------------------------------------------------------------------------- */

/* lm_request_create refuses o with LM_ERR_INVALID and a message containing `why`. */
static void expect_refused(lm_engine *e, const lm_request_options *o, const char *why) {
  lm_request *r = (lm_request *)&r;
  assert_int_equal(lm_request_create(e, o, &r), LM_ERR_INVALID);
  assert_null(r);
  if (!strstr(lm_errmsg(), why)) fprintf(stderr, "\"%s\" lacks \"%s\"\n", lm_errmsg(), why);
  assert_non_null(strstr(lm_errmsg(), why));
  assert_int_equal(lm_request_submit(e, o, &r), LM_ERR_INVALID);
  assert_null(r);
}

static void t_bad_input(void **st) {
  fx *f = *st;
  lm_engine *e = default_engine(f);
  int32_t good[] = {2, 20}, bad[] = {2, V};
  lm_request_options o = ids_opts(bad, 2, 4);
  expect_refused(e, &o, "outside the vocabulary");
  o = ids_opts(good, 0, 4);
  expect_refused(e, &o, "empty");
  o = ids_opts(NULL, 0, 4);
  expect_refused(e, &o, "exactly one");
  o = ids_opts(good, 2, 4);
  o.prompt = "hi";
  expect_refused(e, &o, "exactly one");
  o = ids_opts(good, 2, 4);
  assert_int_equal(lm_sampling_add_bias(&o.sampling, V, 1), LM_OK);
  expect_refused(e, &o, "outside the vocabulary");
  lm_sampling_clear(&o.sampling);
  o = ids_opts(good, 2, 4);
  assert_int_equal(lm_sampling_add_suppress(&o.sampling, V + 5), LM_OK);
  expect_refused(e, &o, "outside the vocabulary");
  lm_sampling_clear(&o.sampling);
  o = ids_opts(good, 2, 4);
  const char *empty[] = {"x", ""}, *broken[] = {"\xC3("}, *surrogate[] = {"\xED\xA0\x80"};
  o.stop = empty;
  o.n_stop = 2;
  expect_refused(e, &o, "stop string 1 is empty");
  o.stop = broken;
  o.n_stop = 1;
  expect_refused(e, &o, "UTF-8");
  o.stop = surrogate;
  expect_refused(e, &o, "UTF-8");
  o = ids_opts(good, 2, 4);
  o.sampling.top_p = 2;
  expect_refused(e, &o, "top_p");
  o = ids_opts(good, 2, 4);
  o.logprobs = LM_TOP_LOGPROBS_MAX + 1;
  expect_refused(e, &o, "logprobs");
  o = ids_opts(good, 2, -1);
  expect_refused(e, &o, "max_tokens");
  drop(f, e);

  /* the context limit: 4 tokens */
  lm_engine_options eo = engine_opts();
  eo.context = 4;
  e = engine(f, f->ck, &eo);
  int32_t five[] = {2, 20, 21, 22, 23};
  assert_int_equal(lm_engine_check(e, 5, 0, NULL, 0), LM_ADMIT_CONTEXT);
  assert_int_equal(lm_engine_check(e, 3, 0, NULL, 0), LM_ADMIT_OK);
  o = ids_opts(five, 5, 0);
  lm_request *r = NULL;
  assert_int_equal(lm_request_create(e, &o, &r), LM_OK);
  assert_int_equal(lm_request_start(r), LM_ERR_INVALID); /* refused at start, still unstarted */
  assert_int_equal(lm_request_admission(r), LM_ADMIT_CONTEXT);
  assert_non_null(strstr(lm_errmsg(), "context limit"));
  assert_int_equal(lm_request_set_max_tokens(r, 1), LM_OK);
  assert_int_equal(lm_request_start(r), LM_ERR_INVALID); /* 5 + 1 > 4 */
  assert_int_equal(lm_request_admission(r), LM_ADMIT_CONTEXT);
  lm_request_free(r);
  o = ids_opts(five, 3, 2); /* 3 + 2 > 4 */
  assert_int_equal(lm_request_submit(e, &o, &r), LM_ERR_INVALID);
  assert_null(r);
  o = ids_opts(five, 3, 0); /* until the limit: one token */
  run *x = go(e, &o);
  assert_int_equal(x->finish, LM_FIN_LENGTH);
  assert_int_equal(x->n, 1);
  assert_int_equal(x->usage.completion_tokens, 1);
  free(x);
  drop(f, e);

  /* a checkpoint without a tokenizer serves ids, but no text and no stop strings */
  lm_checkpoint *ck = NULL;
  assert_int_equal(write_checkpoint(TMP "/model-ids", 128, 4), LM_OK);
  assert_int_equal(lm_checkpoint_open(TMP "/model-ids", &ck), LM_OK);
  eo = engine_opts();
  e = engine(f, ck, &eo);
  int32_t hi[] = {2, 100, 127};
  o = ids_opts(hi, 3, 2);
  x = go(e, &o);
  assert_int_equal(x->finish, LM_FIN_LENGTH);
  assert_int_equal(x->n, 2);
  assert_int_equal(x->len, 0);
  free(x);
  const char *stops[] = {"x"};
  o.stop = stops;
  o.n_stop = 1;
  expect_refused(e, &o, "tokenizer");
  o = ids_opts(NULL, 0, 2);
  o.prompt = "hello";
  assert_int_equal(lm_request_create(e, &o, &r), LM_ERR_STATE);
  assert_null(r);
  drop(f, e);
  lm_checkpoint_free(ck);
}

static int write_model_main(int argc, char **argv) {
  int64_t vocab = 64, window = 4;
  for (int i = 3; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--vocab"))
      vocab = atoll(argv[i + 1]);
    else if (!strcmp(argv[i], "--window"))
      window = atoll(argv[i + 1]);
    else
      return fprintf(stderr, "unknown option %s\n", argv[i]), 2;
  }
  if (vocab < 64 || window < 1)
    return fprintf(stderr, "--vocab must be >= 64 and --window >= 1\n"), 2;
  if (write_checkpoint(argv[2], vocab, window)) return fprintf(stderr, "%s\n", lm_errmsg()), 1;
  return 0;
}

int main(int argc, char **argv) {
  if (argc >= 3 && !strcmp(argv[1], "--write-model")) return write_model_main(argc, argv);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(t_stop_id_and_length, test_teardown),
      cmocka_unit_test_teardown(t_stop_strings, test_teardown),
      cmocka_unit_test_teardown(t_prefix_reuse, test_teardown),
      cmocka_unit_test_teardown(t_state_files, test_teardown),
      cmocka_unit_test_teardown(t_seeded, test_teardown),
      cmocka_unit_test_teardown(t_sampler_error, test_teardown),
      cmocka_unit_test_teardown(t_create_start, test_teardown),
      cmocka_unit_test_teardown(t_bad_input, test_teardown),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
