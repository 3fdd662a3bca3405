/*
 * lumen.h — the public C API of lumen, a local LLM inference engine for the Gemma 4 family.
 *
 * This header is the contract: the `lumen` command line and `lumen serve` are built on it, and
 * what is not declared here is not a published API. A program embeds lumen like this:
 *
 *     lm_checkpoint *ck;  lm_engine *e;  lm_request *r;  lm_event ev;
 *     lm_checkpoint_open("models/lumen-tiny-kjv", &ck);
 *     lm_engine_options eo;  lm_engine_options_init(&eo);
 *     lm_engine_create(ck, &eo, &e);
 *     lm_request_options ro;  lm_request_options_init(&ro);
 *     ro.messages_json = "[{\"role\":\"user\",\"content\":\"Who was Moses?\"}]";
 *     lm_request_submit(e, &ro, &r);
 *     while (lm_request_next(r, -1, &ev) == LM_OK && ev.kind != LM_EVENT_DONE)
 *       if (ev.kind == LM_EVENT_CONTENT) fwrite(ev.text, 1, ev.len, stdout);
 *     lm_request_free(r);  lm_engine_free(e);  lm_checkpoint_free(ck);
 *
 * Objects:
 *   lm_checkpoint  a model directory opened for use: weights, tokenizer, chat template,
 *                  generation defaults. Immutable once opened.
 *   lm_engine      the checkpoint on a backend (cpu, cuda): the KV memory, one scheduler thread
 *                  that runs every request in continuously batched forward steps, the prefix cache.
 *   lm_request     one generation: a prompt (messages, text or ids), sampling, stops, limits;
 *                  its events (tokens, text, reasoning, tool calls, the end with usage) are pulled
 *                  with lm_request_next.
 *
 * Conventions:
 *   - Every fallible call returns lm_status. LM_OK (0) means success; any other value comes with
 *     a human-readable message from lm_errmsg(), kept per thread, valid until the next failing
 *     call on that thread.
 *   - Handles are opaque. Objects come in create/free pairs; every free function accepts NULL.
 *     Strings are UTF-8 and NUL-terminated unless a length goes with them; memory that lumen
 *     returns for the caller to own is released with lm_free().
 *   - Option structs are initialized by their _init function and then changed field by field, so
 *     that fields added later get their defaults.
 *   - Thread safety is stated per function. In short: a checkpoint may be read from any thread;
 *     an engine's functions may be called from any thread; a request belongs to one thread at a
 *     time (lm_request_cancel excepted, which any thread may call).
 *   - The API grows by addition (new functions, new fields at the end of option structs), never
 *     by changed signatures; LUMEN_API_VERSION counts the additions.
 */
#ifndef LUMEN_H
#define LUMEN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LUMEN_VERSION "0.2.0"
#define LUMEN_VERSION_NUMBER 2000 /* major*1000000 + minor*1000 + patch */
/* LUMEN_API_VERSION: 1 status codes only; 2 checkpoints, engines, requests; 3
 * lm_checkpoint_set_chat_template, lm_engine_options.on_load; 4 lm_request_options.share_prompt,
 * constrained decoding (lm_request_options.grammar, json_schema, json_object, constrain_tools;
 * lm_engine_stats.constraint_s); 5 lm_engine_stats.constraint_wait_s; 6 speculative decoding
 * (lm_engine_options.speculative_tokens, lm_request_options.speculative and speculative_tokens,
 * the round fields of lm_event, lm_usage.drafted_tokens / accepted_tokens, lm_engine_stats.spec_*,
 * lm_engine_options.draft_model); 7 LoRA adapters (lm_engine_options.adapters, adapter_weights,
 * n_adapters; lm_engine_load_adapter, lm_engine_unload_adapter, lm_engine_list_adapters,
 * lm_adapter_name_valid; lm_request_options.adapters, adapter_weights, n_adapters, no_adapters).
 */
#define LUMEN_API_VERSION 7

/* Most tokens a speculative round drafts (lm_request_options.speculative_tokens), and the
 * drafts per round the command line and the server default to. */
#define LM_SPEC_MAX_TOKENS 16
#define LM_SPEC_DEFAULT_TOKENS 4

/* ---- status codes ---------------------------------------------------------------------------- */

/* Each has a one-line meaning; lm_errmsg() says which file, field or offset. */
typedef enum lm_status {
  LM_OK = 0,          /* success */
  LM_ERR_IO = 1,      /* a file could not be opened, read, mapped or written */
  LM_ERR_CORRUPT = 2, /* a file's bytes violate its format (truncated, bad offsets, bad JSON) */
  LM_ERR_INVALID = 3, /* an argument or a request is invalid (bad id, bad value, bad shape) */
  LM_ERR_UNSUPPORTED =
      4,                /* valid input that lumen does not implement (a quant mode, a model type) */
  LM_ERR_NOMEM = 5,     /* host or device memory could not be allocated */
  LM_ERR_NOT_FOUND = 6, /* a required file, tensor or field is missing */
  LM_ERR_DEVICE = 7,    /* a GPU/driver call failed */
  LM_ERR_STATE = 8,     /* the object is not in a state that allows the call (a full queue) */
  LM_ERR_CANCELLED = 9, /* the operation was cancelled, or the engine is stopping */
  LM_ERR_TIMEOUT = 10   /* a wait ran out before anything happened */
} lm_status;

/* Version of the linked library; compare with LUMEN_VERSION_NUMBER. Thread-safe. */
int lm_version_number(void);
/* LUMEN_API_VERSION of the linked library. Thread-safe. */
int lm_api_version(void);

/* Message of the last failing call on this thread ("" if none). Never NULL. Thread-safe (the
 * message is per thread). */
const char *lm_errmsg(void);

/* Short name of a status code ("LM_ERR_CORRUPT"). Never NULL. Thread-safe. */
const char *lm_status_name(lm_status s);

/* Frees memory that a lumen function returned for the caller to own. NULL is a no-op. */
void lm_free(void *p);

/* ---- sampling -------------------------------------------------------------------------------- */

typedef struct lm_logit_bias {
  int32_t id;
  float bias; /* added to the logit; -INFINITY bans the id */
} lm_logit_bias;

/* Sampling parameters. The lists are owned by the struct: lm_sampling_clear frees them, and
 * lm_sampling_copy makes a deep copy. Processors run in this order: logit bias, suppression,
 * repetition penalty, presence/frequency penalties, temperature, top-k, top-p, min-p. */
typedef struct lm_sampling {
  float temperature;       /* <= 0: greedy (the argmax) */
  int32_t top_k;           /* 0: off */
  float top_p;             /* 1: off; (0, 1] */
  float min_p;             /* 0: off; [0, 1] */
  float repeat_penalty;    /* 1: off; > 0 */
  int32_t repeat_last_n;   /* window of the repetition penalty (default 64; -1: all) */
  float presence_penalty;  /* 0: off */
  float frequency_penalty; /* 0: off */
  int32_t penalty_last_n;  /* window of presence/frequency (default 64) */
  uint64_t seed;           /* the random stream; the same seed repeats the same draws */
  int32_t n_bias;
  lm_logit_bias *bias; /* [n_bias]; a repeated id adds up */
  int32_t n_suppress;
  int32_t *suppress; /* [n_suppress] ids never sampled */
} lm_sampling;

/* Neutral parameters: temperature 1, every processor off, windows 64, seed 0, no lists. */
void lm_sampling_init(lm_sampling *s);
/* Frees the lists and re-initializes. NULL is a no-op. */
void lm_sampling_clear(lm_sampling *s);
/* Deep copy into dst (which must not own lists: initialize or clear it first). Errors:
 * LM_ERR_NOMEM (dst is then initialized). */
lm_status lm_sampling_copy(lm_sampling *dst, const lm_sampling *src);
/* Appends one bias / one suppressed id. Errors: LM_ERR_INVALID (negative id, NaN or +inf bias),
 * LM_ERR_NOMEM. */
lm_status lm_sampling_add_bias(lm_sampling *s, int32_t id, float bias);
lm_status lm_sampling_add_suppress(lm_sampling *s, int32_t id);
/* Checks every range documented above; LM_ERR_INVALID naming the field. */
lm_status lm_sampling_validate(const lm_sampling *s);

/* ---- checkpoints ----------------------------------------------------------------------------- */

typedef struct lm_checkpoint lm_checkpoint;

/* Opens a model directory: config.json and safetensors (one file, a sharded index, or the MLX
 * layout; bf16 or MLX affine-quantized), and, when present, tokenizer.json, the chat template
 * (chat_template.jinja or tokenizer_config.json) and generation_config.json. A directory without
 * a tokenizer opens too: it serves requests given as ids. Errors: LM_ERR_IO, LM_ERR_NOT_FOUND,
 * LM_ERR_CORRUPT, LM_ERR_UNSUPPORTED, LM_ERR_NOMEM; the message names the file. */
lm_status lm_checkpoint_open(const char *dir, lm_checkpoint **out);

/* A synthetic model of a real geometry, for benchmarks: the architecture of `config_path` (a
 * config.json-shaped preset), weights drawn from `seed` and quantized to `bits` (0: bf16; else
 * 2..8 with groups of `group`, 0 → 64), the tokenizer of `tokenizer_dir` (may be NULL: ids only).
 */
lm_status lm_checkpoint_open_synthetic(const char *config_path, const char *tokenizer_dir, int bits,
                                       int group, uint64_t seed, lm_checkpoint **out);

/* Frees the checkpoint. Every engine created on it must have been freed first. NULL is a no-op. */
void lm_checkpoint_free(lm_checkpoint *ck);

typedef struct lm_checkpoint_info {
  const char *name;       /* the directory's base name (or the preset's) */
  const char *model_type; /* config.json's model_type ("gemma4", "gemma4_text") */
  int n_layers;
  int64_t vocab_size;
  int64_t n_params;
  int64_t weight_bytes;        /* bytes of the weights as loaded */
  int64_t max_positions;       /* max_position_embeddings; 0 when config.json has none */
  int quant_bits, quant_group; /* the default MLX quantization (0: not quantized) */
  int has_tokenizer;
  int has_chat_template;
  int gemma4_format; /* the vocabulary has Gemma 4's control tokens (reasoning, tool calls) */
  int n_stop_ids;    /* the ids that end a response (config, generation_config, tokenizer) */
  const int32_t *stop_ids;
  const lm_sampling *defaults; /* generation_config.json's sampling (neutral when absent) */
  int64_t default_max_tokens;  /* generation_config.json's max_new_tokens (0: not set) */
  size_t longest_piece; /* bytes of the vocabulary's longest token (0: no tokenizer): a text of B
                           bytes is at least B / longest_piece tokens */
} lm_checkpoint_info;

/* Describes the checkpoint; the pointers stay valid while it is open. Thread-safe. */
void lm_checkpoint_describe(const lm_checkpoint *ck, lm_checkpoint_info *info);

/* Tokenizes text[0..len) (special-token strings are matched; add_bos prepends the tokenizer's BOS
 * when it has one). *ids is the caller's (lm_free). Errors: LM_ERR_STATE (no tokenizer),
 * LM_ERR_INVALID (invalid UTF-8), LM_ERR_NOMEM. Thread-safe. */
lm_status lm_checkpoint_tokenize(const lm_checkpoint *ck, const char *text, size_t len, int add_bos,
                                 int32_t **ids, int64_t *n);

/* Decodes ids to text (special tokens left out when skip_special). *text is the caller's
 * (lm_free), NUL-terminated. Errors: LM_ERR_STATE (no tokenizer), LM_ERR_INVALID (an id outside
 * the vocabulary), LM_ERR_NOMEM. Thread-safe. */
lm_status lm_checkpoint_detokenize(const lm_checkpoint *ck, const int32_t *ids, int64_t n,
                                   int skip_special, char **text, size_t *len);

/* Renders a conversation with the checkpoint's chat template: messages_json is a JSON array of
 * OpenAI-style messages, tools_json a JSON array of tools or NULL, kwargs_json a JSON object of
 * extra template variables (e.g. {"enable_thinking": false}) or NULL. The generation prompt is
 * added when add_generation_prompt. *prompt is the caller's (lm_free). Errors: LM_ERR_STATE (no
 * template), LM_ERR_INVALID (bad JSON, a template error), LM_ERR_NOMEM. Thread-safe. */
lm_status lm_checkpoint_render(const lm_checkpoint *ck, const char *messages_json,
                               const char *tools_json, const char *kwargs_json,
                               int add_generation_prompt, char **prompt);

/* Replaces the checkpoint's chat template with the one in `path` (as llama.cpp's
 * --chat-template-file does): a Jinja file, or a JSON file (.json) whose "chat_template" member
 * holds it. Call before creating an engine. Errors: LM_ERR_STATE (an engine exists, or the
 * checkpoint has no tokenizer), LM_ERR_NOT_FOUND, LM_ERR_IO, LM_ERR_INVALID (the template does not
 * parse), LM_ERR_NOMEM; the message names the file. */
lm_status lm_checkpoint_set_chat_template(lm_checkpoint *ck, const char *path);

/* ---- engines --------------------------------------------------------------------------------- */

typedef struct lm_engine lm_engine;

/* Adapters one request stacks at most, and adapters one engine holds mounted at most. */
#define LM_ADAPTER_STACK_MAX 8
#define LM_ADAPTER_MOUNT_MAX 64
#define LM_ADAPTER_NAME_MAX 64 /* bytes of a name, its NUL included */

typedef struct lm_engine_options {
  const char *backend;     /* "cpu", "cuda", or NULL: cuda when a GPU is present, else cpu */
  const char *precision;   /* "f32", "fast", "bf16", or NULL: "fast" */
  int threads;             /* CPU threads; 0: all cores */
  int parallel;            /* sequences decoded together in one batch (default 1) */
  int64_t chunk;           /* prompt tokens per forward step, interleaved with decoding (512) */
  int64_t context;         /* context limit per sequence; 0: max_position_embeddings (else 8192) */
  int queue_size;          /* requests waiting for a slot before submit refuses (64) */
  int64_t kv_budget;       /* bytes for every sequence's caches; 0: from memory_budget_gb; -1: no
                              limit (caches grow as needed; the command line's single sequence) */
  double memory_budget_gb; /* weights + workspace + KV caches; 0: 75% of RAM (kv_budget 0) */
  int prefix_cache;        /* finished sequences kept for prefix reuse (entries; default 4; 0 off);
                              their bytes count against kv_budget and are evicted first */
  const char *kv_quant;    /* KV cache precision: NULL/"off", "4", "8", "config",
                              "turboquant[:K:V]" (full-attention caches) */
  int kv_group;            /* group of "4"/"8" (0: 64) */
  const char *kv_config;   /* "config": this kv_config.json (NULL: the checkpoint's) */
  int64_t kv_quant_start;  /* quantized caches stay plain until they hold this many tokens */
  /* Called on the creating thread as the weights are copied to a device backend (the CPU reads
   * them in place and never calls it): bytes done of total. NULL: no calls. */
  void (*on_load)(void *ctx, int64_t done, int64_t total);
  void *on_load_ctx;
  /* Speculative decoding: the most tokens a request may draft per round (0: none may; at most
   * LM_SPEC_MAX_TOKENS). It sizes the step: up to parallel x (1 + this) tokens and logits rows. */
  int speculative_tokens;
  /* A smaller checkpoint of the same vocabulary (a directory) whose greedy tokens requests with
   * speculative "draft" verify; it shares the backend, with caches of its own per request (not
   * counted in kv_budget). NULL: none. */
  const char *draft_model;
  /* LoRA adapters (directories of PEFT or mlx-lm adapters) applied, stacked, to every request
   * that selects none of its own (lm_request_options.adapters): adapter i with weight
   * adapter_weights[i] (NULL: 1 each); at most LM_ADAPTER_STACK_MAX. Sessions' KV state files are
   * refused while this set is on (they are not keyed by adapters), and so is speculative decoding
   * of requests that run with adapters; the prefix cache keys every entry by the adapter set it
   * was made with, so nothing is reused across sets. */
  const char *const *adapters;
  const float *adapter_weights;
  int n_adapters;
} lm_engine_options;

/* Defaults as documented above. */
void lm_engine_options_init(lm_engine_options *o);

/* Puts the checkpoint on a backend (uploading the weights to a device backend), plans the KV
 * caches, sizes the memory and starts the scheduler thread. One engine per checkpoint at a time.
 * Errors: LM_ERR_INVALID (an option out of range, a budget that does not cover the weights),
 * LM_ERR_UNSUPPORTED (no such backend in this build), LM_ERR_DEVICE, LM_ERR_NOMEM. */
lm_status lm_engine_create(lm_checkpoint *ck, const lm_engine_options *o, lm_engine **out);

/* Stops the scheduler (every request still queued or running ends with LM_FINISH_CANCELLED) and
 * frees the engine. Requests still held by the caller stay valid until lm_request_free. NULL is a
 * no-op. Not while another thread calls into this engine. */
void lm_engine_free(lm_engine *e);

/* Stops the scheduler: every request still queued or running ends with LM_FIN_CANCELLED, and
 * later submits and commands fail with LM_ERR_CANCELLED. The engine stays valid (describe, stats)
 * until lm_engine_free. Idempotent; thread-safe. */
void lm_engine_stop(lm_engine *e);

typedef struct lm_engine_info {
  const char *backend;   /* "cpu" or "cuda" */
  const char *precision; /* "f32", "fast", "bf16" */
  int parallel, queue_size, prefix_cache;
  int64_t chunk, context;
  int64_t kv_budget;            /* bytes (INT64_MAX: no limit) */
  int64_t kv_bytes_per_token;   /* summed over the caches, below every sliding window */
  int64_t max_sequence_context; /* the longest context one sequence can have within the budget */
  int64_t workspace_bytes;      /* the forward step's workspace */
  int n_caches;
  char cache_plan[512]; /* "kv:rotating-plain x5, kv:plain x1" */
} lm_engine_info;

/* Thread-safe. */
void lm_engine_describe(const lm_engine *e, lm_engine_info *info);

/* One cache of the plan (0 <= i < n_caches): the layer that owns it, its signature, its bytes
 * per token and its capacity in tokens (INT64_MAX: grows with the context). Errors:
 * LM_ERR_INVALID (i out of range). Thread-safe. */
lm_status lm_engine_cache(const lm_engine *e, int i, int *layer, char *signature, size_t n,
                          int64_t *bytes_per_token, int64_t *capacity);

typedef enum lm_admission {
  LM_ADMIT_OK = 0,
  LM_ADMIT_CONTEXT, /* prompt + max_tokens exceeds the context limit */
  LM_ADMIT_MEMORY   /* its caches could never fit the KV budget */
} lm_admission;

/* Whether a request of n_prompt tokens and max_tokens could ever run; msg (may be NULL) gets the
 * reason. Thread-safe. */
lm_admission lm_engine_check(const lm_engine *e, int64_t n_prompt, int64_t max_tokens, char *msg,
                             size_t n);

typedef struct lm_engine_stats {
  int active, prefilling, decoding, queued, queue_cap, parallel;
  int64_t kv_budget, kv_reserved, kv_held; /* bytes */
  int prefix_entries;
  int64_t prefix_bytes, prefix_lookups, prefix_hits, prefix_misses, prefix_tokens_reused;
  int64_t prefix_evictions;
  int64_t steps, step_tokens, step_rows, prefill_tokens, decode_tokens;
  int64_t requests_done, requests_cancelled, requests_timeout, requests_failed;
  double busy_s; /* time in forward steps and sampling */
  /* constrained decoding: host time in the constraints' masks and advances (part of busy_s),
   * and the sampled tokens they governed */
  double constraint_s;
  int64_t constrained_tokens;
  /* of it, the time a step waited for masks filled while its forward ran (GPU backends fill the
   * next rows' masks meanwhile; what is left of constraint_s runs in the parallel sampling) */
  double constraint_wait_s;
  /* speculative decoding: steps of speculating sequences (a sequence's step counts once), of them
   * the rounds that verified drafts, tokens drafted, drafts accepted, and tokens emitted */
  int64_t spec_steps, spec_rounds, spec_drafted, spec_accepted, spec_emitted;
} lm_engine_stats;

/* A consistent snapshot of the counters. Thread-safe. */
void lm_engine_get_stats(lm_engine *e, lm_engine_stats *st);

/* Saves the state of a context to a state file (atomic write): the caches of the longest prefix
 * of ids[0..n) that the engine holds (a finished request's context is kept in the prefix cache),
 * its tokens and the model's fingerprint. *saved (may be NULL) gets the tokens written. Errors:
 * LM_ERR_NOT_FOUND (no cached prefix of ids), LM_ERR_IO, LM_ERR_NOMEM. Thread-safe (runs on the
 * scheduler thread between steps). */
lm_status lm_engine_save_state(lm_engine *e, const int32_t *ids, int64_t n, const char *path,
                               int64_t *saved);

/* Loads a state file into the prefix cache: a later request whose ids begin with the saved tokens
 * reuses them. *ids (may be NULL; the caller's, lm_free) gets the saved tokens. Errors:
 * LM_ERR_NOT_FOUND (no such file), LM_ERR_IO, LM_ERR_CORRUPT, LM_ERR_INVALID (another model or
 * cache plan, more tokens than the context), LM_ERR_NOMEM. Thread-safe. */
lm_status lm_engine_load_state(lm_engine *e, const char *path, int32_t **ids, int64_t *n);

/* Teacher-forced logits: feeds ids[0..n) through a fresh context and writes the logits of every
 * position, f32 [n][vocab], to out. The first `prefill` tokens go in chunks of `chunk` (0: the
 * engine's), the rest one token per step (prefill 0 or >= n: all prefilled). Errors:
 * LM_ERR_INVALID (an id outside the vocabulary, n beyond the context), forward errors.
 * Thread-safe (runs on the scheduler thread between steps). */
lm_status lm_engine_logits(lm_engine *e, const int32_t *ids, int64_t n, int64_t prefill,
                           int64_t chunk, float *out);

/* ---- LoRA adapters mounted by name ------------------------------------------------------------
 */

typedef struct lm_adapter_info {
  char name[LM_ADAPTER_NAME_MAX];
  char format[8]; /* "peft" or "mlx-lm" */
  int max_rank;   /* the largest rank of its modules */
  int modules;    /* modules it adapts */
  int64_t bytes;  /* its matrices in the backend's memory */
  int64_t users;  /* requests queued or running with it */
  double load_s;  /* seconds from the call to the adapter being usable */
  double mount_s; /* of them, the engine thread's: the copy to the backend, between two steps */
  char dir[4096]; /* the directory it was loaded from */
} lm_adapter_info;

/* Whether the n bytes at s are a valid adapter name: 1..LM_ADAPTER_NAME_MAX-1 bytes of letters,
 * digits and ._- (so "a+b" and "BASE:NAME" stay unambiguous). Thread-safe. */
int lm_adapter_name_valid(const char *s, size_t n);

/* Loads the adapter in dir (PEFT or mlx-lm; lumen.h's --adapter rules) and mounts it under name
 * (1..LM_ADAPTER_NAME_MAX-1 bytes of letters, digits and ._-), so later requests may select it
 * (lm_request_options.adapters). The files are read and checked on the calling thread; the copy
 * into the backend's memory happens on the engine thread between two steps, so running requests
 * wait for at most that copy. Errors: LM_ERR_INVALID (a bad name, an adapter this model refuses:
 * the message names the cause), LM_ERR_STATE (the name is taken, or LM_ADAPTER_MOUNT_MAX are
 * mounted), LM_ERR_NOT_FOUND / LM_ERR_IO / LM_ERR_CORRUPT (the files), LM_ERR_NOMEM. Thread-safe.
 */
lm_status lm_engine_load_adapter(lm_engine *e, const char *name, const char *dir);

/* Unmounts name: later requests do not find it; requests that selected it before finish with it,
 * and its memory is freed when the last of them ends. Errors: LM_ERR_NOT_FOUND. Thread-safe. */
lm_status lm_engine_unload_adapter(lm_engine *e, const char *name);

/* The mounted adapters, in the order they were loaded: up to max into out; returns how many are
 * mounted. Thread-safe. */
int lm_engine_list_adapters(lm_engine *e, lm_adapter_info *out, int max);

/* ---- requests -------------------------------------------------------------------------------- */

typedef struct lm_request lm_request;

typedef enum lm_tool_choice {
  LM_TOOLS_AUTO = 0, /* the model decides */
  LM_TOOLS_NONE,     /* no tool call (the tools are still shown to the template) */
  LM_TOOLS_REQUIRED, /* the answer opens with a call (Gemma 4 vocabularies) */
  LM_TOOLS_NAMED     /* the answer opens with a call of tool_name */
} lm_tool_choice;

typedef struct lm_request_options {
  /* The prompt: exactly one of these. */
  const char *messages_json; /* a JSON array of messages, rendered with the chat template */
  const char *prompt;        /* plain text, tokenized with the tokenizer's BOS */
  const int32_t *ids;        /* token ids as they are */
  int64_t n_ids;
  const char *tools_json;           /* messages: a JSON array of tools for the template, or NULL */
  const char *template_kwargs_json; /* messages: extra template variables (a JSON object) or NULL */
  lm_tool_choice tool_choice;
  const char *tool_name;   /* LM_TOOLS_NAMED */
  lm_sampling sampling;    /* borrowed (copied at submit) */
  int has_seed;            /* 0: the engine draws a new seed for this request */
  int64_t max_tokens;      /* sampled tokens; 0: until a stop or the context limit */
  const char *const *stop; /* stop strings: the text ends before the first of them */
  int n_stop;
  int ignore_eos;   /* stop ids are ordinary tokens (fixed-length benchmarks) */
  int logprobs;     /* -1: none; 0..20: the chosen token's log-probability and N alternatives */
  int raw_output;   /* events carry the text as decoded, control tokens included, unparsed */
  int parse_output; /* prompt or ids: parse the answer as messages' answers are (reasoning,
                       tool calls), for callers that render the chat template themselves */
  int starts_in_reasoning; /* with parse_output: the prompt ends inside an open reasoning channel */
  double timeout_s;        /* deadline from submit; 0: none */
  /* With the prefix cache on: once all of the prompt but its last token is prefilled, a copy of
   * its caches goes into the prefix cache, before the request's first LM_EVENT_TOKEN. Requests
   * with the same prompt started after that event prefill only the last token: n answers to one
   * prompt for one prefill. (A copy that does not fit the KV budget is skipped.) */
  int share_prompt;
  /* Constrained decoding of the answer (after any reasoning: while the model's reasoning channel
   * is open, nothing is constrained): at most one of grammar, json_schema and json_object. The
   * stop ids come only when the text is complete, and a grammar that allows nothing more ends the
   * answer (LM_FIN_STOP, stop_id -1). Compiled once per text (the engine caches them); a bad one
   * fails lm_request_create with LM_ERR_INVALID or LM_ERR_UNSUPPORTED, the message starting with
   * the field's name and, for a schema, naming the keyword and its JSON pointer. */
  const char *grammar;     /* llama.cpp GBNF (root rule "root") */
  const char *json_schema; /* a JSON Schema (JSON text): the answer is JSON that validates */
  int json_object;         /* the answer is one JSON object */
  /* Tool calls constrained (messages on a Gemma 4 checkpoint): a call names one of tools_json's
   * tools and its arguments follow that tool's parameters schema; tool_choice is enforced (none:
   * no call; required / named: the answer is calls, after any reasoning; auto: text or calls).
   * Implied by grammar, json_schema and json_object. Without any of them, required / named open the
   * call at the prompt's end and nothing is checked. */
  int constrain_tools;
  /* Speculative decoding: "ngram" (prompt lookup: the longest recent suffix of prompt + answer
   * that occurred before proposes what followed it), "draft" (the engine's draft_model proposes
   * its greedy tokens), or NULL (off). Each step verifies the pending
   * token and up to speculative_tokens drafts in one forward and keeps the longest prefix the
   * model agrees with, plus the token it samples after it. The drafts are proposals, never
   * samples, so the answer is the one plain decoding gives, for every sampling setting and seed,
   * on backends whose multi-token steps compute every row as a one-token step does (the CPU: up
   * to 7 tokens per step, drafts trimmed to fit); other backends refuse it. */
  const char *speculative;
  int speculative_tokens; /* 1..the engine's speculative_tokens (0: the engine's) */
  /* LoRA: names of mounted adapters (lm_engine_load_adapter), stacked, adapter i with weight
   * adapter_weights[i] (NULL: 1 each); at most LM_ADAPTER_STACK_MAX. n_adapters 0: the engine's
   * own set (lm_engine_options.adapters, often none); no_adapters: the base model even where the
   * engine has a set. An unknown name fails lm_request_create with LM_ERR_NOT_FOUND, the message
   * naming it. */
  const char *const *adapters;
  const float *adapter_weights;
  int n_adapters;
  int no_adapters;
} lm_request_options;

/* No prompt, the checkpoint's sampling defaults are NOT applied (neutral sampling, temperature
 * 1), no limits, no stops, logprobs -1, tool choice auto. */
void lm_request_options_init(lm_request_options *o);

/* Builds the request without queueing it: renders messages, tokenizes text, validates the
 * options (everything is copied). lm_request_tokens then tells the prompt's length, and
 * lm_request_set_max_tokens may still change the limit. Errors: LM_ERR_INVALID (no prompt or two,
 * an empty prompt, an id outside the vocabulary, bad JSON, a template error, bad sampling, stop
 * strings without a tokenizer), LM_ERR_STATE (messages without a chat template, text without a
 * tokenizer), LM_ERR_NOMEM. Thread-safe with respect to the engine. */
lm_status lm_request_create(lm_engine *e, const lm_request_options *o, lm_request **out);

/* Changes max_tokens of a request not yet started (0: until a stop or the context limit).
 * Errors: LM_ERR_STATE (started), LM_ERR_INVALID (< 0). */
lm_status lm_request_set_max_tokens(lm_request *r, int64_t max_tokens);

/* Checks the request against the engine's limits and queues it. Errors: LM_ERR_INVALID (it can
 * never fit: lm_request_admission says whether the context or the memory is short, and the
 * message by how much), LM_ERR_STATE (the queue is full, or already started), LM_ERR_CANCELLED
 * (the engine is stopping). On error the request stays unstarted (it may be freed, or started
 * again later). */
lm_status lm_request_start(lm_request *r);

/* Why the last lm_request_start refused for lack of room (LM_ADMIT_OK otherwise). */
lm_admission lm_request_admission(const lm_request *r);

/* lm_request_create + lm_request_start; on error nothing is left to free. */
lm_status lm_request_submit(lm_engine *e, const lm_request_options *o, lm_request **out);

typedef enum lm_event_kind {
  LM_EVENT_NONE = 0,  /* nothing yet (lm_request_next timed out) */
  LM_EVENT_TOKEN,     /* a sampled token: id, logprobs, the text it released (before parsing) */
  LM_EVENT_CONTENT,   /* answer text */
  LM_EVENT_REASONING, /* reasoning text (the thought channel) */
  LM_EVENT_TOOL_CALL, /* a complete tool call: name and arguments (JSON) */
  LM_EVENT_DONE       /* the end: finish reason and usage; no event follows */
} lm_event_kind;

typedef enum lm_finish_kind {
  LM_FIN_NONE = 0,
  LM_FIN_STOP,      /* a stop id was sampled (stop_id says which) */
  LM_FIN_STOP_STR,  /* a stop string appeared (stop_index says which) */
  LM_FIN_LENGTH,    /* max_tokens, or the context limit */
  LM_FIN_CANCELLED, /* lm_request_cancel, or the engine stopped */
  LM_FIN_TIMEOUT,   /* the request's deadline passed */
  LM_FIN_ERROR      /* an engine error (message) */
} lm_finish_kind;

#define LM_TOP_LOGPROBS_MAX 20

typedef struct lm_usage {
  int64_t prompt_tokens, cached_tokens, completion_tokens; /* completion counts a stop id too */
  int64_t decode_steps;                                    /* forward steps after the prompt */
  int64_t drafted_tokens, accepted_tokens; /* speculative decoding: proposed, and kept */
  double queue_s, prefill_s, ttft_s,
      decode_s; /* waiting, prefill, first token since submit, rest */
} lm_usage;

typedef struct lm_event {
  lm_event_kind kind;
  /* LM_EVENT_TOKEN */
  int32_t token;
  int is_stop;   /* the token is a stop id (not part of the answer) */
  float logprob; /* when logprobs >= 0 */
  int n_top;
  int32_t top_ids[LM_TOP_LOGPROBS_MAX];
  float top_logprobs[LM_TOP_LOGPROBS_MAX];
  /* LM_EVENT_TOKEN, CONTENT, REASONING: text[0..len), valid until the next call on the request */
  const char *text;
  size_t len;
  /* LM_EVENT_TOOL_CALL: the index of the call in this answer, its name and arguments */
  int tool_index;
  const char *tool_name, *tool_arguments;
  /* LM_EVENT_TOKEN of a speculating request: round_start is 1 on the first token of each decode
   * step, and that event carries the step's drafts (n_drafted, drafted[]; none when nothing
   * recurred). The step's tokens are the drafts the model accepted, in order, then the one it
   * chose after them (unless the answer ended first): the accepted count is how many leading
   * drafts the step's tokens match. */
  int round_start, n_drafted;
  int32_t drafted[LM_SPEC_MAX_TOKENS];
  /* LM_EVENT_DONE */
  lm_finish_kind finish;
  int32_t stop_id;   /* LM_FIN_STOP */
  int stop_index;    /* LM_FIN_STOP_STR */
  const char *error; /* LM_FIN_ERROR, LM_FIN_TIMEOUT, LM_FIN_CANCELLED: why */
  lm_usage usage;
} lm_event;

/* Takes the next event, waiting up to timeout_ms (< 0: until one comes; 0: no wait). On a
 * timeout ev->kind is LM_EVENT_NONE and LM_OK is returned. After LM_EVENT_DONE every call returns
 * LM_EVENT_DONE again. Errors: LM_ERR_NOMEM (the request is cancelled). One thread at a time. */
lm_status lm_request_next(lm_request *r, int timeout_ms, lm_event *ev);

/* Asks the engine to stop the request: it ends with LM_FIN_CANCELLED before the next step (the
 * text streamed so far stays). Idempotent; any thread. */
void lm_request_cancel(lm_request *r);

/* The request's context: the prompt ids, then the sampled ids (a stop id excluded) as far as the
 * events taken so far go. Valid until the next call on the request. */
const int32_t *lm_request_tokens(const lm_request *r, int64_t *n, int64_t *n_prompt);

/* The answer so far, parsed: content and reasoning (NUL-terminated, valid until the next call on
 * the request) and the number of tool calls. Raw-output requests have only content. */
const char *lm_request_content(const lm_request *r, size_t *len);
const char *lm_request_reasoning(const lm_request *r, size_t *len);
int lm_request_tool_calls(const lm_request *r);

/* Cancels the request if it is still running and frees it. NULL is a no-op. */
void lm_request_free(lm_request *r);

#ifdef __cplusplus
}
#endif
#endif /* LUMEN_H */
