/* cli_common.h — helpers shared by the CLI verbs: id lists, backend flags, model setup. */
#ifndef LM_CLI_COMMON_H
#define LM_CLI_COMMON_H

#include <stdint.h>
#include <stdio.h>

#include "backend/backend.h"
#include "model/model.h"

/* Parses "2,17,300" into a malloc'ed array. Returns 0 on success, prints an error otherwise. */
int lm_cli_parse_ids(const char *s, int32_t **ids, int64_t *n);

/* Backend selection flags shared by logits/run/bench/serve. */
typedef struct lm_cli_backend_opts {
  const char *backend;   /* "cpu", "cuda" or NULL (auto) */
  const char *precision; /* "f32", "fast" or NULL (verb default) */
  int threads;           /* 0: OpenMP default */
} lm_cli_backend_opts;

/* The backend lm_cli_backend would create: --backend as given, else "cuda" when a device is
 * visible, else "cpu". */
const char *lm_cli_backend_name(const lm_cli_backend_opts *o);

/* Creates the backend the flags ask for; prints the error and returns NULL on failure.
 * default_prec is the verb's default precision. */
lm_backend *lm_cli_backend(const lm_cli_backend_opts *o, lm_precision default_prec);

/* A MODEL argument — a model directory, or ORG/REPO[@REV] from the Hugging Face cache (where
 * `lumen get` puts it) — as a directory in dir. LM_ERR_NOT_FOUND with a message that says which:
 * no such directory, a directory without config.json, or not in the cache and how to get it. */
lm_status lm_cli_model_dir(const char *arg, char *dir, size_t n);
/* lm_checkpoint_open of a MODEL argument (lm_cli_model_dir first); the error is not printed. */
lm_status lm_cli_checkpoint_open(const char *arg, lm_checkpoint **out);
/* A path argument that may also be a model: ORG/REPO[@REV], when no such path exists, becomes
 * its cached snapshot; any other argument is copied as it is. */
lm_status lm_cli_model_path(const char *arg, char *path, size_t n);
/* The name a served model goes by: arg when it names a cached ORG/REPO[@REV], else NULL (the
 * directory's own name, a commit hash for a snapshot, would say nothing). */
const char *lm_cli_model_id(const char *arg);

/* Loads a model from a MODEL argument, printing the error on failure. */
lm_model *lm_cli_load_model(const char *arg);

/* lm_model_prepare with a progress line while a device backend takes the weights. */
lm_status lm_cli_prepare(lm_model *m, lm_backend *be);

/* Prints "lumen: <message>" for the current thread's error and returns 1. */
int lm_cli_fail(const char *what);

/* Monotonic seconds. */
double lm_cli_now(void);

/* Reads a text file named by flag (a grammar, a schema: at most 4 MiB, valid UTF-8, no NUL) into
 * *out (malloc'ed, NUL-terminated). Prints "lumen: FLAG PATH: why" and returns 1 on failure. */
int lm_cli_read_text(const char *flag, const char *path, char **out);

/* Tokenizes text with the tokenizer of a model directory (its tokenizer.json and
 * tokenizer_config.json), BOS first where the tokenizer adds one. Prints "lumen VERB: why" and
 * returns 1 on failure. */
int lm_cli_encode_text(const char *verb, const char *model_dir, const char *text, int32_t **ids,
                       int64_t *n);

/* The output directory of a converting verb: not the source, and not a non-empty directory
 * unless force (a mistyped OUT_DIR must not replace someone's checkpoint). 0, or 2 after
 * printing why. */
int lm_cli_check_out_dir(const char *verb, const char *src, const char *out, int force);

#endif
