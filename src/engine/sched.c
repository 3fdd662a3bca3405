/* sched.c — the engine thread of sched.h: the job queue, admission into slots, the prefix cache
 * of finished sequences, the batched step, and the commands that run between steps.
 *
 * Locking: `mu` guards the queue, the reservation counter, the published stats, the command list
 * and the stop flag. Slots, caches and the prefix cache belong to the engine thread alone; it
 * takes `mu` only to move jobs and commands in and to publish counters, never during a forward
 * step. Every counter in `st` is written with `mu` held. */
#include "engine/sched.h"

#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/status.h"
#include "engine/constraint.h"
#include "engine/mask_prep.h"
#include "engine/prompt_cache.h"
#include "engine/seq.h"
#include "engine/spec_draft.h"
#include "engine/spec_ngram.h"
#include "kv/kv_state.h"
#include "model/fingerprint.h"
#include "model/forward.h"
#include "model/lora.h"

/* A command for the engine thread (sched.h): run, then done = 1 and the result in st/msg. */
typedef struct sched_cmd {
  lm_status (*run)(lm_sched *s, struct sched_cmd *c);
  const int32_t *ids;
  int64_t n, prefill, chunk;
  const char *path;
  float *out;
  int32_t *got_ids; /* load: the state's tokens */
  int64_t got_n;
  lm_status st;
  char msg[512];
  int done;
  int again; /* run set it: not done yet, run it again after the next step */
  struct sched_cmd *next;
} sched_cmd;

#define LM_ROW_ERR 256

/* A round's rejected drafts are trimmed from caches that may have wrapped. */
_Static_assert(LM_SPEC_MAX_TOKENS <= LM_KV_RING_SPARE + 1,
               "a ring's spare slots must cover a round's drafts");

struct lm_sched {
  lm_model *m;
  lm_backend *be;
  lm_sched_opts o;
  lm_kv_spec *specs;
  int32_t *stop_ids, *keep;
  lm_seq_env env;
  lm_admit admit;
  lm_forward *fw;
  int64_t max_step; /* tokens per step: chunk + parallel x (1 + spec_tokens) */
  int max_rows;     /* logits rows per step: parallel x (1 + spec_tokens) */
  /* engine-owned */
  lm_seq *slots;       /* [parallel] */
  int *used;           /* [parallel] */
  lm_prompt_cache *pc; /* NULL: off */
  int32_t *b_ids, *b_pos, *b_seq, *b_rows, *row_slot, *g_ids;
  lm_kv_set **b_kv;
  int *b_slot;        /* batch sequence index -> slot */
  float *logits;      /* [max_rows][vocab] */
  lm_tok_event *toks; /* [max_rows] */
  char (*row_err)[LM_ROW_ERR];
  /* shared, under mu */
  pthread_mutex_t mu;
  pthread_cond_t cv, cmd_cv;
  sched_cmd *cmds; /* pending, oldest first */
  pthread_t th;
  int started, stop;
  lm_job **q; /* ring of queue_cap */
  int q_head, q_n;
  int64_t reserved; /* bytes reserved by active sequences */
  int64_t pc_held;  /* bytes the prefix cache holds (mirrored under mu) */
  lm_sched_stats st;
  /* a GPU backend: the step's masks are filled while the forward runs (NULL: in sampling) */
  lm_mask_prep *prep;
  lm_constraint **prep_cons; /* [parallel] */
  /* LoRA mounts: slots 0..o.n_lora-1 hold the default set (borrowed), the others what
   * lm_sched_mount put there (owned). mount_id, closing and users under mu (submit reads them) */
  struct lm_lora *mounted[LM_ADAPTER_MOUNT_MAX];
  uint64_t mount_id[LM_ADAPTER_MOUNT_MAX], next_mount;
  int closing[LM_ADAPTER_MOUNT_MAX];
  int64_t users[LM_ADAPTER_MOUNT_MAX];
  lm_lora_pick *b_lora; /* [parallel][LM_LORA_PICKS] the batch's sequences' picks */
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_i32(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

/* ---- jobs ------------------------------------------------------------------------------------ */

lm_status lm_job_create(lm_job **out, lm_chan **consumer) {
  *out = NULL;
  *consumer = NULL;
  lm_job *j = calloc(1, sizeof *j);
  if (!j || !(j->ch = lm_chan_create())) {
    free(j);
    return LM_ERRF(LM_ERR_NOMEM, "engine: out of memory (job)");
  }
  lm_sampling_init(&j->sampling);
  j->top_logprobs = -1;
  j->max_tokens = 1;
  *consumer = j->ch;
  *out = j;
  return LM_OK;
}

void lm_job_free(lm_job *j) {
  if (!j) return;
  free(j->ids);
  lm_sampling_clear(&j->sampling);
  for (int i = 0; i < j->n_stops; i++)
    free(j->stops[i]);
  free(j->stops);
  lm_constraint_free(j->con);
  lm_chan_unref(j->ch);
  free(j);
}

/* Ends a job that never ran (queue timeout, cancellation, shutdown). */
static void job_fail(lm_job *j, lm_finish_kind kind, const char *msg) {
  lm_finish f = {.kind = kind,
                 .stop_id = -1,
                 .stop_index = -1,
                 .prompt_tokens = j->n_ids,
                 .queue_s = now_s() - j->t_submit};
  snprintf(f.message, sizeof f.message, "%s", msg);
  lm_chan_finish(j->ch, &f);
  lm_job_free(j);
}

/* ---- create / free --------------------------------------------------------------------------- */

static lm_status sorted_dup(const int32_t *v, int32_t n, int32_t **out) {
  *out = malloc((size_t)(n ? n : 1) * sizeof **out);
  if (!*out) return LM_ERRF(LM_ERR_NOMEM, "engine: out of memory");
  if (n) memcpy(*out, v, (size_t)n * sizeof *v);
  qsort(*out, (size_t)n, sizeof **out, cmp_i32);
  return LM_OK;
}

static lm_status check_opts(const lm_sched_opts *o) {
  if (o->parallel < 1 || o->parallel > 4096)
    return LM_ERRF(LM_ERR_INVALID, "engine: parallel must be 1..4096");
  if (o->spec_tokens < 0 || o->spec_tokens > LM_SPEC_MAX_TOKENS)
    return LM_ERRF(LM_ERR_INVALID, "engine: speculative tokens must be 0..%d", LM_SPEC_MAX_TOKENS);
  if (o->chunk < 1 || o->chunk > (1 << 20))
    return LM_ERRF(LM_ERR_INVALID, "engine: chunk must be 1..1048576");
  if (o->queue_cap < 1)
    return LM_ERRF(LM_ERR_INVALID, "engine: the queue needs room for one request at least");
  if (o->max_ctx < 2 || o->kv_budget <= 0 || !o->specs || o->prompt_cache < 0)
    return LM_ERRF(LM_ERR_INVALID, "engine: bad scheduler options");
  return LM_OK;
}

static lm_status alloc_buffers(lm_sched *s) {
  int P = s->o.parallel, R = s->max_rows;
  int64_t T = s->max_step, V = s->m->cfg.vocab_size;
  s->slots = calloc((size_t)P, sizeof *s->slots);
  s->used = calloc((size_t)P, sizeof *s->used);
  s->b_ids = malloc((size_t)T * sizeof(int32_t));
  s->b_pos = malloc((size_t)T * sizeof(int32_t));
  s->b_seq = malloc((size_t)T * sizeof(int32_t));
  s->b_rows = malloc((size_t)R * sizeof(int32_t));
  s->row_slot = malloc((size_t)R * sizeof(int32_t));
  s->g_ids = malloc((size_t)R * sizeof(int32_t));
  s->b_kv = malloc((size_t)P * sizeof *s->b_kv);
  s->b_slot = malloc((size_t)P * sizeof *s->b_slot);
  s->logits = malloc((size_t)R * (size_t)V * sizeof(float));
  s->toks = calloc((size_t)R, sizeof *s->toks);
  s->row_err = calloc((size_t)R, sizeof *s->row_err);
  s->q = calloc((size_t)s->o.queue_cap, sizeof *s->q);
  s->b_lora = malloc((size_t)P * LM_LORA_PICKS * sizeof *s->b_lora);
  if (!s->b_lora) return LM_ERRF(LM_ERR_NOMEM, "engine: out of memory");
  if (!s->slots || !s->used || !s->row_err || !s->b_ids || !s->b_pos || !s->b_seq || !s->b_rows ||
      !s->row_slot || !s->g_ids || !s->b_kv || !s->b_slot || !s->logits || !s->toks || !s->q)
    return LM_ERRF(LM_ERR_NOMEM, "engine: out of memory (scheduler buffers for %d sequences)", P);
  return LM_OK;
}

/* The default adapters in slots 0..n_lora-1, mounts 1..n_lora. */
static lm_status mount_defaults(lm_sched *s) {
  if (s->o.n_lora > LM_LORA_PICKS)
    return LM_ERRF(LM_ERR_INVALID, "engine: %d default adapters (at most %d)", s->o.n_lora,
                   LM_LORA_PICKS);
  LM_TRY(lm_forward_set_adapters(s->fw, s->o.lora, s->o.n_lora));
  for (int i = 0; i < s->o.n_lora; i++)
    s->mounted[i] = s->o.lora[i], s->mount_id[i] = ++s->next_mount;
  return LM_OK;
}

lm_status lm_sched_create(lm_model *m, lm_backend *be, const lm_tokenizer *tok,
                          const lm_sched_opts *o, lm_sched **out) {
  *out = NULL;
  LM_TRY(check_opts(o));
  lm_sched *s = calloc(1, sizeof *s);
  if (!s) return LM_ERRF(LM_ERR_NOMEM, "engine: out of memory");
  s->m = m;
  s->be = be;
  s->o = *o;
  s->max_rows = o->parallel * (1 + o->spec_tokens);
  s->max_step = o->chunk + s->max_rows;
  int nc = m->cfg.n_caches;
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  pthread_cond_init(&s->cmd_cv, NULL);
  s->specs = malloc((size_t)(nc ? nc : 1) * sizeof *s->specs);
  lm_status st = s->specs ? LM_OK : LM_ERRF(LM_ERR_NOMEM, "engine: out of memory");
  if (!st) {
    memcpy(s->specs, o->specs, (size_t)nc * sizeof *s->specs);
    s->o.specs = s->specs;
    st = sorted_dup(o->stop_ids, o->n_stop_ids, &s->stop_ids);
  }
  if (!st) st = sorted_dup(o->keep_special, o->n_keep_special, &s->keep);
  if (!st) st = lm_admit_init(&s->admit, s->specs, nc, be->act_dtype, o->kv_budget, o->max_ctx);
  if (!st) st = alloc_buffers(s);
  if (!st && o->prompt_cache > 0)
    st = lm_prompt_cache_create(o->kv_budget, o->prompt_cache, &s->pc);
  if (!st) st = lm_forward_create(m, be, s->max_step, s->max_rows, &s->fw);
  if (!st) st = mount_defaults(s);
  /* the CPU backend's forward already keeps every core busy: its masks stay in the sampling */
  if (!st && strcmp(be->ops->name, "cpu") != 0) {
    s->prep_cons = calloc((size_t)o->parallel, sizeof *s->prep_cons);
    st = s->prep_cons ? lm_mask_prep_create(o->parallel, &s->prep)
                      : LM_ERRF(LM_ERR_NOMEM, "engine: out of memory");
  }
  if (st) {
    lm_sched_free(s);
    return st;
  }
  s->env = (lm_seq_env){.tok = tok,
                        .vocab = m->cfg.vocab_size,
                        .max_ctx = o->max_ctx,
                        .stop_ids = s->stop_ids,
                        .n_stop_ids = o->n_stop_ids,
                        .keep_special = s->keep,
                        .n_keep_special = o->n_keep_special};
  s->st.queue_cap = o->queue_cap;
  s->st.parallel = o->parallel;
  s->st.kv_budget = o->kv_budget;
  *out = s;
  return LM_OK;
}

static void release_slot(lm_sched *s, int i, int keep_cache);
static void publish(lm_sched *s);
static void fail_commands(lm_sched *s);

void lm_sched_stop(lm_sched *s) {
  if (!s) return;
  pthread_mutex_lock(&s->mu);
  int was = s->stop;
  s->stop = 1;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  if (was) return;
  if (s->started) pthread_join(s->th, NULL);
  s->started = 0;
  for (int i = 0; s->slots && i < s->o.parallel; i++)
    if (s->used[i]) {
      lm_seq_end(&s->slots[i], LM_FIN_CANCELLED, "the server is shutting down", now_s());
      release_slot(s, i, 0);
    }
  if (s->pc) lm_prompt_cache_clear(s->pc);
  pthread_mutex_lock(&s->mu);
  s->pc_held = 0;
  fail_commands(s);
  for (int k = 0; s->q && k < s->q_n; k++)
    job_fail(s->q[(s->q_head + k) % s->o.queue_cap], LM_FIN_CANCELLED,
             "the server is shutting down");
  s->q_n = 0;
  publish(s);
  pthread_mutex_unlock(&s->mu);
}

void lm_sched_free(lm_sched *s) {
  if (!s) return;
  lm_sched_stop(s);
  lm_mask_prep_free(s->prep);
  free(s->prep_cons);
  lm_forward_free(s->fw);
  for (int i = s->o.n_lora; i < LM_ADAPTER_MOUNT_MAX; i++) /* after the forward that read them */
    lm_lora_free(s->mounted[i]);
  free(s->b_lora);
  free(s->specs);
  free(s->stop_ids);
  free(s->keep);
  lm_prompt_cache_free(s->pc);
  free(s->slots);
  free(s->used);
  free(s->row_err);
  free(s->b_ids);
  free(s->b_pos);
  free(s->b_seq);
  free(s->b_rows);
  free(s->row_slot);
  free(s->g_ids);
  free(s->b_kv);
  free(s->b_slot);
  free(s->logits);
  free(s->toks);
  free(s->q);
  pthread_cond_destroy(&s->cv);
  pthread_cond_destroy(&s->cmd_cv);
  pthread_mutex_destroy(&s->mu);
  free(s);
}

const lm_admit *lm_sched_admit(const lm_sched *s) { return &s->admit; }

/* ---- admission ------------------------------------------------------------------------------- */

/* Tokens of context a job may reach: prompt + max_tokens, or the limit when max_tokens is 0. */
static int64_t job_need(const lm_sched *s, int64_t n_prompt, int64_t max_tokens) {
  return max_tokens > 0 ? n_prompt + max_tokens : s->admit.max_ctx;
}

lm_admission lm_sched_check(const lm_sched *s, int64_t n_prompt, int64_t max_tokens, char *msg,
                            size_t n) {
  char dummy[8];
  if (!msg) msg = dummy, n = sizeof dummy;
  if (max_tokens <= 0 && n_prompt >= s->admit.max_ctx) {
    snprintf(msg, n, "the prompt has %lld tokens; the context limit is %lld", (long long)n_prompt,
             (long long)s->admit.max_ctx);
    return LM_ADMIT_CONTEXT;
  }
  int64_t need = job_need(s, n_prompt, max_tokens);
  if (need > s->admit.max_ctx) {
    snprintf(msg, n,
             "this request needs %lld tokens of context (%lld in the prompt + %lld max_tokens); "
             "the limit is %lld",
             (long long)need, (long long)n_prompt, (long long)max_tokens,
             (long long)s->admit.max_ctx);
    return LM_ADMIT_CONTEXT;
  }
  int64_t bytes = lm_admit_bytes(&s->admit, need);
  if (bytes > s->admit.budget) {
    snprintf(msg, n,
             "this request needs %.1f MiB of KV cache for %lld tokens (prompt %lld + max_tokens "
             "%lld); the "
             "budget is %.1f MiB (at most %lld tokens per sequence)",
             (double)bytes / 1048576.0, (long long)need, (long long)n_prompt, (long long)max_tokens,
             (double)s->admit.budget / 1048576.0, (long long)lm_admit_max_context(&s->admit));
    return LM_ADMIT_MEMORY;
  }
  return LM_ADMIT_OK;
}

lm_status lm_sched_submit(lm_sched *s, lm_job *j) {
  char msg[256];
  if (j->n_ids < 1 || !j->ids || j->max_tokens < 0)
    return LM_ERRF(LM_ERR_INVALID, "engine: empty prompt or max_tokens < 0");
  for (int64_t i = 0; i < j->n_ids; i++)
    if (j->ids[i] < 0 || j->ids[i] >= s->m->cfg.vocab_size)
      return LM_ERRF(LM_ERR_INVALID, "prompt token %lld: id %d is outside the vocabulary (%lld)",
                     (long long)i, j->ids[i], (long long)s->m->cfg.vocab_size);
  if (lm_sched_check(s, j->n_ids, j->max_tokens, msg, sizeof msg))
    return LM_ERRF(LM_ERR_INVALID, "%s", msg);
  if (j->top_logprobs > LM_TOP_LOGPROBS_MAX)
    return LM_ERRF(LM_ERR_INVALID, "top_logprobs must be <= %d", LM_TOP_LOGPROBS_MAX);
  if (j->n_lora < 0 || j->n_lora > LM_LORA_PICKS)
    return LM_ERRF(LM_ERR_INVALID, "engine: %d adapters stacked (at most %d)", j->n_lora,
                   LM_LORA_PICKS);
  if (!j->n_lora && !j->lora_base)
    for (int i = 0; i < s->o.n_lora; i++)
      j->lora[i] = (lm_lora_pick){.slot = i, .weight = 1.0f}, j->lora_id[i] = (uint64_t)i + 1;
  if (!j->n_lora && !j->lora_base) j->n_lora = s->o.n_lora;
  pthread_mutex_lock(&s->mu);
  lm_status st = LM_OK;
  for (int i = 0; i < j->n_lora && !st; i++) {
    int k = j->lora[i].slot;
    if (k < 0 || k >= LM_ADAPTER_MOUNT_MAX || !j->lora_id[i] || s->mount_id[k] != j->lora_id[i] ||
        s->closing[k])
      st = LM_ERRF(LM_ERR_NOT_FOUND, "adapter %d of the request was unloaded", i);
  }
  if (st)
    ;
  else if (s->stop)
    st = LM_ERRF(LM_ERR_CANCELLED, "the server is shutting down");
  else if (s->q_n == s->o.queue_cap)
    st = LM_ERRF(LM_ERR_STATE, "the request queue is full (%d waiting)", s->q_n);
  else {
    s->q[(s->q_head + s->q_n++) % s->o.queue_cap] = j;
    s->st.queued = s->q_n;
    pthread_cond_signal(&s->cv);
  }
  pthread_mutex_unlock(&s->mu);
  return st;
}

/* ---- the prefix cache (engine thread) ------------------------------------------------------ */

/* The prefix cache's namespace of a job's caches: its adapter mounts and weights (mount ids
 * are never reused, so an adapter loaded again under the same name is another namespace), or
 * NULL (the base model's). */
static const char *job_ns(const lm_job *j, char *buf, size_t n) {
  if (!j->n_lora) return NULL;
  size_t at = (size_t)snprintf(buf, n, "lora");
  for (int i = 0; i < j->n_lora && at < n; i++)
    at += (size_t)snprintf(buf + at, n - at, "+%llu@%a", (unsigned long long)j->lora_id[i],
                           (double)j->lora[i].weight);
  return buf;
}

#define LM_NS_BYTES (LM_LORA_PICKS * 48 + 8)

/* Mirrors the prefix cache's bytes under mu (admission reads them with the reservations). */
static void pc_sync(lm_sched *s) {
  int64_t held = s->pc ? lm_prompt_cache_get_stats(s->pc).bytes_held : 0;
  pthread_mutex_lock(&s->mu);
  s->pc_held = held;
  pthread_mutex_unlock(&s->mu);
}

/* Keeps a finished sequence's caches (they hold hist[0..kv_len)) in the prefix cache. */
static void pc_put(lm_sched *s, lm_seq *q) {
  int64_t n = lm_seq_kv_len(q);
  lm_kv_set *kv = q->kv;
  char ns[LM_NS_BYTES];
  q->kv = NULL;
  if (n < 1 || lm_prompt_cache_adopt(s->pc, job_ns(q->job, ns, sizeof ns), q->hist, n, kv))
    lm_err_clear();
  pc_sync(s);
}

static int make_room(lm_sched *s, int64_t need);

/* A copy of a sharing job's caches, which hold all of its prompt but the last token (lm_job's
 * share_prompt), goes into the prefix cache if memory allows; it is only an optimization, so a
 * failure is not an error. */
static void pc_share(lm_sched *s, lm_seq *q) {
  int64_t n = lm_seq_kv_len(q);
  if (!make_room(s, lm_kv_set_bytes(q->kv) + n * (int64_t)sizeof(int32_t))) return;
  char ns[LM_NS_BYTES];
  if (lm_prompt_cache_insert(s->pc, job_ns(q->job, ns, sizeof ns), q->hist, n, q->kv))
    lm_err_clear();
  pc_sync(s);
}

/* After a step: the sharing jobs of the batch whose caches now stop one token short of the
 * prompt's end (build_batch held that token back for the next step). */
static void share_prompts(lm_sched *s, const lm_batch *b) {
  if (!s->pc) return;
  for (int32_t k = 0; k < b->n_seqs; k++) {
    lm_seq *q = &s->slots[s->b_slot[k]];
    if (q->job->share_prompt && lm_seq_prefilling(q) && q->job->n_ids > 1 &&
        lm_seq_kv_len(q) == q->job->n_ids - 1)
      pc_share(s, q);
  }
}

/* ---- slots ----------------------------------------------------------------------------------- */

static void count_end(lm_sched *s, lm_finish_kind k) {
  if (k == LM_FIN_CANCELLED)
    s->st.requests_cancelled++;
  else if (k == LM_FIN_TIMEOUT)
    s->st.requests_timeout++;
  else if (k == LM_FIN_ERROR)
    s->st.requests_failed++;
  else
    s->st.requests_done++;
}

/* Ends slot i: keeps or frees the caches, gives the memory back, counts the end, and only then
 * finishes the job's channel, so a consumer that sees the end also sees all of that. */
static void release_slot(lm_sched *s, int i, int keep_cache) {
  lm_seq *q = &s->slots[i];
  /* the caches hold hist[0..kv_len) whenever the sequence ended between steps, a cancelled one too
   * (Ctrl-C, then --save-state; a client that went away and comes back with the same prefix) */
  int ok = q->fin.kind == LM_FIN_STOP || q->fin.kind == LM_FIN_STOP_STR ||
           q->fin.kind == LM_FIN_LENGTH || q->fin.kind == LM_FIN_CANCELLED;
  if (keep_cache && ok && s->pc && q->kv && lm_seq_kv_len(q) > 0) pc_put(s, q);
  lm_kv_set_free(q->kv);
  q->kv = NULL;
  lm_kv_set_free(q->dkv);
  q->dkv = NULL;
  pthread_mutex_lock(&s->mu);
  s->reserved -= q->reserved;
  count_end(s, q->fin.kind);
  pthread_mutex_unlock(&s->mu);
  lm_chan_finish(q->job->ch, &q->fin);
  lm_job_free(q->job);
  lm_seq_clear(q);
  s->used[i] = 0;
}

/* Caches for job: a new set, holding the longest cached prefix of its prompt (one token at least
 * is left to feed: its logits start the response). */
static lm_status job_caches(lm_sched *s, lm_job *j, lm_kv_set **kv, int64_t *cached) {
  *cached = 0;
  LM_TRY(lm_kv_set_create(s->be, s->specs, s->m->cfg.n_caches, kv));
  if (!s->pc) return LM_OK;
  char ns[LM_NS_BYTES];
  lm_status st = lm_prompt_cache_lookup(s->pc, job_ns(j, ns, sizeof ns), j->ids, j->n_ids,
                                        j->n_ids - 1, *kv, cached);
  if (st) {
    lm_kv_set_free(*kv);
    *kv = NULL;
  }
  return st;
}

/* Evicts prefix-cache entries, least recently used first, until `need` more bytes fit the
 * budget. Returns 0 when they cannot (the job waits for running sequences to end). */
static int make_room(lm_sched *s, int64_t need) {
  for (;;) {
    pthread_mutex_lock(&s->mu);
    int64_t active = s->reserved;
    pthread_mutex_unlock(&s->mu);
    int64_t held = s->pc ? lm_prompt_cache_get_stats(s->pc).bytes_held : 0;
    if (need <= s->admit.budget - active - held) return 1; /* (a budget may be INT64_MAX) */
    int64_t room = s->admit.budget - active - need;
    if (!s->pc || !lm_prompt_cache_shrink(s->pc, room > 0 ? room : 0)) return 0;
    pc_sync(s);
  }
}

/* Moves the queue head into slot i if its memory fits (evicting prefix-cache entries). Returns 1
 * when it was admitted (or ended), 0 when it must wait. Called with mu held; drops it around
 * cache work. */
static int admit_head(lm_sched *s, int i) {
  lm_job *j = s->q[s->q_head];
  int64_t need = lm_admit_bytes(&s->admit, job_need(s, j->n_ids, j->max_tokens));
  pthread_mutex_unlock(&s->mu);
  int fits = make_room(s, need);
  pthread_mutex_lock(&s->mu);
  if (!fits) return 0;
  s->q_head = (s->q_head + 1) % s->o.queue_cap;
  s->q_n--;
  s->reserved += need;
  pthread_mutex_unlock(&s->mu);
  lm_kv_set *kv = NULL;
  int64_t cached = 0;
  lm_status st = job_caches(s, j, &kv, &cached);
  if (!st) st = lm_seq_init(&s->slots[i], &s->env, j, kv, cached);
  pc_sync(s);
  pthread_mutex_lock(&s->mu);
  if (st) {
    s->reserved -= need;
    s->st.requests_failed++;
    pthread_mutex_unlock(&s->mu);
    job_fail(j, LM_FIN_ERROR, lm_errmsg());
    pthread_mutex_lock(&s->mu);
    return 1;
  }
  s->slots[i].reserved = need;
  s->slots[i].t_admit = now_s();
  s->used[i] = 1;
  return 1;
}

/* Drops queued jobs whose client went away or whose deadline passed. mu held. */
static void expire_queue(lm_sched *s, double now) {
  int kept = 0, cap = s->o.queue_cap;
  for (int k = 0; k < s->q_n; k++) {
    lm_job *j = s->q[(s->q_head + k) % cap];
    int gone = lm_chan_cancelled(j->ch), late = j->deadline > 0 && now > j->deadline;
    if (gone || late) {
      count_end(s, gone ? LM_FIN_CANCELLED : LM_FIN_TIMEOUT);
      job_fail(j, gone ? LM_FIN_CANCELLED : LM_FIN_TIMEOUT,
               gone ? "the client went away" : "the request timed out in the queue");
    } else {
      s->q[(s->q_head + kept++) % cap] = j;
    }
  }
  s->q_n = kept;
}

static void admit_all(lm_sched *s) {
  expire_queue(s, now_s());
  for (int i = 0; i < s->o.parallel && s->q_n > 0; i++)
    if (!s->used[i] && !admit_head(s, i)) break;
  s->st.queued = s->q_n;
}

/* ---- one step -------------------------------------------------------------------------------- */

/* Cancelled or late sequences end before the step. */
static void reap(lm_sched *s, double now) {
  for (int i = 0; i < s->o.parallel; i++) {
    if (!s->used[i]) continue;
    lm_seq *q = &s->slots[i];
    if (lm_chan_cancelled(q->job->ch))
      lm_seq_end(q, LM_FIN_CANCELLED, "the client went away", now);
    else if (q->job->deadline > 0 && now > q->job->deadline)
      lm_seq_end(q, LM_FIN_TIMEOUT, "the request timed out", now);
    if (q->fin.kind) release_slot(s, i, 1);
  }
}

/* Adds hist[kv_len .. kv_len + n) of slot i to the batch; a logits row when `row`. */
static void batch_add(lm_sched *s, lm_batch *b, int i, int64_t n, int row) {
  lm_seq *q = &s->slots[i];
  int64_t at = lm_seq_kv_len(q);
  int32_t si = b->n_seqs++;
  s->b_kv[si] = q->kv;
  s->b_slot[si] = i;
  lm_lora_pick *pk = &s->b_lora[(size_t)si * LM_LORA_PICKS];
  for (int k = 0; k < LM_LORA_PICKS; k++)
    pk[k] = k < q->job->n_lora ? q->job->lora[k] : (lm_lora_pick){.slot = -1};
  for (int64_t k = 0; k < n; k++) {
    s->b_ids[b->n_tokens] = q->hist[at + k];
    s->b_pos[b->n_tokens] = (int32_t)(at + k);
    s->b_seq[b->n_tokens] = si;
    b->n_tokens++;
  }
  if (row) {
    s->row_slot[b->n_logits] = i;
    s->b_rows[b->n_logits++] = b->n_tokens - 1;
  }
}

/* Adds slot i's pending token and its drafts, each with a logits row. */
static void batch_add_drafts(lm_sched *s, lm_batch *b, int i) {
  lm_seq *q = &s->slots[i];
  batch_add(s, b, i, 1, 1);
  for (int k = 0; k < q->n_draft; k++) {
    s->b_ids[b->n_tokens] = q->draft[k];
    s->b_pos[b->n_tokens] = (int32_t)(lm_seq_kv_len(q) + 1 + k);
    s->b_seq[b->n_tokens] = b->n_seqs - 1;
    s->row_slot[b->n_logits] = i;
    s->b_rows[b->n_logits++] = b->n_tokens++;
  }
}

/* The most drafts slot i may verify this step: its job's, within what the answer and the
 * context have left, and before a cache's pending quantization (a plain decode converts it at
 * exactly that length, which a step of several tokens would jump past). */
static int draft_limit(const lm_sched *s, const lm_seq *q) {
  int64_t g = q->job->spec_tokens, at = lm_seq_kv_len(q);
  if (q->job->max_tokens > 0 && q->job->max_tokens - q->n_gen - 1 < g)
    g = q->job->max_tokens - q->n_gen - 1;
  if (s->env.max_ctx - q->n_hist - 1 < g) g = s->env.max_ctx - q->n_hist - 1;
  for (int c = 0; c < q->kv->n; c++) {
    const lm_kv_cache *kc = q->kv->caches[c];
    if (kc->has_pending && kc->pending.quant_start > at && kc->pending.quant_start - at - 1 < g)
      g = kc->pending.quant_start - at - 1;
  }
  return g > 0 ? (int)g : 0;
}

/* Drafts for the decoding sequences that speculate, while the step stays within the tokens the
 * backend computes row-exactly, and none while a prompt waits to be prefilled (its chunk would
 * take the step past that). */
static void propose_drafts(lm_sched *s) {
  int64_t decoding = 0, prefill = 0;
  for (int i = 0; i < s->o.parallel; i++)
    if (s->used[i]) {
      s->slots[i].n_draft = 0;
      if (lm_seq_prefilling(&s->slots[i]))
        prefill++;
      else
        decoding++;
    }
  int64_t room = prefill ? 0 : s->be->exact_rows - decoding;
  for (int i = 0; i < s->o.parallel && room > 0; i++) {
    lm_seq *q = &s->slots[i];
    if (!s->used[i] || lm_seq_prefilling(q) || !q->job->spec_tokens) continue;
    int g = draft_limit(s, q);
    if (g > room) g = (int)room;
    if (!q->job->spec_draft)
      q->n_draft = lm_spec_ngram_propose(q->hist, q->n_hist, g, q->draft);
    else if (lm_spec_draft_propose(s->o.draft, &q->dkv, q->hist, q->n_hist, g, q->draft,
                                   &q->n_draft)) {
      q->n_draft = 0; /* a draft model that failed (memory): this step decodes plainly, and the */
      lm_kv_set_free(q->dkv); /* next one reads the context again */
      q->dkv = NULL;
      lm_err_clear();
    }
    room -= q->n_draft;
  }
}

/* Decode tokens first (one per decoding sequence, with its drafts), then prompt chunks, oldest
 * admission first. */
static void build_batch(lm_sched *s, lm_batch *b) {
  *b = (lm_batch){.ids = s->b_ids,
                  .pos = s->b_pos,
                  .seq = s->b_seq,
                  .kv = s->b_kv,
                  .logit_rows = s->b_rows,
                  .lora = s->b_lora};
  propose_drafts(s);
  for (int i = 0; i < s->o.parallel; i++)
    if (s->used[i] && !lm_seq_prefilling(&s->slots[i])) batch_add_drafts(s, b, i);
  int64_t budget = s->o.chunk;
  for (;;) {
    int pick = -1;
    for (int i = 0; i < s->o.parallel; i++) {
      const lm_seq *q = &s->slots[i];
      int in_batch = 0;
      for (int32_t k = 0; k < b->n_seqs; k++)
        in_batch |= s->b_slot[k] == i;
      if (s->used[i] && lm_seq_prefilling(q) && !in_batch &&
          (pick < 0 || q->t_admit < s->slots[pick].t_admit))
        pick = i;
    }
    if (pick < 0 || budget <= 0) break;
    lm_seq *q = &s->slots[pick];
    int64_t left = q->n_hist - lm_seq_kv_len(q), n = left < budget ? left : budget;
    /* a sharing prompt's last token waits for the next step: the caches are copied without it */
    if (q->job->share_prompt && s->pc && n == left && left > 1) n = left - 1;
    batch_add(s, b, pick, n, n == left);
    budget -= n;
  }
}

/* Samples every logits row (rows in parallel: samplers are independent). */
static void sample_rows(lm_sched *s, const lm_batch *b, int greedy, int32_t *ids) {
  int64_t V = s->m->cfg.vocab_size;
  int n = b->n_logits;
#pragma omp parallel for schedule(dynamic) if (n > 1 && !greedy)
  for (int r = 0; r < n; r++) {
    if (s->slots[s->row_slot[r]].n_draft) continue; /* verified in order (verify_drafts) */
    lm_tok_event *t = &s->toks[r];
    memset(t, 0, sizeof *t);
    ids[r] = greedy
                 ? s->g_ids[r]
                 : lm_seq_sample(&s->slots[s->row_slot[r]], &s->env, s->logits + (int64_t)r * V, t);
    /* the message is per thread: keep it from the thread that sampled the row */
    if (ids[r] < 0) snprintf(s->row_err[r], LM_ROW_ERR, "%s", lm_errmsg());
  }
}

static void fail_batch(lm_sched *s, const lm_batch *b, const char *msg) {
  for (int32_t k = 0; k < b->n_seqs; k++) {
    int i = s->b_slot[k];
    lm_seq_end(&s->slots[i], LM_FIN_ERROR, msg, now_s());
    release_slot(s, i, 0);
  }
}

/* What a step's rows produced, for the counters. */
typedef struct step_tally {
  double con_s; /* the constraints' time (masks while sampling, advancing here) */
  int64_t constrained, emitted;
  int64_t spec_steps, spec_rounds, spec_drafted, spec_accepted, spec_emitted;
} step_tally;

/* Rolls slot i's caches back to the tokens its context keeps after a round: `agreed` drafts
 * past the pending token, never more than the context holds. */
static lm_status keep_agreed(lm_seq *q, int64_t kv_before, int agreed) {
  int64_t keep = kv_before + 1 + agreed, limit = q->n_hist - (q->fin.kind ? 0 : 1);
  if (keep > limit) keep = limit;
  return lm_kv_set_trim(q->kv, lm_seq_kv_len(q) - keep);
}

/* Slot i's round: its rows r0 .. r0 + n_draft, sampled in order, each as a plain step would
 * sample that token (the drafts before it already in the context), until a sampled token differs
 * from the draft, the drafts run out, or the sequence ends. Returns the rows it took. */
static int32_t verify_drafts(lm_sched *s, int i, int32_t r0, int greedy, double now,
                             step_tally *tl) {
  lm_seq *q = &s->slots[i];
  int g = q->n_draft, agreed = 0;
  int64_t V = s->m->cfg.vocab_size, kv_before = lm_seq_kv_len(q) - 1 - g;
  q->steps++; /* the counters first: the last accept may end the sequence and fill its usage */
  q->drafted += g;
  for (int j = 0; j <= g; j++) {
    lm_tok_event *t = &s->toks[r0 + j];
    memset(t, 0, sizeof *t);
    if (j == 0) {
      t->round_start = 1;
      t->n_drafted = g;
      memcpy(t->drafted, q->draft, (size_t)g * sizeof *q->draft);
    }
    tl->constrained += q->job->con != NULL;
    int32_t id = greedy ? s->g_ids[r0 + j] : lm_seq_sample(q, &s->env, s->logits + (r0 + j) * V, t);
    int hit = id >= 0 && j < g && id == q->draft[j];
    agreed += hit;
    q->accepted += hit;
    if (id < 0 || lm_seq_accept(q, &s->env, id, t, now)) {
      lm_seq_end(q, LM_FIN_ERROR, lm_errmsg(), now);
      break;
    }
    tl->emitted++;
    tl->spec_emitted++;
    if (q->fin.kind || !hit) break;
  }
  tl->spec_steps++;
  tl->spec_rounds++;
  tl->spec_drafted += g;
  tl->spec_accepted += agreed;
  q->n_draft = 0;
  if (keep_agreed(q, kv_before, agreed)) lm_seq_end(q, LM_FIN_ERROR, lm_errmsg(), now);
  /* the draft model read the pending token and every draft but the last */
  if (q->dkv && lm_spec_draft_keep(q->dkv, kv_before + 1 + (agreed < g - 1 ? agreed : g - 1)))
    lm_seq_end(q, LM_FIN_ERROR, lm_errmsg(), now);
  return (int32_t)g + 1;
}

static void accept_rows(lm_sched *s, const lm_batch *b, const int32_t *ids, int greedy, double now,
                        step_tally *tl) {
  for (int32_t r = 0; r < b->n_logits; r++) {
    int i = s->row_slot[r];
    lm_seq *q = &s->slots[i];
    if (q->n_draft) {
      r += verify_drafts(s, i, r, greedy, now, tl) - 1;
    } else {
      tl->constrained += q->job->con != NULL;
      if (lm_seq_prefilling(q)) {
        q->t_prefilled = now;
      } else {
        q->steps++;
        if (q->job->spec_tokens) { /* a step that found nothing to draft */
          s->toks[r].round_start = 1;
          tl->spec_steps++;
          tl->spec_emitted += ids[r] >= 0;
        }
      }
      if (ids[r] < 0)
        lm_seq_end(q, LM_FIN_ERROR, s->row_err[r], now);
      else if (lm_seq_accept(q, &s->env, ids[r], &s->toks[r], now))
        lm_seq_end(q, LM_FIN_ERROR, lm_errmsg(), now);
      tl->emitted += ids[r] >= 0;
    }
    tl->con_s += q->con_s;
    q->con_s = 0;
    if (q->fin.kind) release_slot(s, i, 1);
  }
}

static int all_plain_greedy(lm_sched *s, const lm_batch *b) {
  for (int32_t r = 0; r < b->n_logits; r++)
    if (!lm_seq_plain_greedy(&s->slots[s->row_slot[r]])) return 0;
  return 1;
}

/* Hands the constraints of the step's logits rows to the mask helper, which fills their masks
 * while the forward runs; returns how many. */
static int start_masks(lm_sched *s, const lm_batch *b) {
  if (!s->prep) return 0;
  int n = 0;
  for (int32_t r = 0; r < b->n_logits; r++) {
    const lm_seq *q = &s->slots[s->row_slot[r]];
    lm_constraint *c = q->job->con;
    /* a round's rows need masks of states its earlier rows lead to: made while verifying */
    if (c && !q->n_draft) s->prep_cons[n++] = c;
  }
  if (n) lm_mask_prep_start(s->prep, s->prep_cons, n);
  return n;
}

static void step(lm_sched *s) {
  double t0 = now_s();
  reap(s, t0);
  lm_batch b;
  build_batch(s, &b);
  if (!b.n_tokens) return;
  int greedy = b.n_logits > 0 && all_plain_greedy(s, &b);
  int nprep = start_masks(s, &b);
  lm_status st = greedy ? lm_forward_run_greedy(s->fw, &b, NULL, s->g_ids)
                        : lm_forward_run(s->fw, &b, s->logits);
  double prep_s = 0, wait_s = 0;
  if (nprep) { /* the constraints are the helper's until it is done */
    double w0 = now_s();
    lm_mask_prep_wait(s->prep, &prep_s);
    wait_s = now_s() - w0;
  }
  if (st) {
    fail_batch(s, &b, lm_errmsg());
    return;
  }
  share_prompts(s, &b);
  int32_t ids[b.n_logits ? b.n_logits : 1];
  sample_rows(s, &b, greedy, ids);
  int64_t decode = 0; /* the step's tokens of decoding sequences (pending tokens and drafts) */
  for (int32_t k = 0; k < b.n_seqs; k++) {
    const lm_seq *q = &s->slots[s->b_slot[k]];
    decode += lm_seq_prefilling(q) ? 0 : 1 + q->n_draft;
  }
  step_tally tl = {0};
  accept_rows(s, &b, ids, greedy, now_s(), &tl);
  pthread_mutex_lock(&s->mu);
  s->st.constraint_s += tl.con_s + prep_s;
  s->st.constraint_wait_s += wait_s;
  s->st.constrained_tokens += tl.constrained;
  s->st.steps++;
  s->st.step_tokens += b.n_tokens;
  s->st.step_rows += b.n_logits;
  s->st.decode_tokens += tl.emitted;
  s->st.prefill_tokens += b.n_tokens - decode;
  s->st.spec_steps += tl.spec_steps;
  s->st.spec_rounds += tl.spec_rounds;
  s->st.spec_drafted += tl.spec_drafted;
  s->st.spec_accepted += tl.spec_accepted;
  s->st.spec_emitted += tl.spec_emitted;
  s->st.busy_s += now_s() - t0;
  pthread_mutex_unlock(&s->mu);
}

/* Publishes the slot and cache counters (mu held; engine thread, or after it stopped). */
static void publish(lm_sched *s) {
  int a = 0, p = 0;
  int64_t held = 0;
  for (int i = 0; i < s->o.parallel; i++)
    if (s->used[i]) {
      a++;
      p += lm_seq_prefilling(&s->slots[i]);
      held += lm_kv_set_bytes(s->slots[i].kv);
    }
  if (s->pc) {
    lm_prompt_cache_stats ps = lm_prompt_cache_get_stats(s->pc);
    held += ps.bytes_held;
    s->st.prefix_entries = (int)ps.entries;
    s->st.prefix_bytes = ps.bytes_held;
    s->st.prefix_lookups = ps.lookups;
    s->st.prefix_hits = ps.hits;
    s->st.prefix_misses = ps.misses;
    s->st.prefix_tokens_reused = ps.tokens_reused;
    s->st.prefix_evictions = ps.evictions;
  }
  s->st.active = a;
  s->st.prefilling = p;
  s->st.decoding = a - p;
  s->st.kv_held = held;
  s->st.kv_reserved = s->reserved + s->pc_held;
  s->st.queued = s->q_n;
}

static int any_active(const lm_sched *s) {
  for (int i = 0; i < s->o.parallel; i++)
    if (s->used[i]) return 1;
  return 0;
}

/* ---- commands ----------------------------------------------------------------------------------
 */

/* Runs the commands pending now (mu held; dropped around each); one that asks to run again
 * goes back to the end of the list, for after the next step. */
static void run_commands(lm_sched *s) {
  sched_cmd *list = s->cmds;
  s->cmds = NULL;
  while (list) {
    sched_cmd *c = list;
    list = c->next;
    pthread_mutex_unlock(&s->mu);
    lm_err_clear();
    c->again = 0;
    c->st = c->run(s, c);
    if (c->st) snprintf(c->msg, sizeof c->msg, "%s", lm_errmsg());
    pc_sync(s);
    pthread_mutex_lock(&s->mu);
    if (!c->st && c->again) {
      sched_cmd **tail = &s->cmds;
      while (*tail)
        tail = &(*tail)->next;
      c->next = NULL, *tail = c;
      continue;
    }
    c->done = 1;
    pthread_cond_broadcast(&s->cmd_cv);
  }
}

/* Ends the pending commands unrun (mu held): the engine is stopping. */
static void fail_commands(lm_sched *s) {
  for (sched_cmd *c; (c = s->cmds);) {
    s->cmds = c->next;
    c->st = LM_ERR_CANCELLED;
    snprintf(c->msg, sizeof c->msg, "the engine is stopping");
    c->done = 1;
  }
  pthread_cond_broadcast(&s->cmd_cv);
}

/* Runs c on the engine thread (inline while no thread runs) and returns its status, its message
 * set on the caller's thread. */
static lm_status command(lm_sched *s, sched_cmd *c) {
  pthread_mutex_lock(&s->mu);
  if (s->stop) {
    pthread_mutex_unlock(&s->mu);
    return LM_ERRF(LM_ERR_CANCELLED, "the engine is stopping");
  }
  if (!s->started) {
    pthread_mutex_unlock(&s->mu);
    do {
      c->again = 0;
      c->st = c->run(s, c);
    } while (!c->st && c->again);
    pc_sync(s);
    return c->st;
  }
  sched_cmd **tail = &s->cmds;
  while (*tail)
    tail = &(*tail)->next;
  *tail = c;
  pthread_cond_signal(&s->cv);
  while (!c->done)
    pthread_cond_wait(&s->cmd_cv, &s->mu);
  pthread_mutex_unlock(&s->mu);
  return c->st ? lm_err_set(c->st, "%s", c->msg) : LM_OK;
}

static lm_status do_save(lm_sched *s, sched_cmd *c) {
  int64_t len = 0;
  const lm_kv_set *kv = s->pc ? lm_prompt_cache_find(s->pc, NULL, c->ids, c->n, &len) : NULL;
  if (!kv)
    return LM_ERRF(LM_ERR_NOT_FOUND, "%s: the engine holds no cached state of this context",
                   c->path);
  uint8_t fp[LM_FINGERPRINT_BYTES];
  LM_TRY(lm_model_fingerprint(s->m, fp));
  LM_TRY(lm_kv_state_save(c->path, fp, kv, c->ids, len));
  c->got_n = len;
  return LM_OK;
}

static lm_status do_load(lm_sched *s, sched_cmd *c) {
  if (!s->pc)
    return LM_ERRF(LM_ERR_STATE, "%s: loading a state needs the prefix cache (it is off)", c->path);
  lm_kv_set *kv = NULL;
  int32_t *ids = NULL;
  int64_t n = 0;
  LM_TRY(lm_kv_state_load(c->path, s->m, s->specs, s->be, &kv, &ids, &n));
  lm_status st = n >= s->admit.max_ctx
                     ? LM_ERRF(LM_ERR_INVALID, "%s: %lld tokens do not fit the context limit %lld",
                               c->path, (long long)n, (long long)s->admit.max_ctx)
                     : LM_OK;
  if (!st && n > 0) {
    st = lm_prompt_cache_adopt(s->pc, NULL, ids, n, kv);
    kv = NULL;
  }
  lm_kv_set_free(kv);
  if (st) {
    free(ids);
    return st;
  }
  c->got_ids = ids;
  c->got_n = n;
  return LM_OK;
}

static lm_status do_logits(lm_sched *s, sched_cmd *c) {
  int64_t C = c->chunk > 0 ? c->chunk : s->o.chunk, P = c->prefill;
  if (P <= 0 || P > c->n) P = c->n;
  lm_kv_set *kv = NULL;
  lm_forward *f = NULL;
  int64_t V = s->m->cfg.vocab_size;
  lm_status st = lm_kv_set_create(s->be, s->specs, s->m->cfg.n_caches, &kv);
  if (!st) st = lm_forward_create(s->m, s->be, C, C, &f);
  if (!st) st = lm_forward_set_adapters(f, s->o.lora, s->o.n_lora);
  if (!st) st = lm_forward_feed(f, kv, c->ids, P, C, c->out);
  if (!st && c->n > P) st = lm_forward_feed(f, kv, c->ids + P, c->n - P, 1, c->out + P * V);
  lm_forward_free(f);
  lm_kv_set_free(kv);
  return st;
}

/* A state file records the model's fingerprint, not the adapters the caches were made with:
 * saving or loading one under adapters could hand a session another model's caches. */
static lm_status no_state_with_adapters(const char *what) {
  return LM_ERRF(LM_ERR_UNSUPPORTED,
                 "%s state: KV state files are not keyed by LoRA adapters; run without --adapter "
                 "to use them",
                 what);
}

lm_status lm_sched_save_state(lm_sched *s, const int32_t *ids, int64_t n, const char *path,
                              int64_t *saved) {
  if (saved) *saved = 0;
  if (!path || n < 1 || !ids) return LM_ERRF(LM_ERR_INVALID, "save state: no path or no tokens");
  if (s->o.n_lora) return no_state_with_adapters("save");
  sched_cmd c = {.run = do_save, .ids = ids, .n = n, .path = path};
  LM_TRY(command(s, &c));
  if (saved) *saved = c.got_n;
  return LM_OK;
}

lm_status lm_sched_load_state(lm_sched *s, const char *path, int32_t **ids, int64_t *n) {
  if (ids) *ids = NULL;
  if (n) *n = 0;
  if (!path) return LM_ERRF(LM_ERR_INVALID, "load state: no path");
  if (s->o.n_lora) return no_state_with_adapters("load");
  sched_cmd c = {.run = do_load, .path = path};
  LM_TRY(command(s, &c));
  if (ids)
    *ids = c.got_ids;
  else
    free(c.got_ids);
  if (n) *n = c.got_n;
  return LM_OK;
}

lm_status lm_sched_logits(lm_sched *s, const int32_t *ids, int64_t n, int64_t prefill,
                          int64_t chunk, float *out) {
  if (n < 1 || !ids || !out || chunk < 0) return LM_ERRF(LM_ERR_INVALID, "logits: bad arguments");
  if (n > s->admit.max_ctx)
    return LM_ERRF(LM_ERR_INVALID, "logits: %lld tokens exceed the context limit %lld",
                   (long long)n, (long long)s->admit.max_ctx);
  for (int64_t i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] >= s->m->cfg.vocab_size)
      return LM_ERRF(LM_ERR_INVALID, "token %lld: id %d is outside the vocabulary (%lld)",
                     (long long)i, ids[i], (long long)s->m->cfg.vocab_size);
  sched_cmd c = {
      .run = do_logits, .ids = ids, .n = n, .prefill = prefill, .chunk = chunk, .out = out};
  return command(s, &c);
}

/* ---- adapter mounts ------------------------------------------------------------------------- */

/* Counts the jobs queued or running per mount (mu held) and unmounts the closing ones no job
 * picks any more: the forward first, then the adapter's memory. */
static void reap_mounts(lm_sched *s) {
  int64_t users[LM_ADAPTER_MOUNT_MAX] = {0};
  for (int i = 0; i < s->o.parallel; i++)
    for (int k = 0; s->used[i] && k < s->slots[i].job->n_lora; k++)
      users[s->slots[i].job->lora[k].slot]++;
  for (int q = 0; q < s->q_n; q++) {
    const lm_job *j = s->q[(s->q_head + q) % s->o.queue_cap];
    for (int k = 0; k < j->n_lora; k++)
      users[j->lora[k].slot]++;
  }
  memcpy(s->users, users, sizeof users);
  for (int k = s->o.n_lora; k < LM_ADAPTER_MOUNT_MAX; k++) {
    if (!s->closing[k] || users[k]) continue;
    struct lm_lora *l = s->mounted[k];
    pthread_mutex_unlock(&s->mu);
    lm_status st = lm_forward_mount_adapter(s->fw, k, NULL);
    if (!st) lm_lora_free(l);
    lm_err_clear();
    pthread_mutex_lock(&s->mu);
    if (st) continue; /* (the tables' upload failed: tried again after the next step) */
    s->mounted[k] = NULL, s->mount_id[k] = 0, s->closing[k] = 0;
  }
}

typedef struct mount_cmd {
  sched_cmd c;
  struct lm_lora *l;
  int slot;
  uint64_t id;
  double secs;
} mount_cmd;

/* The most bytes of an adapter copied to the backend between two steps: a few ms of the copy
 * engine, so a large adapter costs the running streams a little on several steps rather than
 * a long pause on one. */
#define LM_MOUNT_CHUNK (8u << 20)

static lm_status do_mount(lm_sched *s, sched_cmd *c) {
  mount_cmd *m = (mount_cmd *)c;
  double t0 = now_s();
  int done = 0;
  lm_status st = lm_lora_upload(m->l, s->be, LM_MOUNT_CHUNK, &done);
  m->secs += now_s() - t0;
  if (st || !done) return c->again = !st, st;
  t0 = now_s();
  pthread_mutex_lock(&s->mu);
  int k = s->o.n_lora;
  while (k < LM_ADAPTER_MOUNT_MAX && (s->mounted[k] || s->closing[k]))
    k++;
  pthread_mutex_unlock(&s->mu);
  if (k == LM_ADAPTER_MOUNT_MAX)
    return LM_ERRF(LM_ERR_STATE, "%d adapters are mounted already (the most an engine holds)",
                   LM_ADAPTER_MOUNT_MAX - s->o.n_lora);
  LM_TRY(lm_forward_mount_adapter(s->fw, k, m->l));
  pthread_mutex_lock(&s->mu);
  s->mounted[k] = m->l, s->mount_id[k] = ++s->next_mount;
  m->slot = k, m->id = s->mount_id[k];
  pthread_mutex_unlock(&s->mu);
  m->secs += now_s() - t0;
  return LM_OK;
}

static lm_status do_unmount(lm_sched *s, sched_cmd *c) {
  mount_cmd *m = (mount_cmd *)c;
  pthread_mutex_lock(&s->mu);
  lm_status st = LM_OK;
  if (m->slot < s->o.n_lora || m->slot >= LM_ADAPTER_MOUNT_MAX || !m->id ||
      s->mount_id[m->slot] != m->id || s->closing[m->slot])
    st = LM_ERRF(LM_ERR_NOT_FOUND, "no such adapter mount");
  else {
    s->closing[m->slot] = 1;
    reap_mounts(s);
  }
  pthread_mutex_unlock(&s->mu);
  return st;
}

lm_status lm_sched_mount(lm_sched *s, struct lm_lora *l, int *slot, uint64_t *id, double *secs) {
  mount_cmd m = {.c = {.run = do_mount}, .l = l};
  LM_TRY(command(s, &m.c));
  *slot = m.slot, *id = m.id, *secs = m.secs;
  return LM_OK;
}

lm_status lm_sched_unmount(lm_sched *s, int slot, uint64_t id) {
  mount_cmd m = {.c = {.run = do_unmount}, .slot = slot, .id = id};
  return command(s, &m.c);
}

int64_t lm_sched_mount_users(lm_sched *s, int slot) {
  if (slot < 0 || slot >= LM_ADAPTER_MOUNT_MAX) return 0;
  pthread_mutex_lock(&s->mu);
  int64_t n = s->users[slot];
  pthread_mutex_unlock(&s->mu);
  return n;
}

/* ---- the thread ------------------------------------------------------------------------------ */

static void *engine_main(void *arg) {
  lm_sched *s = arg;
  /* the thread count is per thread in OpenMP: the caller's setting does not reach this one */
  if (s->o.threads > 0) omp_set_num_threads(s->o.threads);
  pthread_mutex_lock(&s->mu);
  while (!s->stop) {
    run_commands(s);
    admit_all(s);
    reap_mounts(s);
    publish(s);
    if (!any_active(s)) {
      /* idle (or the queue head waits for memory that only a running sequence could free) */
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      ts.tv_nsec += 100000000L;
      if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
      }
      if (!s->stop && !s->cmds) pthread_cond_timedwait(&s->cv, &s->mu, &ts);
      continue;
    }
    pthread_mutex_unlock(&s->mu);
    step(s);
    pthread_mutex_lock(&s->mu);
  }
  publish(s);
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

lm_status lm_sched_start(lm_sched *s) {
  if (s->started) return LM_OK;
  if (pthread_create(&s->th, NULL, engine_main, s) != 0)
    return LM_ERRF(LM_ERR_NOMEM, "engine: could not start the scheduler thread");
  s->started = 1;
  return LM_OK;
}

void lm_sched_stats_get(lm_sched *s, lm_sched_stats *out) {
  pthread_mutex_lock(&s->mu);
  *out = s->st;
  pthread_mutex_unlock(&s->mu);
}
