/* test_server_load.c — a short, bounded load test of the server (and, with --bench, the load
 * generator behind the numbers in docs/perf/NOTES.md).
 *
 * As a test: 8 clients send 4 requests each to an in-process server over loopback — streamed and
 * plain chat, completions, Anthropic messages — and some streamed requests are abandoned after
 * their first token. Afterwards: no request failed, every generation is accounted for (done or
 * cancelled, none failed or timed out), and nothing leaked: no active sequence, an empty queue, and
 * no KV memory reserved beyond the prompt cache.
 *
 * As a benchmark: test_server_load --bench --port P [--clients N] [--requests R] [--max-tokens T]
 *   [--prompt-words W] [--temperature T] [--json-schema FILE]: N concurrent streaming clients, R
 * requests each, fixed-length responses (ignore_eos), distinct prompts (no prompt-cache hits);
 * prints aggregate generated tok/s and p50/p99 time to first token as seen by the clients. With
 * --json-schema every request carries it as its response_format (a schema that cannot be
 * finished within max_tokens keeps the lengths fixed). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <pthread.h>

#include "test_server_util.h"

typedef struct load_cfg {
  int port, clients, requests, max_tokens, prompt_words, bench;
  double temperature; /* < 0: the server's default */
  const char *schema; /* --json-schema: the response_format schema's JSON text, or NULL */
} load_cfg;

typedef struct load_client {
  const load_cfg *cfg;
  int idx;
  int ok, failed, cancelled;
  long long tokens;
  double ttft[256];
  int n_ttft;
} load_client;

/* A prompt of about `words` words, distinct per (client, request). */
static void make_prompt(char *out, size_t n, int c, int r, int words) {
  static const char *const w[] = {"and",   "the",    "LORD", "spake", "unto",
                                  "Moses", "saying", "in",   "that",  "day"};
  int k = snprintf(out, n, "Request %d of client %d:", r, c);
  for (int i = 0; i < words && (size_t)k + 16 < n; i++)
    k += snprintf(out + k, n - (size_t)k, " %s", w[(i * 7 + c + r) % 10]);
}

/* 1 when an SSE body carries generated output: a non-empty content / text delta, reasoning, a tool
 * call (OpenAI) or a text / thinking / tool_use block delta (Anthropic). The role chunk is not
 * output. */
static int first_output(const char *b) {
  static const char *const keys[] = {"\"delta\":{\"content\":\"", "\"text\":\""};
  for (int i = 0; i < 2; i++)
    for (const char *p = strstr(b, keys[i]); p; p = strstr(p + 1, keys[i]))
      if (p[strlen(keys[i])] != '"') return 1;
  return strstr(b, "\"reasoning_content\":\"") || strstr(b, "\"tool_calls\":[") ||
         strstr(b, "_delta\"");
}

/* Streams one request, reading as the tokens come; abandon: close after the first content delta. */
static int run_stream(load_client *lc, const char *path, const char *body, int abandon,
                      double *ttft, long long *toks) {
  int fd = http_connect(lc->cfg->port, 120);
  if (fd < 0 || http_send(fd, "POST", path, NULL, body, strlen(body))) {
    if (fd >= 0) close(fd);
    return -1;
  }
  double t0 = test_now();
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap);
  *ttft = -1;
  for (;;) {
    if (n + 4096 > cap) buf = realloc(buf, cap *= 2);
    ssize_t k = recv(fd, buf + n, cap - n - 1, 0);
    if (k <= 0) break;
    n += (size_t)k;
    buf[n] = '\0';
    if (*ttft < 0 && first_output(buf)) {
      *ttft = test_now() - t0;
      if (abandon) break;
    }
  }
  close(fd);
  int ok = strstr(buf, "HTTP/1.1 200") == buf &&
           (abandon || strstr(buf, "[DONE]") || strstr(buf, "message_stop"));
  const char *u = strstr(buf, "\"completion_tokens\":");
  *toks = u ? atoll(u + 20) : 0;
  free(buf);
  return ok ? 0 : -1;
}

static int run_plain(load_client *lc, const char *path, const char *body, long long *toks) {
  http_resp r;
  if (http_post(lc->cfg->port, path, body, &r)) return -1;
  int ok = r.status == 200;
  const char *u = strstr(r.body, "\"completion_tokens\":");
  if (!u) u = strstr(r.body, "\"output_tokens\":");
  *toks = u ? atoll(strchr(u, ':') + 1) : 0;
  if (!ok) fprintf(stderr, "load: %s -> %d %s\n", path, r.status, r.body);
  http_resp_free(&r);
  return ok ? 0 : -1;
}

/* Half of the streamed chat requests (those of even clients) are abandoned after their first
 * output. */
static int abandons(int client, int r) { return (client + r) % 4 == 0 && client % 2 == 0; }

static void one_request(load_client *lc, int r) {
  const load_cfg *cfg = lc->cfg;
  char prompt[4096], body[16384], fmt[8192] = "";
  if (cfg->schema)
    snprintf(fmt, sizeof fmt,
             "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"bench\","
             "\"schema\":%s}},",
             cfg->schema);
  make_prompt(prompt, sizeof prompt, lc->idx, r, cfg->prompt_words);
  int kind = cfg->bench ? 0 : (lc->idx + r) % 4, abandon = !cfg->bench && abandons(lc->idx, r);
  double ttft = -1;
  long long toks = 0;
  int rc;
  char temp[64] = "";
  if (cfg->temperature >= 0) snprintf(temp, sizeof temp, "\"temperature\":%g,", cfg->temperature);
  if (kind == 0) {
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}],\"max_tokens\":%d,%s%s%s"
             "\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
             prompt, cfg->max_tokens, cfg->bench ? "\"ignore_eos\":true," : "", temp, fmt);
    rc = run_stream(lc, "/v1/chat/completions", body, abandon, &ttft, &toks);
  } else if (kind == 1) {
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}],\"max_tokens\":%d}", prompt,
             cfg->max_tokens);
    rc = run_plain(lc, "/v1/chat/completions", body, &toks);
  } else if (kind == 2) {
    snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"max_tokens\":%d,\"temperature\":0}", prompt,
             cfg->max_tokens);
    rc = run_plain(lc, "/v1/completions", body, &toks);
  } else {
    snprintf(body, sizeof body,
             "{\"max_tokens\":%d,\"stream\":true,\"messages\":[{\"role\":\"user\","
             "\"content\":\"%s\"}]}",
             cfg->max_tokens, prompt);
    rc = run_stream(lc, "/v1/messages", body, 0, &ttft, &toks);
  }
  if (rc)
    lc->failed++;
  else if (abandon)
    lc->cancelled++;
  else
    lc->ok++;
  lc->tokens += toks;
  if (ttft >= 0 && lc->n_ttft < 256) lc->ttft[lc->n_ttft++] = ttft;
}

static void *client_main(void *arg) {
  load_client *lc = arg;
  for (int r = 0; r < lc->cfg->requests; r++)
    one_request(lc, r);
  return NULL;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

typedef struct load_sum {
  int ok, failed, cancelled;
  long long tokens;
  double wall, p50, p99;
} load_sum;

static load_sum run_load(const load_cfg *cfg) {
  load_client *lc = calloc((size_t)cfg->clients, sizeof *lc);
  pthread_t *th = calloc((size_t)cfg->clients, sizeof *th);
  double t0 = test_now();
  for (int i = 0; i < cfg->clients; i++) {
    lc[i] = (load_client){.cfg = cfg, .idx = i};
    pthread_create(&th[i], NULL, client_main, &lc[i]);
  }
  load_sum s = {0};
  double *all = calloc((size_t)cfg->clients * 256, sizeof *all);
  int n = 0;
  for (int i = 0; i < cfg->clients; i++) {
    pthread_join(th[i], NULL);
    s.ok += lc[i].ok;
    s.failed += lc[i].failed;
    s.cancelled += lc[i].cancelled;
    s.tokens += lc[i].tokens;
    for (int k = 0; k < lc[i].n_ttft; k++)
      all[n++] = lc[i].ttft[k];
  }
  s.wall = test_now() - t0;
  qsort(all, (size_t)n, sizeof *all, cmp_d);
  s.p50 = n ? all[(size_t)(0.50 * (n - 1) + 0.5)] : 0;
  s.p99 = n ? all[(size_t)(0.99 * (n - 1) + 0.5)] : 0;
  free(all);
  free(lc);
  free(th);
  return s;
}

/* ---- the CI test ----------------------------------------------------------------------------- */

static void t_load(void **state) {
  (void)state;
  test_server t;
  lm_server_opts o;
  lm_server_opts_init(&o);
  o.parallel = 4;
  o.queue_size = 64;
  o.timeout_s = 120;
  assert_int_equal(test_server_start(&t, &o), 0);
  load_cfg cfg = {.port = t.port,
                  .clients = 8,
                  .requests = 4,
                  .max_tokens = 12,
                  .prompt_words = 8,
                  .temperature = -1};
  int total = cfg.clients * cfg.requests, abandoned = 0;
  for (int c = 0; c < cfg.clients; c++)
    for (int r = 0; r < cfg.requests; r++)
      abandoned += abandons(c, r);
  load_sum s = run_load(&cfg);
  fprintf(stderr, "load: %d ok, %d abandoned, %d failed, %lld tokens in %.1f s (ttft p50 %.3f s)\n",
          s.ok, s.cancelled, s.failed, s.tokens, s.wall, s.p50);
  assert_int_equal(s.failed, 0);
  assert_true(abandoned > 0);
  assert_int_equal(s.ok + s.cancelled, total);
  assert_int_equal(s.cancelled, abandoned);
  assert_true(wait_idle(t.port, 10));
  json_t *st = NULL;
  for (int i = 0; i < 100;
       i++) { /* abandoned streams are counted once their sequences are reaped */
    json_decref(st);
    st = test_stats(t.port);
    if (stats_int(st, "jobs", "done") + stats_int(st, "jobs", "cancelled") == total) break;
    usleep(20000);
  }
  assert_int_equal(stats_int(st, "jobs", "done") + stats_int(st, "jobs", "cancelled"), total);
  assert_int_equal(stats_int(st, "jobs", "failed"), 0);
  assert_int_equal(stats_int(st, "jobs", "timeout"), 0);
  assert_int_equal(stats_int(st, "sequences", "active"), 0);
  assert_int_equal(stats_int(st, "queue", "length"), 0);
  assert_int_equal(stats_int(st, "kv", "reserved_bytes"), stats_int(st, "prompt_cache", "bytes"));
  assert_true(stats_int(st, "prompt_cache", "entries") <= 4);
  json_decref(st);
  test_server_stop(&t);
}

/* ---- the benchmark --------------------------------------------------------------------------- */

/* The schema file as one line of JSON (it goes inside the request body). */
static const char *read_schema(const char *path) {
  json_error_t je;
  json_t *j = json_load_file(path, 0, &je);
  char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
  json_decref(j);
  if (!s) fprintf(stderr, "--json-schema %s: %s\n", path, je.text);
  return s;
}

static int bench(int argc, char **argv) {
  load_cfg cfg = {.clients = 1,
                  .requests = 4,
                  .max_tokens = 128,
                  .prompt_words = 100,
                  .bench = 1,
                  .temperature = -1};
  for (int i = 2; i + 1 < argc; i += 2) {
    int v = atoi(argv[i + 1]);
    if (!strcmp(argv[i], "--port"))
      cfg.port = v;
    else if (!strcmp(argv[i], "--clients"))
      cfg.clients = v;
    else if (!strcmp(argv[i], "--requests"))
      cfg.requests = v;
    else if (!strcmp(argv[i], "--max-tokens"))
      cfg.max_tokens = v;
    else if (!strcmp(argv[i], "--prompt-words"))
      cfg.prompt_words = v;
    else if (!strcmp(argv[i], "--temperature"))
      cfg.temperature = atof(argv[i + 1]);
    else if (!strcmp(argv[i], "--json-schema")) {
      if (!(cfg.schema = read_schema(argv[i + 1]))) return 2;
    } else {
      fprintf(stderr, "unknown option %s\n", argv[i]);
      return 2;
    }
  }
  if (cfg.port <= 0 || cfg.clients < 1 || cfg.requests < 1 || cfg.requests > 256) {
    fprintf(stderr, "usage: test_server_load --bench --port P [--clients N] [--requests R<=256] "
                    "[--max-tokens T] "
                    "[--prompt-words W] [--temperature T] [--json-schema FILE]\n");
    return 2;
  }
  load_sum s = run_load(&cfg);
  printf("clients %d  requests %d  ok %d  failed %d  generated %lld tok in %.2f s  aggregate %.1f "
         "tok/s  "
         "ttft p50 %.3f s  p99 %.3f s\n",
         cfg.clients, cfg.clients * cfg.requests, s.ok, s.failed, s.tokens, s.wall,
         (double)s.tokens / s.wall, s.p50, s.p99);
  return s.failed ? 1 : 0;
}

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "--bench")) return bench(argc, argv);
  const struct CMUnitTest tests[] = {cmocka_unit_test(t_load)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
