/* cli_generate.c — `lumen generate`: greedy continuation of a prompt given as token ids
 * (ids in, ids out; `lumen run` does text), as one request of the engine (lumen.h). A model
 * directory without a tokenizer works. */
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/cli_args.h"
#include "cli/cli_common.h"
#include "lumen.h"

static const char *generate_help =
    "usage: lumen generate MODEL_DIR --ids 2,17,... [-n N] [options]\n"
    "       (MODEL_DIR may be ORG/REPO[@REV]: a model in the Hugging Face cache, see `lumen get`)\n"
    "\n"
    "Greedy continuation of the prompt ids: prints the N generated ids as a JSON array and a\n"
    "timing line on stderr. Does not stop at EOS (use `lumen run` for text).\n"
    "\n"
    "  --ids LIST       prompt token ids (required)\n"
    "  -n, --tokens N   tokens to generate (default 16)\n"
    "  --json-schema FILE  the continuation is JSON that validates against this JSON Schema\n"
    "  --grammar FILE      the continuation follows this GBNF grammar; with either one the ids\n"
    "                   stop early when the grammar allows nothing more\n"
    "  --backend B      cpu (default); --precision f32|fast|bf16 (default f32); --threads N\n";

/* Streams the greedy ids of one request as a JSON array. */
static int generate(lm_engine *e, const int32_t *ids, int64_t T, int64_t n, const char *grammar,
                    const char *schema) {
  lm_request_options ro;
  lm_request_options_init(&ro);
  ro.grammar = grammar;
  ro.json_schema = schema;
  ro.ids = ids;
  ro.n_ids = T;
  ro.sampling.temperature = 0;
  ro.has_seed = 1;
  ro.max_tokens = n;
  ro.ignore_eos = 1;
  lm_request *r = NULL;
  if (lm_request_submit(e, &ro, &r)) return lm_cli_fail(NULL);
  lm_event ev;
  int64_t k = 0;
  printf("[");
  while (!lm_request_next(r, -1, &ev) && ev.kind != LM_EVENT_DONE)
    if (ev.kind == LM_EVENT_TOKEN) printf("%s%d", k++ ? "," : "", ev.token);
  printf("]\n");
  int rc = 0;
  if (ev.kind != LM_EVENT_DONE || ev.finish == LM_FIN_ERROR)
    rc = (fprintf(stderr, "lumen: %s\n", ev.kind == LM_EVENT_DONE ? ev.error : lm_errmsg()), 1);
  const lm_usage *u = &ev.usage;
  if (!rc)
    fprintf(stderr, "prefill %lld tokens %.1f tok/s, decode %lld tokens %.1f tok/s\n", (long long)T,
            u->prefill_s > 0 ? (double)T / u->prefill_s : 0.0, (long long)k,
            u->decode_s > 0 ? (double)u->decode_steps / u->decode_s : 0.0);
  lm_request_free(r);
  return rc;
}

int lm_cli_generate(int argc, char **argv) {
  static const struct option lo[] = {
      {"ids", 1, 0, 'i'},         {"tokens", 1, 0, 'n'},  {"backend", 1, 0, 'b'},
      {"precision", 1, 0, 'P'},   {"threads", 1, 0, 't'}, {"grammar", 1, 0, 'g'},
      {"json-schema", 1, 0, 'j'}, {"help", 0, 0, 'h'},    {0, 0, 0, 0}};
  const char *ids_s = NULL, *grammar_file = NULL, *schema_file = NULL;
  int64_t n = 16;
  lm_cli_backend_opts bo = {0};
  int c;
  optind = 1;
  while ((c = getopt_long(argc, argv, ":hn:", lo, NULL)) != -1) {
    switch (c) {
    case 'i': ids_s = optarg; break;
    case 'n':
      if (lm_cli_attached_word(argc, argv, optarg)) return 2;
      n = atoll(optarg);
      break;
    case 'b': bo.backend = optarg; break;
    case 'P': bo.precision = optarg; break;
    case 't': bo.threads = atoi(optarg); break;
    case 'g': grammar_file = optarg; break;
    case 'j': schema_file = optarg; break;
    case 'h': fputs(generate_help, stdout); return 0;
    default: return lm_cli_flag_error(c, argc, argv, lo);
    }
  }
  if (n < 1) return fprintf(stderr, "lumen generate: -n must be at least 1\n"), 2;
  if (optind != argc - 1 || !ids_s) return fputs(generate_help, stderr), 2;
  if (grammar_file && schema_file)
    return fprintf(stderr, "lumen generate: --grammar and --json-schema cannot be used together\n"),
           2;
  char *grammar = NULL, *schema = NULL;
  if ((grammar_file && lm_cli_read_text("--grammar", grammar_file, &grammar)) ||
      (schema_file && lm_cli_read_text("--json-schema", schema_file, &schema))) {
    free(grammar);
    return 1;
  }
  int32_t *ids;
  int64_t T;
  if (lm_cli_parse_ids(ids_s, &ids, &T)) {
    free(grammar);
    free(schema);
    return 1;
  }
  lm_checkpoint *ck = NULL;
  lm_engine *e = NULL;
  lm_engine_options eo;
  lm_engine_options_init(&eo);
  eo.backend = bo.backend;
  eo.precision = bo.precision ? bo.precision : "f32";
  eo.threads = bo.threads;
  eo.chunk = T; /* the prompt in one step */
  eo.kv_budget = -1;
  eo.prefix_cache = 0;
  int rc = 1;
  if (lm_cli_checkpoint_open(argv[optind], &ck) || lm_engine_create(ck, &eo, &e))
    lm_cli_fail(NULL);
  else
    rc = generate(e, ids, T, n, grammar, schema);
  lm_engine_free(e);
  lm_checkpoint_free(ck);
  free(ids);
  free(grammar);
  free(schema);
  return rc;
}
