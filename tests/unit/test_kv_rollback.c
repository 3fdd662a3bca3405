/* test_kv_rollback.c — trimming caches after their rings have wrapped (kv.h, "Rollback"), on the
 * tiny model (sliding window 4, so a ring of 4 + LM_KV_RING_SPARE slots), CPU f32.
 *
 * The reference decodes token by token. The rolled-back run decodes the same tokens, but before
 * some of them appends a few others (drafts that are then rejected) and trims them away. Every
 * logit after a rollback must equal the reference bit for bit: on plain caches, rings and
 * quantized rings, for one rollback of up to LM_KV_RING_SPARE + 1 tokens and for a rollback at
 * every token of a long sequence (the ring wraps many times). Beyond the spare slots the trim is
 * refused and changes nothing. A copy of a rolled-back set (what the prompt cache stores) and a
 * KV state file of one keep how far it may still roll back. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "base/status.h"
#include "kv/kv_snapshot.h"
#include "kv/kv_state.h"
#include "model/fingerprint.h"
#include "model/forward.h"
#include "model/kv_plan.h"
#include "util/tiny_model.h"

#define TMP LM_BUILD_DIR "/tmp/test_kv_rollback"
#define N 72 /* tokens: the 20-slot rings wrap three times */

typedef struct ctx {
  lm_model *m, *mq; /* the tiny model; the one whose head dims take 32-wide KV groups */
  lm_backend *be;
  int32_t ids[N];
  int64_t V;
} ctx;

static int setup(void **st) {
  ctx *c = calloc(1, sizeof *c);
  if (lm_test_write_tiny(lm_test_tiny_config, TMP "/tiny") ||
      lm_test_write_tiny(lm_test_tiny_quant_config, TMP "/tinyq") ||
      lm_model_load(TMP "/tiny", &c->m) || lm_model_load(TMP "/tinyq", &c->mq) ||
      lm_backend_cpu_create(LM_PRECISION_F32, 1, &c->be)) {
    fprintf(stderr, "setup: %s\n", lm_errmsg());
    return -1;
  }
  for (int i = 0; i < N; i++)
    c->ids[i] = (int32_t)(1 + lm_mix64(0xdec0de + (uint64_t)i) % 63);
  c->V = c->m->cfg.vocab_size;
  *st = c;
  return 0;
}

static int teardown(void **st) {
  ctx *c = *st;
  lm_backend_destroy(c->be);
  lm_model_free(c->m);
  lm_model_free(c->mq);
  free(c);
  return 0;
}

static void plan(const lm_model *m, const char *mode, lm_kv_spec *specs) {
  lm_kv_options o = {.mode = mode, .group = 32};
  assert_int_equal(lm_model_kv_plan(m, &o, specs), LM_OK);
}

static lm_kv_set *new_set(ctx *c, const lm_model *m, const lm_kv_spec *specs) {
  lm_kv_set *kv;
  assert_int_equal(lm_kv_set_create(c->be, specs, m->cfg.n_caches, &kv), LM_OK);
  return kv;
}

/* Feeds ids[0..n) as one step (logits of the last token into out when not NULL). */
static void feed(ctx *c, const lm_model *m, lm_kv_set *kv, const int32_t *ids, int64_t n,
                 float *out) {
  lm_forward *f;
  assert_int_equal(lm_forward_create(m, c->be, n, n, &f), LM_OK);
  float *all = malloc((size_t)(n * c->V) * sizeof(float));
  lm_status s = lm_forward_feed(f, kv, ids, n, n, all);
  if (s) fprintf(stderr, "feed: %s\n", lm_errmsg());
  assert_int_equal(s, LM_OK);
  if (out) memcpy(out, all + (n - 1) * c->V, (size_t)c->V * sizeof(float));
  free(all);
  lm_forward_free(f);
}

/* The reference: ids[0..n) token by token, every position's logits. */
static float *reference(ctx *c, const lm_model *m, const lm_kv_spec *specs, int64_t n) {
  float *ref = malloc((size_t)(n * c->V) * sizeof(float));
  lm_kv_set *kv = new_set(c, m, specs);
  for (int64_t t = 0; t < n; t++)
    feed(c, m, kv, c->ids + t, 1, ref + t * c->V);
  lm_kv_set_free(kv);
  return ref;
}

/* Appends `n` drafts after the set's tokens (ids that differ from the real next ones) and trims
 * them off again. */
static void draft_and_reject(ctx *c, const lm_model *m, lm_kv_set *kv, int64_t n) {
  int64_t at = lm_kv_set_len(kv);
  int32_t d[LM_KV_RING_SPARE + 2];
  for (int64_t k = 0; k < n; k++)
    d[k] = (int32_t)(1 + (c->ids[(at + k) % N] + 7 + k) % 63);
  feed(c, m, kv, d, n, NULL);
  assert_true(lm_kv_set_min_len(kv) <= at);
  assert_int_equal(lm_kv_set_trim(kv, n), LM_OK);
  assert_int_equal(lm_kv_set_len(kv), at);
}

/* One rollback of `t` drafts after `at` tokens (the rings wrapped), then the rest. */
static void one_rollback(ctx *c, const lm_model *m, const char *mode, int64_t at, int64_t t) {
  lm_kv_spec specs[8];
  plan(m, mode, specs);
  float *ref = reference(c, m, specs, N), *got = malloc((size_t)c->V * sizeof(float));
  lm_kv_set *kv = new_set(c, m, specs);
  for (int64_t k = 0; k < at; k++)
    feed(c, m, kv, c->ids + k, 1, NULL);
  draft_and_reject(c, m, kv, t);
  for (int64_t k = at; k < N; k++) {
    feed(c, m, kv, c->ids + k, 1, got);
    assert_memory_equal(got, ref + k * c->V, (size_t)c->V * sizeof(float));
  }
  lm_kv_set_free(kv);
  free(ref);
  free(got);
}

static void t_one_rollback(void **st) {
  ctx *c = *st;
  const int64_t ts[] = {1, 4, LM_KV_RING_SPARE, LM_KV_RING_SPARE + 1};
  for (int i = 0; i < 4; i++) {
    one_rollback(c, c->m, "off", 41, ts[i]);
    one_rollback(c, c->mq, "8", 41, ts[i]);
  }
  one_rollback(c, c->mq, "4", 23, LM_KV_RING_SPARE + 1);
  one_rollback(c, c->mq, "turboquant:8:3", 41, LM_KV_RING_SPARE + 1);
  one_rollback(c, c->mq, "off", 17, 5); /* the rings wrap only with the drafts */
}

/* A rejected draft before every token of a long sequence, of varying length. */
static void every_token(ctx *c, const lm_model *m, const char *mode) {
  lm_kv_spec specs[8];
  plan(m, mode, specs);
  float *ref = reference(c, m, specs, N), *got = malloc((size_t)c->V * sizeof(float));
  lm_kv_set *kv = new_set(c, m, specs);
  for (int64_t k = 0; k < N; k++) {
    if (k) draft_and_reject(c, m, kv, 1 + k % (LM_KV_RING_SPARE + 1));
    feed(c, m, kv, c->ids + k, 1, got);
    assert_memory_equal(got, ref + k * c->V, (size_t)c->V * sizeof(float));
  }
  lm_kv_set_free(kv);
  free(ref);
  free(got);
}

static void t_every_token(void **st) {
  ctx *c = *st;
  every_token(c, c->m, "off");
  every_token(c, c->mq, "8");
  every_token(c, c->mq, "turboquant:4:3");
}

/* Past the spare slots the trim is refused, and the set is as it was. */
static void t_refused(void **st) {
  ctx *c = *st;
  lm_kv_spec specs[8];
  plan(c->m, "off", specs);
  float *ref = reference(c, c->m, specs, N), *got = malloc((size_t)c->V * sizeof(float));
  lm_kv_set *kv = new_set(c, c->m, specs);
  for (int64_t k = 0; k < 40; k++)
    feed(c, c->m, kv, c->ids + k, 1, NULL);
  assert_int_equal(lm_kv_set_min_len(kv), 40 - LM_KV_RING_SPARE - 1);
  assert_int_equal(lm_kv_set_trim(kv, LM_KV_RING_SPARE + 2), LM_ERR_STATE);
  printf("refused: %s\n", lm_errmsg());
  assert_non_null(strstr(lm_errmsg(), "re-prefill"));
  assert_int_equal(lm_kv_set_len(kv), 40);
  /* two trims that add up to more than the spare slots: the second is refused */
  assert_int_equal(lm_kv_set_trim(kv, 10), LM_OK);
  assert_int_equal(lm_kv_set_trim(kv, LM_KV_RING_SPARE + 2 - 10), LM_ERR_STATE);
  assert_int_equal(lm_kv_set_len(kv), 30);
  for (int64_t k = 30; k < N; k++) {
    feed(c, c->m, kv, c->ids + k, 1, got);
    assert_memory_equal(got, ref + k * c->V, (size_t)c->V * sizeof(float));
  }
  lm_kv_set_free(kv);
  free(ref);
  free(got);
}

/* Continues a and b from `at` token by token: identical logits. */
static void same_future(ctx *c, lm_kv_set *a, lm_kv_set *b, int64_t at) {
  float *la = malloc((size_t)c->V * sizeof(float)), *lb = malloc((size_t)c->V * sizeof(float));
  for (int64_t k = at; k < N; k++) {
    feed(c, c->m, a, c->ids + k, 1, la);
    feed(c, c->m, b, c->ids + k, 1, lb);
    assert_memory_equal(la, lb, (size_t)c->V * sizeof(float));
  }
  free(la);
  free(lb);
}

/* A set rolled back after a wrap, copied (as the prompt cache does) and saved to a state file:
 * the copies continue identically and may roll back exactly as far as the original. */
static void t_copies_keep_the_limit(void **st) {
  ctx *c = *st;
  lm_kv_spec specs[8];
  plan(c->m, "off", specs);
  lm_kv_set *kv = new_set(c, c->m, specs), *clone, *loaded;
  for (int64_t k = 0; k < 45; k++)
    feed(c, c->m, kv, c->ids + k, 1, NULL);
  assert_int_equal(lm_kv_set_trim(kv, 6), LM_OK); /* 39 tokens; 45 reached */
  int64_t lim = lm_kv_set_min_len(kv);
  assert_int_equal(lim, 45 - LM_KV_RING_SPARE - 1);
  /* a copy of a shorter prefix, as far back as allowed */
  assert_int_equal(lm_kv_set_clone_prefix(kv, lim, &clone), LM_OK);
  assert_int_equal(lm_kv_set_min_len(clone), lim);
  lm_kv_set *p;
  assert_int_equal(lm_kv_set_clone_prefix(kv, lim - 1, &p), LM_ERR_STATE);
  /* a state file */
  uint8_t fp[LM_FINGERPRINT_BYTES];
  assert_int_equal(lm_model_fingerprint(c->m, fp), LM_OK);
  assert_int_equal(lm_kv_state_save(TMP "/rolled.kvstate", fp, kv, c->ids, 39), LM_OK);
  int32_t *tok = NULL;
  int64_t nt = 0;
  lm_status s = lm_kv_state_load(TMP "/rolled.kvstate", c->m, specs, c->be, &loaded, &tok, &nt);
  if (s) fprintf(stderr, "load: %s\n", lm_errmsg());
  assert_int_equal(s, LM_OK);
  assert_int_equal(nt, 39);
  assert_int_equal(lm_kv_set_min_len(loaded), lim);
  free(tok);
  /* the original trimmed to the limit continues like the clone; the loaded one like the
   * original at 39 (another original, as both advance) */
  lm_kv_set *again;
  assert_int_equal(lm_kv_set_clone(kv, &again), LM_OK);
  same_future(c, loaded, again, 39);
  assert_int_equal(lm_kv_set_trim(kv, 39 - lim), LM_OK);
  same_future(c, kv, clone, lim);
  lm_kv_set_free(again);
  lm_kv_set_free(loaded);
  lm_kv_set_free(clone);
  lm_kv_set_free(kv);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(t_one_rollback),
      cmocka_unit_test(t_every_token),
      cmocka_unit_test(t_refused),
      cmocka_unit_test(t_copies_keep_the_limit),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
