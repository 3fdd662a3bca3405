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

/* Teacher-forced logits of the calibration tokens, into out [T][V]. */
static lm_status calib_logits(lm_model *m, lm_backend *be, const lm_qsweep_opts *o, lm_forward *f,
                              float *out) {
  lm_kv_spec specs[m->cfg.n_caches + 1];
  lm_model_kv_specs(m, specs);
  lm_kv_set *kv = NULL;
  lm_status s = lm_kv_set_create(be, specs, m->cfg.n_caches, &kv);
  if (!s) s = lm_forward_feed(f, kv, o->ids, o->n_ids, o->chunk, out);
  lm_kv_set_free(kv);
  return s;
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
                         const lm_logits_ref *ref, float *got, lm_qsweep *t, lm_qsweep_row *r,
                         int k) {
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
  s = calib_logits(m, be, o, f, got);
  double t3 = now();
  lm_status back = lm_exchange_weight(be, r->w, &p); /* p: the candidate again */
  lm_weight_payload_free(&p);
  if (back) return back;
  LM_TRY(s);
  double t4 = now();
  int64_t agree;
  lm_logits_kl_ref(ref, got, &r->kl[k], &agree);
  if (!isfinite(r->kl[k]))
    return LM_ERRF(LM_ERR_STATE, "the model's logits are not finite with this module quantized");
  if (r->kl[k] < 0) r->kl[k] = 0; /* rounding below an exact 0; negative KLs mark misfits */
  t->s_quantize += t1 - t0;
  t->s_exchange += (t2 - t1) + (t4 - t3);
  t->s_forward += t3 - t2;
  t->s_kl += now() - t4;
  return LM_OK;
}

static lm_status sweep_rows(lm_model *m, lm_backend *be, const lm_qsweep_opts *o, lm_qsweep *t,
                            lm_forward *f, const lm_logits_ref *ref, float *got) {
  int64_t total = 0, done = 0;
  for (int i = 0; i < t->n_rows; i++)
    for (int k = 0; k < o->n_kinds; k++)
      total += t->rows[i].kl[k] >= 0;
  for (int i = 0; i < t->n_rows; i++)
    for (int k = 0; k < o->n_kinds; k++) {
      if (t->rows[i].kl[k] < 0) continue;
      lm_status s = measure(m, be, o, f, ref, got, t, &t->rows[i], k);
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
  int64_t n = o->n_ids * m->cfg.vocab_size;
  float *ref = s ? NULL : malloc((size_t)n * sizeof(float));
  float *got = ref ? malloc((size_t)n * sizeof(float)) : NULL;
  lm_forward *f = NULL;
  if (!s && !got) s = LM_ERRF(LM_ERR_NOMEM, "out of memory for the calibration logits");
  if (!s) s = lm_forward_create(m, be, o->chunk, o->chunk, &f);
  lm_logits_ref lr = {0};
  if (!s) s = calib_logits(m, be, o, f, ref);
  if (!s && lm_logits_ref_init(&lr, ref, o->n_ids, m->cfg.vocab_size))
    s = LM_ERRF(LM_ERR_NOMEM, "out of memory for the reference distributions");
  free(ref);
  if (!s) s = sweep_rows(m, be, o, out, f, &lr, got);
  lm_logits_ref_free(&lr);
  lm_forward_free(f);
  free(got);
  if (s) lm_qsweep_free(out);
  return s;
}

void lm_qsweep_free(lm_qsweep *s) {
  free(s->rows);
  memset(s, 0, sizeof *s);
}
