/* generate.c — the generation session of generate.h.
 *
 * Invariant: the caches hold hist[0 .. kv_len) and kv_len <= hist_len; what lies between is fed
 * by the next append/sync (prefill, in chunks) or step (decode, one token). Every forward error
 * empties the caches (a failed step may have written some layers and not others), and the
 * history stays: the next call prefills it again. */
#include "engine/generate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/buf.h"
#include "base/status.h"
#include "engine/stop_match.h"
#include "kv/kv_state.h"
#include "model/fingerprint.h"
#include "model/forward.h"
#include "text/utf8.h"

#define LM_GEN_DEFAULT_CHUNK 512
#define LM_GEN_MAX_CONTEXT ((int64_t)INT32_MAX)

typedef struct gbuf {
  char *p;
  size_t n, cap;
} gbuf;

struct lm_gen {
  lm_model *m;
  lm_backend *be;
  const lm_tokenizer *tok;
  int64_t vocab, chunk, max_ctx;
  lm_forward *fp, *fd; /* prefill [chunk tokens, 1 logit row], decode [1, 1] */
  lm_kv_set *kv;
  lm_kv_spec *specs;
  int32_t *pos, *seq; /* [chunk] batch scratch */
  int32_t *hist;      /* [hist_cap] the context */
  int64_t hist_len, hist_cap;
  float *logits; /* [vocab] of hist[hist_len - 1] when logits_valid */
  int logits_valid;
  /* per-response options */
  lm_sampler *sampler;
  int32_t *stop_ids; /* sorted */
  int32_t n_stop_ids;
  int32_t *keep_special; /* sorted: special ids streamed despite skip_special */
  int32_t n_keep_special;
  char **stops;
  int32_t n_stops;
  int64_t max_tokens;
  int skip_special;
  lm_gen_token_fn on_token;
  void *user;
  lm_detok *detok;
  /* per-response state */
  lm_gen_stop stop;
  int32_t stop_id;
  gbuf hold; /* decoded text not yet streamed (a possible stop-string start) */
  gbuf text; /* text streamed in this response */
  lm_gen_stats st;
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static lm_status gbuf_put(gbuf *b, const char *s, size_t n) {
  return lm_buf_append(&b->p, &b->n, &b->cap, 256, s, n);
}

void lm_gen_opts_init(lm_gen_opts *o) {
  memset(o, 0, sizeof *o);
  o->chunk = LM_GEN_DEFAULT_CHUNK;
  lm_sampling_init(&o->sampling);
}

/* ---- options --------------------------------------------------------------------------------- */

static void free_opts(lm_gen *g) {
  lm_sampler_free(g->sampler);
  g->sampler = NULL;
  free(g->stop_ids);
  g->stop_ids = NULL;
  free(g->keep_special);
  g->keep_special = NULL;
  g->n_keep_special = 0;
  for (int32_t i = 0; i < g->n_stops; i++)
    free(g->stops[i]);
  free(g->stops);
  g->stops = NULL;
  g->n_stop_ids = g->n_stops = 0;
  lm_detok_free(g->detok);
  g->detok = NULL;
}

static int cmp_i32(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

static int in_sorted(const int32_t *v, int32_t n, int32_t id) {
  return n > 0 && bsearch(&id, v, (size_t)n, sizeof id, cmp_i32) != NULL;
}

static lm_status sorted_copy(const int32_t *src, int32_t n, int32_t **dst, int32_t *dn) {
  *dst = NULL;
  *dn = 0;
  if (!n) return LM_OK;
  if (!(*dst = malloc((size_t)n * sizeof **dst)))
    return LM_ERRF(LM_ERR_NOMEM, "generate: out of memory");
  memcpy(*dst, src, (size_t)n * sizeof **dst);
  qsort(*dst, (size_t)n, sizeof **dst, cmp_i32);
  *dn = n;
  return LM_OK;
}

static lm_status check_opts(const lm_gen *g, const lm_gen_opts *o) {
  if (o->max_tokens < 0)
    return LM_ERRF(LM_ERR_INVALID, "max_tokens must be >= 0 (got %lld)", (long long)o->max_tokens);
  if (o->n_stop_ids < 0 || (o->n_stop_ids && !o->stop_ids) || o->n_stop_strings < 0 ||
      (o->n_stop_strings && !o->stop_strings) || o->n_keep_special < 0 ||
      (o->n_keep_special && !o->keep_special))
    return LM_ERRF(LM_ERR_INVALID, "generate: stop lists do not match their counts");
  if (o->n_stop_strings && !g->tok) return LM_ERRF(LM_ERR_INVALID, "stop strings need a tokenizer");
  for (int32_t i = 0; i < o->n_stop_strings; i++) {
    const char *s = o->stop_strings[i];
    if (!s || !*s) return LM_ERRF(LM_ERR_INVALID, "stop string %d is empty", i);
    if (!lm_utf8_valid(s, strlen(s)))
      return LM_ERRF(LM_ERR_INVALID, "stop string %d is not valid UTF-8", i);
  }
  for (int32_t i = 0; i < o->sampling.n_bias; i++)
    if (o->sampling.bias[i].id >= g->vocab)
      return LM_ERRF(LM_ERR_INVALID, "logit bias: id %d is outside the vocabulary (%lld)",
                     o->sampling.bias[i].id, (long long)g->vocab);
  return LM_OK;
}

lm_status lm_gen_set_opts(lm_gen *g, const lm_gen_opts *o) {
  LM_TRY(check_opts(g, o));
  free_opts(g);
  lm_status s = lm_sampler_create(&o->sampling, &g->sampler);
  if (!s) s = lm_sampler_reserve(g->sampler, g->vocab);
  /* special tokens are skipped here, per id, so that keep_special can make exceptions */
  if (!s && g->tok) s = lm_detok_create(g->tok, 0, &g->detok);
  if (!s) s = sorted_copy(o->stop_ids, o->n_stop_ids, &g->stop_ids, &g->n_stop_ids);
  if (!s) s = sorted_copy(o->keep_special, o->n_keep_special, &g->keep_special, &g->n_keep_special);
  if (!s && o->n_stop_strings) {
    g->stops = calloc((size_t)o->n_stop_strings, sizeof *g->stops);
    if (!g->stops) s = LM_ERRF(LM_ERR_NOMEM, "generate: out of memory");
    for (int32_t i = 0; !s && i < o->n_stop_strings; i++, g->n_stops++)
      if (!(g->stops[i] = strdup(o->stop_strings[i])))
        s = LM_ERRF(LM_ERR_NOMEM, "generate: out of memory");
  }
  g->max_tokens = o->max_tokens;
  g->skip_special = o->skip_special;
  g->on_token = o->on_token;
  g->user = o->user;
  if (s) free_opts(g);
  return s;
}

/* ---- create / free / reset ------------------------------------------------------------------- */

static lm_status make_kv(lm_gen *g) {
  lm_kv_set_free(g->kv);
  g->kv = NULL;
  return lm_kv_set_create(g->be, g->specs, g->m->cfg.n_caches, &g->kv);
}

lm_status lm_gen_create(lm_model *m, lm_backend *be, const lm_tokenizer *tok, const lm_gen_opts *o,
                        lm_gen **out) {
  *out = NULL;
  if (!m || !be || !o) return LM_ERRF(LM_ERR_INVALID, "lm_gen_create: NULL argument");
  if (o->chunk < 0 || o->max_context < 0)
    return LM_ERRF(LM_ERR_INVALID, "generate: chunk and max_context must be >= 0");
  lm_gen *g = calloc(1, sizeof *g);
  if (!g) return LM_ERRF(LM_ERR_NOMEM, "generate: out of memory");
  g->m = m;
  g->be = be;
  g->tok = tok;
  g->vocab = m->cfg.vocab_size;
  g->chunk = o->chunk ? o->chunk : LM_GEN_DEFAULT_CHUNK;
  g->max_ctx =
      o->max_context && o->max_context < LM_GEN_MAX_CONTEXT ? o->max_context : LM_GEN_MAX_CONTEXT;
  g->stop_id = -1;
  g->specs = calloc((size_t)m->cfg.n_caches + 1, sizeof *g->specs);
  g->pos = malloc((size_t)g->chunk * sizeof *g->pos);
  g->seq = calloc((size_t)g->chunk, sizeof *g->seq);
  g->logits = malloc((size_t)g->vocab * sizeof *g->logits);
  lm_status s = g->specs && g->pos && g->seq && g->logits
                    ? LM_OK
                    : LM_ERRF(LM_ERR_NOMEM, "generate: out of memory");
  if (!s) s = lm_model_kv_plan(m, o->kv, g->specs);
  if (!s) s = make_kv(g);
  if (!s) s = lm_forward_create(m, be, g->chunk, 1, &g->fp);
  if (!s) s = lm_forward_create(m, be, 1, 1, &g->fd);
  if (!s) s = lm_gen_set_opts(g, o);
  if (s) {
    lm_gen_free(g);
    return s;
  }
  *out = g;
  return LM_OK;
}

void lm_gen_free(lm_gen *g) {
  if (!g) return;
  free_opts(g);
  lm_forward_free(g->fp);
  lm_forward_free(g->fd);
  lm_kv_set_free(g->kv);
  free(g->specs);
  free(g->pos);
  free(g->seq);
  free(g->hist);
  free(g->logits);
  free(g->hold.p);
  free(g->text.p);
  free(g);
}

static int64_t kv_len(const lm_gen *g) { return g->kv ? lm_kv_set_len(g->kv) : 0; }

/* Empties the caches: a trim when the caches can roll back that far, else new caches (when that
 * allocation fails g->kv stays NULL and the next feed retries it). */
static lm_status clear_kv(lm_gen *g) {
  if (!kv_len(g)) return LM_OK;
  if (lm_kv_set_trim(g->kv, kv_len(g)) == LM_OK) return LM_OK;
  return make_kv(g);
}

/* clear_kv after a failure, keeping the failure's message. */
static lm_status clear_kv_after(lm_gen *g, lm_status s) {
  char msg[512];
  snprintf(msg, sizeof msg, "%s", lm_errmsg());
  (void)clear_kv(g);
  return lm_err_set(s, "%s", msg);
}

static void begin_response(lm_gen *g) {
  g->stop = LM_GEN_RUNNING;
  g->stop_id = -1;
  g->hold.n = g->text.n = 0;
  if (g->text.p) g->text.p[0] = '\0';
  if (g->detok) lm_detok_reset(g->detok);
  g->st = (lm_gen_stats){0};
}

lm_status lm_gen_reset(lm_gen *g) {
  g->hist_len = 0;
  g->logits_valid = 0;
  lm_sampler_reset(g->sampler);
  begin_response(g);
  return clear_kv(g);
}

/* ---- feeding the caches ---------------------------------------------------------------------- */

/* Feeds hist[kv_len .. hist_len): chunks through the prefill forward, a single token through the
 * decode forward; the logits of the last token land in g->logits. Returns the steps run. */
static lm_status feed(lm_gen *g, int64_t *steps) {
  if (!g->kv) LM_TRY(make_kv(g));
  int64_t at = lm_kv_set_len(g->kv);
  while (at < g->hist_len) {
    int64_t n = g->hist_len - at < g->chunk ? g->hist_len - at : g->chunk;
    int last = at + n == g->hist_len;
    for (int64_t j = 0; j < n; j++)
      g->pos[j] = (int32_t)(at + j);
    int32_t row = (int32_t)(n - 1);
    lm_batch b = {.n_tokens = (int32_t)n,
                  .ids = g->hist + at,
                  .pos = g->pos,
                  .seq = g->seq,
                  .n_seqs = 1,
                  .kv = &g->kv,
                  .n_logits = last,
                  .logit_rows = &row};
    g->logits_valid = 0;
    lm_status s = lm_forward_run(n == 1 ? g->fd : g->fp, &b, last ? g->logits : NULL);
    if (s) return clear_kv_after(g, s);
    at += n;
    if (steps) (*steps)++;
    g->logits_valid = last;
  }
  return LM_OK;
}

static lm_status hist_reserve(lm_gen *g, int64_t n) {
  if (n <= g->hist_cap) return LM_OK;
  int64_t cap = g->hist_cap ? g->hist_cap : 1024;
  while (cap < n)
    cap *= 2;
  int32_t *h = realloc(g->hist, (size_t)cap * sizeof *h);
  if (!h)
    return LM_ERRF(LM_ERR_NOMEM, "generate: out of memory for a context of %lld tokens",
                   (long long)n);
  g->hist = h;
  g->hist_cap = cap;
  return LM_OK;
}

static lm_status check_ids(const lm_gen *g, const int32_t *ids, int64_t n, int64_t keep) {
  if (n < 0 || (n && !ids)) return LM_ERRF(LM_ERR_INVALID, "generate: bad id list");
  if (keep + n > g->max_ctx)
    return LM_ERRF(LM_ERR_INVALID, "a context of %lld tokens exceeds the limit of %lld",
                   (long long)(keep + n), (long long)g->max_ctx);
  for (int64_t i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] >= g->vocab)
      return LM_ERRF(LM_ERR_INVALID, "token id %d (at %lld) is outside the vocabulary (%lld)",
                     ids[i], (long long)i, (long long)g->vocab);
  return LM_OK;
}

/* Adds ids after hist[0..keep) and prefills; the response starts. */
static lm_status extend(lm_gen *g, int64_t keep, const int32_t *ids, int64_t n) {
  LM_TRY(hist_reserve(g, keep + n));
  if (n) memcpy(g->hist + keep, ids, (size_t)n * sizeof *ids);
  g->hist_len = keep + n;
  begin_response(g);
  int64_t before = kv_len(g);
  double t0 = now_s();
  lm_status s = feed(g, NULL);
  g->st.prefill_s = now_s() - t0;
  g->st.prefill_tokens = kv_len(g) - before;
  g->st.reused_tokens = before;
  return s;
}

lm_status lm_gen_append(lm_gen *g, const int32_t *ids, int64_t n) {
  LM_TRY(check_ids(g, ids, n, g->hist_len));
  if (g->hist_len + n == 0) return LM_ERRF(LM_ERR_STATE, "generate: the context is empty");
  int64_t old = g->hist_len;
  lm_status s = extend(g, old, ids, n);
  if (s) g->hist_len = old; /* feed emptied the caches, or they never grew */
  return s;
}

lm_status lm_gen_sync(lm_gen *g, const int32_t *ids, int64_t n, int64_t *reused) {
  if (n < 1) return LM_ERRF(LM_ERR_INVALID, "generate: sync needs at least one token");
  LM_TRY(check_ids(g, ids, n, 0));
  int64_t c = 0;
  while (c < g->hist_len && c < n && g->hist[c] == ids[c])
    c++;
  int64_t keep = c < n ? c : n - 1; /* one token at least is fed: its logits start the response */
  int64_t held = kv_len(g);
  if (keep < held && lm_kv_set_trim(g->kv, held - keep) != LM_OK) {
    LM_TRY(clear_kv(g)); /* a ring that has wrapped cannot roll back: start over */
    keep = 0;
  }
  lm_status s = extend(g, keep, ids + keep, n - keep);
  if (reused) *reused = g->st.reused_tokens;
  return s;
}

/* ---- text and stops -------------------------------------------------------------------------- */

/* Moves the held text that is final to the streamed text; `final` releases everything (the
 * response ends). Sets LM_GEN_STOP_STRING when a stop string shows up. */
static lm_status release(lm_gen *g, int final) {
  if (!g->hold.n) return LM_OK;
  int64_t at = lm_stop_find(g->stops, g->n_stops, g->hold.p, g->hold.n, NULL);
  size_t n = at >= 0 ? (size_t)at
             : final ? g->hold.n
                     : g->hold.n - lm_stop_held_suffix(g->stops, g->n_stops, g->hold.p, g->hold.n);
  LM_TRY(gbuf_put(&g->text, g->hold.p, n));
  if (at >= 0) {
    g->stop = LM_GEN_STOP_STRING;
    g->hold.n = 0;
  } else {
    memmove(g->hold.p, g->hold.p + n, g->hold.n - n);
    g->hold.n -= n;
  }
  return LM_OK;
}

static lm_status push_text(lm_gen *g, int32_t id) {
  if (!g->detok) return LM_OK;
  if (g->skip_special && lm_tokenizer_is_special(g->tok, id) &&
      !in_sorted(g->keep_special, g->n_keep_special, id))
    return LM_OK;
  const char *t;
  size_t n;
  LM_TRY(lm_detok_push(g->detok, id, &t, &n));
  LM_TRY(gbuf_put(&g->hold, t, n));
  return release(g, 0);
}

static lm_status finish_text(lm_gen *g) {
  if (!g->detok) return LM_OK;
  const char *t;
  size_t n;
  LM_TRY(lm_detok_flush(g->detok, &t, &n));
  LM_TRY(gbuf_put(&g->hold, t, n));
  return release(g, 1);
}

/* Applies the stop rules to the sampled id and streams its text. */
static lm_status accept(lm_gen *g, int32_t id) {
  g->st.decode_tokens++;
  if (in_sorted(g->stop_ids, g->n_stop_ids, id)) {
    g->stop = LM_GEN_STOP_ID;
    g->stop_id = id;
    return finish_text(g);
  }
  LM_TRY(hist_reserve(g, g->hist_len + 1));
  g->hist[g->hist_len++] = id; /* pending: fed by the next step or append */
  LM_TRY(push_text(g, id));
  if (g->stop) return LM_OK;
  if ((g->max_tokens && g->st.decode_tokens >= g->max_tokens) || g->hist_len >= g->max_ctx) {
    g->stop = LM_GEN_STOP_LENGTH;
    return finish_text(g);
  }
  return LM_OK;
}

lm_status lm_gen_step(lm_gen *g, int32_t *id) {
  *id = -1;
  if (g->stop)
    return LM_ERRF(LM_ERR_STATE, "generate: the response has ended (%s)",
                   lm_gen_stop_name(g->stop));
  if (!g->hist_len) return LM_ERRF(LM_ERR_STATE, "generate: the context is empty");
  double t0 = now_s();
  if (kv_len(g) < g->hist_len) LM_TRY(feed(g, &g->st.decode_steps));
  if (!g->logits_valid)
    return LM_ERRF(LM_ERR_STATE, "generate: no logits to sample from (append input first)");
  g->logits_valid = 0;
  int32_t t = lm_sampler_sample(g->sampler, g->logits, g->vocab, g->hist, g->hist_len);
  if (t < 0) return LM_ERR_INVALID; /* memory was reserved: only the logits can be at fault */
  size_t from = g->text.n;
  lm_status s = accept(g, t);
  g->st.decode_s += now_s() - t0;
  if (s) return s;
  *id = t;
  if (g->on_token && g->on_token(g->user, t, g->text.p ? g->text.p + from : "", g->text.n - from) &&
      !g->stop)
    g->stop = LM_GEN_STOP_CALLBACK;
  return LM_OK;
}

lm_status lm_gen_run(lm_gen *g) {
  int32_t id;
  while (!g->stop)
    LM_TRY(lm_gen_step(g, &id));
  return LM_OK;
}

/* ---- queries --------------------------------------------------------------------------------- */

lm_gen_stop lm_gen_stop_reason(const lm_gen *g) { return g->stop; }

const char *lm_gen_stop_name(lm_gen_stop s) {
  switch (s) {
  case LM_GEN_RUNNING: return "running";
  case LM_GEN_STOP_ID:
  case LM_GEN_STOP_STRING: return "stop";
  case LM_GEN_STOP_LENGTH: return "length";
  case LM_GEN_STOP_CALLBACK: return "callback";
  }
  return "unknown";
}

int32_t lm_gen_stop_id(const lm_gen *g) { return g->stop_id; }

const char *lm_gen_text(const lm_gen *g, size_t *len) {
  if (len) *len = g->text.n;
  return g->text.p ? g->text.p : "";
}

const int32_t *lm_gen_tokens(const lm_gen *g, int64_t *n) {
  *n = g->hist_len;
  return g->hist;
}

int64_t lm_gen_kv_len(const lm_gen *g) { return kv_len(g); }

const float *lm_gen_logits(const lm_gen *g) { return g->logits_valid ? g->logits : NULL; }

lm_gen_stats lm_gen_get_stats(const lm_gen *g) { return g->st; }

/* ---- state files -------------------------------------------------------------------------------
 */

lm_status lm_gen_save_state(const lm_gen *g, const char *path) {
  uint8_t fp[LM_FINGERPRINT_BYTES];
  LM_TRY(lm_model_fingerprint(g->m, fp));
  return lm_kv_state_save(path, fp, g->kv, g->hist, kv_len(g));
}

lm_status lm_gen_load_state(lm_gen *g, const char *path) {
  lm_kv_set *kv = NULL;
  int32_t *tokens = NULL;
  int64_t n = 0;
  LM_TRY(lm_kv_state_load(path, g->m, g->specs, g->be, &kv, &tokens, &n));
  lm_status s = n > g->max_ctx
                    ? LM_ERRF(LM_ERR_INVALID, "%s: %lld tokens exceed the context limit %lld", path,
                              (long long)n, (long long)g->max_ctx)
                    : LM_OK;
  if (!s && n > g->hist_cap) {
    int32_t *h = realloc(g->hist, (size_t)n * sizeof *h);
    if (!h)
      s = LM_ERRF(LM_ERR_NOMEM, "generate: out of memory");
    else
      g->hist = h, g->hist_cap = n;
  }
  if (s) {
    lm_kv_set_free(kv);
    free(tokens);
    return s;
  }
  lm_kv_set_free(g->kv);
  g->kv = kv;
  if (n) memcpy(g->hist, tokens, (size_t)n * sizeof *tokens);
  g->hist_len = n;
  g->logits_valid = 0; /* the next sync feeds at least one token */
  free(tokens);
  return LM_OK;
}
