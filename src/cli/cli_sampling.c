/* cli_sampling.c — the sampling/stopping flag table (see cli_sampling.h). */
#include "cli/cli_sampling.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/rng.h"
#include "base/status.h"

typedef enum kind { K_FLOAT, K_INT32, K_U64, K_BIAS, K_STOP, K_MAX_TOKENS } kind;

typedef struct flag {
  const char *name;
  kind k;
  size_t off; /* field of lm_sampling (K_FLOAT, K_INT32, K_U64) */
  const char *arg, *help;
} flag;

#define F(field) offsetof(lm_sampling, field)
static const flag table[] = {
    {"temperature", K_FLOAT, F(temperature), "T",
     "sampling temperature; 0 = greedy (alias --temp)"},
    {"temp", K_FLOAT, F(temperature), "T", NULL},
    {"top-k", K_INT32, F(top_k), "K", "keep the K most likely tokens; 0 = off"},
    {"top-p", K_FLOAT, F(top_p), "P", "nucleus sampling: the smallest set with mass >= P; 1 = off"},
    {"min-p", K_FLOAT, F(min_p), "P", "drop tokens less likely than P x the most likely; 0 = off"},
    {"repeat-penalty", K_FLOAT, F(repeat_penalty), "R",
     "divide the logits of recent tokens by R; 1 = off"},
    {"repeat-last-n", K_INT32, F(repeat_last_n), "N",
     "window of --repeat-penalty; -1 = all, 0 = off (64)"},
    {"presence-penalty", K_FLOAT, F(presence_penalty), "X",
     "subtract X from tokens seen in the window"},
    {"frequency-penalty", K_FLOAT, F(frequency_penalty), "X",
     "subtract X per occurrence in the window"},
    {"penalty-last-n", K_INT32, F(penalty_last_n), "N",
     "window of the presence/frequency penalties (64)"},
    {"seed", K_U64, F(seed), "S", "random seed (default: a new one each run)"},
    {"logit-bias", K_BIAS, 0, "ID=V", "add V to the logit of token ID (V may be -inf); repeatable"},
    {"stop", K_STOP, 0, "STR", "stop when the text contains STR (not printed); repeatable"},
    {"max-tokens", K_MAX_TOKENS, 0, "N",
     "generate at most N tokens (alias -n; default: the checkpoint's or none)"},
};
#undef F
enum { N_FLAGS = sizeof table / sizeof *table };

void lm_cli_sampling_init(lm_cli_sampling *c) {
  memset(c, 0, sizeof *c);
  lm_sampling_init(&c->s);
  c->max_tokens = -1;
}

void lm_cli_sampling_free(lm_cli_sampling *c) {
  lm_sampling_clear(&c->s);
  free(c->stops);
  c->stops = NULL;
  c->n_stops = 0;
}

int lm_cli_sampling_options(struct option *opts, int n, int cap) {
  if (n + N_FLAGS + 1 > cap) return -1;
  for (int i = 0; i < N_FLAGS; i++)
    opts[n++] = (struct option){table[i].name, required_argument, NULL, LM_CLI_SAMPLING_BASE + i};
  opts[n] = (struct option){0, 0, 0, 0};
  return n;
}

int lm_cli_sampling_opt(const char *name) {
  for (int i = 0; i < N_FLAGS; i++)
    if (!strcmp(table[i].name, name)) return LM_CLI_SAMPLING_BASE + i;
  return -1;
}

void lm_cli_sampling_help(FILE *f) {
  for (int i = 0; i < N_FLAGS; i++) {
    if (!table[i].help) continue;
    char lhs[64];
    snprintf(lhs, sizeof lhs, "--%s %s", table[i].name, table[i].arg);
    fprintf(f, "  %-24s %s\n", lhs, table[i].help);
  }
}

static int bad(const flag *fl, const char *arg, const char *why) {
  fprintf(stderr, "lumen: --%s: '%s' %s\n", fl->name, arg, why);
  return -1;
}

static int parse_double(const char *s, double *out) {
  char *end;
  errno = 0;
  double x = strtod(s, &end);
  if (end == s || *end || errno == ERANGE) return -1;
  *out = x;
  return 0;
}

static int parse_ll(const char *s, long long *out) {
  char *end;
  errno = 0;
  long long x = strtoll(s, &end, 10);
  if (end == s || *end || errno) return -1;
  *out = x;
  return 0;
}

static int handle_bias(lm_cli_sampling *c, const flag *fl, const char *arg) {
  const char *eq = strchr(arg, '=');
  char id_s[32];
  double v;
  long long id;
  if (!eq || eq - arg >= (ptrdiff_t)sizeof id_s) return bad(fl, arg, "is not ID=VALUE");
  memcpy(id_s, arg, (size_t)(eq - arg));
  id_s[eq - arg] = '\0';
  if (parse_ll(id_s, &id) || id < 0 || id > INT32_MAX)
    return bad(fl, arg, "does not start with a token id");
  if (parse_double(eq + 1, &v) || isnan(v) || v == INFINITY)
    return bad(fl, arg, "does not end with a number or -inf");
  if (lm_sampling_add_bias(&c->s, (int32_t)id, (float)v)) return bad(fl, arg, "could not be added");
  return 1;
}

static int handle_value(lm_cli_sampling *c, const flag *fl, const char *arg) {
  char *field = (char *)&c->s + fl->off;
  double d;
  long long x;
  switch (fl->k) {
  case K_FLOAT:
    if (parse_double(arg, &d) || !isfinite(d)) return bad(fl, arg, "is not a number");
    *(float *)field = (float)d;
    return 1;
  case K_INT32:
    if (parse_ll(arg, &x) || x < -1 || x > INT32_MAX)
      return bad(fl, arg, "is not an integer >= -1");
    *(int32_t *)field = (int32_t)x;
    return 1;
  case K_U64:
    if (parse_ll(arg, &x) || x < 0) return bad(fl, arg, "is not a non-negative integer");
    *(uint64_t *)field = (uint64_t)x;
    return 1;
  case K_MAX_TOKENS:
    if (parse_ll(arg, &x) || x < 1) return bad(fl, arg, "is not a positive integer");
    c->max_tokens = x;
    return 1;
  case K_STOP: {
    if (!*arg) return bad(fl, arg, "is empty");
    const char **v = realloc(c->stops, (size_t)(c->n_stops + 1) * sizeof *v);
    if (!v) return bad(fl, arg, "could not be added (out of memory)");
    c->stops = v;
    v[c->n_stops++] = arg;
    return 1;
  }
  case K_BIAS: return handle_bias(c, fl, arg);
  }
  return 0;
}

int lm_cli_sampling_handle(lm_cli_sampling *c, int opt, const char *arg) {
  int i = opt - LM_CLI_SAMPLING_BASE;
  if (i < 0 || i >= N_FLAGS) return 0;
  int r = handle_value(c, &table[i], arg);
  if (r == 1) c->set |= 1u << i;
  return r;
}

/* A seed for runs without --seed: the clock and the process id, mixed. */
static uint64_t fresh_seed(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return lm_mix64((uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^
                  ((uint64_t)getpid() << 44)) >>
         1;
}

lm_status lm_cli_sampling_apply(const lm_cli_sampling *c, const lm_sampling *defaults,
                                lm_sampling *out) {
  LM_TRY(lm_sampling_copy(out, defaults));
  out->seed = fresh_seed();
  for (int i = 0; i < N_FLAGS; i++) {
    if (!(c->set & (1u << i))) continue;
    const flag *fl = &table[i];
    const char *src = (const char *)&c->s + fl->off;
    char *dst = (char *)out + fl->off;
    if (fl->k == K_FLOAT)
      memcpy(dst, src, sizeof(float));
    else if (fl->k == K_INT32)
      memcpy(dst, src, sizeof(int32_t));
    else if (fl->k == K_U64)
      memcpy(dst, src, sizeof(uint64_t));
  }
  for (int32_t i = 0; i < c->s.n_bias; i++) {
    lm_status s = lm_sampling_add_bias(out, c->s.bias[i].id, c->s.bias[i].bias);
    if (s) {
      lm_sampling_clear(out);
      return s;
    }
  }
  return LM_OK;
}
