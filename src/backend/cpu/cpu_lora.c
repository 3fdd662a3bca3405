/* cpu_lora.c — the LoRA ops of the CPU backend (backend.h: lm_lora_shrink_args and the lora
 * terms of lm_matmul_args), in f32: each row's picks read from the tables as the step runs. In
 * a team every thread calls these ops; the rows are shared out as chunks. */
#include "backend/cpu/cpu_internal.h"
#include "base/status.h"

/* t[j * R + r] = weight_j · (A_j x)[r] for the picks of row `row` of one module. */
static void shrink_row(const lm_cpu_vec *vk, const lm_lora_io *io, const float *x, int64_t K,
                       int64_t row) {
  const lm_lora_pick *pk = io->picks + row * LM_LORA_PICKS;
  float *t = lm_cpu_row(io->t, row);
  for (int j = 0; j < LM_LORA_PICKS && pk[j].slot >= 0; j++) {
    const lm_lora_ent *e = &io->tab[pk[j].slot];
    if (!e->rank) continue;
    const float *rows[e->rank];
    for (int r = 0; r < e->rank; r++)
      rows[r] = (const float *)e->a + (int64_t)r * K;
    vk->dots(x, rows, e->rank, (int)K, pk[j].weight, t + (int64_t)j * io->rank_stride);
  }
}

typedef struct shrink_job {
  const lm_lora_shrink_args *a;
  const lm_cpu_vec *vk;
} shrink_job;

static void shrink_chunk(void *arg, int64_t i) {
  const shrink_job *j = arg;
  int64_t row = i / j->a->n;
  shrink_row(j->vk, &j->a->io[i % j->a->n], lm_cpu_row(j->a->x, row), j->a->x.cols, row);
}

lm_status lm_cpu_lora_shrink(lm_backend *be, const lm_lora_shrink_args *a) {
  if (a->n < 1 || a->n > 3 || a->x.dtype != LM_DT_F32)
    return LM_ERRF(LM_ERR_INVALID, "lora_shrink: %d modules of %s rows", a->n,
                   lm_dtype_name(a->x.dtype));
  shrink_job j = {a, lm_cpu_vec_of(be)};
  lm_cpu_team_run(lm_cpu_team_of(be), a->x.rows * a->n, 1, shrink_chunk, &j);
  return LM_OK;
}

typedef struct expand_job {
  lm_tensor out;
  const lm_lora_io *io;
} expand_job;

/* out[row][c] += Σ_j Σ_r B_j[c][r] · t[j * R + r], the picks in order. */
static void expand_chunk(void *arg, int64_t row) {
  const expand_job *j = arg;
  const lm_lora_pick *pk = j->io->picks + row * LM_LORA_PICKS;
  const float *t = lm_cpu_row(j->io->t, row);
  float *y = lm_cpu_row(j->out, row);
  for (int k = 0; k < LM_LORA_PICKS && pk[k].slot >= 0; k++) {
    const lm_lora_ent *e = &j->io->tab[pk[k].slot];
    const float *tk = t + (int64_t)k * j->io->rank_stride;
    for (int64_t c = 0; e->rank && c < j->out.cols; c++) {
      const float *b = (const float *)e->b + c * e->rank;
      float s = 0;
      for (int r = 0; r < e->rank; r++)
        s += b[r] * tk[r];
      y[c] += s;
    }
  }
}

lm_status lm_cpu_lora_expand(lm_backend *be, lm_tensor out, const lm_lora_io *io) {
  if (out.dtype != LM_DT_F32 || io->t.rows < out.rows)
    return LM_ERRF(LM_ERR_INVALID, "lora: %s output of %lld rows, t of %lld",
                   lm_dtype_name(out.dtype), (long long)out.rows, (long long)io->t.rows);
  expand_job j = {out, io};
  lm_cpu_team_run(lm_cpu_team_of(be), out.rows, 1, expand_chunk, &j);
  return LM_OK;
}
