/* cli_bench.c — `lumen bench`: prefill and decode speed of a synthetic model of a real
 * geometry (or a checkpoint), against the machine's measured memory read bandwidth.
 * Decode runs a fixed number of tokens (greedy, never stopping at EOS). */
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/cpu/cpu_matmul.h"
#include "backend/cpu/cpu_team.h"
#include "base/rng.h"
#include "base/status.h"
#include "cli/cli.h"
#include "cli/cli_args.h"
#include "cli/cli_common.h"
#include "cli/cli_progress.h"
#include "kv/kv_state.h"
#include "model/fingerprint.h"
#include "cli/cli_adapter.h"
#include "model/forward.h"
#include "model/kv_plan.h"
#include "model/lora_save.h"
#ifdef LM_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

static const char *bench_help =
    "usage: lumen bench (--preset FILE | MODEL_DIR) [options]\n"
    "\n"
    "Measures prefill tok/s at given prompt lengths and decode tok/s at given context lengths\n"
    "(median of --reps after --warmup runs), the bytes a decode step reads, the achieved GB/s and\n"
    "its share of the measured memory read bandwidth. CPU: a read probe's best of 15 passes at\n"
    "the start (printed with the median and slowest pass), and a decode's share is of the best\n"
    "of the 3-pass probes taken right before and after each of its measured runs, so that the\n"
    "two see the same neighbours on a shared machine (its share of the first probe follows).\n"
    "\n"
    "  --preset FILE       config.json-shaped geometry (e.g. ../shared/presets/gemma4-e2b.json):\n"
    "                      random weights from the seeded counter generator\n"
    "  --bits B            synthetic weights: 0 = bf16, else MLX affine 2..8 bits (default 4)\n"
    "  --group G           quantization group 32/64/128 (default 64)\n"
    "  --seed S            generator seed (default 1)\n"
    "  --prompt LIST       prefill lengths, comma-separated (default 128)\n"
    "  --context LIST      decode context lengths (default 512)\n"
    "  --decode-tokens N   tokens per decode measurement (default 16)\n"
    "  --reps N            measured repetitions (default 3); --warmup N (default 1)\n"
    "  --backend B         cpu or cuda (default: cuda when built and a GPU is present);\n"
    "                      --precision f32|fast|bf16 (default fast); --threads N\n"
    "  --kv-quant MODE     KV caches: off (default), 4, 8, config, or turboquant[:K:V] (full-\n"
    "                      attention layers); --kv-group G for uniform 4/8-bit (default 64)\n"
    "  --state-tokens N    instead: prefill N tokens, save the cache set to a state file in\n"
    "                      $TMPDIR, restore it (page cache warm, then with the file's pages\n"
    "                      dropped), report file size and save/restore seconds, and check that\n"
    "                      the restored set continues with identical logits\n"
    "  --verify-tokens N   also time steps of 1 + N tokens of one sequence at each context (the\n"
    "                      shape of a speculative verification: N drafts rejected, the context\n"
    "                      growing by one a step) and their cost in one-token steps\n"
    "  --adapter P[@W]     apply the LoRA adapter in directory P (PEFT or mlx-lm) with weight W;\n"
    "                      repeat to stack several\n"
    "  --adapter-rank R    also a random adapter of rank R on every attention and MLP\n"
    "                      projection (what an adapter costs a step, on a --preset model)\n"
    "  --adapters K        with --adapter-rank: K such adapters (1..48), sequence i running\n"
    "                      adapter i mod K (distinct adapters in one batch)\n"
    "  --save-adapter DIR  write the --adapter-rank adapter to DIR (PEFT layout, bf16) and\n"
    "                      stop (an adapter of the model's shapes, to measure loading it)\n"
    "  --batch N           decode N sequences together (each at the --context length):\n"
    "                      aggregate tok/s of the N streams (default 1)\n"
    "  --json              one JSON object on stdout\n";

typedef struct bench_opts {
  const char *preset, *model, *prompt, *context;
  int bits, group, reps, warmup, json;
  int64_t decode_tokens, state_tokens;
  int verify; /* --verify-tokens: drafts per timed verification step (0: none) */
  lm_kv_options kv;
  uint64_t seed;
  lm_cli_backend_opts be;
  lm_cli_adapters ad; /* --adapter (every sequence's, stacked) */
  int adapter_rank;
  int n_synth; /* --adapters: random adapters mounted at LM_BENCH_SYNTH_SLOT + k */
  lm_lora *synth[LM_ADAPTER_MOUNT_MAX];
  int batch;
  const char *save_adapter;
} bench_opts;

#define LM_BENCH_SYNTH_SLOT 8

/* Sequence s's adapters: the --adapter set, then its random one (i mod K); NULL without random
 * ones (the forward's default: the --adapter set). picks: [LM_LORA_PICKS]. */
static const lm_lora_pick *seq_picks(const bench_opts *o, int s, lm_lora_pick *picks) {
  if (!o->n_synth) return NULL;
  int n = 0;
  for (; n < o->ad.n; n++)
    picks[n] = (lm_lora_pick){.slot = n, .weight = 1.0f};
  picks[n++] = (lm_lora_pick){.slot = LM_BENCH_SYNTH_SLOT + s % o->n_synth, .weight = 1.0f};
  for (; n < LM_LORA_PICKS; n++)
    picks[n] = (lm_lora_pick){.slot = -1};
  return picks;
}

static int parse(int argc, char **argv, bench_opts *o) {
  static const struct option lo[] = {
      {"preset", 1, 0, 'p'},        {"bits", 1, 0, 'b'},         {"group", 1, 0, 'g'},
      {"seed", 1, 0, 's'},          {"prompt", 1, 0, 'P'},       {"context", 1, 0, 'c'},
      {"decode-tokens", 1, 0, 'n'}, {"reps", 1, 0, 'r'},         {"warmup", 1, 0, 'w'},
      {"backend", 1, 0, 'B'},       {"precision", 1, 0, 'x'},    {"threads", 1, 0, 't'},
      {"json", 0, 0, 'j'},          {"help", 0, 0, 'h'},         {"state-tokens", 1, 0, 'S'},
      {"kv-quant", 1, 0, 'q'},      {"kv-group", 1, 0, 'G'},     {"verify-tokens", 1, 0, 'V'},
      {"adapter", 1, 0, 'A'},       {"adapter-rank", 1, 0, 'R'}, {"adapters", 1, 0, 'K'},
      {"batch", 1, 0, 'N'},         {"save-adapter", 1, 0, 'W'}, {0, 0, 0, 0}};
  *o = (bench_opts){.bits = 4,
                    .group = 64,
                    .reps = 3,
                    .warmup = 1,
                    .decode_tokens = 16,
                    .seed = 1,
                    .prompt = "128",
                    .context = "512",
                    .batch = 1};
  int c;
  optind = 1;
  while ((c = getopt_long(argc, argv, ":h", lo, NULL)) != -1) {
    switch (c) {
    case 'p': o->preset = optarg; break;
    case 'b': o->bits = atoi(optarg); break;
    case 'g': o->group = atoi(optarg); break;
    case 's': o->seed = strtoull(optarg, NULL, 10); break;
    case 'P': o->prompt = optarg; break;
    case 'c': o->context = optarg; break;
    case 'n': o->decode_tokens = atoll(optarg); break;
    case 'r': o->reps = atoi(optarg); break;
    case 'w': o->warmup = atoi(optarg); break;
    case 'B': o->be.backend = optarg; break;
    case 'x': o->be.precision = optarg; break;
    case 't': o->be.threads = atoi(optarg); break;
    case 'j': o->json = 1; break;
    case 'S': o->state_tokens = atoll(optarg); break;
    case 'q': o->kv.mode = optarg; break;
    case 'G': o->kv.group = atoi(optarg); break;
    case 'V': o->verify = atoi(optarg); break;
    case 'A':
      if (lm_cli_adapters_add(&o->ad, optarg)) return 2;
      break;
    case 'R': o->adapter_rank = atoi(optarg); break;
    case 'K': o->n_synth = atoi(optarg); break;
    case 'N': o->batch = atoi(optarg); break;
    case 'W': o->save_adapter = optarg; break;
    case 'h': fputs(bench_help, stdout); return 0;
    default: return lm_cli_flag_error(c, argc, argv, lo);
    }
  }
  if (optind < argc) o->model = argv[optind++];
  if (optind != argc || (!o->preset == !o->model) || o->reps < 1 || o->warmup < 0 ||
      o->decode_tokens < 1 || o->state_tokens < 0 || o->verify < 0 ||
      o->verify > LM_SPEC_MAX_TOKENS || o->adapter_rank < 0 || o->n_synth < 0 ||
      o->n_synth > LM_ADAPTER_MOUNT_MAX - LM_BENCH_SYNTH_SLOT || (o->n_synth && !o->adapter_rank) ||
      (o->adapter_rank && o->ad.n >= LM_CLI_MAX_ADAPTERS) || o->batch < 1 || o->batch > 4096 ||
      (o->batch > 1 && o->verify) || (o->save_adapter && !o->adapter_rank)) {
    fputs(bench_help, stderr);
    return 2;
  }
  if (o->adapter_rank && !o->n_synth) o->n_synth = 1;
  if (o->state_tokens && (o->ad.n || o->adapter_rank)) {
    fprintf(stderr, "lumen bench: --state-tokens does not take adapters (state files are not "
                    "keyed by an adapter set)\n");
    return 2;
  }
  return -1;
}

/* Bytes one decode token reads: every matrix once (MoE: the top_k experts of E), the tied
 * head, a row of each lookup table, and the KV cache held at context n. */
static double decode_bytes(const lm_model *m, const lm_kv_spec *specs, int64_t n, lm_dtype act) {
  const lm_model_config *c = &m->cfg;
  double b = (double)lm_weight_bytes(&m->embed) +
             (double)lm_weight_bytes(&m->embed) / (double)c->vocab_size;
  if (c->ple_dim)
    b += (double)lm_weight_bytes(&m->ple_model_proj) +
         (double)lm_weight_bytes(&m->embed_ple) / (double)c->ple_vocab;
  for (int l = 0; l < c->n_layers; l++) {
    const lm_layer_weights *L = &m->layers[l];
    const lm_weight *ws[] = {&L->q,  &L->k,    &L->v,        &L->o,        &L->gate,
                             &L->up, &L->down, &L->ple_gate, &L->ple_proj, &L->router};
    for (size_t i = 0; i < sizeof ws / sizeof *ws; i++)
      if (ws[i]->data) b += (double)lm_weight_bytes(ws[i]);
    if (c->moe) {
      const lm_weight *ex[] = {&L->ex_gate, &L->ex_up, &L->ex_down};
      for (int i = 0; i < 3; i++)
        b += (double)lm_weight_bytes(ex[i]) * (double)c->top_k / (double)c->n_experts;
    }
  }
  for (int i = 0; i < c->n_caches; i++) {
    int64_t cap = lm_kv_spec_capacity(&specs[i]), held = n > cap ? cap : n;
    b += (double)held * (double)lm_kv_spec_bytes_per_token(&specs[i], act);
  }
  return b;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_d);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Deterministic pseudo-random prompt ids in [3, V). */
static void fill_ids(int32_t *ids, int64_t n, int64_t V, uint64_t seed) {
  for (int64_t i = 0; i < n; i++)
    ids[i] = (int32_t)(3 + (lm_mix64(seed * 7919 + (uint64_t)i) % (uint64_t)(V - 3)));
}

/* One prefill of n tokens into a fresh cache set; returns seconds, or -1 on error. */
static double time_prefill(const lm_model *m, const lm_kv_spec *specs, lm_backend *be,
                           lm_forward *f, const int32_t *ids, int64_t n, const lm_lora_pick *lora,
                           lm_kv_set **kv_out) {
  lm_kv_set *kv;
  if (lm_kv_set_create(be, specs, m->cfg.n_caches, &kv)) return -1;
  int32_t *pos = malloc((size_t)n * sizeof *pos), *seq = calloc((size_t)n, sizeof *seq);
  int32_t last = (int32_t)(n - 1);
  for (int64_t i = 0; pos && i < n; i++)
    pos[i] = (int32_t)i;
  lm_batch b = {.n_tokens = (int32_t)n,
                .ids = ids,
                .pos = pos,
                .seq = seq,
                .n_seqs = 1,
                .kv = &kv,
                .n_logits = 1,
                .logit_rows = &last,
                .lora = lora};
  double t0 = lm_cli_now();
  lm_status s = pos && seq ? lm_forward_run(f, &b, NULL) : LM_ERR_NOMEM;
  double dt = lm_cli_now() - t0;
  free(pos);
  free(seq);
  if (s || !kv_out)
    lm_kv_set_free(kv);
  else
    *kv_out = kv;
  return s ? -1 : dt;
}

/* n greedy decode steps continuing kv (the argmax runs on the backend; only the token id
 * comes back); returns seconds, or -1. */
static double time_decode(lm_forward *f, lm_kv_set *kv, int64_t n, const lm_lora_pick *lora) {
  int32_t id = 3, seq = 0, row = 0;
  double t0 = lm_cli_now();
  lm_status s = LM_OK;
  for (int64_t i = 0; i < n && !s; i++) {
    int32_t pos = (int32_t)lm_kv_set_len(kv), next = 0;
    lm_batch b = {.n_tokens = 1,
                  .ids = &id,
                  .pos = &pos,
                  .seq = &seq,
                  .n_seqs = 1,
                  .kv = &kv,
                  .n_logits = 1,
                  .logit_rows = &row,
                  .lora = lora};
    s = lm_forward_run_greedy(f, &b, NULL, &next);
    id = next;
  }
  double dt = lm_cli_now() - t0;
  return s ? -1 : dt;
}

/* n verification steps of t tokens continuing kv: every row's argmax, then the t - 1 drafts
 * trimmed off, so the context grows by one a step as in decode; returns seconds, or -1. */
static double time_verify(lm_forward *f, lm_kv_set *kv, int64_t n, int t,
                          const lm_lora_pick *lora) {
  int32_t ids[LM_SPEC_MAX_TOKENS + 1], pos[LM_SPEC_MAX_TOKENS + 1], seq[LM_SPEC_MAX_TOKENS + 1],
      rows[LM_SPEC_MAX_TOKENS + 1], next[LM_SPEC_MAX_TOKENS + 1];
  double t0 = lm_cli_now();
  lm_status s = LM_OK;
  for (int64_t i = 0; i < n && !s; i++) {
    int32_t at = (int32_t)lm_kv_set_len(kv);
    for (int k = 0; k < t; k++)
      ids[k] = 3 + k, pos[k] = at + k, seq[k] = 0, rows[k] = k;
    lm_batch b = {.n_tokens = t,
                  .ids = ids,
                  .pos = pos,
                  .seq = seq,
                  .n_seqs = 1,
                  .kv = &kv,
                  .n_logits = t,
                  .logit_rows = rows,
                  .lora = lora};
    s = lm_forward_run_greedy(f, &b, NULL, next);
    if (!s) s = lm_kv_set_trim(kv, t - 1);
  }
  double dt = lm_cli_now() - t0;
  return s ? -1 : dt;
}

/* The best of a few read-probe passes now (GB/s), where the backend has the CPU's probe; 0
 * elsewhere. Taken right before and after each measured run, it sees the neighbours the run
 * saw: on a machine whose memory others share, a probe taken once at the start may not. */
#define LM_BENCH_PROBE_PASSES 3

static double probe_now(lm_backend *be, const bench_opts *o) {
  if (strcmp(be->ops->name, "cpu")) return 0;
  return lm_cpu_read_bandwidth_passes(o->be.threads, LM_BENCH_PROBE_PASSES).best;
}

/* A forward with the bench's adapters attached. */
static lm_status bench_forward(const lm_model *m, lm_backend *be, const bench_opts *o,
                               int64_t max_tokens, int64_t max_logits, lm_forward **f) {
  LM_TRY(lm_forward_create(m, be, max_tokens, max_logits, f));
  lm_status s = lm_forward_set_adapters(*f, o->ad.set, o->ad.n);
  for (int k = 0; k < o->n_synth && !s; k++)
    s = lm_forward_mount_adapter(*f, LM_BENCH_SYNTH_SLOT + k, o->synth[k]);
  if (s) {
    lm_forward_free(*f);
    *f = NULL;
  }
  return s;
}

/* n greedy decode steps of the N sequences kv[0..N) together, each at its own length (one
 * token each, a logits row each; sequence s runs picks[s]); returns seconds, or -1. */
static double time_batch(lm_forward *f, lm_kv_set **kv, int N, int64_t n,
                         const lm_lora_pick (*picks)[LM_LORA_PICKS]) {
  int32_t *ids = malloc((size_t)N * 5 * sizeof *ids);
  if (!ids) return -1;
  int32_t *pos = ids + N, *seq = pos + N, *rows = seq + N, *next = rows + N;
  for (int s = 0; s < N; s++)
    ids[s] = 3, seq[s] = s, rows[s] = s;
  double t0 = lm_cli_now();
  lm_status st = LM_OK;
  for (int64_t i = 0; i < n && !st; i++) {
    for (int s = 0; s < N; s++)
      pos[s] = (int32_t)lm_kv_set_len(kv[s]);
    lm_batch b = {.n_tokens = N,
                  .ids = ids,
                  .pos = pos,
                  .seq = seq,
                  .n_seqs = N,
                  .kv = kv,
                  .n_logits = N,
                  .logit_rows = rows,
                  .lora = picks ? &picks[0][0] : NULL};
    st = lm_forward_run_greedy(f, &b, NULL, next);
    memcpy(ids, next, (size_t)N * sizeof *ids);
  }
  double dt = lm_cli_now() - t0;
  free(ids);
  return st ? -1 : dt;
}

/* One measured (or warm-up) run: o->batch sequences prefilled to ctx, then o->decode_tokens
 * steps of t tokens (1: decode; more: verification, one sequence). Seconds, or -1. */
static double run_steps(const lm_model *m, const lm_kv_spec *specs, lm_backend *be,
                        const bench_opts *o, lm_forward *fp, lm_forward *fd, const int32_t *ids,
                        int64_t ctx, int t, lm_lora_pick (*picks)[LM_LORA_PICKS], lm_kv_set **kv) {
  int N = o->batch, any = o->n_synth > 0;
  for (int s = 0; s < N; s++)
    if (time_prefill(m, specs, be, fp, ids, ctx, any ? picks[s] : NULL, &kv[s]) < 0) return -1;
  if (N > 1) return time_batch(fd, kv, N, o->decode_tokens, any ? picks : NULL);
  return t == 1 ? time_decode(fd, kv[0], o->decode_tokens, any ? picks[0] : NULL)
                : time_verify(fd, kv[0], o->decode_tokens, t, any ? picks[0] : NULL);
}

/* Median seconds of o->decode_tokens steps of t tokens (1: decode; more: verification) after a
 * prefill of ctx tokens (of each of o->batch sequences), over o->reps runs after o->warmup; -1
 * on failure. *probe: the best probe pass taken around the measured runs (0 where the backend
 * has none). */
static double time_steps(const lm_model *m, const lm_kv_spec *specs, lm_backend *be,
                         const bench_opts *o, const int32_t *ids, int64_t ctx, int t,
                         lm_cli_progress *prog, int *runs, double *probe) {
  int N = o->batch;
  lm_forward *fp = NULL, *fd = NULL;
  lm_kv_set **kv = calloc((size_t)N, sizeof *kv);
  lm_lora_pick(*picks)[LM_LORA_PICKS] = malloc((size_t)N * sizeof *picks);
  if (!kv || !picks || bench_forward(m, be, o, ctx, 1, &fp) ||
      bench_forward(m, be, o, N > 1 ? N : t, N > 1 ? N : t, &fd)) {
    lm_forward_free(fp);
    free(kv), free(picks);
    return -1;
  }
  for (int s = 0; s < N; s++)
    seq_picks(o, s, picks[s]);
  double v[o->reps];
  int bad = 0;
  *probe = 0;
  for (int r = 0; r < o->warmup + o->reps && !bad; r++) {
    double before = r >= o->warmup ? probe_now(be, o) : 0;
    double dt = run_steps(m, specs, be, o, fp, fd, ids, ctx, t, picks, kv);
    bad = dt < 0;
    if (!bad && r >= o->warmup) {
      double after = probe_now(be, o), best = before > after ? before : after;
      *probe = best > *probe ? best : *probe;
      v[r - o->warmup] = dt;
    }
    for (int s = 0; s < N; s++)
      lm_kv_set_free(kv[s]), kv[s] = NULL;
    lm_cli_progress_update(prog, ++*runs);
  }
  lm_forward_free(fp);
  lm_forward_free(fd);
  free(kv), free(picks);
  lm_cli_progress_clear(prog);
  return bad ? -1 : median(v, o->reps);
}

/* ---- --state-tokens: KV state save/restore ------------------------------------------------ */

/* Logits of one more token (id 3) after kv, into out [vocab]. */
static lm_status next_logits(lm_forward *f, lm_kv_set *kv, float *out) {
  int32_t id = 3;
  return lm_forward_feed(f, kv, &id, 1, 1, out);
}

/* Drops the file's pages from the page cache (clean after fsync), so the next read is cold. */
static void drop_pages(const char *path) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) return;
  (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  close(fd);
}

typedef struct state_result {
  double prefill_s, save_s, load_warm_s, load_cold_s, max_diff;
  int64_t file_bytes, kv_bytes;
} state_result;

/* Prefill, save, two restores and the continuation check; the state file lives in dir. */
static lm_status state_run(const lm_model *m, lm_backend *be, const int32_t *ids, int64_t n,
                           const char *path, state_result *r) {
  lm_kv_spec specs[m->cfg.n_caches + 1];
  lm_model_kv_specs(m, specs);
  int64_t chunk = n < 512 ? (n ? n : 1) : 512, V = m->cfg.vocab_size;
  uint8_t fp[LM_FINGERPRINT_BYTES];
  lm_kv_set *kv = NULL, *back = NULL;
  lm_forward *fp_fwd = NULL, *f1 = NULL;
  int32_t *tok = NULL;
  int64_t nt = 0;
  float *la = malloc((size_t)V * sizeof(float)), *lb = malloc((size_t)V * sizeof(float));
  lm_status s = la && lb ? lm_model_fingerprint(m, fp) : LM_ERRF(LM_ERR_NOMEM, "out of memory");
  if (!s) s = lm_kv_set_create(be, specs, m->cfg.n_caches, &kv);
  if (!s) s = lm_forward_create(m, be, chunk, 1, &fp_fwd);
  if (!s) s = lm_forward_create(m, be, 1, 1, &f1);
  double t0 = lm_cli_now();
  if (!s) s = lm_forward_feed(fp_fwd, kv, ids, n, chunk, NULL);
  r->prefill_s = lm_cli_now() - t0;
  r->kv_bytes = kv ? lm_kv_set_bytes(kv) : 0;
  t0 = lm_cli_now();
  if (!s) s = lm_kv_state_save(path, fp, kv, ids, n);
  r->save_s = lm_cli_now() - t0;
  struct stat st;
  r->file_bytes = !s && !stat(path, &st) ? (int64_t)st.st_size : -1;
  for (int cold = 0; cold < 2 && !s; cold++) {
    if (cold) drop_pages(path);
    lm_kv_set_free(back);
    free(tok);
    back = NULL, tok = NULL;
    t0 = lm_cli_now();
    s = lm_kv_state_load(path, m, specs, be, &back, &tok, &nt);
    *(cold ? &r->load_cold_s : &r->load_warm_s) = lm_cli_now() - t0;
  }
  if (!s && (nt != n || (n && memcmp(tok, ids, (size_t)n * sizeof *ids))))
    s = LM_ERRF(LM_ERR_STATE, "restored token ids differ");
  if (!s) s = next_logits(f1, kv, la);
  if (!s) s = next_logits(f1, back, lb);
  r->max_diff = 0;
  for (int64_t v = 0; !s && v < V; v++) {
    double d = (double)la[v] - lb[v];
    d = d < 0 ? -d : d;
    r->max_diff = d > r->max_diff ? d : r->max_diff;
  }
  lm_forward_free(fp_fwd);
  lm_forward_free(f1);
  lm_kv_set_free(kv);
  lm_kv_set_free(back);
  free(tok), free(la), free(lb);
  return s;
}

static int bench_state(const lm_model *m, lm_backend *be, const bench_opts *o, const int32_t *ids) {
  const char *tmp = getenv("TMPDIR");
  char dir[4096], path[4200];
  snprintf(dir, sizeof dir, "%s/lumen-bench-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(dir)) {
    fprintf(stderr, "bench: cannot create a directory for the state file in %s\n",
            tmp && *tmp ? tmp : "/tmp");
    return 1;
  }
  snprintf(path, sizeof path, "%s/state.kvstate", dir);
  fprintf(stderr, "bench: prefilling %lld tokens for the state file...\n",
          (long long)o->state_tokens);
  state_result r = {0};
  lm_status s = state_run(m, be, ids, o->state_tokens, path, &r);
  unlink(path);
  rmdir(dir);
  if (s) {
    lm_cli_fail("state save/restore");
    return 1;
  }
  double gb = (double)r.file_bytes / 1e9;
  if (o->json)
    printf("{\"backend\":\"%s\",\"state\":{\"tokens\":%lld,\"prefill_s\":%.3f,\"kv_bytes\":%lld,"
           "\"file_bytes\":%lld,\"save_s\":%.4f,\"restore_warm_s\":%.4f,\"restore_cold_s\":%.4f,"
           "\"continuation_max_abs_diff\":%.3g}}\n",
           be->ops->name, (long long)o->state_tokens, r.prefill_s, (long long)r.kv_bytes,
           (long long)r.file_bytes, r.save_s, r.load_warm_s, r.load_cold_s, r.max_diff);
  else
    printf("state of %lld tokens on %s: prefill %.2f s (%.1f tok/s); KV %.1f MB, file %.1f MB\n"
           "save %.3f s (%.2f GB/s, fsync included); restore %.3f s warm (%.2f GB/s), %.3f s with "
           "the file's "
           "pages dropped (%.2f GB/s)\n"
           "restored set continues %s\n",
           (long long)o->state_tokens, be->ops->name, r.prefill_s,
           (double)o->state_tokens / r.prefill_s, (double)r.kv_bytes / 1e6,
           (double)r.file_bytes / 1e6, r.save_s, gb / r.save_s, r.load_warm_s, gb / r.load_warm_s,
           r.load_cold_s, gb / r.load_cold_s,
           r.max_diff == 0 ? "with identical logits" : "with DIFFERENT logits");
  if (r.max_diff != 0) fprintf(stderr, "bench: restored logits differ by up to %.3g\n", r.max_diff);
  return r.max_diff == 0 ? 0 : 1;
}

/* The backend's own read bandwidth (and copy bandwidth where it measures one), GB/s; spread:
 * the median and slowest of the CPU probe's passes (0 where the backend has no spread). */
static double backend_bandwidth(lm_backend *be, const bench_opts *o, double *copy, double spread[2],
                                char *info, size_t n) {
  *copy = 0;
  spread[0] = spread[1] = 0;
#ifdef LM_HAVE_CUDA
  if (!strcmp(be->ops->name, "cuda")) {
    lm_cuda_mem_report(be, info, n);
    *copy = lm_cuda_copy_bandwidth_gbs(be);
    return lm_cuda_read_bandwidth_gbs(be);
  }
#endif
  lm_cpu_kernels_info(info, n);
  lm_cpu_bw bw = lm_cpu_read_bandwidth(o->be.threads);
  spread[0] = bw.median;
  spread[1] = bw.worst;
  return bw.best;
}

int lm_cli_bench(int argc, char **argv) {
  bench_opts o;
  int pr = parse(argc, argv, &o), rc = 1;
  if (pr >= 0) return pr;
  int32_t *plist = NULL, *clist = NULL, *ids = NULL;
  lm_kv_spec *specs = NULL; /* the cache plan (--kv-quant) */
  json_t **vj = NULL;       /* --verify-tokens with --json: one object per context */
  int64_t np = 0, nc = 0;
  if (lm_cli_parse_ids(o.prompt, &plist, &np) || lm_cli_parse_ids(o.context, &clist, &nc)) return 2;
  lm_model *m = NULL;
  lm_backend *be = NULL;
  double t0 = lm_cli_now();
  if (o.preset) {
    fprintf(stderr, "bench: building a synthetic %s model (%s, seed %llu)...\n", o.preset,
            o.bits ? "affine" : "bf16", (unsigned long long)o.seed);
    if (lm_model_synth(o.preset, o.bits, o.group, o.seed, &m)) {
      lm_cli_fail("synthetic model");
      goto done;
    }
  } else if (!(m = lm_cli_load_model(o.model))) {
    goto done;
  }
  fprintf(stderr, "bench: model ready in %.1f s: %.2f B parameters, %.2f GB of weights\n",
          lm_cli_now() - t0, (double)m->n_params / 1e9, (double)m->weight_bytes / 1e9);
  if (lm_cli_adapters_load(&o.ad, m)) goto done;
  for (int k = 0; k < o.n_synth; k++) {
    if (lm_lora_synth(m, o.adapter_rank, o.seed + (uint64_t)k, &o.synth[k])) {
      lm_cli_fail("--adapter-rank");
      goto done;
    }
    if (!k)
      fprintf(stderr, "bench: %d random rank-%d adapter%s on %d modules%s\n", o.n_synth,
              o.adapter_rank, o.n_synth > 1 ? "s" : "", o.synth[0]->n_mods,
              o.n_synth > 1 ? " (sequence i runs adapter i mod K)" : "");
  }
  if (o.save_adapter) {
    if (lm_lora_save_peft(o.synth[0], o.save_adapter, LM_DT_BF16)) {
      lm_cli_fail("--save-adapter");
      goto done;
    }
    fprintf(stderr, "bench: adapter written to %s\n", o.save_adapter);
    rc = 0;
    goto done;
  }
  if (!(be = lm_cli_backend(&o.be, LM_PRECISION_FAST))) goto done;
  t0 = lm_cli_now();
  if (lm_cli_prepare(m, be)) { /* device backends upload the weights once */
    lm_cli_fail("preparing the weights");
    goto done;
  }
  fprintf(stderr, "bench: weights prepared for %s in %.1f s\n", be->ops->name, lm_cli_now() - t0);
  char isa[512];
  fprintf(stderr, "bench: measuring the memory read bandwidth...\n");
  double copy_bw, spread[2], bw = backend_bandwidth(be, &o, &copy_bw, spread, isa, sizeof isa);
  int64_t maxlen = 1;
  for (int64_t i = 0; i < np; i++)
    maxlen = plist[i] > maxlen ? plist[i] : maxlen;
  for (int64_t i = 0; i < nc; i++)
    maxlen = clist[i] > maxlen ? clist[i] : maxlen;
  if (o.state_tokens > maxlen) maxlen = o.state_tokens;
  if (!(ids = malloc((size_t)(maxlen + 1) * sizeof *ids))) goto done;
  fill_ids(ids, maxlen, m->cfg.vocab_size, o.seed);
  if (o.state_tokens) {
    rc = bench_state(m, be, &o, ids);
    goto done;
  }
  if (!(specs = calloc((size_t)m->cfg.n_caches + 1, sizeof *specs)) ||
      lm_model_kv_plan(m, &o.kv, specs)) {
    lm_cli_fail("--kv-quant");
    goto done;
  }
  if (o.json)
    printf("{\"backend\":\"%s\",\"kernels\":\"%s\",\"read_bandwidth_gbs\":%.2f,"
           "\"read_bandwidth_median_gbs\":%.2f,\"read_bandwidth_slowest_gbs\":%.2f,"
           "\"copy_bandwidth_gbs\":%.2f,\"params\":%lld,\"weight_bytes\":%lld,\"prefill\":[",
           be->ops->name, isa, bw, spread[0], spread[1], copy_bw, (long long)m->n_params,
           (long long)m->weight_bytes);
  else
    printf("backend %s (%s), measured read bandwidth %.1f GB/s\nmodel: %lld parameters, %lld "
           "weight bytes\n",
           be->ops->name, isa, bw, (long long)m->n_params, (long long)m->weight_bytes);
  if (!o.json && spread[1] > 0)
    printf("read bandwidth: best pass %.1f GB/s, median %.1f, slowest %.1f (spread %.0f%%)\n", bw,
           spread[0], spread[1], 100.0 * (bw - spread[1]) / bw);
  if (!o.json && copy_bw > 0) printf("measured copy bandwidth %.1f GB/s (read + write)\n", copy_bw);
  fflush(stdout);
  lm_cli_progress prog;
  int runs = 0;
  lm_cli_progress_start(&prog, "bench",
                        (double)(np + nc * (o.verify ? 2 : 1)) * (o.warmup + o.reps), "runs");
  for (int64_t i = 0; i < np; i++) {
    lm_forward *f = NULL;
    if (plist[i] < 1 || bench_forward(m, be, &o, plist[i], 1, &f)) {
      lm_cli_fail("prefill workspace");
      goto done;
    }
    double v[o.reps];
    for (int r = 0; r < o.warmup + o.reps; r++) {
      lm_lora_pick pk[LM_LORA_PICKS];
      double dt = time_prefill(m, specs, be, f, ids, plist[i], seq_picks(&o, 0, pk), NULL);
      if (dt < 0) {
        lm_forward_free(f);
        lm_cli_fail("prefill");
        goto done;
      }
      if (r >= o.warmup) v[r - o.warmup] = dt;
      lm_cli_progress_update(&prog, ++runs);
    }
    lm_forward_free(f);
    lm_cli_progress_clear(&prog);
    double med = median(v, o.reps);
    if (o.json)
      printf("%s{\"tokens\":%d,\"seconds\":%.6f,\"tok_s\":%.2f}", i ? "," : "", plist[i], med,
             plist[i] / med);
    else
      printf("prefill %6d tokens: %9.2f tok/s (%.3f s)\n", plist[i], plist[i] / med, med);
    fflush(stdout);
  }
  printf(o.json ? "],\"decode\":[" : "");
  if (!(vj = calloc((size_t)(nc ? nc : 1), sizeof *vj))) {
    lm_cli_fail("out of memory");
    goto done;
  }
  for (int64_t i = 0; i < nc; i++) {
    int64_t ctx = clist[i] > 0 ? clist[i] : 1;
    double near = 0, near_v = 0;
    double med = time_steps(m, specs, be, &o, ids, ctx, 1, &prog, &runs, &near), ver = 0;
    if (med > 0 && o.verify)
      ver = time_steps(m, specs, be, &o, ids, ctx, 1 + o.verify, &prog, &runs, &near_v);
    if (med < 0 || ver < 0) {
      lm_cli_fail("decode");
      goto done;
    }
    if (o.batch > 1) { /* aggregate over the streams; the weights are read once a step */
      double agg = (double)o.batch * (double)o.decode_tokens / med;
      if (o.json)
        printf("%s{\"context\":%lld,\"batch\":%d,\"tokens\":%lld,\"tok_s\":%.2f,\"step_ms\":%.3f}",
               i ? "," : "", (long long)ctx, o.batch, (long long)o.decode_tokens, agg,
               1e3 * med / (double)o.decode_tokens);
      else
        printf("decode %d sequences at %6lld context: %9.2f tok/s aggregate (%.3f ms a step)\n",
               o.batch, (long long)ctx, agg, 1e3 * med / (double)o.decode_tokens);
      fflush(stdout);
      continue;
    }
    double tps = (double)o.decode_tokens / med;
    double bytes = decode_bytes(m, specs, ctx + o.decode_tokens / 2, be->act_dtype),
           gbs = bytes * tps / 1e9;
    double ref = near > 0 ? near : bw; /* the bandwidth of the runs' own moments */
    if (o.json)
      printf("%s{\"context\":%lld,\"tokens\":%lld,\"tok_s\":%.2f,\"bytes_per_token\":%.0f,\"gb_s\":"
             "%.2f,\"bandwidth_pct\":%.1f,\"probe_around_runs_gbs\":%.2f,"
             "\"first_probe_pct\":%.1f}",
             i ? "," : "", (long long)ctx, (long long)o.decode_tokens, tps, bytes, gbs,
             100.0 * gbs / ref, near, 100.0 * gbs / bw);
    else if (near > 0)
      printf("decode at %6lld context: %8.2f tok/s, %.1f MB/token, %.1f GB/s = %.0f%% of the "
             "bandwidth measured around its runs (best pass %.1f GB/s; %.0f%% of the first "
             "probe)\n",
             (long long)ctx, tps, bytes / 1e6, gbs, 100.0 * gbs / ref, near, 100.0 * gbs / bw);
    else
      printf("decode at %6lld context: %8.2f tok/s, %.1f MB/token, %.1f GB/s = %.0f%% of measured "
             "bandwidth\n",
             (long long)ctx, tps, bytes / 1e6, gbs, 100.0 * gbs / bw);
    if (o.verify && !o.json)
      printf("verify 1+%d at %6lld context: %8.3f ms a step = %.2f one-token steps (%.3f ms)\n",
             o.verify, (long long)ctx, 1e3 * ver / (double)o.decode_tokens, ver / med,
             1e3 * med / (double)o.decode_tokens);
    if (o.verify && o.json) /* printed after the decode array */
      vj[i] = json_pack("{s:I,s:i,s:f,s:f,s:f}", "context", (json_int_t)ctx, "step_tokens",
                        1 + o.verify, "step_ms", 1e3 * ver / (double)o.decode_tokens,
                        "one_token_step_ms", 1e3 * med / (double)o.decode_tokens, "cost_in_steps",
                        ver / med);
    fflush(stdout);
  }
  lm_cli_progress_end(&prog);
  if (o.json && o.verify) {
    printf("],\"verify\":[");
    for (int64_t i = 0; i < nc; i++) {
      char *t = json_dumps(vj[i], JSON_COMPACT);
      printf("%s%s", i ? "," : "", t ? t : "{}");
      free(t);
    }
  }
  printf(o.json ? "]}\n" : "");
  if (!strcmp(be->ops->name, "cpu")) {
    lm_cpu_team_stats ts = lm_cpu_team_stats_of(be);
    fprintf(stderr,
            "bench: cpu decode steps: %lld as one region, %lld of them on one thread (%.1f ms a "
            "step on one thread, %.1f on the whole team)\n",
            (long long)ts.steps, (long long)ts.one_steps, 1e3 * ts.sec_one, 1e3 * ts.sec_all);
  }
#ifdef LM_HAVE_CUDA
  if (!strcmp(be->ops->name, "cuda")) {
    int64_t uses, builds;
    lm_cuda_plan_stats(be, &uses, &builds);
    const char *why = lm_cuda_plan_error(be);
    fprintf(stderr, "bench: cuda plans: %lld graph launches, %lld captures%s%s\n", (long long)uses,
            (long long)builds, *why ? "; last capture refused: " : "", why);
  }
#endif
  rc = 0;
done:
  for (int64_t i = 0; vj && i < nc; i++)
    json_decref(vj[i]);
  free(vj);
  free(specs);
  lm_cli_adapters_free(&o.ad); /* before the backend: their copies are its memory */
  for (int k = 0; k < o.n_synth; k++)
    lm_lora_free(o.synth[k]);
  lm_backend_destroy(be);
  lm_model_free(m);
  free(ids);
  free(plist);
  free(clist);
  return rc;
}
