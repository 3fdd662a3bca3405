/* test_spec.c — speculative decoding with n-gram drafts (lumen.h's `speculative`), CPU backend.
 *
 * The answer must be the one plain decoding gives, token for token: a request with drafts and
 * the same request without them, on one engine, give the same ids and the same finish — greedy
 * and sampled (temperature, top-k, top-p, min-p, repetition penalty, one seed), on the model
 * kinds of the fixtures (PLE + KV sharing, MoE + k_eq_v, 4-bit weights) with plain, sliding
 * (wrapped: windows of 8, answers of 96 tokens), 8- and 4-bit and delayed-quantized caches, at
 * f32 and FAST precision; on the embedded model with text, stop strings and a JSON Schema. The
 * drafts must also be used: rounds that drafted and drafts that were accepted are counted, and a
 * step that accepts k drafts gives k + 1 tokens. Drafts from a draft model (the embedded model's
 * 4-bit copy) give the same answers and, on held-out text, an acceptance of at least half. Plus
 * the n-gram proposer itself and the refusals (an engine without room, a backend without exact
 * rows, an unknown source, a draft model of another vocabulary, "draft" without one). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "engine/spec_ngram.h"
#include "lumen.h"

#define FX LM_SOURCE_DIR "/tests/fixtures"
#define TINY LM_SOURCE_DIR "/models/lumen-tiny-kjv"
#define MAXN 160

/* ---- the proposer ---------------------------------------------------------------------------- */

static void t_ngram(void **st) {
  (void)st;
  int32_t out[8];
  /* the longest suffix that recurs wins, at its latest earlier occurrence */
  const int32_t h[] = {1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 2, 3};
  assert_int_equal(lm_spec_ngram_propose(h, 13, 4, out), 4); /* "2 3" last seen at 6 -> 7 8 5 2 */
  assert_int_equal(out[0], 7);
  assert_int_equal(out[3], 2);
  const int32_t g[] = {4, 1, 2, 3, 5, 6, 1, 2, 3};
  assert_int_equal(lm_spec_ngram_propose(g, 9, 3, out), 3); /* "1 2 3" at 1 -> 5 6 1 */
  assert_int_equal(out[0], 5);
  assert_int_equal(out[2], 1);
  /* no more drafts than what follows the occurrence; none when nothing recurs */
  const int32_t r[] = {5, 6, 7, 5};
  assert_int_equal(lm_spec_ngram_propose(r, 4, 8, out), 3); /* "5" at 0 -> 6 7 5 */
  assert_int_equal(out[2], 5);
  const int32_t u[] = {1, 2, 3, 4};
  assert_int_equal(lm_spec_ngram_propose(u, 4, 8, out), 0);
  assert_int_equal(lm_spec_ngram_propose(u, 1, 8, out), 0);
  assert_int_equal(lm_spec_ngram_propose(r, 4, 0, out), 0);
}

/* ---- plain and speculative answers ----------------------------------------------------------- */

typedef struct answer {
  int32_t ids[MAXN];
  int n;
  lm_finish_kind finish;
  lm_usage u;
  int rounds, drafted_rounds; /* steps (round_start events) and those that drafted */
  int max_tokens_per_step;
} answer;

typedef struct ask {
  const int32_t *ids;
  int64_t n_ids;
  const char *prompt; /* instead of ids */
  const char *schema;
  const char *const *stop;
  int n_stop;
  float temperature;
  int64_t max_tokens;
  int ignore_eos;
} ask;

static void run(lm_engine *e, const ask *a, const char *spec, answer *out);

/* The same request with and without drafts from `source`; returns the drafts accepted. */
static int64_t same_answer_from(lm_engine *e, const ask *a, const char *source, const char *what,
                                answer *q);

static void run(lm_engine *e, const ask *a, const char *spec, answer *out) {
  memset(out, 0, sizeof *out);
  lm_request_options ro;
  lm_request_options_init(&ro);
  ro.ids = a->ids;
  ro.n_ids = a->n_ids;
  ro.prompt = a->prompt;
  ro.json_schema = a->schema;
  ro.stop = a->stop;
  ro.n_stop = a->n_stop;
  ro.has_seed = 1;
  ro.sampling.seed = 1234;
  ro.sampling.temperature = a->temperature;
  if (a->temperature > 0) {
    ro.sampling.top_k = 40;
    ro.sampling.top_p = 0.95f;
    ro.sampling.min_p = 0.02f;
    ro.sampling.repeat_penalty = 1.1f;
  }
  ro.max_tokens = a->max_tokens;
  ro.ignore_eos = a->ignore_eos;
  ro.speculative = spec;
  lm_request *r;
  lm_status s = lm_request_submit(e, &ro, &r);
  if (s) fprintf(stderr, "submit: %s\n", lm_errmsg());
  assert_int_equal(s, LM_OK);
  lm_event ev;
  int in_step = 0;
  while (!lm_request_next(r, -1, &ev) && ev.kind != LM_EVENT_DONE) {
    if (ev.kind != LM_EVENT_TOKEN) continue;
    if (ev.round_start) {
      out->rounds++;
      out->drafted_rounds += ev.n_drafted > 0;
      in_step = 0;
    }
    if (++in_step > out->max_tokens_per_step) out->max_tokens_per_step = in_step;
    if (out->n < MAXN) out->ids[out->n++] = ev.token;
  }
  assert_int_equal(ev.kind, LM_EVENT_DONE);
  if (ev.finish == LM_FIN_ERROR) fprintf(stderr, "error: %s\n", ev.error);
  out->finish = ev.finish;
  out->u = ev.usage;
  lm_request_free(r);
}

/* The same request with and without n-gram drafts: the same answer; returns the drafts accepted. */
static int64_t same_answer(lm_engine *e, const ask *a, const char *what) {
  answer q;
  return same_answer_from(e, a, "ngram", what, &q);
}

static int64_t same_answer_from(lm_engine *e, const ask *a, const char *source, const char *what,
                                answer *out) {
  answer p, q;
  run(e, a, NULL, &p);
  run(e, a, source, &q);
  *out = q;
  printf("%-34s %3d tokens, %3d steps (%3d drafting), drafts %3lld/%3lld accepted, finish %d\n",
         what, q.n, q.rounds, q.drafted_rounds, (long long)q.u.accepted_tokens,
         (long long)q.u.drafted_tokens, (int)q.finish);
  assert_int_equal(p.n, q.n);
  assert_memory_equal(p.ids, q.ids, (size_t)p.n * sizeof *p.ids);
  assert_int_equal(p.finish, q.finish);
  assert_int_equal(p.u.completion_tokens, q.u.completion_tokens);
  /* plain decoding drafts nothing; the speculating answer's steps add up */
  assert_int_equal(p.u.drafted_tokens, 0);
  assert_int_equal(p.rounds, 0);
  assert_int_equal(q.u.decode_steps, q.rounds);
  /* a step gives its accepted drafts + one token, but the last may end on an accepted draft */
  int64_t given = q.u.decode_steps + q.u.accepted_tokens;
  assert_true(given == q.n - 1 || (given == q.n && q.finish != LM_FIN_LENGTH));
  assert_true(q.u.accepted_tokens <= q.u.drafted_tokens);
  assert_true(q.max_tokens_per_step <= 7); /* the CPU verifies steps of up to 7 tokens */
  return q.u.accepted_tokens;
}

static lm_engine *engine_with(lm_checkpoint *ck, const char *precision, const char *kv_quant,
                              int64_t quant_start, const char *draft) {
  lm_engine_options eo;
  lm_engine_options_init(&eo);
  eo.draft_model = draft;
  eo.backend = "cpu";
  eo.precision = precision;
  eo.threads = 2;
  eo.kv_budget = -1;
  eo.prefix_cache = 0;
  eo.kv_quant = kv_quant;
  eo.kv_group = 32;
  eo.kv_quant_start = quant_start;
  eo.speculative_tokens = 6;
  lm_engine *e;
  lm_status s = lm_engine_create(ck, &eo, &e);
  if (s) fprintf(stderr, "engine: %s\n", lm_errmsg());
  assert_int_equal(s, LM_OK);
  return e;
}

static lm_engine *engine(lm_checkpoint *ck, const char *precision, const char *kv_quant,
                         int64_t quant_start) {
  return engine_with(ck, precision, kv_quant, quant_start, NULL);
}

static int read_ids(const char *dir, int32_t *ids, int cap) {
  char path[600];
  snprintf(path, sizeof path, "%s/ids.txt", dir);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  int n = 0;
  while (n < cap && fscanf(f, "%d,", &ids[n]) == 1)
    n++;
  fclose(f);
  return n;
}

/* A fixture model: greedy and sampled, under each cache plan and precision (the quantized
 * plans where the head dims take groups of 32). */
static void fixture_model(const char *name, int quant_kv) {
  char dir[512];
  snprintf(dir, sizeof dir, FX "/%s", name);
  int32_t ids[64];
  int n = read_ids(dir, ids, 64);
  lm_checkpoint *ck;
  assert_int_equal(lm_checkpoint_open(dir, &ck), LM_OK);
  static const struct {
    const char *precision, *kv;
    int64_t start;
  } plans[] = {
      {"f32", "off", 0}, {"fast", "off", 0}, {"f32", "8", 0}, {"f32", "4", 0}, {"f32", "8", 60}};
  int64_t accepted = 0;
  for (size_t i = 0; i < (quant_kv ? sizeof plans / sizeof *plans : 2); i++) {
    lm_engine *e = engine(ck, plans[i].precision, plans[i].kv, plans[i].start);
    char what[96];
    ask a = {.ids = ids, .n_ids = n, .max_tokens = 96, .ignore_eos = 1};
    snprintf(what, sizeof what, "%s %s kv %s/%lld greedy", name, plans[i].precision, plans[i].kv,
             (long long)plans[i].start);
    accepted += same_answer(e, &a, what);
    a.temperature = 0.9f;
    snprintf(what, sizeof what, "%s %s kv %s/%lld sampled", name, plans[i].precision, plans[i].kv,
             (long long)plans[i].start);
    accepted += same_answer(e, &a, what);
    lm_engine_free(e);
  }
  assert_true(accepted > 0);
  lm_checkpoint_free(ck);
}

static void t_e4b_like(void **st) { /* PLE, KV sharing */
  (void)st;
  fixture_model("e4b_like", 1);
}

static void t_12b_like(void **st) { /* k_eq_v, head dims 32 and 64 */
  (void)st;
  fixture_model("12b_like", 1);
}

static void t_moe_like(void **st) { /* MoE, k_eq_v */
  (void)st;
  fixture_model("moe_like", 0);
}

static void t_quantized_weights(void **st) { /* MLX 4-bit */
  (void)st;
  fixture_model("e2b_like_mlx4", 0);
}

/* The embedded model: text that repeats (the drafts are accepted often), stop strings, a stop
 * id, a JSON Schema. */
static void t_embedded(void **st) {
  (void)st;
  lm_checkpoint *ck;
  assert_int_equal(lm_checkpoint_open(TINY, &ck), LM_OK);
  lm_engine *e = engine(ck, "f32", "off", 0);
  const char *verse = "And God said, Let there be light: and there was light. And God saw the "
                      "light, that it was good: and God divided the light from the darkness. "
                      "And God said, Let there be";
  ask a = {.prompt = verse, .max_tokens = 100, .ignore_eos = 1};
  assert_true(same_answer(e, &a, "embedded greedy, repeated verse") > 10);
  a.temperature = 0.7f;
  same_answer(e, &a, "embedded sampled");
  const char *stops[] = {"children", "Babylon"};
  ask b = {.prompt = verse, .max_tokens = 100, .stop = stops, .n_stop = 2};
  same_answer(e, &b, "embedded, stop strings");
  ask c = {.prompt = "In the beginning", .max_tokens = 150};
  same_answer(e, &c, "embedded, until a stop id");
  ask d = {.prompt = verse,
           .max_tokens = 60,
           .schema = "{\"type\":\"object\",\"properties\":{\"light\":{\"type\":\"string\"}},"
                     "\"required\":[\"light\"]}"};
  same_answer(e, &d, "embedded, JSON Schema");
  for (int64_t m = 1; m <= 9; m++) { /* every round boundary against max_tokens */
    ask f = {.prompt = verse, .max_tokens = m, .ignore_eos = 1};
    answer q;
    run(e, &f, "ngram", &q);
    assert_int_equal(q.n, m);
    assert_int_equal(q.finish, LM_FIN_LENGTH);
  }
  lm_engine_free(e);
  lm_checkpoint_free(ck);
}

/* The embedded model with its 4-bit copy as the draft model: the same answers, greedy and
 * sampled, with wrapped rings on both; on a held-out chapter (the model's own greedy text) most
 * drafts are accepted (the bar: half). A draft of another vocabulary is refused. */
static void t_draft_model(void **st) {
  (void)st;
  lm_checkpoint *ck;
  assert_int_equal(lm_checkpoint_open(TINY, &ck), LM_OK);
  lm_engine *e = engine_with(ck, "f32", "off", 0, TINY "-4bit");
  int32_t ids[96];
  int n = read_ids(FX "/lumen-tiny-kjv", ids, 48); /* a held-out chapter */
  ask a = {.ids = ids, .n_ids = n, .max_tokens = 140, .ignore_eos = 1};
  answer q;
  same_answer_from(e, &a, "draft", "embedded greedy, 4-bit draft", &q);
  double rate = (double)q.u.accepted_tokens / (double)q.u.drafted_tokens;
  printf("held-out acceptance %.2f, %.2f tokens per step\n", rate,
         (double)(q.n - 1) / (double)q.u.decode_steps);
  assert_true(rate >= 0.5);
  a.temperature = 0.8f;
  same_answer_from(e, &a, "draft", "embedded sampled, 4-bit draft", &q);
  ask c = {.prompt = "In the beginning", .max_tokens = 100};
  same_answer_from(e, &c, "draft", "embedded, draft, until a stop id", &q);
  lm_engine_free(e);
  lm_engine_options eo;
  lm_engine_options_init(&eo);
  eo.backend = "cpu";
  eo.kv_budget = -1;
  eo.speculative_tokens = 4;
  eo.draft_model = FX "/e4b_like"; /* 512 tokens */
  assert_int_equal(lm_engine_create(ck, &eo, &e), LM_ERR_INVALID);
  printf("other vocabulary: %s\n", lm_errmsg());
  assert_non_null(strstr(lm_errmsg(), "e4b_like"));
  eo.draft_model = NULL; /* and "draft" without a draft model */
  assert_int_equal(lm_engine_create(ck, &eo, &e), LM_OK);
  lm_request_options ro;
  lm_request_options_init(&ro);
  ro.prompt = "In the beginning";
  ro.speculative = "draft";
  lm_request *r;
  assert_int_equal(lm_request_create(e, &ro, &r), LM_ERR_INVALID);
  printf("no draft model: %s\n", lm_errmsg());
  lm_engine_free(e);
  lm_checkpoint_free(ck);
}

/* What is refused, and how. */
static void t_refused(void **st) {
  (void)st;
  lm_checkpoint *ck;
  assert_int_equal(lm_checkpoint_open(TINY, &ck), LM_OK);
  lm_engine_options eo;
  lm_engine_options_init(&eo);
  eo.backend = "cpu";
  eo.kv_budget = -1;
  eo.speculative_tokens = LM_SPEC_MAX_TOKENS + 1;
  lm_engine *e;
  assert_int_equal(lm_engine_create(ck, &eo, &e), LM_ERR_INVALID);
  eo.speculative_tokens = 0;
  assert_int_equal(lm_engine_create(ck, &eo, &e), LM_OK);
  lm_request_options ro;
  lm_request_options_init(&ro);
  ro.prompt = "In the beginning";
  ro.speculative = "ngram";
  lm_request *r;
  assert_int_equal(lm_request_create(e, &ro, &r), LM_ERR_INVALID);
  printf("no room: %s\n", lm_errmsg());
  assert_non_null(strstr(lm_errmsg(), "speculative"));
  lm_engine_free(e);
  eo.speculative_tokens = 4;
  assert_int_equal(lm_engine_create(ck, &eo, &e), LM_OK);
  ro.speculative = "lookahead";
  assert_int_equal(lm_request_create(e, &ro, &r), LM_ERR_INVALID);
  printf("unknown: %s\n", lm_errmsg());
  ro.speculative = "ngram";
  ro.speculative_tokens = 5;
  assert_int_equal(lm_request_create(e, &ro, &r), LM_ERR_INVALID);
  ro.speculative_tokens = 3;
  assert_int_equal(lm_request_create(e, &ro, &r), LM_OK);
  lm_request_free(r);
  lm_engine_free(e);
  eo.precision = "bf16"; /* not checked for row-exact steps */
  assert_int_equal(lm_engine_create(ck, &eo, &e), LM_OK);
  ro.speculative_tokens = 0;
  assert_int_equal(lm_request_create(e, &ro, &r), LM_ERR_UNSUPPORTED);
  printf("bf16: %s\n", lm_errmsg());
  lm_engine_free(e);
  lm_checkpoint_free(ck);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(t_ngram),
      cmocka_unit_test(t_e4b_like),
      cmocka_unit_test(t_12b_like),
      cmocka_unit_test(t_moe_like),
      cmocka_unit_test(t_quantized_weights),
      cmocka_unit_test(t_embedded),
      cmocka_unit_test(t_draft_model),
      cmocka_unit_test(t_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
