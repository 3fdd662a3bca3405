/* cli_info.c — `lumen info`: what a checkpoint is — architecture, the per-layer map, sizes,
 * and KV memory per token of context (sliding layers capped at their ring: window + spare). */
#include <getopt.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "cli/cli.h"
#include "cli/cli_args.h"
#include "cli/cli_common.h"
#include "kv/kv.h"
#include "model/forward.h"
#include "model/kv_plan.h"
#ifdef LM_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

static const char *info_help =
    "usage: lumen info MODEL_DIR [--json] [--kv-quant MODE] [--kv-group G] [--backend cpu|cuda "
    "[--ctx N]]\n"
    "       (MODEL_DIR may be ORG/REPO[@REV]: a model in the Hugging Face cache, see `lumen get`)\n"
    "\n"
    "Prints the architecture, the per-layer map (type, head dim, KV heads, donor, weight bits,\n"
    "MLP width), parameter count, weight bytes, the cache plan (one cache per donor layer, its\n"
    "signature) and the KV bytes per token of context for each --kv-quant choice. Plain caches "
    "are\n"
    "counted at f32 (the CPU backend's activations); sliding layers hold at most their ring\n"
    "(the window + 16 spare slots, so that a wrapped ring can roll back).\n"
    "\n"
    "With --backend, the model is also loaded onto that backend with a forward workspace (chunks\n"
    "of --chunk tokens) and one sequence's caches reserved for --ctx tokens, and the memory it\n"
    "holds is printed: on cuda the device memory by purpose (weights, KV, workspace) and what is\n"
    "left free. Running out of memory is reported with the sizes.\n"
    "\n"
    "  --json              machine-readable output\n"
    "  --kv-quant MODE     the plan to show: off (default), 4, 8, config (kv_config.json) or\n"
    "                      turboquant[:K:V]\n"
    "  --kv-group G        group of uniform 4/8-bit caches (default 64)\n"
    "  --backend B         cpu or cuda: also report the memory a session takes there\n"
    "  --ctx N             context to reserve with --backend (default 4096)\n"
    "  --chunk N           prefill chunk the workspace is sized for (default 512)\n"
    "  --precision P       f32, fast (default) or bf16 with --backend\n";

static void weight_bits(const lm_weight *w, char *buf, size_t n) {
  if (w->bits)
    snprintf(buf, n, "q%d/g%d", w->bits, w->group);
  else
    snprintf(buf, n, "%s", lm_dtype_name(w->dtype));
}

/* KV bytes for a context of n tokens: Σ bytes_per_token × min(n, capacity). */
static int64_t kv_bytes_at(const lm_model *m, const lm_kv_spec *specs, int64_t n) {
  int64_t b = 0;
  for (int i = 0; i < m->cfg.n_caches; i++) {
    int64_t cap = lm_kv_spec_capacity(&specs[i]), held = n > cap ? cap : n;
    b += held * lm_kv_spec_bytes_per_token(&specs[i], LM_DT_F32);
  }
  return b;
}

/* Bytes per token once every ring is full: what each further token of context costs. */
static int64_t kv_marginal(const lm_model *m, const lm_kv_spec *specs) {
  return kv_bytes_at(m, specs, (int64_t)1 << 30) - kv_bytes_at(m, specs, ((int64_t)1 << 30) - 1);
}

typedef struct info_mem {
  int64_t weights, kv, workspace, free_bytes, total_bytes; /* -1: not known on this backend */
} info_mem;

/* Loads m onto the backend with a workspace and one sequence's caches for ctx tokens, runs
 * one token (a device backend learns which buffers are caches at a step), and measures. */
static int backend_memory(lm_model *m, const lm_kv_spec *specs, const lm_cli_backend_opts *bo,
                          int64_t ctx, int64_t chunk, info_mem *out) {
  lm_backend *be = lm_cli_backend(bo, LM_PRECISION_FAST);
  if (!be) return 1;
  lm_forward *f = NULL;
  lm_kv_set *kv = NULL;
  int32_t id = 0;
  lm_status s = lm_cli_prepare(m, be);
  if (!s) s = lm_forward_create(m, be, chunk, 1, &f);
  if (!s) s = lm_kv_set_create(be, specs, m->cfg.n_caches, &kv);
  if (!s) s = lm_kv_set_reserve(kv, ctx);
  if (!s) s = lm_forward_feed(f, kv, &id, 1, 1, NULL);
  /* the CPU backend: host memory as planned (f32 caches at the reserved context) */
  *out = (info_mem){m->weight_bytes, kv_bytes_at(m, specs, ctx),
                    lm_forward_workspace_bytes(m, chunk, 1, be->act_dtype), -1, -1};
#ifdef LM_HAVE_CUDA
  lm_cuda_mem cm;
  if (!s && !strcmp(be->ops->name, "cuda") && !(s = lm_cuda_mem_get(be, &cm)))
    *out = (info_mem){cm.weights, cm.kv, cm.workspace, cm.free_bytes, cm.total_bytes};
#endif
  int rc = s ? lm_cli_fail(NULL) : 0;
  lm_kv_set_free(kv);
  lm_forward_free(f);
  lm_backend_destroy(be);
  return rc;
}

static void print_memory(const char *backend, int64_t ctx, int64_t chunk, const info_mem *mm) {
  printf("\nmemory on %s (one sequence, %lld tokens of context reserved, chunks of %lld):\n",
         backend, (long long)ctx, (long long)chunk);
  printf("  weights %.1f MiB, KV %.1f MiB, workspace %.1f MiB", (double)mm->weights / 1048576.0,
         (double)mm->kv / 1048576.0, (double)mm->workspace / 1048576.0);
  if (mm->total_bytes > 0)
    printf("; device free %.1f of %.1f MiB", (double)mm->free_bytes / 1048576.0,
           (double)mm->total_bytes / 1048576.0);
  printf("\n");
}

static json_t *info_json(const lm_model *m, const lm_kv_spec *specs) {
  const lm_model_config *c = &m->cfg;
  json_t *layers = json_array();
  for (int l = 0; l < c->n_layers; l++) {
    const lm_layer_config *L = &c->layers[l];
    char bits[32];
    weight_bits(&m->layers[l].q, bits, sizeof bits);
    json_array_append_new(layers,
                          json_pack("{s:i,s:s,s:i,s:i,s:b,s:i,s:i,s:s,s:I,s:b}", "layer", l, "type",
                                    lm_layer_type_name(L->type), "head_dim", L->head_dim,
                                    "kv_heads", L->n_kv_heads, "kv_shared", L->kv_shared, "donor",
                                    L->donor, "cache", L->cache, "weights", bits, "ffn_dim",
                                    (json_int_t)L->ffn_dim, "k_eq_v", L->k_eq_v));
  }
  json_t *caches = json_array();
  int64_t bpt = 0;
  for (int i = 0; i < c->n_caches; i++) {
    int64_t b = lm_kv_spec_bytes_per_token(&specs[i], LM_DT_F32);
    char sig[64];
    bpt += b;
    json_array_append_new(
        caches,
        json_pack(
            "{s:i,s:i,s:s,s:I,s:I}", "cache", i, "layer", c->cache_layer[i], "signature",
            lm_kv_spec_signature(&specs[i], sig, sizeof sig), "bytes_per_token", (json_int_t)b,
            "capacity",
            (json_int_t)(lm_kv_kind_ring(specs[i].kind) ? lm_kv_spec_capacity(&specs[i]) : -1)));
  }
  json_t *at = json_object();
  static const int64_t ctx[] = {1, 1024, 4096, 32768, 131072};
  for (size_t i = 0; i < sizeof ctx / sizeof *ctx; i++) {
    char k[32];
    snprintf(k, sizeof k, "%lld", (long long)ctx[i]);
    json_object_set_new(at, k, json_integer(kv_bytes_at(m, specs, ctx[i])));
  }
  return json_pack("{s:s,s:s,s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:f,s:I,s:I,s:b,s:I,s:I,s:I,s:I,s:I,s:"
                   "o,s:o,s:I,s:o}",
                   "model_type", c->model_type, "text_model_type", c->text_model_type, "naming",
                   m->mlx_naming ? "mlx" : "hf", "vocab_size", (json_int_t)c->vocab_size,
                   "hidden_size", (json_int_t)c->hidden, "layers", (json_int_t)c->n_layers, "heads",
                   (json_int_t)c->n_heads, "sliding_window", (json_int_t)c->sliding_window,
                   "per_layer_input_dim", (json_int_t)c->ple_dim, "kv_shared_layers",
                   (json_int_t)c->n_kv_shared, "final_logit_softcapping", c->final_softcap,
                   "experts", (json_int_t)c->n_experts, "top_k_experts", (json_int_t)c->top_k,
                   "moe", c->moe, "parameters", (json_int_t)m->n_params, "weight_bytes",
                   (json_int_t)m->weight_bytes, "caches_count", (json_int_t)c->n_caches,
                   "kv_bytes_per_token_uncapped", (json_int_t)bpt, "moe_intermediate_size",
                   (json_int_t)c->moe_dim, "layer_map", layers, "caches", caches, "kv_dtype_bytes",
                   (json_int_t)sizeof(float), "kv_bytes_at_context", at);
}

static void print_text(const lm_model *m, const lm_kv_spec *specs) {
  const lm_model_config *c = &m->cfg;
  printf("model      %s (text: %s, %s naming)\n", c->model_type, c->text_model_type,
         m->mlx_naming ? "MLX" : "HF");
  printf("geometry   hidden %lld, %lld layers, %lld heads, vocab %lld, sliding window %lld, "
         "softcap %g\n",
         (long long)c->hidden, (long long)c->n_layers, (long long)c->n_heads,
         (long long)c->vocab_size, (long long)c->sliding_window, c->final_softcap);
  if (c->ple_dim)
    printf("per-layer  embeddings %lld per layer (vocab %lld)\n", (long long)c->ple_dim,
           (long long)c->ple_vocab);
  if (c->moe)
    printf("moe        %lld experts, top %lld, width %lld\n", (long long)c->n_experts,
           (long long)c->top_k, (long long)c->moe_dim);
  printf("parameters %lld (%.3f B), weights %.1f MB\n", (long long)m->n_params,
         (double)m->n_params / 1e9, (double)m->weight_bytes / 1e6);
  printf("\nlayer  type     head_dim kv_heads  kv-from  cache  weights   mlp\n");
  for (int l = 0; l < c->n_layers; l++) {
    const lm_layer_config *L = &c->layers[l];
    char bits[32], from[16];
    weight_bits(&m->layers[l].q, bits, sizeof bits);
    snprintf(from, sizeof from, L->kv_shared ? "%d" : "self", L->donor);
    printf("%5d  %-7s  %8d %8d  %7s  %5d  %-8s %5lld%s\n", l,
           L->type == LM_LAYER_FULL ? "full" : "sliding", L->head_dim, L->n_kv_heads, from,
           L->cache, bits, (long long)L->ffn_dim, L->k_eq_v ? "  k=v" : "");
  }
  printf("\ncache plan: %d caches (donor layers only)\n  cache  layer  signature                   "
         "bytes/token  capacity\n",
         c->n_caches);
  for (int i = 0; i < c->n_caches; i++) {
    char sig[64], cap[32] = "unbounded";
    if (lm_kv_kind_ring(specs[i].kind))
      snprintf(cap, sizeof cap, "%lld", (long long)lm_kv_spec_capacity(&specs[i]));
    printf("  %5d  %5d  %-26s %11lld  %s\n", i, c->cache_layer[i],
           lm_kv_spec_signature(&specs[i], sig, sizeof sig),
           (long long)lm_kv_spec_bytes_per_token(&specs[i], LM_DT_F32), cap);
  }
  static const int64_t ctx[] = {1024, 4096, 32768, 131072};
  printf("\nKV memory of this plan:\n");
  for (size_t i = 0; i < sizeof ctx / sizeof *ctx; i++)
    printf("  %7lld tokens of context: %10.2f MB\n", (long long)ctx[i],
           (double)kv_bytes_at(m, specs, ctx[i]) / 1e6);
  printf("  each further token (sliding layers capped at %lld): %lld bytes\n",
         (long long)c->sliding_window, (long long)kv_marginal(m, specs));
}

/* Bytes per token of context (long context, rings full) for each --kv-quant choice. */
static void print_choices(const lm_model *m, int group) {
  static const char *modes[] = {"off", "8", "4", "turboquant", "config"};
  printf("\nKV bytes per token of long context, by --kv-quant (group %d):\n", group);
  for (size_t i = 0; i < sizeof modes / sizeof *modes; i++) {
    lm_kv_spec specs[m->cfg.n_caches + 1];
    lm_kv_options o = {.mode = modes[i], .group = group};
    if (lm_model_kv_plan(m, &o, specs)) {
      if (strcmp(modes[i], "config"))
        printf("  %-10s  (not applicable: %s)\n", modes[i], lm_errmsg());
      continue; /* no kv_config.json: nothing to show */
    }
    printf("  %-10s  %10lld bytes   at 32k tokens %10.2f MB\n", modes[i],
           (long long)kv_marginal(m, specs), (double)kv_bytes_at(m, specs, 32768) / 1e6);
  }
}

int lm_cli_info(int argc, char **argv) {
  static const struct option lo[] = {
      {"json", 0, 0, 'j'},      {"kv-quant", 1, 0, 'q'}, {"kv-group", 1, 0, 'g'},
      {"backend", 1, 0, 'B'},   {"ctx", 1, 0, 'c'},      {"chunk", 1, 0, 'k'},
      {"precision", 1, 0, 'x'}, {"help", 0, 0, 'h'},     {0, 0, 0, 0}};
  int json = 0, c, group = 64;
  int64_t ctx = 4096, chunk = 512;
  const char *mode = "off";
  lm_cli_backend_opts bo = {0};
  optind = 1;
  while ((c = getopt_long(argc, argv, ":h", lo, NULL)) != -1) {
    if (c == 'j')
      json = 1;
    else if (c == 'q')
      mode = optarg;
    else if (c == 'g')
      group = atoi(optarg);
    else if (c == 'B')
      bo.backend = optarg;
    else if (c == 'c')
      ctx = atoll(optarg);
    else if (c == 'k')
      chunk = atoll(optarg);
    else if (c == 'x')
      bo.precision = optarg;
    else if (c == 'h')
      return fputs(info_help, stdout), 0;
    else
      return lm_cli_flag_error(c, argc, argv, lo);
  }
  if (optind != argc - 1 || ctx < 1 || chunk < 1) return fputs(info_help, stderr), 2;
  lm_model *m = lm_cli_load_model(argv[optind]);
  if (!m) return 1;
  lm_kv_spec specs[m->cfg.n_caches + 1];
  lm_kv_options ko = {.mode = mode, .group = group};
  if (lm_model_kv_plan(m, &ko, specs)) {
    lm_model_free(m);
    return lm_cli_fail(NULL);
  }
  info_mem mm = {0};
  if (bo.backend && backend_memory(m, specs, &bo, ctx, chunk, &mm)) {
    lm_model_free(m);
    return 1;
  }
  if (json) {
    json_t *j = info_json(m, specs);
    if (bo.backend)
      json_object_set_new(
          j, "memory",
          json_pack("{s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:I}", "backend", bo.backend, "context",
                    (json_int_t)ctx, "chunk", (json_int_t)chunk, "weights", (json_int_t)mm.weights,
                    "kv", (json_int_t)mm.kv, "workspace", (json_int_t)mm.workspace, "device_free",
                    (json_int_t)mm.free_bytes, "device_total", (json_int_t)mm.total_bytes));
    char *s = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    puts(s);
    free(s);
    json_decref(j);
  } else {
    print_text(m, specs);
    print_choices(m, group);
    if (bo.backend) print_memory(bo.backend, ctx, chunk, &mm);
  }
  lm_model_free(m);
  return 0;
}
