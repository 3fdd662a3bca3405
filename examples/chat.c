/*
 * chat.c — a minimal streaming chat on lumen's public API: lumen.h and libc, nothing else.
 *
 *     chat MODEL_DIR [--temp T] [--max-tokens N]
 *
 * Reads one user turn per line from stdin, streams the answer to stdout and keeps the whole
 * conversation as a JSON messages array that it builds itself. Greedy unless --temp is given.
 * After each answer a line "[N bytes, M tokens, T s]" goes to stderr.
 */
#define _POSIX_C_SOURCE 200809L /* getline */
#include <lumen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct buf {
  char *p;
  size_t len, cap;
} buf;

/* Appends s[0..n) and keeps the buffer NUL-terminated; exits when memory runs out. */
static void buf_add(buf *b, const char *s, size_t n) {
  if (b->len + n + 1 > b->cap) {
    size_t cap = (b->len + n + 1) * 2;
    char *p = realloc(b->p, cap);
    if (!p) {
      fputs("chat: out of memory\n", stderr);
      exit(1);
    }
    b->p = p, b->cap = cap;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = '\0';
}

/* Appends s[0..n) as a JSON string: quotes, backslashes and control bytes are escaped; other
 * bytes (UTF-8 included) pass as they are. */
static void buf_add_json(buf *b, const char *s, size_t n) {
  buf_add(b, "\"", 1);
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    char esc[8];
    if (c == '"' || c == '\\')
      snprintf(esc, sizeof esc, "\\%c", c);
    else if (c == '\n')
      strcpy(esc, "\\n");
    else if (c == '\t')
      strcpy(esc, "\\t");
    else if (c < 0x20 || c == 0x7f)
      snprintf(esc, sizeof esc, "\\u%04x", c);
    else
      esc[0] = (char)c, esc[1] = '\0';
    buf_add(b, esc, strlen(esc));
  }
  buf_add(b, "\"", 1);
}

/* Appends {"role":role,"content":text} to the array in conv (which has no closing bracket). */
static void add_message(buf *conv, const char *role, const char *text, size_t n) {
  buf_add(conv, conv->len > 1 ? ",{\"role\":\"" : "{\"role\":\"", conv->len > 1 ? 10 : 9);
  buf_add(conv, role, strlen(role));
  buf_add(conv, "\",\"content\":", 12);
  buf_add_json(conv, text, n);
  buf_add(conv, "}", 1);
}

static int fail(const char *what, lm_status st) {
  fprintf(stderr, "chat: %s: %s: %s\n", what, lm_status_name(st), lm_errmsg());
  return 1;
}

/* Runs one turn: streams the answer and appends it to the conversation. 0 on success. */
static int turn(lm_engine *e, buf *conv, float temp, long max_tokens) {
  lm_request_options ro;
  lm_request_options_init(&ro);
  buf_add(conv, "]", 1);
  ro.messages_json = conv->p;
  ro.sampling.temperature = temp;
  ro.max_tokens = max_tokens;
  lm_request *r;
  lm_status st = lm_request_submit(e, &ro, &r);
  conv->p[--conv->len] = '\0'; /* the bracket again off, for the next message */
  if (st != LM_OK) return fail("submit", st);
  lm_event ev;
  memset(&ev, 0, sizeof ev);
  while ((st = lm_request_next(r, -1, &ev)) == LM_OK && ev.kind != LM_EVENT_DONE) {
    if (ev.kind == LM_EVENT_CONTENT) fwrite(ev.text, 1, ev.len, stdout), fflush(stdout);
  }
  int rc = 0;
  if (st != LM_OK)
    rc = fail("generation", st);
  else if (ev.finish == LM_FIN_ERROR || ev.finish == LM_FIN_TIMEOUT)
    fprintf(stderr, "chat: %s\n", ev.error ? ev.error : "generation failed"), rc = 1;
  size_t len;
  const char *content = lm_request_content(r, &len);
  printf("\n");
  fprintf(stderr, "[%zu bytes, %lld tokens, %.2f s]\n", len, (long long)ev.usage.completion_tokens,
          ev.usage.prefill_s + ev.usage.decode_s);
  add_message(conv, "assistant", content, len);
  lm_request_free(r);
  return rc;
}

int main(int argc, char **argv) {
  float temp = 0; /* greedy */
  long max_tokens = 256;
  const char *dir = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--temp") && i + 1 < argc)
      temp = strtof(argv[++i], NULL);
    else if (!strcmp(argv[i], "--max-tokens") && i + 1 < argc)
      max_tokens = atol(argv[++i]);
    else if (!dir && argv[i][0] != '-')
      dir = argv[i];
    else
      dir = NULL, i = argc;
  }
  if (!dir) {
    fprintf(stderr, "usage: %s MODEL_DIR [--temp T] [--max-tokens N]\n", argv[0]);
    return 2;
  }
  lm_checkpoint *ck;
  lm_status st = lm_checkpoint_open(dir, &ck);
  if (st != LM_OK) return fail(dir, st);
  lm_engine_options eo;
  lm_engine_options_init(&eo);
  lm_engine *e;
  if ((st = lm_engine_create(ck, &eo, &e)) != LM_OK) {
    lm_checkpoint_free(ck);
    return fail("engine", st);
  }
  buf conv = {0}, line = {0};
  buf_add(&conv, "[", 1);
  int rc = 0;
  ssize_t n;
  while (rc == 0 && (fputs("> ", stderr), (n = getline(&line.p, &line.cap, stdin)) >= 0)) {
    while (n > 0 && (line.p[n - 1] == '\n' || line.p[n - 1] == '\r'))
      line.p[--n] = '\0';
    if (n == 0) continue;
    add_message(&conv, "user", line.p, (size_t)n);
    rc = turn(e, &conv, temp, max_tokens);
  }
  free(line.p);
  free(conv.p);
  lm_engine_free(e);
  lm_checkpoint_free(ck);
  return rc;
}
