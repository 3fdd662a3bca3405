/* cli_textgen.h — what `lumen run` and `lumen chat` share: their flags, opening a checkpoint with
 * an engine of one sequence (lumen.h: the same engine `lumen serve` runs), rendering a
 * conversation into ids, and streaming one response to the terminal (answer on stdout, reasoning
 * on stderr, tool calls as lines on stdout) with the timing line on stderr. Ctrl-C (SIGINT, read
 * from a signalfd: no handler, no global) cancels the response being generated. */
#ifndef LM_CLI_TEXTGEN_H
#define LM_CLI_TEXTGEN_H

#include <jansson.h>
#include <stdio.h>

#include "cli/cli_adapter.h"
#include "cli/cli_common.h"
#include "cli/cli_sampling.h"
#include "cli/cli_spec.h"
#include "lumen.h"

typedef struct lm_cli_textgen_opts {
  lm_cli_backend_opts be;
  lm_cli_sampling samp;
  int raw;            /* --raw: plain completion, no chat template */
  int raw_output;     /* --raw-output: print the decoded text as is (control tokens included) */
  const char *system; /* --system */
  int think;          /* -1: the template's default; 0: --no-think; 1: --think */
  int64_t chunk, ctx; /* --chunk, --ctx (0: defaults) */
  const char *kv_quant, *kv_config;       /* --kv-quant, --kv-config */
  int kv_group;                           /* --kv-group */
  int64_t kv_quant_start;                 /* --kv-quant-start */
  const char *save_state, *load_state;    /* --save-state, --load-state */
  const char *chat_template;              /* --chat-template FILE: instead of the checkpoint's */
  const char *grammar_file, *schema_file; /* --grammar FILE (GBNF), --json-schema FILE */
  lm_cli_spec spec;                       /* --spec, --spec-tokens */
  lm_cli_adapters ad;                     /* --adapter */
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
  lm_checkpoint *ck;
  lm_checkpoint_info ci;
  lm_engine *e;
  lm_sampling sampling; /* the checkpoint's defaults with the flags overlaid */
  int64_t max_tokens;
  char *kwargs; /* template variables as JSON ({"enable_thinking": …}) or NULL */
  int32_t *ctx; /* the context after the last response: its prompt and answer */
  int64_t n_ctx;
  int64_t prompt_len; /* context tokens when the last response started */
  int templ;          /* prompts go through the chat template (it has one, and not --raw) */
  int parse;          /* responses go through the output parser (templ, not --raw-output) */
  int starts_in_reasoning;
  int sigfd;                   /* SIGINT as a file descriptor (-1: none) */
  int interrupted;             /* the last response was cut by Ctrl-C */
  int wrote;                   /* the response printed something on stdout */
  int in_reasoning;            /* reasoning is being printed on stderr */
  char *grammar, *json_schema; /* the files' texts: every response is constrained by them */
} lm_cli_textgen;

/* Opens MODEL_DIR for generation; prints the error and returns 1 on failure. */
int lm_cli_textgen_open(lm_cli_textgen *t, const char *dir, const lm_cli_textgen_opts *o);
void lm_cli_textgen_close(lm_cli_textgen *t);

/* Checks that text is valid UTF-8; prints "lumen: WHAT is not valid UTF-8 (byte N)" and returns 1
 * otherwise. */
int lm_cli_check_utf8(const char *what, const char *text, size_t len);

/* Renders messages with the template (generation prompt added) into *prompt (lm_free) and notes
 * how the answer is to be parsed. Tokenize the prompt without a BOS (the template writes it).
 * Prints the error and returns 1 on failure. */
int lm_cli_textgen_render(lm_cli_textgen *t, const json_t *messages, char **prompt);
/* Tokenizes plain text, with the tokenizer's BOS when bos is set (*ids: lm_free). */
int lm_cli_textgen_encode(lm_cli_textgen *t, const char *text, int bos, int32_t **ids, size_t *n);

/* Generates one response after making the context ids[0..n) (sync = 1: the engine reuses the
 * longest cached prefix) or after appending them to the context (sync = 0), streaming it to stdout
 * (ended by a newline), then prints the timing line. Ctrl-C ends the response (t->interrupted).
 * Returns 0, or 1 after printing an error. */
int lm_cli_textgen_respond(lm_cli_textgen *t, const int32_t *ids, size_t n, int sync);
/* The last response's tokens decoded with every special token (what the context holds as text;
 * a stop id is not part of it). lm_free; NULL after printing an error. */
char *lm_cli_textgen_reply_text(lm_cli_textgen *t);

/* Forgets the conversation (the next response starts from an empty context). */
void lm_cli_textgen_reset(lm_cli_textgen *t);

/* Waits until stdin has input (1) or Ctrl-C was pressed (0). */
int lm_cli_textgen_wait_input(lm_cli_textgen *t);

/* --save-state / --load-state through the engine (the context the last response left). Print the
 * error and return 1 on failure. */
int lm_cli_textgen_save(lm_cli_textgen *t, const char *path);
int lm_cli_textgen_load(lm_cli_textgen *t, const char *path);

#endif
