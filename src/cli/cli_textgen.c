/* cli_textgen.c — the text-generation plumbing shared by `lumen run` and `lumen chat`, over the
 * public API (lumen.h). */
#include "cli/cli_textgen.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "base/status.h"
#include "cli/cli_args.h"
#include "cli/cli_progress.h"
#include "text/utf8.h"

/* ---- flags ----------------------------------------------------------------------------------- */

enum {
  OPT_BACKEND = 1,
  OPT_PRECISION,
  OPT_THREADS,
  OPT_RAW,
  OPT_RAW_OUTPUT,
  OPT_SYSTEM,
  OPT_THINK,
  OPT_NO_THINK,
  OPT_CHUNK,
  OPT_CTX,
  OPT_KV_QUANT,
  OPT_KV_GROUP,
  OPT_KV_CONFIG,
  OPT_KV_START,
  OPT_SAVE_STATE,
  OPT_LOAD_STATE,
  OPT_TEMPLATE,
  OPT_GRAMMAR,
  OPT_JSON_SCHEMA,
  OPT_SPEC,
  OPT_SPEC_TOKENS,
  OPT_ADAPTER
};

void lm_cli_textgen_opts_init(lm_cli_textgen_opts *o) {
  memset(o, 0, sizeof *o);
  lm_cli_sampling_init(&o->samp);
  o->think = -1;
}

void lm_cli_textgen_opts_free(lm_cli_textgen_opts *o) { lm_cli_sampling_free(&o->samp); }

void lm_cli_textgen_help(FILE *f) {
  fputs(
      "  --raw                    plain completion: no chat template, the prompt gets the BOS\n"
      "  --system TEXT            system prompt (chat format)\n"
      "  --chat-template FILE     use this Jinja template (or a .json file's \"chat_template\")\n"
      "                           instead of the checkpoint's\n"
      "  --think / --no-think     set the template's enable_thinking (default: the template's)\n"
      "  --raw-output             print the decoded text as is, control tokens included, unparsed\n"
      "  --json-schema FILE       the answer is JSON that validates against this JSON Schema\n"
      "  --grammar FILE           the answer follows this GBNF grammar (llama.cpp's notation)\n"
      "                           (either one; after the reasoning when thinking is on)\n"
      "  --chunk N                prefill tokens per forward step (512)\n"
      "  --ctx N                  context limit in tokens (default: none)\n"
      "  --backend B              cpu (default); --precision f32|fast|bf16 (default fast); "
      "--threads N\n"
      "  --kv-quant MODE          KV caches: off (default), 4, 8, config (the checkpoint's "
      "kv_config.json),\n"
      "                           or turboquant[:K:V] on full-attention layers (K 2/4/5/8, V 2-5; "
      "8:3)\n"
      "  --kv-group G             group of uniform 4/8-bit caches (64); --kv-config FILE another "
      "kv_config.json\n"
      "  --kv-quant-start N       quantized caches stay plain until they hold N tokens (0)\n"
      "  --load-state FILE        start from a saved session (same model and cache plan); the "
      "prompt\n"
      "                           then reuses the saved tokens it begins with\n"
      "  --save-state FILE        save the session (caches, tokens) after the response (atomic "
      "write)\n"
      "  --adapter DIR[@W]        apply the LoRA adapter in DIR (PEFT or mlx-lm) with weight W "
      "(1);\n"
      "                           repeat to stack several (not with --save-state/--load-state)\n"
      "  -v, --verbose            print the seed, the sampling settings and the stop reason on "
      "stderr\n",
      f);
  lm_cli_spec_help(f);
  lm_cli_sampling_help(f);
}

static int parse_count(const char *flag, const char *arg, int64_t *out) {
  char *end;
  long long x = strtoll(arg, &end, 10);
  if (end == arg || *end || x < 1) {
    fprintf(stderr, "lumen: %s: '%s' is not a positive integer\n", flag, arg);
    return 2;
  }
  *out = x;
  return 0;
}

static int handle_opt(lm_cli_textgen_opts *o, int c, const char *arg) {
  switch (c) {
  case OPT_BACKEND: o->be.backend = arg; return 0;
  case OPT_PRECISION: o->be.precision = arg; return 0;
  case OPT_THREADS: o->be.threads = atoi(arg); return 0;
  case OPT_RAW: o->raw = 1; return 0;
  case OPT_RAW_OUTPUT: o->raw_output = 1; return 0;
  case OPT_SYSTEM: o->system = arg; return 0;
  case OPT_THINK: o->think = 1; return 0;
  case OPT_NO_THINK: o->think = 0; return 0;
  case OPT_CHUNK: return parse_count("--chunk", arg, &o->chunk);
  case OPT_CTX: return parse_count("--ctx", arg, &o->ctx);
  case OPT_KV_QUANT: o->kv_quant = arg; return 0;
  case OPT_KV_GROUP: o->kv_group = atoi(arg); return 0;
  case OPT_KV_CONFIG: o->kv_config = arg; return 0;
  case OPT_KV_START: o->kv_quant_start = atoll(arg); return 0;
  case OPT_SAVE_STATE: o->save_state = arg; return 0;
  case OPT_LOAD_STATE: o->load_state = arg; return 0;
  case OPT_TEMPLATE: o->chat_template = arg; return 0;
  case OPT_GRAMMAR: o->grammar_file = arg; return 0;
  case OPT_JSON_SCHEMA: o->schema_file = arg; return 0;
  case OPT_SPEC: return lm_cli_spec_source(&o->spec, arg);
  case OPT_SPEC_TOKENS: return lm_cli_spec_tokens(&o->spec, arg);
  case OPT_ADAPTER: return lm_cli_adapters_add(&o->ad, arg);
  case 'v': o->verbose = 1; return 0;
  case 'n':
    return lm_cli_sampling_handle(&o->samp, lm_cli_sampling_opt("max-tokens"), arg) == 1 ? 0 : 2;
  default: {
    int r = lm_cli_sampling_handle(&o->samp, c, arg);
    return r == 1 ? 0 : 2;
  }
  }
}

int lm_cli_textgen_parse(lm_cli_textgen_opts *o, int argc, char **argv, const char *help,
                         int *done) {
  struct option lo[64] = {{"backend", 1, 0, OPT_BACKEND},
                          {"precision", 1, 0, OPT_PRECISION},
                          {"threads", 1, 0, OPT_THREADS},
                          {"raw", 0, 0, OPT_RAW},
                          {"raw-output", 0, 0, OPT_RAW_OUTPUT},
                          {"system", 1, 0, OPT_SYSTEM},
                          {"think", 0, 0, OPT_THINK},
                          {"no-think", 0, 0, OPT_NO_THINK},
                          {"chunk", 1, 0, OPT_CHUNK},
                          {"ctx", 1, 0, OPT_CTX},
                          {"verbose", 0, 0, 'v'},
                          {"help", 0, 0, 'h'},
                          {"kv-quant", 1, 0, OPT_KV_QUANT},
                          {"kv-group", 1, 0, OPT_KV_GROUP},
                          {"kv-config", 1, 0, OPT_KV_CONFIG},
                          {"kv-quant-start", 1, 0, OPT_KV_START},
                          {"save-state", 1, 0, OPT_SAVE_STATE},
                          {"load-state", 1, 0, OPT_LOAD_STATE},
                          {"chat-template", 1, 0, OPT_TEMPLATE},
                          {"grammar", 1, 0, OPT_GRAMMAR},
                          {"json-schema", 1, 0, OPT_JSON_SCHEMA},
                          {"spec", 1, 0, OPT_SPEC},
                          {"spec-tokens", 1, 0, OPT_SPEC_TOKENS},
                          {"adapter", 1, 0, OPT_ADAPTER}};
  int c;
  *done = 0;
  if (lm_cli_sampling_options(lo, 24, 64) < 0) { /* the table outgrew lo */
    *done = 1;
    return fputs("lumen: internal error: too many flags\n", stderr), 2;
  }
  optind = 1;
  while ((c = getopt_long(argc, argv, ":hvn:", lo, NULL)) != -1) {
    if (c == 'h') {
      fputs(help, stdout);
      lm_cli_textgen_help(stdout);
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
    if (handle_opt(o, c, optarg)) {
      fprintf(stderr, "%.*s (see --help)\n", (int)strcspn(help, "\n"), help);
      *done = 1;
      return 2;
    }
  }
  if (lm_cli_adapters_parse(&o->ad)) {
    *done = 1;
    return 2;
  }
  return 0;
}

/* ---- opening a checkpoint -------------------------------------------------------------------- */

/* SIGINT becomes readable on a signalfd. It is blocked before the engine's thread starts, so that
 * thread inherits the mask and the signal reaches no one but the descriptor. */
static int open_sigfd(void) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  if (pthread_sigmask(SIG_BLOCK, &set, NULL)) return -1;
  return signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
}

/* 1 (and the signal consumed) when Ctrl-C was pressed since the last look. */
static int take_sigint(lm_cli_textgen *t) {
  struct signalfd_siginfo si;
  return t->sigfd >= 0 && read(t->sigfd, &si, sizeof si) == (ssize_t)sizeof si;
}

static int make_engine(lm_cli_textgen *t) {
  const lm_cli_textgen_opts *o = t->o;
  lm_engine_options eo;
  lm_engine_options_init(&eo);
  eo.backend = o->be.backend;
  eo.precision = o->be.precision;
  eo.threads = o->be.threads;
  eo.chunk = o->chunk > 0 ? o->chunk : 512;
  eo.context = o->ctx;
  eo.kv_budget = -1; /* one sequence: its caches grow as it needs */
  eo.kv_quant = o->kv_quant;
  eo.kv_group = o->kv_group;
  eo.kv_config = o->kv_config;
  eo.kv_quant_start = o->kv_quant_start;
  eo.speculative_tokens = lm_cli_spec_engine_tokens(&o->spec);
  eo.draft_model = o->spec.draft;
  lm_cli_adapters_options(&o->ad, &eo);
  lm_cli_progress pr;
  lm_cli_progress_start(&pr, "loading the weights", 0, "B");
  eo.on_load = lm_cli_progress_cb;
  eo.on_load_ctx = &pr;
  lm_status s = lm_engine_create(t->ck, &eo, &t->e);
  lm_cli_progress_end(&pr);
  return s ? lm_cli_fail(NULL) : 0;
}

static int open_text(lm_cli_textgen *t, const char *dir) {
  const lm_cli_textgen_opts *o = t->o;
  if (!t->ci.has_tokenizer) {
    fprintf(stderr, "lumen: %s has no tokenizer.json (use `lumen generate --ids` for ids)\n", dir);
    return 1;
  }
  t->templ = t->ci.has_chat_template && !o->raw;
  t->parse = t->templ && !o->raw_output;
  if (!t->ci.has_chat_template && !o->raw)
    fprintf(stderr,
            "lumen: note: %s has no chat template, so the prompt is completed as plain text "
            "(--chat-template FILE gives one; --raw silences this note)\n",
            dir);
  if (o->think >= 0 && !(t->kwargs = strdup(o->think ? "{\"enable_thinking\":true}"
                                                     : "{\"enable_thinking\":false}")))
    return lm_cli_fail("out of memory");
  if (lm_cli_sampling_apply(&o->samp, t->ci.defaults, &t->sampling) ||
      lm_sampling_validate(&t->sampling))
    return lm_cli_fail("sampling");
  t->max_tokens = o->samp.max_tokens > 0 ? o->samp.max_tokens : t->ci.default_max_tokens;
  if (o->verbose)
    fprintf(stderr,
            "lumen: seed %llu, temperature %g, top-k %d, top-p %g, min-p %g; %d stop ids%s\n",
            (unsigned long long)t->sampling.seed, t->sampling.temperature, t->sampling.top_k,
            t->sampling.top_p, t->sampling.min_p, t->ci.n_stop_ids,
            t->ci.has_chat_template && !o->raw ? "" : "; raw completion");
  return 0;
}

int lm_cli_textgen_open(lm_cli_textgen *t, const char *dir, const lm_cli_textgen_opts *o) {
  memset(t, 0, sizeof *t);
  t->o = o;
  t->sigfd = -1;
  lm_sampling_init(&t->sampling);
  if (o->grammar_file && o->schema_file) {
    fprintf(stderr, "lumen: --grammar and --json-schema cannot be used together\n");
    return 1;
  }
  if ((o->grammar_file && lm_cli_read_text("--grammar", o->grammar_file, &t->grammar)) ||
      (o->schema_file && lm_cli_read_text("--json-schema", o->schema_file, &t->json_schema)))
    return 1;
  if (lm_cli_checkpoint_open(dir, &t->ck)) return lm_cli_fail(NULL);
  if (o->chat_template && lm_checkpoint_set_chat_template(t->ck, o->chat_template))
    return lm_cli_fail("--chat-template");
  lm_checkpoint_describe(t->ck, &t->ci);
  if (open_text(t, dir)) return 1;
  t->sigfd = open_sigfd();
  return make_engine(t);
}

void lm_cli_textgen_close(lm_cli_textgen *t) {
  lm_engine_free(t->e);
  lm_checkpoint_free(t->ck);
  lm_sampling_clear(&t->sampling);
  free(t->kwargs);
  free(t->ctx);
  free(t->grammar);
  free(t->json_schema);
  if (t->sigfd >= 0) close(t->sigfd);
  memset(t, 0, sizeof *t);
  t->sigfd = -1;
}

/* ---- prompts --------------------------------------------------------------------------------- */

int lm_cli_check_utf8(const char *what, const char *text, size_t len) {
  if (lm_utf8_valid(text, len)) return 0;
  size_t at = 0;
  for (int32_t cp; at < len; at += lm_utf8_next(text + at, len - at, &cp)) {
    lm_utf8_next(text + at, len - at, &cp);
    if (cp < 0) break;
  }
  fprintf(stderr, "lumen: %s is not valid UTF-8 (byte %zu)\n", what, at);
  return 1;
}

int lm_cli_textgen_encode(lm_cli_textgen *t, const char *text, int bos, int32_t **ids, size_t *n) {
  int64_t k = 0;
  if (lm_checkpoint_tokenize(t->ck, text, strlen(text), bos, ids, &k))
    return lm_cli_fail("tokenize");
  *n = (size_t)k;
  return 0;
}

/* The prompt ends inside an opened reasoning channel (the canonical Gemma template after a tool
 * response with thinking on). */
static int ends_in_reasoning(const char *prompt) {
  static const char *const opens[] = {"<|channel>thought\n", "<think>\n"};
  size_t n = strlen(prompt);
  for (int i = 0; i < 2; i++) {
    size_t k = strlen(opens[i]);
    if (n >= k && !memcmp(prompt + n - k, opens[i], k)) return 1;
  }
  return 0;
}

int lm_cli_textgen_render(lm_cli_textgen *t, const json_t *messages, char **prompt) {
  *prompt = NULL;
  char *msgs = json_dumps(messages, JSON_COMPACT);
  lm_status s = msgs ? lm_checkpoint_render(t->ck, msgs, NULL, t->kwargs, 1, prompt)
                     : LM_ERRF(LM_ERR_NOMEM, "out of memory");
  free(msgs);
  if (s) return lm_cli_fail("chat template");
  t->starts_in_reasoning = ends_in_reasoning(*prompt);
  return 0;
}

/* ---- streaming one response ------------------------------------------------------------------ */

static void put_out(lm_cli_textgen *t, const char *s, size_t n) {
  if (!n) return;
  if (t->in_reasoning) {
    fputc('\n', stderr);
    t->in_reasoning = 0;
  }
  fwrite(s, 1, n, stdout);
  fflush(stdout);
  t->wrote = s[n - 1] == '\n' ? 1 : 2; /* 2: the line is open */
}

/* One event of the response: the answer on stdout, reasoning on stderr, a tool call as a line. */
static void show(lm_cli_textgen *t, const lm_event *ev) {
  if (ev->kind == LM_EVENT_CONTENT) {
    put_out(t, ev->text, ev->len);
  } else if (ev->kind == LM_EVENT_REASONING) {
    fwrite(ev->text, 1, ev->len, stderr);
    fflush(stderr);
    t->in_reasoning = 1;
  } else if (ev->kind == LM_EVENT_TOOL_CALL) {
    char line[256];
    int k =
        snprintf(line, sizeof line, "%s[tool call] %s ", t->wrote == 2 ? "\n" : "", ev->tool_name);
    put_out(t, line, (size_t)(k < (int)sizeof line ? k : (int)sizeof line - 1));
    put_out(t, ev->tool_arguments, strlen(ev->tool_arguments));
    put_out(t, "\n", 1);
  }
}

static void print_stats(const lm_cli_textgen *t, const lm_event *done) {
  const lm_usage *u = &done->usage;
  int64_t prefill = u->prompt_tokens - u->cached_tokens;
  /* the first token comes with the prompt's last step; the decode rate is of the rest */
  int64_t later = u->completion_tokens > 1 ? u->completion_tokens - 1 : 0;
  fprintf(stderr, "prefill %lld tok @ %.1f tok/s, decode %lld tok @ %.1f tok/s", (long long)prefill,
          u->prefill_s > 0 ? (double)prefill / u->prefill_s : 0.0, (long long)u->completion_tokens,
          u->decode_s > 0 ? (double)later / u->decode_s : 0.0);
  if (u->cached_tokens) fprintf(stderr, ", cached %lld tok", (long long)u->cached_tokens);
  if (t->o->spec.source)
    fprintf(stderr, ", drafts %lld/%lld accepted, %.2f tok/step", (long long)u->accepted_tokens,
            (long long)u->drafted_tokens,
            u->decode_steps > 0 ? (double)later / (double)u->decode_steps : 0.0);
  if (t->o->verbose) {
    static const char *const why[] = {"running",   "stop",    "stop", "length",
                                      "cancelled", "timeout", "error"};
    fprintf(stderr, ", stop: %s", why[done->finish]);
  }
  fputc('\n', stderr);
}

/* Says so when a response ended because the context is full, not at a stop or at -n. */
static void context_note(const lm_cli_textgen *t, const lm_event *done) {
  lm_engine_info ei;
  lm_engine_describe(t->e, &ei);
  if (done->finish != LM_FIN_LENGTH || t->n_ctx + 1 < ei.context) return;
  fprintf(stderr, "lumen: the context is full (%lld tokens)%s\n", (long long)ei.context,
          t->ci.max_positions > ei.context ? "; --ctx N gives a longer one" : "");
}

/* The request of one response over ids (the whole context). */
static lm_status submit(lm_cli_textgen *t, const int32_t *ids, int64_t n, lm_request **r) {
  lm_request_options ro;
  lm_request_options_init(&ro);
  ro.ids = ids;
  ro.n_ids = n;
  ro.sampling = t->sampling;
  ro.has_seed = 1;
  /* a limit past the context is the context (the old command line's rule): 0 = until it is full */
  lm_engine_info ei;
  lm_engine_describe(t->e, &ei);
  ro.max_tokens = t->max_tokens > 0 && t->max_tokens < ei.context - n ? t->max_tokens : 0;
  ro.stop = t->o->samp.stops;
  ro.n_stop = t->o->samp.n_stops;
  ro.raw_output = t->o->raw_output;
  ro.parse_output = t->parse;
  ro.starts_in_reasoning = t->starts_in_reasoning;
  ro.grammar = t->grammar;
  ro.json_schema = t->json_schema;
  ro.speculative = t->o->spec.source;
  return lm_request_submit(t->e, &ro, r);
}

/* Streams the events of r until its end (*done); Ctrl-C cancels it. */
static lm_status pump(lm_cli_textgen *t, lm_request *r, lm_event *done) {
  for (;;) {
    lm_event ev;
    LM_TRY(lm_request_next(r, 100, &ev));
    if (take_sigint(t)) {
      t->interrupted = 1;
      lm_request_cancel(r);
    }
    if (ev.kind == LM_EVENT_DONE) {
      *done = ev;
      return LM_OK;
    }
    show(t, &ev);
  }
}

/* The context becomes the request's: its prompt and answer. */
static int keep_context(lm_cli_textgen *t, lm_request *r) {
  int64_t n, np;
  const int32_t *ids = lm_request_tokens(r, &n, &np);
  int32_t *c = realloc(t->ctx, (size_t)(n ? n : 1) * sizeof *c);
  if (!c) return lm_cli_fail("out of memory");
  memcpy(c, ids, (size_t)n * sizeof *c);
  t->ctx = c;
  t->n_ctx = n;
  t->prompt_len = np;
  return 0;
}

/* ids of the next request: ids alone (sync), or the context followed by them. */
static int request_ids(lm_cli_textgen *t, const int32_t *ids, size_t n, int sync, int32_t **out,
                       int64_t *len) {
  int64_t keep = sync ? 0 : t->n_ctx;
  *len = keep + (int64_t)n;
  if (!(*out = malloc((size_t)(*len ? *len : 1) * sizeof **out)))
    return lm_cli_fail("out of memory");
  if (keep) memcpy(*out, t->ctx, (size_t)keep * sizeof **out);
  if (n) memcpy(*out + keep, ids, n * sizeof *ids);
  return 0;
}

int lm_cli_textgen_respond(lm_cli_textgen *t, const int32_t *ids, size_t n, int sync) {
  t->wrote = 0;
  t->in_reasoning = 0;
  t->interrupted = 0;
  int32_t *all = NULL;
  int64_t len = 0;
  lm_request *r = NULL;
  lm_event done = {0};
  if (request_ids(t, ids, n, sync, &all, &len)) return 1;
  int rc = submit(t, all, len, &r) ? lm_cli_fail("prefill") : 0;
  free(all);
  if (!rc && pump(t, r, &done)) rc = lm_cli_fail("decode");
  if (!rc && done.finish == LM_FIN_ERROR) rc = (fprintf(stderr, "lumen: %s\n", done.error), 1);
  if (!rc) rc = keep_context(t, r);
  lm_request_free(r);
  if (rc) return rc;
  if (t->in_reasoning) fputc('\n', stderr);
  if (t->wrote != 1) {
    fputc('\n', stdout);
    t->wrote = 1;
  }
  fflush(stdout);
  print_stats(t, &done);
  context_note(t, &done);
  return 0;
}

char *lm_cli_textgen_reply_text(lm_cli_textgen *t) {
  char *text = NULL;
  size_t len;
  if (lm_checkpoint_detokenize(t->ck, t->ctx + t->prompt_len, t->n_ctx - t->prompt_len, 0, &text,
                               &len)) {
    lm_cli_fail("decode");
    return NULL;
  }
  return text;
}

void lm_cli_textgen_reset(lm_cli_textgen *t) { t->n_ctx = t->prompt_len = 0; }

int lm_cli_textgen_wait_input(lm_cli_textgen *t) {
  struct pollfd p[2] = {{.fd = STDIN_FILENO, .events = POLLIN}, {.fd = t->sigfd, .events = POLLIN}};
  for (;;) {
    int k = poll(p, t->sigfd >= 0 ? 2 : 1, -1);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 || (p[0].revents & (POLLIN | POLLHUP | POLLERR))) return 1;
    if (take_sigint(t)) return 0;
  }
}

int lm_cli_textgen_save(lm_cli_textgen *t, const char *path) {
  if (!t->n_ctx) return (fprintf(stderr, "lumen: --save-state: nothing to save\n"), 1);
  if (lm_engine_save_state(t->e, t->ctx, t->n_ctx, path, NULL)) return lm_cli_fail("--save-state");
  return 0;
}

int lm_cli_textgen_load(lm_cli_textgen *t, const char *path) {
  int32_t *ids = NULL;
  int64_t n = 0;
  if (lm_engine_load_state(t->e, path, &ids, &n)) return lm_cli_fail("--load-state");
  free(t->ctx);
  t->ctx = ids;
  t->n_ctx = t->prompt_len = n;
  return 0;
}
