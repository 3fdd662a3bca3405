/* cli_quant_eval.c — `lumen quant-eval`: what a quantized checkpoint costs against the one it
 * came from, on given text: mean KL(reference ‖ model) of the next-token distributions, argmax
 * agreement, and each model's perplexity, teacher-forced on the same tokens. A measurement
 * program (docs/quant/RESULTS.md is made with it), not a test. */
#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "cli/cli.h"
#include "cli/cli_args.h"
#include "cli/cli_common.h"
#include "model/forward.h"
#include "model/logit_stats.h"

static const char *quant_eval_help =
    "usage: lumen quant-eval REF_DIR MODEL_DIR... (--text FILE | --ids-file FILE) [--tokens N]\n"
    "\n"
    "Teacher-forces the tokens of FILE (text: tokenized with REF_DIR's tokenizer, BOS first; ids:\n"
    "comma-separated) through REF_DIR and each MODEL_DIR on the cpu backend in f32, and prints\n"
    "per model the mean KL(REF || MODEL) over positions, the argmax agreement, its perplexity and\n"
    "its weight bytes. The models must share REF_DIR's vocabulary.\n"
    "  --tokens N     the first N tokens (default 1024; at most the models' context)\n"
    "  --chunk C      prefill chunk (default 256); --threads N\n";

/* Logits of ids through one model, [T][V]; NULL after printing the error. */
static float *model_logits(const char *dir, const int32_t *ids, int64_t T, int64_t C, int threads,
                           int64_t *Vp, int64_t *wbytes) {
  lm_model *m = lm_cli_load_model(dir);
  if (!m) return NULL;
  if (!*Vp) *Vp = m->cfg.vocab_size; /* the reference sets it */
  int64_t V = *Vp;
  if (m->cfg.vocab_size != V) {
    fprintf(stderr, "lumen quant-eval: %s has %lld tokens in its vocabulary, the reference %lld\n",
            dir, (long long)m->cfg.vocab_size, (long long)V);
    lm_model_free(m);
    return NULL;
  }
  lm_cli_backend_opts bo = {.backend = "cpu", .threads = threads};
  lm_backend *be = lm_cli_backend(&bo, LM_PRECISION_F32);
  lm_kv_spec specs[m->cfg.n_caches + 1];
  lm_model_kv_specs(m, specs);
  lm_kv_set *kv = NULL;
  lm_forward *f = NULL;
  float *out = be ? malloc((size_t)(T * V) * sizeof(float)) : NULL;
  lm_status s = out ? LM_OK : LM_ERRF(LM_ERR_NOMEM, "out of memory");
  if (!s) s = lm_kv_set_create(be, specs, m->cfg.n_caches, &kv);
  if (!s) s = lm_forward_create(m, be, C, C, &f);
  if (!s) s = lm_forward_feed(f, kv, ids, T, C, out);
  *wbytes = m->weight_bytes;
  lm_forward_free(f);
  lm_kv_set_free(kv);
  lm_backend_destroy(be);
  lm_model_free(m);
  if (s && be) fprintf(stderr, "lumen quant-eval: %s: %s\n", dir, lm_errmsg());
  if (s) free(out);
  return s ? NULL : out;
}

static int read_tokens(const char *ref, const char *text, const char *idsf, int32_t **ids,
                       int64_t *n) {
  char *buf;
  if (lm_cli_read_text(text ? "--text" : "--ids-file", text ? text : idsf, &buf)) return 1;
  int rc =
      idsf ? lm_cli_parse_ids(buf, ids, n) : lm_cli_encode_text("quant-eval", ref, buf, ids, n);
  free(buf);
  return rc;
}

int lm_cli_quant_eval(int argc, char **argv) {
  static const struct option lo[] = {
      {"text", 1, 0, 'x'},    {"ids-file", 1, 0, 'i'}, {"tokens", 1, 0, 'n'}, {"chunk", 1, 0, 'c'},
      {"threads", 1, 0, 't'}, {"help", 0, 0, 'h'},     {0, 0, 0, 0}};
  const char *text = NULL, *idsf = NULL;
  int64_t N = 1024, C = 256;
  int threads = 0, c;
  optind = 1;
  while ((c = getopt_long(argc, argv, ":h", lo, NULL)) != -1) {
    switch (c) {
    case 'x': text = optarg; break;
    case 'i': idsf = optarg; break;
    case 'n': N = atoll(optarg); break;
    case 'c': C = atoll(optarg); break;
    case 't': threads = atoi(optarg); break;
    case 'h': return fputs(quant_eval_help, stdout), 0;
    default: return lm_cli_flag_error(c, argc, argv, lo);
    }
  }
  if (argc - optind < 2 || !text == !idsf || N < 2 || C < 1)
    return fputs(quant_eval_help, stderr), 2;
  const char *ref = argv[optind];
  char refdir[4096];
  if (lm_cli_model_dir(ref, refdir, sizeof refdir))
    return fprintf(stderr, "lumen quant-eval: %s\n", lm_errmsg()), 1;
  int32_t *ids = NULL;
  int64_t T = 0;
  if (read_tokens(refdir, text, idsf, &ids, &T)) return 1;
  if (T > N) T = N;
  if (T < 2) return free(ids), fprintf(stderr, "lumen quant-eval: fewer than 2 tokens\n"), 1;
  int64_t V = 0, wb = 0;
  for (int64_t i = 0; i < T; i++)
    if (ids[i] < 0) return free(ids), fprintf(stderr, "lumen quant-eval: a negative id\n"), 1;
  float *rl = model_logits(ref, ids, T, C, threads, &V, &wb);
  int rc = rl ? 0 : 1;
  if (rl) {
    printf("%lld tokens; KL(ref || model) over %lld next-token predictions\n", (long long)T,
           (long long)(T - 1));
    printf("%-40s %12s %10s %10s %14s\n", "model", "mean KL", "argmax", "perplexity",
           "weight bytes");
    printf("%-40s %12s %10s %10.4f %14lld\n", ref, "(reference)", "-",
           exp(lm_logits_nll(rl, ids + 1, T - 1, V)), (long long)wb);
    fflush(stdout);
  }
  for (int i = optind + 1; rl && i < argc; i++) {
    float *ml = model_logits(argv[i], ids, T, C, threads, &V, &wb);
    if (!ml) {
      rc = 1;
      continue;
    }
    double kl;
    int64_t agree;
    lm_logits_kl(rl, ml, T - 1, V, &kl, &agree);
    printf("%-40s %12.5g %4lld/%-5lld %10.4f %14lld\n", argv[i], kl, (long long)agree,
           (long long)(T - 1), exp(lm_logits_nll(ml, ids + 1, T - 1, V)), (long long)wb);
    fflush(stdout);
    free(ml);
  }
  free(rl);
  free(ids);
  return rc;
}
