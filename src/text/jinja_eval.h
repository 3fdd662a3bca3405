/* jinja_eval.h — evaluator state shared by jinja_eval.c and the builtins in jinja_builtins.c
 * (internal). */
#ifndef LM_TEXT_JINJA_EVAL_H
#define LM_TEXT_JINJA_EVAL_H

#include "text/jinja.h"
#include "text/jinja_ast.h"

/* A variable scope. jinja2 scoping: a macro call and each for-loop iteration get a fresh frame;
 * `if` does not. Lookups walk to the parent; assignments go to the innermost frame. */
typedef struct lm_jframe {
  struct lm_jframe *parent;
  size_t n, cap;
  const char **names;
  lm_jv *vals;
} lm_jframe;

/* Nested evaluations per render: a few hundred bytes of stack each, so 1024 stay well inside a
 * thread's stack even under a sanitizer. */
#define LM_JINJA_MAX_EVAL_DEPTH 1024

typedef struct lm_jctx {
  lm_jarena *a;
  lm_jbuf *out; /* where text goes now: the result, or a capture (set block, macro call) */
  lm_jinja_limits lim;
  uint64_t steps;
  int depth;
  int edepth;       /* expressions being evaluated, nested (LM_JINJA_MAX_EVAL_DEPTH) */
  int located;      /* the pending error message already names a template position */
  int flow;         /* LM_JFLOW_* after break/continue until the enclosing loop consumes it */
  lm_jframe *frame; /* innermost scope: names resolve from here outwards */
} lm_jctx;

enum { LM_JFLOW_NONE = 0, LM_JFLOW_BREAK, LM_JFLOW_CONTINUE };

/* Evaluated call arguments. */
typedef struct lm_jcall {
  const lm_jv *args;
  size_t nargs;
  const char *const *kwnames;
  const lm_jv *kwvals;
  size_t nkw;
} lm_jcall;

/* A macro value (LM_JV_MACRO): its definition (MACRO or CALLBLOCK node) and the frame it closes
 * over. */
typedef struct lm_jmacro {
  const lm_jnode *node;
  lm_jframe *scope;
  struct lm_jmacro *caller; /* for a macro invoked by {% call %}: the call block's body */
} lm_jmacro;

/* The `loop` object (LM_JV_LOOP). */
typedef struct lm_jloop {
  lm_jv items; /* the (filtered) list being iterated */
  size_t index0;
  int depth;
} lm_jloop;

/* Positional-or-keyword argument `name` at position `pos`; returns 1 when given. */
int lm_jcall_arg(const lm_jcall *c, size_t pos, const char *name, lm_jv *out);

/* Attribute / item lookup with jinja2's rules: missing gives Undefined, but any lookup on Undefined
 * fails ("'x' is undefined"). */
lm_status lm_jinja_getattr(lm_jctx *x, lm_jv obj, const char *name, lm_jv *out);
lm_status lm_jinja_getitem(lm_jctx *x, lm_jv obj, lm_jv key, lm_jv *out);
/* Calls a macro or builtin function value. */
lm_status lm_jinja_call_value(lm_jctx *x, lm_jv fn, const lm_jcall *c, lm_jv *out);
/* Items of an iterable as a list (dict: keys; str: characters; Undefined: empty). */
lm_status lm_jinja_iterate(lm_jctx *x, lm_jv v, lm_jv *out_list);

/* Builtins (jinja_builtins.c). */
lm_status lm_jinja_apply_filter(lm_jctx *x, int id, lm_jv in, const lm_jcall *c, lm_jv *out);
lm_status lm_jinja_apply_test(lm_jctx *x, int id, lm_jv in, const lm_jcall *c, int *result);
/* A Python method of a str/dict/list/loop value. *found = 0 when the type has no such method. */
lm_status lm_jinja_call_method(lm_jctx *x, lm_jv obj, const char *name, const lm_jcall *c,
                               lm_jv *out, int *found);
/* Builtin global functions: ids for LM_JV_FUNC values. */
enum {
  LM_JFN_RANGE = 1,
  LM_JFN_NAMESPACE,
  LM_JFN_DICT,
  LM_JFN_RAISE,
  LM_JFN_STRFTIME,
  LM_JFN_COUNT
};
extern const char *const lm_jinja_global_names[LM_JFN_COUNT];
lm_status lm_jinja_call_global(lm_jctx *x, int id, const lm_jcall *c, lm_jv *out);

/* Python `%` formatting of a string (used by the % operator and the format filter). */
lm_status lm_jinja_percent_format(lm_jctx *x, lm_jv fmt, lm_jv args, lm_jv *out);
/* Python str.replace(old, new, count) (count < 0: all) and str.splitlines(keepends). */
lm_status lm_jinja_str_replace(lm_jctx *x, const lm_jstr *s, const lm_jstr *old,
                               const lm_jstr *new_, int64_t count, lm_jv *out);
lm_status lm_jinja_splitlines(lm_jctx *x, const lm_jstr *s, int keepends, lm_jv *out);
/* Python len(); LM_ERR_INVALID for values without a length. */
lm_status lm_jinja_len(lm_jv v, int64_t *n);

#endif
