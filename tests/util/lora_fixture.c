/* lora_fixture.c — see lora_fixture.h. */
#include "util/lora_fixture.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "model/forward.h"
#include "model/lora.h"
#include "util/fixture.h"

/* Logits of tok[0..T): the first P in one step, the rest one by one; NULL on an error. */
static float *feed(lm_model *m, lm_backend *be, lm_lora *const *set, int n, const int32_t *tok,
                   int64_t T, int64_t P) {
  int64_t V = m->cfg.vocab_size;
  float *out = malloc((size_t)(T * V) * sizeof(float));
  lm_forward *f = NULL;
  lm_kv_set *kv = NULL;
  lm_kv_spec specs[m->cfg.n_caches + 1];
  lm_model_kv_specs(m, specs);
  lm_status s = out ? lm_forward_create(m, be, P, P, &f) : LM_ERR_NOMEM;
  if (!s) s = lm_forward_set_adapters(f, set, n);
  if (!s) s = lm_kv_set_create(be, specs, m->cfg.n_caches, &kv);
  if (!s) s = lm_forward_feed(f, kv, tok, P, P, out);
  if (!s && T > P) s = lm_forward_feed(f, kv, tok + P, T - P, 1, out + P * V);
  if (s) fprintf(stderr, "  %s\n", lm_errmsg());
  lm_kv_set_free(kv);
  lm_forward_free(f);
  if (s) free(out);
  return s ? NULL : out;
}

static int check_one(const char *name, const char *dir, lm_backend *be) {
  char base[2300];
  lm_fx_adapter ad[4];
  int na = lm_fx_lora(dir, base, sizeof base, ad, 4), fails = 0;
  lm_model *m = NULL;
  lm_lora *set[4] = {0};
  int32_t *tok = NULL;
  float *ref = NULL;
  lm_status s = lm_model_load(base, &m);
  if (!s) s = lm_model_prepare(m, be); /* a device backend holds its own copy */
  for (int k = 0; !s && k < na; k++)
    s = lm_lora_load(m, ad[k].path, ad[k].weight, &set[k]);
  int64_t T = s ? 0 : lm_fx_load(dir, m->cfg.vocab_size, &tok, &ref);
  if (s || T < 2) {
    printf("  %-20s cannot be read: %s  FAIL\n", name, s ? lm_errmsg() : "ids/logits");
    fails = 1;
  }
  for (int mode = 0; !fails && mode < 2; mode++) {
    float *got = feed(m, be, set, na, tok, T, mode ? T / 2 : T);
    lm_fx_cmp c = got ? lm_fx_compare(ref, got, T, m->cfg.vocab_size) : (lm_fx_cmp){0};
    int ok = got && c.max_abs_diff <= 1e-3 * c.max_abs_ref && c.argmax_agree == T;
    printf("  %-20s %-5s %-14s max|d|=%.3g (bound %.3g) argmax %lld/%lld %s\n", name, be->ops->name,
           mode ? "prefill+decode" : "one pass", c.max_abs_diff, 1e-3 * c.max_abs_ref,
           (long long)c.argmax_agree, (long long)T, ok ? "ok" : "FAIL");
    fails += !ok;
    free(got);
  }
  for (int k = 0; k < 4; k++)
    lm_lora_free(set[k]);
  free(tok), free(ref);
  lm_model_free(m);
  return fails;
}

int lm_fx_lora_check_all(const char *dir, lm_backend *be, int *checked) {
  char **names;
  int n = lm_fx_list(dir, "meta.json", &names), fails = 0;
  *checked = 0;
  for (int i = 0; i < n; i++) {
    char d[1100], base[2300];
    lm_fx_adapter ad[4];
    snprintf(d, sizeof d, "%s/%s", dir, names[i]);
    if (strncmp(names[i], "lora_", 5) || lm_fx_lora(d, base, sizeof base, ad, 4) < 1) continue;
    fails += check_one(names[i], d, be);
    ++*checked;
  }
  lm_fx_free_list(names, n);
  return fails;
}
