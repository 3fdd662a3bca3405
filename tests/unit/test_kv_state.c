/* test_kv_state.c — KV persistence: the hash and the model fingerprint, clones, save/restore
 * round trips on tiny models (rings that have wrapped, every cache kind, a delayed quantization
 * before and after it converts, element dtypes converted across backends), and the table of bad
 * files: truncations, flipped bytes, forged fields, other model, other plan, wrong targets. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/rng.h"
#include "base/status.h"
#include "kv/kv_snapshot.h"
#include "kv/kv_state.h"
#include "model/forward.h"
#include "model/kv_plan.h"
#include "util/tiny_model.h"

#define TMP LM_BUILD_DIR "/tmp/test_kv_state"

typedef struct ctx {
  lm_model *m, *mq; /* the tiny model; the quantizable one */
  lm_backend *be;
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

/* ---- helpers --------------------------------------------------------------------------------- */

#define N_IDS 64
#define WRAP 30 /* tokens that wrap the rings: window 4 + LM_KV_RING_SPARE slots */
static void test_ids(int32_t *ids, int n) {
  for (int i = 0; i < n; i++)
    ids[i] = (int32_t)(1 + lm_mix64(0x5eed + (uint64_t)i) % 63);
}

static lm_kv_set *new_set(lm_backend *be, const lm_model *m, const lm_kv_spec *specs) {
  lm_kv_set *kv;
  assert_int_equal(lm_kv_set_create(be, specs, m->cfg.n_caches, &kv), LM_OK);
  return kv;
}

/* Feeds ids[from..to) in steps of `step`; logits of every fed position into out (may be NULL). */
static void feed(const lm_model *m, lm_backend *be, lm_kv_set *kv, const int32_t *ids, int64_t from,
                 int64_t to, int64_t step, float *out) {
  lm_forward *f;
  assert_int_equal(lm_forward_create(m, be, step, step, &f), LM_OK);
  lm_status s = lm_forward_feed(f, kv, ids + from, to - from, step, out);
  if (s) fprintf(stderr, "feed: %s\n", lm_errmsg());
  assert_int_equal(s, LM_OK);
  lm_forward_free(f);
}

static void fingerprint(const lm_model *m, uint8_t fp[32]) {
  assert_int_equal(lm_model_fingerprint(m, fp), LM_OK);
}

static uint8_t *read_all(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  *n = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *b = malloc(*n + 1);
  assert_int_equal(fread(b, 1, *n, f), *n);
  fclose(f);
  return b;
}

static void write_all(const char *path, const uint8_t *b, size_t n) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(b, 1, n, f), n);
  fclose(f);
}

static void plan(const lm_model *m, const char *mode, int64_t start, lm_kv_spec *specs) {
  lm_kv_options o = {.mode = mode, .group = 32, .quant_start = start};
  lm_status s = lm_model_kv_plan(m, &o, specs);
  if (s) fprintf(stderr, "plan: %s\n", lm_errmsg());
  assert_int_equal(s, LM_OK);
}

/* ---- the hash ----------------------------------------------------------------------------------
 */

static void t_hash(void **st) {
  (void)st;
  uint8_t data[1000], d1[32], d2[32];
  for (int i = 0; i < 1000; i++)
    data[i] = (uint8_t)lm_mix64((uint64_t)i);
  /* Streaming in odd pieces equals one pass; the 64-bit checksum is digest word 0. */
  lm_hasher h;
  lm_hasher_init(&h, 9);
  lm_hasher_update(&h, data, 1000);
  lm_hasher_final(&h, d1);
  for (size_t step = 1; step < 70; step += 7) {
    lm_hasher_init(&h, 9);
    for (size_t o = 0; o < 1000; o += step)
      lm_hasher_update(&h, data + o, 1000 - o < step ? 1000 - o : step);
    lm_hasher_final(&h, d2);
    assert_memory_equal(d1, d2, 32);
  }
  uint64_t w0 = 0;
  for (int b = 7; b >= 0; b--)
    w0 = (w0 << 8) | d1[b];
  assert_true(w0 == lm_hash64(data, 1000, 9));
  /* Length, seed and trailing zeros all matter. */
  uint8_t z[40] = {0};
  assert_true(lm_hash64(z, 31, 0) != lm_hash64(z, 32, 0));
  assert_true(lm_hash64(z, 32, 0) != lm_hash64(z, 33, 0));
  assert_true(lm_hash64(z, 0, 0) != lm_hash64(z, 0, 1));
  /* Avalanche: flipping any one input bit flips about half of the 256 output bits. */
  double total = 0;
  int lo = 256, hi = 0, trials = 0;
  lm_hasher_init(&h, 0);
  lm_hasher_update(&h, data, 100);
  lm_hasher_final(&h, d1);
  for (int bit = 0; bit < 800; bit++) {
    data[bit / 8] ^= (uint8_t)(1u << (bit % 8));
    lm_hasher_init(&h, 0);
    lm_hasher_update(&h, data, 100);
    lm_hasher_final(&h, d2);
    data[bit / 8] ^= (uint8_t)(1u << (bit % 8));
    int d = 0;
    for (int k = 0; k < 32; k++)
      d += __builtin_popcount(d1[k] ^ d2[k]);
    total += d, trials++;
    lo = d < lo ? d : lo, hi = d > hi ? d : hi;
  }
  printf("avalanche: mean %.1f of 256 bits (min %d, max %d)\n", total / trials, lo, hi);
  assert_true(total / trials > 124 && total / trials < 132);
  assert_true(lo > 90 && hi < 166);
  /* Known answers: these values are part of the file format (docs/kv-state-format.md). */
  printf("hash64(\"\", 0) = %016llx, hash64(\"lumen\", 0) = %016llx\n",
         (unsigned long long)lm_hash64("", 0, 0), (unsigned long long)lm_hash64("lumen", 5, 0));
  assert_true(lm_hash64("", 0, 0) == 0x83ebae47db59693aull);
  assert_true(lm_hash64("lumen", 5, 0) == 0x7ed3fb8e89c0c3e5ull);
}

static void t_fingerprint(void **st) {
  ctx *c = *st;
  uint8_t a[32], b[32], q[32];
  fingerprint(c->m, a);
  fingerprint(c->mq, q);
  assert_memory_not_equal(a, q, 32);
  /* The same checkpoint in another directory: same fingerprint (paths do not enter). */
  assert_int_equal(lm_test_write_tiny(lm_test_tiny_config, TMP "/tiny_copy"), LM_OK);
  lm_model *m2;
  assert_int_equal(lm_model_load(TMP "/tiny_copy", &m2), LM_OK);
  fingerprint(m2, b);
  assert_memory_equal(a, b, 32);
  lm_model_free(m2);
  /* A config.json that differs by one value: another model. */
  char cfg[2048];
  snprintf(cfg, sizeof cfg, "%s", lm_test_tiny_config);
  char *p = strstr(cfg, "30.0");
  assert_non_null(p);
  p[0] = '2';
  assert_int_equal(lm_test_write_tiny(cfg, TMP "/tiny_other"), LM_OK);
  assert_int_equal(lm_model_load(TMP "/tiny_other", &m2), LM_OK);
  fingerprint(m2, b);
  assert_memory_not_equal(a, b, 32);
  lm_model_free(m2);
  /* Synthetic models: preset + bits/group/seed. */
  lm_model *s1, *s2;
  assert_int_equal(lm_model_synth(TMP "/tiny/config.json", 0, 0, 1, &s1), LM_OK);
  assert_int_equal(lm_model_synth(TMP "/tiny/config.json", 0, 0, 2, &s2), LM_OK);
  fingerprint(s1, a);
  fingerprint(s2, b);
  assert_memory_not_equal(a, b, 32);
  fingerprint(s2, a);
  assert_memory_equal(a, b, 32);
  lm_model_free(s1);
  lm_model_free(s2);
}

/* ---- clones and prefix states
 * ---------------------------------------------------------------------- */

static void t_clone(void **st) {
  ctx *c = *st;
  lm_kv_spec specs[8];
  lm_model_kv_specs(c->m, specs);
  int32_t ids[N_IDS];
  test_ids(ids, N_IDS);
  int64_t V = c->m->cfg.vocab_size;
  float *la = malloc(N_IDS * V * sizeof(float)), *lb = malloc(N_IDS * V * sizeof(float));
  lm_kv_set *a = new_set(c->be, c->m, specs), *b;
  feed(c->m, c->be, a, ids, 0, WRAP, 3, NULL);
  assert_int_equal(lm_kv_set_clone(a, &b), LM_OK);
  assert_int_equal(lm_kv_set_len(b), WRAP);
  assert_true(lm_kv_set_alloc_bytes(b) <= lm_kv_set_alloc_bytes(a)); /* exact fit */
  feed(c->m, c->be, a, ids, WRAP, N_IDS, 2, la);
  feed(c->m, c->be, b, ids, WRAP, N_IDS, 2, lb);
  assert_memory_equal(la, lb, (size_t)(N_IDS - WRAP) * V * sizeof(float));
  /* A wrapped ring gives back an earlier state only as far as its spare slots reach; an
   * unwrapped one always can. */
  lm_kv_set *p;
  assert_int_equal(lm_kv_set_min_len(a), N_IDS - LM_KV_RING_SPARE - 1);
  assert_true(lm_kv_set_can_truncate(a, N_IDS - LM_KV_RING_SPARE - 1));
  assert_false(lm_kv_set_can_truncate(a, N_IDS - LM_KV_RING_SPARE - 2));
  assert_false(lm_kv_set_can_truncate(a, 5));
  assert_int_equal(lm_kv_set_clone_prefix(a, 5, &p), LM_ERR_STATE);
  assert_null(p);
  lm_kv_set *u = new_set(c->be, c->m, specs);
  feed(c->m, c->be, u, ids, 0, 4, 4, NULL);
  assert_true(lm_kv_set_can_truncate(u, 2));
  assert_int_equal(lm_kv_set_clone_prefix(u, 2, &p), LM_OK);
  assert_int_equal(lm_kv_set_len(p), 2);
  lm_kv_set_free(p);
  assert_int_equal(lm_kv_set_clone_prefix(u, 5, &p), LM_ERR_INVALID);
  lm_kv_set_free(u);
  lm_kv_set_free(a);
  lm_kv_set_free(b);
  free(la);
  free(lb);
}

/* ---- round trips
 * ------------------------------------------------------------------------------------ */

/* Feeds `at` tokens (in `chunk` steps), saves, restores, and checks that continuing the restored
 * set gives bit-identical logits to continuing the original one. */
static void round_trip(ctx *c, const lm_model *m, const lm_kv_spec *specs, int64_t at,
                       int64_t chunk) {
  int32_t ids[N_IDS];
  test_ids(ids, N_IDS);
  int64_t V = m->cfg.vocab_size, rest = N_IDS - at;
  float *la = malloc((size_t)(N_IDS * V) * sizeof(float)),
        *lb = malloc((size_t)(N_IDS * V) * sizeof(float));
  lm_kv_set *a = new_set(c->be, m, specs), *b = NULL;
  if (at) feed(m, c->be, a, ids, 0, at, chunk, NULL);
  uint8_t fp[32];
  fingerprint(m, fp);
  char sig[64];
  printf("round trip at %2lld tokens (chunk %lld): cache 0 %s, cache 2 %s\n", (long long)at,
         (long long)chunk, lm_kv_signature(a->caches[0], sig, sizeof sig),
         lm_kv_signature(a->caches[2], sig + 32, 32));
  assert_int_equal(lm_kv_state_save(TMP "/rt.kvstate", fp, a, ids, at), LM_OK);
  int32_t *tok;
  int64_t nt;
  lm_status s = lm_kv_state_load(TMP "/rt.kvstate", m, specs, c->be, &b, &tok, &nt);
  if (s) fprintf(stderr, "load: %s\n", lm_errmsg());
  assert_int_equal(s, LM_OK);
  assert_int_equal(nt, at);
  if (at) assert_memory_equal(tok, ids, (size_t)at * sizeof *ids);
  for (int i = 0; i < a->n; i++) {
    lm_kv_spec pa = lm_kv_plan_spec(a->caches[i]), pb = lm_kv_plan_spec(b->caches[i]);
    lm_kv_spec ya = lm_kv_layout_spec(a->caches[i]), yb = lm_kv_layout_spec(b->caches[i]);
    assert_true(lm_kv_spec_equal(&pa, &pb) && lm_kv_spec_equal(&ya, &yb));
    assert_int_equal(a->caches[i]->has_pending, b->caches[i]->has_pending);
  }
  feed(m, c->be, a, ids, at, N_IDS, 1 + (rest > 3 ? 2 : 0), la);
  feed(m, c->be, b, ids, at, N_IDS, 1 + (rest > 3 ? 2 : 0), lb);
  assert_memory_equal(la, lb, (size_t)(rest * V) * sizeof(float));
  free(tok);
  lm_kv_set_free(a);
  lm_kv_set_free(b);
  free(la);
  free(lb);
}

static void t_round_trip_plain(void **st) {
  ctx *c = *st;
  lm_kv_spec specs[8];
  plan(c->m, "off", 0, specs);
  round_trip(c, c->m, specs, 0, 1);  /* an empty session */
  round_trip(c, c->m, specs, 3, 3);  /* rings not yet full */
  round_trip(c, c->m, specs, 20, 2); /* exactly full (window 4 + LM_KV_RING_SPARE slots) */
  round_trip(c, c->m, specs, 33, 5); /* wrapped */
  round_trip(c, c->m, specs, 37, 1); /* wrapped, decoded token by token */
}

static void t_round_trip_quant(void **st) {
  ctx *c = *st;
  lm_kv_spec specs[8];
  plan(c->mq, "8", 0, specs);
  round_trip(c, c->mq, specs, 31, 4);
  plan(c->mq, "4", 0, specs);
  round_trip(c, c->mq, specs, 2, 2);
  round_trip(c, c->mq, specs, 9, 9);
  plan(c->mq, "off", 0, specs);
  round_trip(c, c->mq, specs, 10, 3);
}

/* TurboQuant on the full-attention caches (the rings stay plain). */
static void t_round_trip_turboquant(void **st) {
  ctx *c = *st;
  lm_kv_spec specs[8];
  plan(c->mq, "turboquant:8:3", 0, specs);
  round_trip(c, c->mq, specs, 31, 4);
  plan(c->mq, "turboquant:4:2", 0, specs);
  round_trip(c, c->mq, specs, 9, 9);
  assert_true(lm_kv_kind_tq(specs[2].kind));
}

/* --kv-quant-start: saved while still plain (pending), and after converting. */
static void t_round_trip_delayed(void **st) {
  ctx *c = *st;
  lm_kv_spec specs[8];
  plan(c->mq, "8", 6, specs);
  round_trip(c, c->mq, specs, 4, 4);  /* plain, pending */
  round_trip(c, c->mq, specs, 12, 3); /* converted at the reserve before the third chunk */
  lm_kv_set *a = new_set(c->be, c->mq, specs);
  int32_t ids[N_IDS];
  test_ids(ids, N_IDS);
  feed(c->mq, c->be, a, ids, 0, 12, 3, NULL);
  assert_false(a->caches[0]->has_pending);
  assert_true(lm_kv_kind_quant(a->caches[0]->kind));
  lm_kv_set_free(a);
}

/* K/V elements change type when a state moves between backends (here: a CPU backend that
 * claims bf16 activations; only memory ops run on it). */
static void t_dtype_conversion(void **st) {
  ctx *c = *st;
  lm_kv_spec specs[8];
  plan(c->m, "off", 0, specs);
  lm_kv_set *a = new_set(c->be, c->m, specs), *b, *r;
  int32_t ids[N_IDS], *tok;
  int64_t nt;
  test_ids(ids, N_IDS);
  feed(c->m, c->be, a, ids, 0, 7, 7, NULL);
  uint8_t fp[32];
  fingerprint(c->m, fp);
  assert_int_equal(lm_kv_state_save(TMP "/dt.kvstate", fp, a, ids, 7), LM_OK);
  lm_backend bf = *c->be;
  bf.act_dtype = LM_DT_BF16;
  assert_int_equal(lm_kv_state_load(TMP "/dt.kvstate", c->m, specs, &bf, &b, &tok, &nt), LM_OK);
  free(tok);
  assert_int_equal(lm_kv_state_save(TMP "/dt16.kvstate", fp, b, ids, 7), LM_OK);
  assert_int_equal(lm_kv_state_load(TMP "/dt16.kvstate", c->m, specs, c->be, &r, &tok, &nt), LM_OK);
  free(tok);
  for (int i = 0; i < a->n; i++) {
    const lm_kv_cache *ca = a->caches[i], *cb = b->caches[i], *cr = r->caches[i];
    assert_int_equal(cb->dtype, LM_DT_BF16);
    int64_t w = lm_kv_held(ca) * ca->n_kv_heads * ca->head_dim;
    const float *fa = ca->k, *fr = cr->k; /* CPU memory */
    const uint16_t *hb = cb->k;
    for (int64_t k = 0; k < w; k++) {
      assert_true(lm_f32_to_bf16(fa[k]) == hb[k]);
      assert_true(lm_round_bf16(fa[k]) == fr[k]);
    }
  }
  lm_kv_set_free(a);
  lm_kv_set_free(b);
  lm_kv_set_free(r);
}

/* ---- the bad-file table
 * ----------------------------------------------------------------------------- */

/* Checksum seeds and field offsets from docs/kv-state-format.md, to forge files whose checksums
 * are valid but whose fields are not: the structural checks must catch them on their own. */
enum { S_HEADER = 0x4c4b5601, S_TABLE = 0x4c4b5602, S_TOKENS = 0x4c4b5603 };

static uint64_t rd64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--)
    v = (v << 8) | p[i];
  return v;
}
static void wr64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}
static void wr32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}

/* Recomputes the table, token and header checksums of a (modified) file of n bytes; regions
 * that a forged count pushes past the end keep their old sums. */
static void reseal(uint8_t *b, size_t n) {
  uint64_t nc = b[24] | (uint64_t)b[25] << 8, nt = rd64(b + 32);
  if (128 + nc * 256 <= n) wr64(b + 104, lm_hash64(b + 128, (size_t)(nc * 256), S_TABLE));
  if (nt < n && 128 + nc * 256 + nt * 4 <= n)
    wr64(b + 112, lm_hash64(b + 128 + nc * 256, (size_t)(nt * 4), S_TOKENS));
  wr64(b + 120, lm_hash64(b, 120, S_HEADER));
}

typedef struct bad_ctx {
  ctx *c;
  const lm_kv_spec *specs;
  const uint8_t *good;
  size_t n;
  uint8_t *buf;
  int model_level; /* a defect only the model reveals (the parser alone accepts the file) */
} bad_ctx;

/* Writes buf[0..n) as a file, loads it, and expects status `want` and a message containing `msg`.
 */
static void expect_load(bad_ctx *x, const uint8_t *buf, size_t n, lm_status want, const char *msg,
                        const char *row) {
  write_all(TMP "/bad.kvstate", buf, n);
  lm_kv_set *kv = (lm_kv_set *)1;
  int32_t *tok = (int32_t *)1;
  int64_t nt = -1;
  lm_status s = lm_kv_state_load(TMP "/bad.kvstate", x->c->m, x->specs, x->c->be, &kv, &tok, &nt);
  if (s != want || !strstr(lm_errmsg(), msg))
    fprintf(stderr, "row '%s': got %s '%s', want %s '%s'\n", row, lm_status_name(s), lm_errmsg(),
            lm_status_name(want), msg);
  assert_int_equal(s, want);
  assert_non_null(strstr(lm_errmsg(), msg));
  assert_null(kv);
  assert_null(tok);
  assert_int_equal(nt, 0);
  /* The parser alone agrees (with every checksum on). */
  lm_kv_state_info *in = NULL;
  if ((want == LM_ERR_CORRUPT || want == LM_ERR_UNSUPPORTED) && !x->model_level) {
    assert_int_not_equal(lm_kv_state_parse(buf, n, "bad", LM_KV_STATE_VERIFY_ALL, &in), LM_OK);
    assert_null(in);
  }
}

/* A copy of the good file with one change, resealed or not. */
static uint8_t *variant(bad_ctx *x) {
  memcpy(x->buf, x->good, x->n);
  return x->buf;
}

static void make_good(bad_ctx *x, lm_kv_set **kv_out) {
  int32_t ids[N_IDS];
  test_ids(ids, N_IDS);
  lm_kv_set *kv = new_set(x->c->be, x->c->m, x->specs);
  feed(x->c->m, x->c->be, kv, ids, 0, WRAP, 10, NULL);
  uint8_t fp[32];
  fingerprint(x->c->m, fp);
  assert_int_equal(lm_kv_state_save(TMP "/good.kvstate", fp, kv, ids, WRAP), LM_OK);
  x->good = read_all(TMP "/good.kvstate", &x->n);
  x->buf = malloc(x->n);
  *kv_out = kv;
}

static void t_truncated(void **st) {
  ctx *c = *st;
  lm_kv_spec specs[8];
  lm_model_kv_specs(c->m, specs);
  bad_ctx x = {.c = c, .specs = specs};
  lm_kv_set *kv;
  make_good(&x, &kv);
  lm_kv_state_info *in;
  assert_int_equal(lm_kv_state_parse(x.good, x.n, "good", LM_KV_STATE_VERIFY_ALL, &in), LM_OK);
  printf("good file: %zu bytes, data from %llu, %d caches\n", x.n,
         (unsigned long long)in->data_offset, in->n_caches);
  assert_int_equal(in->data_offset % 4096, 0);
  for (int i = 0; i < in->n_caches; i++)
    for (int a = 0; a < LM_KV_ARRAYS; a++)
      assert_int_equal(in->caches[i].arrays[a].offset % 4096, 0);
  /* Cut at every interesting point: in the header, the table, the tokens, padding, each block. */
  size_t cuts[64];
  int nc = 0;
  size_t fixed[] = {1,
                    7,
                    8,
                    12,
                    64,
                    127,
                    128,
                    129,
                    128 + 256,
                    128 + 256 * 3 + 10,
                    (size_t)in->data_offset - 1,
                    (size_t)in->data_offset,
                    (size_t)in->data_offset + 1};
  for (size_t i = 0; i < sizeof fixed / sizeof *fixed; i++)
    cuts[nc++] = fixed[i];
  for (int i = 0; i < in->n_caches; i++)
    for (int a = 0; a < LM_KV_ARRAYS && nc < 60; a++)
      if (in->caches[i].arrays[a].bytes)
        cuts[nc++] = (size_t)(in->caches[i].arrays[a].offset + in->caches[i].arrays[a].bytes / 2);
  cuts[nc++] = x.n - 1;
  for (int i = 0; i < nc; i++) {
    char row[64];
    snprintf(row, sizeof row, "truncated at %zu", cuts[i]);
    expect_load(&x, x.good, cuts[i], LM_ERR_CORRUPT, "truncated", row);
  }
  expect_load(&x, x.good, 0, LM_ERR_CORRUPT, "empty file", "empty");
  /* A byte too many. */
  uint8_t *longer = malloc(x.n + 1);
  memcpy(longer, x.good, x.n);
  longer[x.n] = 0;
  expect_load(&x, longer, x.n + 1, LM_ERR_CORRUPT, "past the declared end", "one byte appended");
  free(longer);
  lm_kv_state_info_free(in);
  lm_kv_set_free(kv);
  free((void *)x.good);
  free(x.buf);
}

static void t_flipped(void **st) {
  ctx *c = *st;
  lm_kv_spec specs[8];
  lm_model_kv_specs(c->m, specs);
  bad_ctx x = {.c = c, .specs = specs};
  lm_kv_set *kv;
  make_good(&x, &kv);
  lm_kv_state_info *in;
  assert_int_equal(lm_kv_state_parse(x.good, x.n, "good", LM_KV_STATE_VERIFY_ALL, &in), LM_OK);
  /* Every byte of the fixed header. */
  for (int i = 0; i < 128; i++) {
    uint8_t *b = variant(&x);
    b[i] ^= 0x10;
    const char *msg = i < 8    ? "bad magic"
                      : i < 12 ? "version"
                      : i < 16 ? "byte-order"
                               : "header checksum";
    lm_status want = i >= 8 && i < 12 ? LM_ERR_UNSUPPORTED : LM_ERR_CORRUPT;
    char row[64];
    snprintf(row, sizeof row, "header byte %d flipped", i);
    expect_load(&x, b, x.n, want, msg, row);
  }
  /* Bytes of the cache table, the token ids, and each data block. */
  for (int i = 128; i < 128 + 256 * in->n_caches; i += 37) {
    uint8_t *b = variant(&x);
    b[i] ^= 0x01;
    expect_load(&x, b, x.n, LM_ERR_CORRUPT, "cache table checksum", "table byte flipped");
  }
  size_t t0 = 128 + 256 * (size_t)in->n_caches;
  for (size_t i = t0; i < t0 + 4 * (size_t)in->n_tokens; i += 5) {
    uint8_t *b = variant(&x);
    b[i] ^= 0x80;
    expect_load(&x, b, x.n, LM_ERR_CORRUPT, "token ids checksum", "token byte flipped");
  }
  for (int i = 0; i < in->n_caches; i++)
    for (int a = 0; a < LM_KV_ARRAYS; a++) {
      const lm_kv_state_block *bl = &in->caches[i].arrays[a];
      if (!bl->bytes) continue;
      uint8_t *b = variant(&x);
      b[bl->offset + bl->bytes - 1] ^= 0x04;
      expect_load(&x, b, x.n, LM_ERR_CORRUPT, "data checksum mismatch", "data byte flipped");
    }
  /* A flipped byte in the padding between blocks is outside every checksum, and harmless. */
  uint8_t *b = variant(&x);
  b[in->data_offset - 1] ^= 0xff;
  write_all(TMP "/pad.kvstate", b, x.n);
  lm_kv_set *r;
  int32_t *tok;
  int64_t nt;
  assert_int_equal(lm_kv_state_load(TMP "/pad.kvstate", c->m, specs, c->be, &r, &tok, &nt), LM_OK);
  lm_kv_set_free(r);
  free(tok);
  lm_kv_state_info_free(in);
  lm_kv_set_free(kv);
  free((void *)x.good);
  free(x.buf);
}

/* Fields changed and resealed: the checksums pass, the structural checks must not. */
static void t_forged(void **st) {
  ctx *c = *st;
  lm_kv_spec specs[8];
  lm_model_kv_specs(c->m, specs);
  bad_ctx x = {.c = c, .specs = specs};
  lm_kv_set *kv;
  make_good(&x, &kv);
  uint8_t *b, *e0 = NULL, *e2 = NULL; /* cache 0: a ring; cache 2: plain */
  size_t E0 = 128, E2 = 128 + 2 * 256;
#define ROW(expr, want, msg)                                                                       \
  do {                                                                                             \
    b = variant(&x);                                                                               \
    e0 = b + E0, e2 = b + E2;                                                                      \
    (void)e0, (void)e2;                                                                            \
    expr;                                                                                          \
    reseal(b, x.n);                                                                                \
    expect_load(&x, b, x.n, want, msg, #expr);                                                     \
  } while (0)
  ROW(wr32(b + 8, 1), LM_ERR_UNSUPPORTED, "version 1");
  ROW(wr32(b + 12, 0x04030201u), LM_ERR_UNSUPPORTED, "other byte order");
  ROW(wr32(b + 12, 0x11111111u), LM_ERR_CORRUPT, "byte-order mark");
  ROW(wr32(b + 16, 64), LM_ERR_CORRUPT, "header/entry sizes");
  ROW(wr32(b + 20, 128), LM_ERR_CORRUPT, "header/entry sizes");
  ROW(wr32(b + 28, 1), LM_ERR_CORRUPT, "unknown flags");
  ROW(wr32(b + 24, 5000), LM_ERR_CORRUPT, "caches (at most");
  ROW(wr32(b + 24, 2), LM_ERR_CORRUPT, "region offsets");
  ROW(wr64(b + 32, (uint64_t)1 << 40), LM_ERR_CORRUPT, "tokens (at most");
  ROW(wr64(b + 32, 8), LM_ERR_CORRUPT, "");
  ROW(wr64(b + 56, rd64(b + 56) + 4096), LM_ERR_CORRUPT, "region offsets");
  ROW(wr64(b + 64, rd64(b + 64) - 1), LM_ERR_CORRUPT, "past the declared end");
  ROW(wr64(b + 64, UINT64_MAX), LM_ERR_CORRUPT, "truncated");
  ROW(wr32(e0 + 0, 9), LM_ERR_CORRUPT, "unknown cache kind");
  ROW(wr32(e0 + 12, 0), LM_ERR_CORRUPT, "bad ring window");
  ROW(wr32(e0 + 24, 0), LM_ERR_CORRUPT, "geometry");
  ROW(wr32(e0 + 28, 1u << 30), LM_ERR_CORRUPT, "geometry");
  ROW(wr64(e0 + 40, 0), LM_ERR_CORRUPT, "bad ring window");
  ROW(wr64(e2 + 40, 4), LM_ERR_CORRUPT, "bad ring window");
  ROW(wr32(e2 + 4, 8), LM_ERR_CORRUPT, "plain plan with quantization");
  ROW(wr32(e2 + 16, 8), LM_ERR_CORRUPT, "plain layout with quantization");
  ROW(wr32(e2 + 224, 3), LM_ERR_CORRUPT, "value bits on a kind");
  ROW(wr32(e0 + 228, 3), LM_ERR_CORRUPT, "value bits on a kind");
  ROW(wr32(e2 + 32, 1), LM_ERR_CORRUPT, "does not follow plan");
  ROW(wr32(e2 + 36, 7), LM_ERR_CORRUPT, "element type");
  ROW(wr64(e2 + 56, 8), LM_ERR_CORRUPT, "tokens in");
  ROW(wr64(e0 + 64, 9), LM_ERR_CORRUPT, "tokens in"); /* a wrapped ring stores its slots */
  ROW(wr64(e0 + 216, WRAP - 1), LM_ERR_CORRUPT, "high-water mark");
  ROW(wr64(e0 + 216, WRAP + LM_KV_RING_SPARE + 2), LM_ERR_CORRUPT, "high-water mark");
  ROW(wr64(e2 + 216, WRAP + 1), LM_ERR_CORRUPT, "high-water mark");
  ROW(wr64(e2 + 72 + 8, rd64(e2 + 72 + 8) - 4), LM_ERR_CORRUPT, "geometry needs");
  ROW(wr64(e2 + 72, rd64(e2 + 72) + 8), LM_ERR_CORRUPT, "misaligned");
  ROW(wr64(e2 + 72 + 24, rd64(e2 + 72)), LM_ERR_CORRUPT, "out of order");
  ROW(wr64(e2 + 72, (uint64_t)1 << 62), LM_ERR_CORRUPT, "past the end");
  ROW(wr64(e2 + 72 + 48, 4096), LM_ERR_CORRUPT, "empty K scales block");
  ROW(b[E2 + 250] = 1, LM_ERR_CORRUPT, "reserved bytes");
  ROW(memcpy(b, "LMKVSTAX", 8), LM_ERR_CORRUPT, "bad magic");
  /* Bytes of a token id changed consistently: a token outside the vocabulary. */
  x.model_level = 1;
  ROW(wr32(b + 128 + 3 * 256 + 8, 1000), LM_ERR_CORRUPT, "outside the vocabulary");
#undef ROW
  lm_kv_set_free(kv);
  free((void *)x.good);
  free(x.buf);
}

static void t_mismatch(void **st) {
  ctx *c = *st;
  lm_kv_spec specs[8], other[8];
  lm_model_kv_specs(c->m, specs);
  bad_ctx x = {.c = c, .specs = specs};
  lm_kv_set *kv, *r = NULL;
  make_good(&x, &kv);
  int32_t *tok = NULL;
  int64_t nt;
  /* Another model with the same geometry. */
  lm_model *m2;
  assert_int_equal(lm_model_load(TMP "/tiny_other", &m2), LM_OK);
  assert_int_equal(lm_kv_state_load(TMP "/good.kvstate", m2, specs, c->be, &r, &tok, &nt),
                   LM_ERR_INVALID);
  printf("other model: %s\n", lm_errmsg());
  assert_non_null(strstr(lm_errmsg(), "another model"));
  assert_null(r);
  lm_model_free(m2);
  /* Another cache plan: a ring where the file has a plain cache, and another window. */
  memcpy(other, specs, sizeof other);
  other[2].kind = LM_KV_ROTATING_PLAIN;
  other[2].window = 4;
  assert_int_equal(lm_kv_state_load(TMP "/good.kvstate", c->m, other, c->be, &r, &tok, &nt),
                   LM_ERR_INVALID);
  printf("other plan: %s\n", lm_errmsg());
  assert_non_null(strstr(
      lm_errmsg(), "cache 2 was saved as kv:plain; this session's plan is kv:rotating-plain"));
  memcpy(other, specs, sizeof other);
  other[0].window = 8;
  assert_int_equal(lm_kv_state_load(TMP "/good.kvstate", c->m, other, c->be, &r, &tok, &nt),
                   LM_ERR_INVALID);
  /* Plans of the quantizable model: a file with --kv-quant 8 read by a plain session, and
   * quant_start differences. */
  lm_kv_spec q8[8], q8s[8], off[8];
  plan(c->mq, "8", 0, q8);
  plan(c->mq, "8", 6, q8s);
  plan(c->mq, "off", 0, off);
  lm_kv_set *q = new_set(c->be, c->mq, q8);
  int32_t ids[N_IDS];
  test_ids(ids, N_IDS);
  feed(c->mq, c->be, q, ids, 0, 5, 5, NULL);
  uint8_t fp[32];
  fingerprint(c->mq, fp);
  assert_int_equal(lm_kv_state_save(TMP "/q8.kvstate", fp, q, ids, 5), LM_OK);
  assert_int_equal(lm_kv_state_load(TMP "/q8.kvstate", c->mq, off, c->be, &r, &tok, &nt),
                   LM_ERR_INVALID);
  printf("other plan: %s\n", lm_errmsg());
  assert_non_null(strstr(lm_errmsg(),
                         "cache 0 was saved as kv:rotating-quant:8:32; this session's plan is "
                         "kv:rotating-plain"));
  assert_int_equal(lm_kv_state_load(TMP "/q8.kvstate", c->mq, q8s, c->be, &r, &tok, &nt),
                   LM_ERR_INVALID);
  assert_non_null(strstr(lm_errmsg(), "from token 6"));
  assert_int_equal(lm_kv_state_load(TMP "/q8.kvstate", c->mq, q8, c->be, &r, &tok, &nt), LM_OK);
  lm_kv_set_free(r);
  free(tok);
  r = NULL;
  /* The wrong number of caches. */
  lm_kv_state_expect e = {.specs = specs, .n_specs = 2};
  assert_int_equal(lm_kv_state_load_ex(TMP "/good.kvstate", &e, c->be, &r, &tok, &nt),
                   LM_ERR_INVALID);
  assert_non_null(strstr(lm_errmsg(), "3 caches; this session's plan has 2"));
  lm_kv_set_free(q);
  lm_kv_set_free(kv);
  free((void *)x.good);
  free(x.buf);
}

/* No file, a directory, and targets that cannot be written: clear errors, nothing left behind. */
static int count_temps(const char *dir) {
  DIR *d = opendir(dir);
  int n = 0;
  for (struct dirent *e; d && (e = readdir(d));)
    n += strstr(e->d_name, ".tmp-") != NULL;
  if (d) closedir(d);
  return n;
}

static void t_paths(void **st) {
  ctx *c = *st;
  lm_kv_spec specs[8];
  lm_model_kv_specs(c->m, specs);
  lm_kv_set *kv = new_set(c->be, c->m, specs), *r = NULL;
  int32_t ids[N_IDS], *tok = NULL;
  int64_t nt;
  test_ids(ids, N_IDS);
  feed(c->m, c->be, kv, ids, 0, 6, 6, NULL);
  uint8_t fp[32];
  fingerprint(c->m, fp);
  assert_int_equal(lm_kv_state_load(TMP "/no-such.kvstate", c->m, specs, c->be, &r, &tok, &nt),
                   LM_ERR_NOT_FOUND);
  assert_int_equal(lm_kv_state_load(TMP, c->m, specs, c->be, &r, &tok, &nt), LM_ERR_IO);
  assert_non_null(strstr(lm_errmsg(), "is a directory"));
  assert_int_equal(lm_kv_state_save(TMP "/no-such-dir/x.kvstate", fp, kv, ids, 6), LM_ERR_IO);
  printf("unwritable: %s\n", lm_errmsg());
  assert_non_null(strstr(lm_errmsg(), "cannot create a temporary file"));
  mkdir(TMP "/a-dir", 0755);
  int before = count_temps(TMP);
  assert_int_equal(lm_kv_state_save(TMP "/a-dir", fp, kv, ids, 6), LM_ERR_IO);
  printf("directory target: %s\n", lm_errmsg());
  assert_int_equal(count_temps(TMP), before);
  /* The wrong token count for the caches: refused before any file is made; an existing target
   * keeps its contents. */
  assert_int_equal(lm_kv_state_save(TMP "/keep.kvstate", fp, kv, ids, 6), LM_OK);
  size_t n0, n1;
  uint8_t *b0 = read_all(TMP "/keep.kvstate", &n0);
  assert_int_equal(lm_kv_state_save(TMP "/keep.kvstate", fp, kv, ids, 5), LM_ERR_INVALID);
  assert_non_null(strstr(lm_errmsg(), "holds 6 tokens, not the 5 given"));
  uint8_t *b1 = read_all(TMP "/keep.kvstate", &n1);
  assert_int_equal(n0, n1);
  assert_memory_equal(b0, b1, n0);
  assert_int_equal(count_temps(TMP), before);
  free(b0);
  free(b1);
  lm_kv_set_free(kv);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(t_hash),
                                     cmocka_unit_test(t_fingerprint),
                                     cmocka_unit_test(t_clone),
                                     cmocka_unit_test(t_round_trip_plain),
                                     cmocka_unit_test(t_round_trip_quant),
                                     cmocka_unit_test(t_round_trip_delayed),
                                     cmocka_unit_test(t_round_trip_turboquant),
                                     cmocka_unit_test(t_dtype_conversion),
                                     cmocka_unit_test(t_truncated),
                                     cmocka_unit_test(t_flipped),
                                     cmocka_unit_test(t_forged),
                                     cmocka_unit_test(t_mismatch),
                                     cmocka_unit_test(t_paths)};
  return cmocka_run_group_tests(tests, setup, teardown);
}
