/* cpu_team.c — the decode step's thread team (see cpu_team.h): chunk claiming, the phase
 * wait, ops run alone, and the adaptive team size. */
#include "backend/cpu/cpu_team.h"

#include <omp.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "base/status.h"

/* Pauses before a waiting thread starts yielding its core: a phase's last chunk normally
 * finishes within a few microseconds; a longer wait means its owner is off its core, and
 * spinning would only keep the core from it (or from whoever the OS runs instead). After
 * LM_CPU_YIELDS yields the waiter sleeps in short naps, so that a long wait (its owner
 * descheduled for a timeslice) leaves the core to the machine's other work. */
#define LM_CPU_SPIN 1024
#define LM_CPU_YIELDS 64
#define LM_CPU_NAP_NS 50000
/* The adaptive size: how often the size not in use is tried, in decode steps, and the margin
 * by which the size not in use must beat the one in use to take over (step times on a loaded
 * machine swing by tens of percent from step to step). */
#define LM_CPU_PROBE_TEAM 32
#define LM_CPU_PROBE_ONE 64
#define LM_CPU_SWITCH_MARGIN 0.85

static void lm_cpu_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

int lm_cpu_team_active(const lm_cpu_team *t) { return t->level && omp_get_level() == t->level; }

static void lm_cpu_team_wait(lm_cpu_team *t, int64_t end) {
  for (int spin = 0; atomic_load_explicit(&t->done, memory_order_acquire) < end; spin++) {
    if (spin < LM_CPU_SPIN) {
      lm_cpu_pause();
    } else if (spin < LM_CPU_SPIN + LM_CPU_YIELDS) {
      sched_yield();
    } else {
      nanosleep(&(struct timespec){.tv_nsec = LM_CPU_NAP_NS}, NULL);
      spin = LM_CPU_SPIN + LM_CPU_YIELDS; /* no overflow on very long waits */
    }
  }
}

void lm_cpu_team_run(lm_cpu_team *t, int64_t n, int par, lm_cpu_chunk_fn fn, void *arg) {
  if (!lm_cpu_team_active(t)) {
#pragma omp parallel for schedule(static) if (par && n > 1)
    for (int64_t i = 0; i < n; i++)
      fn(arg, i);
    return;
  }
  lm_cpu_team_slot *me = &t->self[omp_get_thread_num()];
  int64_t base = me->base, end = base + n;
  me->base = end;
  /* Every chunk before base is claimed (this thread saw the previous phase done), and none
   * past end can be until this phase is done: so next lies in [base, end] here. */
  int64_t c = atomic_load_explicit(&t->next, memory_order_relaxed);
  while (c < end) {
    if (!atomic_compare_exchange_weak(&t->next, &c, c + 1)) continue;
    fn(arg, c - base);
    atomic_fetch_add_explicit(&t->done, 1, memory_order_release);
    c = atomic_load_explicit(&t->next, memory_order_relaxed);
  }
  lm_cpu_team_wait(t, end);
}

typedef struct solo_call {
  lm_cpu_team *t;
  int region;
  lm_status (*fn)(void *);
  void *arg;
} solo_call;

static void solo_chunk(void *arg, int64_t i) {
  (void)i;
  solo_call *c = arg;
  lm_status s = LM_OK;
  if (c->region) {
#pragma omp parallel num_threads(1)
    s = c->fn(c->arg);
  } else {
    s = c->fn(c->arg);
  }
  if (s == LM_OK) return;
  int none = LM_OK;
  if (atomic_compare_exchange_strong(&c->t->solo_status, &none, (int)s))
    snprintf(c->t->solo_msg, sizeof c->t->solo_msg, "%s", lm_errmsg());
}

lm_status lm_cpu_team_solo(lm_cpu_team *t, int region, lm_status (*fn)(void *), void *arg) {
  if (!lm_cpu_team_active(t)) return fn(arg);
  solo_call c = {t, region, fn, arg};
  lm_cpu_team_run(t, 1, 0, solo_chunk, &c);
  /* a failure ends the step for every thread (the first one's status and message) */
  lm_status s = (lm_status)atomic_load(&t->solo_status);
  return s == LM_OK ? LM_OK : lm_err_set(s, "%s", t->solo_msg);
}

/* The team size for the next step, and whether this step is a probe of the other size. */
static int lm_cpu_team_pick(lm_cpu_team *t, int full) {
  lm_cpu_team_adapt *a = &t->ad;
  if (full <= 1 || !t->adapt) return full;
  int64_t s = a->steps;
  int probe = a->one ? s % LM_CPU_PROBE_TEAM == LM_CPU_PROBE_TEAM - 1
                     : (s % LM_CPU_PROBE_ONE == LM_CPU_PROBE_ONE - 1 || (s >= 2 && !a->sec[0]));
  return (a->one != probe) ? 1 : full;
}

static void lm_cpu_team_record(lm_cpu_team *t, int one, double sec) {
  lm_cpu_team_adapt *a = &t->ad;
  double *m = &a->sec[one ? 0 : 1];
  *m = *m > 0 ? 0.5 * *m + 0.5 * sec : sec;
  a->steps++;
  a->one_steps += one;
  if (a->sec[0] > 0 && a->sec[1] > 0)
    a->one = a->one ? !(a->sec[1] < LM_CPU_SWITCH_MARGIN * a->sec[0])
                    : a->sec[0] < LM_CPU_SWITCH_MARGIN * a->sec[1];
}

lm_status lm_cpu_team_step(lm_cpu_team *t, int64_t T, lm_status (*issue)(void *), void *arg) {
  int full = omp_get_max_threads();
  if (!t->enable || T < 1 || T > LM_CPU_TEAM_MAX_T || omp_in_parallel()) return issue(arg);
  if (full > LM_CPU_TEAM_MAX) full = LM_CPU_TEAM_MAX;
  int nt = lm_cpu_team_pick(t, full);
  atomic_store(&t->next, 0);
  atomic_store(&t->done, 0);
  atomic_store(&t->solo_status, LM_OK);
  for (int i = 0; i < nt; i++)
    t->self[i].base = 0;
  t->size = nt;
  t->level = omp_get_level() + 1;
  lm_status s = LM_OK;
  double t0 = omp_get_wtime();
#pragma omp parallel num_threads(nt)
  {
    lm_status mine = issue(arg);
    if (omp_get_thread_num() == 0) s = mine;
  }
  double dt = omp_get_wtime() - t0;
  t->level = 0;
  if (T == 1 && s == LM_OK) lm_cpu_team_record(t, nt == 1, dt);
  return s;
}
