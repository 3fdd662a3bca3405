/* test_engine_sched.c — the continuous-batching scheduler on the embedded model, without HTTP:
 *   - sequences decoded together in one batch, with prompts prefilled in small chunks between
 *     decode steps, produce the same greedy tokens (and log-probabilities within 1e-3) as each
 *     sequence alone;
 *   - the prompt cache: a repeated prompt reuses all but its last token and answers the same;
 *   - a sharing job (share_prompt) puts its prompt in the prefix cache before its first token, so
 *     jobs with the same prompt submitted then prefill one token each (n answers, one prefill);
 *   - cancellation and timeouts end a sequence at once and give its memory back;
 *   - a full queue refuses, a KV budget that fits one sequence runs two one after the other, and
 *     a request that can never fit is refused by the check;
 *   - stop strings, stop ids, ignore_eos and max_tokens end responses where they should;
 *   - the counters stay consistent while another thread reads them during admissions and prefix
 *     cache lookups (they are written under the scheduler's lock only). */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "model/forward.h"
#include "sample/gen_config.h"
#include "engine/sched.h"

#define TINY LM_SOURCE_DIR "/models/lumen-tiny-kjv"

static lm_model *M;
static lm_backend *BE;
static lm_tokenizer *TOK;
static int32_t *STOP;
static int32_t N_STOP;
static lm_kv_spec SPECS[32];

static int setup(void **state) {
  (void)state;
  if (lm_model_load(TINY, &M) || lm_backend_cpu_create(LM_PRECISION_F32, 0, &BE) ||
      lm_model_prepare(M, BE) || lm_tokenizer_load(TINY, &TOK))
    return -1;
  lm_gen_config gc;
  if (lm_gen_config_load(TINY, &gc)) return -1;
  lm_status s =
      lm_gen_stop_ids(M->cfg.eos_ids, M->cfg.n_eos, &gc, lm_tokenizer_eos(TOK), &STOP, &N_STOP);
  lm_gen_config_clear(&gc);
  lm_model_kv_specs(M, SPECS);
  return s ? -1 : 0;
}

static int teardown(void **state) {
  (void)state;
  free(STOP);
  lm_tokenizer_free(TOK);
  lm_backend_destroy(BE);
  lm_model_free(M);
  return 0;
}

static lm_sched *make(int parallel, int64_t chunk, int queue, int64_t budget, int pcache) {
  lm_sched_opts o = {.parallel = parallel,
                     .chunk = chunk,
                     .queue_cap = queue,
                     .kv_budget = budget,
                     .max_ctx = 2048,
                     .prompt_cache = pcache,
                     .specs = SPECS,
                     .stop_ids = STOP,
                     .n_stop_ids = N_STOP};
  lm_sched *s = NULL;
  assert_int_equal(lm_sched_create(M, BE, TOK, &o, &s), LM_OK);
  assert_int_equal(lm_sched_start(s), LM_OK);
  return s;
}

typedef struct result {
  int32_t ids[600];
  float lp[600];
  int n;
  char text[8192];
  lm_finish fin;
} result;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A greedy job; long ones (>= 300 tokens) ignore EOS so they surely run that long. */
static lm_chan *submit(lm_sched *s, const char *prompt, int64_t max_tokens, int logprobs,
                       lm_status want) {
  lm_job *j;
  lm_chan *ch;
  assert_int_equal(lm_job_create(&j, &ch), LM_OK);
  size_t n;
  assert_int_equal(lm_tokenizer_encode(TOK, prompt, strlen(prompt), 1, &j->ids, &n), LM_OK);
  j->n_ids = (int64_t)n;
  j->max_tokens = max_tokens;
  j->sampling.temperature = 0;
  j->top_logprobs = logprobs ? 2 : -1;
  j->ignore_eos = max_tokens >= 300;
  j->t_submit = now_s();
  lm_status st = lm_sched_submit(s, j);
  assert_int_equal(st, want);
  if (st) {
    lm_job_free(j);
    lm_chan_unref(ch);
    return NULL;
  }
  return ch;
}

/* Collects a channel's events until the end (or fails after 60 s). */
static void collect(lm_chan *ch, result *r) {
  memset(r, 0, sizeof *r);
  for (int waited = 0; waited < 600; waited++) {
    lm_tok_event *ev;
    size_t n;
    int done = lm_chan_take(ch, 100, &ev, &n, &r->fin);
    for (size_t i = 0; i < n; i++) {
      if (r->n < 600) {
        r->lp[r->n] = ev[i].logprob;
        r->ids[r->n++] = ev[i].id;
      }
      if (ev[i].len) strncat(r->text, ev[i].text, sizeof r->text - strlen(r->text) - 1);
    }
    lm_tok_events_free(ev, n);
    if (done) {
      lm_chan_unref(ch);
      return;
    }
  }
  fail_msg("no end after 60 s");
}

static const char *const prompts[] = {
    "In the beginning", "And God said, Let there be light: and there was",
    "Psalms 23:1 The LORD is my shepherd; I shall not want. He maketh me to lie "
    "down in green pastures: he leadeth me beside the still waters. He restoreth"};

static void t_batched_equals_alone(void **state) {
  (void)state;
  result alone[3], together[3];
  lm_sched *s = make(1, 512, 8, 1 << 30, 0);
  for (int i = 0; i < 3; i++)
    collect(submit(s, prompts[i], 24, 1, LM_OK), &alone[i]);
  lm_sched_free(s);
  /* chunk 5: the long prompt is prefilled over several steps while the others decode */
  s = make(4, 5, 8, 1 << 30, 0);
  lm_chan *ch[3];
  for (int i = 0; i < 3; i++)
    ch[i] = submit(s, prompts[i], 24, 1, LM_OK);
  for (int i = 0; i < 3; i++)
    collect(ch[i], &together[i]);
  lm_sched_stats st;
  lm_sched_stats_get(s, &st);
  assert_true(st.step_rows > st.steps); /* some steps really carried several sequences */
  lm_sched_free(s);
  for (int i = 0; i < 3; i++) {
    assert_int_equal(alone[i].fin.kind, LM_FIN_LENGTH);
    assert_int_equal(together[i].n, alone[i].n);
    for (int k = 0; k < alone[i].n; k++) {
      assert_int_equal(together[i].ids[k], alone[i].ids[k]);
      assert_true(fabsf(together[i].lp[k] - alone[i].lp[k]) < 1e-3f);
    }
    assert_string_equal(together[i].text, alone[i].text);
    assert_int_equal(together[i].fin.completion_tokens, 24);
  }
  /* the embedded model's known greedy continuation (models/lumen-tiny-kjv/samples.txt) */
  assert_memory_equal(alone[0].text, " of the reign of Darius the king", 32);
}

static void t_prompt_cache(void **state) {
  (void)state;
  lm_sched *s = make(2, 512, 8, 1 << 30, 2);
  result a, b;
  collect(submit(s, prompts[2], 8, 0, LM_OK), &a);
  collect(submit(s, prompts[2], 8, 0, LM_OK), &b);
  assert_int_equal(a.fin.cached_tokens, 0);
  assert_int_equal(b.fin.cached_tokens, b.fin.prompt_tokens - 1);
  assert_string_equal(a.text, b.text);
  lm_sched_stats st;
  for (int i = 0; i < 200;
       i++) { /* the counters are published between steps, after the channel ends */
    lm_sched_stats_get(s, &st);
    if (st.prefix_entries == 1 && !st.active) break;
    usleep(10000);
  }
  assert_int_equal(st.prefix_hits, 1);
  assert_int_equal(st.prefix_entries, 1);
  assert_true(st.kv_reserved > 0 &&
              st.kv_reserved == st.prefix_bytes); /* only the cache entry is left */
  lm_sched_free(s);
}

static void wait_idle(lm_sched *s);

/* Waits for the first token event of ch (which the result then starts with). */
static void first_token(lm_chan *ch, result *r) {
  memset(r, 0, sizeof *r);
  for (int waited = 0; waited < 600 && !r->n; waited++) {
    lm_tok_event *ev;
    size_t n;
    int done = lm_chan_take(ch, 100, &ev, &n, &r->fin);
    for (size_t i = 0; i < n; i++) {
      r->ids[r->n++] = ev[i].id;
      if (ev[i].len) strncat(r->text, ev[i].text, sizeof r->text - strlen(r->text) - 1);
    }
    lm_tok_events_free(ev, n);
    assert_false(done);
  }
  assert_true(r->n > 0);
}

/* The rest of ch's events after first_token. */
static void collect_rest(lm_chan *ch, result *r) {
  result rest;
  collect(ch, &rest);
  for (int i = 0; i < rest.n && r->n < 600; i++)
    r->ids[r->n++] = rest.ids[i];
  strncat(r->text, rest.text, sizeof r->text - strlen(r->text) - 1);
  r->fin = rest.fin;
}

static void t_share_prompt(void **state) {
  (void)state;
  lm_sched *s = make(4, 512, 8, 1 << 30, 4);
  result alone, first, sib[2];
  collect(submit(s, prompts[2], 12, 0, LM_OK), &alone);
  lm_sched_free(s);
  s = make(4, 512, 8, 1 << 30, 4);
  lm_sched_stats st0, st;
  lm_sched_stats_get(s, &st0);
  lm_job *j;
  lm_chan *ch, *sc[2];
  assert_int_equal(lm_job_create(&j, &ch), LM_OK);
  size_t n;
  assert_int_equal(lm_tokenizer_encode(TOK, prompts[2], strlen(prompts[2]), 1, &j->ids, &n), LM_OK);
  j->n_ids = (int64_t)n;
  j->max_tokens = 12;
  j->sampling.temperature = 0;
  j->share_prompt = 1;
  j->t_submit = now_s();
  assert_int_equal(lm_sched_submit(s, j), LM_OK);
  first_token(ch, &first);
  for (int k = 0; k < 2; k++)
    sc[k] = submit(s, prompts[2], 12, 0, LM_OK);
  collect_rest(ch, &first);
  for (int k = 0; k < 2; k++)
    collect(sc[k], &sib[k]);
  wait_idle(s);
  lm_sched_stats_get(s, &st);
  /* the first prefilled the prompt (in two steps), each sibling only its last token */
  assert_int_equal(st.prefill_tokens - st0.prefill_tokens, (int64_t)n + 2);
  assert_string_equal(first.text, alone.text);
  for (int k = 0; k < 2; k++) {
    assert_int_equal(sib[k].fin.cached_tokens, (int64_t)n - 1);
    assert_string_equal(sib[k].text, alone.text);
  }
  assert_int_equal(first.fin.cached_tokens, 0);
  lm_sched_free(s);
}

static void wait_idle(lm_sched *s) {
  lm_sched_stats st;
  for (int i = 0; i < 500; i++) {
    lm_sched_stats_get(s, &st);
    if (!st.active && !st.queued) return;
    usleep(10000);
  }
  fail_msg("the scheduler did not become idle");
}

static void t_cancel_and_timeout(void **state) {
  (void)state;
  lm_sched *s = make(2, 512, 8, 1 << 30, 2);
  lm_chan *ch = submit(s, prompts[0], 500, 0, LM_OK);
  lm_tok_event *ev;
  size_t n;
  lm_finish fin;
  int got = 0;
  for (int i = 0; i < 100 && !got; i++) {
    lm_chan_take(ch, 100, &ev, &n, &fin);
    got = n > 0;
    lm_tok_events_free(ev, n);
  }
  assert_true(got);
  lm_chan_cancel(ch);
  result r;
  collect(ch, &r);
  assert_int_equal(r.fin.kind, LM_FIN_CANCELLED);
  assert_true(r.fin.completion_tokens < 500);
  wait_idle(s);
  lm_sched_stats st;
  lm_sched_stats_get(s, &st);
  /* its reservation is given back; what it had computed stays as a prefix-cache entry */
  assert_int_equal(st.kv_reserved, st.prefix_bytes);
  assert_int_equal(st.prefix_entries, 1);
  assert_int_equal(st.requests_cancelled, 1);
  /* a deadline that has passed ends the job */
  lm_job *j;
  assert_int_equal(lm_job_create(&j, &ch), LM_OK);
  size_t k;
  lm_tokenizer_encode(TOK, "x", 1, 1, &j->ids, &k);
  j->n_ids = (int64_t)k;
  j->max_tokens = 1500; /* far more than 0.2 s of decoding, on a fast machine too */
  j->ignore_eos = 1;
  j->t_submit = now_s();
  j->deadline = j->t_submit + 0.2;
  assert_int_equal(lm_sched_submit(s, j), LM_OK);
  collect(ch, &r);
  assert_int_equal(r.fin.kind, LM_FIN_TIMEOUT);
  lm_sched_free(s);
}

static void t_queue_and_memory(void **state) {
  (void)state;
  lm_sched *s = make(1, 512, 1, 1 << 30, 0);
  lm_chan *a = submit(s, prompts[0], 1500, 0, LM_OK); /* still running after 0.2 s on any machine */
  usleep(200000); /* a is running; b fills the one queue place; c is refused */
  lm_chan *b = submit(s, prompts[1], 4, 0, LM_OK);
  assert_null(submit(s, prompts[1], 4, 0, LM_ERR_STATE));
  lm_chan_cancel(a);
  result ra, rb;
  collect(a, &ra);
  collect(b, &rb);
  assert_int_equal(rb.fin.kind, LM_FIN_LENGTH);
  lm_sched_free(s);
  /* a budget for one sequence of 40 tokens: two such requests run one after the other */
  lm_kv_spec *sp = SPECS;
  lm_admit ad;
  lm_admit_init(&ad, sp, M->cfg.n_caches, BE->act_dtype, 1, 2048);
  int64_t one = lm_admit_bytes(&ad, 40);
  s = make(2, 512, 4, one, 0);
  char msg[256];
  assert_int_equal(lm_sched_check(s, 30, 10, msg, sizeof msg), LM_ADMIT_OK);
  assert_int_equal(lm_sched_check(s, 30, 11, msg, sizeof msg), LM_ADMIT_MEMORY);
  assert_non_null(strstr(msg, "KV cache"));
  assert_int_equal(lm_sched_check(s, 2000, 100, msg, sizeof msg), LM_ADMIT_CONTEXT);
  lm_chan *c1 = submit(s, prompts[0], 20, 0, LM_OK), *c2 = submit(s, prompts[0], 20, 0, LM_OK);
  assert_null(submit(s, prompts[0], 60, 0, LM_ERR_INVALID)); /* over the whole budget */
  result r1, r2;
  collect(c1, &r1);
  collect(c2, &r2);
  assert_int_equal(r1.fin.kind, LM_FIN_LENGTH);
  assert_int_equal(r2.fin.kind, LM_FIN_LENGTH);
  /* the second waited for the first one's memory: admitted only after most of its run */
  assert_true(r2.fin.queue_s > r1.fin.queue_s + 0.5 * (r1.fin.prefill_s + r1.fin.decode_s));
  assert_string_equal(r1.text, r2.text);
  lm_sched_free(s);
}

static void t_stops(void **state) {
  (void)state;
  lm_sched *s = make(2, 512, 4, 1 << 30, 0);
  lm_job *j;
  lm_chan *ch;
  /* a stop string split over tokens: the text before it, nothing after */
  assert_int_equal(lm_job_create(&j, &ch), LM_OK);
  size_t n;
  lm_tokenizer_encode(TOK, prompts[0], strlen(prompts[0]), 1, &j->ids, &n);
  j->n_ids = (int64_t)n;
  j->max_tokens = 40;
  j->sampling.temperature = 0;
  j->stops = calloc(1, sizeof *j->stops);
  j->stops[0] = strdup("Darius");
  j->n_stops = 1;
  assert_int_equal(lm_sched_submit(s, j), LM_OK);
  result r;
  collect(ch, &r);
  assert_int_equal(r.fin.kind, LM_FIN_STOP_STR);
  assert_int_equal(r.fin.stop_index, 0);
  assert_string_equal(r.text, " of the reign of ");
  /* a chat turn ends on <turn|> (a stop id), which is not text */
  const char *chat = "<bos><|turn>user\nWho are you?<turn|>\n<|turn>model\n";
  assert_int_equal(lm_job_create(&j, &ch), LM_OK);
  lm_tokenizer_encode(TOK, chat, strlen(chat), 0, &j->ids, &n);
  j->n_ids = (int64_t)n;
  j->max_tokens = 100;
  j->sampling.temperature = 0;
  assert_int_equal(lm_sched_submit(s, j), LM_OK);
  collect(ch, &r);
  assert_int_equal(r.fin.kind, LM_FIN_STOP);
  assert_int_equal(r.fin.stop_id, lm_tokenizer_find(TOK, "<turn|>", 7));
  assert_string_equal(
      r.text, "I am lumen-tiny-kjv, a small language model trained on the King James Bible.");
  /* ignore_eos: the same turn runs to max_tokens */
  assert_int_equal(lm_job_create(&j, &ch), LM_OK);
  lm_tokenizer_encode(TOK, chat, strlen(chat), 0, &j->ids, &n);
  j->n_ids = (int64_t)n;
  j->max_tokens = 60;
  j->ignore_eos = 1;
  j->sampling.temperature = 0;
  assert_int_equal(lm_sched_submit(s, j), LM_OK);
  collect(ch, &r);
  assert_int_equal(r.fin.kind, LM_FIN_LENGTH);
  assert_int_equal(r.fin.completion_tokens, 60);
  /* bad jobs are refused */
  assert_int_equal(lm_job_create(&j, &ch), LM_OK);
  j->ids = malloc(sizeof *j->ids);
  j->ids[0] = 99999;
  j->n_ids = 1;
  assert_int_equal(lm_sched_submit(s, j), LM_ERR_INVALID);
  lm_job_free(j);
  lm_chan_unref(ch);
  lm_sched_free(s);
}

/* Reads the counters in a loop while requests come and go; checks what must always hold. */
typedef struct reader {
  lm_sched *s;
  atomic_int stop;
  int bad, reads;
} reader;

static void *read_stats(void *arg) {
  reader *r = arg;
  while (!atomic_load(&r->stop)) {
    lm_sched_stats st;
    lm_sched_stats_get(r->s, &st);
    r->bad += st.prefix_hits + st.prefix_misses > st.prefix_lookups || st.active > st.parallel ||
              st.prefix_tokens_reused < st.prefix_hits;
    r->reads++;
  }
  return NULL;
}

static void t_stats_consistent(void **state) {
  (void)state;
  lm_sched *s = make(3, 16, 32, 1 << 30, 3);
  reader rd = {.s = s};
  atomic_init(&rd.stop, 0);
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, read_stats, &rd), 0);
  enum { N = 9 };
  lm_chan *ch[N];
  for (int i = 0; i < N; i++)
    ch[i] = submit(s, prompts[i % 3], 6, 0, LM_OK);
  result r;
  for (int i = 0; i < N; i++)
    collect(ch[i], &r);
  wait_idle(s);
  atomic_store(&rd.stop, 1);
  pthread_join(th, NULL);
  lm_sched_stats st;
  lm_sched_stats_get(s, &st);
  assert_int_equal(rd.bad, 0);
  assert_true(rd.reads > 0);
  assert_int_equal(st.requests_done, N);
  assert_int_equal(st.prefix_lookups, N);
  assert_int_equal(st.prefix_hits + st.prefix_misses, N);
  assert_true(st.prefix_hits >= 1); /* three prompts, each asked three times */
  lm_sched_free(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(t_batched_equals_alone), cmocka_unit_test(t_prompt_cache),
      cmocka_unit_test(t_share_prompt),         cmocka_unit_test(t_cancel_and_timeout),
      cmocka_unit_test(t_queue_and_memory),     cmocka_unit_test(t_stops),
      cmocka_unit_test(t_stats_consistent),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
