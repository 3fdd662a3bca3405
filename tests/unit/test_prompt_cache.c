/* test_prompt_cache.c — the prompt cache on the tiny model (sliding window 4): reuse shows in
 * the stats and is exact in the output — logits of a request served from the cache equal, bit
 * for bit on the CPU f32 path, those of a from-scratch run with the same step boundaries (the
 * CPU forward is not chunk-invariant in the last bits: a T-row GEMM and a GEMV round
 * differently, so "from scratch" feeds the same steps) and match a one-pass run to rounding.
 * Also: prefixes longer than the window (wrapped rings), cutting an entry back (plain caches,
 * unwrapped rings, and wrapped ones within their spare slots) and declining beyond, eviction by
 * bytes in LRU order, superseded entries, namespaces, a delayed quantization, turboquant caches
 * (handed only to sessions of the same plan), bad arguments. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "base/status.h"
#include "engine/prompt_cache.h"
#include "kv/kv_snapshot.h"
#include "model/forward.h"
#include "model/kv_plan.h"
#include "util/tiny_model.h"

#define TMP LM_BUILD_DIR "/tmp/test_prompt_cache"
#define N 64
#define W 30 /* a prefix that wraps the rings (window 4 + LM_KV_RING_SPARE slots) */

typedef struct ctx {
  lm_model *m, *mq;
  lm_backend *be;
  lm_kv_spec specs[8];
  int32_t ids[N], alt[N]; /* alt shares ids' first 8 tokens, then differs */
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
  lm_model_kv_specs(c->m, c->specs);
  for (int i = 0; i < N; i++) {
    c->ids[i] = (int32_t)(1 + lm_mix64(0xc0ffee + (uint64_t)i) % 63);
    c->alt[i] = i < 8 ? c->ids[i] : (int32_t)(1 + (c->ids[i] + 17) % 63);
  }
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

static lm_kv_set *new_set(ctx *c, const lm_model *m, const lm_kv_spec *specs) {
  lm_kv_set *kv;
  assert_int_equal(lm_kv_set_create(c->be, specs, m->cfg.n_caches, &kv), LM_OK);
  return kv;
}

/* Feeds ids[from..to) as one step; logits of every fed position to out (may be NULL). */
static void step(ctx *c, const lm_model *m, lm_kv_set *kv, const int32_t *ids, int64_t from,
                 int64_t to, float *out) {
  lm_forward *f;
  int64_t n = to - from;
  assert_int_equal(lm_forward_create(m, c->be, n, n, &f), LM_OK);
  lm_status s = lm_forward_feed(f, kv, ids + from, n, n, out);
  if (s) fprintf(stderr, "feed: %s\n", lm_errmsg());
  assert_int_equal(s, LM_OK);
  lm_forward_free(f);
}

static float *logits(ctx *c) { return calloc((size_t)(N * c->V), sizeof(float)); }

/* A session that inserts ids[0..n) (fed as one step) into pc. */
static void insert(ctx *c, lm_prompt_cache *pc, const char *ns, const int32_t *ids, int64_t n) {
  lm_kv_set *kv = new_set(c, c->m, c->specs);
  step(c, c->m, kv, ids, 0, n, NULL);
  assert_int_equal(lm_prompt_cache_insert(pc, ns, ids, n, kv), LM_OK);
  lm_kv_set_free(kv);
}

/* A request for ids[0..N): lookup (at most N - 1 reused), then the rest as one step. */
static int64_t request(ctx *c, lm_prompt_cache *pc, const char *ns, const int32_t *ids,
                       float *out) {
  lm_kv_set *kv = new_set(c, c->m, c->specs);
  int64_t reused;
  assert_int_equal(lm_prompt_cache_lookup(pc, ns, ids, N, N - 1, kv, &reused), LM_OK);
  assert_int_equal(lm_kv_set_len(kv), reused);
  step(c, c->m, kv, ids, reused, N, out + reused * c->V);
  lm_kv_set_free(kv);
  return reused;
}

static double max_abs_diff(const float *a, const float *b, int64_t n) {
  double d = 0;
  for (int64_t i = 0; i < n; i++)
    d = fmax(d, fabs((double)a[i] - b[i]));
  return d;
}

/* A prefix longer than the window: the rings have wrapped, the snapshot is still exact. */
static void t_reuse_exact(void **st) {
  ctx *c = *st;
  lm_prompt_cache *pc;
  assert_int_equal(lm_prompt_cache_create(1 << 20, 0, &pc), LM_OK);
  insert(c, pc, NULL, c->ids, W);
  lm_prompt_cache_stats s = lm_prompt_cache_get_stats(pc);
  assert_int_equal(s.entries, 1);
  assert_true(s.bytes_held > 0);
  float *got = logits(c), *ref = logits(c), *one = logits(c);
  assert_int_equal(request(c, pc, NULL, c->ids, got), W);
  /* From scratch with the same steps: [0, W) then [W, N). */
  lm_kv_set *kv = new_set(c, c->m, c->specs);
  step(c, c->m, kv, c->ids, 0, W, ref);
  step(c, c->m, kv, c->ids, W, N, ref + W * c->V);
  assert_memory_equal(got + W * c->V, ref + W * c->V, (size_t)((N - W) * c->V) * sizeof(float));
  lm_kv_set_free(kv);
  /* And one pass over everything: the same values up to rounding. */
  kv = new_set(c, c->m, c->specs);
  step(c, c->m, kv, c->ids, 0, N, one);
  double d = max_abs_diff(got + W * c->V, one + W * c->V, (N - W) * c->V);
  printf("cached vs one pass: max |d| %.3g\n", d);
  assert_true(d < 1e-4);
  lm_kv_set_free(kv);
  s = lm_prompt_cache_get_stats(pc);
  printf("stats: %lld hits, %lld misses, %lld tokens reused, %lld bytes held\n", (long long)s.hits,
         (long long)s.misses, (long long)s.tokens_reused, (long long)s.bytes_held);
  assert_int_equal(s.lookups, 1);
  assert_int_equal(s.hits, 1);
  assert_int_equal(s.misses, 0);
  assert_int_equal(s.tokens_reused, W);
  assert_int_equal(s.declined, 0);
  /* The entry survived being restored: a second request reuses it again, identically. */
  float *again = logits(c);
  assert_int_equal(request(c, pc, NULL, c->ids, again), W);
  assert_memory_equal(got + W * c->V, again + W * c->V, (size_t)((N - W) * c->V) * sizeof(float));
  assert_int_equal(lm_prompt_cache_get_stats(pc).tokens_reused, 2 * W);
  free(got), free(ref), free(one), free(again);
  lm_prompt_cache_free(pc);
}

/* A shorter common prefix of an entry: fine while the rings have not wrapped (the rows are cut
 * back), and after they have as far back as their spare slots reach; declined beyond. */
static void t_cut_and_decline(void **st) {
  ctx *c = *st;
  lm_prompt_cache *pc;
  assert_int_equal(lm_prompt_cache_create(1 << 20, 0, &pc), LM_OK);
  /* Entry of 4 tokens (rings exactly full, not wrapped); alt shares 8 with ids, so 4 here. A
   * request for ids' sibling that shares only 3 tokens reuses 3. */
  int32_t sib[N];
  memcpy(sib, c->ids, sizeof sib);
  sib[3] = (int32_t)(1 + (sib[3] + 5) % 63);
  insert(c, pc, NULL, c->ids, 4);
  float *got = logits(c), *ref = logits(c);
  assert_int_equal(request(c, pc, NULL, sib, got), 3);
  /* From scratch: the same rows (computed in a 4-token step), cut back to 3, then the rest. */
  lm_kv_set *kv = new_set(c, c->m, c->specs);
  step(c, c->m, kv, c->ids, 0, 4, NULL);
  assert_int_equal(lm_kv_set_trim(kv, 1), LM_OK);
  step(c, c->m, kv, sib, 3, N, ref + 3 * c->V);
  assert_memory_equal(got + 3 * c->V, ref + 3 * c->V, (size_t)((N - 3) * c->V) * sizeof(float));
  lm_kv_set_free(kv);
  /* Entry of W tokens (wrapped: W > 4 + LM_KV_RING_SPARE slots); alt shares its first 8, below
   * the W - LM_KV_RING_SPARE - 1 tokens the spare slots reach back to: declined. */
  lm_prompt_cache_clear(pc);
  insert(c, pc, NULL, c->ids, W);
  lm_prompt_cache_stats s0 = lm_prompt_cache_get_stats(pc);
  assert_int_equal(request(c, pc, NULL, c->alt, got), 0);
  lm_prompt_cache_stats s = lm_prompt_cache_get_stats(pc);
  assert_int_equal(s.misses - s0.misses, 1);
  assert_int_equal(s.declined - s0.declined, 1);
  /* A request that shares exactly that many reuses them, and continues exactly as a run that fed
   * W tokens and trimmed back; one token less is declined. */
  const int64_t edge = W - LM_KV_RING_SPARE - 1;
  int32_t far[N], nearer[N];
  memcpy(far, c->ids, sizeof far);
  far[edge] = (int32_t)(1 + (far[edge] + 5) % 63);
  memcpy(nearer, far, sizeof nearer);
  nearer[edge - 1] = (int32_t)(1 + (nearer[edge - 1] + 5) % 63);
  assert_int_equal(request(c, pc, NULL, far, got), edge);
  kv = new_set(c, c->m, c->specs);
  step(c, c->m, kv, c->ids, 0, W, NULL);
  assert_int_equal(lm_kv_set_min_len(kv), edge);
  assert_int_equal(lm_kv_set_trim(kv, W - edge), LM_OK);
  step(c, c->m, kv, far, edge, N, ref + edge * c->V);
  assert_memory_equal(got + edge * c->V, ref + edge * c->V,
                      (size_t)((N - edge) * c->V) * sizeof(float));
  lm_kv_set_free(kv);
  assert_int_equal(request(c, pc, NULL, nearer, got), 0);
  /* The same W tokens as the whole request: reusing all W would leave nothing to feed, so W - 1
   * (a one-token trim of the wrapped rings); W + 1 tokens reuse all W. */
  lm_kv_set *d = new_set(c, c->m, c->specs);
  int64_t reused;
  assert_int_equal(lm_prompt_cache_lookup(pc, NULL, c->ids, W, W - 1, d, &reused), LM_OK);
  assert_int_equal(reused, W - 1);
  assert_int_equal(lm_prompt_cache_lookup(pc, NULL, c->ids, W + 1, W, d, &reused), LM_OK);
  assert_int_equal(reused, W);
  assert_int_equal(lm_kv_set_len(d), W);
  /* A non-empty destination is replaced; an entry of another plan is never used. */
  step(c, c->m, d, c->ids, W, W + 2, NULL);
  assert_int_equal(lm_prompt_cache_lookup(pc, NULL, c->ids, N, -1, d, &reused), LM_OK);
  assert_int_equal(reused, W);
  assert_int_equal(lm_kv_set_len(d), W);
  lm_kv_set_free(d);
  lm_kv_spec wide[8];
  memcpy(wide, c->specs, sizeof wide);
  wide[0].window = 8;
  d = new_set(c, c->m, wide);
  assert_int_equal(lm_prompt_cache_lookup(pc, NULL, c->ids, N, -1, d, &reused), LM_OK);
  assert_int_equal(reused, 0);
  assert_int_equal(lm_kv_set_len(d), 0);
  lm_kv_set_free(d);
  free(got), free(ref);
  lm_prompt_cache_free(pc);
}

/* Eviction by bytes, least recently used first; superseded and oversized entries. */
static void t_eviction(void **st) {
  ctx *c = *st;
  lm_kv_set *kv = new_set(c, c->m, c->specs);
  step(c, c->m, kv, c->ids, 0, 6, NULL);
  lm_kv_set *snap;
  assert_int_equal(lm_kv_set_clone(kv, &snap), LM_OK);
  int64_t one = lm_kv_set_alloc_bytes(snap) + 6 * 4; /* an entry of 6 tokens */
  lm_kv_set_free(snap);
  lm_kv_set_free(kv);
  lm_prompt_cache *pc;
  assert_int_equal(lm_prompt_cache_create(2 * one + one / 2, 0, &pc), LM_OK);
  int32_t a[N], b[N], d[N];
  for (int i = 0; i < N; i++)
    a[i] = c->ids[i], b[i] = c->alt[(i + 9) % N], d[i] = (int32_t)(1 + (i * 7) % 63);
  insert(c, pc, NULL, a, 6);
  insert(c, pc, NULL, b, 6);
  assert_int_equal(lm_prompt_cache_get_stats(pc).bytes_held, 2 * one);
  float *out = logits(c);
  assert_int_equal(request(c, pc, NULL, a, out), 6); /* a is now the most recently used */
  insert(c, pc, NULL, d, 6);                         /* evicts b */
  lm_prompt_cache_stats s = lm_prompt_cache_get_stats(pc);
  assert_int_equal(s.evictions, 1);
  assert_int_equal(s.entries, 2);
  assert_int_equal(s.bytes_held, 2 * one);
  assert_int_equal(request(c, pc, NULL, b, out), 0);
  assert_int_equal(request(c, pc, NULL, a, out), 6);
  assert_int_equal(request(c, pc, NULL, d, out), 6);
  /* Re-inserting the same ids only marks the entry used. */
  insert(c, pc, NULL, d, 6);
  assert_int_equal(lm_prompt_cache_get_stats(pc).inserts, 3);
  /* A snapshot larger than the whole cap is not stored. */
  insert(c, pc, NULL, a, N);
  s = lm_prompt_cache_get_stats(pc);
  assert_int_equal(s.rejected, 1);
  assert_int_equal(s.entries, 2);
  lm_prompt_cache_free(pc);
  /* An entry of 3 tokens is covered by one of 4 that extends it (rings not wrapped), not by one
   * of W (wrapped: it could not be cut back to 3). */
  assert_int_equal(lm_prompt_cache_create(1 << 20, 0, &pc), LM_OK);
  insert(c, pc, NULL, a, 3);
  insert(c, pc, NULL, a, 4);
  s = lm_prompt_cache_get_stats(pc);
  assert_int_equal(s.superseded, 1);
  assert_int_equal(s.entries, 1);
  insert(c, pc, NULL, a, W);
  s = lm_prompt_cache_get_stats(pc);
  assert_int_equal(s.superseded, 1);
  assert_int_equal(s.entries, 2);
  free(out);
  lm_prompt_cache_free(pc);
}

static void t_namespaces(void **st) {
  ctx *c = *st;
  lm_prompt_cache *pc;
  assert_int_equal(lm_prompt_cache_create(1 << 20, 0, &pc), LM_OK);
  insert(c, pc, "adapter-a", c->ids, 10);
  float *out = logits(c);
  assert_int_equal(request(c, pc, NULL, c->ids, out), 0);
  assert_int_equal(request(c, pc, "", c->ids, out), 0);
  assert_int_equal(request(c, pc, "adapter-b", c->ids, out), 0);
  assert_int_equal(request(c, pc, "adapter-a", c->ids, out), 10);
  insert(c, pc, NULL, c->ids, 10); /* the same ids in another namespace: a second entry */
  lm_prompt_cache_stats s = lm_prompt_cache_get_stats(pc);
  assert_int_equal(s.entries, 2);
  assert_int_equal(s.hits, 1);
  assert_int_equal(s.misses, 3);
  assert_int_equal(request(c, pc, NULL, c->ids, out), 10);
  free(out);
  lm_prompt_cache_free(pc);
}

/* --kv-quant 8 from token 6: an entry taken after the conversion restored into a fresh (still
 * plain) session, and one taken before it. */
static void t_delayed_quant(void **st) {
  ctx *c = *st;
  lm_kv_spec q[8];
  lm_kv_options o = {.mode = "8", .group = 32, .quant_start = 6};
  assert_int_equal(lm_model_kv_plan(c->mq, &o, q), LM_OK);
  const int cuts[2][2] = {{6, 9}, {5, 5}}; /* steps [0,a) [a,b), insert at b */
  for (int k = 0; k < 2; k++) {
    int a = cuts[k][0], b = cuts[k][1];
    lm_prompt_cache *pc;
    assert_int_equal(lm_prompt_cache_create(1 << 20, 0, &pc), LM_OK);
    lm_kv_set *kv = new_set(c, c->mq, q);
    step(c, c->mq, kv, c->ids, 0, a, NULL);
    if (b > a) step(c, c->mq, kv, c->ids, a, b, NULL);
    assert_int_equal(lm_prompt_cache_insert(pc, NULL, c->ids, b, kv), LM_OK);
    float *got = logits(c), *ref = logits(c);
    step(c, c->mq, kv, c->ids, b, N,
         ref + b * c->V); /* from scratch = the inserting session going on */
    lm_kv_set_free(kv);
    kv = new_set(c, c->mq, q);
    assert_true(kv->caches[0]->has_pending);
    int64_t reused;
    assert_int_equal(lm_prompt_cache_lookup(pc, NULL, c->ids, N, N - 1, kv, &reused), LM_OK);
    assert_int_equal(reused, b);
    assert_int_equal(kv->caches[0]->has_pending, b < 9);
    step(c, c->mq, kv, c->ids, b, N, got + b * c->V);
    assert_memory_equal(got + b * c->V, ref + b * c->V, (size_t)((N - b) * c->V) * sizeof(float));
    if (b >= 9) assert_true(lm_kv_kind_quant(kv->caches[0]->kind));
    lm_kv_set_free(kv);
    free(got), free(ref);
    lm_prompt_cache_free(pc);
  }
}

/* Turboquant full-attention caches: an entry restores into a session of the same plan and goes
 * on bit for bit; a session of another plan (plain caches, other value bits) is never handed it. */
static void t_turboquant(void **st) {
  ctx *c = *st;
  lm_kv_spec q[8], plain[8], other[8];
  assert_int_equal(lm_model_kv_plan(c->mq, &(lm_kv_options){.mode = "turboquant:8:3"}, q), LM_OK);
  assert_int_equal(lm_model_kv_plan(c->mq, &(lm_kv_options){.mode = "off"}, plain), LM_OK);
  assert_int_equal(lm_model_kv_plan(c->mq, &(lm_kv_options){.mode = "turboquant:8:4"}, other),
                   LM_OK);
  const int b = 9;
  lm_prompt_cache *pc;
  assert_int_equal(lm_prompt_cache_create(1 << 20, 0, &pc), LM_OK);
  lm_kv_set *kv = new_set(c, c->mq, q);
  step(c, c->mq, kv, c->ids, 0, b, NULL);
  assert_int_equal(lm_prompt_cache_insert(pc, NULL, c->ids, b, kv), LM_OK);
  float *got = logits(c), *ref = logits(c);
  step(c, c->mq, kv, c->ids, b, N, ref + b * c->V);
  lm_kv_set_free(kv);
  int64_t reused;
  const lm_kv_spec *refused[2] = {plain, other};
  for (int k = 0; k < 2; k++) {
    kv = new_set(c, c->mq, refused[k]);
    assert_int_equal(lm_prompt_cache_lookup(pc, NULL, c->ids, N, N - 1, kv, &reused), LM_OK);
    assert_int_equal(reused, 0);
    lm_kv_set_free(kv);
  }
  kv = new_set(c, c->mq, q);
  assert_int_equal(lm_prompt_cache_lookup(pc, NULL, c->ids, N, N - 1, kv, &reused), LM_OK);
  assert_int_equal(reused, b);
  assert_true(lm_kv_kind_tq(kv->caches[2]->kind));
  step(c, c->mq, kv, c->ids, b, N, got + b * c->V);
  assert_memory_equal(got + b * c->V, ref + b * c->V, (size_t)((N - b) * c->V) * sizeof(float));
  lm_kv_set_free(kv);
  free(got), free(ref);
  lm_prompt_cache_free(pc);
}

static void t_bad_arguments(void **st) {
  ctx *c = *st;
  lm_prompt_cache *pc;
  assert_int_equal(lm_prompt_cache_create(0, 0, &pc), LM_ERR_INVALID);
  assert_null(pc);
  assert_int_equal(lm_prompt_cache_create(1 << 20, 0, &pc), LM_OK);
  lm_kv_set *kv = new_set(c, c->m, c->specs);
  step(c, c->m, kv, c->ids, 0, 5, NULL);
  assert_int_equal(lm_prompt_cache_insert(pc, NULL, c->ids, 4, kv),
                   LM_ERR_INVALID); /* kv holds 5 */
  assert_int_equal(lm_prompt_cache_insert(pc, NULL, c->ids, 0, kv), LM_ERR_INVALID);
  int64_t reused = 7;
  assert_int_equal(lm_prompt_cache_lookup(pc, NULL, c->ids, -1, -1, kv, &reused), LM_ERR_INVALID);
  assert_int_equal(reused, 0);
  assert_int_equal(lm_prompt_cache_lookup(pc, NULL, c->ids, 5, -1, kv, &reused),
                   LM_OK); /* empty: a miss */
  assert_int_equal(reused, 0);
  assert_int_equal(lm_kv_set_len(kv), 5);
  lm_kv_set_free(kv);
  lm_prompt_cache_free(pc);
  lm_prompt_cache_free(NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(t_reuse_exact),   cmocka_unit_test(t_cut_and_decline),
      cmocka_unit_test(t_eviction),      cmocka_unit_test(t_namespaces),
      cmocka_unit_test(t_delayed_quant), cmocka_unit_test(t_turboquant),
      cmocka_unit_test(t_bad_arguments)};
  return cmocka_run_group_tests(tests, setup, teardown);
}
