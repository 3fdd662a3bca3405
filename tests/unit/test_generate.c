/* test_generate.c — the generation session on a tiny random model (vocab 64) paired with a
 * 64-token tokenizer written here (single characters, a few merges, Gemma-style control tokens):
 * stop ids, stop strings split across tokens with hold-back, max tokens, the token callback,
 * reuse of the cache when a turn is appended or a context re-synced (the caches grow by the new
 * tokens only and the logits equal a from-scratch run), seeded sampling, and bad input.
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
#include <sys/stat.h>

#include "base/status.h"
#include "engine/generate.h"
#include "model/forward.h"
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

typedef struct fx {
  lm_model *m;
  lm_backend *be;
  lm_tokenizer *tok;
} fx;

static int setup(void **st) {
  static fx f;
  if (write_checkpoint(TMP "/model", 64, 4)) return fprintf(stderr, "%s\n", lm_errmsg()), -1;
  if (lm_model_load(TMP "/model", &f.m) || lm_backend_cpu_create(LM_PRECISION_F32, 0, &f.be) ||
      lm_model_prepare(f.m, f.be) || lm_tokenizer_load(TMP "/model", &f.tok))
    return fprintf(stderr, "%s\n", lm_errmsg()), -1;
  *st = &f;
  return 0;
}

static int teardown(void **st) {
  fx *f = *st;
  lm_tokenizer_free(f->tok);
  lm_backend_destroy(f->be);
  lm_model_free(f->m);
  return 0;
}

static lm_gen *session(fx *f, const lm_gen_opts *o) {
  lm_gen *g = NULL;
  lm_status s = lm_gen_create(f->m, f->be, f->tok, o, &g);
  if (s) fprintf(stderr, "%s\n", lm_errmsg());
  assert_int_equal(s, LM_OK);
  return g;
}

static lm_gen_opts greedy_opts(void) {
  lm_gen_opts o;
  lm_gen_opts_init(&o);
  o.sampling.temperature = 0;
  o.skip_special = 1;
  return o;
}

/* What the callback saw: every call's id and text, and the cumulative text after each call. */
typedef struct trace {
  int n;
  int32_t id[256];
  size_t cum[256];
  char text[4096];
  size_t len;
  int stop_after; /* return 1 at this call (1-based); 0 never */
} trace;

static int on_token(void *user, int32_t id, const char *text, size_t len) {
  trace *t = user;
  assert_true(t->n < 256 && t->len + len < sizeof t->text);
  memcpy(t->text + t->len, text, len);
  t->len += len;
  t->text[t->len] = '\0';
  t->id[t->n] = id;
  t->cum[t->n++] = t->len;
  return t->stop_after && t->n == t->stop_after;
}

static void encode(fx *f, const char *text, int32_t **ids, size_t *n) {
  assert_int_equal(lm_tokenizer_encode(f->tok, text, strlen(text), 1, ids, n), LM_OK);
}

/* A greedy baseline: the first `n` tokens after the prompt, with their text pieces. */
static void baseline(fx *f, const int32_t *p, size_t np, int n, trace *t) {
  lm_gen_opts o = greedy_opts();
  o.max_tokens = n;
  o.on_token = on_token;
  o.user = t;
  memset(t, 0, sizeof *t);
  lm_gen *g = session(f, &o);
  assert_int_equal(lm_gen_append(g, p, (int64_t)np), LM_OK);
  assert_int_equal(lm_gen_run(g), LM_OK);
  assert_int_equal(lm_gen_stop_reason(g), LM_GEN_STOP_LENGTH);
  assert_int_equal(t->n, n);
  lm_gen_free(g);
}

/* ---- stop ids, max tokens, callback ---------------------------------------------------------- */

static void t_stop_id_and_length(void **st) {
  fx *f = *st;
  int32_t *p;
  size_t np;
  encode(f, "the cat sat on the mat", &p, &np);
  trace b;
  baseline(f, p, np, 24, &b);
  printf("baseline: \"%s\"\n", b.text);
  int k = -1; /* the first id that appears first at index >= 3 */
  for (int i = 3; i < b.n && k < 0; i++) {
    int first = 1;
    for (int j = 0; j < i; j++)
      first &= b.id[j] != b.id[i];
    if (first) k = i;
  }
  assert_true(k > 0);
  lm_gen_opts o = greedy_opts();
  trace t = {0};
  o.on_token = on_token;
  o.user = &t;
  o.stop_ids = &b.id[k];
  o.n_stop_ids = 1;
  lm_gen *g = session(f, &o);
  assert_int_equal(lm_gen_append(g, p, (int64_t)np), LM_OK);
  assert_int_equal(lm_gen_run(g), LM_OK);
  assert_int_equal(lm_gen_stop_reason(g), LM_GEN_STOP_ID);
  assert_int_equal(lm_gen_stop_id(g), b.id[k]);
  assert_int_equal(t.n, k + 1); /* the stop id reaches the callback too */
  assert_int_equal(t.id[k], b.id[k]);
  assert_int_equal(t.len, b.cum[k - 1]); /* its text is not streamed */
  assert_memory_equal(t.text, b.text, t.len);
  int64_t nh;
  const int32_t *h = lm_gen_tokens(g, &nh);
  assert_int_equal(nh, (int64_t)np + k); /* the stop id stays out of the context */
  assert_memory_equal(h + np, b.id, (size_t)k * sizeof *h);
  assert_int_equal(lm_gen_kv_len(g),
                   nh); /* the step that sampled the stop id fed the token before it */
  int32_t id;
  assert_int_equal(lm_gen_step(g, &id), LM_ERR_STATE); /* the response has ended */
  lm_gen_free(g);

  /* max tokens: exactly that many, the last one pending */
  o = greedy_opts();
  o.max_tokens = 7;
  g = session(f, &o);
  assert_int_equal(lm_gen_append(g, p, (int64_t)np), LM_OK);
  assert_int_equal(lm_gen_run(g), LM_OK);
  assert_int_equal(lm_gen_stop_reason(g), LM_GEN_STOP_LENGTH);
  lm_gen_stats s = lm_gen_get_stats(g);
  assert_int_equal(s.decode_tokens, 7);
  assert_int_equal(s.decode_steps, 6);
  assert_int_equal(s.prefill_tokens, (int64_t)np);
  assert_int_equal(lm_gen_kv_len(g), (int64_t)np + 6);
  size_t len;
  const char *txt = lm_gen_text(g, &len);
  assert_int_equal(len, b.cum[6]); /* the text of the 7 tokens, all of it streamed at the end */
  assert_memory_equal(txt, b.text, len);
  /* continuing after a length stop: append nothing, the pending token is fed */
  assert_int_equal(lm_gen_append(g, NULL, 0), LM_OK);
  assert_int_equal(lm_gen_kv_len(g), (int64_t)np + 7);
  assert_int_equal(lm_gen_run(g), LM_OK);
  assert_int_equal(lm_gen_get_stats(g).decode_tokens, 7);
  h = lm_gen_tokens(g, &nh);
  assert_memory_equal(h + np, b.id, 14 * sizeof *h); /* = the first 14 of the baseline */
  lm_gen_free(g);

  /* the callback ends the response */
  o = greedy_opts();
  t = (trace){.stop_after = 3};
  o.on_token = on_token;
  o.user = &t;
  g = session(f, &o);
  assert_int_equal(lm_gen_append(g, p, (int64_t)np), LM_OK);
  assert_int_equal(lm_gen_run(g), LM_OK);
  assert_int_equal(lm_gen_stop_reason(g), LM_GEN_STOP_CALLBACK);
  assert_int_equal(t.n, 3);
  lm_gen_free(g);
  free(p);
}

/* ---- stop strings ---------------------------------------------------------------------------- */

static void t_stop_strings(void **st) {
  fx *f = *st;
  int32_t *p;
  size_t np;
  encode(f, "hello there, in the end", &p, &np);
  trace b;
  baseline(f, p, np, 40, &b);
  /* a boundary between two tokens with text whose 2-byte string first occurs across it */
  int k = -1;
  char stop[3] = {0};
  for (int i = 2; i + 1 < b.n && k < 0; i++) {
    size_t end = b.cum[i - 1];
    if (end < 2 || b.cum[i - 1] == (i > 1 ? b.cum[i - 2] : 0) || b.cum[i] == end) continue;
    if ((unsigned char)b.text[end - 1] >= 0x80 || (unsigned char)b.text[end] >= 0x80) continue;
    stop[0] = b.text[end - 1];
    stop[1] = b.text[end];
    if ((size_t)(strstr(b.text, stop) - b.text) == end - 1) k = i;
  }
  if (k < 0) fprintf(stderr, "no usable boundary in \"%s\"\n", b.text);
  assert_true(k > 0);
  size_t at = b.cum[k - 1] - 1; /* where the stop string starts */
  printf("stop string \"%s\" at byte %zu of \"%s\"\n", stop, at, b.text);

  lm_gen_opts o = greedy_opts();
  const char *stops[] = {"never-seen", stop};
  trace t = {0};
  o.on_token = on_token;
  o.user = &t;
  o.stop_strings = stops;
  o.n_stop_strings = 2;
  lm_gen *g = session(f, &o);
  assert_int_equal(lm_gen_append(g, p, (int64_t)np), LM_OK);
  assert_int_equal(lm_gen_run(g), LM_OK);
  assert_int_equal(lm_gen_stop_reason(g), LM_GEN_STOP_STRING);
  assert_int_equal(t.n, k + 1); /* ends on the token that completes it */
  assert_int_equal(t.len, at);  /* the text before it, nothing of it or after */
  assert_memory_equal(t.text, b.text, at);
  assert_int_equal(t.cum[k - 1], at); /* its first byte was held back */
  size_t len;
  assert_string_equal(lm_gen_text(g, &len), t.text);
  lm_gen_free(g);

  /* a false alarm: the held byte is released by the next token, nothing is lost */
  char fake[3] = {stop[0], '#', 0};
  const char *stops2[] = {fake};
  t = (trace){0};
  o.stop_strings = stops2;
  o.n_stop_strings = 1;
  o.max_tokens = 40;
  g = session(f, &o);
  assert_int_equal(lm_gen_append(g, p, (int64_t)np), LM_OK);
  assert_int_equal(lm_gen_run(g), LM_OK);
  assert_int_equal(lm_gen_stop_reason(g), LM_GEN_STOP_LENGTH);
  assert_string_equal(t.text, b.text);
  assert_int_equal(t.cum[k - 1], at);
  assert_true(t.cum[k] >= at + 1);
  lm_gen_free(g);

  /* a stop string that is the whole first token's text stops with nothing streamed */
  char first[8] = {0};
  memcpy(first, b.text, b.cum[0] < 7 ? b.cum[0] : 7);
  if (first[0]) {
    const char *stops3[] = {first};
    t = (trace){0};
    o.stop_strings = stops3;
    g = session(f, &o);
    assert_int_equal(lm_gen_append(g, p, (int64_t)np), LM_OK);
    assert_int_equal(lm_gen_run(g), LM_OK);
    assert_int_equal(lm_gen_stop_reason(g), LM_GEN_STOP_STRING);
    assert_int_equal(t.len, 0);
    lm_gen_free(g);
  }
  free(p);
}

/* ---- cache reuse ----------------------------------------------------------------------------- */

static float max_diff(const float *a, const float *b, int64_t n, float *scale) {
  float d = 0, m = 0;
  for (int64_t i = 0; i < n; i++) {
    d = fmaxf(d, fabsf(a[i] - b[i]));
    m = fmaxf(m, fabsf(b[i]));
  }
  *scale = m;
  return d;
}

/* Logits of a from-scratch session on ids. */
static float *scratch_logits(fx *f, const int32_t *ids, int64_t n, int64_t chunk) {
  lm_gen_opts o = greedy_opts();
  o.chunk = chunk;
  lm_gen *g = session(f, &o);
  assert_int_equal(lm_gen_append(g, ids, n), LM_OK);
  int64_t V = f->m->cfg.vocab_size;
  float *out = malloc((size_t)V * sizeof *out);
  memcpy(out, lm_gen_logits(g), (size_t)V * sizeof *out);
  lm_gen_free(g);
  return out;
}

static void expect_same_logits(fx *f, lm_gen *g) {
  int64_t n, V = f->m->cfg.vocab_size;
  const int32_t *h = lm_gen_tokens(g, &n);
  assert_non_null(lm_gen_logits(g));
  float *ref = scratch_logits(f, h, n, 512), scale;
  float d = max_diff(lm_gen_logits(g), ref, V, &scale);
  printf("context %lld: max |Δlogit| vs from scratch %.3g (max |logit| %.3g)\n", (long long)n, d,
         scale);
  assert_true(scale > 0.1f && d <= 1e-4f * scale);
  free(ref);
}

static void t_append_reuses_cache(void **st) {
  fx *f = *st;
  int32_t *p1, *p2;
  size_t n1, n2;
  encode(f, "<|turn>user\nhi there<turn|>\n<|turn>model\n", &p1, &n1);
  const char *turn2 = "<turn|>\n<|turn>user\nand then?<turn|>\n<|turn>model\n";
  assert_int_equal(lm_tokenizer_encode(f->tok, turn2, strlen(turn2), 0, &p2, &n2), LM_OK);
  lm_gen_opts o = greedy_opts();
  o.max_tokens = 5;
  o.chunk = 4; /* several prefill chunks */
  lm_gen *g = session(f, &o);
  assert_int_equal(lm_gen_append(g, p1, (int64_t)n1), LM_OK);
  expect_same_logits(f, g);
  assert_int_equal(lm_gen_run(g), LM_OK);
  int64_t before = lm_gen_kv_len(g);
  assert_int_equal(before, (int64_t)n1 + 4);
  assert_int_equal(lm_gen_append(g, p2, (int64_t)n2), LM_OK);
  lm_gen_stats s = lm_gen_get_stats(g);
  assert_int_equal(s.reused_tokens, before);
  assert_int_equal(s.prefill_tokens, 1 + (int64_t)n2); /* the pending token and the new turn only */
  assert_int_equal(lm_gen_kv_len(g), before + 1 + (int64_t)n2);
  expect_same_logits(f, g);

  /* sync with the context + a suffix: only the suffix is fed */
  int64_t n;
  const int32_t *h = lm_gen_tokens(g, &n);
  int32_t *ctx = malloc((size_t)(n + 3) * sizeof *ctx);
  memcpy(ctx, h, (size_t)n * sizeof *ctx);
  ctx[n] = 20, ctx[n + 1] = 21, ctx[n + 2] = 22;
  int64_t reused;
  assert_int_equal(lm_gen_sync(g, ctx, n + 3, &reused), LM_OK);
  assert_int_equal(reused, n);
  assert_int_equal(lm_gen_get_stats(g).prefill_tokens, 3);
  expect_same_logits(f, g);
  /* sync with a context that diverges early: the sliding layers' rings have wrapped (window 4),
   * so they cannot roll back and everything is prefilled again */
  ctx[3] = (ctx[3] + 1) % 64;
  assert_int_equal(lm_gen_sync(g, ctx, n + 3, &reused), LM_OK);
  assert_int_equal(reused, 0);
  assert_int_equal(lm_gen_kv_len(g), n + 3);
  expect_same_logits(f, g);
  /* a short context (no ring has wrapped) rolls back to the common prefix */
  int32_t a[] = {2, 20, 21}, b2[] = {2, 20, 30};
  assert_int_equal(lm_gen_sync(g, a, 3, &reused), LM_OK);
  assert_int_equal(lm_gen_sync(g, b2, 3, &reused), LM_OK);
  assert_int_equal(reused, 2);
  assert_int_equal(lm_gen_get_stats(g).prefill_tokens, 1);
  expect_same_logits(f, g);
  /* the same context again: the last token is fed again for its logits */
  assert_int_equal(lm_gen_sync(g, b2, 3, &reused), LM_OK);
  assert_int_equal(reused, 2);
  expect_same_logits(f, g);
  /* reset empties everything */
  assert_int_equal(lm_gen_reset(g), LM_OK);
  assert_int_equal(lm_gen_kv_len(g), 0);
  assert_int_equal(lm_gen_tokens(g, &n) != NULL || n == 0, 1);
  assert_int_equal(n, 0);
  free(ctx);
  free(p1);
  free(p2);
  lm_gen_free(g);
}

/* ---- seeded sampling ------------------------------------------------------------------------- */

static void run_ids(lm_gen *g, const int32_t *p, size_t np, int32_t *out, int n) {
  assert_int_equal(lm_gen_sync(g, p, (int64_t)np, NULL), LM_OK);
  for (int i = 0; i < n; i++)
    assert_int_equal(lm_gen_step(g, &out[i]), LM_OK);
}

static void t_seeded(void **st) {
  fx *f = *st;
  int32_t *p;
  size_t np;
  encode(f, "once upon a time", &p, &np);
  lm_gen_opts o;
  lm_gen_opts_init(&o);
  o.sampling.temperature = 1.5f;
  o.sampling.seed = 1234;
  lm_gen *a = session(f, &o), *b = session(f, &o);
  int32_t ra[16], rb[16], rc[16];
  run_ids(a, p, np, ra, 16);
  run_ids(b, p, np, rb, 16);
  assert_memory_equal(ra, rb, sizeof ra);
  o.sampling.seed = 99;
  assert_int_equal(lm_gen_set_opts(b, &o), LM_OK);
  run_ids(b, p, np, rc, 16);
  assert_memory_not_equal(ra, rc, sizeof ra);
  assert_int_equal(lm_gen_reset(a), LM_OK); /* restarts the random stream */
  run_ids(a, p, np, rc, 16);
  assert_memory_equal(ra, rc, sizeof ra);
  lm_gen_free(a);
  lm_gen_free(b);
  free(p);
}

/* ---- bad input ------------------------------------------------------------------------------- */

static void t_bad_input(void **st) {
  fx *f = *st;
  lm_gen_opts o = greedy_opts();
  lm_gen *g = session(f, &o);
  int32_t id, bad[] = {2, 64};
  assert_int_equal(lm_gen_step(g, &id), LM_ERR_STATE);
  assert_int_equal(lm_gen_append(g, NULL, 0), LM_ERR_STATE);
  assert_int_equal(lm_gen_append(g, bad, 2), LM_ERR_INVALID);
  assert_non_null(strstr(lm_errmsg(), "outside the vocabulary"));
  assert_int_equal(lm_gen_sync(g, bad, 0, NULL), LM_ERR_INVALID);
  assert_int_equal(lm_gen_kv_len(g), 0);
  lm_gen_free(g);
  lm_gen_free(NULL);

  lm_gen *none = NULL;
  o = greedy_opts();
  lm_sampling_add_bias(&o.sampling, 64, 1);
  assert_int_equal(lm_gen_create(f->m, f->be, f->tok, &o, &none), LM_ERR_INVALID);
  assert_non_null(strstr(lm_errmsg(), "outside the vocabulary"));
  lm_sampling_clear(&o.sampling);
  o = greedy_opts();
  const char *empty[] = {""}, *broken[] = {"\xC3("};
  o.stop_strings = empty;
  o.n_stop_strings = 1;
  assert_int_equal(lm_gen_create(f->m, f->be, f->tok, &o, &none), LM_ERR_INVALID);
  o.stop_strings = broken;
  assert_int_equal(lm_gen_create(f->m, f->be, f->tok, &o, &none), LM_ERR_INVALID);
  assert_int_equal(lm_gen_create(f->m, f->be, NULL, &o, &none),
                   LM_ERR_INVALID); /* needs a tokenizer */
  o = greedy_opts();
  o.sampling.top_p = 2;
  assert_int_equal(lm_gen_create(f->m, f->be, f->tok, &o, &none), LM_ERR_INVALID);
  assert_null(none);
  /* the context limit */
  o = greedy_opts();
  o.max_context = 4;
  g = session(f, &o);
  int32_t five[] = {2, 20, 21, 22, 23};
  assert_int_equal(lm_gen_append(g, five, 5), LM_ERR_INVALID);
  assert_int_equal(lm_gen_append(g, five, 3), LM_OK);
  assert_int_equal(lm_gen_run(g), LM_OK);
  assert_int_equal(lm_gen_stop_reason(g), LM_GEN_STOP_LENGTH);
  assert_int_equal(lm_gen_get_stats(g).decode_tokens, 1);
  lm_gen_free(g);
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
      cmocka_unit_test(t_stop_id_and_length),  cmocka_unit_test(t_stop_strings),
      cmocka_unit_test(t_append_reuses_cache), cmocka_unit_test(t_seeded),
      cmocka_unit_test(t_bad_input),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
