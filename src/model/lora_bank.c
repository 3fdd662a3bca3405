/* lora_bank.c — mounted adapters, their module tables and the step's row picks (lora_bank.h). */
#include "model/lora_bank.h"

#include <stdlib.h>
#include <string.h>

#include "base/status.h"

#define N_SLOTS LM_ADAPTER_MOUNT_MAX

struct lm_lora_bank {
  lm_backend *be;
  int n_layers;
  int64_t max_tokens;
  lm_lora *slot[N_SLOTS];
  int default_slots[LM_LORA_PICKS];
  int n_default;
  /* tables: [n_layers * LM_LORA_KINDS][N_SLOTS], host mirror and backend copy */
  lm_lora_ent *tab_host;
  lm_lora_ent *tab;
  int *site_users; /* [n_layers * LM_LORA_KINDS]: mounted adapters adapting the module */
  int rank_stride; /* the largest rank mounted: t's column stride per pick */
  /* the step: picks [max_tokens][LM_LORA_PICKS] (host staging, backend copy); t: three f32
   * [max_tokens][LM_LORA_PICKS * rank_stride] (the modules of one shrink) */
  lm_lora_pick *picks_host, *picks;
  void *t_mem;
  int64_t t_cols;
  int step_picks; /* most picks a row of the step has (0: no LoRA this step) */
  lm_lora_io *io; /* [n_layers * LM_LORA_KINDS] the step's paths, fixed before it runs (the CPU's
                   * team issues the ops from every thread: nothing may change during the step) */
  uint64_t gen;
};

static size_t tab_bytes(const lm_lora_bank *b) {
  return (size_t)b->n_layers * LM_LORA_KINDS * N_SLOTS * sizeof(lm_lora_ent);
}

lm_status lm_lora_bank_create(const lm_model *m, lm_backend *be, int64_t max_tokens,
                              lm_lora_bank **out) {
  *out = NULL;
  if (!be->ops->lora_shrink)
    return LM_ERRF(LM_ERR_UNSUPPORTED, "the %s backend does not run LoRA adapters", be->ops->name);
  lm_lora_bank *b = calloc(1, sizeof *b);
  if (!b) return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  b->be = be, b->n_layers = m->cfg.n_layers, b->max_tokens = max_tokens, b->gen = 1;
  size_t sites = (size_t)b->n_layers * LM_LORA_KINDS;
  b->tab_host = calloc(sites * N_SLOTS, sizeof *b->tab_host);
  b->site_users = calloc(sites, sizeof *b->site_users);
  b->picks_host = malloc((size_t)max_tokens * LM_LORA_PICKS * sizeof *b->picks_host);
  b->io = calloc(sites, sizeof *b->io);
  lm_status s = b->tab_host && b->site_users && b->picks_host && b->io
                    ? LM_OK
                    : LM_ERRF(LM_ERR_NOMEM, "out of memory for the adapter tables");
  if (!s) s = be->ops->alloc(be, tab_bytes(b), (void **)&b->tab);
  if (!s) s = be->ops->upload(be, b->tab, b->tab_host, tab_bytes(b));
  if (!s)
    s = be->ops->alloc(be, (size_t)max_tokens * LM_LORA_PICKS * sizeof(lm_lora_pick),
                       (void **)&b->picks);
  if (s) return lm_lora_bank_free(b), lm_err_prefix(s, "adapter tables");
  *out = b;
  return LM_OK;
}

void lm_lora_bank_free(lm_lora_bank *b) {
  if (!b) return;
  if (b->tab) b->be->ops->free(b->be, b->tab);
  if (b->picks) b->be->ops->free(b->be, b->picks);
  if (b->t_mem) b->be->ops->free(b->be, b->t_mem);
  free(b->tab_host);
  free(b->site_users);
  free(b->picks_host);
  free(b->io);
  free(b);
}

/* t sized for the largest rank mounted (it only grows: a plan keeps its pointers). */
static lm_status fit_rank(lm_lora_bank *b, int rank) {
  if (rank <= b->rank_stride) return LM_OK;
  int64_t cols = (int64_t)LM_LORA_PICKS * rank;
  void *mem = NULL;
  LM_TRY(b->be->ops->alloc(b->be, (size_t)(3 * b->max_tokens * cols) * sizeof(float), &mem));
  if (b->t_mem) b->be->ops->free(b->be, b->t_mem);
  b->t_mem = mem, b->t_cols = cols, b->rank_stride = rank;
  return LM_OK;
}

/* Slot s's entries in every table: l's modules, or nothing. */
static void write_slot(lm_lora_bank *b, int s, const lm_lora *l, int sign) {
  for (int i = 0; l && i < l->n_mods; i++) {
    const lm_lora_module *md = &l->mods[i];
    size_t site = (size_t)md->layer * LM_LORA_KINDS + md->kind;
    b->tab_host[site * N_SLOTS + (size_t)s] =
        sign > 0 ? (lm_lora_ent){.a = md->a_dev, .b = md->b_dev, .rank = md->rank}
                 : (lm_lora_ent){0};
    b->site_users[site] += sign;
  }
}

lm_status lm_lora_bank_mount(lm_lora_bank *b, int slot, lm_lora *l) {
  if (slot < 0 || slot >= N_SLOTS)
    return LM_ERRF(LM_ERR_INVALID, "adapter slot %d (0..%d)", slot, N_SLOTS - 1);
  if (l) {
    LM_TRY(lm_lora_prepare(l, b->be));
    LM_TRY(fit_rank(b, l->max_rank));
  }
  write_slot(b, slot, b->slot[slot], -1);
  write_slot(b, slot, l, +1);
  b->slot[slot] = l;
  b->gen++;
  return b->be->ops->upload(b->be, b->tab, b->tab_host, tab_bytes(b));
}

void lm_lora_bank_set_default(lm_lora_bank *b, const int *slots, int n) {
  b->n_default = n < LM_LORA_PICKS ? n : LM_LORA_PICKS;
  for (int i = 0; i < b->n_default; i++)
    b->default_slots[i] = slots[i];
}

/* Row t's picks: its sequence's list, ending at the first free slot. */
static int row_picks(lm_lora_bank *b, const lm_batch *batch, int32_t t) {
  lm_lora_pick *dst = &b->picks_host[(size_t)t * LM_LORA_PICKS];
  int n = 0;
  if (batch->lora) {
    const lm_lora_pick *src = &batch->lora[(size_t)batch->seq[t] * LM_LORA_PICKS];
    for (; n < LM_LORA_PICKS && src[n].slot >= 0 && src[n].slot < N_SLOTS && b->slot[src[n].slot];
         n++)
      dst[n] = src[n];
  } else {
    for (; n < b->n_default; n++)
      dst[n] = (lm_lora_pick){.slot = b->default_slots[n], .weight = 1.0f};
  }
  for (int j = n; j < LM_LORA_PICKS; j++)
    dst[j] = (lm_lora_pick){.slot = -1};
  return n;
}

/* The t buffer of a module: modules shrunk together (q, k, v; gate, up) use different ones. */
static int t_index(lm_lora_kind k) {
  return k == LM_LORA_K || k == LM_LORA_UP ? 1 : k == LM_LORA_V ? 2 : 0;
}

lm_status lm_lora_bank_begin(lm_lora_bank *b, const lm_batch *batch, uint64_t *variant) {
  int most = 0;
  for (int32_t t = 0; t < batch->n_tokens; t++) {
    int n = row_picks(b, batch, t);
    most = n > most ? n : most;
  }
  b->step_picks = most;
  *variant = most ? b->gen * (LM_LORA_PICKS + 1) + (uint64_t)most : 0;
  if (!most) return LM_OK;
  for (size_t site = 0; site < (size_t)b->n_layers * LM_LORA_KINDS; site++) {
    float *t = (float *)b->t_mem + (size_t)t_index((lm_lora_kind)(site % LM_LORA_KINDS)) *
                                       (size_t)(b->max_tokens * b->t_cols);
    b->io[site] = (lm_lora_io){.tab = b->tab + site * N_SLOTS,
                               .picks = b->picks,
                               .t = {.data = t,
                                     .rows = batch->n_tokens,
                                     .cols = (int64_t)most * b->rank_stride,
                                     .ld = b->t_cols,
                                     .dtype = LM_DT_F32},
                               .rank_stride = b->rank_stride};
  }
  return b->be->ops->upload(b->be, b->picks, b->picks_host,
                            (size_t)batch->n_tokens * LM_LORA_PICKS * sizeof(lm_lora_pick));
}

int lm_lora_bank_at(const lm_lora_bank *b, int layer, lm_lora_kind kind) {
  return b && b->step_picks && b->site_users[(size_t)layer * LM_LORA_KINDS + kind] > 0;
}

lm_status lm_lora_bank_shrink(lm_lora_bank *b, int layer, const lm_lora_kind *kinds, int n,
                              lm_tensor x, const lm_lora_io **io) {
  lm_lora_shrink_args a = {.x = x};
  for (int i = 0; i < n; i++) {
    io[i] = NULL;
    if (!lm_lora_bank_at(b, layer, kinds[i])) continue;
    const lm_lora_io *p = &b->io[(size_t)layer * LM_LORA_KINDS + kinds[i]];
    a.io[a.n++] = *p;
    io[i] = p;
  }
  return a.n ? b->be->ops->lora_shrink(b->be, &a) : LM_OK;
}
