/* jinja.h — a Jinja2-subset template interpreter, enough to run the chat templates that checkpoints
 * ship.
 *
 * It follows Python jinja2 3.1 as Hugging Face transformers configures it for apply_chat_template:
 * trim_blocks, lstrip_blocks, loop controls (break/continue), a raise_exception() global,
 * transformers' tojson (json.dumps, no HTML escaping, keys unsorted) and strftime_now(). Values
 * print the way Python's str() prints them. What is implemented: {{ }}, {% %}, {# #} with `-`/`+`
 * whitespace control; if/elif/ else, for (loop.*, else, `if` filter, tuple unpacking), set (names,
 * tuples, namespace attributes, block capture), macro with defaults and keyword arguments, call
 * blocks with caller(), filter blocks, raw; the filters, tests, string/dict methods and operators
 * listed in jinja_builtins.c and jinja_eval.c. Not implemented (an error, never a silent
 * difference): include/import/extends/block, recursive loops, star arguments in calls, the `do`
 * tag. Sandbox: values are immutable except namespace attributes, as under transformers'
 * ImmutableSandboxedEnvironment.
 *
 * Errors carry "line L col C". Syntax errors are LM_ERR_CORRUPT, unknown filters/tests/tags
 * LM_ERR_UNSUPPORTED, failures while rendering (raise_exception, type errors, limits)
 * LM_ERR_INVALID, memory LM_ERR_NOMEM.
 *
 * Thread safety: a compiled template is immutable; any number of threads may render it at once. */
#ifndef LM_TEXT_JINJA_H
#define LM_TEXT_JINJA_H

#include <stddef.h>
#include <stdint.h>

#include "lumen.h"
#include "text/jinja_value.h"

typedef struct lm_jinja_template lm_jinja_template;

typedef struct lm_jinja_options {
  int trim_blocks;
  int lstrip_blocks;
} lm_jinja_options;

/* The transformers environment: trim_blocks and lstrip_blocks on. */
static inline lm_jinja_options lm_jinja_options_hf(void) {
  lm_jinja_options o = {1, 1};
  return o;
}

/* Bounds for one render; a template that passes one fails with LM_ERR_INVALID (or NOMEM for
 * memory). */
typedef struct lm_jinja_limits {
  size_t max_output;  /* bytes of rendered text */
  size_t max_memory;  /* bytes of arena for values built while rendering */
  uint64_t max_steps; /* statements executed + loop iterations + calls */
  int max_depth;      /* macro call nesting */
} lm_jinja_limits;

/* 32 MiB output, 512 MiB values, 50M steps, 100 nested calls: far above any chat prompt. */
static inline lm_jinja_limits lm_jinja_limits_default(void) {
  lm_jinja_limits l = {32u << 20, 512u << 20, 50000000u, 100};
  return l;
}

/* Compiles src[0..len). opts NULL = lm_jinja_options_hf(). *out is NULL on failure. */
lm_status lm_jinja_compile(const char *src, size_t len, const lm_jinja_options *opts,
                           lm_jinja_template **out);
void lm_jinja_free(lm_jinja_template *t);

/* 1 when the template reads or assigns a variable of this name anywhere (0 for NULL). */
int lm_jinja_refers_to(const lm_jinja_template *t, const char *name);

/* Renders with the variables of `vars` (a DICT value, or UNDEF for none) visible as globals, next
 * to the builtins (range, namespace, dict, raise_exception, strftime_now). Temporary values are
 * allocated in `arena` (the caller frees it; it may hold vars too). limits NULL =
 * lm_jinja_limits_default(). On LM_OK *out is a malloc'd NUL-terminated string (free() it),
 * *out_len its length (may be NULL). */
lm_status lm_jinja_render(const lm_jinja_template *t, lm_jarena *arena, lm_jv vars,
                          const lm_jinja_limits *limits, char **out, size_t *out_len);

#endif
