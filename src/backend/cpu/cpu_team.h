/* cpu_team.h — the CPU backend's decode step as one parallel region. run_step opens a single
 * OpenMP region and every thread of it issues the step's whole op sequence (the forward's
 * issue()); each op then shares its work through a phase of chunks: the threads claim chunks
 * from one counter until none are left, and a phase ends when all its chunks are done, not
 * when all threads have arrived. So a thread the OS has taken off its core between phases
 * holds nobody up: it finds the phases it missed already done and catches up. Waits spin
 * briefly, then yield the core, then nap. The team's size adapts: decode steps are timed, and where
 * one thread turns out faster than the whole team (a shared machine) the team shrinks to one,
 * trying the full team again from time to time. */
#ifndef LM_BACKEND_CPU_TEAM_H
#define LM_BACKEND_CPU_TEAM_H

#include <stdatomic.h>
#include <stdint.h>

#include "lumen.h"

#define LM_CPU_TEAM_MAX 64  /* threads a team can hold */
#define LM_CPU_TEAM_MAX_T 7 /* steps of up to this many tokens run as a team (the gemv paths) */

typedef struct lm_cpu_team_slot {
  _Alignas(64) int64_t base; /* this thread's count of the step's chunks issued so far */
} lm_cpu_team_slot;

/* The adaptive team size: mean seconds per decode step of each size, and when to try the
 * other one. */
typedef struct lm_cpu_team_adapt {
  double sec[2];     /* [0]: one thread, [1]: the full team; 0 until measured */
  int64_t steps;     /* decode steps run */
  int64_t one_steps; /* of which with one thread */
  int one;           /* the team currently runs with one thread */
} lm_cpu_team_adapt;

typedef struct lm_cpu_team {
  _Alignas(64) _Atomic int64_t next; /* next unclaimed chunk of the step */
  _Alignas(64) _Atomic int64_t done; /* chunks of the step finished */
  lm_cpu_team_slot self[LM_CPU_TEAM_MAX];
  int level;  /* OpenMP level of the step's region; 0: no team running */
  int size;   /* threads of the running team */
  int adapt;  /* 1: adapt the size (the default); 0: always the full team */
  int enable; /* 1: run_step runs steps as a team (the default) */
  lm_cpu_team_adapt ad;
  _Atomic int solo_status; /* the first failure of an op run alone (lm_cpu_team_solo) */
  char solo_msg[512];      /* its message, for the threads that did not run it */
} lm_cpu_team;

/* Does chunk i of a phase, on the calling thread. */
typedef void (*lm_cpu_chunk_fn)(void *arg, int64_t i);

/* 1 when the caller is a thread of a running step's team: it must then call every op, and
 * every lm_cpu_team_run of an op, in the same order with the same shapes as its team mates. */
int lm_cpu_team_active(const lm_cpu_team *t);

/* Chunks [0, n) of a phase, fn(arg, i) each (arg belongs to the calling thread): claimed by
 * the team's threads as they come; returns once every chunk is done. Outside a team, runs
 * them here, or (par) over an OpenMP parallel for. */
void lm_cpu_team_run(lm_cpu_team *t, int64_t n, int par, lm_cpu_chunk_fn fn, void *arg);

/* Inside a team: fn(arg), work without a team form, on one thread (with `region`, inside an
 * OpenMP region of its own, so that fn's own regions and team calls run on that thread alone),
 * its status returned to every thread. Outside: fn(arg). */
lm_status lm_cpu_team_solo(lm_cpu_team *t, int region, lm_status (*fn)(void *), void *arg);

/* Settings and counters of a CPU backend's team (tests, `lumen bench`). enable 0: steps run
 * as separate ops, each with its own regions, as prefill does; adapt 0: always the full team. */
struct lm_backend;
void lm_cpu_team_config(struct lm_backend *be, int enable, int adapt);
typedef struct lm_cpu_team_stats {
  int64_t steps;           /* decode steps (one token) run as a team */
  int64_t one_steps;       /* of which with one thread */
  double sec_one, sec_all; /* mean seconds per step of each size, as the adaptation saw them */
} lm_cpu_team_stats;
lm_cpu_team_stats lm_cpu_team_stats_of(const struct lm_backend *be);

/* A step of T tokens: issue(arg) on every thread of a team of the adapted size, when T is at
 * most LM_CPU_TEAM_MAX_T and the team is enabled, else issue(arg) here. Returns the calling
 * thread's status. */
lm_status lm_cpu_team_step(lm_cpu_team *t, int64_t T, lm_status (*issue)(void *), void *arg);

#endif
