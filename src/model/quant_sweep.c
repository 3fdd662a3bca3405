/* quant_sweep.c — per-module sensitivity of a model to its quantization (see quant_sweep.h). */
#include "model/quant_sweep.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model/forward.h"
#include "model/logit_stats.h"
#include "model/quantize.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* How a measurement is compared with the reference. On the host, against the reference's
 * distributions computed once (lm_logits_ref); or, when the backend has logits_kl, on the
 * backend against the reference's logits kept there, so that a measurement brings back T
 * floats instead of T x V (E4B: 256 x 262,144 logits, whose transfer and host KL took 90% of
 * a GPU sweep's time). */
typedef struct judge {
  int dev;
  lm_logits_ref host; /* host path: the reference */
  float *got;         /* host path: a measurement's logits [T][V] */
  lm_tensor ref, kl;  /* device path: the reference's logits [T][V], a measurement's KLs [T][1] */
  float *kl_rows;     /* device path: the KLs brought back [T] */
} judge;

typedef struct rows_ctx {
  lm_backend *be;
  const judge *j;
  int keep; /* 1: the rows are the reference's (copied aside); 0: compared with it */
} rows_ctx;

static lm_status on_rows(void *arg, int64_t first, lm_tensor lg) {
  rows_ctx *c = arg;
  lm_tensor ref = lm_tensor_rows(c->j->ref, first, lg.rows);
  if (!c->keep)
    return c->be->ops->logits_kl(
        c->be,
        &(lm_logits_kl_args){.kl = lm_tensor_rows(c->j->kl, first, lg.rows), .x = lg, .ref = ref});
  size_t row = (size_t)lg.cols * sizeof(float);
  for (int64_t r = 0; r < lg.rows; r++)
    LM_TRY(c->be->ops->copy(c->be, (char *)ref.data + (size_t)r * row,
                            (const char *)lg.data + (size_t)(r * lg.ld) * sizeof(float), row));
  return LM_OK;
}

/* Teacher-forces the calibration tokens through the model as it is now: their logits into out
 * [T][V] (host), or, with j, left on the backend for on_rows (keep: copied aside as j's
 * reference; else compared with it). */
static lm_status calib(lm_model *m, lm_backend *be, const lm_qsweep_opts *o, lm_forward *f,
                       float *out, const judge *j, int keep) {
  lm_kv_spec specs[m->cfg.n_caches + 1];
  lm_model_kv_specs(m, specs);
  lm_kv_set *kv = NULL;
  rows_ctx c = {be, j, keep};
  lm_status s = lm_kv_set_create(be, specs, m->cfg.n_caches, &kv);
  if (!s)
    s = j ? lm_forward_feed_rows(f, kv, o->ids, o->n_ids, o->chunk, on_rows, &c)
          : lm_forward_feed(f, kv, o->ids, o->n_ids, o->chunk, out);
  lm_kv_set_free(kv);
  return s;
}

static lm_tensor dev_f32(lm_backend *be, int64_t rows, int64_t cols, lm_status *s) {
  lm_tensor t = {.rows = rows, .cols = cols, .ld = cols, .dtype = LM_DT_F32};
  if (!*s) *s = be->ops->alloc(be, (size_t)(rows * cols) * sizeof(float), &t.data);
  return t;
}

static void judge_free(lm_backend *be, judge *j) {
  lm_logits_ref_free(&j->host);
  free(j->got);
  free(j->kl_rows);
  if (j->ref.data) be->ops->free(be, j->ref.data);
  if (j->kl.data) be->ops->free(be, j->kl.data);
  memset(j, 0, sizeof *j);
}

/* Runs the model as it is now (the reference) and keeps what the comparisons need. */
static lm_status judge_init(lm_model *m, lm_backend *be, const lm_qsweep_opts *o, lm_forward *f,
                            judge *j) {
  int64_t T = o->n_ids, V = m->cfg.vocab_size;
  memset(j, 0, sizeof *j);
  j->dev = be->ops->logits_kl != NULL;
  lm_status s = LM_OK;
  if (j->dev) {
    j->ref = dev_f32(be, T, V, &s);
    j->kl = dev_f32(be, T, 1, &s);
    j->kl_rows = s ? NULL : malloc((size_t)T * sizeof(float));
    if (!s && !j->kl_rows) s = LM_ERRF(LM_ERR_NOMEM, "out of memory");
    if (!s) s = calib(m, be, o, f, NULL, j, 1);
  } else {
    float *ref = malloc((size_t)(T * V) * sizeof(float));
    j->got = ref ? malloc((size_t)(T * V) * sizeof(float)) : NULL;
    if (!j->got) s = LM_ERRF(LM_ERR_NOMEM, "out of memory for the calibration logits");
    if (!s) s = calib(m, be, o, f, ref, NULL, 0);
    if (!s && lm_logits_ref_init(&j->host, ref, T, V))
      s = LM_ERRF(LM_ERR_NOMEM, "out of memory for the reference distributions");
    free(ref);
  }
  if (s) judge_free(be, j);
  return s;
}

/* The model as it is now against the reference: the mean KL; the forward's and the
 * comparison's seconds added to t. */
static lm_status judge_run(lm_model *m, lm_backend *be, const lm_qsweep_opts *o, lm_forward *f,
                           judge *j, double *kl, lm_qsweep *t) {
  double t0 = now();
  lm_status s = j->dev ? calib(m, be, o, f, NULL, j, 0) : calib(m, be, o, f, j->got, NULL, 0);
  double t1 = now();
  t->s_forward += t1 - t0;
  LM_TRY(s);
  if (j->dev) {
    LM_TRY(be->ops->download(be, j->kl_rows, j->kl.data, (size_t)o->n_ids * sizeof(float)));
    *kl = 0;
    for (int64_t r = 0; r < o->n_ids; r++) /* in position order: the same bits every run */
      *kl += (double)j->kl_rows[r] / (double)o->n_ids;
  } else {
    int64_t agree;
    lm_logits_kl_ref(&j->host, j->got, kl, &agree);
  }
  t->s_kl += now() - t1;
  return LM_OK;
}

typedef struct collect {
  lm_qsweep *t;
  const lm_qsweep_opts *o;
  int cap;
} collect;

void lm_qsweep_row_kinds(lm_qsweep_row *r, const lm_weight *w, const lm_qkind *kinds, int n) {
  int forced = lm_quantize_forced_bits(r->module);
  for (int k = 0; k < n; k++) {
    int fits = lm_weight_payload_fits(w, kinds[k].bits, kinds[k].group) &&
               (!forced || kinds[k].bits == forced);
    r->bytes[k] = fits ? lm_weight_payload_bytes(w, kinds[k].bits, kinds[k].group) : 0;
    if (!fits) r->kl[k] = -1;
  }
}

/* A row per module, its kinds' KLs to be measured. */
static lm_status add_row(const lm_weight *w, const char *module, void *arg) {
  collect *c = arg;
  if (c->t->n_rows == c->cap) {
    int cap = c->cap ? 2 * c->cap : 64;
    lm_qsweep_row *r = realloc(c->t->rows, (size_t)cap * sizeof *r);
    if (!r) return LM_ERRF(LM_ERR_NOMEM, "out of memory");
    c->t->rows = r;
    c->cap = cap;
  }
  lm_qsweep_row *r = &c->t->rows[c->t->n_rows++];
  memset(r, 0, sizeof *r);
  snprintf(r->module, sizeof r->module, "%s", module);
  r->w = (lm_weight *)w; /* the model is the caller's to change (lm_quant_sweep takes it so) */
  r->params = (w->n_experts ? w->n_experts : 1) * w->rows * w->cols;
  lm_qsweep_row_kinds(r, w, c->o->kinds, c->o->n_kinds);
  return LM_OK;
}

/* Quantizes row r's module with kind k, measures, and puts the original back. */
static lm_status measure(lm_model *m, lm_backend *be, const lm_qsweep_opts *o, lm_forward *f,
                         judge *j, lm_qsweep *t, lm_qsweep_row *r, int k) {
  lm_weight_payload p;
  double t0 = now();
  LM_TRY(lm_weight_payload_quantize(r->w, o->kinds[k].bits, o->kinds[k].group, &p));
  double t1 = now();
  lm_status s = lm_exchange_weight(be, r->w, &p);
  if (s) {
    lm_weight_payload_free(&p);
    return s;
  }
  double t2 = now();
  t->s_quantize += t1 - t0;
  t->s_exchange += t2 - t1;
  s = judge_run(m, be, o, f, j, &r->kl[k], t);
  double t3 = now();
  lm_status back = lm_exchange_weight(be, r->w, &p); /* p: the candidate again */
  lm_weight_payload_free(&p);
  t->s_exchange += now() - t3;
  if (back) return back;
  LM_TRY(s);
  if (!isfinite(r->kl[k]))
    return LM_ERRF(LM_ERR_STATE, "the model's logits are not finite with this module quantized");
  if (r->kl[k] < 0) r->kl[k] = 0; /* rounding below an exact 0; negative KLs mark misfits */
  return LM_OK;
}

static lm_status sweep_rows(lm_model *m, lm_backend *be, const lm_qsweep_opts *o, lm_qsweep *t,
                            lm_forward *f, judge *j) {
  int64_t total = 0, done = 0;
  for (int i = 0; i < t->n_rows; i++)
    for (int k = 0; k < o->n_kinds; k++)
      total += t->rows[i].kl[k] >= 0;
  for (int i = 0; i < t->n_rows; i++)
    for (int k = 0; k < o->n_kinds; k++) {
      if (t->rows[i].kl[k] < 0) continue;
      lm_status s = measure(m, be, o, f, j, t, &t->rows[i], k);
      if (s)
        return lm_err_prefix(s, "%s at %d bits, group %d", t->rows[i].module, o->kinds[k].bits,
                             o->kinds[k].group);
      if (o->progress) o->progress(o->progress_ctx, ++done, total, t->rows[i].module);
    }
  return LM_OK;
}

lm_status lm_quant_sweep(lm_model *m, lm_backend *be, const lm_qsweep_opts *o, lm_qsweep *out) {
  memset(out, 0, sizeof *out);
  if (m->quant.present)
    return LM_ERRF(LM_ERR_UNSUPPORTED, "%s is already quantized: measure from the bf16 checkpoint",
                   m->dir);
  if (o->n_kinds < 1 || o->n_kinds > LM_QSWEEP_MAX_KINDS || o->n_ids < 2 || o->chunk < 1)
    return LM_ERRF(LM_ERR_INVALID, "a sweep needs 1..%d kinds and at least 2 calibration tokens",
                   LM_QSWEEP_MAX_KINDS);
  memcpy(out->kinds, o->kinds, (size_t)o->n_kinds * sizeof *o->kinds);
  out->n_kinds = o->n_kinds;
  out->calib_tokens = o->n_ids;
  collect c = {.t = out, .o = o};
  lm_status s = lm_quantize_foreach_module(m, add_row, &c);
  lm_forward *f = NULL;
  judge j = {0};
  if (!s) s = lm_forward_create(m, be, o->chunk, o->chunk, &f);
  if (!s) s = judge_init(m, be, o, f, &j);
  if (!s) s = sweep_rows(m, be, o, out, f, &j);
  judge_free(be, &j);
  lm_forward_free(f);
  if (s) lm_qsweep_free(out);
  return s;
}

void lm_qsweep_free(lm_qsweep *s) {
  free(s->rows);
  memset(s, 0, sizeof *s);
}
