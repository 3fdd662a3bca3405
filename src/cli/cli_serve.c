/* cli_serve.c — `lumen serve`: the OpenAI/Anthropic-compatible HTTP server over one checkpoint
 * (or a synthetic model of a real geometry, for benchmarks), until SIGINT or SIGTERM. */
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "cli/cli.h"
#include "cli/cli_adapter.h"
#include "cli/cli_args.h"
#include "cli/cli_progress.h"
#include "cli/cli_common.h"
#include "cli/cli_sampling.h"
#include "cli/cli_spec.h"
#include "io/file_util.h"
#include "server/server.h"

static const char *const usage =
    "usage: lumen serve [--model] MODEL_DIR [options]\n"
    "       (MODEL_DIR may be ORG/REPO[@REV]: a model in the Hugging Face cache, see `lumen get`)\n"
    "       lumen serve --preset FILE --tokenizer DIR [options]   (synthetic weights, for "
    "benchmarks)\n"
    "\n"
    "Serves MODEL_DIR over HTTP, OpenAI- and Anthropic-compatible (point any OpenAI client at\n"
    "http://HOST:PORT/v1), with a chat page for browsers at http://HOST:PORT/ (e.g.\n"
    "http://127.0.0.1:8080/):\n"
    "  GET  /                      the chat page: streaming, reasoning, tool calls, settings;\n"
    "                              conversations kept in the browser; loads nothing from "
    "elsewhere\n"
    "  POST /v1/chat/completions   chat (streamed with \"stream\": true), tools, reasoning, "
    "logprobs\n"
    "  POST /v1/completions        raw prompt, no chat template\n"
    "  POST /v1/responses          OpenAI Responses (input items, function calls, streamed "
    "events,\n"
    "                              previous_response_id over the last 1024 responses, 64 MiB,\n"
    "                              an hour; GET/DELETE /v1/responses/ID; store: false keeps one "
    "out)\n"
    "  POST /v1/messages           Anthropic Messages (tool_use / tool_result, thinking, SSE "
    "events)\n"
    "  POST /v1/messages/count_tokens   the prompt's tokens for a Messages body\n"
    "  POST /tokenize  /detokenize  /apply-template   llama.cpp's tokenizer and template "
    "endpoints\n"
    "  GET  /v1/models  /health  /stats (sequences, queue, prompt cache, KV use, cache plan)  "
    "/metrics (Prometheus)\n"
    "  POST /v1/adapters           {\"name\": N, \"path\": DIR} mounts a LoRA adapter (PEFT or "
    "mlx-lm);\n"
    "                              GET /v1/adapters lists them, DELETE /v1/adapters/N unmounts\n"
    "Chat and completions take n up to 16 (n answers, the prompt prefilled once). A request naming "
    "a model\n"
    "the server does not serve is answered 404 model_not_found; one naming none gets the served "
    "model.\n"
    "A request picks mounted adapters by \"adapter\": \"N\" (\"A+B\" stacks; or [\"A\", {\"name\": "
    "\"B\", \"weight\": 0.5}])\n"
    "or by the model id MODEL:N, which /v1/models lists; an unknown adapter is a 404.\n"
    "Structured output, enforced token by token: \"response_format\" json_object or json_schema\n"
    "(chat; Responses \"text.format\"; Anthropic \"output_format\"), \"grammar\" (GBNF, "
    "llama.cpp's notation; chat, "
    "completions,\n"
    "messages); tool calls name an offered tool with arguments that follow its schema, and\n"
    "tool_choice none / required / a named tool is held to (after any reasoning). An unsupported\n"
    "schema keyword is a 400 naming it.\n"
    "Requests share one continuously batched forward pass; a request whose prompt + max_tokens "
    "cannot fit\n"
    "the KV budget is refused with 400 (type memory_admission), a full queue with 429.\n"
    "\n"
    "Server:\n"
    "  --model DIR              checkpoint directory (or the first positional argument; alias -m)\n"
    "  --host H                 address to listen on (127.0.0.1)\n"
    "  --port P                 port (8080; 0 = any free port, printed at startup)\n"
    "  --parallel N             sequences decoded together in one batch (4; alias -np)\n"
    "  --ctx N                  context limit per sequence (the model's max_position_embeddings;\n"
    "                           alias -c, --ctx-size)\n"
    "  --chunk N                prompt tokens per step, interleaved with decoding (512; alias "
    "--prefill-step-size)\n"
    "  --memory-budget GB       memory for weights + workspace + KV caches (75% of RAM)\n"
    "  --queue-size N           requests waiting for a slot before 429 (64)\n"
    "  --prompt-cache N         finished sequences kept for prefix reuse (= --parallel; 0 = off;\n"
    "                           alias --prompt-cache-size)\n"
    "  --timeout S              per-request deadline in seconds (600; 0 = none)\n"
    "  --max-body BYTES         request body limit (8388608)\n"
    "  --api-key KEY            require 'Authorization: Bearer KEY' (or x-api-key) on every "
    "endpoint but /health\n"
    "                           and the chat page (which holds no data and asks for the key)\n"
    "                           (visible in ps: prefer --api-key-file FILE, its first line, or\n"
    "                           the LUMEN_API_KEY environment variable)\n"
    "  --model-id NAME          serve the model under NAME too (repeatable; alias --alias,\n"
    "                           --served-model-name): /v1/models lists every NAME, then the\n"
    "                           model's own name; the first is what responses report\n"
    "  --cors ORIGINS           let pages from ORIGINS call the API from a browser: '*' or a\n"
    "                           comma-separated list (https://app.example,http://localhost:3000);\n"
    "                           preflights answered, CORS headers on every response\n"
    "  --chat-template FILE     use this Jinja template (or a .json file's \"chat_template\")\n"
    "  --max-connections N      simultaneous HTTP connections (256); when full, the oldest one\n"
    "                           still sending its request is dropped for a newcomer; a request\n"
    "                           must arrive within 10 s of connecting (or of the last answer)\n"
    "  --log-requests           one line per request on stderr: method, path, status, prompt /\n"
    "                           cached / generated tokens, time (alias -v)\n"
    "  --no-webui               no chat page: GET / answers 404 (the API is unchanged)\n"
    "  --kv-quant MODE          KV cache precision: off (default), 4, 8, config "
    "(kv_config.json)\n"
    "                           or turboquant[:K:V] (full-attention layers; K 2/4/5/8, V 2-5)\n"
    "  --kv-group G             group size of --kv-quant 4/8 (64); --kv-config FILE for --kv-quant "
    "config\n"
    "  --adapter DIR[@W]        a LoRA adapter (PEFT or mlx-lm) on every request, weight W (1);\n"
    "                           repeat to stack several (a request's \"adapter\" replaces the "
    "set)\n"
    "  --backend B              cpu or cuda (default: cuda when a GPU is present); --precision "
    "f32|fast|bf16; --threads N\n"
    "  --preset FILE            synthetic model of this config.json-shaped geometry (with "
    "--tokenizer DIR;\n"
    "                           --bits B 0..8 (4), --weight-seed S)\n"
    "Request defaults (a request's own fields win; --max-tokens is the default max_tokens, 512):\n";

enum {
  O_MODEL = 1,
  O_HOST,
  O_PORT,
  O_PARALLEL,
  O_CTX,
  O_CHUNK,
  O_BUDGET,
  O_QUEUE,
  O_PCACHE,
  O_TIMEOUT,
  O_MAXBODY,
  O_KEY,
  O_ID,
  O_MAXCONN,
  O_LOG,
  O_KVQ,
  O_KVG,
  O_KVC,
  O_BACKEND,
  O_PREC,
  O_THREADS,
  O_PRESET,
  O_TOKENIZER,
  O_BITS,
  O_WSEED,
  O_KEYFILE,
  O_TEMPLATE,
  O_NOWEB,
  O_CORS,
  O_SPEC,
  O_SPEC_TOKENS,
  O_ADAPTER
};

#define MAX_IDS 16

typedef struct serve_opts {
  lm_server_opts so;
  lm_cli_sampling samp;
  const char *model, *preset, *tokenizer, *chat_template;
  const char *key_file;
  char *key;                /* read from key_file or LUMEN_API_KEY (owned) */
  const char *ids[MAX_IDS]; /* every --model-id (alias --served-model-name, --alias) */
  int n_ids;
  int bits;
  unsigned long long wseed;
  lm_cli_spec spec;
  lm_cli_adapters ad;
} serve_opts;

static int num(const char *flag, const char *arg, double lo, double hi, double *out) {
  char *end;
  double x = strtod(arg, &end);
  if (end == arg || *end || !(x >= lo && x <= hi)) {
    fprintf(stderr, "lumen serve: %s: '%s' must be a number in [%g, %g]\n", flag, arg, lo, hi);
    return 2;
  }
  *out = x;
  return 0;
}

static int int_opt(serve_opts *o, int c, const char *arg) {
  double x;
  switch (c) {
  case O_PORT: return num("--port", arg, 0, 65535, &x) ? 2 : (o->so.port = (int)x, 0);
  case O_PARALLEL: return num("--parallel", arg, 1, 4096, &x) ? 2 : (o->so.parallel = (int)x, 0);
  case O_CTX: return num("--ctx", arg, 2, 1 << 30, &x) ? 2 : (o->so.ctx = (int64_t)x, 0);
  case O_CHUNK: return num("--chunk", arg, 1, 1 << 20, &x) ? 2 : (o->so.chunk = (int64_t)x, 0);
  case O_BUDGET: return num("--memory-budget", arg, 1e-6, 1e6, &o->so.memory_budget_gb);
  case O_QUEUE:
    return num("--queue-size", arg, 1, 1 << 20, &x) ? 2 : (o->so.queue_size = (int)x, 0);
  case O_PCACHE:
    return num("--prompt-cache", arg, 0, 1 << 16, &x)
               ? 2
               : (o->so.prompt_cache = x > 0 ? (int)x : -1, 0);
  case O_TIMEOUT:
    return num("--timeout", arg, 0, 1e9, &x) ? 2 : (o->so.timeout_s = x > 0 ? x : -1, 0);
  case O_MAXBODY:
    return num("--max-body", arg, 1024, 1 << 30, &x) ? 2 : (o->so.max_body = (int64_t)x, 0);
  case O_MAXCONN:
    return num("--max-connections", arg, 1, 65536, &x) ? 2 : (o->so.max_connections = (int)x, 0);
  case O_KVG: return num("--kv-group", arg, 32, 128, &x) ? 2 : (o->so.kv_group = (int)x, 0);
  case O_THREADS: return num("--threads", arg, 1, 4096, &x) ? 2 : (o->so.threads = (int)x, 0);
  case O_BITS: return num("--bits", arg, 0, 8, &x) ? 2 : (o->bits = (int)x, 0);
  case O_WSEED:
    return num("--weight-seed", arg, 0, 1e18, &x) ? 2 : (o->wseed = (unsigned long long)x, 0);
  }
  return -1;
}

static int handle(serve_opts *o, int c, const char *arg) {
  int r = int_opt(o, c, arg);
  if (r >= 0) return r;
  switch (c) {
  case O_MODEL: o->model = arg; return 0;
  case O_HOST: o->so.host = arg; return 0;
  case O_KEY: o->so.api_key = arg; return 0;
  case O_KEYFILE: o->key_file = arg; return 0;
  case O_ID:
    if (o->n_ids == MAX_IDS) {
      fprintf(stderr, "lumen serve: at most %d --model-id (--served-model-name) names\n", MAX_IDS);
      return 2;
    }
    o->ids[o->n_ids++] = arg;
    return 0;
  case O_CORS: o->so.cors = arg; return 0;
  case 'v':
  case O_LOG: o->so.log_requests = 1; return 0;
  case O_NOWEB: o->so.no_webui = 1; return 0;
  case O_SPEC: return lm_cli_spec_source(&o->spec, arg);
  case O_SPEC_TOKENS: return lm_cli_spec_tokens(&o->spec, arg);
  case O_ADAPTER: return lm_cli_adapters_add(&o->ad, arg);
  case O_KVQ: o->so.kv_quant = arg; return 0;
  case O_KVC: o->so.kv_config = arg; return 0;
  case O_BACKEND: o->so.backend = arg; return 0;
  case O_PREC: o->so.precision = arg; return 0;
  case O_PRESET: o->preset = arg; return 0;
  case O_TOKENIZER: o->tokenizer = arg; return 0;
  case O_TEMPLATE: o->chat_template = arg; return 0;
  }
  if (c == lm_cli_sampling_opt("stop")) {
    fprintf(stderr,
            "lumen serve: --stop is a per-request field (\"stop\"), not a server default\n");
    return 2;
  }
  return lm_cli_sampling_handle(&o->samp, c, arg) == 1 ? 0 : 2;
}

static int parse(serve_opts *o, int argc, char **argv, int *done) {
  struct option lo[64] = {{"model", 1, 0, O_MODEL},
                          {"host", 1, 0, O_HOST},
                          {"port", 1, 0, O_PORT},
                          {"parallel", 1, 0, O_PARALLEL},
                          {"ctx", 1, 0, O_CTX},
                          {"chunk", 1, 0, O_CHUNK},
                          {"prefill-step-size", 1, 0, O_CHUNK},
                          {"memory-budget", 1, 0, O_BUDGET},
                          {"queue-size", 1, 0, O_QUEUE},
                          {"prompt-cache", 1, 0, O_PCACHE},
                          {"prompt-cache-size", 1, 0, O_PCACHE},
                          {"timeout", 1, 0, O_TIMEOUT},
                          {"max-body", 1, 0, O_MAXBODY},
                          {"api-key", 1, 0, O_KEY},
                          {"api-key-file", 1, 0, O_KEYFILE},
                          {"model-id", 1, 0, O_ID},
                          {"max-connections", 1, 0, O_MAXCONN},
                          {"log-requests", 0, 0, O_LOG},
                          {"kv-quant", 1, 0, O_KVQ},
                          {"kv-group", 1, 0, O_KVG},
                          {"kv-config", 1, 0, O_KVC},
                          {"backend", 1, 0, O_BACKEND},
                          {"precision", 1, 0, O_PREC},
                          {"threads", 1, 0, O_THREADS},
                          {"preset", 1, 0, O_PRESET},
                          {"tokenizer", 1, 0, O_TOKENIZER},
                          {"bits", 1, 0, O_BITS},
                          {"weight-seed", 1, 0, O_WSEED},
                          {"chat-template", 1, 0, O_TEMPLATE},
                          {"no-webui", 0, 0, O_NOWEB},
                          {"cors", 1, 0, O_CORS},
                          {"spec", 1, 0, O_SPEC},
                          {"spec-tokens", 1, 0, O_SPEC_TOKENS},
                          {"adapter", 1, 0, O_ADAPTER},
                          {"verbose", 0, 0, 'v'},
                          {"help", 0, 0, 'h'}};
  int n = 36;
  if (lm_cli_sampling_options(lo, n, 64) < 0) return 2;
  *done = 0;
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, ":hvn:", lo, NULL)) != -1) {
    if (c == 'h') {
      fputs(usage, stdout);
      lm_cli_spec_help(stdout);
      fputs("                           (a request's \"speculative\": false turns them off, true\n"
            "                           or {\"source\": \"ngram\", \"tokens\": N} on; with\n"
            "                           --spec-tokens alone, requests may ask for them)\n",
            stdout);
      lm_cli_sampling_help(stdout);
      *done = 1;
      return 0;
    }
    if (c == '?' || c == ':') {
      *done = 1;
      return lm_cli_flag_error(c, argc, argv, lo);
    }
    if (c == 'n' && lm_cli_attached_word(argc, argv, optarg)) {
      *done = 1;
      return 2;
    }
    if (c == 'n') c = lm_cli_sampling_opt("max-tokens");
    if (handle(o, c, optarg)) {
      fprintf(stderr, "usage: lumen serve [--model] MODEL_DIR [options] (see --help)\n");
      *done = 1;
      return 2;
    }
  }
  if (optind < argc && !o->model) o->model = argv[optind++];
  if (optind != argc || (!o->model == !o->preset) || (o->preset && !o->tokenizer)) {
    fprintf(
        stderr,
        "lumen serve: give one MODEL_DIR, or --preset FILE with --tokenizer DIR (see --help)\n");
    *done = 1;
    return 2;
  }
  return 0;
}

/* The first line of FILE, without its line end; a regular file of at most 4 KiB. */
static int read_key_file(const char *path, char **out) {
  FILE *f;
  if (lm_file_fopen_regular(path, &f)) return lm_cli_fail("--api-key-file");
  char buf[4097];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  int big = n == sizeof buf - 1 && fgetc(f) != EOF;
  fclose(f);
  buf[n] = '\0';
  buf[strcspn(buf, "\r\n")] = '\0';
  if (big || !buf[0]) {
    fprintf(stderr, "lumen serve: --api-key-file %s: %s\n", path,
            big ? "larger than 4 KiB" : "the first line is empty");
    return 1;
  }
  *out = strdup(buf);
  return *out ? 0 : lm_cli_fail("--api-key-file");
}

/* The key: --api-key, else --api-key-file, else LUMEN_API_KEY (none of them: no key). */
static int api_key(serve_opts *o) {
  if (o->so.api_key && o->key_file) {
    fprintf(stderr, "lumen serve: give --api-key or --api-key-file, not both\n");
    return 2;
  }
  if (o->key_file) {
    int r = read_key_file(o->key_file, &o->key);
    if (r) return r;
  } else if (!o->so.api_key && getenv("LUMEN_API_KEY") && *getenv("LUMEN_API_KEY")) {
    if (!(o->key = strdup(getenv("LUMEN_API_KEY")))) return lm_cli_fail("LUMEN_API_KEY");
  }
  if (o->key) o->so.api_key = o->key;
  return 0;
}

/* The request defaults: the checkpoint's generation_config.json with the flags overlaid. */
static int defaults(serve_opts *o, const lm_checkpoint *ck, lm_sampling *out) {
  lm_checkpoint_info ci;
  lm_checkpoint_describe(ck, &ci);
  lm_status s = lm_cli_sampling_apply(&o->samp, ci.defaults, out);
  o->so.max_tokens = o->samp.max_tokens > 0      ? o->samp.max_tokens
                     : ci.default_max_tokens > 0 ? ci.default_max_tokens
                                                 : 0;
  if (s) return lm_cli_fail("sampling flags");
  o->so.has_seed = (o->samp.set >> (lm_cli_sampling_opt("seed") - LM_CLI_SAMPLING_BASE)) & 1u;
  return 0;
}

static lm_checkpoint *load(serve_opts *o) {
  lm_checkpoint *ck = NULL;
  if (!o->preset) {
    if (lm_cli_checkpoint_open(o->model, &ck)) lm_cli_fail(NULL);
    if (ck && o->chat_template && lm_checkpoint_set_chat_template(ck, o->chat_template)) {
      lm_cli_fail("--chat-template");
      lm_checkpoint_free(ck);
      ck = NULL;
    }
    return ck;
  }
  fprintf(stderr, "lumen serve: building a synthetic model of %s (%d-bit weights)...\n", o->preset,
          o->bits);
  if (lm_checkpoint_open_synthetic(o->preset, o->tokenizer, o->bits, 64, o->wseed, &ck))
    lm_cli_fail("synthetic model");
  return ck;
}

/* Blocks until SIGINT or SIGTERM (blocked in every thread, taken here). */
static void wait_signal(const sigset_t *set) {
  int sig = 0;
  sigwait(set, &sig);
  fprintf(stderr, "lumen serve: %s, shutting down\n", sig == SIGINT ? "interrupted" : "terminated");
}

static int serve(serve_opts *o, const sigset_t *set) {
  const char *dir = o->preset ? o->tokenizer : o->model;
  lm_sampling samp;
  lm_sampling_init(&samp);
  lm_checkpoint *ck = load(o);
  lm_server *s = NULL;
  int rc = 1;
  if (!ck || defaults(o, ck, &samp)) goto done;

  o->so.model_dir = dir;
  o->so.speculative = o->spec.source;
  o->so.draft_model = o->spec.draft;
  if (lm_cli_adapters_parse(&o->ad)) goto done;
  o->so.adapters = o->ad.n ? o->ad.dirs : NULL;
  o->so.adapter_weights = o->ad.n ? o->ad.weight : NULL;
  o->so.n_adapters = o->ad.n;
  o->so.speculative_tokens = o->spec.source ? lm_cli_spec_engine_tokens(&o->spec) : o->spec.tokens;
  o->so.sampling = &samp;
  /* served as every --model-id, and always as the model's own name */
  o->so.model_id = o->preset ? "synthetic" : lm_cli_model_id(o->model);
  o->so.aliases = o->ids;
  o->so.n_aliases = o->n_ids;
  lm_cli_progress pr;
  lm_cli_progress_start(&pr, "loading the weights", 0, "B");
  o->so.on_load = lm_cli_progress_cb;
  o->so.on_load_ctx = &pr;
  lm_status cs = lm_server_create(ck, &o->so, &s);
  lm_cli_progress_end(&pr);
  if (cs || lm_server_start(s)) {
    lm_cli_fail("serve");
    goto done;
  }
  char desc[2048];
  lm_server_describe(s, desc, sizeof desc);
  const char *host = o->so.host ? o->so.host : "127.0.0.1";
  printf("lumen serve: %s\nlumen serve: listening on http://%s:%d/v1\n", desc, host,
         lm_server_port(s));
  if (!o->so.no_webui) printf("lumen serve: chat page at http://%s:%d/\n", host, lm_server_port(s));
  fflush(stdout);
  wait_signal(set);
  rc = 0;
done:
  lm_server_free(s);
  lm_sampling_clear(&samp);
  lm_checkpoint_free(ck);
  return rc;
}

int lm_cli_serve(int argc, char **argv) {
  serve_opts o;
  memset(&o, 0, sizeof o);
  lm_server_opts_init(&o.so);
  o.so.port = 8080;
  o.bits = 4;
  lm_cli_sampling_init(&o.samp);
  int done = 0, rc = parse(&o, argc, argv, &done);
  if (!done && (rc = api_key(&o)) != 0) done = 1;
  if (!done) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL); /* before any thread starts, so all inherit it */
    signal(SIGPIPE, SIG_IGN);
    rc = serve(&o, &set);
  }
  lm_cli_sampling_free(&o.samp);
  free(o.key);
  return rc;
}
