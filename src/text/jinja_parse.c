/* jinja_parse.c — tokens to a syntax tree: jinja2's grammar, recursive descent.
 *
 * Precedence, loosest first (jinja2 3.1 parser.py): `x if c else y`, or, and, not, comparisons and
 * `in`/`not in`, + -, ~, * / // %, **, unary - +, then postfix (.attr, [item], [a:b:c], call) with
 * filters `|f` and tests `is t` binding tightest. So `a | trim | length > 0` is `(a|trim|length) >
 * 0` and `x ~ y | upper` upper-cases only y. Filters and tests are resolved here, so an unknown one
 * fails when the template loads, as in jinja2. Nesting is capped so hostile input cannot exhaust
 * the stack: recursion by depth, and the trees that loops build (`1 + 1 + ...`, `x|f|f|...`)
 * by their height, which the evaluator would otherwise walk recursively. */
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "text/jinja.h"
#include "text/jinja_ast.h"

#define LM_JPARSE_MAX_DEPTH 100
/* Height of one expression tree; chat templates stay below 20. */
#define LM_JPARSE_MAX_HEIGHT 256

typedef struct parser {
  lm_jarena *a;
  const lm_jtok *t;
  size_t n, i;
  int depth;
} parser;

typedef struct nvec {
  lm_jnode **v;
  const char **names;
  size_t n, cap;
} nvec;

static const lm_jtok *cur(const parser *P) { return &P->t[P->i]; }
static const lm_jtok *peek(const parser *P, size_t k) {
  return &P->t[P->i + k < P->n ? P->i + k : P->n - 1];
}

static lm_status perr(const parser *P, const lm_jtok *t, const char *fmt, const char *arg) {
  char msg[256];
  snprintf(msg, sizeof msg, fmt, arg ? arg : "");
  return LM_ERRF(LM_ERR_CORRUPT, "template syntax error at line %d col %d: %s", t->line, t->col,
                 msg);
}

static int is_op(const lm_jtok *t, const char *op) {
  return t->type == LM_JT_OP && t->n == strlen(op) && memcmp(t->s, op, t->n) == 0;
}

static int is_name(const lm_jtok *t, const char *name) {
  return t->type == LM_JT_NAME && t->n == strlen(name) && memcmp(t->s, name, t->n) == 0;
}

static int accept_op(parser *P, const char *op) {
  if (!is_op(cur(P), op)) return 0;
  P->i++;
  return 1;
}

static int accept_name(parser *P, const char *name) {
  if (!is_name(cur(P), name)) return 0;
  P->i++;
  return 1;
}

static lm_status expect_op(parser *P, const char *op) {
  if (accept_op(P, op)) return LM_OK;
  return perr(P, cur(P), "expected '%s'", op);
}

static lm_status expect_block_end(parser *P) {
  if (cur(P)->type == LM_JT_BLOCK_END) {
    P->i++;
    return LM_OK;
  }
  return perr(P, cur(P), "expected end of block tag ('%%}')%s", NULL);
}

static lm_status new_node(parser *P, lm_jnode_type type, const lm_jtok *at, lm_jnode **out) {
  LM_TRY(lm_jarena_alloc(P->a, sizeof **out, (void **)out));
  (*out)->type = type;
  (*out)->line = at->line;
  (*out)->col = at->col;
  return LM_OK;
}

static lm_status tok_name(parser *P, const lm_jtok *t, const char **out) {
  char *s;
  LM_TRY(lm_jarena_alloc(P->a, t->n + 1, (void **)&s));
  memcpy(s, t->s, t->n);
  *out = s;
  return LM_OK;
}

static lm_status expect_name(parser *P, const char **out) {
  if (cur(P)->type != LM_JT_NAME) return perr(P, cur(P), "expected a name%s", NULL);
  LM_TRY(tok_name(P, cur(P), out));
  P->i++;
  return LM_OK;
}

static lm_status nvec_push(nvec *v, lm_jnode *node, const char *name) {
  if (v->n == v->cap) {
    size_t cap = v->cap ? v->cap * 2 : 8;
    lm_jnode **nv = realloc(v->v, cap * sizeof *nv);
    if (!nv) return LM_ERRF(LM_ERR_NOMEM, "out of memory (parser)");
    v->v = nv;
    const char **nn = realloc(v->names, cap * sizeof *nn);
    if (!nn) return LM_ERRF(LM_ERR_NOMEM, "out of memory (parser)");
    v->names = nn;
    v->cap = cap;
  }
  v->v[v->n] = node;
  v->names[v->n++] = name;
  return LM_OK;
}

static void nvec_free(nvec *v) {
  free(v->v);
  free(v->names);
}

/* Moves a vector into the arena (and frees the vector). */
static lm_status nvec_done(parser *P, nvec *v, lm_jnodes *out, const char ***names) {
  lm_status s = LM_OK;
  out->n = v->n;
  out->v = NULL;
  if (v->n) {
    s = lm_jarena_alloc(P->a, v->n * sizeof *out->v, (void **)&out->v);
    if (s == LM_OK) memcpy(out->v, v->v, v->n * sizeof *out->v);
    if (s == LM_OK && names) {
      s = lm_jarena_alloc(P->a, v->n * sizeof **names, (void **)names);
      if (s == LM_OK) memcpy(*names, v->names, v->n * sizeof **names);
    }
  }
  nvec_free(v);
  return s;
}

/* ---- expressions ---------------------------------------------------------------------------- */

static lm_status parse_expr(parser *P, int with_cond, lm_jnode **out);
static lm_status parse_tuple(parser *P, int with_cond, int explicit_parens, lm_jnode **out);
static lm_status parse_unary(parser *P, int with_filter, lm_jnode **out);

static lm_status enter(parser *P) {
  if (++P->depth > LM_JPARSE_MAX_DEPTH)
    return perr(P, cur(P), "expression nested too deeply%s", NULL);
  return LM_OK;
}

/* n gets child as an operand: n's height grows past it, within the cap. */
static lm_status grow(parser *P, lm_jnode *n, const lm_jnode *child) {
  if (child && child->height + 1 > n->height) n->height = child->height + 1;
  if (n->height > LM_JPARSE_MAX_HEIGHT)
    return LM_ERRF(LM_ERR_INVALID,
                   "template syntax error at line %d col %d: expression nested deeper than %d "
                   "(operators, filters or calls)",
                   n->line, n->col, LM_JPARSE_MAX_HEIGHT);
  return LM_OK;
}

/* Call arguments after '(': positional, then name=value. */
static lm_status parse_args(parser *P, lm_jnode *call) {
  nvec pos = {0}, kw = {0};
  lm_status s = LM_OK;
  while (s == LM_OK && !is_op(cur(P), ")")) {
    if (pos.n + kw.n > 0 && (s = expect_op(P, ",")) != LM_OK) break;
    if (is_op(cur(P), ")")) break; /* trailing comma */
    if (is_op(cur(P), "*") || is_op(cur(P), "**")) {
      s = perr(P, cur(P), "*args / **kwargs in calls are not supported%s", NULL);
      break;
    }
    lm_jnode *e;
    if (cur(P)->type == LM_JT_NAME && is_op(peek(P, 1), "=")) {
      const char *name;
      if ((s = expect_name(P, &name)) != LM_OK) break;
      P->i++;
      if ((s = parse_expr(P, 1, &e)) == LM_OK && (s = grow(P, call, e)) == LM_OK)
        s = nvec_push(&kw, e, name);
    } else if (kw.n) {
      s = perr(P, cur(P), "positional argument after keyword argument%s", NULL);
    } else if ((s = parse_expr(P, 1, &e)) == LM_OK && (s = grow(P, call, e)) == LM_OK) {
      s = nvec_push(&pos, e, NULL);
    }
  }
  if (s == LM_OK) s = expect_op(P, ")");
  if (s != LM_OK) {
    nvec_free(&pos);
    nvec_free(&kw);
    return s;
  }
  LM_TRY(nvec_done(P, &pos, &call->args, NULL));
  return nvec_done(P, &kw, &call->kwvals, &call->kwnames);
}

static lm_status parse_list_like(parser *P, const char *close, int is_dict, lm_jnode *node) {
  nvec keys = {0}, vals = {0};
  lm_status s = LM_OK;
  while (s == LM_OK && !is_op(cur(P), close)) {
    if (keys.n && (s = expect_op(P, ",")) != LM_OK) break;
    if (is_op(cur(P), close)) break;
    lm_jnode *k, *v = NULL;
    if ((s = parse_expr(P, 1, &k)) != LM_OK) break;
    if (is_dict && ((s = expect_op(P, ":")) != LM_OK || (s = parse_expr(P, 1, &v)) != LM_OK)) break;
    if ((s = nvec_push(&keys, k, NULL)) == LM_OK && is_dict) s = nvec_push(&vals, v, NULL);
  }
  if (s == LM_OK) s = expect_op(P, close);
  if (s != LM_OK) {
    nvec_free(&keys);
    nvec_free(&vals);
    return s;
  }
  LM_TRY(nvec_done(P, &keys, &node->args, NULL));
  return nvec_done(P, &vals, &node->kwvals, NULL);
}

static lm_status parse_primary(parser *P, lm_jnode **out) {
  const lm_jtok *t = cur(P);
  if (t->type == LM_JT_NAME) {
    LM_TRY(new_node(P, LM_JN_LIT, t, out));
    if (is_name(t, "true") || is_name(t, "True"))
      (*out)->lit = lm_jv_bool(1);
    else if (is_name(t, "false") || is_name(t, "False"))
      (*out)->lit = lm_jv_bool(0);
    else if (is_name(t, "none") || is_name(t, "None"))
      (*out)->lit = lm_jv_none();
    else {
      (*out)->type = LM_JN_NAME;
      LM_TRY(tok_name(P, t, &(*out)->name));
    }
    P->i++;
    return LM_OK;
  }
  if (t->type == LM_JT_STRING) { /* adjacent literals concatenate, as in Python */
    LM_TRY(new_node(P, LM_JN_LIT, t, out));
    (*out)->lit = t->value;
    P->i++;
    if (cur(P)->type == LM_JT_STRING) {
      lm_jbuf b = {0};
      lm_status s = lm_jbuf_put(&b, t->value.u.s->s, t->value.u.s->len);
      while (s == LM_OK && cur(P)->type == LM_JT_STRING) {
        s = lm_jbuf_put(&b, cur(P)->value.u.s->s, cur(P)->value.u.s->len);
        P->i++;
      }
      if (s == LM_OK) s = lm_jv_str(P->a, b.data, b.len, &(*out)->lit);
      lm_jbuf_free(&b);
      return s;
    }
    return LM_OK;
  }
  if (t->type == LM_JT_INT || t->type == LM_JT_FLOAT) {
    LM_TRY(new_node(P, LM_JN_LIT, t, out));
    (*out)->lit = t->value;
    P->i++;
    return LM_OK;
  }
  if (is_op(t, "(")) {
    P->i++;
    LM_TRY(parse_tuple(P, 1, 1, out));
    return expect_op(P, ")");
  }
  if (is_op(t, "[") || is_op(t, "{")) {
    int is_dict = is_op(t, "{");
    P->i++;
    LM_TRY(new_node(P, is_dict ? LM_JN_DICT : LM_JN_LIST, t, out));
    return parse_list_like(P, is_dict ? "}" : "]", is_dict, *out);
  }
  if (t->type == LM_JT_EOF || t->type == LM_JT_VAR_END || t->type == LM_JT_BLOCK_END)
    return perr(P, t, "expected an expression%s", NULL);
  return perr(P, t, "unexpected token '%s'",
              t->type == LM_JT_OP ? (is_op(t, "}") ? "}" : t->s) : "?");
}

/* Inside [ ]: an index or a slice a:b:c (each part optional). */
static lm_status parse_subscript(parser *P, lm_jnode *target, const lm_jtok *at, lm_jnode **out) {
  lm_jnode *parts[3] = {NULL, NULL, NULL};
  int is_slice = 0;
  for (int k = 0; k < 3; k++) {
    if (!is_op(cur(P), ":") && !is_op(cur(P), "]")) LM_TRY(parse_expr(P, 1, &parts[k]));
    if (k < 2 && accept_op(P, ":")) {
      is_slice = 1;
      continue;
    }
    break;
  }
  LM_TRY(expect_op(P, "]"));
  LM_TRY(new_node(P, is_slice ? LM_JN_SLICE : LM_JN_ITEM, at, out));
  (*out)->a = target;
  (*out)->b = parts[0];
  (*out)->c = parts[1];
  (*out)->d = parts[2];
  if (!is_slice && !parts[0]) return perr(P, at, "empty subscript%s", NULL);
  return LM_OK;
}

static lm_status parse_postfix(parser *P, lm_jnode **node) {
  for (;;) {
    const lm_jtok *t = cur(P);
    lm_jnode *n;
    if (is_op(t, ".")) {
      P->i++;
      if (cur(P)->type == LM_JT_INT) { /* foo.0 is foo[0] */
        LM_TRY(new_node(P, LM_JN_ITEM, t, &n));
        LM_TRY(new_node(P, LM_JN_LIT, cur(P), &n->b));
        n->b->lit = cur(P)->value;
        P->i++;
      } else {
        LM_TRY(new_node(P, LM_JN_ATTR, t, &n));
        LM_TRY(expect_name(P, &n->name));
      }
      n->a = *node;
    } else if (is_op(t, "[")) {
      P->i++;
      LM_TRY(parse_subscript(P, *node, t, &n));
    } else if (is_op(t, "(")) {
      P->i++;
      LM_TRY(new_node(P, LM_JN_CALL, t, &n));
      n->a = *node;
      n->line = (*node)->line, n->col = (*node)->col; /* errors point at the callee, not at '(' */
      LM_TRY(parse_args(P, n));
    } else {
      return LM_OK;
    }
    LM_TRY(grow(P, n, *node));
    *node = n;
  }
}

static lm_status parse_filter(parser *P, lm_jnode *operand, lm_jnode **out) {
  const lm_jtok *t = cur(P);
  lm_jnode *n;
  LM_TRY(new_node(P, LM_JN_FILTER, t, &n));
  LM_TRY(expect_name(P, &n->name));
  while (is_op(cur(P), ".") && peek(P, 1)->type == LM_JT_NAME)
    P->i += 2; /* dotted names: unknown anyway */
  n->op = lm_jinja_filter_id(n->name);
  if (n->op < 0)
    return LM_ERRF(LM_ERR_UNSUPPORTED, "template error at line %d col %d: unknown filter '%s'",
                   t->line, t->col, n->name);
  n->a = operand;
  LM_TRY(grow(P, n, operand));
  if (accept_op(P, "(")) LM_TRY(parse_args(P, n));
  *out = n;
  return LM_OK;
}

static lm_status parse_test(parser *P, lm_jnode *operand, lm_jnode **out) {
  const lm_jtok *t = cur(P);
  lm_jnode *n;
  LM_TRY(new_node(P, LM_JN_TEST, t, &n));
  n->negated = accept_name(P, "not");
  LM_TRY(expect_name(P, &n->name));
  n->op = lm_jinja_test_id(n->name);
  if (n->op < 0)
    return LM_ERRF(LM_ERR_UNSUPPORTED, "template error at line %d col %d: unknown test '%s'",
                   t->line, t->col, n->name);
  n->a = operand;
  LM_TRY(grow(P, n, operand));
  const lm_jtok *c = cur(P);
  if (accept_op(P, "(")) {
    LM_TRY(parse_args(P, n));
  } else if ((c->type == LM_JT_NAME || c->type == LM_JT_STRING || c->type == LM_JT_INT ||
              c->type == LM_JT_FLOAT || is_op(c, "(") || is_op(c, "[") || is_op(c, "{")) &&
             !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and") && !is_name(c, "if") &&
             !is_name(c, "is")) {
    /* `x is divisibleby 3`, `x is sameas none`: one bare argument */
    lm_jnode *arg;
    LM_TRY(parse_primary(P, &arg));
    LM_TRY(parse_postfix(P, &arg));
    LM_TRY(lm_jarena_alloc(P->a, sizeof *n->args.v, (void **)&n->args.v));
    n->args.v[0] = arg;
    n->args.n = 1;
  }
  *out = n;
  return LM_OK;
}

static lm_status parse_filter_expr(parser *P, lm_jnode **node) {
  for (;;) {
    if (accept_op(P, "|")) {
      LM_TRY(parse_filter(P, *node, node));
    } else if (accept_name(P, "is")) {
      LM_TRY(parse_test(P, *node, node));
    } else if (is_op(cur(P), "(")) {
      const lm_jtok *t = cur(P);
      P->i++;
      lm_jnode *n;
      LM_TRY(new_node(P, LM_JN_CALL, t, &n));
      n->a = *node;
      LM_TRY(grow(P, n, *node));
      LM_TRY(parse_args(P, n));
      *node = n;
    } else {
      return LM_OK;
    }
  }
}

static lm_status parse_unary(parser *P, int with_filter, lm_jnode **out) {
  const lm_jtok *t = cur(P);
  LM_TRY(enter(P));
  if (is_op(t, "-") || is_op(t, "+")) {
    P->i++;
    LM_TRY(new_node(P, LM_JN_UNARY, t, out));
    (*out)->op = t->s[0];
    LM_TRY(parse_unary(P, 0, &(*out)->a));
    LM_TRY(grow(P, *out, (*out)->a));
  } else {
    LM_TRY(parse_primary(P, out));
  }
  LM_TRY(parse_postfix(P, out));
  if (with_filter) LM_TRY(parse_filter_expr(P, out));
  P->depth--;
  return LM_OK;
}

static lm_status binop(parser *P, const lm_jtok *at, int type, int op, lm_jnode *a, lm_jnode *b,
                       lm_jnode **out) {
  LM_TRY(new_node(P, (lm_jnode_type)type, at, out));
  (*out)->op = op;
  (*out)->a = a;
  (*out)->b = b;
  LM_TRY(grow(P, *out, a));
  return grow(P, *out, b);
}

static lm_status parse_pow(parser *P, lm_jnode **out) {
  LM_TRY(parse_unary(P, 1, out));
  while (is_op(cur(P), "**")) {
    const lm_jtok *t = cur(P);
    P->i++;
    lm_jnode *r;
    LM_TRY(parse_unary(P, 1, &r));
    LM_TRY(binop(P, t, LM_JN_BINOP, LM_JOP_POW, *out, r, out));
  }
  return LM_OK;
}

static lm_status parse_math2(parser *P, lm_jnode **out) {
  LM_TRY(parse_pow(P, out));
  for (;;) {
    const lm_jtok *t = cur(P);
    int op = is_op(t, "*")    ? LM_JOP_MUL
             : is_op(t, "/")  ? LM_JOP_DIV
             : is_op(t, "//") ? LM_JOP_FLOORDIV
             : is_op(t, "%")  ? LM_JOP_MOD
                              : 0;
    if (!op) return LM_OK;
    P->i++;
    lm_jnode *r;
    LM_TRY(parse_pow(P, &r));
    LM_TRY(binop(P, t, LM_JN_BINOP, op, *out, r, out));
  }
}

static lm_status parse_concat(parser *P, lm_jnode **out) {
  LM_TRY(parse_math2(P, out));
  while (is_op(cur(P), "~")) {
    const lm_jtok *t = cur(P);
    P->i++;
    lm_jnode *r;
    LM_TRY(parse_math2(P, &r));
    LM_TRY(binop(P, t, LM_JN_BINOP, LM_JOP_CONCAT, *out, r, out));
  }
  return LM_OK;
}

static lm_status parse_math1(parser *P, lm_jnode **out) {
  LM_TRY(parse_concat(P, out));
  for (;;) {
    const lm_jtok *t = cur(P);
    int op = is_op(t, "+") ? LM_JOP_ADD : is_op(t, "-") ? LM_JOP_SUB : 0;
    if (!op) return LM_OK;
    P->i++;
    lm_jnode *r;
    LM_TRY(parse_concat(P, &r));
    LM_TRY(binop(P, t, LM_JN_BINOP, op, *out, r, out));
  }
}

static int cmp_op(parser *P) {
  const lm_jtok *t = cur(P);
  int op = is_op(t, "==")     ? LM_JOP_EQ
           : is_op(t, "!=")   ? LM_JOP_NE
           : is_op(t, "<")    ? LM_JOP_LT
           : is_op(t, "<=")   ? LM_JOP_LE
           : is_op(t, ">")    ? LM_JOP_GT
           : is_op(t, ">=")   ? LM_JOP_GE
           : is_name(t, "in") ? LM_JOP_IN
                              : 0;
  if (op) {
    P->i++;
  } else if (is_name(t, "not") && is_name(peek(P, 1), "in")) {
    P->i += 2;
    op = LM_JOP_NOTIN;
  }
  return op;
}

/* a < b < c is (a < b) and (b < c), as Python chains comparisons. */
static lm_status parse_compare(parser *P, lm_jnode **out) {
  LM_TRY(parse_math1(P, out));
  lm_jnode *left = *out, *chain = NULL;
  for (;;) {
    const lm_jtok *t = cur(P);
    int op = cmp_op(P);
    if (!op) break;
    lm_jnode *r, *c;
    LM_TRY(parse_math1(P, &r));
    LM_TRY(binop(P, t, op == LM_JOP_IN || op == LM_JOP_NOTIN ? LM_JN_BINOP : LM_JN_CMP, op, left, r,
                 &c));
    if (chain)
      LM_TRY(binop(P, t, LM_JN_AND, 0, chain, c, &chain));
    else
      chain = c;
    left = r;
  }
  if (chain) *out = chain;
  return LM_OK;
}

static lm_status parse_not(parser *P, lm_jnode **out) {
  const lm_jtok *t = cur(P);
  if (accept_name(P, "not")) {
    LM_TRY(enter(P));
    LM_TRY(new_node(P, LM_JN_UNARY, t, out));
    (*out)->op = '!';
    LM_TRY(parse_not(P, &(*out)->a));
    P->depth--;
    return LM_OK;
  }
  return parse_compare(P, out);
}

static lm_status parse_and(parser *P, lm_jnode **out) {
  LM_TRY(parse_not(P, out));
  while (is_name(cur(P), "and")) {
    const lm_jtok *t = cur(P);
    P->i++;
    lm_jnode *r;
    LM_TRY(parse_not(P, &r));
    LM_TRY(binop(P, t, LM_JN_AND, 0, *out, r, out));
  }
  return LM_OK;
}

static lm_status parse_or(parser *P, lm_jnode **out) {
  LM_TRY(parse_and(P, out));
  while (is_name(cur(P), "or")) {
    const lm_jtok *t = cur(P);
    P->i++;
    lm_jnode *r;
    LM_TRY(parse_and(P, &r));
    LM_TRY(binop(P, t, LM_JN_OR, 0, *out, r, out));
  }
  return LM_OK;
}

static lm_status parse_expr(parser *P, int with_cond, lm_jnode **out) {
  LM_TRY(enter(P));
  LM_TRY(parse_or(P, out));
  while (with_cond && is_name(cur(P), "if")) {
    const lm_jtok *t = cur(P);
    P->i++;
    lm_jnode *n;
    LM_TRY(new_node(P, LM_JN_COND, t, &n));
    n->a = *out;
    LM_TRY(parse_or(P, &n->b));
    if (accept_name(P, "else")) LM_TRY(parse_expr(P, 1, &n->c));
    *out = n;
  }
  P->depth--;
  return LM_OK;
}

static int tuple_ends(const parser *P) {
  const lm_jtok *t = cur(P);
  return t->type == LM_JT_VAR_END || t->type == LM_JT_BLOCK_END || t->type == LM_JT_EOF ||
         is_op(t, ")") || is_op(t, "=") || is_name(t, "in") || is_name(t, "if") ||
         is_name(t, "recursive");
}

/* a, b, c  ->  a tuple; a single expression without a trailing comma stays itself. */
static lm_status parse_tuple(parser *P, int with_cond, int explicit_parens, lm_jnode **out) {
  const lm_jtok *at = cur(P);
  nvec items = {0};
  int saw_comma = 0;
  lm_status s = LM_OK;
  for (;;) {
    if (items.n) {
      if (!accept_op(P, ",")) break;
      saw_comma = 1;
    }
    if (tuple_ends(P)) break;
    lm_jnode *e;
    if ((s = parse_expr(P, with_cond, &e)) != LM_OK || (s = nvec_push(&items, e, NULL)) != LM_OK)
      break;
  }
  if (s == LM_OK && items.n == 0 && !explicit_parens)
    s = perr(P, at, "expected an expression%s", NULL);
  if (s != LM_OK) {
    nvec_free(&items);
    return s;
  }
  if (items.n == 1 && !saw_comma) {
    *out = items.v[0];
    nvec_free(&items);
    return LM_OK;
  }
  LM_TRY(new_node(P, LM_JN_TUPLE, at, out));
  return nvec_done(P, &items, &(*out)->args, NULL);
}

/* for/set targets: a name, `a, b`, or (set only) `ns.attr`. */
static lm_status parse_target(parser *P, int allow_attr, lm_jnode **out) {
  const lm_jtok *at = cur(P);
  nvec items = {0};
  lm_status s = LM_OK;
  do {
    lm_jnode *n;
    if ((s = new_node(P, LM_JN_NAME, cur(P), &n)) != LM_OK ||
        (s = expect_name(P, &n->name)) != LM_OK)
      break;
    if (allow_attr && items.n == 0 && is_op(cur(P), ".")) {
      P->i++;
      lm_jnode *attr;
      if ((s = new_node(P, LM_JN_ATTR, cur(P), &attr)) != LM_OK ||
          (s = expect_name(P, &attr->name)) != LM_OK)
        break;
      attr->a = n;
      *out = attr;
      nvec_free(&items);
      return LM_OK;
    }
    if ((s = nvec_push(&items, n, NULL)) != LM_OK) break;
  } while (accept_op(P, ",") && cur(P)->type == LM_JT_NAME);
  if (s != LM_OK) {
    nvec_free(&items);
    return s;
  }
  if (items.n == 1) {
    *out = items.v[0];
    nvec_free(&items);
    return LM_OK;
  }
  LM_TRY(new_node(P, LM_JN_TUPLE, at, out));
  return nvec_done(P, &items, &(*out)->args, NULL);
}

/* ---- statements ----------------------------------------------------------------------------- */

/* Parses statements until a block tag named in `ends` (NULL-terminated); leaves P after that name
 * and sets *which to its index. With ends == NULL, parses to the end of the template. */
static lm_status parse_body(parser *P, const char *const *ends, lm_jnodes *out, int *which);

static lm_status parse_if(parser *P, const lm_jtok *at, lm_jnode **out) {
  static const char *const ends[] = {"elif", "else", "endif", NULL};
  LM_TRY(new_node(P, LM_JN_IF, at, out));
  LM_TRY(parse_tuple(P, 0, 0, &(*out)->a));
  LM_TRY(expect_block_end(P));
  int which;
  LM_TRY(parse_body(P, ends, &(*out)->body, &which));
  if (which == 0) { /* elif: a nested if in the else branch */
    lm_jnode *nested;
    LM_TRY(parse_if(P, &P->t[P->i - 1], &nested));
    LM_TRY(lm_jarena_alloc(P->a, sizeof *(*out)->orelse.v, (void **)&(*out)->orelse.v));
    (*out)->orelse.v[0] = nested;
    (*out)->orelse.n = 1;
    return LM_OK;
  }
  LM_TRY(expect_block_end(P));
  if (which == 1) {
    static const char *const endif[] = {"endif", NULL};
    LM_TRY(parse_body(P, endif, &(*out)->orelse, &which));
    LM_TRY(expect_block_end(P));
  }
  return LM_OK;
}

static lm_status parse_for(parser *P, const lm_jtok *at, lm_jnode **out) {
  static const char *const ends[] = {"else", "endfor", NULL};
  LM_TRY(new_node(P, LM_JN_FOR, at, out));
  LM_TRY(parse_target(P, 0, &(*out)->a));
  if (!accept_name(P, "in")) return perr(P, cur(P), "expected 'in'%s", NULL);
  LM_TRY(parse_tuple(P, 0, 0, &(*out)->b));
  if (is_name(cur(P), "recursive"))
    return perr(P, cur(P), "recursive for loops are not supported%s", NULL);
  if (accept_name(P, "if")) LM_TRY(parse_expr(P, 1, &(*out)->c));
  LM_TRY(expect_block_end(P));
  int which;
  LM_TRY(parse_body(P, ends, &(*out)->body, &which));
  LM_TRY(expect_block_end(P));
  if (which == 0) {
    static const char *const endfor[] = {"endfor", NULL};
    LM_TRY(parse_body(P, endfor, &(*out)->orelse, &which));
    LM_TRY(expect_block_end(P));
  }
  return LM_OK;
}

static lm_status parse_filter_chain(parser *P, lm_jnode *leaf, lm_jnode **out) {
  *out = leaf;
  do
    LM_TRY(parse_filter(P, *out, out));
  while (accept_op(P, "|"));
  return LM_OK;
}

static lm_status parse_set(parser *P, const lm_jtok *at, lm_jnode **out) {
  static const char *const ends[] = {"endset", NULL};
  lm_jnode *target;
  LM_TRY(parse_target(P, 1, &target));
  if (accept_op(P, "=")) {
    LM_TRY(new_node(P, LM_JN_SET, at, out));
    (*out)->a = target;
    LM_TRY(parse_tuple(P, 1, 0, &(*out)->b));
    return expect_block_end(P);
  }
  LM_TRY(new_node(P, LM_JN_SETBLOCK, at, out));
  (*out)->a = target;
  if (accept_op(P, "|")) LM_TRY(parse_filter_chain(P, NULL, &(*out)->b));
  LM_TRY(expect_block_end(P));
  int which;
  LM_TRY(parse_body(P, ends, &(*out)->body, &which));
  return expect_block_end(P);
}

/* (a, b=default, …) for macros and call blocks. */
static lm_status parse_params(parser *P, lm_jnode *node) {
  nvec names = {0}, defs = {0};
  lm_status s = LM_OK;
  if (accept_op(P, "(")) {
    while (s == LM_OK && !is_op(cur(P), ")")) {
      if (names.n && (s = expect_op(P, ",")) != LM_OK) break;
      if (is_op(cur(P), ")")) break;
      lm_jnode *n, *def = NULL;
      if ((s = new_node(P, LM_JN_NAME, cur(P), &n)) != LM_OK ||
          (s = expect_name(P, &n->name)) != LM_OK)
        break;
      if (accept_op(P, "="))
        s = parse_expr(P, 1, &def);
      else if (defs.n && defs.v[defs.n - 1])
        s = perr(P, cur(P), "parameter without a default after one with%s", NULL);
      if (s == LM_OK) s = nvec_push(&names, n, NULL);
      if (s == LM_OK) s = nvec_push(&defs, def, NULL);
    }
    if (s == LM_OK) s = expect_op(P, ")");
  }
  if (s != LM_OK) {
    nvec_free(&names);
    nvec_free(&defs);
    return s;
  }
  LM_TRY(nvec_done(P, &names, &node->args, NULL));
  return nvec_done(P, &defs, &node->kwvals, NULL);
}

static lm_status parse_macro(parser *P, const lm_jtok *at, lm_jnode **out) {
  static const char *const ends[] = {"endmacro", NULL};
  LM_TRY(new_node(P, LM_JN_MACRO, at, out));
  LM_TRY(expect_name(P, &(*out)->name));
  LM_TRY(parse_params(P, *out));
  LM_TRY(expect_block_end(P));
  int which;
  LM_TRY(parse_body(P, ends, &(*out)->body, &which));
  if (cur(P)->type == LM_JT_NAME) P->i++; /* {% endmacro name %} */
  return expect_block_end(P);
}

static lm_status parse_call_block(parser *P, const lm_jtok *at, lm_jnode **out) {
  static const char *const ends[] = {"endcall", NULL};
  LM_TRY(new_node(P, LM_JN_CALLBLOCK, at, out));
  if (is_op(cur(P), "(")) LM_TRY(parse_params(P, *out));
  LM_TRY(parse_expr(P, 1, &(*out)->a));
  if ((*out)->a->type != LM_JN_CALL) return perr(P, at, "expected a call after 'call'%s", NULL);
  LM_TRY(expect_block_end(P));
  int which;
  LM_TRY(parse_body(P, ends, &(*out)->body, &which));
  return expect_block_end(P);
}

static lm_status parse_statement(parser *P, lm_jnode **out) {
  const lm_jtok *at = cur(P);
  if (at->type != LM_JT_NAME) return perr(P, at, "expected a tag name%s", NULL);
  P->i++;
  if (is_name(at, "if")) return parse_if(P, at, out);
  if (is_name(at, "for")) return parse_for(P, at, out);
  if (is_name(at, "set")) return parse_set(P, at, out);
  if (is_name(at, "macro")) return parse_macro(P, at, out);
  if (is_name(at, "call")) return parse_call_block(P, at, out);
  if (is_name(at, "break") || is_name(at, "continue")) {
    LM_TRY(new_node(P, is_name(at, "break") ? LM_JN_BREAK : LM_JN_CONTINUE, at, out));
    return expect_block_end(P);
  }
  if (is_name(at, "filter")) {
    static const char *const ends[] = {"endfilter", NULL};
    LM_TRY(new_node(P, LM_JN_FILTERBLOCK, at, out));
    LM_TRY(parse_filter_chain(P, NULL, &(*out)->b));
    LM_TRY(expect_block_end(P));
    int which;
    LM_TRY(parse_body(P, ends, &(*out)->body, &which));
    return expect_block_end(P);
  }
  if (is_name(at, "generation")) { /* transformers' assistant-mask marker: renders its body */
    static const char *const ends[] = {"endgeneration", NULL};
    LM_TRY(new_node(P, LM_JN_SEQ, at, out));
    LM_TRY(expect_block_end(P));
    int which;
    LM_TRY(parse_body(P, ends, &(*out)->body, &which));
    return expect_block_end(P);
  }
  char name[64];
  snprintf(name, sizeof name, "%.*s", (int)(at->n < 60 ? at->n : 60), at->s);
  if (is_name(at, "include") || is_name(at, "import") || is_name(at, "from") ||
      is_name(at, "extends") || is_name(at, "block") || is_name(at, "do") || is_name(at, "with"))
    return LM_ERRF(LM_ERR_UNSUPPORTED,
                   "template error at line %d col %d: tag '%s' is not supported", at->line, at->col,
                   name);
  return perr(P, at, "unknown tag '%s'", name);
}

static lm_status parse_body(parser *P, const char *const *ends, lm_jnodes *out, int *which) {
  nvec v = {0};
  lm_status s = LM_OK;
  if (++P->depth > LM_JPARSE_MAX_DEPTH) return perr(P, cur(P), "blocks nested too deeply%s", NULL);
  for (;;) {
    const lm_jtok *t = cur(P);
    lm_jnode *n = NULL;
    if (t->type == LM_JT_EOF) {
      if (ends) {
        const char *last = ends[0];
        for (int k = 0; ends[k]; k++)
          last = ends[k];
        s = perr(P, t, "unexpected end of template, expected '{%% %s %%}'", last);
      }
      break;
    }
    if (t->type == LM_JT_DATA) {
      if ((s = new_node(P, LM_JN_TEXT, t, &n)) == LM_OK) s = lm_jv_str(P->a, t->s, t->n, &n->lit);
      P->i++;
    } else if (t->type == LM_JT_VAR_BEGIN) {
      P->i++;
      if ((s = new_node(P, LM_JN_PRINT, t, &n)) == LM_OK) s = parse_tuple(P, 1, 0, &n->a);
      if (s == LM_OK && cur(P)->type != LM_JT_VAR_END) s = perr(P, cur(P), "expected '}}'%s", NULL);
      P->i++;
    } else if (t->type == LM_JT_BLOCK_BEGIN) {
      const lm_jtok *name = peek(P, 1);
      int k = -1;
      for (int e = 0; ends && ends[e]; e++)
        if (is_name(name, ends[e])) k = e;
      if (k >= 0) {
        P->i += 2;
        *which = k;
        break;
      }
      P->i++;
      s = parse_statement(P, &n);
    } else {
      s = perr(P, t, "unexpected token%s", NULL);
    }
    if (s == LM_OK && n) s = nvec_push(&v, n, NULL);
    if (s != LM_OK) break;
  }
  P->depth--;
  if (s != LM_OK) {
    nvec_free(&v);
    return s;
  }
  return nvec_done(P, &v, out, NULL);
}

/* ---- entry ---------------------------------------------------------------------------------- */

/* jinja2 reads the source through str.splitlines(): \r\n and \r become \n, and
 * (keep_trailing_newline being false) one final newline is dropped. */
static lm_status normalize_source(const char *src, size_t len, char **out, size_t *out_len) {
  char *d = malloc(len + 1);
  if (!d) return LM_ERRF(LM_ERR_NOMEM, "out of memory (template source)");
  size_t o = 0;
  for (size_t i = 0; i < len; i++) {
    if (src[i] == '\r') {
      d[o++] = '\n';
      if (i + 1 < len && src[i + 1] == '\n') i++;
    } else {
      d[o++] = src[i];
    }
  }
  if (o > 0 && d[o - 1] == '\n') o--;
  d[o] = '\0';
  *out = d;
  *out_len = o;
  return LM_OK;
}

lm_status lm_jinja_compile(const char *src, size_t len, const lm_jinja_options *opts,
                           lm_jinja_template **out) {
  *out = NULL;
  lm_jinja_options def = lm_jinja_options_hf();
  if (!opts) opts = &def;
  lm_jinja_template *t = calloc(1, sizeof *t);
  if (!t) return LM_ERRF(LM_ERR_NOMEM, "out of memory (template)");
  char *norm = NULL;
  size_t nlen = 0;
  lm_jtoks toks = {0};
  lm_status s = lm_jarena_create(0, &t->arena);
  if (s == LM_OK) s = normalize_source(src, len, &norm, &nlen);
  if (s == LM_OK) {
    lm_jlex_opts lo = {opts->trim_blocks, opts->lstrip_blocks};
    s = lm_jinja_lex(t->arena, norm, nlen, &lo, &toks);
  }
  if (s == LM_OK) {
    /* names in the tree are copied into the arena, so the normalized source can go */
    parser P = {t->arena, toks.v, toks.n, 0, 0};
    int which;
    s = parse_body(&P, NULL, &t->body, &which);
  }
  free(toks.v);
  free(norm);
  if (s != LM_OK) {
    lm_jinja_free(t);
    return s;
  }
  *out = t;
  return LM_OK;
}

void lm_jinja_free(lm_jinja_template *t) {
  if (!t) return;
  lm_jarena_free(t->arena);
  free(t);
}
