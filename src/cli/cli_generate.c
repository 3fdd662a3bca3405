/* cli_generate.c — `lumen generate`: greedy continuation of a prompt given as token ids
 * (ids in, ids out; `lumen run` does text). Prefills the prompt, then decodes N tokens. */
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "cli/cli.h"
#include "cli/cli_common.h"
#include "model/forward.h"

static const char *generate_help =
    "usage: lumen generate MODEL_DIR --ids 2,17,... [-n N] [options]\n"
    "\n"
    "Greedy continuation of the prompt ids: prints the N generated ids as a JSON array and a\n"
    "timing line on stderr. Does not stop at EOS (use `lumen run` for text).\n"
    "\n"
    "  --ids LIST       prompt token ids (required)\n"
    "  -n, --tokens N   tokens to generate (default 16)\n"
    "  --backend B      cpu (default); --precision f32|fast|bf16 (default f32); --threads N\n";

static int64_t argmax(const float *x, int64_t n) {
  int64_t b = 0;
  for (int64_t i = 1; i < n; i++)
    b = x[i] > x[b] ? i : b;
  return b;
}

static int generate(lm_model *m, lm_backend *be, const int32_t *ids, int64_t T, int64_t n) {
  int64_t V = m->cfg.vocab_size;
  lm_kv_spec specs[m->cfg.n_caches + 1];
  lm_model_kv_specs(m, specs);
  lm_kv_set *kv = NULL;
  lm_forward *fp = NULL, *fd = NULL;
  float *logits = malloc((size_t)T * (size_t)V * sizeof(float));
  int rc = 1;
  if (!logits || lm_kv_set_create(be, specs, m->cfg.n_caches, &kv) ||
      lm_forward_create(m, be, T, T, &fp) || lm_forward_create(m, be, 1, 1, &fd)) {
    lm_cli_fail(NULL);
    goto done;
  }
  double t0 = lm_cli_now();
  if (lm_forward_feed(fp, kv, ids, T, T, logits)) {
    lm_cli_fail("prefill");
    goto done;
  }
  double t1 = lm_cli_now();
  int32_t next = (int32_t)argmax(logits + (T - 1) * V, V);
  printf("[");
  for (int64_t i = 0; i < n; i++) {
    printf("%s%d", i ? "," : "", next);
    if (i + 1 < n) {
      if (lm_forward_feed(fd, kv, &next, 1, 1, logits)) {
        lm_cli_fail("decode");
        goto done;
      }
      next = (int32_t)argmax(logits, V);
    }
  }
  printf("]\n");
  double t2 = lm_cli_now();
  fprintf(stderr, "prefill %lld tokens %.1f tok/s, decode %lld tokens %.1f tok/s\n", (long long)T,
          T / (t1 - t0), (long long)n, n > 1 ? (n - 1) / (t2 - t1) : 0.0);
  rc = 0;
done:
  lm_forward_free(fp);
  lm_forward_free(fd);
  lm_kv_set_free(kv);
  free(logits);
  return rc;
}

int lm_cli_generate(int argc, char **argv) {
  static const struct option lo[] = {{"ids", 1, 0, 'i'},
                                     {"tokens", 1, 0, 'n'},
                                     {"backend", 1, 0, 'b'},
                                     {"precision", 1, 0, 'P'},
                                     {"threads", 1, 0, 't'},
                                     {"help", 0, 0, 'h'},
                                     {0, 0, 0, 0}};
  const char *ids_s = NULL;
  int64_t n = 16;
  lm_cli_backend_opts bo = {0};
  int c;
  optind = 1;
  while ((c = getopt_long(argc, argv, "hn:", lo, NULL)) != -1) {
    switch (c) {
    case 'i': ids_s = optarg; break;
    case 'n': n = atoll(optarg); break;
    case 'b': bo.backend = optarg; break;
    case 'P': bo.precision = optarg; break;
    case 't': bo.threads = atoi(optarg); break;
    case 'h': fputs(generate_help, stdout); return 0;
    default: fputs(generate_help, stderr); return 2;
    }
  }
  if (optind != argc - 1 || !ids_s || n < 1) return fputs(generate_help, stderr), 2;
  int32_t *ids;
  int64_t T;
  if (lm_cli_parse_ids(ids_s, &ids, &T)) return 1;
  lm_model *m = lm_cli_load_model(argv[optind]);
  lm_backend *be = m ? lm_cli_backend(&bo, LM_PRECISION_F32) : NULL;
  int rc = 1;
  if (be && lm_model_prepare(m, be)) { /* device backends upload the weights once */
    lm_cli_fail("prepare");
    lm_backend_destroy(be);
    be = NULL;
  }
  if (m && be) {
    for (int64_t i = 0; i < T; i++)
      if (ids[i] >= m->cfg.vocab_size) {
        fprintf(stderr, "lumen: --ids: id %d is outside the vocabulary (%lld)\n", ids[i],
                (long long)m->cfg.vocab_size);
        T = 0;
      }
    rc = T ? generate(m, be, ids, T, n) : 1;
  }
  lm_backend_destroy(be);
  lm_model_free(m);
  free(ids);
  return rc;
}
