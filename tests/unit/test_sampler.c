/* test_sampler.c — each logits processor on small hand-made logits with exact expected results,
 * the processor order, greedy ties, seeded reproducibility, the distribution of temperature
 * sampling over many draws, the top-p shortcut against a brute-force reference, parameter
 * validation, and generation_config.json parsing (good files, a table of bad ones, stop ids). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/rng.h"
#include "base/status.h"
#include "sample/gen_config.h"
#include "sample/sampler.h"

static lm_sampler *make(const lm_sampling *p) {
  lm_sampler *s = NULL;
  assert_int_equal(lm_sampler_create(p, &s), LM_OK);
  return s;
}

static lm_sampling greedy(void) {
  lm_sampling p;
  lm_sampling_init(&p);
  p.temperature = 0;
  return p;
}

/* ---- greedy ---------------------------------------------------------------------------------- */

static void t_greedy(void **st) {
  (void)st;
  lm_sampling p = greedy();
  lm_sampler *s = make(&p);
  float a[] = {1, 3, 3, 2};
  assert_int_equal(lm_sampler_sample(s, a, 4, NULL, 0), 1); /* lowest id on ties */
  float b[] = {NAN, -1, NAN, -2};
  assert_int_equal(lm_sampler_sample(s, b, 4, NULL, 0), 1); /* NaN is never chosen */
  float c[] = {-INFINITY, -INFINITY};
  assert_int_equal(lm_sampler_sample(s, c, 2, NULL, 0), -1);
  assert_non_null(strstr(lm_errmsg(), "no token has a finite logit"));
  float d[] = {0};
  assert_int_equal(lm_sampler_sample(s, d, 0, NULL, 0), -1);
  lm_sampler_free(s);
}

/* ---- 1-4: penalties, bias, suppression (greedy leaves the processed logits in place) ----------
 */

static void t_repeat_penalty(void **st) {
  (void)st;
  lm_sampling p = greedy();
  p.repeat_penalty = 2;
  p.repeat_last_n = -1;
  lm_sampler *s = make(&p);
  float x[] = {2, -2, 1, 0.5f};
  int32_t h[] = {0, 1, 0, 99,
                 -3}; /* repeated ids count once; ids outside the vocabulary are ignored */
  assert_int_equal(lm_sampler_sample(s, x, 4, h, 5), 0);
  float want[] = {1, -4, 1, 0.5f};
  assert_memory_equal(x, want, sizeof want);
  lm_sampler_free(s);
  /* a window of 1: only the last id */
  p.repeat_last_n = 1;
  s = make(&p);
  float y[] = {2, -2, 1, 0.5f};
  int32_t h2[] = {0, 1};
  lm_sampler_sample(s, y, 4, h2, 2);
  float want2[] = {2, -4, 1, 0.5f};
  assert_memory_equal(y, want2, sizeof want2);
  lm_sampler_free(s);
  /* window 0: off */
  p.repeat_last_n = 0;
  s = make(&p);
  float z[] = {2, -2};
  lm_sampler_sample(s, z, 2, h2, 2);
  assert_true(z[0] == 2 && z[1] == -2);
  lm_sampler_free(s);
}

static void t_presence_frequency(void **st) {
  (void)st;
  lm_sampling p = greedy();
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  p.penalty_last_n = -1;
  lm_sampler *s = make(&p);
  float x[] = {1, 1, 3, 2};
  int32_t h[] = {2, 2, 3};
  assert_int_equal(lm_sampler_sample(s, x, 4, h, 3), 2);
  float want[] = {1, 1, 2, 1.25f}; /* 3 - (2*0.25 + 0.5), 2 - (0.25 + 0.5) */
  assert_memory_equal(x, want, sizeof want);
  lm_sampler_free(s);
  /* window of 2: id 2 counted once */
  p.penalty_last_n = 2;
  s = make(&p);
  float y[] = {1, 1, 3, 2};
  lm_sampler_sample(s, y, 4, h, 3);
  float want2[] = {1, 1, 2.25f, 1.25f};
  assert_memory_equal(y, want2, sizeof want2);
  lm_sampler_free(s);
}

static void t_bias_suppress(void **st) {
  (void)st;
  lm_sampling p = greedy();
  assert_int_equal(lm_sampling_add_bias(&p, 1, 5), LM_OK);
  assert_int_equal(lm_sampling_add_bias(&p, 1, 0.5f), LM_OK); /* repeated ids add up */
  assert_int_equal(lm_sampling_add_bias(&p, 3, -INFINITY), LM_OK);
  assert_int_equal(lm_sampling_add_bias(&p, 500, 1), LM_OK); /* outside this vocabulary: ignored */
  assert_int_equal(lm_sampling_add_suppress(&p, 0), LM_OK);
  lm_sampler *s = make(&p);
  float x[] = {10, 1, 2, 20};
  assert_int_equal(lm_sampler_sample(s, x, 4, NULL, 0), 1);
  assert_true(x[0] == -INFINITY && x[1] == 6.5f && x[2] == 2 && x[3] == -INFINITY);
  lm_sampler_free(s);
  /* the order: penalties before bias (the bias is not divided by the penalty) */
  lm_sampling_clear(&p);
  p = greedy();
  p.repeat_penalty = 2;
  lm_sampling_add_bias(&p, 0, 4);
  s = make(&p);
  float y[] = {2, 0};
  int32_t h[] = {0};
  lm_sampler_sample(s, y, 2, h, 1);
  assert_true(y[0] == 5); /* 2/2 + 4, not (2+4)/2 */
  lm_sampler_free(s);
  lm_sampling_clear(&p);
}

/* ---- 6-9: truncations, checked through the set of ids that many draws produce ---------------- */

/* Draws n times (seeds 0..n-1) and returns a bit mask of the ids seen (vocab <= 32). */
static uint32_t seen_ids(lm_sampling p, const float *logits, int vocab, int n) {
  uint32_t mask = 0;
  float x[32];
  for (int i = 0; i < n; i++) {
    p.seed = (uint64_t)i;
    lm_sampler *s = make(&p);
    memcpy(x, logits, (size_t)vocab * sizeof *x);
    int32_t id = lm_sampler_sample(s, x, vocab, NULL, 0);
    assert_true(id >= 0 && id < vocab);
    mask |= 1u << id;
    lm_sampler_free(s);
  }
  return mask;
}

static void t_truncations(void **st) {
  (void)st;
  lm_sampling p;
  lm_sampling_init(&p);
  float q[] = {logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f)};
  assert_int_equal(seen_ids(p, q, 4, 2000), 0xF); /* nothing truncated */
  /* top-k, exactly k with ties broken by the lower id */
  float t[] = {0, 5, 5, 1};
  p.top_k = 1;
  assert_int_equal(seen_ids(p, t, 4, 300), 1u << 1);
  p.top_k = 2;
  assert_int_equal(seen_ids(p, t, 4, 300), (1u << 1) | (1u << 2));
  p.top_k = 0;
  /* top-p: a token stays while the mass before it is < top_p */
  p.top_p = 0.4f;
  assert_int_equal(seen_ids(p, q, 4, 500), 0x1);
  p.top_p = 0.75f;
  assert_int_equal(seen_ids(p, q, 4, 2000), 0x3);
  p.top_p = 0.82f;
  assert_int_equal(seen_ids(p, q, 4, 2000), 0x7);
  /* top-k runs before top-p: after top-3 the mass before the third is 0.8/0.95 > 0.82 */
  p.top_k = 3;
  assert_int_equal(seen_ids(p, q, 4, 2000), 0x3);
  p.top_k = 0;
  /* temperature runs before top-p: T = 2 flattens to {.379,.294,.208,.120}, 0.673 < 0.7 */
  p.top_p = 0.7f;
  assert_int_equal(seen_ids(p, q, 4, 2000), 0x3);
  p.temperature = 2;
  assert_int_equal(seen_ids(p, q, 4, 3000), 0x7);
  p.temperature = 1;
  p.top_p = 1;
  /* min-p: p >= min_p * p_max */
  p.min_p = 0.2f; /* threshold 0.1 */
  assert_int_equal(seen_ids(p, q, 4, 2000), 0x7);
  p.min_p = 0.5f; /* threshold 0.25 */
  assert_int_equal(seen_ids(p, q, 4, 2000), 0x3);
  p.min_p = 1;
  assert_int_equal(seen_ids(p, q, 4, 300), 0x1);
}

/* ---- reproducibility and distribution -------------------------------------------------------- */

static void fill_random(float *x, int n, uint64_t seed) {
  for (int i = 0; i < n; i++)
    x[i] = 6.0f * lm_rng_uniform(seed, 9, (uint64_t)i) - 3.0f;
}

static void draw_seq(lm_sampler *s, int32_t *out, int n) {
  float x[1000];
  for (int i = 0; i < n; i++) {
    fill_random(x, 1000, (uint64_t)i);
    out[i] = lm_sampler_sample(s, x, 1000, out, i);
  }
}

static void t_reproducible(void **st) {
  (void)st;
  lm_sampling p;
  lm_sampling_init(&p);
  p.top_k = 50;
  p.top_p = 0.9f;
  p.repeat_penalty = 1.3f;
  p.seed = 42;
  lm_sampler *a = make(&p), *b = make(&p);
  p.seed = 43;
  lm_sampler *c = make(&p);
  int32_t ra[64], rb[64], rc[64], rr[64];
  draw_seq(a, ra, 64);
  draw_seq(b, rb, 64);
  draw_seq(c, rc, 64);
  assert_memory_equal(ra, rb, sizeof ra);
  assert_memory_not_equal(ra, rc, sizeof ra);
  lm_sampler_reset(a);
  draw_seq(a, rr, 64);
  assert_memory_equal(ra, rr, sizeof ra);
  lm_sampler_free(a);
  lm_sampler_free(b);
  lm_sampler_free(c);
}

/* Temperature sampling over N draws matches softmax(logits / T). Tolerance: 0.005 absolute per
 * id; the standard error of a frequency near 0.5 over 200k draws is 0.0011, so this is > 4 sigma.
 */
static void check_distribution(float temperature, const double *want) {
  lm_sampling p;
  lm_sampling_init(&p);
  p.temperature = temperature;
  p.seed = 7;
  lm_sampler *s = make(&p);
  enum { N = 200000 };
  int count[4] = {0};
  for (int i = 0; i < N; i++) {
    float x[] = {0, logf(2), logf(3), logf(4)};
    int32_t id = lm_sampler_sample(s, x, 4, NULL, 0);
    assert_true(id >= 0 && id < 4);
    count[id]++;
  }
  for (int i = 0; i < 4; i++) {
    double f = (double)count[i] / N;
    if (fabs(f - want[i]) > 0.005)
      fprintf(stderr, "T=%g id %d: %.4f, want %.4f\n", temperature, i, f, want[i]);
    assert_true(fabs(f - want[i]) <= 0.005);
  }
  lm_sampler_free(s);
}

static void t_distribution(void **st) {
  (void)st;
  const double t1[] = {0.1, 0.2, 0.3, 0.4};
  check_distribution(1.0f, t1);
  const double t05[] = {1 / 30.0, 4 / 30.0, 9 / 30.0, 16 / 30.0}; /* p^(1/T) */
  check_distribution(0.5f, t05);
}

/* ---- the top-p shortcut against a brute-force reference of the same draw --------------------- */

static int cmp_desc(const void *pa, const void *pb) {
  const float *a = pa, *b = pb; /* {logit, id} pairs */
  if (a[0] != b[0]) return a[0] > b[0] ? -1 : 1;
  return a[1] < b[1] ? -1 : a[1] > b[1];
}

static int cmp_id_pair(const void *pa, const void *pb) {
  const float *a = pa, *b = pb;
  return (a[1] > b[1]) - (a[1] < b[1]);
}

/* The whole pipeline (temperature, top-p, the draw in id order) written the slow way: sort
 * everything, weights expf(l - max) summed in double (sampler.c's definition). */
static int32_t reference_top_p(const float *logits, int n, float temperature, float top_p,
                               uint64_t seed, uint64_t counter) {
  float(*c)[2] = malloc((size_t)n * sizeof *c);
  for (int i = 0; i < n; i++) {
    c[i][0] = logits[i] * (1.0f / temperature);
    c[i][1] = (float)i;
  }
  qsort(c, (size_t)n, sizeof *c, cmp_desc);
  float m = c[0][0];
  double z = 0, cum = 0;
  for (int i = 0; i < n; i++)
    z += expf(c[i][0] - m);
  int k = n;
  for (int i = 0; i < n; i++) {
    if (cum >= (double)top_p * z) {
      k = i > 0 ? i : 1;
      break;
    }
    cum += expf(c[i][0] - m);
  }
  qsort(c, (size_t)k, sizeof *c, cmp_id_pair);
  double zk = 0;
  for (int i = 0; i < k; i++)
    zk += expf(c[i][0] - m);
  double u = (double)lm_rng_uniform(seed, 0, counter) * zk, acc = 0;
  int32_t id = (int32_t)c[k - 1][1];
  for (int i = 0; i < k; i++) {
    acc += expf(c[i][0] - m);
    if (u < acc) {
      id = (int32_t)c[i][1];
      break;
    }
  }
  free(c);
  return id;
}

static void t_top_p_shortcut(void **st) {
  (void)st;
  enum { V = 5000 };
  static float x[V], y[V];
  lm_sampling p;
  lm_sampling_init(&p);
  p.temperature = 0.8f;
  p.top_p = 0.9f;
  p.seed = 11;
  lm_sampler *s = make(&p);
  for (int i = 0; i < 200; i++) {
    fill_random(x, V, 100 + (uint64_t)i);
    for (int j = 0; j < V; j++)
      x[j] *= 1 + (float)(i % 5); /* from flat to peaked */
    memcpy(y, x, sizeof x);
    int32_t want = reference_top_p(y, V, p.temperature, p.top_p, p.seed, (uint64_t)i);
    assert_int_equal(lm_sampler_sample(s, x, V, NULL, 0), want);
  }
  lm_sampler_free(s);
}

/* ---- validation ------------------------------------------------------------------------------ */

static void t_validate(void **st) {
  (void)st;
  lm_sampling p;
  lm_sampling_init(&p);
  assert_int_equal(lm_sampling_validate(&p), LM_OK);
  const char *needle[] = {
      "temperature", "temperature", "top_k",          "top_p",          "top_p",
      "min_p",       "min_p",       "repeat_penalty", "repeat_penalty", "penalties must be finite",
      "windows",     "windows"};
  for (int i = 0; i < (int)(sizeof needle / sizeof *needle); i++) {
    lm_sampling_init(&p);
    switch (i) {
    case 0: p.temperature = -1; break;
    case 1: p.temperature = NAN; break;
    case 2: p.top_k = -1; break;
    case 3: p.top_p = 0; break;
    case 4: p.top_p = 1.5f; break;
    case 5: p.min_p = -0.1f; break;
    case 6: p.min_p = 2; break;
    case 7: p.repeat_penalty = 0; break;
    case 8: p.repeat_penalty = INFINITY; break;
    case 9: p.presence_penalty = NAN; break;
    case 10: p.repeat_last_n = -2; break;
    case 11: p.penalty_last_n = -5; break;
    }
    lm_sampler *s = NULL;
    assert_int_equal(lm_sampler_create(&p, &s), LM_ERR_INVALID);
    assert_null(s);
    if (!strstr(lm_errmsg(), needle[i])) fprintf(stderr, "case %d: %s\n", i, lm_errmsg());
    assert_non_null(strstr(lm_errmsg(), needle[i]));
  }
  lm_sampling_init(&p);
  assert_int_equal(lm_sampling_add_bias(&p, -1, 1), LM_ERR_INVALID);
  assert_int_equal(lm_sampling_add_bias(&p, 1, NAN), LM_ERR_INVALID);
  assert_int_equal(lm_sampling_add_bias(&p, 1, INFINITY), LM_ERR_INVALID);
  assert_int_equal(lm_sampling_add_suppress(&p, -4), LM_ERR_INVALID);
  assert_int_equal(p.n_bias + p.n_suppress, 0);
  /* copy is deep */
  lm_sampling_add_bias(&p, 3, 1);
  lm_sampling q;
  assert_int_equal(lm_sampling_copy(&q, &p), LM_OK);
  assert_ptr_not_equal(q.bias, p.bias);
  assert_int_equal(q.bias[0].id, 3);
  lm_sampling_clear(&p);
  lm_sampling_clear(&q);
  lm_sampling_clear(NULL);
  lm_sampler_free(NULL);
}

/* ---- generation_config.json ------------------------------------------------------------------ */

static void t_gen_config(void **st) {
  (void)st;
  const char *gemma =
      "{\"bos_token_id\":2,\"do_sample\":true,\"eos_token_id\":[1,106,50],\"pad_token_id\":0,"
      "\"suppress_tokens\":[258883,258882],\"temperature\":1.0,\"top_k\":64,\"top_p\":0.95,"
      "\"transformers_version\":\"5.17.0\"}";
  lm_gen_config g;
  assert_int_equal(lm_gen_config_parse(gemma, strlen(gemma), "gc", &g), LM_OK);
  assert_int_equal(g.found, 1);
  assert_true(g.sampling.temperature == 1.0f && g.sampling.top_k == 64 &&
              g.sampling.top_p == 0.95f);
  assert_int_equal(g.n_eos, 3);
  assert_int_equal(g.eos[2], 50);
  assert_int_equal(g.sampling.n_suppress, 2);
  assert_int_equal(g.sampling.suppress[0], 258883);
  assert_int_equal(lm_sampling_validate(&g.sampling), LM_OK);
  int cfg_eos[] = {1, 106};
  int32_t *ids, n;
  assert_int_equal(lm_gen_stop_ids(cfg_eos, 2, &g, 1, &ids, &n), LM_OK);
  assert_int_equal(n, 3);
  assert_true(ids[0] == 1 && ids[1] == 50 && ids[2] == 106);
  free(ids);
  lm_gen_config_clear(&g);
  assert_int_equal(lm_gen_stop_ids(NULL, 0, NULL, -1, &ids, &n), LM_OK);
  assert_true(n == 0 && ids == NULL);

  const char *greedy_cfg =
      "{\"do_sample\":false,\"temperature\":0.7,\"eos_token_id\":7,\"repetition_penalty\":1.1,"
      "\"min_p\":0.05,\"max_new_tokens\":99}";
  assert_int_equal(lm_gen_config_parse(greedy_cfg, strlen(greedy_cfg), "gc", &g), LM_OK);
  assert_true(g.sampling.temperature == 0 && g.sampling.repeat_penalty == 1.1f &&
              g.sampling.min_p == 0.05f);
  assert_true(g.n_eos == 1 && g.eos[0] == 7 && g.max_new_tokens == 99);
  lm_gen_config_clear(&g);

  /* a directory without the file: found = 0, neutral defaults */
  mkdir(LM_BUILD_DIR "/tmp", 0755);
  mkdir(LM_BUILD_DIR "/tmp/test_sampler_empty", 0755);
  assert_int_equal(lm_gen_config_load(LM_BUILD_DIR "/tmp/test_sampler_empty", &g), LM_OK);
  assert_int_equal(g.found, 0);
  assert_true(g.sampling.temperature == 1.0f && g.n_eos == 0);
  lm_gen_config_clear(&g);
  lm_gen_config_clear(NULL);
}

static void t_gen_config_bad(void **st) {
  (void)st;
  static const struct {
    const char *json, *needle;
    lm_status want;
  } bad[] = {
      {"{", "gc", LM_ERR_CORRUPT},
      {"[1,2]", "expected a JSON object", LM_ERR_CORRUPT},
      {"{\"temperature\":\"hot\"}", "temperature", LM_ERR_CORRUPT},
      {"{\"temperature\":-1}", "temperature", LM_ERR_CORRUPT},
      {"{\"top_p\":0}", "top_p", LM_ERR_CORRUPT},
      {"{\"top_p\":1e-50}", "top_p", LM_ERR_CORRUPT},
      {"{\"top_p\":1.5}", "top_p", LM_ERR_CORRUPT},
      {"{\"min_p\":-0.5}", "min_p", LM_ERR_CORRUPT},
      {"{\"top_k\":-3}", "top_k", LM_ERR_CORRUPT},
      {"{\"top_k\":1.5}", "top_k", LM_ERR_CORRUPT},
      {"{\"repetition_penalty\":0}", "repetition_penalty", LM_ERR_CORRUPT},
      {"{\"do_sample\":\"yes\"}", "do_sample", LM_ERR_CORRUPT},
      {"{\"eos_token_id\":\"x\"}", "eos_token_id", LM_ERR_CORRUPT},
      {"{\"eos_token_id\":[1,\"a\"]}", "eos_token_id\"[1]", LM_ERR_CORRUPT},
      {"{\"eos_token_id\":[-1]}", "outside", LM_ERR_CORRUPT},
      {"{\"eos_token_id\":1099511627776}", "outside", LM_ERR_CORRUPT},
      {"{\"suppress_tokens\":[5,-5]}", "suppress_tokens\"[1]", LM_ERR_CORRUPT},
      {"{\"suppress_tokens\":{}}", "suppress_tokens", LM_ERR_CORRUPT},
      {"{\"max_new_tokens\":0}", "max_new_tokens", LM_ERR_CORRUPT},
      {"{\"top_k\":1,\"top_k\":2}", "gc", LM_ERR_CORRUPT},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    lm_gen_config g;
    lm_status s = lm_gen_config_parse(bad[i].json, strlen(bad[i].json), "gc", &g);
    if (s != bad[i].want || !strstr(lm_errmsg(), bad[i].needle))
      fprintf(stderr, "%s -> %d: %s\n", bad[i].json, s, lm_errmsg());
    assert_int_equal(s, bad[i].want);
    assert_non_null(strstr(lm_errmsg(), bad[i].needle));
    assert_true(g.found == 0 && g.eos == NULL && g.sampling.suppress == NULL);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(t_greedy),
      cmocka_unit_test(t_repeat_penalty),
      cmocka_unit_test(t_presence_frequency),
      cmocka_unit_test(t_bias_suppress),
      cmocka_unit_test(t_truncations),
      cmocka_unit_test(t_reproducible),
      cmocka_unit_test(t_distribution),
      cmocka_unit_test(t_top_p_shortcut),
      cmocka_unit_test(t_validate),
      cmocka_unit_test(t_gen_config),
      cmocka_unit_test(t_gen_config_bad),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
