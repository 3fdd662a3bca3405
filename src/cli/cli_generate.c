/* cli_generate.c — `lumen generate`: greedy continuation of a prompt given as token ids
 * (ids in, ids out; `lumen run` does text), as one request of the engine (lumen.h). A model
 * directory without a tokenizer works. */
#include <getopt.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/cli_adapter.h"
#include "cli/cli_args.h"
#include "cli/cli_common.h"
#include "cli/cli_spec.h"
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
    "  --json           print {\"ids\": [...], \"rounds\": [...]}: with --spec, each step's "
    "drafts\n"
    "                   and how many of them were accepted ({\"drafted\": [...], \"accepted\": "
    "K})\n"
    "  --json-schema FILE  the continuation is JSON that validates against this JSON Schema\n"
    "  --grammar FILE      the continuation follows this GBNF grammar; with either one the ids\n"
    "                   stop early when the grammar allows nothing more\n"
    "  --kv-quant MODE  KV caches: off (default), 4, 8, config (the checkpoint's\n"
    "                   kv_config.json) or turboquant[:K:V] (full-attention layers);\n"
    "                   --kv-group G (64); --kv-config FILE;\n"
    "                   --kv-quant-start N (quantized caches stay plain until N tokens)\n"
    "  --backend B      cpu (default); --precision f32|fast|bf16 (default f32); --threads N\n"
    "  --adapter DIR[@W] apply the LoRA adapter in DIR (PEFT or mlx-lm) with weight W (1);\n"
    "                   repeat to stack several\n";

/* What one generation prints: the ids, and per step its drafts and the tokens it gave. */
typedef struct gen_out {
  int json;
  int64_t k; /* ids printed */
  json_t *rounds;
  int32_t drafted[LM_SPEC_MAX_TOKENS];
  int n_drafted, matched, open, agreeing; /* the step being read */
} gen_out;

/* Closes the step being read: its drafts and how many the model accepted (the leading drafts
 * its tokens match; the token after them is the model's own). */
static void close_round(gen_out *g) {
  if (!g->open) return;
  json_t *d = json_array();
  for (int i = 0; i < g->n_drafted; i++)
    json_array_append_new(d, json_integer(g->drafted[i]));
  json_array_append_new(g->rounds, json_pack("{s:o,s:i}", "drafted", d, "accepted", g->matched));
  g->open = 0;
}

static void take_token(gen_out *g, const lm_event *ev) {
  if (ev->round_start) {
    close_round(g);
    g->open = 1;
    g->n_drafted = ev->n_drafted;
    memcpy(g->drafted, ev->drafted, sizeof g->drafted);
    g->matched = 0;
    g->agreeing = 1;
  }
  if (g->open && g->agreeing) {
    if (g->matched < g->n_drafted && ev->token == g->drafted[g->matched])
      g->matched++;
    else
      g->agreeing = 0;
  }
  if (g->json)
    printf("%s%d", g->k ? ", " : "", ev->token);
  else
    printf("%s%d", g->k ? "," : "", ev->token);
  g->k++;
}

/* Streams the greedy ids of one request as a JSON array (or object, --json). */
static int generate(lm_engine *e, const int32_t *ids, int64_t T, int64_t n, const char *grammar,
                    const char *schema, const lm_cli_spec *spec, int json) {
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
  ro.speculative = spec->source;
  lm_request *r = NULL;
  if (lm_request_submit(e, &ro, &r)) return lm_cli_fail(NULL);
  lm_event ev;
  gen_out g = {.json = json, .rounds = json_array()};
  printf(json ? "{\"ids\": [" : "[");
  while (!lm_request_next(r, -1, &ev) && ev.kind != LM_EVENT_DONE)
    if (ev.kind == LM_EVENT_TOKEN) take_token(&g, &ev);
  close_round(&g);
  if (json) {
    char *rounds = json_dumps(g.rounds, JSON_COMPACT);
    printf("], \"rounds\": %s}\n", rounds ? rounds : "[]");
    free(rounds);
  } else {
    printf("]\n");
  }
  json_decref(g.rounds);
  int rc = 0;
  if (ev.kind != LM_EVENT_DONE || ev.finish == LM_FIN_ERROR)
    rc = (fprintf(stderr, "lumen: %s\n", ev.kind == LM_EVENT_DONE ? ev.error : lm_errmsg()), 1);
  const lm_usage *u = &ev.usage;
  int64_t later = g.k > 1 ? g.k - 1 : 0; /* the first id comes with the prompt's step */
  if (!rc) {
    fprintf(stderr, "prefill %lld tokens %.1f tok/s, decode %lld tokens %.1f tok/s", (long long)T,
            u->prefill_s > 0 ? (double)T / u->prefill_s : 0.0, (long long)g.k,
            u->decode_s > 0 ? (double)later / u->decode_s : 0.0);
    if (spec->source)
      fprintf(stderr, ", drafts %lld/%lld accepted, %.2f tokens/step",
              (long long)u->accepted_tokens, (long long)u->drafted_tokens,
              u->decode_steps > 0 ? (double)later / (double)u->decode_steps : 0.0);
    fputc('\n', stderr);
  }
  lm_request_free(r);
  return rc;
}

enum { O_JSON = 0x100, O_SPEC, O_SPEC_TOKENS, O_KVQ, O_KVG, O_KVC, O_KVS, O_ADAPTER };

/* A count flag's value (>= lo), or -1 after printing why not. */
static int64_t count_arg(const char *flag, const char *arg, int64_t lo) {
  char *end;
  long long x = strtoll(arg, &end, 10);
  if (end == arg || *end || x < lo)
    return fprintf(stderr, "lumen generate: %s: '%s' is not a count >= %lld\n", flag, arg,
                   (long long)lo),
           -1;
  return x;
}

int lm_cli_generate(int argc, char **argv) {
  static const struct option lo[] = {{"ids", 1, 0, 'i'},
                                     {"tokens", 1, 0, 'n'},
                                     {"backend", 1, 0, 'b'},
                                     {"precision", 1, 0, 'P'},
                                     {"threads", 1, 0, 't'},
                                     {"grammar", 1, 0, 'g'},
                                     {"json-schema", 1, 0, 'j'},
                                     {"json", 0, 0, O_JSON},
                                     {"spec", 1, 0, O_SPEC},
                                     {"spec-tokens", 1, 0, O_SPEC_TOKENS},
                                     {"kv-quant", 1, 0, O_KVQ},
                                     {"kv-group", 1, 0, O_KVG},
                                     {"kv-config", 1, 0, O_KVC},
                                     {"kv-quant-start", 1, 0, O_KVS},
                                     {"adapter", 1, 0, O_ADAPTER},
                                     {"help", 0, 0, 'h'},
                                     {0, 0, 0, 0}};
  const char *ids_s = NULL, *grammar_file = NULL, *schema_file = NULL;
  lm_cli_adapters ad = {0};
  int64_t n = 16;
  int json = 0;
  lm_cli_spec spec = {0};
  lm_cli_backend_opts bo = {0};
  lm_engine_options eo;
  lm_engine_options_init(&eo);
  int c;
  optind = 1;
  while ((c = getopt_long(argc, argv, ":hn:", lo, NULL)) != -1) {
    int64_t x = 0;
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
    case O_JSON: json = 1; break;
    case O_SPEC:
      if (lm_cli_spec_source(&spec, optarg)) return 2;
      break;
    case O_SPEC_TOKENS:
      if (lm_cli_spec_tokens(&spec, optarg)) return 2;
      break;
    case O_KVQ: eo.kv_quant = optarg; break;
    case O_KVG:
      if ((x = count_arg("--kv-group", optarg, 1)) < 0) return 2;
      eo.kv_group = (int)x;
      break;
    case O_KVC: eo.kv_config = optarg; break;
    case O_KVS:
      if ((x = count_arg("--kv-quant-start", optarg, 0)) < 0) return 2;
      eo.kv_quant_start = x;
      break;
    case O_ADAPTER:
      if (lm_cli_adapters_add(&ad, optarg)) return 2;
      break;
    case 'h':
      fputs(generate_help, stdout);
      lm_cli_spec_help(stdout);
      return 0;
    default: return lm_cli_flag_error(c, argc, argv, lo);
    }
  }
  if (n < 1) return fprintf(stderr, "lumen generate: -n must be at least 1\n"), 2;
  if (lm_cli_adapters_parse(&ad)) return 2;
  lm_cli_adapters_options(&ad, &eo);
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
  eo.backend = bo.backend;
  eo.precision = bo.precision ? bo.precision : "f32";
  eo.threads = bo.threads;
  eo.chunk = T; /* the prompt in one step */
  eo.kv_budget = -1;
  eo.prefix_cache = 0;
  eo.speculative_tokens = lm_cli_spec_engine_tokens(&spec);
  eo.draft_model = spec.draft;
  int rc = 1;
  if (lm_cli_checkpoint_open(argv[optind], &ck) || lm_engine_create(ck, &eo, &e))
    lm_cli_fail(NULL);
  else
    rc = generate(e, ids, T, n, grammar, schema, &spec, json);
  lm_engine_free(e);
  lm_checkpoint_free(ck);
  free(ids);
  free(grammar);
  free(schema);
  return rc;
}
