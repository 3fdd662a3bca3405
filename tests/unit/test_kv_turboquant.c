/* test_kv_turboquant.c — the kv:turboquant:<k>:<v> cache kind on the CPU backend: its attention
 * (keys dequantized a tile at a time, values summed in the rotated domain, each output row
 * un-rotated once) against a reference that decodes the whole window eagerly and attends in
 * double; results independent of how a sequence is chunked (every read sees stored values);
 * trim, clones and state files; the plan (--kv-quant turboquant:K:V on full-attention caches
 * only) and its refusals; the state-file fields of the kind, checked by the parser. */
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
#include "kv/batch.h"
#include "kv/kv_snapshot.h"
#include "kv/kv_state.h"
#include "model/kv_plan.h"
#include "util/tiny_model.h"

#define TMP LM_BUILD_DIR "/tmp/test_kv_turboquant"
#define H 2  /* KV heads */
#define G 3  /* query heads per KV head */
#define N 80 /* positions: three 32-position tiles, the last one partial */
#define MAXD 128

typedef struct geom {
  int hd, k_bits, v_bits;
} geom;

static lm_kv_spec tq_spec(geom g) {
  return (lm_kv_spec){.kind = LM_KV_TURBOQUANT,
                      .n_kv_heads = H,
                      .head_dim = g.hd,
                      .bits = g.k_bits,
                      .v_bits = g.v_bits,
                      .group = LM_TQ_BLOCK};
}

/* A standard normal (Box–Muller) of (seed, i). */
static float gauss(uint64_t seed, uint64_t i) {
  const double two53 = 9007199254740992.0, two_pi = 6.283185307179586;
  double u1 = ((double)(lm_rng_u64(seed, 1, i) >> 11) + 1.0) / two53;
  double u2 = (double)(lm_rng_u64(seed, 2, i) >> 11) / two53;
  return (float)(sqrt(-2.0 * log(u1)) * cos(two_pi * u2));
}

/* The q, k or v row of position p (which 0, 1, 2) of the sequence `seed`: a function of the
 * position only, so every chunking feeds the same rows. Keys get a per-channel offset, as real
 * keys have, so the affine zero is exercised. */
static void row_of(uint64_t seed, int which, int64_t p, int n, float *x) {
  for (int i = 0; i < n; i++)
    x[i] = gauss(seed * 3 + (uint64_t)which, (uint64_t)(p * n + i)) +
           (which == 1 ? 0.05f * (float)(i % 7) : 0.0f);
}

/* One step over positions [p0, p0 + n) of seed's sequence: stage, attend, append, as the forward
 * does for a donor layer; out[p][H*G*hd] receives the attention output. */
static void step(lm_backend *be, lm_kv_set *kv, geom g, uint64_t seed, int64_t p0, int64_t n,
                 float *out) {
  int64_t qw = (int64_t)H * G * g.hd, kw = (int64_t)H * g.hd, sw = lm_kv_stage_row_bound(kw);
  float *q = malloc((size_t)(n * qw) * sizeof(float)),
        *k = malloc((size_t)(n * kw) * sizeof(float)),
        *v = malloc((size_t)(n * kw) * sizeof(float));
  uint8_t *stage = malloc((size_t)(n * sw));
  int32_t ids[N] = {0}, pos[N], seq[N] = {0};
  for (int64_t t = 0; t < n; t++) {
    pos[t] = (int32_t)(p0 + t);
    row_of(seed, 0, p0 + t, (int)qw, q + t * qw);
    row_of(seed, 1, p0 + t, (int)kw, k + t * kw);
    row_of(seed, 2, p0 + t, (int)kw, v + t * kw);
  }
  assert_int_equal(lm_kv_set_reserve(kv, n), LM_OK);
  lm_batch b = {.n_tokens = (int32_t)n, .ids = ids, .pos = pos, .seq = seq, .n_seqs = 1, .kv = &kv};
  lm_tensor tq = {q, n, qw, qw, LM_DT_F32}, to = {out + p0 * qw, n, qw, qw, LM_DT_F32},
            tk = {k, n, kw, kw, LM_DT_F32}, tv = {v, n, kw, kw, LM_DT_F32},
            ts = {stage, n, sw, sw, LM_DT_U8};
  const lm_backend_ops *op = be->ops;
  assert_int_equal(op->begin_step(be, &b), LM_OK);
  assert_int_equal(op->kv_stage(be, &(lm_kv_stage_args){.k_new = tk, .v_new = tv, .stage = ts}),
                   LM_OK);
  assert_int_equal(op->attention(be, &(lm_attn_args){.out = to,
                                                     .q = tq,
                                                     .k_new = tk,
                                                     .v_new = tv,
                                                     .n_heads = H * G,
                                                     .n_kv_heads = H,
                                                     .head_dim = g.hd,
                                                     .scale = 1.0f / sqrtf((float)g.hd)}),
                   LM_OK);
  assert_int_equal(op->kv_append(be, &(lm_kv_append_args){.k_new = tk, .v_new = tv, .stage = ts}),
                   LM_OK);
  assert_int_equal(op->end_step(be), LM_OK);
  free(q), free(k), free(v), free(stage);
}

/* Feeds positions [from, to) of seed's sequence in steps of the lengths in plan (cycled). */
static void feed(lm_backend *be, lm_kv_set *kv, geom g, uint64_t seed, int64_t from, int64_t to,
                 const int *plan, float *out) {
  for (int64_t p = from, i = 0; p < to; i++) {
    int64_t n = plan[i % 8] < to - p ? plan[i % 8] : to - p;
    step(be, kv, g, seed, p, n, out);
    p += n;
  }
}

/* Row of head h at position p as stored, decoded eagerly: keys dequantized, values un-rotated. */
static void stored_rows(const lm_kv_cache *c, int64_t p, int h, float *k, float *v) {
  const lm_tq_params *tp = &c->tq;
  int64_t ng = lm_tq_groups(tp), sb = H * ng;
  const uint8_t *kc =
      (const uint8_t *)c->k + p * lm_kv_row_bytes(c, LM_KV_K) + h * lm_tq_key_code_bytes(tp);
  const uint8_t *vc =
      (const uint8_t *)c->v + p * lm_kv_row_bytes(c, LM_KV_V) + h * lm_tq_value_code_bytes(tp);
  lm_tq_key_decode(tp, kc, (const uint16_t *)c->ks + p * sb + h * ng,
                   (const uint16_t *)c->kb + p * sb + h * ng, k);
  lm_tq_value_decode_rot(tp, vc, (const uint16_t *)c->vs + p * sb + h * ng, v);
  lm_tq_unrotate(tp, v);
}

/* The eager reference: every position's causal attention over the whole stored window, in
 * double; the largest |difference| from got, relative to the largest |reference| value. */
static double eager_error(const lm_kv_cache *c, geom g, uint64_t seed, const float *got) {
  int hd = g.hd;
  int64_t qw = (int64_t)H * G * hd;
  float *k = malloc((size_t)(N * H * hd) * sizeof(float)),
        *v = malloc((size_t)(N * H * hd) * sizeof(float)), q[H * G * MAXD];
  for (int64_t p = 0; p < N; p++)
    for (int h = 0; h < H; h++)
      stored_rows(c, p, h, k + (p * H + h) * hd, v + (p * H + h) * hd);
  double worst = 0, scale = 0, s[N], o[MAXD];
  for (int64_t p = 0; p < N; p++) {
    row_of(seed, 0, p, (int)qw, q);
    for (int r = 0; r < H * G; r++) {
      int h = r / G;
      double m = -INFINITY, z = 0;
      for (int64_t j = 0; j <= p; j++) {
        s[j] = 0;
        for (int d = 0; d < hd; d++)
          s[j] += (double)q[r * hd + d] * k[(j * H + h) * hd + d];
        s[j] /= sqrt((double)hd);
        m = s[j] > m ? s[j] : m;
      }
      memset(o, 0, sizeof o);
      for (int64_t j = 0; j <= p; j++) {
        double e = exp(s[j] - m);
        z += e;
        for (int d = 0; d < hd; d++)
          o[d] += e * v[(j * H + h) * hd + d];
      }
      for (int d = 0; d < hd; d++) {
        double want = o[d] / z, have = got[p * qw + r * hd + d];
        worst = fmax(worst, fabs(want - have));
        scale = fmax(scale, fabs(want));
      }
    }
  }
  free(k), free(v);
  return worst / scale;
}

static lm_kv_set *new_set(lm_backend *be, geom g) {
  lm_kv_spec s = tq_spec(g);
  lm_kv_set *kv;
  lm_status st = lm_kv_set_create(be, &s, 1, &kv);
  if (st) fprintf(stderr, "create: %s\n", lm_errmsg());
  assert_int_equal(st, LM_OK);
  return kv;
}

static const int WHOLE[8] = {N, N, N, N, N, N, N, N}, SINGLE[8] = {1, 1, 1, 1, 1, 1, 1, 1},
                 MIXED[8] = {7, 1, 13, 1, 1, 32, 5, 2};

/* Attention agrees with the eager reference, and the three chunkings agree bit for bit. */
static void t_attention(void **st) {
  lm_backend *be = *st;
  const geom gs[] = {{64, 8, 3}, {128, 4, 2}, {64, 5, 5}, {128, 2, 4}};
  int64_t qw = H * G * MAXD;
  float *a = malloc((size_t)(N * qw) * sizeof(float)),
        *b = malloc((size_t)(N * qw) * sizeof(float));
  for (int i = 0; i < 4; i++) {
    geom g = gs[i];
    size_t bytes = (size_t)(N * H * G * g.hd) * sizeof(float);
    const int *plans[3] = {WHOLE, SINGLE, MIXED};
    for (int k = 0; k < 3; k++) {
      lm_kv_set *kv = new_set(be, g);
      feed(be, kv, g, 11, 0, N, plans[k], k ? b : a);
      if (k == 0) {
        double e = eager_error(kv->caches[0], g, 11, a);
        printf("d %d k%d v%d: attention vs eager decode, max |error| / max |out| = %.3g\n", g.hd,
               g.k_bits, g.v_bits, e);
        assert_true(e <= 1e-6);
      } else {
        assert_memory_equal(a, b, bytes); /* chunking changes nothing */
      }
      lm_kv_set_free(kv);
    }
  }
  free(a), free(b);
}

/* Trim gives back any number of tokens (the kind is never a ring); what follows is what a cache
 * that never held the trimmed tokens computes. Clones and copies of a prefix continue alike. */
static void t_trim_and_clone(void **st) {
  lm_backend *be = *st;
  geom g = {64, 8, 3};
  size_t row = (size_t)(H * G * g.hd) * sizeof(float);
  float *a = malloc(N * row), *b = malloc(N * row);
  lm_kv_set *x = new_set(be, g), *y = new_set(be, g), *cl;
  feed(be, x, g, 5, 0, N - 10, MIXED, a);
  assert_int_equal(lm_kv_set_min_len(x), 0);
  assert_int_equal(lm_kv_set_trim(x, 31), LM_OK);
  assert_int_equal(lm_kv_set_trim(x, N), LM_ERR_INVALID);
  feed(be, x, g, 6, N - 41, N, MIXED, a); /* another continuation after the trim */
  feed(be, y, g, 5, 0, N - 41, SINGLE, b);
  feed(be, y, g, 6, N - 41, N, WHOLE, b);
  assert_memory_equal(a + (N - 41) * row / sizeof(float), b + (N - 41) * row / sizeof(float),
                      41 * row);
  /* a clone of the first 30 tokens, continued, equals the original trimmed to 30 */
  assert_int_equal(lm_kv_set_clone_prefix(x, 30, &cl), LM_OK);
  char sa[64], sb[64];
  assert_string_equal(lm_kv_signature(cl->caches[0], sa, sizeof sa), "kv:turboquant:8:3");
  assert_int_equal(lm_kv_set_trim(x, N - 30), LM_OK);
  feed(be, x, g, 7, 30, N, MIXED, a);
  feed(be, cl, g, 7, 30, N, SINGLE, b);
  assert_memory_equal(a + 30 * row / sizeof(float), b + 30 * row / sizeof(float), (N - 30) * row);
  lm_kv_spec pa = lm_kv_plan_spec(x->caches[0]), pb = lm_kv_plan_spec(cl->caches[0]);
  assert_true(lm_kv_spec_equal(&pa, &pb));
  /* another width is another plan: the prefix cache and state files never mix them */
  lm_kv_spec other = tq_spec((geom){64, 8, 4});
  assert_false(lm_kv_spec_equal(&pa, &other));
  assert_string_equal(lm_kv_spec_signature(&other, sb, sizeof sb), "kv:turboquant:8:4");
  lm_kv_set_free(x), lm_kv_set_free(y), lm_kv_set_free(cl);
  free(a), free(b);
}

/* Sizes of §2.4, and geometries the codec lacks refused at creation. */
static void t_spec(void **st) {
  lm_backend *be = *st;
  lm_kv_spec s = tq_spec((geom){128, 8, 3});
  assert_int_equal(lm_kv_spec_bytes_per_token(&s, LM_DT_F32), H * 200);
  s = tq_spec((geom){64, 4, 2});
  assert_int_equal(lm_kv_spec_bytes_per_token(&s, LM_DT_F32), H * (64 * 6 / 8 + 6 * 2));
  lm_kv_cache *c;
  assert_int_equal(lm_kv_create(be, &s, &c), LM_OK);
  assert_int_equal(lm_kv_bytes_per_token(c), H * (64 * 6 / 8 + 6 * 2));
  assert_int_equal(lm_kv_capacity(c), LM_KV_UNBOUNDED);
  lm_kv_free(c);
  s = tq_spec((geom){96, 8, 3});
  assert_int_equal(lm_kv_create(be, &s, &c), LM_ERR_UNSUPPORTED);
  assert_non_null(strstr(lm_errmsg(), "head_dim 96"));
  s = tq_spec((geom){64, 8, 8});
  assert_int_equal(lm_kv_create(be, &s, &c), LM_ERR_UNSUPPORTED);
  assert_true(be->ops->supports_cache(be, "kv:turboquant:8:3"));
  assert_false(be->ops->supports_cache(be, "kv:turboquant:3:3"));
  assert_false(be->ops->supports_cache(be, "kv:turboquant:8:3:1"));
  assert_false(be->ops->supports_cache(be, "kv:turboquant"));
}

/* --kv-quant turboquant[:K:V]: full-attention caches only, sliding rings stay plain. */
static void t_plan(void **st) {
  (void)st;
  lm_model *m, *mp;
  assert_int_equal(lm_test_write_tiny(lm_test_tiny_quant_config, TMP "/tinyq"), LM_OK);
  assert_int_equal(lm_test_write_tiny(lm_test_tiny_config, TMP "/tiny"), LM_OK);
  assert_int_equal(lm_model_load(TMP "/tinyq", &m), LM_OK);
  assert_int_equal(lm_model_load(TMP "/tiny", &mp), LM_OK);
  lm_kv_spec specs[16];
  char sig[64];
  assert_int_equal(lm_model_kv_plan(m, &(lm_kv_options){.mode = "turboquant:4:3"}, specs), LM_OK);
  int tq = 0;
  for (int i = 0; i < m->cfg.n_caches; i++) {
    lm_kv_spec_signature(&specs[i], sig, sizeof sig);
    printf("cache %d (layer %d): %s\n", i, m->cfg.cache_layer[i], sig);
    if (lm_kv_kind_ring(specs[i].kind)) {
      assert_string_equal(sig, "kv:rotating-plain");
    } else {
      assert_string_equal(sig, "kv:turboquant:4:3");
      tq++;
    }
  }
  assert_true(tq >= 1);
  assert_int_equal(lm_model_kv_plan(m, &(lm_kv_options){.mode = "turboquant"}, specs), LM_OK);
  for (int i = 0; i < m->cfg.n_caches; i++)
    if (!lm_kv_kind_ring(specs[i].kind)) {
      assert_string_equal(lm_kv_spec_signature(&specs[i], sig, sizeof sig), "kv:turboquant:8:3");
    }
  static const struct {
    const char *mode;
    lm_status want;
    const char *msg;
  } bad[] = {{"turboquant:3:3", LM_ERR_UNSUPPORTED, "key bits 3"},
             {"turboquant:8:6", LM_ERR_UNSUPPORTED, "value bits 6"},
             {"turboquant:8", LM_ERR_INVALID, "turboquant[:K:V]"},
             {"turboquant:8:3:1", LM_ERR_INVALID, "turboquant[:K:V]"},
             {"turboquant:8:3x", LM_ERR_INVALID, "turboquant[:K:V]"},
             {"turboquantum", LM_ERR_INVALID, "turboquant[:K:V]"}};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    lm_status s = lm_model_kv_plan(m, &(lm_kv_options){.mode = bad[i].mode}, specs);
    printf("%s: %s\n", bad[i].mode, lm_errmsg());
    assert_int_equal(s, bad[i].want);
    assert_non_null(strstr(lm_errmsg(), bad[i].msg));
  }
  assert_int_equal(
      lm_model_kv_plan(m, &(lm_kv_options){.mode = "turboquant", .quant_start = 4}, specs),
      LM_ERR_UNSUPPORTED);
  /* a full-attention head dim the codec lacks (32) is refused by cache and layer */
  assert_int_equal(lm_model_kv_plan(mp, &(lm_kv_options){.mode = "turboquant"}, specs),
                   LM_ERR_UNSUPPORTED);
  printf("tiny: %s\n", lm_errmsg());
  assert_non_null(strstr(lm_errmsg(), "head_dim 32"));
  lm_model_free(m), lm_model_free(mp);
}

static uint32_t rd32(const uint8_t *p) {
  return p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static void wr32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}

/* A state file of a turboquant cache restores every array byte for byte; its entry's fields
 * are checked (the parser, header checksums off so that the edits need no resealing). */
static void t_state(void **st) {
  lm_backend *be = *st;
  geom g = {128, 5, 2};
  lm_kv_set *kv = new_set(be, g), *back;
  float *out = malloc((size_t)(N * H * G * g.hd) * sizeof(float));
  feed(be, kv, g, 9, 0, 41, MIXED, out);
  uint8_t fp[LM_FINGERPRINT_BYTES] = {1, 2, 3};
  int32_t ids[41] = {0}, *tok;
  int64_t nt;
  assert_int_equal(lm_kv_state_save(TMP "/tq.kvstate", fp, kv, ids, 41), LM_OK);
  lm_kv_spec spec = tq_spec(g);
  lm_kv_state_expect e = {.fingerprint = fp, .specs = &spec, .n_specs = 1};
  lm_status s = lm_kv_state_load_ex(TMP "/tq.kvstate", &e, be, &back, &tok, &nt);
  if (s) fprintf(stderr, "load: %s\n", lm_errmsg());
  assert_int_equal(s, LM_OK);
  assert_int_equal(nt, 41);
  const lm_kv_cache *a = kv->caches[0], *b = back->caches[0];
  const void *pa[5] = {a->k, a->v, a->ks, a->kb, a->vs}, *pb[5] = {b->k, b->v, b->ks, b->kb, b->vs};
  for (int i = 0; i < 5; i++)
    assert_memory_equal(pa[i], pb[i], (size_t)(41 * lm_kv_row_bytes(a, i)));
  assert_null(b->vb);
  /* another plan (other value bits) is refused by name */
  lm_kv_spec other = tq_spec((geom){128, 5, 3});
  lm_kv_set *no;
  free(tok);
  e.specs = &other;
  assert_int_equal(lm_kv_state_load_ex(TMP "/tq.kvstate", &e, be, &no, &tok, &nt), LM_ERR_INVALID);
  assert_non_null(strstr(lm_errmsg(), "kv:turboquant:5:2"));
  /* forged entry fields */
  FILE *f = fopen(TMP "/tq.kvstate", "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  size_t n = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *good = malloc(n), *buf = malloc(n), *en = buf + 128;
  assert_int_equal(fread(good, 1, n, f), n);
  fclose(f);
  static const struct {
    int off;
    uint32_t v;
    const char *msg;
  } rows[] = {{0, 5, "unknown cache kind"},
              {4, 3, "bad turboquant plan"},
              {8, 64, "bad turboquant plan"},
              {224, 6, "bad turboquant plan"},
              {224, 0, "bad turboquant plan"},
              {228, 3, "layout quantization differs"},
              {16, 4, "layout quantization differs"},
              {36, 1, "element type"},
              {32, 1, "does not follow plan"},
              {28, 96, "bad turboquant plan"},
              {240, 1, "reserved bytes"}};
  for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
    memcpy(buf, good, n);
    assert_int_not_equal(rd32(en + rows[i].off), rows[i].v);
    wr32(en + rows[i].off, rows[i].v);
    lm_kv_state_info *in = NULL;
    s = lm_kv_state_parse(buf, n, "forged", LM_KV_STATE_VERIFY_DATA, &in);
    if (s != LM_ERR_CORRUPT || !strstr(lm_errmsg(), rows[i].msg))
      fprintf(stderr, "row %zu: got %s '%s', want '%s'\n", i, lm_status_name(s), lm_errmsg(),
              rows[i].msg);
    assert_int_equal(s, LM_ERR_CORRUPT);
    assert_non_null(strstr(lm_errmsg(), rows[i].msg));
    assert_null(in);
  }
  lm_kv_state_info *in = NULL;
  assert_int_equal(lm_kv_state_parse(good, n, "good", LM_KV_STATE_VERIFY_ALL, &in), LM_OK);
  lm_kv_state_info_free(in);
  free(good), free(buf), free(out);
  lm_kv_set_free(kv), lm_kv_set_free(back);
}

static int setup(void **st) {
  lm_backend *be;
  mkdir(LM_BUILD_DIR "/tmp", 0755);
  mkdir(TMP, 0755);
  if (lm_backend_cpu_create(LM_PRECISION_F32, 1, &be)) {
    fprintf(stderr, "setup: %s\n", lm_errmsg());
    return -1;
  }
  *st = be;
  return 0;
}

static int teardown(void **st) {
  lm_backend_destroy(*st);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(t_attention), cmocka_unit_test(t_trim_and_clone), cmocka_unit_test(t_spec),
      cmocka_unit_test(t_plan),      cmocka_unit_test(t_state),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
