/* cli_run.c — `lumen run MODEL_DIR "prompt"`: one response to one prompt, streamed to stdout.
 * With a chat template the prompt becomes a user turn (after an optional system turn) and the
 * answer is parsed (reasoning on stderr, tool calls as lines); --raw, or a checkpoint without a
 * template, continues the prompt as plain text. The timing line goes to stderr. */
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/cli_textgen.h"

static const char *run_help =
    "usage: lumen run MODEL_DIR [PROMPT] [options]\n"
    "       (MODEL_DIR may be ORG/REPO[@REV]: a model in the Hugging Face cache, see `lumen get`)\n"
    "\n"
    "Generates a response to PROMPT (read from stdin when it is absent or '-') and streams it to\n"
    "stdout; \"prefill N tok @ X tok/s, decode M tok @ Y tok/s\" goes to stderr (decode speed "
    "counts\n"
    "forward steps). The sampling defaults come from the checkpoint's generation_config.json; it\n"
    "stops on any EOS id of config.json, generation_config.json and the tokenizer, on --stop\n"
    "strings and at --max-tokens. The output ends with a newline.\n"
    "\n";

/* Reads all of stdin into a NUL-terminated buffer. */
static char *read_stdin(size_t *len) {
  size_t cap = 4096, n = 0;
  char *b = malloc(cap);
  for (size_t k; b && (k = fread(b + n, 1, cap - n - 1, stdin)) > 0;) {
    n += k;
    if (cap - n - 1 == 0) {
      char *nb = realloc(b, cap *= 2);
      if (!nb) free(b);
      b = nb;
    }
  }
  if (b) b[n] = '\0';
  *len = n;
  return b;
}

static int run_prompt(lm_cli_textgen *t, const lm_cli_textgen_opts *o, const char *prompt) {
  int32_t *ids = NULL;
  size_t n = 0;
  int rc;
  if (t->templ) {
    json_t *msgs = json_array();
    if (o->system)
      json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "system", "content", o->system));
    json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "user", "content", prompt));
    char *text = NULL;
    rc = lm_cli_textgen_render(t, msgs, &text);
    json_decref(msgs);
    if (!rc) rc = lm_cli_textgen_encode(t, text, 0, &ids, &n);
    lm_free(text);
  } else {
    if (o->system && !o->raw) fprintf(stderr, "lumen: no chat template: --system is ignored\n");
    rc = lm_cli_textgen_encode(t, prompt, 1, &ids, &n);
  }
  if (!rc && n == 0) rc = (fprintf(stderr, "lumen: the prompt is empty\n"), 1);
  if (!rc && o->load_state) rc = lm_cli_textgen_load(t, o->load_state);
  /* sync: a loaded state keeps the tokens the prompt begins with */
  if (!rc) rc = lm_cli_textgen_respond(t, ids, n, 1);
  if (!rc && o->save_state) rc = lm_cli_textgen_save(t, o->save_state);
  lm_free(ids);
  if (!rc && t->interrupted) rc = 130; /* as a shell reports a SIGINT */
  return rc;
}

int lm_cli_run(int argc, char **argv) {
  lm_cli_textgen_opts o;
  lm_cli_textgen_opts_init(&o);
  int done, rc = lm_cli_textgen_parse(&o, argc, argv, run_help, &done);
  if (done) goto out;
  rc = 2;
  if (optind != argc - 1 && optind != argc - 2) {
    fputs(run_help, stderr);
    goto out;
  }
  const char *dir = argv[optind];
  char *owned = NULL;
  const char *prompt = optind == argc - 2 ? argv[optind + 1] : "-";
  size_t len = strlen(prompt);
  rc = 1;
  if (!strcmp(prompt, "-")) {
    if (!(prompt = owned = read_stdin(&len))) {
      fprintf(stderr, "lumen: cannot read the prompt from stdin\n");
      goto out;
    }
  }
  if (lm_cli_check_utf8("the prompt", prompt, len) ||
      (o.system && lm_cli_check_utf8("--system", o.system, strlen(o.system))))
    goto free_prompt;
  if (memchr(prompt, '\0', len)) {
    fprintf(stderr, "lumen: the prompt contains a NUL byte\n");
    goto free_prompt;
  }
  lm_cli_textgen t;
  rc = lm_cli_textgen_open(&t, dir, &o);
  if (!rc) rc = run_prompt(&t, &o, prompt);
  lm_cli_textgen_close(&t);
free_prompt:
  free(owned);
out:
  lm_cli_textgen_opts_free(&o);
  return rc;
}
