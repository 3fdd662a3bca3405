/* cli_textgen.c — the text-generation plumbing shared by `lumen run` and `lumen chat`. */
#include "cli/cli_textgen.h"

#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "model/forward.h"
#include "sample/gen_config.h"
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
  OPT_LOAD_STATE
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
      "  --think / --no-think     set the template's enable_thinking (default: the template's)\n"
      "  --raw-output             print the decoded text as is, control tokens included, unparsed\n"
      "  --chunk N                prefill tokens per forward step (512)\n"
      "  --ctx N                  context limit in tokens (default: none)\n"
      "  --backend B              cpu (default); --precision f32|fast|bf16 (default fast); "
      "--threads N\n"
      "  --kv-quant MODE          KV caches: off (default), 4, 8, or config (the checkpoint's "
      "kv_config.json)\n"
      "  --kv-group G             group of uniform 4/8-bit caches (64); --kv-config FILE another "
      "kv_config.json\n"
      "  --kv-quant-start N       quantized caches stay plain until they hold N tokens (0)\n"
      "  --load-state FILE        start from a saved session (same model and cache plan); the "
      "prompt\n"
      "                           then reuses the saved tokens it begins with\n"
      "  --save-state FILE        save the session (caches, tokens) after the response (atomic "
      "write)\n"
      "  -v, --verbose            print the seed, the sampling settings and the stop reason on "
      "stderr\n",
      f);
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
  case OPT_KV_QUANT: o->kv.mode = arg; return 0;
  case OPT_KV_GROUP: o->kv.group = atoi(arg); return 0;
  case OPT_KV_CONFIG: o->kv.config_path = arg; return 0;
  case OPT_KV_START: o->kv.quant_start = atoll(arg); return 0;
  case OPT_SAVE_STATE: o->save_state = arg; return 0;
  case OPT_LOAD_STATE: o->load_state = arg; return 0;
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
  struct option lo[48] = {{"backend", 1, 0, OPT_BACKEND},
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
                          {"load-state", 1, 0, OPT_LOAD_STATE}};
  lm_cli_sampling_options(lo, 18, 48);
  int c;
  *done = 0;
  optind = 1;
  while ((c = getopt_long(argc, argv, "hvn:", lo, NULL)) != -1) {
    if (c == 'h') {
      fputs(help, stdout);
      lm_cli_textgen_help(stdout);
      *done = 1;
      return 0;
    }
    if (c == '?' || handle_opt(o, c, optarg)) {
      fprintf(stderr, "%.*s (see --help)\n", (int)strcspn(help, "\n"), help);
      *done = 1;
      return 2;
    }
  }
  return 0;
}

/* ---- opening a checkpoint -------------------------------------------------------------------- */

static int32_t find_token(const void *ctx, const char *text, size_t len) {
  return lm_tokenizer_find(ctx, text, len);
}

static char *token_string(const lm_tokenizer *tok, int32_t id) {
  size_t n = 0;
  const char *s = id >= 0 ? lm_tokenizer_piece(tok, id, &n) : NULL;
  return s ? strndup(s, n) : strdup("");
}

static int on_token(void *user, int32_t id, const char *text, size_t len);

static int make_session(lm_cli_textgen *t) {
  const lm_cli_textgen_opts *o = t->o;
  lm_gen_opts go;
  lm_gen_opts_init(&go);
  go.kv = &o->kv;
  go.chunk = o->chunk;
  go.max_context = o->ctx;
  go.max_tokens = o->samp.max_tokens > 0 ? o->samp.max_tokens : t->gc.max_new_tokens;
  go.stop_ids = t->stop_ids;
  go.n_stop_ids = t->n_stop_ids;
  go.stop_strings = o->samp.stops;
  go.n_stop_strings = o->samp.n_stops;
  /* special tokens are not text, except the control tokens the output parser reads */
  int32_t keep[8];
  int32_t nk = 0;
  const int32_t pt[] = {t->ptok.channel_open,       t->ptok.channel_close,
                        t->ptok.tool_call_open,     t->ptok.tool_call_close,
                        t->ptok.tool_response_open, lm_tokenizer_find(t->tok, "<|\"|>", 5)};
  for (int i = 0; t->tmpl && i < 6; i++)
    if (pt[i] >= 0) keep[nk++] = pt[i];
  go.skip_special = !o->raw_output;
  go.keep_special = keep;
  go.n_keep_special = nk;
  go.on_token = on_token;
  go.user = t;
  lm_status s = lm_cli_sampling_apply(&o->samp, &t->gc.sampling, &go.sampling);
  if (!s) s = lm_gen_create(t->m, t->be, t->tok, &go, &t->gen);
  if (!s && o->verbose)
    fprintf(stderr,
            "lumen: seed %llu, temperature %g, top-k %d, top-p %g, min-p %g; %d stop ids%s\n",
            (unsigned long long)go.sampling.seed, go.sampling.temperature, go.sampling.top_k,
            go.sampling.top_p, go.sampling.min_p, t->n_stop_ids, t->tmpl ? "" : "; raw completion");
  lm_sampling_clear(&go.sampling);
  return s ? lm_cli_fail(NULL) : 0;
}

static int open_text(lm_cli_textgen *t, const char *dir) {
  if (lm_tokenizer_load(dir, &t->tok)) return lm_cli_fail(NULL);
  if (!t->o->raw && lm_chat_template_load(dir, &t->tmpl)) return lm_cli_fail("chat template");
  if (!t->tmpl && !t->o->raw && t->o->verbose)
    fprintf(stderr, "lumen: %s has no chat template: raw completion\n", dir);
  if (lm_gen_config_load(dir, &t->gc)) return lm_cli_fail(NULL);
  if (lm_gen_stop_ids(t->m->cfg.eos_ids, t->m->cfg.n_eos, &t->gc, lm_tokenizer_eos(t->tok),
                      &t->stop_ids, &t->n_stop_ids))
    return lm_cli_fail(NULL);
  t->bos = token_string(t->tok, lm_tokenizer_bos(t->tok));
  t->eos = token_string(t->tok, lm_tokenizer_eos(t->tok));
  if (!t->bos || !t->eos) return lm_cli_fail("out of memory");
  if (t->o->think >= 0) t->kwargs = json_pack("{s:b}", "enable_thinking", t->o->think);
  t->parse_gemma4 = lm_parser_tokens_gemma4(find_token, t->tok, &t->ptok) == LM_OK;
  if (!t->parse_gemma4) {
    memset(&t->ptok, 0xff, sizeof t->ptok); /* every id -1 */
    t->ptok.eos = lm_tokenizer_eos(t->tok);
  }
  return 0;
}

int lm_cli_textgen_open(lm_cli_textgen *t, const char *dir, const lm_cli_textgen_opts *o) {
  memset(t, 0, sizeof *t);
  t->o = o;
  lm_gen_config_clear(&t->gc);
  if (!(t->m = lm_cli_load_model(dir))) return 1;
  if (!(t->be = lm_cli_backend(&o->be, LM_PRECISION_FAST))) return 1;
  if (lm_model_prepare(t->m, t->be)) return lm_cli_fail("prepare");
  if (open_text(t, dir)) return 1;
  return make_session(t);
}

void lm_cli_textgen_close(lm_cli_textgen *t) {
  lm_parser_free(t->parser);
  lm_gen_free(t->gen);
  json_decref(t->kwargs);
  free(t->bos);
  free(t->eos);
  free(t->stop_ids);
  lm_gen_config_clear(&t->gc);
  lm_chat_template_free(t->tmpl);
  lm_tokenizer_free(t->tok);
  lm_backend_destroy(t->be);
  lm_model_free(t->m);
  memset(t, 0, sizeof *t);
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
  if (lm_tokenizer_encode(t->tok, text, strlen(text), bos, ids, n)) return lm_cli_fail("tokenize");
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

static int new_parser(lm_cli_textgen *t, int start_in_reasoning);

int lm_cli_textgen_render(lm_cli_textgen *t, const json_t *messages, char **prompt) {
  *prompt = NULL;
  if (lm_chat_render(t->tmpl, messages, NULL, t->kwargs, 1, t->bos, t->eos, prompt))
    return lm_cli_fail("chat template");
  if (t->o->raw_output || !new_parser(t, ends_in_reasoning(*prompt))) return 0;
  free(*prompt);
  *prompt = NULL;
  return 1;
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

/* The output parser's events: the answer on stdout, reasoning on stderr, a tool call as a line. */
static lm_status on_event(void *user, const lm_parse_event *ev) {
  lm_cli_textgen *t = user;
  if (ev->kind == LM_PARSE_CONTENT) {
    put_out(t, ev->text, ev->len);
  } else if (ev->kind == LM_PARSE_REASONING) {
    fwrite(ev->text, 1, ev->len, stderr);
    fflush(stderr);
    t->in_reasoning = 1;
  } else {
    char line[256];
    int k = snprintf(line, sizeof line, "%s[tool call] %s ", t->wrote == 2 ? "\n" : "", ev->name);
    put_out(t, line, (size_t)(k < (int)sizeof line ? k : (int)sizeof line - 1));
    put_out(t, ev->arguments, strlen(ev->arguments));
    put_out(t, "\n", 1);
  }
  return LM_OK;
}

static int new_parser(lm_cli_textgen *t, int start_in_reasoning) {
  lm_parser_free(t->parser);
  t->parser = NULL;
  lm_parser_opts po = {.format = t->parse_gemma4 ? LM_PARSER_GEMMA4 : LM_PARSER_GENERIC,
                       .tokens = t->ptok,
                       .start_in_reasoning = start_in_reasoning,
                       .emit = on_event,
                       .user = t};
  return lm_parser_create(&po, &t->parser) ? lm_cli_fail("output parser") : 0;
}

/* The session's token callback: through the parser (chat format), else straight to stdout. */
static int on_token(void *user, int32_t id, const char *text, size_t len) {
  lm_cli_textgen *t = user;
  if (!t->parser) {
    put_out(t, text, len);
    return 0;
  }
  if (lm_parser_feed(t->parser, id, text, len)) {
    lm_cli_fail("output parser");
    return 1;
  }
  return 0;
}

static void print_stats(const lm_cli_textgen *t) {
  lm_gen_stats s = lm_gen_get_stats(t->gen);
  fprintf(stderr, "prefill %lld tok @ %.1f tok/s, decode %lld tok @ %.1f tok/s",
          (long long)s.prefill_tokens,
          s.prefill_s > 0 ? (double)s.prefill_tokens / s.prefill_s : 0.0,
          (long long)s.decode_tokens, s.decode_s > 0 ? (double)s.decode_steps / s.decode_s : 0.0);
  if (s.reused_tokens) fprintf(stderr, ", cached %lld tok", (long long)s.reused_tokens);
  if (t->o->verbose) fprintf(stderr, ", stop: %s", lm_gen_stop_name(lm_gen_stop_reason(t->gen)));
  fputc('\n', stderr);
}

int lm_cli_textgen_respond(lm_cli_textgen *t, const int32_t *ids, size_t n, int sync) {
  t->wrote = 0;
  t->in_reasoning = 0;
  lm_status s =
      sync ? lm_gen_sync(t->gen, ids, (int64_t)n, NULL) : lm_gen_append(t->gen, ids, (int64_t)n);
  if (s) return lm_cli_fail("prefill");
  lm_gen_tokens(t->gen, &t->prompt_len);
  if (lm_gen_run(t->gen)) return lm_cli_fail("decode");
  if (t->parser && lm_parser_finish(t->parser)) return lm_cli_fail("output parser");
  if (t->in_reasoning) fputc('\n', stderr);
  if (t->wrote != 1) {
    fputc('\n', stdout);
    t->wrote = 1;
  }
  fflush(stdout);
  print_stats(t);
  return 0;
}

char *lm_cli_textgen_reply_text(lm_cli_textgen *t) {
  int64_t n;
  const int32_t *ids = lm_gen_tokens(t->gen, &n);
  char *text = NULL;
  size_t len;
  if (lm_tokenizer_decode(t->tok, ids + t->prompt_len, (size_t)(n - t->prompt_len), 0, &text,
                          &len)) {
    lm_cli_fail("decode");
    return NULL;
  }
  return text;
}
