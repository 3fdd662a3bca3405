/* cli_textgen.h — what `lumen run` and `lumen chat` share: their flags, opening a checkpoint for
 * text generation (model, backend, tokenizer, chat template, generation_config.json, stop ids, a
 * generation session), rendering a conversation into ids, and streaming one response to the
 * terminal through the output parser (answer on stdout, reasoning on stderr, tool calls as lines
 * on stdout) with the timing line on stderr. */
#ifndef LM_CLI_TEXTGEN_H
#define LM_CLI_TEXTGEN_H

#include <jansson.h>
#include <stdio.h>

#include "cli/cli_common.h"
#include "cli/cli_sampling.h"
#include "engine/generate.h"
#include "sample/gen_config.h"
#include "text/chat.h"
#include "text/parse.h"
#include "text/tokenizer.h"

typedef struct lm_cli_textgen_opts {
  lm_cli_backend_opts be;
  lm_cli_sampling samp;
  int raw;            /* --raw: plain completion, no chat template */
  int raw_output;     /* --raw-output: print the decoded text as is (control tokens included) */
  const char *system; /* --system */
  int think;          /* -1: the template's default; 0: --no-think; 1: --think */
  int64_t chunk, ctx; /* --chunk, --ctx (0: defaults) */
  lm_kv_options kv;   /* --kv-quant, --kv-group, --kv-config, --kv-quant-start */
  const char *save_state, *load_state; /* --save-state, --load-state */
  int verbose;
} lm_cli_textgen_opts;

void lm_cli_textgen_opts_init(lm_cli_textgen_opts *o);
void lm_cli_textgen_opts_free(lm_cli_textgen_opts *o);
/* Parses argv with the shared flags; positional arguments are left in argv[optind..argc).
 * Returns 0, or the exit code (0 after --help, 2 on a usage error) with *done set. */
int lm_cli_textgen_parse(lm_cli_textgen_opts *o, int argc, char **argv, const char *help,
                         int *done);
/* Prints the help of the shared flags. */
void lm_cli_textgen_help(FILE *f);

typedef struct lm_cli_textgen {
  const lm_cli_textgen_opts *o;
  lm_model *m;
  lm_backend *be;
  lm_tokenizer *tok;
  lm_chat_template *tmpl; /* NULL: raw completion */
  lm_gen_config gc;
  int32_t *stop_ids;
  int32_t n_stop_ids;
  lm_gen *gen;
  json_t *kwargs;   /* template variables ({"enable_thinking": …}) or NULL */
  char *bos, *eos;  /* token strings for the template */
  int parse_gemma4; /* the vocabulary has Gemma 4's control tokens */
  lm_parser_tokens ptok;
  lm_parser *parser;  /* the response being streamed (template mode) */
  int64_t prompt_len; /* context tokens when the last response started */
  int wrote;          /* the response printed something on stdout */
  int in_reasoning;   /* reasoning is being printed on stderr */
} lm_cli_textgen;

/* Opens MODEL_DIR for generation; prints the error and returns 1 on failure. */
int lm_cli_textgen_open(lm_cli_textgen *t, const char *dir, const lm_cli_textgen_opts *o);
void lm_cli_textgen_close(lm_cli_textgen *t);

/* Checks that text is valid UTF-8; prints "lumen: WHAT is not valid UTF-8 (byte N)" and returns 1
 * otherwise. */
int lm_cli_check_utf8(const char *what, const char *text, size_t len);

/* Renders messages with the template (generation prompt added) into *prompt (malloc'ed) and gets
 * the output parser ready for the response. Tokenize the prompt without a BOS (the template writes
 * it). Prints the error and returns 1 on failure. */
int lm_cli_textgen_render(lm_cli_textgen *t, const json_t *messages, char **prompt);
/* Tokenizes plain text, with the tokenizer's BOS when bos is set. */
int lm_cli_textgen_encode(lm_cli_textgen *t, const char *text, int bos, int32_t **ids, size_t *n);

/* Generates one response after making the context ids[0..n) (sync = 1: reuse the longest cached
 * prefix) or after appending them (sync = 0), streaming it to stdout (ended by a newline), then
 * prints the timing line. Returns 0, or 1 after printing an error. */
int lm_cli_textgen_respond(lm_cli_textgen *t, const int32_t *ids, size_t n, int sync);
/* The last response's tokens decoded with every special token (what the context holds as text;
 * a stop id is not part of it). malloc'ed; NULL after printing an error. */
char *lm_cli_textgen_reply_text(lm_cli_textgen *t);

#endif
