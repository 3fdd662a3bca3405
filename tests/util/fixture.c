/* fixture.c — fixture file readers and the logits comparison used by the parity tests. */
#include "util/fixture.h"

#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int64_t lm_fx_read_ids(const char *path, int32_t **ids) {
  FILE *f = fopen(path, "r");
  *ids = NULL;
  if (!f) return 0;
  int64_t n = 0, cap = 256;
  int32_t *v = malloc((size_t)cap * sizeof *v);
  long x;
  while (v && fscanf(f, " %ld ,", &x) == 1) {
    if (n == cap) v = realloc(v, (size_t)(cap *= 2) * sizeof *v);
    if (v) v[n++] = (int32_t)x;
  }
  fclose(f);
  *ids = v;
  return v ? n : 0;
}

float *lm_fx_read_f32(const char *path, int64_t n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  float *v = malloc((size_t)n * sizeof *v);
  int ok = v && fread(v, sizeof *v, (size_t)n, f) == (size_t)n && fgetc(f) == EOF;
  fclose(f);
  if (!ok) {
    free(v);
    return NULL;
  }
  return v;
}

int64_t lm_fx_load(const char *dir, int64_t V, int32_t **ids, float **ref) {
  char p[1100];
  snprintf(p, sizeof p, "%s/ids.txt", dir);
  int64_t T = lm_fx_read_ids(p, ids);
  snprintf(p, sizeof p, "%s/logits.f32", dir);
  *ref = T ? lm_fx_read_f32(p, T * V) : NULL;
  if (*ref) return T;
  free(*ids);
  *ids = NULL;
  return 0;
}

int lm_fx_has_weights(const char *dir) {
  char p[1100];
  snprintf(p, sizeof p, "%s/model.safetensors", dir);
  if (access(p, R_OK) == 0) return 1;
  snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
  return access(p, R_OK) == 0;
}

int lm_fx_bound(const char *dir, const char *key, double *kl_max, double *argmax_min) {
  char p[1100];
  snprintf(p, sizeof p, "%s/meta.json", dir);
  json_t *j = json_load_file(p, 0, NULL);
  json_t *b = json_object_get(json_object_get(j, "tolerance"), key);
  json_t *k = json_object_get(b, "mean_kl_max"), *a = json_object_get(b, "argmax_agree_min");
  int ok = json_is_number(k) && json_is_number(a);
  if (ok) *kl_max = json_number_value(k), *argmax_min = json_number_value(a);
  json_decref(j);
  return ok ? 0 : -1;
}

int lm_fx_lora(const char *dir, char *base, size_t n, lm_fx_adapter *ad, int max) {
  char p[1100];
  snprintf(p, sizeof p, "%s/meta.json", dir);
  json_t *j = json_load_file(p, 0, NULL);
  json_t *b = json_object_get(j, "base"), *a = json_object_get(j, "adapters");
  int k = -1;
  if (json_is_string(b) && json_is_array(a) && (int)json_array_size(a) <= max) {
    snprintf(base, n, "%s/%s", dir, json_string_value(b));
    for (k = 0; k < (int)json_array_size(a); k++) {
      json_t *e = json_array_get(a, (size_t)k), *pa = json_object_get(e, "path"),
             *w = json_object_get(e, "weight");
      if (!json_is_string(pa)) {
        k = -1;
        break;
      }
      snprintf(ad[k].path, sizeof ad[k].path, "%s/%s", dir, json_string_value(pa));
      ad[k].weight = json_is_number(w) ? (float)json_number_value(w) : 1.0f;
    }
  }
  json_decref(j);
  return k;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

int lm_fx_list(const char *dir, const char *marker, char ***names) {
  *names = NULL;
  DIR *d = opendir(dir);
  if (!d) return 0;
  int n = 0;
  char **v = NULL;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char p[1024];
    snprintf(p, sizeof p, "%s/%s/%s", dir, e->d_name, marker);
    FILE *f = fopen(p, "rb");
    if (!f) continue;
    fclose(f);
    v = realloc(v, (size_t)(n + 1) * sizeof *v);
    v[n++] = strdup(e->d_name);
  }
  closedir(d);
  if (n) qsort(v, (size_t)n, sizeof *v, cmp_str);
  *names = v;
  return n;
}

void lm_fx_free_list(char **names, int n) {
  for (int i = 0; i < n; i++)
    free(names[i]);
  free(names);
}

static void log_softmax(const float *x, int64_t V, double *out) {
  double mx = x[0], s = 0;
  for (int64_t i = 1; i < V; i++)
    mx = x[i] > mx ? x[i] : mx;
  for (int64_t i = 0; i < V; i++)
    s += exp((double)x[i] - mx);
  double lse = mx + log(s);
  for (int64_t i = 0; i < V; i++)
    out[i] = (double)x[i] - lse;
}

lm_fx_cmp lm_fx_compare(const float *ref, const float *got, int64_t T, int64_t V) {
  lm_fx_cmp c = {0};
  c.T = T;
  double *lr = malloc((size_t)V * sizeof *lr), *lg = malloc((size_t)V * sizeof *lg);
  for (int64_t t = 0; t < T; t++) {
    const float *r = ref + t * V, *g = got + t * V;
    int64_t ar = 0, ag = 0;
    for (int64_t i = 0; i < V; i++) {
      double d = fabs((double)r[i] - g[i]);
      if (!(d <= c.max_abs_diff)) c.max_abs_diff = isnan(d) ? INFINITY : d;
      if (fabs(r[i]) > c.max_abs_ref) c.max_abs_ref = fabs(r[i]);
      if (r[i] > r[ar]) ar = i;
      if (g[i] > g[ag]) ag = i;
    }
    c.argmax_agree += ar == ag;
    log_softmax(r, V, lr);
    log_softmax(g, V, lg);
    double kl = 0;
    for (int64_t i = 0; i < V; i++)
      kl += exp(lr[i]) * (lr[i] - lg[i]);
    c.mean_kl += kl / (double)T;
  }
  free(lr);
  free(lg);
  return c;
}
