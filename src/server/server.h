/* server.h — lumen's OpenAI-compatible HTTP server (`lumen serve`).
 *
 * Endpoints: POST /v1/chat/completions, POST /v1/completions, POST /v1/responses (and GET/DELETE
 * /v1/responses/ID), POST /v1/messages and /v1/messages/count_tokens (Anthropic), GET /v1/models,
 * POST/GET /v1/adapters and GET/DELETE /v1/adapters/NAME (LoRA adapters mounted by name, which a
 * request picks by its "adapter" field or a model id BASE:NAME; srv_adapters.h), POST /tokenize,
 * /detokenize and /apply-template (llama.cpp's), GET /health, GET /stats, GET /metrics, and the
 * chat page at GET / (srv_web.c). HTTP
 * on libmicrohttpd (a pool of epoll threads; a generation parks its connection instead of holding a
 * thread), JSON on jansson. The server is a client of the public API (lumen.h): it maps the
 * protocols onto requests of one engine, whose scheduler runs every sequence in one continuously
 * re-formed batch.
 *
 * Lifetime: create (puts the checkpoint on its backend as an engine: the cache plan, the KV budget,
 * the scheduler thread), start (binds and serves), free (stops: open requests end as cancelled).
 * The checkpoint outlives the server. */
#ifndef LM_SERVER_SERVER_H
#define LM_SERVER_SERVER_H

#include <stdint.h>

#include "lumen.h"

typedef struct lm_server_opts {
  const char *model_dir; /* the directory the checkpoint came from (names the model) */
  const char *model_id;  /* the model's own name (NULL: the directory's base name) */
  /* More ids the model is served under (--served-model-name, repeatable). The served ids are
   * aliases[0..n_aliases) then model_id; the first is the one responses report when a request
   * names none, and a request naming any other id is answered 404 model_not_found. */
  const char *const *aliases;
  int n_aliases;
  const char *host;        /* NULL: 127.0.0.1 */
  int port;                /* 0: an ephemeral port (lm_server_port tells which) */
  int parallel;            /* sequences in the batch (0: 4) */
  int64_t ctx;             /* per-sequence context limit (0: the model's max_position_embeddings) */
  int64_t chunk;           /* prompt tokens per step (0: 512) */
  double memory_budget_gb; /* weights + workspace + KV (0: 75% of physical memory) */
  int64_t kv_budget_bytes; /* > 0: the KV budget itself, overriding memory_budget_gb */
  int queue_size;          /* waiting requests beyond which 429 (0: 64) */
  int prompt_cache;        /* finished sequences kept for prefix reuse (-1: off, 0: = parallel) */
  const char
      *api_key;     /* bearer token required on every endpoint but /health and GET / (NULL: none) */
  int64_t max_body; /* request body cap in bytes (0: 8 MiB) */
  double timeout_s; /* per-request deadline (0: 600 s; < 0: none) */
  int64_t max_tokens;          /* default max_tokens (0: 512) */
  const lm_sampling *sampling; /* default sampling (NULL: generation_config.json's) */
  int has_seed;                /* sampling->seed applies to requests without a seed */
  const char *kv_quant;        /* --kv-quant plan: NULL/"off", "4", "8", "config" */
  int kv_group;                /* --kv-group (0: 64) */
  const char *kv_config;       /* --kv-config */
  const char *backend;         /* "cpu", "cuda", NULL: cuda when a GPU is present */
  const char *precision;       /* NULL: fast */
  int threads;                 /* CPU threads (0: all) */
  int max_connections;         /* 0: 256 */
  int log_requests;            /* one line per request on stderr */
  void (*on_load)(void *ctx, int64_t done, int64_t total); /* lm_engine_options.on_load */
  void *on_load_ctx;
  int no_webui; /* GET / answers 404 instead of the chat page */
  /* Origins browsers may call the API from: "*" or a comma-separated list (NULL: no CORS
   * headers; OPTIONS is still answered 204, for same-origin preflights). */
  const char *cors;
  /* The Responses API's store of past responses (previous_response_id): at most this many
   * entries (0: 1024; < 0: no store), bytes (0: 64 MiB) and seconds each is kept (0: 3600). */
  int store_entries;
  int64_t store_bytes;
  double store_ttl_s;
  /* Speculative decoding (lm_request_options.speculative): the source requests use unless their
   * "speculative" field says otherwise ("ngram"; NULL: off), and the most drafts per step a
   * request may ask for (0: LM_SPEC_DEFAULT_TOKENS when a source is set, else none may). */
  const char *speculative;
  int speculative_tokens;
  const char *draft_model; /* lm_engine_options.draft_model (--spec draft:DIR) */
  /* lm_engine_options.adapters: LoRA adapters on every request (--adapter) */
  const char *const *adapters;
  const float *adapter_weights;
  int n_adapters;
} lm_server_opts;

void lm_server_opts_init(lm_server_opts *o);

typedef struct lm_server lm_server;

/* Creates the engine over ck (which must have a tokenizer) and the server around it. */
lm_status lm_server_create(lm_checkpoint *ck, const lm_server_opts *o, lm_server **out);
/* Binds host:port and starts serving (HTTP threads + the engine thread). */
lm_status lm_server_start(lm_server *s);
int lm_server_port(const lm_server *s);
/* One paragraph about what was loaded and how it is served (startup banner). */
void lm_server_describe(const lm_server *s, char *buf, size_t n);
void lm_server_free(lm_server *s); /* NULL is a no-op */

#endif
