/* jinja_ast.h — tokens and syntax tree shared by the template lexer, parser and evaluator
 * (internal).
 *
 * One fat node type serves every expression and statement: the tree is small (a chat template is a
 * few hundred nodes), lives in the template's arena, and a uniform node keeps the parser and
 * evaluator free of casts. The field comments say which node types use which fields. */
#ifndef LM_TEXT_JINJA_AST_H
#define LM_TEXT_JINJA_AST_H

#include "text/jinja_value.h"

/* ---- tokens --------------------------------------------------------------------------------- */

typedef enum lm_jtok_type {
  LM_JT_DATA,        /* template text (s, n) after whitespace control */
  LM_JT_VAR_BEGIN,   /* {{ */
  LM_JT_VAR_END,     /* }} */
  LM_JT_BLOCK_BEGIN, /* {% */
  LM_JT_BLOCK_END,   /* %} */
  LM_JT_NAME,        /* identifier (s, n) */
  LM_JT_INT,         /* integer literal (value) */
  LM_JT_FLOAT,       /* float literal (value) */
  LM_JT_STRING,      /* string literal, escapes resolved (value) */
  LM_JT_OP,          /* operator (s, n), e.g. "//" */
  LM_JT_EOF
} lm_jtok_type;

typedef struct lm_jtok {
  lm_jtok_type type;
  int line, col;
  const char *s;
  size_t n;
  lm_jv value;
} lm_jtok;

typedef struct lm_jtoks {
  lm_jtok *v;
  size_t n, cap;
} lm_jtoks;

typedef struct lm_jlex_opts {
  int trim_blocks, lstrip_blocks;
} lm_jlex_opts;

/* Tokenizes src (already newline-normalized, NUL-terminated) into toks; strings live in arena. */
lm_status lm_jinja_lex(lm_jarena *arena, const char *src, size_t len, const lm_jlex_opts *opts,
                       lm_jtoks *toks);

/* ---- nodes ---------------------------------------------------------------------------------- */

typedef enum lm_jnode_type {
  /* expressions */
  LM_JN_LIT,    /* lit */
  LM_JN_NAME,   /* name */
  LM_JN_LIST,   /* args = items */
  LM_JN_TUPLE,  /* args = items */
  LM_JN_DICT,   /* args = keys, kwvals = values */
  LM_JN_ATTR,   /* a.name */
  LM_JN_ITEM,   /* a[b] */
  LM_JN_SLICE,  /* a[b:c:d], each of b/c/d may be NULL */
  LM_JN_CALL,   /* a(args, kwnames=kwvals) */
  LM_JN_FILTER, /* a | name(args, kw); a is NULL inside a filter block; op = filter id */
  LM_JN_TEST,   /* a is [not] name(args); op = test id, negated = "is not" */
  LM_JN_UNARY,  /* op ('!' not, '-' neg, '+' pos) a */
  LM_JN_BINOP,  /* a op b: + - * / // % ** ~ in notin, op = LM_JOP_* */
  LM_JN_CMP,    /* a op b, op = LM_JOP_EQ..GE; chains nest as AND */
  LM_JN_AND,    /* a and b */
  LM_JN_OR,     /* a or b */
  LM_JN_COND,   /* a if b else c (c may be NULL: Undefined) */
  /* statements */
  LM_JN_TEXT,        /* lit: a string */
  LM_JN_PRINT,       /* {{ a }} */
  LM_JN_IF,          /* if a: body else orelse (elif nests in orelse) */
  LM_JN_FOR,         /* for a (target) in b [if c]: body else orelse */
  LM_JN_SET,         /* set a (NAME, TUPLE of NAME, or ATTR) = b */
  LM_JN_SETBLOCK,    /* set a (target) [| filters in b] : body captured */
  LM_JN_MACRO,       /* macro name(args = NAME params, kwvals = defaults or NULL): body */
  LM_JN_CALLBLOCK,   /* call[(args = caller params)] a: body is the `caller()` macro */
  LM_JN_FILTERBLOCK, /* filter b (FILTER chain with a NULL leaf): body */
  LM_JN_BREAK,
  LM_JN_CONTINUE,
  LM_JN_SEQ /* body only (e.g. a {% generation %} block) */
} lm_jnode_type;

enum {
  LM_JOP_ADD = 1,
  LM_JOP_SUB,
  LM_JOP_MUL,
  LM_JOP_DIV,
  LM_JOP_FLOORDIV,
  LM_JOP_MOD,
  LM_JOP_POW,
  LM_JOP_CONCAT,
  LM_JOP_IN,
  LM_JOP_NOTIN,
  LM_JOP_EQ,
  LM_JOP_NE,
  LM_JOP_LT,
  LM_JOP_LE,
  LM_JOP_GT,
  LM_JOP_GE
};

typedef struct lm_jnode lm_jnode;

typedef struct lm_jnodes {
  lm_jnode **v;
  size_t n;
} lm_jnodes;

struct lm_jnode {
  lm_jnode_type type;
  int op;
  int negated;
  int line, col;
  int height; /* longest path to a leaf in this expression (parse-time depth bound) */
  lm_jv lit;
  const char *name;
  lm_jnode *a, *b, *c, *d;
  lm_jnodes args;
  lm_jnodes kwvals;
  const char **kwnames;
  lm_jnodes body, orelse;
};

/* A compiled template: the tree and the arena that holds it. */
struct lm_jinja_template {
  lm_jarena *arena;
  lm_jnodes body;
};

/* Builtin filter and test ids (-1 when unknown), resolved at parse time as jinja2 does. */
int lm_jinja_filter_id(const char *name);
int lm_jinja_test_id(const char *name);

#endif
