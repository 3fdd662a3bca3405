/* engine_adapters.c — LoRA adapters mounted by name in a running engine (lumen.h
 * lm_engine_load_adapter): the names and what the scheduler mounted under them. Files are read on
 * the caller's thread; the scheduler copies the matrices to the backend between two steps. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/status.h"
#include "engine/api_impl.h"
#include "model/lora.h"

typedef struct lm_mount {
  char name[LM_ADAPTER_NAME_MAX];
  char dir[4096];
  const char *format;
  int slot; /* -1: loading */
  uint64_t id;
  int max_rank, modules;
  int64_t bytes;
  double load_s, mount_s;
} lm_mount;

static double mono_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int lm_adapter_name_valid(const char *s, size_t n) {
  if (!s || n < 1 || n >= LM_ADAPTER_NAME_MAX) return 0;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
          c == '_' || c == '-'))
      return 0;
  }
  return 1;
}

static lm_status check_name(const char *name) {
  if (!lm_adapter_name_valid(name, name ? strlen(name) : 0))
    return LM_ERRF(LM_ERR_INVALID,
                   "adapter name '%s': 1..%d bytes of letters, digits, '.', '_' and '-'",
                   name ? name : "", LM_ADAPTER_NAME_MAX - 1);
  return LM_OK;
}

static int find(const lm_engine *e, const char *name) {
  for (int i = 0; i < e->n_mounts; i++)
    if (!strcmp(e->mounts[i].name, name)) return i;
  return -1;
}

static void drop(lm_engine *e, int i) {
  memmove(&e->mounts[i], &e->mounts[i + 1], (size_t)(e->n_mounts - i - 1) * sizeof *e->mounts);
  e->n_mounts--;
}

/* Reserves name (slot -1) so that two loads of one name cannot both go ahead. */
static lm_status reserve(lm_engine *e, const char *name, const char *dir) {
  lm_status st = LM_OK;
  pthread_mutex_lock(&e->mounts_mu);
  if (!e->mounts && !(e->mounts = calloc(LM_ADAPTER_MOUNT_MAX, sizeof *e->mounts)))
    st = LM_ERRF(LM_ERR_NOMEM, "out of memory");
  else if (find(e, name) >= 0)
    st = LM_ERRF(LM_ERR_STATE, "an adapter named '%s' is mounted already", name);
  else if (e->n_mounts == LM_ADAPTER_MOUNT_MAX)
    st = LM_ERRF(LM_ERR_STATE, "%d adapters are mounted (the most an engine holds)",
                 LM_ADAPTER_MOUNT_MAX);
  else {
    lm_mount *m = &e->mounts[e->n_mounts++];
    *m = (lm_mount){.slot = -1};
    snprintf(m->name, sizeof m->name, "%s", name);
    snprintf(m->dir, sizeof m->dir, "%s", dir);
  }
  pthread_mutex_unlock(&e->mounts_mu);
  return st;
}

lm_status lm_engine_load_adapter(lm_engine *e, const char *name, const char *dir) {
  if (!e || !dir || !*dir) return LM_ERRF(LM_ERR_INVALID, "load adapter: no engine or directory");
  LM_TRY(check_name(name));
  if (strlen(dir) >= sizeof((lm_mount *)0)->dir)
    return LM_ERRF(LM_ERR_INVALID, "adapter directory: path too long");
  double t0 = mono_s();
  LM_TRY(reserve(e, name, dir));
  lm_lora *l = NULL;
  int slot = -1;
  uint64_t id = 0;
  double mount_s = 0;
  lm_status st = lm_lora_load(e->ck->m, dir, 1.0f, &l);
  if (!st) st = lm_lora_stage(l, e->be->act_dtype); /* here, not on the engine thread */
  if (!st) st = lm_sched_mount(e->sched, l, &slot, &id, &mount_s);
  pthread_mutex_lock(&e->mounts_mu);
  int i = find(e, name);
  if (st) {
    drop(e, i);
  } else {
    lm_mount *m = &e->mounts[i];
    int64_t params = 0;
    for (int k = 0; k < l->n_mods; k++)
      params += (int64_t)l->mods[k].rank * (l->mods[k].in + l->mods[k].out);
    m->slot = slot, m->id = id, m->format = l->format, m->max_rank = l->max_rank;
    m->modules = l->n_mods;
    m->bytes = l->dev_bytes ? l->dev_bytes : params * (int64_t)sizeof(float);
    m->load_s = mono_s() - t0, m->mount_s = mount_s;
  }
  pthread_mutex_unlock(&e->mounts_mu);
  if (st && slot < 0) lm_lora_free(l); /* (mounted, the scheduler owns it) */
  return st;
}

lm_status lm_engine_unload_adapter(lm_engine *e, const char *name) {
  if (!e || !name) return LM_ERRF(LM_ERR_INVALID, "unload adapter: no engine or name");
  pthread_mutex_lock(&e->mounts_mu);
  int i = e->mounts ? find(e, name) : -1;
  int slot = i >= 0 ? e->mounts[i].slot : -1;
  uint64_t id = i >= 0 ? e->mounts[i].id : 0;
  if (slot >= 0) drop(e, i);
  pthread_mutex_unlock(&e->mounts_mu);
  if (slot < 0) return LM_ERRF(LM_ERR_NOT_FOUND, "no adapter named '%s' is mounted", name);
  return lm_sched_unmount(e->sched, slot, id);
}

int lm_engine_list_adapters(lm_engine *e, lm_adapter_info *out, int max) {
  if (!e) return 0;
  pthread_mutex_lock(&e->mounts_mu);
  int n = 0;
  for (int i = 0; i < e->n_mounts; i++) {
    const lm_mount *m = &e->mounts[i];
    if (m->slot < 0) continue;
    if (out && n < max) {
      lm_adapter_info *a = &out[n];
      *a = (lm_adapter_info){.max_rank = m->max_rank,
                             .modules = m->modules,
                             .bytes = m->bytes,
                             .load_s = m->load_s,
                             .mount_s = m->mount_s,
                             .users = lm_sched_mount_users(e->sched, m->slot)};
      snprintf(a->name, sizeof a->name, "%s", m->name);
      snprintf(a->format, sizeof a->format, "%s", m->format);
      snprintf(a->dir, sizeof a->dir, "%s", m->dir);
    }
    n++;
  }
  pthread_mutex_unlock(&e->mounts_mu);
  return n;
}

lm_status lm_engine_pick_adapters(lm_engine *e, const lm_request_options *o, lm_job *j) {
  j->n_lora = 0;
  j->lora_base = o->no_adapters;
  if (o->no_adapters && o->n_adapters)
    return LM_ERRF(LM_ERR_INVALID, "adapters: no_adapters with %d adapters named", o->n_adapters);
  if (o->n_adapters < 0 || o->n_adapters > LM_ADAPTER_STACK_MAX || (o->n_adapters && !o->adapters))
    return LM_ERRF(LM_ERR_INVALID, "adapters: 0..%d names (got %d)", LM_ADAPTER_STACK_MAX,
                   o->n_adapters);
  lm_status st = LM_OK;
  pthread_mutex_lock(&e->mounts_mu);
  for (int i = 0; i < o->n_adapters && !st; i++) {
    const char *name = o->adapters[i];
    float w = o->adapter_weights ? o->adapter_weights[i] : 1.0f;
    int k = name && e->mounts ? find(e, name) : -1;
    if (k < 0 || e->mounts[k].slot < 0)
      st = LM_ERRF(LM_ERR_NOT_FOUND, "adapter '%s' is not mounted", name ? name : "(null)");
    else if (!isfinite(w))
      st = LM_ERRF(LM_ERR_INVALID, "adapter '%s': its weight must be a finite number", name);
    else {
      j->lora[i] = (lm_lora_pick){.slot = e->mounts[k].slot, .weight = w};
      j->lora_id[i] = e->mounts[k].id;
      j->n_lora = i + 1;
    }
  }
  pthread_mutex_unlock(&e->mounts_mu);
  if (st) j->n_lora = 0;
  return st;
}
