/* sampler.c — the processors of sampler.h and the draw.
 *
 * Cost per call: the penalties touch only the ids of their window; the truncations work on a
 * candidate list. With top-k the list is built by a k-heap over the logits (O(V log k)); top-p
 * without top-k buckets the logits and sorts only the bucket where the mass crosses top_p, so a
 * 262k vocabulary is never sorted per token. Pure temperature / min-p never sorts. */
#include "sample/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "base/status.h"

typedef struct cand {
  float logit;
  int32_t id;
} cand;

struct lm_sampler {
  lm_sampling p;
  lm_rng rng;
  int64_t cap;      /* entries of cand / count */
  cand *cand;       /* [cap] working candidate list */
  cand *tmp;        /* [cap] scratch (the top-p boundary bucket) */
  float *w;         /* [cap] weights of the candidates */
  int32_t *count;   /* [cap] occurrences in a penalty window (zero between uses) */
  int32_t *touched; /* [cap] ids whose count is non-zero */
};

/* ---- parameters ------------------------------------------------------------------------------ */

void lm_sampling_init(lm_sampling *s) {
  memset(s, 0, sizeof *s);
  s->temperature = 1.0f;
  s->top_p = 1.0f;
  s->repeat_penalty = 1.0f;
  s->repeat_last_n = 64;
  s->penalty_last_n = 64;
}

void lm_sampling_clear(lm_sampling *s) {
  if (!s) return;
  free(s->bias);
  free(s->suppress);
  lm_sampling_init(s);
}

lm_status lm_sampling_copy(lm_sampling *dst, const lm_sampling *src) {
  *dst = *src;
  dst->bias = NULL;
  dst->suppress = NULL;
  if (src->n_bias) {
    dst->bias = malloc((size_t)src->n_bias * sizeof *dst->bias);
    if (!dst->bias) goto nomem;
    memcpy(dst->bias, src->bias, (size_t)src->n_bias * sizeof *dst->bias);
  }
  if (src->n_suppress) {
    dst->suppress = malloc((size_t)src->n_suppress * sizeof *dst->suppress);
    if (!dst->suppress) goto nomem;
    memcpy(dst->suppress, src->suppress, (size_t)src->n_suppress * sizeof *dst->suppress);
  }
  return LM_OK;
nomem:
  free(dst->bias);
  dst->bias = NULL;
  dst->n_bias = dst->n_suppress = 0;
  return LM_ERRF(LM_ERR_NOMEM, "sampling: out of memory");
}

lm_status lm_sampling_add_bias(lm_sampling *s, int32_t id, float bias) {
  if (id < 0) return LM_ERRF(LM_ERR_INVALID, "logit bias: id %d is negative", id);
  if (isnan(bias) || bias == INFINITY)
    return LM_ERRF(LM_ERR_INVALID, "logit bias of id %d: %g is not allowed", id, bias);
  lm_logit_bias *b = realloc(s->bias, (size_t)(s->n_bias + 1) * sizeof *b);
  if (!b) return LM_ERRF(LM_ERR_NOMEM, "logit bias: out of memory");
  s->bias = b;
  b[s->n_bias++] = (lm_logit_bias){id, bias};
  return LM_OK;
}

lm_status lm_sampling_add_suppress(lm_sampling *s, int32_t id) {
  if (id < 0) return LM_ERRF(LM_ERR_INVALID, "suppress_tokens: id %d is negative", id);
  int32_t *v = realloc(s->suppress, (size_t)(s->n_suppress + 1) * sizeof *v);
  if (!v) return LM_ERRF(LM_ERR_NOMEM, "suppress_tokens: out of memory");
  s->suppress = v;
  v[s->n_suppress++] = id;
  return LM_OK;
}

lm_status lm_sampling_validate(const lm_sampling *s) {
  if (!isfinite(s->temperature) || s->temperature < 0)
    return LM_ERRF(LM_ERR_INVALID, "temperature must be a finite number >= 0 (got %g)",
                   s->temperature);
  if (s->top_k < 0) return LM_ERRF(LM_ERR_INVALID, "top_k must be >= 0 (got %d)", s->top_k);
  if (!(s->top_p > 0 && s->top_p <= 1))
    return LM_ERRF(LM_ERR_INVALID, "top_p must be in (0, 1] (got %g)", s->top_p);
  if (!(s->min_p >= 0 && s->min_p <= 1))
    return LM_ERRF(LM_ERR_INVALID, "min_p must be in [0, 1] (got %g)", s->min_p);
  if (!isfinite(s->repeat_penalty) || s->repeat_penalty <= 0)
    return LM_ERRF(LM_ERR_INVALID, "repeat_penalty must be a finite number > 0 (got %g)",
                   s->repeat_penalty);
  if (!isfinite(s->presence_penalty) || !isfinite(s->frequency_penalty))
    return LM_ERRF(LM_ERR_INVALID, "presence/frequency penalties must be finite");
  if (s->repeat_last_n < -1 || s->penalty_last_n < -1)
    return LM_ERRF(LM_ERR_INVALID,
                   "penalty windows must be -1 (all), 0 (off) or a count (got %d, %d)",
                   s->repeat_last_n, s->penalty_last_n);
  if ((s->n_bias && !s->bias) || (s->n_suppress && !s->suppress) || s->n_bias < 0 ||
      s->n_suppress < 0)
    return LM_ERRF(LM_ERR_INVALID, "sampling: bias/suppress lists do not match their counts");
  for (int32_t i = 0; i < s->n_bias; i++)
    if (s->bias[i].id < 0 || isnan(s->bias[i].bias) || s->bias[i].bias == INFINITY)
      return LM_ERRF(LM_ERR_INVALID, "logit bias %d: id %d, bias %g is not allowed", i,
                     s->bias[i].id, s->bias[i].bias);
  for (int32_t i = 0; i < s->n_suppress; i++)
    if (s->suppress[i] < 0)
      return LM_ERRF(LM_ERR_INVALID, "suppress_tokens[%d] = %d is negative", i, s->suppress[i]);
  return LM_OK;
}

/* ---- the sampler object ---------------------------------------------------------------------- */

lm_status lm_sampler_create(const lm_sampling *p, lm_sampler **out) {
  *out = NULL;
  LM_TRY(lm_sampling_validate(p));
  lm_sampler *s = calloc(1, sizeof *s);
  if (!s) return LM_ERRF(LM_ERR_NOMEM, "sampler: out of memory");
  if (lm_sampling_copy(&s->p, p)) {
    free(s);
    return LM_ERR_NOMEM;
  }
  s->rng = (lm_rng){p->seed, 0};
  *out = s;
  return LM_OK;
}

void lm_sampler_free(lm_sampler *s) {
  if (!s) return;
  lm_sampling_clear(&s->p);
  free(s->cand);
  free(s->tmp);
  free(s->w);
  free(s->count);
  free(s->touched);
  free(s);
}

void lm_sampler_reset(lm_sampler *s) { s->rng = (lm_rng){s->p.seed, 0}; }

const lm_sampling *lm_sampler_params(const lm_sampler *s) { return &s->p; }

static int reserve(lm_sampler *s, int64_t vocab) {
  if (vocab <= s->cap) return 0;
  free(s->cand);
  free(s->tmp);
  free(s->w);
  free(s->count);
  free(s->touched);
  s->cand = malloc((size_t)vocab * sizeof *s->cand);
  s->tmp = malloc((size_t)vocab * sizeof *s->tmp);
  s->w = malloc((size_t)vocab * sizeof *s->w);
  s->count = calloc((size_t)vocab, sizeof *s->count);
  s->touched = malloc((size_t)vocab * sizeof *s->touched);
  s->cap = s->cand && s->tmp && s->w && s->count && s->touched ? vocab : 0;
  return s->cap ? 0 : -1;
}

lm_status lm_sampler_reserve(lm_sampler *s, int64_t vocab) {
  if (reserve(s, vocab))
    return LM_ERRF(LM_ERR_NOMEM, "sampler: out of memory for a vocabulary of %lld",
                   (long long)vocab);
  return LM_OK;
}

/* ---- 1-4: penalties, bias, suppression ------------------------------------------------------- */

/* Counts the ids of the window into s->count; returns how many distinct ids were touched. */
static int64_t count_window(lm_sampler *s, const int32_t *h, int64_t n, int32_t last_n,
                            int64_t vocab) {
  int64_t from = last_n < 0 || last_n >= n ? 0 : n - last_n, nt = 0;
  for (int64_t i = from; i < n; i++) {
    int32_t id = h[i];
    if (id < 0 || id >= vocab) continue;
    if (s->count[id]++ == 0) s->touched[nt++] = id;
  }
  return nt;
}

static void uncount(lm_sampler *s, int64_t nt) {
  for (int64_t i = 0; i < nt; i++)
    s->count[s->touched[i]] = 0;
}

static void apply_penalties(lm_sampler *s, float *x, int64_t vocab, const int32_t *h, int64_t n) {
  const lm_sampling *p = &s->p;
  if (p->repeat_penalty != 1.0f && p->repeat_last_n != 0) {
    int64_t nt = count_window(s, h, n, p->repeat_last_n, vocab);
    for (int64_t i = 0; i < nt; i++) {
      float *l = &x[s->touched[i]];
      *l = *l > 0 ? *l / p->repeat_penalty : *l * p->repeat_penalty;
    }
    uncount(s, nt);
  }
  if ((p->presence_penalty != 0 || p->frequency_penalty != 0) && p->penalty_last_n != 0) {
    int64_t nt = count_window(s, h, n, p->penalty_last_n, vocab);
    for (int64_t i = 0; i < nt; i++) {
      int32_t id = s->touched[i];
      x[id] -= (float)s->count[id] * p->frequency_penalty + p->presence_penalty;
    }
    uncount(s, nt);
  }
  for (int32_t i = 0; i < p->n_bias; i++)
    if (p->bias[i].id < vocab) x[p->bias[i].id] += p->bias[i].bias;
  for (int32_t i = 0; i < p->n_suppress; i++)
    if (p->suppress[i] < vocab) x[p->suppress[i]] = -INFINITY;
}

/* ---- 5: greedy ------------------------------------------------------------------------------- */

static int32_t argmax(const float *x, int64_t vocab) {
  int64_t b = -1;
  for (int64_t i = 0; i < vocab; i++)
    if (x[i] > -INFINITY && (b < 0 || x[i] > x[b])) b = i; /* NaN compares false: never chosen */
  return (int32_t)b;
}

/* ---- 6-9: candidates and truncation ----------------------------------------------------------
 * Probabilities are weights w = expf(logit - max) (float) summed in double; every step uses the
 * same weights, so the cut points do not depend on the path taken. The draw walks the kept tokens
 * in id order, whichever truncation ran. */

/* a before b: higher logit first, the lower id on ties (a total order, so sorts are deterministic).
 */
static int before(const cand *a, const cand *b) {
  return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

static int cmp_cand(const void *pa, const void *pb) {
  const cand *a = pa, *b = pb;
  return before(a, b) ? -1 : before(b, a) ? 1 : 0;
}

static int cmp_id(const void *pa, const void *pb) {
  const cand *a = pa, *b = pb;
  return (a->id > b->id) - (a->id < b->id);
}

/* Min-heap on `before` (the worst candidate at the root). */
static void sift_down(cand *h, int64_t n, int64_t i) {
  for (;;) {
    int64_t l = 2 * i + 1, r = l + 1, w = i;
    if (l < n && before(&h[w], &h[l])) w = l;
    if (r < n && before(&h[w], &h[r])) w = r;
    if (w == i) return;
    cand t = h[i];
    h[i] = h[w];
    h[w] = t;
    i = w;
  }
}

/* The k best finite logits, sorted. Returns their number (< k when fewer are finite). */
static int64_t top_k_sorted(const float *x, int64_t vocab, int64_t k, cand *h) {
  int64_t n = 0;
  for (int64_t i = 0; i < vocab; i++) {
    if (!(x[i] > -INFINITY)) continue;
    cand c = {x[i], (int32_t)i};
    if (n < k) {
      h[n++] = c;
      if (n == k)
        for (int64_t j = k / 2; j-- > 0;)
          sift_down(h, n, j);
    } else if (before(&c, &h[0])) {
      h[0] = c;
      sift_down(h, n, 0);
    }
  }
  qsort(h, (size_t)n, sizeof *h, cmp_cand);
  return n;
}

/* All finite logits in id order. */
static int64_t all_finite(const float *x, int64_t vocab, cand *c) {
  int64_t n = 0;
  for (int64_t i = 0; i < vocab; i++)
    if (x[i] > -INFINITY) c[n++] = (cand){x[i], (int32_t)i};
  return n;
}

static float max_logit(const cand *c, int64_t n) {
  float m = c[0].logit;
  for (int64_t i = 1; i < n; i++)
    m = c[i].logit > m ? c[i].logit : m;
  return m;
}

/* w[i] = expf(c[i].logit - m); returns their sum. */
static double weigh(const cand *c, int64_t n, float m, float *w) {
  double z = 0;
  for (int64_t i = 0; i < n; i++)
    z += w[i] = expf(c[i].logit - m);
  return z;
}

/* Sorted c (with weights w): how many stay under top-p, the mass before each kept token being
 * < target = top_p * z, starting from `cum` (the mass of what comes before c). At least one. */
static int64_t cut_sorted(const cand *c, const float *w, int64_t n, double cum, double target) {
  for (int64_t i = 0; i < n; i++)
    if (cum >= target)
      return i > 0 ? i : 1;
    else
      cum += w[i];
  return n;
}

/* Top-p over the sorted top-k list (the distribution is those k); then id order for the draw. */
static int64_t top_p_sorted(cand *c, int64_t n, float top_p, float *w) {
  double z = weigh(c, n, c[0].logit, w);
  n = cut_sorted(c, w, n, 0, (double)top_p * z);
  qsort(c, (size_t)n, sizeof *c, cmp_id);
  return n;
}

#define LM_SAMPLE_BUCKETS 1024

/* Top-p over c in id order without sorting it: the logits fall into buckets of equal width below
 * the maximum; the bucket where the mass crosses top_p is sorted alone to place the exact cut, and
 * c is filtered in place (id order kept). `t` is scratch for that bucket. */
static int64_t nucleus(cand *c, int64_t n, float top_p, float *w, cand *t) {
  float m = max_logit(c, n), lo = m;
  for (int64_t i = 0; i < n; i++)
    lo = c[i].logit < lo ? c[i].logit : lo;
  float scale = m > lo ? (float)(LM_SAMPLE_BUCKETS - 1) / (m - lo) : 0.0f;
#define BUCKET(l) ((int)fminf((m - (l)) * scale, (float)(LM_SAMPLE_BUCKETS - 1)))
  double z = weigh(c, n, m, w), mass[LM_SAMPLE_BUCKETS] = {0}, target = (double)top_p * z, cum = 0;
  for (int64_t i = 0; i < n; i++)
    mass[BUCKET(c[i].logit)] += w[i];
  int b = 0;
  while (b < LM_SAMPLE_BUCKETS - 1 && cum + mass[b] < target)
    cum += mass[b++];
  int64_t nt = 0;
  for (int64_t i = 0; i < n; i++)
    if (BUCKET(c[i].logit) == b) t[nt++] = c[i];
  if (!nt) return n; /* the mass never reached the target: rounding; keep everything */
  qsort(t, (size_t)nt, sizeof *t, cmp_cand);
  float *wt = w; /* the bucket's weights, in its sorted order (w is free again) */
  for (int64_t i = 0; i < nt; i++)
    wt[i] = expf(t[i].logit - m);
  cand last = t[cut_sorted(t, wt, nt, cum, target) - 1];
  int64_t k = 0;
  for (int64_t i = 0; i < n; i++) {
    int bi = BUCKET(c[i].logit);
    if (bi < b || (bi == b && (before(&c[i], &last) || c[i].id == last.id))) c[k++] = c[i];
  }
#undef BUCKET
  return k;
}

/* Drops (keeping order) the tokens with p < min_p * p_max, i.e. expf(l - l_max) < min_p. */
static int64_t apply_min_p(cand *c, int64_t n, float min_p) {
  float m = max_logit(c, n);
  int64_t k = 0;
  for (int64_t i = 0; i < n; i++)
    if (expf(c[i].logit - m) >= min_p) c[k++] = c[i];
  return k;
}

/* ---- 10: the draw ---------------------------------------------------------------------------- */

static int32_t draw(lm_sampler *s, const cand *c, int64_t n) {
  double z = weigh(c, n, max_logit(c, n), s->w);
  double u = (double)lm_rng_next_uniform(&s->rng) * z, cum = 0;
  for (int64_t i = 0; i < n; i++) {
    cum += s->w[i];
    if (u < cum) return c[i].id;
  }
  return c[n - 1].id; /* u rounded onto the total */
}

int32_t lm_sampler_sample(lm_sampler *s, float *logits, int64_t vocab, const int32_t *history,
                          int64_t n) {
  const lm_sampling *p = &s->p;
  if (vocab < 1 || !logits || (n > 0 && !history)) {
    lm_err_set(LM_ERR_INVALID, "sample: bad arguments (vocab %lld)", (long long)vocab);
    return -1;
  }
  if (reserve(s, vocab)) {
    lm_err_set(LM_ERR_NOMEM, "sample: out of memory for a vocabulary of %lld", (long long)vocab);
    return -1;
  }
  apply_penalties(s, logits, vocab, history, n);
  if (p->temperature <= 0) {
    int32_t id = argmax(logits, vocab);
    if (id < 0) lm_err_set(LM_ERR_INVALID, "sample: no token has a finite logit");
    return id;
  }
  float inv_t = 1.0f / p->temperature;
  for (int64_t i = 0; i < vocab; i++)
    logits[i] *= inv_t;
  cand *c = s->cand;
  int64_t nc;
  if (p->top_k > 0 && p->top_k < vocab) {
    nc = top_k_sorted(logits, vocab, p->top_k, c);
    if (nc && p->top_p < 1)
      nc = top_p_sorted(c, nc, p->top_p, s->w);
    else
      qsort(c, (size_t)nc, sizeof *c, cmp_id);
  } else {
    nc = all_finite(logits, vocab, c);
    if (nc && p->top_p < 1) nc = nucleus(c, nc, p->top_p, s->w, s->tmp);
  }
  if (!nc) {
    lm_err_set(LM_ERR_INVALID, "sample: no token has a finite logit");
    return -1;
  }
  if (p->min_p > 0) nc = apply_min_p(c, nc, p->min_p);
  return draw(s, c, nc);
}
