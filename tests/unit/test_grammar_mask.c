/* test_grammar_mask.c — the token-mask machinery against brute force on a 4096-piece synthetic
 * vocabulary (the embedded model's size; byte-fallback pieces, words with leading spaces,
 * multi-byte UTF-8): every cache key depth, the memoized and the plain walk, the memo's fallback
 * when it fills up, a cache so small it evicts on every insert, and matchers on several threads
 * sharing one grammar. Then a benchmark over a 262144-piece vocabulary (Gemma's size) that
 * reports microseconds per fill_mask, cold and warm, on stderr (smaller under sanitizers). */
#include <pthread.h>
#include <time.h>

#include "grammar_synth_vocab.h"
#include "grammar_testlib.h"

static const char *const k_schema =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":8},"
    "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":150},\"email\":{\"type\":\"string\","
    "\"format\":\"email\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},"
    "\"maxItems\":3},\"kind\":{\"enum\":[\"a\",\"bc\",null]},\"address\":{\"type\":\"object\","
    "\"properties\":{\"street\":{\"type\":\"string\"},\"zip\":{\"type\":\"string\",\"pattern\":"
    "\"^[0-9]{5}$\"}},\"required\":[\"street\"]}},\"required\":[\"name\",\"age\"]}";

static const char *const k_gbnf = "root ::= (item \" \"?){1,6}\n"
                                  "item ::= [a-z]+ | \"(\" root \")\" | [0-9]{1,3} | [^ -~]+\n";

static lm_grammar *schema(const char *s) {
  lm_grammar *g = NULL;
  if (lm_grammar_from_json_schema(s, strlen(s), &g) != LM_OK) fail_msg("%s", lm_errmsg());
  return g;
}

/* Walks with every mask checked, under the given matcher settings. */
typedef struct cfg {
  uint32_t depth;
  int no_dfa;
  uint32_t dfa_max_states;
  uint32_t max_uncertain; /* 0: the default */
} cfg;

static void walk_checked(const lm_grammar *g, const lm_grammar_vocab *v, cfg c, uint64_t seed,
                         int steps) {
  lm_matcher *m = NULL;
  assert_int_equal(lm_matcher_create(g, v, &m), LM_OK);
  lm_matcher_set_key_depth(m, c.depth);
  m->no_dfa = c.no_dfa;
  m->dfa.max_states = c.dfa_max_states;
  if (c.max_uncertain) m->max_uncertain = c.max_uncertain;
  size_t nw = ((size_t)v->n + 31) / 32;
  uint32_t *mask = calloc(nw, 4);
  int32_t *ok = calloc((size_t)v->n, sizeof *ok);
  lm_rng rng = {seed, 0};
  for (int s = 0; s < steps && !lm_matcher_finished(m); s++) {
    gt_check_mask(m);
    assert_int_equal(lm_matcher_fill_mask(m, mask), LM_OK);
    int n = 0;
    for (int32_t t = 0; t < v->n; t++)
      if ((mask[t >> 5] >> (t & 31)) & 1) ok[n++] = t;
    if (n == 0) break;
    /* Prefer closing tokens half the time, so the walk gets through the structure. */
    int32_t pick = ok[lm_rng_next(&rng) % (uint64_t)n];
    if (lm_rng_next(&rng) % 2)
      for (int k = 0; k < n; k++)
        if (memchr(v->bytes + v->off[ok[k]], '"', v->len[ok[k]])) pick = ok[k];
    assert_int_equal(lm_matcher_accept(m, pick), LM_OK);
  }
  free(mask);
  free(ok);
  lm_matcher_free(m);
}

static void t_brute_force_depths(void **state) {
  (void)state;
  lm_grammar_vocab *v = sv_make(4096, 7);
  lm_grammar *gs[2] = {schema(k_schema), gt_gbnf(k_gbnf)};
  /* key depths; the plain walk; a memo so small it falls back; keys deepened past 3 uncertain */
  const cfg cfgs[] = {{1, 0, 0, 0}, {2, 0, 0, 0}, {3, 0, 0, 0}, {8, 0, 0, 0},
                      {2, 1, 0, 0}, {1, 0, 3, 0}, {1, 0, 0, 3}};
  for (int gi = 0; gi < 2; gi++)
    for (size_t c = 0; c < sizeof cfgs / sizeof *cfgs; c++)
      walk_checked(gs[gi], v, cfgs[c], 11 + c * 101 + (uint64_t)gi, 40);
  lm_grammar_free(gs[0]);
  lm_grammar_free(gs[1]);
  lm_grammar_vocab_free(v);
}

/* A cache too small for one mask: every fill computes, evicts, and stays right. */
static void t_tiny_cache(void **state) {
  (void)state;
  lm_grammar_vocab *v = sv_make(4096, 9);
  lm_grammar *g = schema(k_schema);
  lm_grammar_set_cache_limit(g, 100); /* less than one mask: nothing is kept */
  walk_checked(g, v, (cfg){2, 0, 0, 0}, 5, 30);
  lm_gcache_stats st = lm_gcache_get_stats(g->caches[0]);
  assert_int_equal(st.entries, 0);
  assert_true(st.misses > 0);
  lm_grammar *g2 = schema(k_schema); /* a few entries: evictions with entries in use */
  walk_checked(g2, v, (cfg){2, 0, 0, 0}, 6, 10);
  lm_grammar_set_cache_limit(g2, 8 * 1024);
  walk_checked(g2, v, (cfg){2, 0, 0, 0}, 6, 30);
  walk_checked(g2, v, (cfg){2, 0, 0, 0}, 6, 30);
  st = lm_gcache_get_stats(g2->caches[0]);
  assert_true(st.evictions > 0);
  assert_true(st.bytes <= 8 * 1024);
  lm_grammar_free(g);
  lm_grammar_free(g2);
  lm_grammar_vocab_free(v);
}

typedef struct thr {
  const lm_grammar *g;
  const lm_grammar_vocab *v;
  uint64_t seed;
} thr;

static void *thread_main(void *arg) {
  thr *t = arg;
  walk_checked(t->g, t->v, (cfg){2, 0, 0, 0}, t->seed, 25);
  return NULL;
}

/* Matchers on four threads share the grammar and its cache (and a cache small enough to evict
 * while others hold entries). */
static void t_threads(void **state) {
  (void)state;
  lm_grammar_vocab *v = sv_make(4096, 13);
  lm_grammar *g = schema(k_schema);
  lm_grammar_set_cache_limit(g, 256 * 1024);
  pthread_t th[4];
  thr args[4];
  for (int i = 0; i < 4; i++) {
    args[i] = (thr){g, v, 100 + (uint64_t)i};
    assert_int_equal(pthread_create(&th[i], NULL, thread_main, &args[i]), 0);
  }
  for (int i = 0; i < 4; i++)
    pthread_join(th[i], NULL);
  lm_grammar_free(g);
  lm_grammar_vocab_free(v);
}

/* Two vocabularies on one grammar get two caches; masks stay per vocabulary. */
static void t_two_vocabs(void **state) {
  (void)state;
  lm_grammar_vocab *a = sv_make(4096, 21), *b = gt_json_vocab();
  lm_grammar *g = schema(k_schema);
  walk_checked(g, a, (cfg){2, 0, 0, 0}, 1, 15);
  walk_checked(g, b, (cfg){2, 0, 0, 0}, 1, 15);
  walk_checked(g, a, (cfg){2, 0, 0, 0}, 2, 15);
  assert_int_equal(g->n_caches, 2);
  lm_grammar_free(g);
  lm_grammar_vocab_free(a);
  lm_grammar_vocab_free(b);
}

/* ---- benchmark ---------------------------------------------------------------------------------
 */

#if defined(__SANITIZE_ADDRESS__)
#define BENCH_VOCAB 32768
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define BENCH_VOCAB 32768
#endif
#endif
#ifndef BENCH_VOCAB
#define BENCH_VOCAB 262144
#endif

static const char *const k_bench_schema =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":"
    "\"integer\",\"minimum\":0,\"maximum\":150},\"email\":{\"type\":\"string\",\"format\":"
    "\"email\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"maxItems\":5},"
    "\"address\":{\"type\":\"object\",\"properties\":{\"street\":{\"type\":\"string\"},\"city\":{"
    "\"type\":\"string\"},\"zip\":{\"type\":\"string\",\"pattern\":\"^[0-9]{5}$\"}},\"required\":["
    "\"street\",\"city\"]},\"active\":{\"type\":\"boolean\"}},\"required\":[\"name\",\"age\","
    "\"tags\",\"address\"]}";

static const char *const k_docs[3] = {
    "{\"name\": \"Alice Johnson\", \"age\": 34, \"email\": \"alice@example.com\", \"tags\": "
    "[\"engineer\", \"hiker\", \"cook\"], \"address\": {\"street\": \"12 Main Street\", \"city\": "
    "\"Springfield\", \"zip\": \"12345\"}, \"active\": true}",
    "{\"name\":\"Bob\",\"age\":7,\"tags\":[],\"address\":{\"street\":\"Rue de la Paix 5, apt. "
    "12\",\"city\":\"Paris\"}}",
    "{\n  \"name\": \"Chen Wei\",\n  \"age\": 150,\n  \"email\": \"chen.wei@mail.example.cn\",\n  "
    "\"tags\": [\"a\", \"b\", \"c\", \"d\", \"e\"],\n  \"address\": {\n    \"street\": \"\\u4eac "
    "88\",\n    \"city\": \"北京\",\n    \"zip\": \"10000\"\n  },\n  \"active\": false\n}"};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct run_stats {
  int steps;
  double total, max;
} run_stats;

/* Forces doc through a fresh matcher, the longest allowed piece at each step, timing every fill;
 * every few steps the mask is checked against brute force. */
static run_stats force_doc(const lm_grammar *g, const lm_grammar_vocab *v, const char *doc,
                           int brute_every) {
  lm_matcher *m = NULL;
  assert_int_equal(lm_matcher_create(g, v, &m), LM_OK);
  uint32_t *mask = calloc(((size_t)v->n + 31) / 32, 4);
  run_stats r = {0, 0, 0};
  size_t pos = 0, n = strlen(doc);
  while (pos < n) {
    double t0 = now_s();
    assert_int_equal(lm_matcher_fill_mask(m, mask), LM_OK);
    double dt = now_s() - t0;
    r.total += dt;
    if (dt > r.max) r.max = dt;
    if (brute_every && r.steps % brute_every == 0) gt_check_mask(m);
    size_t len = 0;
    int32_t t = -1;
    for (size_t l = n - pos; l > 0 && t < 0;) {
      size_t got;
      int32_t c = sv_longest(v, doc + pos, l, &got);
      if (c < 0) break;
      if ((mask[c >> 5] >> (c & 31)) & 1)
        t = c, len = got;
      else
        l = got - 1;
    }
    if (t < 0) fail_msg("no allowed token at %zu: %s", pos, doc + pos);
    assert_int_equal(lm_matcher_accept(m, t), LM_OK);
    pos += len;
    r.steps++;
  }
  assert_true(lm_matcher_complete(m));
  free(mask);
  lm_matcher_free(m);
  return r;
}

static void t_bench(void **state) {
  (void)state;
  double t0 = now_s();
  lm_grammar_vocab *v = sv_make(BENCH_VOCAB, 42);
  double t_vocab = now_s() - t0;
  t0 = now_s();
  lm_grammar *g = schema(k_bench_schema);
  double t_grammar = now_s() - t0;
  fprintf(stderr,
          "grammar bench: vocabulary of %d pieces (%u trie nodes) built in %.0f ms; "
          "schema compiled in %.2f ms\n",
          v->n, v->n_nodes, t_vocab * 1e3, t_grammar * 1e3);
  static const char *const what[] = {"document 1, cold cache", "document 1, warm cache",
                                     "document 2, same grammar",
                                     "document 3 (pretty), same grammar"};
  const char *docs[4] = {k_docs[0], k_docs[0], k_docs[1], k_docs[2]};
  for (int i = 0; i < 4; i++) {
    run_stats r = force_doc(g, v, docs[i], BENCH_VOCAB <= 32768 ? 7 : 0);
    fprintf(stderr, "grammar bench: %-34s %3d fills: mean %8.1f us, max %8.1f us\n", what[i],
            r.steps, r.total / r.steps * 1e6, r.max * 1e6);
  }
  /* 64 streams at once, warm: one fill each, the cost of one decode step's masks. */
  lm_matcher *ms[64];
  uint32_t *mask = calloc(((size_t)v->n + 31) / 32, 4);
  for (int i = 0; i < 64; i++) {
    assert_int_equal(lm_matcher_create(g, v, &ms[i]), LM_OK);
    size_t k = (size_t)(i * 3) % 40;
    assert_int_equal(lm_matcher_accept_bytes(ms[i], k_docs[0], k), LM_OK);
    assert_int_equal(lm_matcher_fill_mask(ms[i], mask), LM_OK);
  }
  t0 = now_s();
  for (int rep = 0; rep < 10; rep++)
    for (int i = 0; i < 64; i++)
      assert_int_equal(lm_matcher_fill_mask(ms[i], mask), LM_OK);
  fprintf(stderr, "grammar bench: 64 streams, warm: %.1f us per step for all 64 masks\n",
          (now_s() - t0) / 10 * 1e6);
  for (int i = 0; i < 64; i++)
    lm_matcher_free(ms[i]);
  free(mask);
  lm_grammar_free(g);
  lm_grammar_vocab_free(v);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(t_brute_force_depths),
      cmocka_unit_test(t_tiny_cache),
      cmocka_unit_test(t_threads),
      cmocka_unit_test(t_two_vocabs),
      cmocka_unit_test(t_bench),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
