/* api_impl.h — what the public handles of lumen.h hold (checkpoint.c, engine.c, request.c). The
 * API layer turns text into ids and events back into text; the scheduler (sched.h) below it sees
 * only ids, caches and samplers. */
#ifndef LM_ENGINE_API_IMPL_H
#define LM_ENGINE_API_IMPL_H

#include <pthread.h>
#include <stdatomic.h>

#include "backend/backend.h"
#include "engine/grammar_cache.h"
#include "engine/sched.h"
#include "grammar/grammar.h"
#include "lumen.h"
#include "model/model.h"
#include "sample/gen_config.h"
#include "text/chat.h"
#include "text/parse.h"
#include "text/tokenizer.h"

#define LM_API_MAX_KEEP 8

struct lm_checkpoint {
  char *dir, *name;
  lm_model *m;
  lm_tokenizer *tok;      /* NULL: ids only */
  lm_chat_template *tmpl; /* NULL: no chat */
  lm_gen_config gc;
  int32_t *stop_ids;
  int32_t n_stop_ids;
  int gemma4;                    /* the vocabulary has Gemma 4's control tokens */
  lm_parser_tokens ptok;         /* every id -1 without them (but eos) */
  int32_t keep[LM_API_MAX_KEEP]; /* control tokens the output parser reads: streamed as text */
  int32_t n_keep;
  char *bos, *eos; /* token strings for the template */
  int64_t max_positions;
  size_t longest_piece; /* bytes of the longest token piece */
  atomic_int engines;   /* engines on this checkpoint (at most one) */
  int32_t think_id;     /* <|think|> (a prompt with it turns thinking on), -1 */
  int32_t quote_id;     /* <|"|>, the call syntax's string quote (a grammar may use it), -1 */
  /* the vocabulary as grammars see it, built on the first constrained request (gv_mu) */
  pthread_mutex_t gv_mu;
  lm_grammar_vocab *gv;
  char *gv_bytes;
};

/* The checkpoint's grammar vocabulary (built once, on first use; thread-safe). Errors:
 * LM_ERR_STATE (no tokenizer), LM_ERR_NOMEM, the grammar library's. */
lm_status lm_checkpoint_grammar_vocab(lm_checkpoint *ck, const lm_grammar_vocab **out);

struct lm_engine {
  lm_checkpoint *ck;
  lm_backend *be;
  lm_engine_options o; /* resolved; string fields point into the copies below */
  char *kv_quant, *kv_config;
  lm_kv_spec *specs;
  lm_sched *sched;
  lm_engine_info info;
  atomic_uint_fast64_t seq;   /* seeds of requests without one */
  lm_grammar_cache *grammars; /* compiled constraints by source text (grammar_cache.h) */
  int32_t *stop_sorted;       /* the checkpoint's stop ids, sorted (constraints read them) */
  int32_t n_stop;
  struct lm_spec_draft *draft; /* lm_engine_options.draft_model, loaded (NULL: none) */
  struct lm_lora *lora[8];     /* lm_engine_options.adapters, loaded */
  int n_lora;
  /* adapters mounted by name (engine_adapters.c), under mounts_mu; slot -1: still loading */
  pthread_mutex_t mounts_mu;
  struct lm_mount *mounts; /* [LM_ADAPTER_MOUNT_MAX] */
  int n_mounts;
};

/* The adapters a request selects (lumen.h lm_request_options.adapters), resolved to the mounts
 * its job carries (engine_adapters.c). */
lm_status lm_engine_pick_adapters(lm_engine *e, const lm_request_options *o, lm_job *j);

#endif
