/* cli_tokenize.c — `lumen tokenize` (text -> ids) and `lumen detokenize` (ids -> text).
 *
 * Both load a tokenizer.json (or a model directory holding one) once and then serve one input
 * (--text / --ids) or a batch of JSON lines (--jsonl), which is how the golden tests drive them.
 * Input text must be valid UTF-8: the CLI rejects anything else instead of repairing it. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/status.h"
#include "cli/cli.h"
#include "cli/cli_common.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

static const char tokenize_help[] =
    "usage: lumen tokenize TOKENIZER_OR_MODEL_DIR [--text S] [--no-special] [--jsonl] [--stats]\n"
    "\n"
    "Encodes text with a Hugging Face tokenizer.json (or the tokenizer.json and "
    "tokenizer_config.json\n"
    "of a model directory) and prints the ids as a JSON array.\n"
    "\n"
    "  --text S       the text to encode (default: all of standard input, byte for byte)\n"
    "  --no-special   add no BOS/EOS (added tokens written in the text are still recognised)\n"
    "  --jsonl        read one JSON string per input line; print one JSON array of ids per line\n"
    "  --stats        print the load time and the encode throughput to standard error\n"
    "\n"
    "Input that is not valid UTF-8 is rejected (exit 1).\n";

static const char detokenize_help[] =
    "usage: lumen detokenize TOKENIZER_OR_MODEL_DIR (--ids 1,2,3 | --jsonl) [--skip-special] "
    "[--stream]\n"
    "\n"
    "Decodes ids with the tokenizer's decoder and prints the text (nothing is added after it).\n"
    "\n"
    "  --ids LIST      comma-separated token ids\n"
    "  --jsonl         read one JSON array of ids per input line; print one JSON string per line\n"
    "  --skip-special  leave out special tokens\n"
    "  --stream        decode through the streaming detokenizer, one id at a time\n"
    "\n"
    "Ids that have no token are dropped, as Hugging Face tokenizers does.\n";

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int fail(const char *verb, lm_status s) {
  (void)s;
  fprintf(stderr, "lumen %s: %s\n", verb, lm_errmsg());
  return 1;
}

static int load(const char *verb, const char *path, lm_tokenizer **t, double *secs) {
  double t0 = now_s();
  char dir[4096];
  lm_status s = lm_cli_model_path(path, dir, sizeof dir);
  if (!s) s = lm_tokenizer_load(dir, t);
  *secs = now_s() - t0;
  return s == LM_OK ? 0 : fail(verb, s);
}

/* Reads all of stdin; returns NULL (with errno) on failure. */
static char *read_stdin(size_t *len) {
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap);
  while (buf) {
    size_t got = fread(buf + n, 1, cap - n, stdin);
    n += got;
    if (got == 0) break;
    if (n == cap) {
      char *nb = realloc(buf, cap * 2);
      if (!nb) free(buf);
      buf = nb;
      cap *= 2;
    }
  }
  if (buf && ferror(stdin)) {
    free(buf);
    return NULL;
  }
  *len = n;
  return buf;
}

/* Prints [a,b,c] and a newline; ids are non-negative. Formats by hand: printf per id would cost
 * as much as the encoding. */
static void print_ids(const int32_t *ids, size_t n) {
  char buf[4096];
  size_t w = 0;
  buf[w++] = '[';
  for (size_t i = 0; i < n; i++) {
    char digits[12];
    int k = 0;
    uint32_t v = (uint32_t)ids[i];
    do
      digits[k++] = (char)('0' + v % 10), v /= 10;
    while (v);
    if (w + (size_t)k + 2 > sizeof buf) fwrite(buf, 1, w, stdout), w = 0;
    if (i) buf[w++] = ',';
    while (k)
      buf[w++] = digits[--k];
  }
  buf[w++] = ']';
  buf[w++] = '\n';
  fwrite(buf, 1, w, stdout);
}

typedef struct tok_opts {
  const char *path, *text;
  int add_special, jsonl, stats;
} tok_opts;

typedef struct tok_stats {
  double secs;
  size_t bytes;
} tok_stats;

static int encode_one(const lm_tokenizer *t, const tok_opts *o, const char *s, size_t n,
                      tok_stats *st) {
  int32_t *ids;
  size_t n_ids;
  double t0 = now_s();
  lm_status r = lm_tokenizer_encode(t, s, n, o->add_special, &ids, &n_ids);
  st->secs += now_s() - t0;
  st->bytes += n;
  if (r != LM_OK) return fail("tokenize", r);
  print_ids(ids, n_ids);
  free(ids);
  return 0;
}

static int encode_jsonl(const lm_tokenizer *t, const tok_opts *o, tok_stats *st) {
  char *line = NULL;
  size_t cap = 0, lineno = 0;
  ssize_t got;
  int rc = 0;
  while (rc == 0 && (got = getline(&line, &cap, stdin)) >= 0) {
    json_error_t e;
    lineno++;
    json_t *v = json_loadb(line, (size_t)got, JSON_DECODE_ANY | JSON_ALLOW_NUL, &e);
    if (!json_is_string(v)) {
      fprintf(stderr, "lumen tokenize: stdin line %zu: not a JSON string%s%s\n", lineno,
              v ? "" : ": ", v ? "" : e.text);
      rc = 1;
    } else
      rc = encode_one(t, o, json_string_value(v), json_string_length(v), st);
    json_decref(v);
  }
  free(line);
  return rc;
}

static int parse_tokenize_args(int argc, char **argv, tok_opts *o) {
  memset(o, 0, sizeof *o);
  o->add_special = 1;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      fputs(tokenize_help, stdout);
      return -1;
    } else if (!strcmp(argv[i], "--text") && i + 1 < argc)
      o->text = argv[++i];
    else if (!strcmp(argv[i], "--no-special"))
      o->add_special = 0;
    else if (!strcmp(argv[i], "--jsonl"))
      o->jsonl = 1;
    else if (!strcmp(argv[i], "--stats"))
      o->stats = 1;
    else if (argv[i][0] != '-' && !o->path)
      o->path = argv[i];
    else {
      fprintf(stderr, "lumen tokenize: %s '%s' (see `lumen tokenize --help`)\n",
              argv[i][0] == '-' ? "unknown flag" : "unexpected argument", argv[i]);
      return 2;
    }
  }
  if (!o->path || (o->text && o->jsonl)) {
    fputs(tokenize_help, stderr);
    return 2;
  }
  return 0;
}

static int encode_raw(const lm_tokenizer *t, const tok_opts *o, tok_stats *st) {
  size_t n = 0;
  char *owned = NULL;
  const char *s = o->text;
  if (s)
    n = strlen(s);
  else if (!(s = owned = read_stdin(&n))) {
    fprintf(stderr, "lumen tokenize: cannot read standard input: %s\n", strerror(errno));
    return 1;
  }
  int rc;
  if (!lm_utf8_valid(s, n)) {
    fprintf(stderr, "lumen tokenize: the input text is not valid UTF-8\n");
    rc = 1;
  } else
    rc = encode_one(t, o, s, n, st);
  free(owned);
  return rc;
}

int lm_cli_tokenize(int argc, char **argv) {
  tok_opts o;
  int rc = parse_tokenize_args(argc, argv, &o);
  if (rc) return rc < 0 ? 0 : rc;
  lm_tokenizer *t;
  tok_stats st = {0, 0};
  double load_s;
  if (load("tokenize", o.path, &t, &load_s)) return 1;
  rc = o.jsonl ? encode_jsonl(t, &o, &st) : encode_raw(t, &o, &st);
  if (o.stats)
    fprintf(stderr, "lumen tokenize: load %.1f ms; encode %zu bytes in %.1f ms (%.2f MB/s)\n",
            load_s * 1e3, st.bytes, st.secs * 1e3,
            st.secs > 0 ? (double)st.bytes / st.secs / 1e6 : 0.0);
  lm_tokenizer_free(t);
  fflush(stdout);
  return rc;
}

/* ---- detokenize --------------------------------------------------------------------------- */
typedef struct detok_opts {
  const char *path, *ids;
  int skip_special, jsonl, stream;
} detok_opts;

static int parse_ids(const char *list, int32_t **ids, size_t *n) {
  size_t cap = 16;
  *n = 0;
  *ids = malloc(cap * sizeof **ids);
  for (const char *p = list; *ids && *p;) {
    char *end;
    errno = 0;
    long v = strtol(p, &end, 10);
    if (end == p || errno || v < 0 || v > INT32_MAX || (*end && *end != ',')) {
      fprintf(stderr, "lumen detokenize: --ids: '%s' is not a list of non-negative integers\n",
              list);
      free(*ids);
      return 2;
    }
    if (*n == cap) {
      int32_t *nv = realloc(*ids, (cap *= 2) * sizeof **ids);
      if (!nv) free(*ids);
      *ids = nv;
      if (!nv) break;
    }
    (*ids)[(*n)++] = (int32_t)v;
    p = *end ? end + 1 : end;
  }
  if (!*ids) {
    fprintf(stderr, "lumen detokenize: out of memory\n");
    return 1;
  }
  return 0;
}

/* Decodes in one call, or id by id through the streaming detokenizer. */
static lm_status decode_ids(const lm_tokenizer *t, const detok_opts *o, const int32_t *ids,
                            size_t n, char **text, size_t *len) {
  if (!o->stream) return lm_tokenizer_decode(t, ids, n, o->skip_special, text, len);
  lm_detok *d;
  lm_status s = lm_detok_create(t, o->skip_special, &d);
  if (s != LM_OK) return s;
  size_t cap = 64, w = 0;
  char *out = malloc(cap);
  for (size_t i = 0; i <= n && s == LM_OK && out; i++) {
    const char *piece;
    size_t pl;
    s = i < n ? lm_detok_push(d, ids[i], &piece, &pl) : lm_detok_flush(d, &piece, &pl);
    if (s != LM_OK) break;
    while (w + pl + 1 > cap) {
      char *no = realloc(out, cap *= 2);
      if (!no) free(out);
      out = no;
      if (!no) break;
    }
    if (out) memcpy(out + w, piece, pl), w += pl;
  }
  lm_detok_free(d);
  if (s == LM_OK && !out) s = LM_ERRF(LM_ERR_NOMEM, "out of memory");
  if (s != LM_OK) {
    free(out);
    return s;
  }
  out[w] = '\0';
  *text = out;
  *len = w;
  return LM_OK;
}

static int decode_print(const lm_tokenizer *t, const detok_opts *o, const int32_t *ids, size_t n) {
  char *text;
  size_t len;
  lm_status s = decode_ids(t, o, ids, n, &text, &len);
  if (s != LM_OK) return fail("detokenize", s);
  if (o->jsonl) {
    json_t *j = json_stringn(text, len);
    char *dump = j ? json_dumps(j, JSON_ENCODE_ANY) : NULL;
    if (dump) puts(dump);
    free(dump);
    json_decref(j);
    if (!dump) {
      free(text);
      fprintf(stderr, "lumen detokenize: cannot encode the text as JSON\n");
      return 1;
    }
  } else
    fwrite(text, 1, len, stdout);
  free(text);
  return 0;
}

/* One line: a JSON array of non-negative integers. */
static int line_ids(const json_t *v, size_t lineno, int32_t **ids, size_t *n) {
  *ids = NULL, *n = 0;
  if (!json_is_array(v)) goto bad;
  *ids = malloc((json_array_size(v) + 1) * sizeof **ids);
  if (!*ids) return 1;
  for (size_t i = 0; i < json_array_size(v); i++) {
    const json_t *x = json_array_get(v, i);
    if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > INT32_MAX)
      goto bad;
    (*ids)[(*n)++] = (int32_t)json_integer_value(x);
  }
  return 0;
bad:
  free(*ids);
  *ids = NULL;
  fprintf(stderr, "lumen detokenize: stdin line %zu: not a JSON array of non-negative integers\n",
          lineno);
  return 1;
}

static int decode_jsonl(const lm_tokenizer *t, const detok_opts *o) {
  char *line = NULL;
  size_t cap = 0, lineno = 0;
  ssize_t got;
  int rc = 0;
  while (rc == 0 && (got = getline(&line, &cap, stdin)) >= 0) {
    json_error_t e;
    int32_t *ids;
    size_t n;
    json_t *v = json_loadb(line, (size_t)got, 0, &e);
    rc = line_ids(v, ++lineno, &ids, &n);
    if (rc == 0) rc = decode_print(t, o, ids, n);
    free(ids);
    json_decref(v);
  }
  free(line);
  return rc;
}

static int parse_detokenize_args(int argc, char **argv, detok_opts *o) {
  memset(o, 0, sizeof *o);
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      fputs(detokenize_help, stdout);
      return -1;
    } else if (!strcmp(argv[i], "--ids") && i + 1 < argc)
      o->ids = argv[++i];
    else if (!strcmp(argv[i], "--skip-special"))
      o->skip_special = 1;
    else if (!strcmp(argv[i], "--jsonl"))
      o->jsonl = 1;
    else if (!strcmp(argv[i], "--stream"))
      o->stream = 1;
    else if (argv[i][0] != '-' && !o->path)
      o->path = argv[i];
    else {
      fprintf(stderr, "lumen detokenize: %s '%s' (see `lumen detokenize --help`)\n",
              argv[i][0] == '-' ? "unknown flag" : "unexpected argument", argv[i]);
      return 2;
    }
  }
  if (!o->path || !o->ids == !o->jsonl) {
    fputs(detokenize_help, stderr);
    return 2;
  }
  return 0;
}

int lm_cli_detokenize(int argc, char **argv) {
  detok_opts o;
  int rc = parse_detokenize_args(argc, argv, &o);
  if (rc) return rc < 0 ? 0 : rc;
  int32_t *ids = NULL;
  size_t n = 0;
  if (o.ids && (rc = parse_ids(o.ids, &ids, &n))) return rc;
  lm_tokenizer *t;
  double load_s;
  if (load("detokenize", o.path, &t, &load_s)) {
    free(ids);
    return 1;
  }
  rc = o.jsonl ? decode_jsonl(t, &o) : decode_print(t, &o, ids, n);
  free(ids);
  lm_tokenizer_free(t);
  fflush(stdout);
  return rc;
}
