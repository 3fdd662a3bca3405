/* cli_common.c — shared CLI helpers. */
#include "cli/cli_common.h"

#include <dirent.h>
#include <errno.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/status.h"
#include "cli/cli_progress.h"
#include "hub/hub_cache.h"
#include "io/file_util.h"
#include "model/forward.h"
#include "text/tokenizer.h"
#include "text/utf8.h"
#ifdef LM_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

int lm_cli_fail(const char *what) {
  fprintf(stderr, "lumen: %s%s%s\n", what ? what : "", what && *lm_errmsg() ? ": " : "",
          lm_errmsg());
  return 1;
}

double lm_cli_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int lm_cli_parse_ids(const char *s, int32_t **ids, int64_t *n) {
  *ids = NULL;
  *n = 0;
  int64_t cap = 16;
  int32_t *v = malloc((size_t)cap * sizeof *v);
  if (!v) return 1;
  const char *p = s;
  while (*p) {
    char *end;
    errno = 0;
    long long x = strtoll(p, &end, 10);
    if (end == p || errno || x < 0 || x > INT32_MAX || (*end && *end != ',')) {
      fprintf(stderr, "lumen: --ids: '%s' is not a comma-separated list of non-negative integers\n",
              s);
      free(v);
      return 1;
    }
    if (*n == cap) {
      int32_t *nv = realloc(v, (size_t)(cap *= 2) * sizeof *v);
      if (!nv) {
        free(v);
        return 1;
      }
      v = nv;
    }
    v[(*n)++] = (int32_t)x;
    p = *end ? end + 1 : end;
  }
  if (!*n) {
    fprintf(stderr, "lumen: --ids: empty list\n");
    free(v);
    return 1;
  }
  *ids = v;
  return 0;
}

const char *lm_cli_backend_name(const lm_cli_backend_opts *o) {
  if (o->backend) return o->backend;
#ifdef LM_HAVE_CUDA
  if (lm_cuda_device_count() > 0) return "cuda"; /* default: the GPU when there is one */
#endif
  return "cpu";
}

lm_backend *lm_cli_backend(const lm_cli_backend_opts *o, lm_precision default_prec) {
  lm_precision prec = default_prec;
  if (o->precision) {
    if (!strcmp(o->precision, "f32"))
      prec = LM_PRECISION_F32;
    else if (!strcmp(o->precision, "fast"))
      prec = LM_PRECISION_FAST;
    else if (!strcmp(o->precision, "bf16"))
      prec = LM_PRECISION_BF16;
    else {
      fprintf(stderr, "lumen: --precision must be f32, fast or bf16 (got '%s')\n", o->precision);
      return NULL;
    }
  }
  if (o->threads > 0) omp_set_num_threads(o->threads);
  lm_backend *be = NULL;
  const char *name = lm_cli_backend_name(o);
  if (!strcmp(name, "cpu")) {
    if (lm_backend_cpu_create(prec, o->threads, &be)) lm_cli_fail("cpu backend");
    return be;
  }
  if (!strcmp(name, "cuda")) {
#ifdef LM_HAVE_CUDA
    if (lm_backend_cuda_create(prec, 0, &be)) lm_cli_fail("cuda backend");
#else
    fprintf(
        stderr,
        "lumen: --backend cuda: this build has no CUDA backend (configure with -DLUMEN_CUDA=ON)\n");
#endif
    return be;
  }
  fprintf(stderr, "lumen: --backend must be cpu or cuda (got '%s')\n", o->backend);
  return NULL;
}

lm_status lm_cli_model_dir(const char *arg, char *dir, size_t n) {
  LM_TRY(lm_hub_resolve(arg, dir, n));
  struct stat st;
  char cfg[4200];
  if (stat(dir, &st) || !S_ISDIR(st.st_mode))
    return LM_ERRF(LM_ERR_NOT_FOUND,
                   "%s is not a directory (a model is a directory with "
                   "config.json and safetensors, or ORG/REPO from the hub)",
                   arg);
  snprintf(cfg, sizeof cfg, "%s/config.json", dir);
  if (access(cfg, F_OK) && !strcmp(arg, dir))
    return LM_ERRF(LM_ERR_NOT_FOUND, "%s is not a model directory (no config.json)", arg);
  if (access(cfg, F_OK))
    return LM_ERRF(LM_ERR_NOT_FOUND, "%s is not a model (its snapshot %s has no config.json)", arg,
                   dir);
  return LM_OK;
}

lm_status lm_cli_checkpoint_open(const char *arg, lm_checkpoint **out) {
  char dir[4096];
  *out = NULL;
  LM_TRY(lm_cli_model_dir(arg, dir, sizeof dir));
  return lm_checkpoint_open(dir, out);
}

lm_status lm_cli_model_path(const char *arg, char *path, size_t n) {
  if (access(arg, F_OK) && lm_hub_looks_like_ref(arg)) return lm_hub_resolve(arg, path, n);
  if (strlen(arg) >= n) return LM_ERRF(LM_ERR_INVALID, "%.200s...: path too long", arg);
  memcpy(path, arg, strlen(arg) + 1);
  return LM_OK;
}

const char *lm_cli_model_id(const char *arg) {
  return arg && access(arg, F_OK) && lm_hub_looks_like_ref(arg) ? arg : NULL;
}

lm_model *lm_cli_load_model(const char *arg) {
  lm_model *m = NULL;
  char dir[4096];
  if (lm_cli_model_dir(arg, dir, sizeof dir) || lm_model_load(dir, &m)) {
    lm_cli_fail(NULL);
    return NULL;
  }
  return m;
}

lm_status lm_cli_prepare(lm_model *m, lm_backend *be) {
  lm_cli_progress pr;
  lm_cli_progress_start(&pr, "loading the weights", 0, "B");
  lm_status s = lm_model_prepare_progress(m, be, lm_cli_progress_cb, &pr);
  lm_cli_progress_end(&pr);
  return s;
}

int lm_cli_read_text(const char *flag, const char *path, char **out) {
  *out = NULL;
  FILE *f = NULL;
  if (lm_file_fopen_regular(path, &f)) return lm_cli_fail(flag);
  size_t cap = 1 << 22, n = 0;
  char *b = malloc(cap + 1);
  if (b) n = fread(b, 1, cap + 1, f);
  int err = ferror(f);
  fclose(f);
  const char *why = !b ? "out of memory" : err ? "cannot read it" : n > cap ? "over 4 MiB" : NULL;
  if (!why && !lm_utf8_valid(b, n)) why = "not valid UTF-8";
  if (!why && memchr(b, '\0', n)) why = "contains a NUL byte";
  if (why) {
    fprintf(stderr, "lumen: %s %s: %s\n", flag, path, why);
    free(b);
    return 1;
  }
  b[n] = '\0';
  *out = b;
  return 0;
}

int lm_cli_encode_text(const char *verb, const char *model_dir, const char *text, int32_t **ids,
                       int64_t *n) {
  lm_tokenizer *tok = NULL;
  size_t nn = 0;
  lm_status s = lm_tokenizer_load(model_dir, &tok);
  if (!s) s = lm_tokenizer_encode(tok, text, strlen(text), 1, ids, &nn);
  lm_tokenizer_free(tok);
  if (s) return fprintf(stderr, "lumen %s: %s\n", verb, lm_errmsg()), 1;
  *n = (int64_t)nn;
  return 0;
}

/* 1 when dir holds anything (a missing directory is empty). */
static int not_empty(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return errno != ENOENT;
  struct dirent *e;
  int any = 0;
  while (!any && (e = readdir(d)))
    any = strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
  closedir(d);
  return any;
}

int lm_cli_check_out_dir(const char *verb, const char *src, const char *out, int force) {
  struct stat a, b;
  if (!stat(src, &a) && !stat(out, &b) && a.st_dev == b.st_dev && a.st_ino == b.st_ino)
    return fprintf(stderr, "lumen %s: OUT_DIR %s is the source directory\n", verb, out), 2;
  if (!stat(out, &b) && !S_ISDIR(b.st_mode))
    return fprintf(stderr, "lumen %s: %s exists and is not a directory\n", verb, out), 2;
  if (!force && not_empty(out))
    return fprintf(stderr, "lumen %s: %s is not empty (give --force to write into it)\n", verb,
                   out),
           2;
  return 0;
}
