/* prompt_cache.c — byte-capped LRU of prefix snapshots (see prompt_cache.h). Entries live in a
 * small array; LRU order is a use counter (the oldest tick is evicted first). */
#include "engine/prompt_cache.h"

#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "kv/kv_snapshot.h"

typedef struct pc_entry {
  char *ns;
  int32_t *ids;
  int64_t n;
  lm_kv_set *kv; /* the state after exactly n tokens */
  int64_t bytes;
  uint64_t tick; /* last use */
} pc_entry;

struct lm_prompt_cache {
  pc_entry *e;
  int n, cap;
  int max_entries; /* 0: no cap but the bytes */
  uint64_t clock;
  lm_prompt_cache_stats st;
};

lm_status lm_prompt_cache_create(int64_t max_bytes, int max_entries, lm_prompt_cache **out) {
  *out = NULL;
  if (max_bytes <= 0) return LM_ERRF(LM_ERR_INVALID, "prompt cache: the byte cap must be positive");
  if (max_entries < 0) return LM_ERRF(LM_ERR_INVALID, "prompt cache: the entry cap must be >= 0");
  lm_prompt_cache *pc = calloc(1, sizeof *pc);
  if (!pc) return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  pc->st.max_bytes = max_bytes;
  pc->max_entries = max_entries;
  *out = pc;
  return LM_OK;
}

static void entry_free(pc_entry *e) {
  free(e->ns);
  free(e->ids);
  lm_kv_set_free(e->kv);
}

/* Removes entry i (order does not matter: LRU lives in the ticks). */
static void drop(lm_prompt_cache *pc, int i) {
  pc->st.bytes_held -= pc->e[i].bytes;
  entry_free(&pc->e[i]);
  pc->e[i] = pc->e[--pc->n];
  pc->st.entries = pc->n;
}

void lm_prompt_cache_clear(lm_prompt_cache *pc) {
  while (pc->n)
    drop(pc, pc->n - 1);
}

void lm_prompt_cache_free(lm_prompt_cache *pc) {
  if (!pc) return;
  lm_prompt_cache_clear(pc);
  free(pc->e);
  free(pc);
}

lm_prompt_cache_stats lm_prompt_cache_get_stats(const lm_prompt_cache *pc) { return pc->st; }

static int64_t common_prefix(const int32_t *a, const int32_t *b, int64_t n) {
  int64_t i = 0;
  while (i < n && a[i] == b[i])
    i++;
  return i;
}

/* Whether an entry's snapshot can be copied into dst: same caches, plans, backend, dtype. */
static int compatible(const lm_kv_set *snap, const lm_kv_set *dst) {
  if (snap->n != dst->n) return 0;
  for (int i = 0; i < snap->n; i++) {
    const lm_kv_cache *a = snap->caches[i], *b = dst->caches[i];
    lm_kv_spec pa = lm_kv_plan_spec(a), pb = lm_kv_plan_spec(b);
    if (a->be != b->be || a->dtype != b->dtype || !lm_kv_spec_equal(&pa, &pb)) return 0;
  }
  return 1;
}

lm_status lm_prompt_cache_lookup(lm_prompt_cache *pc, const char *ns, const int32_t *ids, int64_t n,
                                 int64_t max_reuse, lm_kv_set *dst, int64_t *reused) {
  *reused = 0;
  if (n < 0 || (n && !ids) || !dst)
    return LM_ERRF(LM_ERR_INVALID, "prompt cache lookup: bad arguments");
  ns = ns ? ns : "";
  int64_t limit = max_reuse < 0 || max_reuse > n ? n : max_reuse, best = 0, refused = 0;
  int bi = -1;
  pc->st.lookups++;
  for (int i = 0; i < pc->n; i++) {
    pc_entry *e = &pc->e[i];
    if (strcmp(e->ns, ns) || !compatible(e->kv, dst)) continue;
    int64_t m = common_prefix(e->ids, ids, e->n < limit ? e->n : limit);
    if (m < e->n && !lm_kv_set_can_truncate(e->kv, m)) { /* a wrapped ring cannot go back to m */
      refused = m > refused ? m : refused;
      continue;
    }
    if (m > best || (m == best && m && e->tick > pc->e[bi].tick)) best = m, bi = i;
  }
  if (refused > best) pc->st.declined++;
  if (!best) {
    pc->st.misses++;
    return LM_OK;
  }
  LM_TRY(lm_kv_set_copy_prefix(dst, pc->e[bi].kv, best));
  pc->e[bi].tick = ++pc->clock;
  pc->st.hits++;
  pc->st.tokens_reused += best;
  *reused = best;
  return LM_OK;
}

/* Backend bytes an exact-fit snapshot of kv takes (what lm_kv_set_clone allocates). */
static int64_t snapshot_bytes(const lm_kv_set *kv, int64_t n) {
  int64_t b = n * (int64_t)sizeof(int32_t);
  for (int i = 0; i < kv->n; i++) {
    const lm_kv_cache *c = kv->caches[i];
    b += (c->window ? c->window : n) * lm_kv_bytes_per_token(c);
  }
  return b;
}

static int find_exact(const lm_prompt_cache *pc, const char *ns, const int32_t *ids, int64_t n) {
  for (int i = 0; i < pc->n; i++)
    if (pc->e[i].n == n && !strcmp(pc->e[i].ns, ns) &&
        !memcmp(pc->e[i].ids, ids, (size_t)n * sizeof *ids))
      return i;
  return -1;
}

static void evict_lru(lm_prompt_cache *pc) {
  int old = 0;
  for (int i = 1; i < pc->n; i++)
    old = pc->e[i].tick < pc->e[old].tick ? i : old;
  drop(pc, old);
  pc->st.evictions++;
}

/* Makes room for one more entry of `bytes`: under both caps once it is added. */
static void evict_to_fit(lm_prompt_cache *pc, int64_t bytes) {
  while (pc->n && (pc->st.bytes_held + bytes > pc->st.max_bytes ||
                   (pc->max_entries && pc->n >= pc->max_entries)))
    evict_lru(pc);
}

int lm_prompt_cache_shrink(lm_prompt_cache *pc, int64_t bytes) {
  if (!pc->n || pc->st.bytes_held <= bytes) return 0;
  evict_lru(pc);
  return 1;
}

/* Drops the entries the new one covers: same namespace, a prefix of its ids, reachable by a cut. */
static void drop_superseded(lm_prompt_cache *pc, const pc_entry *ne) {
  for (int i = pc->n - 1; i >= 0; i--) {
    const pc_entry *e = &pc->e[i];
    if (e->n < ne->n && !strcmp(e->ns, ne->ns) && compatible(e->kv, ne->kv) &&
        common_prefix(e->ids, ne->ids, e->n) == e->n && lm_kv_set_can_truncate(ne->kv, e->n)) {
      drop(pc, i);
      pc->st.superseded++;
    }
  }
}

static lm_status entry_make(const char *ns, const int32_t *ids, int64_t n, const lm_kv_set *kv,
                            pc_entry *e) {
  memset(e, 0, sizeof *e);
  e->n = n;
  if (!(e->ns = strdup(ns)) || !(e->ids = malloc((size_t)n * sizeof *ids))) {
    entry_free(e);
    return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  }
  memcpy(e->ids, ids, (size_t)n * sizeof *ids);
  lm_status s = lm_kv_set_clone(kv, &e->kv);
  if (s) {
    entry_free(e);
    return lm_err_prefix(s, "prompt cache snapshot");
  }
  e->bytes = lm_kv_set_alloc_bytes(e->kv) + n * (int64_t)sizeof *ids;
  return LM_OK;
}

/* The entry joins the cache (its bytes counted), dropping those it supersedes. */
static void add_entry(lm_prompt_cache *pc, pc_entry *e) {
  e->tick = ++pc->clock;
  drop_superseded(pc, e);
  pc->e[pc->n++] = *e;
  pc->st.entries = pc->n;
  pc->st.bytes_held += e->bytes;
  pc->st.inserts++;
}

/* Arguments of an insert, and room in the entry array. */
static lm_status check_insert(lm_prompt_cache *pc, const char *ns, const int32_t *ids, int64_t n,
                              const lm_kv_set *kv) {
  if (n < 1 || !ids || !kv || !ns)
    return LM_ERRF(LM_ERR_INVALID, "prompt cache insert: bad arguments");
  for (int i = 0; i < kv->n; i++)
    if (kv->caches[i]->n != n)
      return LM_ERRF(LM_ERR_INVALID, "prompt cache insert: cache %d holds %lld tokens, not %lld", i,
                     (long long)kv->caches[i]->n, (long long)n);
  if (pc->n == pc->cap) {
    int cap = pc->cap ? 2 * pc->cap : 8;
    pc_entry *ne = realloc(pc->e, (size_t)cap * sizeof *ne);
    if (!ne) return LM_ERRF(LM_ERR_NOMEM, "out of memory");
    pc->e = ne;
    pc->cap = cap;
  }
  return LM_OK;
}

lm_status lm_prompt_cache_insert(lm_prompt_cache *pc, const char *ns, const int32_t *ids, int64_t n,
                                 const lm_kv_set *kv) {
  ns = ns ? ns : "";
  LM_TRY(check_insert(pc, ns, ids, n, kv));
  int have = find_exact(pc, ns, ids, n);
  if (have >= 0) {
    pc->e[have].tick = ++pc->clock;
    return LM_OK;
  }
  int64_t need = snapshot_bytes(kv, n);
  if (need > pc->st.max_bytes) {
    pc->st.rejected++;
    return LM_OK;
  }
  evict_to_fit(pc, need); /* before the copy, so the cap bounds the peak too */
  pc_entry e;
  LM_TRY(entry_make(ns, ids, n, kv, &e));
  add_entry(pc, &e);
  return LM_OK;
}

lm_status lm_prompt_cache_adopt(lm_prompt_cache *pc, const char *ns, const int32_t *ids, int64_t n,
                                lm_kv_set *kv) {
  lm_status s = check_insert(pc, ns ? ns : "", ids, n, kv);
  if (s || !kv) {
    lm_kv_set_free(kv);
    return s;
  }
  ns = ns ? ns : "";
  int have = find_exact(pc, ns, ids, n);
  if (have >= 0) { /* the same state: keep the older snapshot, count the use */
    pc->e[have].tick = ++pc->clock;
    lm_kv_set_free(kv);
    return LM_OK;
  }
  int64_t bytes = lm_kv_set_alloc_bytes(kv) + n * (int64_t)sizeof *ids;
  if (bytes > pc->st.max_bytes) {
    pc->st.rejected++;
    lm_kv_set_free(kv);
    return LM_OK;
  }
  evict_to_fit(pc, bytes);
  pc_entry e = {.n = n, .kv = kv, .bytes = bytes};
  if (!(e.ns = strdup(ns)) || !(e.ids = malloc((size_t)n * sizeof *ids))) {
    entry_free(&e);
    return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  }
  memcpy(e.ids, ids, (size_t)n * sizeof *ids);
  add_entry(pc, &e);
  return LM_OK;
}

const lm_kv_set *lm_prompt_cache_find(const lm_prompt_cache *pc, const char *ns, const int32_t *ids,
                                      int64_t n, int64_t *len) {
  ns = ns ? ns : "";
  int best = -1;
  for (int i = 0; i < pc->n; i++) {
    const pc_entry *e = &pc->e[i];
    if (e->n <= n && !strcmp(e->ns, ns) && common_prefix(e->ids, ids, e->n) == e->n &&
        (best < 0 || e->n > pc->e[best].n))
      best = i;
  }
  *len = best >= 0 ? pc->e[best].n : 0;
  return best >= 0 ? pc->e[best].kv : NULL;
}
