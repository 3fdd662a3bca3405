/* test_cpu_team.c — a decode step run as one parallel region (cpu_team.c) computes exactly
 * what the same step computes as separate ops: logits bit for bit, in F32 and FAST, on a
 * dense, a 4-bit and a MoE fixture model, with more threads than chunks of some phases, with
 * the adaptive team size, with steps of several tokens, and past 512 keys, where a team
 * splits attention's keys among its threads. And a token decoded alone computes the bits it
 * computes inside a step of several tokens. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_team.h"
#include "base/status.h"
#include "model/forward.h"
#include "model/kv_plan.h"

#define FIXTURES LM_SOURCE_DIR "/tests/fixtures"
#define DECODE 12

/* Tokens of the prefill: a few, or enough for three of attention's key segments. */
static int64_t prompt_len = 9;

/* Logits of a prompt_len-token prefill, then DECODE steps of `step` tokens ([T][V]). */
static float *run(const lm_model *m, lm_backend *be, int64_t step, const lm_kv_options *kvo) {
  int64_t V = m->cfg.vocab_size, T = prompt_len + DECODE, PROMPT = prompt_len;
  int32_t ids[T];
  for (int64_t i = 0; i < T; i++)
    ids[i] = (int32_t)(3 + (i * 7919) % (V - 3));
  float *out = malloc((size_t)(T * V) * sizeof(float));
  lm_kv_spec specs[m->cfg.n_caches + 1];
  assert_int_equal(lm_model_kv_plan(m, kvo, specs), LM_OK);
  lm_kv_set *kv = NULL;
  lm_forward *f = NULL;
  assert_int_equal(lm_kv_set_create(be, specs, m->cfg.n_caches, &kv), LM_OK);
  assert_int_equal(lm_forward_create(m, be, PROMPT, PROMPT, &f), LM_OK);
  lm_status s = lm_forward_feed(f, kv, ids, PROMPT, PROMPT, out);
  if (!s) s = lm_forward_feed(f, kv, ids + PROMPT, DECODE, step, out + PROMPT * V);
  if (s) fprintf(stderr, "forward failed: %s\n", lm_errmsg());
  assert_int_equal(s, LM_OK);
  lm_forward_free(f);
  lm_kv_set_free(kv);
  return out;
}

/* The team's logits against the separate ops', for one model and precision. */
static void check_kv(const char *name, lm_precision prec, int adapt, int64_t step,
                     const lm_kv_options *kvo) {
  lm_model *m = NULL;
  lm_backend *be = NULL;
  char dir[512];
  snprintf(dir, sizeof dir, "%s/%s", FIXTURES, name);
  assert_int_equal(lm_model_load(dir, &m), LM_OK);
  assert_int_equal(lm_backend_cpu_create(prec, 0, &be), LM_OK);
  lm_cpu_team_config(be, 0, 0);
  float *want = run(m, be, step, kvo);
  lm_cpu_team_config(be, 1, adapt);
  float *got = run(m, be, step, kvo);
  lm_cpu_team_stats st = lm_cpu_team_stats_of(be);
  size_t n = (size_t)((prompt_len + DECODE) * m->cfg.vocab_size);
  printf("%-14s %s adapt %d step %lld: %lld team steps (%lld on one thread)\n", name,
         prec == LM_PRECISION_FAST ? "fast" : "f32 ", adapt, (long long)step, (long long)st.steps,
         (long long)st.one_steps);
  assert_int_equal(st.steps, step == 1 ? DECODE : 0); /* only one-token steps are counted */
  assert_memory_equal(got, want, n * sizeof(float));
  free(want);
  free(got);
  lm_backend_destroy(be);
  lm_model_free(m);
}

static void check(const char *name, lm_precision prec, int adapt, int64_t step) {
  check_kv(name, prec, adapt, step, &(lm_kv_options){0});
}

static void t_dense(void **st) {
  (void)st;
  check("e2b_like", LM_PRECISION_F32, 0, 1);
  check("e2b_like", LM_PRECISION_F32, 0, 3);
}

static void t_quantized(void **st) {
  (void)st;
  check("e2b_like_mlx4", LM_PRECISION_F32, 0, 1);
  check("e2b_like_mlx4", LM_PRECISION_FAST, 0, 1);
  check("e2b_like_mlx4", LM_PRECISION_FAST, 1, 1);
  check("e2b_like_mlx4", LM_PRECISION_FAST, 0, 5);
}

/* Past 512 keys (three segments of the full layers): the team's split keys. */
static void t_long(void **st) {
  (void)st;
  prompt_len = 600;
  check("e2b_like", LM_PRECISION_F32, 0, 1);
  check("e2b_like_mlx4", LM_PRECISION_FAST, 0, 1);
  check_kv("e4b_like", LM_PRECISION_F32, 0, 1, &(lm_kv_options){.mode = "4", .group = 32});
  prompt_len = 9;
}

/* The logits of every token, decoded one at a time and in steps of 3 and 5 (a verifier's
 * batch), without a team and with one. */
static void t_rows_independent(void **st) {
  (void)st;
  const char *names[] = {"e2b_like", "e2b_like_mlx4", "moe_like_mlx4"};
  for (int i = 0; i < 3; i++) {
    lm_model *m = NULL;
    lm_backend *be = NULL;
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", FIXTURES, names[i]);
    assert_int_equal(lm_model_load(dir, &m), LM_OK);
    assert_int_equal(lm_backend_cpu_create(LM_PRECISION_FAST, 0, &be), LM_OK);
    for (int team = 0; team < 2; team++) {
      lm_cpu_team_config(be, team, 0);
      float *one = run(m, be, 1, &(lm_kv_options){0});
      size_t n = (size_t)((prompt_len + DECODE) * m->cfg.vocab_size);
      for (int64_t step = 3; step <= 5; step += 2) {
        float *many = run(m, be, step, &(lm_kv_options){0});
        printf("%-14s team %d: steps of 1 and of %lld\n", names[i], team, (long long)step);
        assert_memory_equal(many, one, n * sizeof(float));
        free(many);
      }
      free(one);
    }
    lm_backend_destroy(be);
    lm_model_free(m);
  }
}

static void t_moe_and_quantized_cache(void **st) {
  (void)st;
  check("moe_like_mlx4", LM_PRECISION_FAST, 0, 1);
  /* 4-bit caches from the 12th token on: staging, appends and the conversion mid-decode */
  check_kv("e4b_like", LM_PRECISION_F32, 0, 1,
           &(lm_kv_options){.mode = "4", .group = 32, .quant_start = 12});
}

int main(void) {
  /* more threads than this machine may have cores, and than some phases have chunks */
  omp_set_num_threads(3);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(t_dense),
      cmocka_unit_test(t_quantized),
      cmocka_unit_test(t_moe_and_quantized_cache),
      cmocka_unit_test(t_long),
      cmocka_unit_test(t_rows_independent),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
