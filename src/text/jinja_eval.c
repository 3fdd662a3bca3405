/* jinja_eval.c — runs a template tree: scopes, statements, expressions and Python operator
 * semantics.
 *
 * Scoping follows jinja2: top-level `set` writes the template's globals; a for loop gives every
 * iteration a fresh frame (so `set` inside a loop neither leaks out nor survives to the next
 * iteration, which is why templates carry state in namespace() objects); `if` has no frame of its
 * own; a macro runs in a fresh frame whose parent is the frame it was defined in. Every error is
 * prefixed once with the line and column of the innermost node that failed. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "text/jinja_eval.h"

static lm_status eval(lm_jctx *x, const lm_jnode *n, lm_jv *out);
static lm_status exec_body(lm_jctx *x, lm_jframe *f, const lm_jnodes *body);

static lm_status locate(lm_jctx *x, const lm_jnode *n, lm_status s) {
  if (s != LM_OK && !x->located) {
    x->located = 1;
    lm_err_prefix(s, "template error at line %d col %d", n->line, n->col);
  }
  return s;
}

#define TRYN(n, expr)                                                                              \
  do {                                                                                             \
    lm_status s_ = (expr);                                                                         \
    if (s_ != LM_OK) return locate(x, (n), s_);                                                    \
  } while (0)

/* ---- frames --------------------------------------------------------------------------------- */

static lm_status frame_new(lm_jctx *x, lm_jframe *parent, lm_jframe **out) {
  LM_TRY(lm_jarena_alloc(x->a, sizeof **out, (void **)out));
  (*out)->parent = parent;
  return LM_OK;
}

static lm_status frame_set(lm_jctx *x, lm_jframe *f, const char *name, lm_jv v) {
  for (size_t i = 0; i < f->n; i++)
    if (strcmp(f->names[i], name) == 0) {
      f->vals[i] = v;
      return LM_OK;
    }
  if (f->n == f->cap) {
    size_t cap = f->cap ? f->cap * 2 : 8;
    const char **names;
    lm_jv *vals;
    LM_TRY(lm_jarena_alloc(x->a, cap * sizeof *names, (void **)&names));
    LM_TRY(lm_jarena_alloc(x->a, cap * sizeof *vals, (void **)&vals));
    if (f->n) {
      memcpy(names, f->names, f->n * sizeof *names);
      memcpy(vals, f->vals, f->n * sizeof *vals);
    }
    f->names = names, f->vals = vals, f->cap = cap;
  }
  f->names[f->n] = name;
  f->vals[f->n++] = v;
  return LM_OK;
}

static int frame_get(const lm_jframe *f, const char *name, lm_jv *out) {
  for (; f; f = f->parent)
    for (size_t i = f->n; i-- > 0;)
      if (strcmp(f->names[i], name) == 0) {
        *out = f->vals[i];
        return 1;
      }
  return 0;
}

static lm_status step(lm_jctx *x) {
  if (++x->steps > x->lim.max_steps)
    return LM_ERRF(LM_ERR_INVALID, "template ran more than %llu steps",
                   (unsigned long long)x->lim.max_steps);
  return LM_OK;
}

/* ---- lookups -------------------------------------------------------------------------------- */

static lm_status undefined_error(lm_jv v) {
  if (v.u.s) return LM_ERRF(LM_ERR_INVALID, "'%s' is undefined", v.u.s->s);
  return LM_ERRF(LM_ERR_INVALID, "value is undefined");
}

static lm_status undef_named(lm_jctx *x, const char *name, lm_jv *out) {
  LM_TRY(lm_jv_cstr(x->a, name, out));
  out->kind = LM_JV_UNDEF;
  return LM_OK;
}

static lm_status loop_attr(lm_jctx *x, const lm_jloop *l, const char *name, lm_jv *out) {
  size_t len = l->items.u.l->n, i = l->index0;
  if (!strcmp(name, "index0"))
    *out = lm_jv_int((int64_t)i);
  else if (!strcmp(name, "index"))
    *out = lm_jv_int((int64_t)i + 1);
  else if (!strcmp(name, "revindex0"))
    *out = lm_jv_int((int64_t)(len - i - 1));
  else if (!strcmp(name, "revindex"))
    *out = lm_jv_int((int64_t)(len - i));
  else if (!strcmp(name, "first"))
    *out = lm_jv_bool(i == 0);
  else if (!strcmp(name, "last"))
    *out = lm_jv_bool(i + 1 == len);
  else if (!strcmp(name, "length"))
    *out = lm_jv_int((int64_t)len);
  else if (!strcmp(name, "depth"))
    *out = lm_jv_int(l->depth);
  else if (!strcmp(name, "depth0"))
    *out = lm_jv_int(l->depth - 1);
  else if (!strcmp(name, "previtem")) {
    if (i > 0)
      *out = l->items.u.l->v[i - 1];
    else
      return undef_named(x, "previtem", out);
  } else if (!strcmp(name, "nextitem")) {
    if (i + 1 < len)
      *out = l->items.u.l->v[i + 1];
    else
      return undef_named(x, "nextitem", out);
  } else {
    return undef_named(x, name, out);
  }
  return LM_OK;
}

lm_status lm_jinja_getattr(lm_jctx *x, lm_jv obj, const char *name, lm_jv *out) {
  switch (obj.kind) {
  case LM_JV_UNDEF: return undefined_error(obj);
  case LM_JV_DICT:
  case LM_JV_NS:
    if (lm_jv_dict_gets(obj, name, out)) return LM_OK;
    return undef_named(x, name, out);
  case LM_JV_LOOP: return loop_attr(x, obj.u.p, name, out);
  default: return undef_named(x, name, out);
  }
}

/* Python index normalization: negative counts from the end; returns 0 when out of range. */
static int norm_index(int64_t i, size_t len, size_t *out) {
  if (i < 0) i += (int64_t)len;
  if (i < 0 || (uint64_t)i >= len) return 0;
  *out = (size_t)i;
  return 1;
}

lm_status lm_jinja_getitem(lm_jctx *x, lm_jv obj, lm_jv key, lm_jv *out) {
  size_t idx;
  if (obj.kind == LM_JV_UNDEF) return undefined_error(obj);
  if (obj.kind == LM_JV_DICT) {
    if (lm_jv_dict_get(obj, key, out)) return LM_OK;
  } else if (obj.kind == LM_JV_NS || obj.kind == LM_JV_LOOP) {
    if (key.kind == LM_JV_STR) return lm_jinja_getattr(x, obj, key.u.s->s, out);
  } else if (obj.kind == LM_JV_LIST && (key.kind == LM_JV_INT || key.kind == LM_JV_BOOL)) {
    if (norm_index(key.kind == LM_JV_BOOL ? key.u.b : key.u.i, obj.u.l->n, &idx)) {
      *out = obj.u.l->v[idx];
      return LM_OK;
    }
  } else if (obj.kind == LM_JV_STR && (key.kind == LM_JV_INT || key.kind == LM_JV_BOOL)) {
    const lm_jstr *s = obj.u.s;
    if (norm_index(key.kind == LM_JV_BOOL ? key.u.b : key.u.i, lm_jutf8_count(s->s, s->len),
                   &idx)) {
      size_t off = lm_jutf8_offset(s->s, s->len, idx), end = lm_jutf8_offset(s->s, s->len, idx + 1);
      return lm_jv_str(x->a, s->s + off, end - off, out);
    }
  }
  if (key.kind == LM_JV_STR) return undef_named(x, key.u.s->s, out);
  *out = lm_jv_undef();
  return LM_OK;
}

lm_status lm_jinja_iterate(lm_jctx *x, lm_jv v, lm_jv *out) {
  switch (v.kind) {
  case LM_JV_UNDEF: return lm_jv_list(x->a, 0, out);
  case LM_JV_LIST:
    *out = v;
    if (v.u.l->tuple) { /* iteration yields a list view; keep the items, drop tuple-ness */
      LM_TRY(lm_jv_list(x->a, v.u.l->n, out));
      for (size_t i = 0; i < v.u.l->n; i++)
        LM_TRY(lm_jv_list_push(x->a, *out, v.u.l->v[i]));
    }
    return LM_OK;
  case LM_JV_DICT:
  case LM_JV_NS:
    LM_TRY(lm_jv_list(x->a, v.u.d->n, out));
    for (size_t i = 0; i < v.u.d->n; i++)
      LM_TRY(lm_jv_list_push(x->a, *out, v.u.d->k[i]));
    return LM_OK;
  case LM_JV_STR: {
    const lm_jstr *s = v.u.s;
    LM_TRY(lm_jv_list(x->a, 0, out));
    for (size_t i = 0; i < s->len;) {
      uint32_t cp;
      size_t k = lm_jutf8_next(s->s + i, s->len - i, &cp);
      lm_jv ch;
      LM_TRY(lm_jv_str(x->a, s->s + i, k, &ch));
      LM_TRY(lm_jv_list_push(x->a, *out, ch));
      i += k;
    }
    return LM_OK;
  }
  default: return LM_ERRF(LM_ERR_INVALID, "'%s' object is not iterable", lm_jv_type_name(v));
  }
}

/* ---- calls ---------------------------------------------------------------------------------- */

int lm_jcall_arg(const lm_jcall *c, size_t pos, const char *name, lm_jv *out) {
  if (pos < c->nargs) {
    *out = c->args[pos];
    return 1;
  }
  for (size_t i = 0; name && i < c->nkw; i++)
    if (strcmp(c->kwnames[i], name) == 0) {
      *out = c->kwvals[i];
      return 1;
    }
  return 0;
}

static lm_status call_macro(lm_jctx *x, lm_jmacro *m, const lm_jcall *c, lm_jv *out) {
  const lm_jnode *def = m->node;
  if (x->depth + 1 > x->lim.max_depth)
    return LM_ERRF(LM_ERR_INVALID, "macro calls nested deeper than %d", x->lim.max_depth);
  LM_TRY(step(x));
  if (c->nargs > def->args.n)
    return LM_ERRF(LM_ERR_INVALID, "macro '%s' takes not more than %zu argument(s)",
                   def->name ? def->name : "caller", def->args.n);
  for (size_t k = 0; k < c->nkw; k++) {
    size_t p = 0;
    while (p < def->args.n && strcmp(def->args.v[p]->name, c->kwnames[k]) != 0)
      p++;
    if (p == def->args.n)
      return LM_ERRF(LM_ERR_INVALID, "macro '%s' takes no keyword argument '%s'",
                     def->name ? def->name : "caller", c->kwnames[k]);
  }
  lm_jframe *f;
  LM_TRY(frame_new(x, m->scope, &f));
  for (size_t p = 0; p < def->args.n; p++) {
    lm_jv v;
    const char *pname = def->args.v[p]->name;
    if (!lm_jcall_arg(c, p, pname, &v)) {
      if (def->kwvals.v[p]) { /* defaults are evaluated at call time in the macro's own frame */
        lm_jframe *saved = x->frame;
        x->frame = f;
        lm_status s = eval(x, def->kwvals.v[p], &v);
        x->frame = saved;
        LM_TRY(s);
      } else {
        LM_TRY(undef_named(x, pname, &v));
      }
    }
    LM_TRY(frame_set(x, f, pname, v));
  }
  if (m->caller) {
    lm_jv cv = {LM_JV_MACRO, {.p = m->caller}};
    LM_TRY(frame_set(x, f, "caller", cv));
  }
  lm_jbuf buf = {0}, *saved = x->out;
  buf.cap_limit = x->lim.max_output;
  x->out = &buf;
  x->depth++;
  lm_status s = exec_body(x, f, &def->body);
  x->depth--;
  x->out = saved;
  x->flow = LM_JFLOW_NONE;
  if (s == LM_OK) s = lm_jv_str(x->a, buf.data ? buf.data : "", buf.len, out);
  lm_jbuf_free(&buf);
  return s;
}

lm_status lm_jinja_call_value(lm_jctx *x, lm_jv fn, const lm_jcall *c, lm_jv *out) {
  if (fn.kind == LM_JV_MACRO) return call_macro(x, fn.u.p, c, out);
  if (fn.kind == LM_JV_FUNC) return lm_jinja_call_global(x, (int)fn.u.i, c, out);
  if (fn.kind == LM_JV_UNDEF) return undefined_error(fn);
  return LM_ERRF(LM_ERR_INVALID, "'%s' object is not callable", lm_jv_type_name(fn));
}

/* Evaluates a node's args/kwargs into a call record (arrays live in the arena). */
static lm_status eval_args(lm_jctx *x, const lm_jnode *n, lm_jcall *c) {
  lm_jv *args = NULL, *kw = NULL;
  if (n->args.n) LM_TRY(lm_jarena_alloc(x->a, n->args.n * sizeof *args, (void **)&args));
  if (n->kwvals.n) LM_TRY(lm_jarena_alloc(x->a, n->kwvals.n * sizeof *kw, (void **)&kw));
  for (size_t i = 0; i < n->args.n; i++)
    LM_TRY(eval(x, n->args.v[i], &args[i]));
  for (size_t i = 0; i < n->kwvals.n; i++)
    LM_TRY(eval(x, n->kwvals.v[i], &kw[i]));
  c->args = args, c->nargs = n->args.n;
  c->kwnames = n->kwnames, c->kwvals = kw, c->nkw = n->kwvals.n;
  return LM_OK;
}

static lm_status eval_call(lm_jctx *x, const lm_jnode *n, lm_jv *out) {
  lm_jcall c;
  if (n->a->type ==
      LM_JN_ATTR) { /* obj.method(...): Python methods first, as getattr would find them */
    lm_jv obj;
    LM_TRY(eval(x, n->a->a, &obj));
    TRYN(n->a, obj.kind == LM_JV_UNDEF ? undefined_error(obj) : LM_OK);
    LM_TRY(eval_args(x, n, &c));
    int found = 0;
    TRYN(n, lm_jinja_call_method(x, obj, n->a->name, &c, out, &found));
    if (found) return LM_OK;
    lm_jv fn;
    TRYN(n->a, lm_jinja_getattr(x, obj, n->a->name, &fn));
    if (fn.kind == LM_JV_UNDEF)
      return locate(x, n->a,
                    LM_ERRF(LM_ERR_INVALID, "'%s' object has no attribute '%s'",
                            lm_jv_type_name(obj), n->a->name));
    TRYN(n, lm_jinja_call_value(x, fn, &c, out));
    return LM_OK;
  }
  lm_jv fn;
  LM_TRY(eval(x, n->a, &fn));
  LM_TRY(eval_args(x, n, &c));
  TRYN(n, lm_jinja_call_value(x, fn, &c, out));
  return LM_OK;
}

/* ---- operators ------------------------------------------------------------------------------ */

static int is_int(lm_jv v) { return v.kind == LM_JV_INT || v.kind == LM_JV_BOOL; }
static int64_t ival(lm_jv v) { return v.kind == LM_JV_BOOL ? v.u.b : v.u.i; }
static double fval(lm_jv v) { return v.kind == LM_JV_FLOAT ? v.u.f : (double)ival(v); }
static int is_arith(lm_jv v) { return is_int(v) || v.kind == LM_JV_FLOAT; }

static lm_status type_error(const char *op, lm_jv a, lm_jv b) {
  if (a.kind == LM_JV_UNDEF) return undefined_error(a);
  if (b.kind == LM_JV_UNDEF) return undefined_error(b);
  if (a.kind == LM_JV_BIGINT || b.kind == LM_JV_BIGINT)
    return LM_ERRF(LM_ERR_UNSUPPORTED, "arithmetic on integers outside 64 bits is not supported");
  return LM_ERRF(LM_ERR_INVALID, "unsupported operand type(s) for %s: '%s' and '%s'", op,
                 lm_jv_type_name(a), lm_jv_type_name(b));
}

static lm_status concat_values(lm_jctx *x, lm_jv a, lm_jv b, lm_jv *out) {
  if (a.kind == LM_JV_STR && b.kind == LM_JV_STR) {
    lm_jstr *s;
    size_t n = a.u.s->len + b.u.s->len;
    LM_TRY(lm_jarena_alloc(x->a, sizeof *s + n + 1, (void **)&s));
    memcpy(s->s, a.u.s->s, a.u.s->len);
    memcpy(s->s + a.u.s->len, b.u.s->s, b.u.s->len);
    s->len = n;
    out->kind = LM_JV_STR;
    out->u.s = s;
    return LM_OK;
  }
  lm_jbuf buf = {0};
  lm_status s = lm_jv_put_str(&buf, a);
  if (s == LM_OK) s = lm_jv_put_str(&buf, b);
  if (s == LM_OK) s = lm_jv_str(x->a, buf.data ? buf.data : "", buf.len, out);
  lm_jbuf_free(&buf);
  return s;
}

static lm_status repeat(lm_jctx *x, lm_jv seq, int64_t times, lm_jv *out) {
  if (times < 0) times = 0;
  size_t unit = seq.kind == LM_JV_STR ? seq.u.s->len : seq.u.l->n;
  if (unit && (uint64_t)times > (x->lim.max_output / unit) + 1)
    return LM_ERRF(LM_ERR_INVALID, "sequence repetition larger than the output limit");
  if (seq.kind == LM_JV_STR) {
    lm_jbuf b = {0};
    lm_status s = LM_OK;
    for (int64_t i = 0; i < times && s == LM_OK; i++)
      s = lm_jbuf_put(&b, seq.u.s->s, unit);
    if (s == LM_OK) s = lm_jv_str(x->a, b.data ? b.data : "", b.len, out);
    lm_jbuf_free(&b);
    return s;
  }
  LM_TRY(lm_jv_list(x->a, unit * (size_t)times, out));
  out->u.l->tuple = seq.u.l->tuple;
  for (int64_t i = 0; i < times; i++)
    for (size_t k = 0; k < unit; k++)
      LM_TRY(lm_jv_list_push(x->a, *out, seq.u.l->v[k]));
  return LM_OK;
}

static lm_status contains(lm_jv needle, lm_jv hay, int *res) {
  switch (hay.kind) {
  case LM_JV_STR:
    if (needle.kind != LM_JV_STR)
      return LM_ERRF(LM_ERR_INVALID, "'in <string>' requires string as left operand, not %s",
                     lm_jv_type_name(needle));
    *res = needle.u.s->len == 0 ||
           memmem(hay.u.s->s, hay.u.s->len, needle.u.s->s, needle.u.s->len) != NULL;
    return LM_OK;
  case LM_JV_LIST:
    *res = 0;
    for (size_t i = 0; i < hay.u.l->n && !*res; i++)
      *res = lm_jv_equal(needle, hay.u.l->v[i]);
    return LM_OK;
  case LM_JV_DICT:
  case LM_JV_NS: {
    lm_jv dummy;
    *res = lm_jv_dict_get(hay, needle, &dummy);
    return LM_OK;
  }
  case LM_JV_UNDEF: return undefined_error(hay);
  default:
    return LM_ERRF(LM_ERR_INVALID, "argument of type '%s' is not iterable", lm_jv_type_name(hay));
  }
}

static lm_status int_result(int overflow, int64_t r, lm_jv *out) {
  if (overflow)
    return LM_ERRF(LM_ERR_UNSUPPORTED,
                   "integer overflow (results beyond 64 bits are not supported)");
  *out = lm_jv_int(r);
  return LM_OK;
}

static lm_status arith(lm_jctx *x, int op, lm_jv a, lm_jv b, lm_jv *out) {
  static const char *const names[] = {"", "+", "-", "*", "/", "//", "%", "**"};
  int64_t r = 0;
  if (op == LM_JOP_ADD) {
    if ((a.kind == LM_JV_STR && b.kind == LM_JV_STR)) return concat_values(x, a, b, out);
    if (a.kind == LM_JV_LIST && b.kind == LM_JV_LIST && a.u.l->tuple == b.u.l->tuple) {
      LM_TRY(lm_jv_list(x->a, a.u.l->n + b.u.l->n, out));
      out->u.l->tuple = a.u.l->tuple;
      for (size_t i = 0; i < a.u.l->n; i++)
        LM_TRY(lm_jv_list_push(x->a, *out, a.u.l->v[i]));
      for (size_t i = 0; i < b.u.l->n; i++)
        LM_TRY(lm_jv_list_push(x->a, *out, b.u.l->v[i]));
      return LM_OK;
    }
  }
  if (op == LM_JOP_MUL) {
    if ((a.kind == LM_JV_STR || a.kind == LM_JV_LIST) && is_int(b))
      return repeat(x, a, ival(b), out);
    if ((b.kind == LM_JV_STR || b.kind == LM_JV_LIST) && is_int(a))
      return repeat(x, b, ival(a), out);
  }
  if (op == LM_JOP_MOD && a.kind == LM_JV_STR) return lm_jinja_percent_format(x, a, b, out);
  if (!is_arith(a) || !is_arith(b)) return type_error(names[op], a, b);
  if (is_int(a) && is_int(b) && op != LM_JOP_DIV) {
    int64_t p = ival(a), q = ival(b);
    switch (op) {
    case LM_JOP_ADD: {
      int ov = __builtin_add_overflow(p, q, &r);
      return int_result(ov, r, out);
    }
    case LM_JOP_SUB: {
      int ov = __builtin_sub_overflow(p, q, &r);
      return int_result(ov, r, out);
    }
    case LM_JOP_MUL: {
      int ov = __builtin_mul_overflow(p, q, &r);
      return int_result(ov, r, out);
    }
    case LM_JOP_FLOORDIV:
    case LM_JOP_MOD:
      if (q == 0) return LM_ERRF(LM_ERR_INVALID, "integer division or modulo by zero");
      if (p == INT64_MIN && q == -1) return int_result(op == LM_JOP_FLOORDIV, 0, out);
      {
        int64_t d = p / q, m = p % q;
        if (m != 0 && ((m < 0) != (q < 0))) d--, m += q; /* Python floors */
        *out = lm_jv_int(op == LM_JOP_FLOORDIV ? d : m);
      }
      return LM_OK;
    case LM_JOP_POW:
      if (q >= 0) {
        int64_t acc = 1;
        for (int64_t i = 0; i < q; i++) {
          if (__builtin_mul_overflow(acc, p, &acc)) return int_result(1, 0, out);
          if (acc == 0 || acc == 1 || (acc == -1 && i > 64)) break;
        }
        if (p == -1) acc = (q % 2) ? -1 : 1;
        *out = lm_jv_int(acc);
        return LM_OK;
      }
      *out = lm_jv_float(pow((double)p, (double)q));
      return LM_OK;
    }
  }
  double p = fval(a), q = fval(b);
  switch (op) {
  case LM_JOP_ADD: *out = lm_jv_float(p + q); return LM_OK;
  case LM_JOP_SUB: *out = lm_jv_float(p - q); return LM_OK;
  case LM_JOP_MUL: *out = lm_jv_float(p * q); return LM_OK;
  case LM_JOP_DIV:
    if (q == 0) return LM_ERRF(LM_ERR_INVALID, "division by zero");
    *out = lm_jv_float(p / q);
    return LM_OK;
  case LM_JOP_FLOORDIV:
  case LM_JOP_MOD: { /* CPython float_divmod */
    if (q == 0) return LM_ERRF(LM_ERR_INVALID, "float division or modulo by zero");
    double m = fmod(p, q), d = (p - m) / q;
    if (m != 0 && ((q < 0) != (m < 0))) m += q, d -= 1.0;
    double fd = floor(d);
    if (d - fd > 0.5) fd += 1.0;
    *out = lm_jv_float(op == LM_JOP_MOD ? m : fd);
    return LM_OK;
  }
  case LM_JOP_POW: *out = lm_jv_float(pow(p, q)); return LM_OK;
  }
  return type_error(names[op], a, b);
}

static lm_status slice_value(lm_jctx *x, lm_jv obj, const lm_jnode *n, lm_jv *out) {
  lm_jv parts[3] = {lm_jv_none(), lm_jv_none(), lm_jv_none()};
  const lm_jnode *nodes[3] = {n->b, n->c, n->d};
  for (int k = 0; k < 3; k++) {
    if (nodes[k]) LM_TRY(eval(x, nodes[k], &parts[k]));
    if (parts[k].kind != LM_JV_NONE && !is_int(parts[k]))
      return locate(x, n, LM_ERRF(LM_ERR_INVALID, "slice indices must be integers or None"));
  }
  int64_t step = parts[2].kind == LM_JV_NONE ? 1 : ival(parts[2]);
  if (step == 0) return locate(x, n, LM_ERRF(LM_ERR_INVALID, "slice step cannot be zero"));
  if (obj.kind == LM_JV_UNDEF) return locate(x, n, undefined_error(obj));
  lm_jv items = obj;
  if (obj.kind == LM_JV_STR)
    LM_TRY(lm_jinja_iterate(x, obj, &items));
  else if (obj.kind != LM_JV_LIST)
    return locate(
        x, n, LM_ERRF(LM_ERR_INVALID, "'%s' object is not subscriptable", lm_jv_type_name(obj)));
  int64_t len = (int64_t)items.u.l->n, start, stop;
  /* PySlice_AdjustIndices */
  if (parts[0].kind == LM_JV_NONE)
    start = step < 0 ? len - 1 : 0;
  else {
    start = ival(parts[0]);
    if (start < 0)
      start = start + len < 0 ? (step < 0 ? -1 : 0) : start + len;
    else if (start >= len)
      start = step < 0 ? len - 1 : len;
  }
  if (parts[1].kind == LM_JV_NONE)
    stop = step < 0 ? -1 : len;
  else {
    stop = ival(parts[1]);
    if (stop < 0)
      stop = stop + len < 0 ? (step < 0 ? -1 : 0) : stop + len;
    else if (stop >= len)
      stop = step < 0 ? len - 1 : len;
  }
  lm_jv res;
  LM_TRY(lm_jv_list(x->a, 0, &res));
  res.u.l->tuple = obj.kind == LM_JV_LIST && obj.u.l->tuple;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
    LM_TRY(lm_jv_list_push(x->a, res, items.u.l->v[i]));
  if (obj.kind != LM_JV_STR) {
    *out = res;
    return LM_OK;
  }
  lm_jbuf b = {0};
  lm_status s = LM_OK;
  for (size_t i = 0; i < res.u.l->n && s == LM_OK; i++)
    s = lm_jbuf_put(&b, res.u.l->v[i].u.s->s, res.u.l->v[i].u.s->len);
  if (s == LM_OK) s = lm_jv_str(x->a, b.data ? b.data : "", b.len, out);
  lm_jbuf_free(&b);
  return s;
}

/* ---- expressions ---------------------------------------------------------------------------- */

static lm_jframe *cur_frame(lm_jctx *x);

static lm_status eval_collection(lm_jctx *x, const lm_jnode *n, lm_jv *out) {
  if (n->type == LM_JN_DICT) {
    LM_TRY(lm_jv_dict(x->a, n->args.n, out));
    for (size_t i = 0; i < n->args.n; i++) {
      lm_jv k, v;
      LM_TRY(eval(x, n->args.v[i], &k));
      LM_TRY(eval(x, n->kwvals.v[i], &v));
      TRYN(n, lm_jv_dict_set(x->a, *out, k, v));
    }
    return LM_OK;
  }
  LM_TRY(lm_jv_list(x->a, n->args.n, out));
  out->u.l->tuple = n->type == LM_JN_TUPLE;
  for (size_t i = 0; i < n->args.n; i++) {
    lm_jv v;
    LM_TRY(eval(x, n->args.v[i], &v));
    LM_TRY(lm_jv_list_push(x->a, *out, v));
  }
  return LM_OK;
}

static lm_status eval_binop(lm_jctx *x, const lm_jnode *n, lm_jv *out) {
  lm_jv a, b;
  LM_TRY(eval(x, n->a, &a));
  LM_TRY(eval(x, n->b, &b));
  if (n->op == LM_JOP_CONCAT) {
    TRYN(n, concat_values(x, a, b, out));
  } else if (n->op == LM_JOP_IN || n->op == LM_JOP_NOTIN) {
    int r = 0;
    TRYN(n, contains(a, b, &r));
    *out = lm_jv_bool(n->op == LM_JOP_IN ? r : !r);
  } else if (n->type == LM_JN_CMP) {
    int r = 0;
    if (n->op == LM_JOP_EQ || n->op == LM_JOP_NE) {
      r = lm_jv_equal(a, b);
      *out = lm_jv_bool(n->op == LM_JOP_EQ ? r : !r);
    } else {
      TRYN(n, lm_jv_compare(a, b, &r));
      *out = lm_jv_bool(n->op == LM_JOP_LT   ? r < 0
                        : n->op == LM_JOP_LE ? r <= 0
                        : n->op == LM_JOP_GT ? r > 0
                                             : r >= 0);
    }
  } else {
    TRYN(n, arith(x, n->op, a, b, out));
  }
  return LM_OK;
}

static lm_status eval_unary(lm_jctx *x, const lm_jnode *n, lm_jv *out) {
  lm_jv a;
  LM_TRY(eval(x, n->a, &a));
  if (n->op == '!') {
    *out = lm_jv_bool(!lm_jv_truthy(a));
  } else if (a.kind == LM_JV_FLOAT) {
    *out = lm_jv_float(n->op == '-' ? -a.u.f : a.u.f);
  } else if (is_int(a)) {
    if (n->op == '-' && ival(a) == INT64_MIN) TRYN(n, int_result(1, 0, out));
    *out = lm_jv_int(n->op == '-' ? -ival(a) : ival(a));
  } else {
    TRYN(n, a.kind == LM_JV_UNDEF ? undefined_error(a)
                                  : LM_ERRF(LM_ERR_INVALID, "bad operand type for unary %c: '%s'",
                                            n->op, lm_jv_type_name(a)));
  }
  return LM_OK;
}

static lm_status eval_node(lm_jctx *x, const lm_jnode *n, lm_jv *out) {
  lm_jv a, b;
  lm_jcall c;
  int r;
  switch (n->type) {
  case LM_JN_LIT: *out = n->lit; return LM_OK;
  case LM_JN_NAME:
    if (frame_get(cur_frame(x), n->name, out)) return LM_OK;
    TRYN(n, undef_named(x, n->name, out));
    return LM_OK;
  case LM_JN_LIST:
  case LM_JN_TUPLE:
  case LM_JN_DICT: return eval_collection(x, n, out);
  case LM_JN_ATTR:
    LM_TRY(eval(x, n->a, &a));
    TRYN(n, lm_jinja_getattr(x, a, n->name, out));
    return LM_OK;
  case LM_JN_ITEM:
    LM_TRY(eval(x, n->a, &a));
    LM_TRY(eval(x, n->b, &b));
    TRYN(n, lm_jinja_getitem(x, a, b, out));
    return LM_OK;
  case LM_JN_SLICE: LM_TRY(eval(x, n->a, &a)); return slice_value(x, a, n, out);
  case LM_JN_CALL: return eval_call(x, n, out);
  case LM_JN_FILTER:
    LM_TRY(eval(x, n->a, &a));
    LM_TRY(eval_args(x, n, &c));
    TRYN(n, lm_jinja_apply_filter(x, n->op, a, &c, out));
    return LM_OK;
  case LM_JN_TEST:
    LM_TRY(eval(x, n->a, &a));
    LM_TRY(eval_args(x, n, &c));
    TRYN(n, lm_jinja_apply_test(x, n->op, a, &c, &r));
    *out = lm_jv_bool(n->negated ? !r : r);
    return LM_OK;
  case LM_JN_UNARY: return eval_unary(x, n, out);
  case LM_JN_BINOP:
  case LM_JN_CMP: return eval_binop(x, n, out);
  case LM_JN_AND:
  case LM_JN_OR:
    LM_TRY(eval(x, n->a, &a));
    if (lm_jv_truthy(a) == (n->type == LM_JN_OR)) {
      *out = a;
      return LM_OK;
    }
    return eval(x, n->b, out);
  case LM_JN_COND:
    LM_TRY(eval(x, n->b, &b));
    if (lm_jv_truthy(b)) return eval(x, n->a, out);
    if (n->c) return eval(x, n->c, out);
    *out = lm_jv_undef();
    return LM_OK;
  default: return locate(x, n, LM_ERRF(LM_ERR_INVALID, "statement used as an expression"));
  }
}

/* Every nested evaluation passes here, so the stack an expression uses is bounded before it
 * recurses (the parser bounds one tree's height; this also covers trees nested through macro
 * calls, whose bodies evaluate under their caller's expression). */
static lm_status eval(lm_jctx *x, const lm_jnode *n, lm_jv *out) {
  if (x->edepth >= LM_JINJA_MAX_EVAL_DEPTH)
    return locate(
        x, n,
        LM_ERRF(LM_ERR_INVALID, "expressions nested deeper than %d", LM_JINJA_MAX_EVAL_DEPTH));
  x->edepth++;
  lm_status s = eval_node(x, n, out);
  x->edepth--;
  return s;
}

/* ---- statements ----------------------------------------------------------------------------- */

static lm_jframe *cur_frame(lm_jctx *x) { return x->frame; }

static lm_status assign(lm_jctx *x, lm_jframe *f, const lm_jnode *target, lm_jv v) {
  if (target->type == LM_JN_NAME) return frame_set(x, f, target->name, v);
  if (target->type == LM_JN_ATTR) {
    lm_jv ns;
    if (!frame_get(f, target->a->name, &ns) || ns.kind != LM_JV_NS)
      return locate(x, target,
                    LM_ERRF(LM_ERR_INVALID, "cannot assign attribute on non-namespace object '%s'",
                            target->a->name));
    lm_jv key;
    LM_TRY(lm_jv_cstr(x->a, target->name, &key));
    lm_jv as_dict = {LM_JV_DICT, {.d = ns.u.d}};
    return lm_jv_dict_set(x->a, as_dict, key, v);
  }
  /* tuple unpacking */
  lm_jv items;
  TRYN(target, lm_jinja_iterate(x, v, &items));
  if (items.u.l->n != target->args.n)
    return locate(x, target,
                  LM_ERRF(LM_ERR_INVALID, "cannot unpack %zu values into %zu names", items.u.l->n,
                          target->args.n));
  for (size_t i = 0; i < target->args.n; i++)
    LM_TRY(assign(x, f, target->args.v[i], items.u.l->v[i]));
  return LM_OK;
}

static lm_status exec_node(lm_jctx *x, lm_jframe *f, const lm_jnode *n);

/* Runs body with f as the innermost frame. */
static lm_status exec_body(lm_jctx *x, lm_jframe *f, const lm_jnodes *body) {
  lm_jframe *saved = x->frame;
  x->frame = f;
  lm_status s = LM_OK;
  for (size_t i = 0; i < body->n && s == LM_OK && x->flow == LM_JFLOW_NONE; i++)
    s = exec_node(x, f, body->v[i]);
  x->frame = saved;
  return s;
}

static lm_status exec_for(lm_jctx *x, lm_jframe *f, const lm_jnode *n) {
  lm_jv seq, items;
  LM_TRY(eval(x, n->b, &seq));
  TRYN(n->b, lm_jinja_iterate(x, seq, &items));
  lm_jframe *it;
  LM_TRY(frame_new(x, f, &it));
  if (n->c) { /* `for x in xs if cond`: filter first, so loop.length and loop.last count what
                 remains */
    lm_jv kept;
    LM_TRY(lm_jv_list(x->a, 0, &kept));
    for (size_t i = 0; i < items.u.l->n; i++) {
      lm_jv ok;
      it->n = 0;
      LM_TRY(assign(x, it, n->a, items.u.l->v[i]));
      lm_jframe *saved = x->frame;
      x->frame = it;
      lm_status s = eval(x, n->c, &ok);
      x->frame = saved;
      LM_TRY(s);
      if (lm_jv_truthy(ok)) LM_TRY(lm_jv_list_push(x->a, kept, items.u.l->v[i]));
    }
    items = kept;
  }
  if (items.u.l->n == 0) return exec_body(x, f, &n->orelse);
  lm_jloop *loop;
  LM_TRY(lm_jarena_alloc(x->a, sizeof *loop, (void **)&loop));
  loop->items = items;
  lm_jv outer;
  loop->depth = frame_get(f, "loop", &outer) && outer.kind == LM_JV_LOOP
                    ? ((lm_jloop *)outer.u.p)->depth + 1
                    : 1;
  lm_jv lv = {LM_JV_LOOP, {.p = loop}};
  for (size_t i = 0; i < items.u.l->n; i++) {
    TRYN(n, step(x));
    loop->index0 = i;
    it->n = 0; /* a fresh scope per iteration */
    LM_TRY(frame_set(x, it, "loop", lv));
    LM_TRY(assign(x, it, n->a, items.u.l->v[i]));
    LM_TRY(exec_body(x, it, &n->body));
    if (x->flow == LM_JFLOW_BREAK) {
      x->flow = LM_JFLOW_NONE;
      break;
    }
    x->flow = LM_JFLOW_NONE;
  }
  return LM_OK;
}

static lm_status capture(lm_jctx *x, lm_jframe *f, const lm_jnodes *body, lm_jv *out) {
  lm_jbuf buf = {0}, *saved = x->out;
  buf.cap_limit = x->lim.max_output;
  x->out = &buf;
  lm_status s = exec_body(x, f, body);
  x->out = saved;
  if (s == LM_OK) s = lm_jv_str(x->a, buf.data ? buf.data : "", buf.len, out);
  lm_jbuf_free(&buf);
  return s;
}

/* Applies a filter chain whose innermost operand is NULL (set-block and filter-block filters). */
static lm_status apply_chain(lm_jctx *x, const lm_jnode *chain, lm_jv in, lm_jv *out) {
  if (!chain) {
    *out = in;
    return LM_OK;
  }
  lm_jv v;
  LM_TRY(apply_chain(x, chain->a, in, &v));
  lm_jcall c;
  LM_TRY(eval_args(x, chain, &c));
  TRYN(chain, lm_jinja_apply_filter(x, chain->op, v, &c, out));
  return LM_OK;
}

static lm_status make_macro(lm_jctx *x, const lm_jnode *def, lm_jframe *scope, lm_jv *out) {
  lm_jmacro *m;
  LM_TRY(lm_jarena_alloc(x->a, sizeof *m, (void **)&m));
  m->node = def;
  m->scope = scope;
  out->kind = LM_JV_MACRO;
  out->u.p = m;
  return LM_OK;
}

static lm_status exec_call_block(lm_jctx *x, lm_jframe *f, const lm_jnode *n) {
  const lm_jnode *call = n->a;
  lm_jv fn, caller, res;
  LM_TRY(eval(x, call->a, &fn));
  if (fn.kind != LM_JV_MACRO)
    return locate(x, call, LM_ERRF(LM_ERR_INVALID, "{%% call %%} needs a macro"));
  LM_TRY(make_macro(x, n, f, &caller));
  lm_jmacro bound = *(lm_jmacro *)fn.u.p;
  bound.caller = caller.u.p;
  lm_jcall c;
  LM_TRY(eval_args(x, call, &c));
  TRYN(n, call_macro(x, &bound, &c, &res));
  TRYN(n, lm_jbuf_put(x->out, res.u.s->s, res.u.s->len));
  return LM_OK;
}

static lm_status exec_node(lm_jctx *x, lm_jframe *f, const lm_jnode *n) {
  lm_jv v;
  TRYN(n, step(x));
  switch (n->type) {
  case LM_JN_TEXT: TRYN(n, lm_jbuf_put(x->out, n->lit.u.s->s, n->lit.u.s->len)); return LM_OK;
  case LM_JN_PRINT:
    LM_TRY(eval(x, n->a, &v));
    TRYN(n, lm_jv_put_str(x->out, v));
    return LM_OK;
  case LM_JN_IF:
    LM_TRY(eval(x, n->a, &v));
    return exec_body(x, f, lm_jv_truthy(v) ? &n->body : &n->orelse);
  case LM_JN_FOR: return exec_for(x, f, n);
  case LM_JN_SET: LM_TRY(eval(x, n->b, &v)); return assign(x, f, n->a, v);
  case LM_JN_SETBLOCK:
    LM_TRY(capture(x, f, &n->body, &v));
    LM_TRY(apply_chain(x, n->b, v, &v));
    return assign(x, f, n->a, v);
  case LM_JN_MACRO: LM_TRY(make_macro(x, n, f, &v)); return frame_set(x, f, n->name, v);
  case LM_JN_CALLBLOCK: return exec_call_block(x, f, n);
  case LM_JN_FILTERBLOCK:
    LM_TRY(capture(x, f, &n->body, &v));
    LM_TRY(apply_chain(x, n->b, v, &v));
    TRYN(n, lm_jv_put_str(x->out, v));
    return LM_OK;
  case LM_JN_BREAK: x->flow = LM_JFLOW_BREAK; return LM_OK;
  case LM_JN_CONTINUE: x->flow = LM_JFLOW_CONTINUE; return LM_OK;
  case LM_JN_SEQ: return exec_body(x, f, &n->body);
  default: return locate(x, n, LM_ERRF(LM_ERR_INVALID, "expression used as a statement"));
  }
}

/* ---- entry ---------------------------------------------------------------------------------- */

lm_status lm_jinja_render(const lm_jinja_template *t, lm_jarena *arena, lm_jv vars,
                          const lm_jinja_limits *limits, char **out, size_t *out_len) {
  *out = NULL;
  lm_jctx x = {0};
  x.a = arena;
  x.lim = limits ? *limits : lm_jinja_limits_default();
  lm_jframe *builtins, *top;
  LM_TRY(frame_new(&x, NULL, &builtins));
  for (int id = 1; id < LM_JFN_COUNT; id++) {
    lm_jv fn = {LM_JV_FUNC, {.i = id}};
    LM_TRY(frame_set(&x, builtins, lm_jinja_global_names[id], fn));
  }
  LM_TRY(frame_new(&x, builtins, &top));
  if (vars.kind == LM_JV_DICT)
    for (size_t i = 0; i < vars.u.d->n; i++)
      if (vars.u.d->k[i].kind == LM_JV_STR)
        LM_TRY(frame_set(&x, top, vars.u.d->k[i].u.s->s, vars.u.d->v[i]));
  lm_jbuf buf = {0};
  buf.cap_limit = x.lim.max_output;
  x.out = &buf;
  x.frame = top;
  lm_status s = exec_body(&x, top, &t->body);
  size_t len = buf.len;
  if (s == LM_OK) s = lm_jbuf_take(&buf, out);
  if (s == LM_OK && out_len) *out_len = len;
  lm_jbuf_free(&buf);
  return s;
}
