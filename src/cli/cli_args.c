/* cli_args.c — other tools' flag spellings (cli_args.h). */
#include "cli/cli_args.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum alias_kind {
  A_RENAME, /* the same meaning under lumen's name */
  A_MODEL,  /* the model: `--model` for serve, the first argument elsewhere */
  A_PROMPT, /* the prompt: the argument after the model */
  A_DROP,   /* the meaning is what lumen always does */
  A_HINT    /* a meaning lumen does not have: refused, with what to do instead */
} alias_kind;

typedef struct alias {
  const char *flag; /* as typed, before any "=value" */
  alias_kind kind;
  const char *to;    /* A_RENAME: lumen's flag; A_HINT: the hint */
  const char *verbs; /* " run chat " style list where it applies; NULL: every verb */
  int value;         /* the flag takes a value (the next argument, or "=value") */
} alias;

#define TEXT " run chat serve "
#define MODEL_VERBS                                                                                \
  " run chat serve info logits generate kv-eval quantize bench tokenize detokenize "
#define GPU_HINT "lumen runs the whole model on the chosen backend (--backend cuda or cpu)"
#define DEVICE_HINT "lumen runs on one device: --backend cuda or cpu"
#define ONE_GPU_HINT "lumen runs on one GPU: --backend cuda"
#define FLASH_HINT "lumen's attention is always fused; there is nothing to switch"
#define KV_HINT "quantized KV caches are --kv-quant 4|8|config|turboquant:K:V"
#define CHUNK_HINT "the prefill step is --chunk N"
#define HF_HINT "download with `lumen get ORG/REPO`, then name the model ORG/REPO"
#define CHAT_HINT "a conversation is `lumen chat MODEL`"

static const alias aliases[] = {
    {"-m", A_MODEL, NULL, MODEL_VERBS, 1},
    {"--model", A_MODEL, NULL, MODEL_VERBS, 1},
    {"-c", A_RENAME, "--ctx", TEXT " info ", 1},
    {"--ctx-size", A_RENAME, "--ctx", TEXT " info ", 1},
    {"-t", A_RENAME, "--threads", TEXT " bench kv-eval logits generate ", 1},
    {"-np", A_RENAME, "--parallel", " serve ", 1},
    {"--n-parallel", A_RENAME, "--parallel", " serve ", 1},
    {"--alias", A_RENAME, "--model-id", " serve ", 1},
    {"--served-model-name", A_RENAME, "--model-id", " serve ", 1},
    {"-s", A_RENAME, "--seed", TEXT " bench ", 1},
    {"--n-predict", A_RENAME, "-n", TEXT " generate ", 1},
    {"-sys", A_RENAME, "--system", " run chat ", 1},
    {"--system-prompt", A_RENAME, "--system", " run chat ", 1},
    {"--chat-template-file", A_RENAME, "--chat-template", TEXT, 1},
    {"-p", A_RENAME, "--prompt", " bench ", 1},
    {"-p", A_PROMPT, NULL, " run ", 1},
    {"--prompt", A_PROMPT, NULL, " run ", 1},
    {"--jinja", A_DROP, NULL, TEXT, 0},
    {"-cb", A_DROP, NULL, " serve ", 0},
    {"--cont-batching", A_DROP, NULL, " serve ", 0},
    {"-ngl", A_HINT, GPU_HINT, NULL, 1},
    {"--n-gpu-layers", A_HINT, GPU_HINT, NULL, 1},
    {"--gpu-layers", A_HINT, GPU_HINT, NULL, 1},
    {"-ot", A_HINT, GPU_HINT, NULL, 1},
    {"--override-tensor", A_HINT, GPU_HINT, NULL, 1},
    {"--cpu-moe", A_HINT, GPU_HINT, NULL, 0},
    {"--n-cpu-moe", A_HINT, GPU_HINT, NULL, 1},
    {"-dev", A_HINT, DEVICE_HINT, NULL, 1},
    {"--device", A_HINT, DEVICE_HINT, NULL, 1},
    {"-ts", A_HINT, ONE_GPU_HINT, NULL, 1},
    {"--tensor-split", A_HINT, ONE_GPU_HINT, NULL, 1},
    {"-sm", A_HINT, ONE_GPU_HINT, NULL, 1},
    {"--split-mode", A_HINT, ONE_GPU_HINT, NULL, 1},
    {"-fa", A_HINT, FLASH_HINT, NULL, 1},
    {"--flash-attn", A_HINT, FLASH_HINT, NULL, 1},
    {"-ctk", A_HINT, KV_HINT, NULL, 1},
    {"-ctv", A_HINT, KV_HINT, NULL, 1},
    {"--cache-type-k", A_HINT, KV_HINT, NULL, 1},
    {"--cache-type-v", A_HINT, KV_HINT, NULL, 1},
    {"-b", A_HINT, CHUNK_HINT, NULL, 1},
    {"--batch-size", A_HINT, CHUNK_HINT, NULL, 1},
    {"-ub", A_HINT, CHUNK_HINT, NULL, 1},
    {"--ubatch-size", A_HINT, CHUNK_HINT, NULL, 1},
    {"-hf", A_HINT, HF_HINT, NULL, 1},
    {"--hf-repo", A_HINT, HF_HINT, NULL, 1},
    {"-cnv", A_HINT, CHAT_HINT, NULL, 0},
    {"--conversation", A_HINT, CHAT_HINT, NULL, 0},
    {"-i", A_HINT, CHAT_HINT, NULL, 0},
    {"--interactive", A_HINT, CHAT_HINT, NULL, 0},
};
enum { N_ALIASES = sizeof aliases / sizeof *aliases };

static int applies(const alias *a, const char *verb) {
  if (!a->verbs) return 1;
  char key[64];
  snprintf(key, sizeof key, " %s ", verb);
  return strstr(a->verbs, key) != NULL;
}

/* The alias for token t of this verb; *eq points at "=value" of a long flag (else NULL). */
static const alias *find_alias(const char *verb, const char *t, const char **eq) {
  *eq = t[1] == '-' ? strchr(t, '=') : NULL;
  size_t n = *eq ? (size_t)(*eq - t) : strlen(t);
  for (int i = 0; i < N_ALIASES; i++)
    if (strlen(aliases[i].flag) == n && !strncmp(aliases[i].flag, t, n) &&
        applies(&aliases[i], verb))
      return &aliases[i];
  return NULL;
}

static int refuse(const char *verb, const char *t, const char *hint) {
  fprintf(stderr, "lumen %s: unknown flag '%.*s': %s\n", verb, (int)strcspn(t, "="), t, hint);
  return 2;
}

typedef struct builder {
  char **argv;
  int argc;
  const char *model, *prompt;
  char *owned;
  size_t used;
} builder;

/* "--to=value" in the owned block (sized for the whole command line). */
static char *join(builder *b, const char *to, const char *value) {
  char *s = b->owned + b->used;
  int k = sprintf(s, "%s=%s", to, value);
  b->used += (size_t)k + 1;
  return s;
}

/* One alias at argv[*i]; advances *i past its value. */
static int apply(builder *b, const alias *a, const char *verb, int argc, char **argv, int *i,
                 const char *eq) {
  const char *t = argv[*i], *value = eq ? eq + 1 : NULL;
  if (a->kind == A_HINT) return refuse(verb, t, a->to);
  if (a->value && !value) {
    if (*i + 1 >= argc) {
      fprintf(stderr, "lumen %s: flag '%s' needs a value\n", verb, t);
      return 2;
    }
    value = argv[++*i];
  }
  switch (a->kind) {
  case A_DROP: break;
  case A_MODEL:
    if (!strcmp(verb, "serve"))
      b->argv[b->argc++] = join(b, "--model", value);
    else
      b->model = value;
    break;
  case A_PROMPT: b->prompt = value; break;
  default:
    if (!a->value) {
      b->argv[b->argc++] = (char *)a->to;
    } else if (a->to[1] != '-') { /* a short flag takes its value as the next argument */
      b->argv[b->argc++] = (char *)a->to;
      b->argv[b->argc++] = (char *)value;
    } else {
      b->argv[b->argc++] = join(b, a->to, value);
    }
  }
  return 0;
}

int lm_cli_args_normalize(int argc, char **argv, lm_cli_args *out) {
  memset(out, 0, sizeof *out);
  size_t bytes = 64;
  for (int i = 0; i < argc; i++)
    bytes += strlen(argv[i]) + 32;
  builder b = {.argv = calloc((size_t)argc + 4, sizeof *b.argv), .owned = malloc(bytes)};
  if (!b.argv || !b.owned) {
    free(b.argv);
    free(b.owned);
    fprintf(stderr, "lumen: out of memory\n");
    return 2;
  }
  const char *verb = argv[0];
  b.argv[b.argc++] = argv[0];
  int model_at = b.argc++, rest = 0;
  for (int i = 1; i < argc; i++) {
    const char *t = argv[i], *eq;
    const alias *a = rest || t[0] != '-' || !t[1] ? NULL : find_alias(verb, t, &eq);
    if (!rest && !strcmp(t, "--")) rest = 1;
    if (!a) {
      b.argv[b.argc++] = argv[i];
      continue;
    }
    const char *had_model = b.model, *had_prompt = b.prompt;
    if ((a->kind == A_MODEL && had_model) || (a->kind == A_PROMPT && had_prompt)) {
      fprintf(stderr, "lumen %s: '%s' given twice\n", verb, t);
      goto fail;
    }
    if (apply(&b, a, verb, argc, argv, &i, eq)) goto fail;
  }
  /* the model first (getopt keeps the order of the arguments), the prompt last */
  if (b.model)
    b.argv[model_at] = (char *)b.model;
  else
    memmove(b.argv + model_at, b.argv + model_at + 1,
            (size_t)(--b.argc - model_at) * sizeof *b.argv);
  if (b.prompt) {
    if (!rest) b.argv[b.argc++] = "--";
    b.argv[b.argc++] = (char *)b.prompt;
  }
  b.argv[b.argc] = NULL;
  *out = (lm_cli_args){.argc = b.argc, .argv = b.argv, .owned = b.owned};
  return 0;
fail:
  free(b.argv);
  free(b.owned);
  return 2;
}

void lm_cli_args_free(lm_cli_args *a) {
  free(a->argv);
  free(a->owned);
  memset(a, 0, sizeof *a);
}

/* ---- getopt errors --------------------------------------------------------------------------- */

static size_t edit_distance(const char *a, size_t na, const char *b) {
  size_t nb = strlen(b), row[64];
  if (na >= 63 || nb >= 63) return 99;
  for (size_t j = 0; j <= nb; j++)
    row[j] = j;
  for (size_t i = 1; i <= na; i++) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= nb; j++) {
      size_t up = row[j], best = diag + (a[i - 1] != b[j - 1]);
      if (up + 1 < best) best = up + 1;
      if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
      diag = up;
      row[j] = best;
    }
  }
  return row[nb];
}

/* The known long flag nearest to name[0..n) (at most 2 edits away, or one it begins with). */
static const char *closest(const char *name, size_t n, const struct option *lo) {
  const char *best = NULL;
  size_t bd = 3;
  if (n < 3) return NULL; /* one or two letters are near too many flags to guess */
  for (; lo && lo->name; lo++) {
    size_t d = edit_distance(name, n, lo->name);
    if (n >= 3 && !strncmp(lo->name, name, n)) d = 1;
    if (d < bd) bd = d, best = lo->name;
  }
  return best;
}

int lm_cli_flag_error(int c, int argc, char **argv, const struct option *lo) {
  const char *verb = argv[0];
  /* getopt has stepped past the flag it could not use, except inside a cluster like -xv */
  const char *t = optind > 1 && optind <= argc ? argv[optind - 1] : "?";
  if (c == '?' && optopt && !(t[0] == '-' && t[1] != '-' && strchr(t + 1, optopt)) && optind < argc)
    t = argv[optind];
  if (c == ':') {
    fprintf(stderr, "lumen %s: flag '%.*s' needs a value (see `lumen %s --help`)\n", verb,
            (int)strcspn(t, "="), t, verb);
    return 2;
  }
  const char *name = t + strspn(t, "-");
  size_t n = strcspn(name, "=");
  const char *near = closest(name, n, lo);
  if (c == '?' && t[0] == '-' && t[1] != '-' && optopt) {
    fprintf(stderr, "lumen %s: unknown flag '-%c'%s%s%s (see `lumen %s --help`)\n", verb, optopt,
            near ? " (did you mean --" : "", near ? near : "", near ? "?)" : "", verb);
    return 2;
  }
  fprintf(stderr, "lumen %s: unknown flag '%.*s'%s%s%s (see `lumen %s --help`)\n", verb,
          (int)strcspn(t, "="), t, near ? " (did you mean --" : "", near ? near : "",
          near ? "?)" : "", verb);
  return 2;
}

int lm_cli_attached_word(int argc, char **argv, const char *arg) {
  const char *t = optind > 1 && optind <= argc ? argv[optind - 1] : NULL;
  if (!t || t[0] != '-' || t[1] == '-' || arg != t + 2) return 0;
  char *end;
  (void)strtod(arg, &end);
  if (end != arg && !*end) return 0;
  fprintf(stderr, "lumen %s: unknown flag '%s' (see `lumen %s --help`)\n", argv[0], t, argv[0]);
  return 2;
}
