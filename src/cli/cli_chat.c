/* cli_chat.c — `lumen chat MODEL_DIR`: an interactive multi-turn conversation.
 *
 * A turn is one line of input; a line ending in a backslash continues on the next line (the
 * backslash becomes a newline), so multi-line turns work the same typed or piped. Empty lines are
 * skipped. /reset starts a new conversation, /exit (or /quit, or end of input) leaves.
 *
 * The conversation lives in the KV cache: each turn renders the whole conversation with the chat
 * template. When the render starts with the text the context already holds (the last prompt and
 * the answer as generated), only the rest is tokenized and prefilled: normally just the new turn.
 * Otherwise (the template re-renders earlier turns differently: it drops old reasoning or an empty
 * thought channel, or trims the answer) the whole render is matched against the cache token by
 * token: the cache rolls back to the common prefix, or is prefilled again when a sliding-window
 * ring has wrapped and cannot roll back.
 * Without a chat template (or with --raw) the turns are plain text appended to the context. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/cli_textgen.h"

static const char *chat_help =
    "usage: lumen chat MODEL_DIR [options]\n"
    "       (MODEL_DIR may be ORG/REPO[@REV]: a model in the Hugging Face cache, see `lumen get`)\n"
    "\n"
    "Reads turns from stdin (typed or piped), one line each (end a line with \\ to continue it), "
    "and\n"
    "streams each answer to stdout followed by a newline; the timing line of each answer goes to\n"
    "stderr (\"cached N tok\": context tokens reused from the cache). Commands: /reset, /exit.\n"
    "\n";

typedef struct chat {
  lm_cli_textgen t;
  const lm_cli_textgen_opts *o;
  json_t *msgs;
  char *ctx_text;  /* the text the context holds (template mode), NULL: unknown */
  int turns;       /* raw mode: turns appended so far */
  int failed;      /* some turn failed */
  int interrupted; /* Ctrl-C at the prompt ended the session */
} chat;

/* Reads one turn (joining backslash-continued lines) into *buf; returns its length or -1 at EOF. */
static ssize_t read_turn(char **buf, size_t *cap) {
  char *line = NULL;
  size_t lcap = 0, n = 0;
  ssize_t k;
  int any = 0;
  while ((k = getline(&line, &lcap, stdin)) >= 0) {
    any = 1;
    while (k > 0 && (line[k - 1] == '\n' || line[k - 1] == '\r'))
      line[--k] = '\0';
    int more = k > 0 && line[k - 1] == '\\';
    if (more) line[k - 1] = '\n';
    if (n + (size_t)k + 1 > *cap) {
      size_t nc = (n + (size_t)k + 1) * 2;
      char *nb = realloc(*buf, nc);
      if (!nb) break;
      *buf = nb;
      *cap = nc;
    }
    memcpy(*buf + n, line, (size_t)k);
    n += (size_t)k;
    (*buf)[n] = '\0';
    if (!more) break;
  }
  free(line);
  return any ? (ssize_t)n : -1;
}

static void reset_conversation(chat *c) {
  json_array_clear(c->msgs);
  free(c->ctx_text);
  c->ctx_text = NULL;
  if (c->o->system && c->t.templ)
    json_array_append_new(c->msgs,
                          json_pack("{s:s,s:s}", "role", "system", "content", c->o->system));
  c->turns = 0;
}

/* Tokens to feed for the rendered conversation: when the render starts with the text the context
 * already holds, only the rest (the cached tokens stay exactly as generated, and nothing needs to
 * roll back); else all of it, for the engine's prefix cache to match token by token. */
static int turn_ids(chat *c, const char *prompt, int32_t **ids, size_t *n, int *sync) {
  size_t k = c->ctx_text ? strlen(c->ctx_text) : 0;
  *sync = !(k && !strncmp(prompt, c->ctx_text, k) && prompt[k]);
  return lm_cli_textgen_encode(&c->t, *sync ? prompt : prompt + k, 0, ids, n);
}

/* Remembers the turn: the answer as the model wrote it (the template drops what it does not
 * replay, e.g. old reasoning) and the text the context now holds. */
static int remember(chat *c, const char *prompt) {
  char *reply = lm_cli_textgen_reply_text(&c->t);
  if (!reply) return 1;
  json_array_append_new(c->msgs, json_pack("{s:s,s:s}", "role", "assistant", "content", reply));
  free(c->ctx_text);
  c->ctx_text = malloc(strlen(prompt) + strlen(reply) + 1);
  if (c->ctx_text) sprintf(c->ctx_text, "%s%s", prompt, reply);
  lm_free(reply);
  return 0;
}

/* One turn in chat-template mode: render everything, feed what the cache lacks, answer. */
static int template_turn(chat *c, const char *text) {
  json_array_append_new(c->msgs, json_pack("{s:s,s:s}", "role", "user", "content", text));
  int32_t *ids = NULL;
  size_t n = 0;
  char *prompt = NULL;
  int sync = 1, rc = lm_cli_textgen_render(&c->t, c->msgs, &prompt);
  if (!rc) rc = turn_ids(c, prompt, &ids, &n, &sync);
  if (!rc) rc = lm_cli_textgen_respond(&c->t, ids, n, sync);
  if (!rc) rc = remember(c, prompt);
  if (rc) { /* forget the turn; the next one re-syncs token by token */
    json_array_remove(c->msgs, json_array_size(c->msgs) - 1);
    free(c->ctx_text);
    c->ctx_text = NULL;
  }
  lm_free(ids);
  lm_free(prompt);
  return rc;
}

/* One turn without a template: the text is appended to the context as is. */
static int raw_turn(chat *c, const char *text) {
  int32_t *ids = NULL;
  size_t n = 0;
  char *with_nl = malloc(strlen(text) + 2);
  if (!with_nl) return 1;
  sprintf(with_nl, "%s%s", c->turns ? "\n" : "", text);
  int rc = lm_cli_textgen_encode(&c->t, with_nl, c->turns == 0, &ids, &n);
  free(with_nl);
  if (!rc && n) rc = lm_cli_textgen_respond(&c->t, ids, n, 0);
  lm_free(ids);
  if (!rc) c->turns++;
  return rc;
}

/* Handles one input; returns 1 to leave. */
static int handle(chat *c, const char *line, size_t len) {
  if (!strcmp(line, "/exit") || !strcmp(line, "/quit")) return 1;
  if (!strcmp(line, "/reset")) {
    reset_conversation(c);
    lm_cli_textgen_reset(&c->t);
    fprintf(stderr, "(new conversation)\n");
    return 0;
  }
  if (line[0] == '/' && !strchr(line, ' ') && len > 1) {
    fprintf(stderr, "lumen: unknown command %s (commands: /reset, /exit)\n", line);
    c->failed = 1;
    return 0;
  }
  if (lm_cli_check_utf8("the input", line, len)) {
    c->failed = 1;
    return 0;
  }
  if ((c->t.templ ? template_turn(c, line) : raw_turn(c, line))) c->failed = 1;
  return 0;
}

static void repl(chat *c) {
  int tty = isatty(STDIN_FILENO);
  /* unbuffered: the wait for input polls the descriptor, which cannot see lines that stdio has
   * already read ahead into its buffer */
  setvbuf(stdin, NULL, _IONBF, 0);
  char *buf = NULL;
  size_t cap = 0;
  for (;;) {
    if (tty) {
      fputs("> ", stdout);
      fflush(stdout);
    }
    if (!lm_cli_textgen_wait_input(&c->t)) { /* Ctrl-C at the prompt leaves */
      c->interrupted = 1;
      break;
    }
    ssize_t n = read_turn(&buf, &cap);
    if (n < 0) break;
    if (n == 0) continue;
    if (memchr(buf, '\0', (size_t)n)) {
      fprintf(stderr, "lumen: the input contains a NUL byte\n");
      c->failed = 1;
      continue;
    }
    if (handle(c, buf, (size_t)n)) break;
  }
  if (tty) fputc('\n', stdout);
  free(buf);
}

int lm_cli_chat(int argc, char **argv) {
  lm_cli_textgen_opts o;
  lm_cli_textgen_opts_init(&o);
  int done, rc = lm_cli_textgen_parse(&o, argc, argv, chat_help, &done);
  if (done) goto out;
  rc = 2;
  if (optind != argc - 1) {
    fputs(chat_help, stderr);
    goto out;
  }
  rc = 1;
  if (o.system && lm_cli_check_utf8("--system", o.system, strlen(o.system))) goto out;
  chat c = {.o = &o, .msgs = json_array()};
  if (!lm_cli_textgen_open(&c.t, argv[optind], &o)) {
    reset_conversation(&c);
    repl(&c);
    rc = c.interrupted ? 130 : c.failed;
  }
  lm_cli_textgen_close(&c.t);
  json_decref(c.msgs);
  free(c.ctx_text);
out:
  lm_cli_textgen_opts_free(&o);
  return rc;
}
