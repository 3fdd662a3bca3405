/* jinja_methods.c — Python methods of template values (str, dict, list, loop), the global functions
 * (range, namespace, dict, raise_exception, strftime_now) and printf-style `%` formatting.
 *
 * Only side-effect-free methods exist, as under transformers' ImmutableSandboxedEnvironment, where
 * `list.append` and friends are refused; templates keep state in namespace() objects instead. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#include "base/status.h"
#include "text/jinja_eval.h"

static int is_int(lm_jv v) { return v.kind == LM_JV_INT || v.kind == LM_JV_BOOL; }
static int64_t ival(lm_jv v) { return v.kind == LM_JV_BOOL ? v.u.b : v.u.i; }

static lm_status method_err(lm_jv obj, const char *name, const char *what) {
  return LM_ERRF(LM_ERR_INVALID, "%s.%s(): %s", lm_jv_type_name(obj), name, what);
}

static lm_status str_arg(lm_jv obj, const char *m, const lm_jcall *c, size_t pos, const char *kw,
                         const lm_jstr **out) {
  lm_jv v;
  if (!lm_jcall_arg(c, pos, kw, &v) || v.kind != LM_JV_STR)
    return method_err(obj, m, "expects a string argument");
  *out = v.u.s;
  return LM_OK;
}

/* ---- str ------------------------------------------------------------------------------------ */

static int in_chars(uint32_t cp, const lm_jstr *chars) {
  if (!chars) return lm_py_isspace(cp);
  for (size_t i = 0; i < chars->len;) {
    uint32_t c;
    i += lm_jutf8_next(chars->s + i, chars->len - i, &c);
    if (c == cp) return 1;
  }
  return 0;
}

static lm_status str_strip(lm_jctx *x, const lm_jstr *s, const lm_jstr *chars, int left, int right,
                           lm_jv *out) {
  size_t b = 0, e = s->len;
  while (left && b < e) {
    uint32_t cp;
    size_t k = lm_jutf8_next(s->s + b, e - b, &cp);
    if (!in_chars(cp, chars)) break;
    b += k;
  }
  while (right && e > b) {
    size_t k = lm_jutf8_prev(s->s + b, e - b);
    uint32_t cp;
    lm_jutf8_next(s->s + e - k, k, &cp);
    if (!in_chars(cp, chars)) break;
    e -= k;
  }
  return lm_jv_str(x->a, s->s + b, e - b, out);
}

static lm_status push_str(lm_jctx *x, lm_jv list, const char *s, size_t n) {
  lm_jv v;
  LM_TRY(lm_jv_str(x->a, s, n, &v));
  return lm_jv_list_push(x->a, list, v);
}

static lm_status reverse_list(lm_jctx *x, lm_jv *list) {
  lm_jv r;
  LM_TRY(lm_jv_list(x->a, list->u.l->n, &r));
  for (size_t i = list->u.l->n; i-- > 0;)
    LM_TRY(lm_jv_list_push(x->a, r, list->u.l->v[i]));
  *list = r;
  return LM_OK;
}

/* str.split / str.rsplit. Whitespace mode (sep None) drops empty pieces, as Python does. */
static lm_status str_split(lm_jctx *x, const lm_jstr *s, const lm_jstr *sep, int64_t maxsplit,
                           int from_right, lm_jv *out) {
  LM_TRY(lm_jv_list(x->a, 0, out));
  if (sep && sep->len == 0) return LM_ERRF(LM_ERR_INVALID, "str.split(): empty separator");
  int64_t done = 0;
  if (!sep) {
    if (!from_right) {
      size_t i = lm_py_lspace(s->s, s->len);
      while (i < s->len) {
        if (maxsplit >= 0 && done >= maxsplit) {
          size_t e = s->len - lm_py_rspace(s->s + i, s->len - i);
          return push_str(x, *out, s->s + i, e - i);
        }
        size_t j = i;
        while (j < s->len) {
          uint32_t cp;
          size_t k = lm_jutf8_next(s->s + j, s->len - j, &cp);
          if (lm_py_isspace(cp)) break;
          j += k;
        }
        LM_TRY(push_str(x, *out, s->s + i, j - i));
        done++;
        i = j + lm_py_lspace(s->s + j, s->len - j);
      }
      return LM_OK;
    }
    size_t e = s->len - lm_py_rspace(s->s, s->len);
    while (e > 0) {
      if (maxsplit >= 0 && done >= maxsplit) {
        size_t b = lm_py_lspace(s->s, e);
        LM_TRY(push_str(x, *out, s->s + b, e - b));
        break;
      }
      size_t b = e;
      while (b > 0) {
        size_t k = lm_jutf8_prev(s->s, b);
        uint32_t cp;
        lm_jutf8_next(s->s + b - k, k, &cp);
        if (lm_py_isspace(cp)) break;
        b -= k;
      }
      LM_TRY(push_str(x, *out, s->s + b, e - b));
      done++;
      e = b - lm_py_rspace(s->s, b);
    }
    return reverse_list(x, out);
  }
  if (!from_right) {
    size_t i = 0;
    for (;;) {
      const char *hit =
          (maxsplit < 0 || done < maxsplit) ? memmem(s->s + i, s->len - i, sep->s, sep->len) : NULL;
      if (!hit) return push_str(x, *out, s->s + i, s->len - i);
      LM_TRY(push_str(x, *out, s->s + i, (size_t)(hit - s->s) - i));
      i = (size_t)(hit - s->s) + sep->len;
      done++;
    }
  }
  size_t e = s->len;
  for (;;) {
    size_t hit = (size_t)-1;
    if ((maxsplit < 0 || done < maxsplit) && e >= sep->len)
      for (size_t p = e - sep->len + 1; p-- > 0;)
        if (memcmp(s->s + p, sep->s, sep->len) == 0) {
          hit = p;
          break;
        }
    if (hit == (size_t)-1) {
      LM_TRY(push_str(x, *out, s->s, e));
      return reverse_list(x, out);
    }
    LM_TRY(push_str(x, *out, s->s + hit + sep->len, e - hit - sep->len));
    e = hit;
    done++;
  }
}

static int affix_match(const lm_jstr *s, lm_jv affix, int suffix) {
  if (affix.kind != LM_JV_STR) return 0;
  const lm_jstr *a = affix.u.s;
  if (a->len > s->len) return 0;
  return memcmp(suffix ? s->s + s->len - a->len : s->s, a->s, a->len) == 0;
}

static lm_status str_affix(lm_jv obj, const char *m, const lm_jcall *c, int suffix, lm_jv *out) {
  lm_jv p;
  if (!lm_jcall_arg(c, 0, NULL, &p)) return method_err(obj, m, "takes a prefix");
  int r = 0;
  if (p.kind == LM_JV_LIST) {
    for (size_t i = 0; i < p.u.l->n && !r; i++)
      r = affix_match(obj.u.s, p.u.l->v[i], suffix);
  } else if (p.kind == LM_JV_STR) {
    r = affix_match(obj.u.s, p, suffix);
  } else {
    return method_err(obj, m, "arg must be str or a tuple of str");
  }
  *out = lm_jv_bool(r);
  return LM_OK;
}

static lm_status str_find(lm_jv obj, const char *m, const lm_jcall *c, lm_jv *out) {
  const lm_jstr *s = obj.u.s, *sub = NULL;
  LM_TRY(str_arg(obj, m, c, 0, NULL, &sub));
  int rev = m[0] == 'r', strict = strstr(m, "index") != NULL;
  const char *hit = NULL;
  if (!rev) {
    hit = sub->len == 0 ? s->s : memmem(s->s, s->len, sub->s, sub->len);
  } else if (sub->len <= s->len) {
    for (size_t p = s->len - sub->len + 1; p-- > 0 && !hit;)
      if (memcmp(s->s + p, sub->s, sub->len) == 0) hit = s->s + p;
  }
  if (!hit && strict) return method_err(obj, m, "substring not found");
  *out = lm_jv_int(hit ? (int64_t)lm_jutf8_count(s->s, (size_t)(hit - s->s)) : -1);
  return LM_OK;
}

static lm_status str_count(lm_jv obj, const lm_jcall *c, lm_jv *out) {
  const lm_jstr *s = obj.u.s, *sub = NULL;
  LM_TRY(str_arg(obj, "count", c, 0, NULL, &sub));
  int64_t n = 0;
  if (sub->len == 0) {
    n = (int64_t)lm_jutf8_count(s->s, s->len) + 1;
  } else {
    for (size_t i = 0; i + sub->len <= s->len;) {
      const char *hit = memmem(s->s + i, s->len - i, sub->s, sub->len);
      if (!hit) break;
      n++;
      i = (size_t)(hit - s->s) + sub->len;
    }
  }
  *out = lm_jv_int(n);
  return LM_OK;
}

static lm_status str_join(lm_jctx *x, lm_jv obj, const lm_jcall *c, lm_jv *out) {
  lm_jv seq, items;
  if (!lm_jcall_arg(c, 0, NULL, &seq)) return method_err(obj, "join", "takes an iterable");
  LM_TRY(lm_jinja_iterate(x, seq, &items));
  lm_jbuf b = {0};
  lm_status s = LM_OK;
  for (size_t i = 0; i < items.u.l->n && s == LM_OK; i++) {
    lm_jv v = items.u.l->v[i];
    if (v.kind != LM_JV_STR) s = method_err(obj, "join", "sequence item is not a str");
    if (s == LM_OK && i) s = lm_jbuf_put(&b, obj.u.s->s, obj.u.s->len);
    if (s == LM_OK) s = lm_jbuf_put(&b, v.u.s->s, v.u.s->len);
  }
  if (s == LM_OK) s = lm_jv_str(x->a, b.data ? b.data : "", b.len, out);
  lm_jbuf_free(&b);
  return s;
}

/* str.isdigit() & co. over every code point (False for ""). */
static lm_status str_class(lm_jv obj, const char *m, lm_jv *out) {
  const lm_jstr *s = obj.u.s;
  int ok = s->len > 0;
  for (size_t i = 0; i < s->len && ok;) {
    uint32_t cp;
    i += lm_jutf8_next(s->s + i, s->len - i, &cp);
    utf8proc_category_t cat =
        cp < LM_JUTF8_RAW ? utf8proc_category((utf8proc_int32_t)cp) : UTF8PROC_CATEGORY_CN;
    int alpha = cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
    int digit = cat == UTF8PROC_CATEGORY_ND;
    if (!strcmp(m, "isdigit"))
      ok = digit;
    else if (!strcmp(m, "isalpha"))
      ok = alpha;
    else if (!strcmp(m, "isalnum"))
      ok = alpha || digit || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO;
    else
      ok = lm_py_isspace(cp);
  }
  *out = lm_jv_bool(ok);
  return LM_OK;
}

/* "{} {0} {name}".format(...), without format specs. */
static lm_status str_format(lm_jctx *x, lm_jv obj, const lm_jcall *c, lm_jv *out) {
  const lm_jstr *s = obj.u.s;
  lm_jbuf b = {0};
  lm_status st = LM_OK;
  size_t auto_idx = 0;
  for (size_t i = 0; i < s->len && st == LM_OK; i++) {
    char ch = s->s[i];
    if ((ch == '{' || ch == '}') && i + 1 < s->len && s->s[i + 1] == ch) {
      st = lm_jbuf_putc(&b, ch);
      i++;
      continue;
    }
    if (ch == '}') {
      st = method_err(obj, "format", "single '}' encountered in format string");
      break;
    }
    if (ch != '{') {
      st = lm_jbuf_putc(&b, ch);
      continue;
    }
    const char *close = memchr(s->s + i, '}', s->len - i);
    if (!close) {
      st = method_err(obj, "format", "single '{' encountered in format string");
      break;
    }
    size_t fl = (size_t)(close - (s->s + i + 1));
    const char *f = s->s + i + 1;
    if (memchr(f, ':', fl) || memchr(f, '!', fl) || memchr(f, '[', fl) || memchr(f, '.', fl)) {
      st = LM_ERRF(LM_ERR_UNSUPPORTED,
                   "str.format(): format specs and field access are not supported");
      break;
    }
    lm_jv v = lm_jv_undef();
    int found = 0;
    if (fl == 0 || (f[0] >= '0' && f[0] <= '9')) {
      size_t idx = fl == 0 ? auto_idx++ : (size_t)strtoull(f, NULL, 10);
      if (idx < c->nargs) v = c->args[idx], found = 1;
    } else {
      for (size_t k = 0; k < c->nkw && !found; k++)
        if (strlen(c->kwnames[k]) == fl && !memcmp(c->kwnames[k], f, fl))
          v = c->kwvals[k], found = 1;
    }
    if (!found) {
      st = method_err(obj, "format", "missing argument for a replacement field");
      break;
    }
    st = lm_jv_put_str(&b, v);
    i += fl + 1;
  }
  if (st == LM_OK) st = lm_jv_str(x->a, b.data ? b.data : "", b.len, out);
  lm_jbuf_free(&b);
  return st;
}

static lm_status via_filter(lm_jctx *x, const char *filter, lm_jv obj, lm_jv *out) {
  lm_jcall none = {0};
  return lm_jinja_apply_filter(x, lm_jinja_filter_id(filter), obj, &none, out);
}

static lm_status str_method(lm_jctx *x, lm_jv obj, const char *m, const lm_jcall *c, lm_jv *out,
                            int *found) {
  const lm_jstr *s = obj.u.s;
  lm_jv a0 = lm_jv_none(), a1 = lm_jv_int(-1);
  *found = 1;
  if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip")) {
    lm_jcall_arg(c, 0, "chars", &a0);
    if (a0.kind != LM_JV_NONE && a0.kind != LM_JV_STR)
      return method_err(obj, m, "arg must be None or str");
    return str_strip(x, s, a0.kind == LM_JV_STR ? a0.u.s : NULL, m[0] != 'r', m[0] != 'l', out);
  }
  if (!strcmp(m, "split") || !strcmp(m, "rsplit")) {
    lm_jcall_arg(c, 0, "sep", &a0);
    lm_jcall_arg(c, 1, "maxsplit", &a1);
    if ((a0.kind != LM_JV_NONE && a0.kind != LM_JV_STR) || !is_int(a1))
      return method_err(obj, m, "bad arguments");
    return str_split(x, s, a0.kind == LM_JV_STR ? a0.u.s : NULL, ival(a1), m[0] == 'r', out);
  }
  if (!strcmp(m, "splitlines")) {
    lm_jv keep = lm_jv_bool(0);
    lm_jcall_arg(c, 0, "keepends", &keep);
    return lm_jinja_splitlines(x, s, lm_jv_truthy(keep), out);
  }
  if (!strcmp(m, "startswith") || !strcmp(m, "endswith"))
    return str_affix(obj, m, c, m[0] == 'e', out);
  if (!strcmp(m, "upper") || !strcmp(m, "lower") || !strcmp(m, "title") || !strcmp(m, "capitalize"))
    return via_filter(x, m, obj, out);
  if (!strcmp(m, "replace")) {
    const lm_jstr *old = NULL, *new_ = NULL;
    LM_TRY(str_arg(obj, m, c, 0, NULL, &old));
    LM_TRY(str_arg(obj, m, c, 1, NULL, &new_));
    lm_jcall_arg(c, 2, "count", &a1);
    return lm_jinja_str_replace(x, s, old, new_, is_int(a1) ? ival(a1) : -1, out);
  }
  if (!strcmp(m, "find") || !strcmp(m, "rfind") || !strcmp(m, "index") || !strcmp(m, "rindex"))
    return str_find(obj, m, c, out);
  if (!strcmp(m, "count")) return str_count(obj, c, out);
  if (!strcmp(m, "join")) return str_join(x, obj, c, out);
  if (!strcmp(m, "format")) return str_format(x, obj, c, out);
  if (!strcmp(m, "isdigit") || !strcmp(m, "isalpha") || !strcmp(m, "isalnum") ||
      !strcmp(m, "isspace"))
    return str_class(obj, m, out);
  if (!strcmp(m, "islower") || !strcmp(m, "isupper")) {
    int r;
    LM_TRY(lm_jinja_apply_test(x, lm_jinja_test_id(m + 2), obj, c, &r));
    *out = lm_jv_bool(r);
    return LM_OK;
  }
  if (!strcmp(m, "removeprefix") || !strcmp(m, "removesuffix")) {
    const lm_jstr *a = NULL;
    LM_TRY(str_arg(obj, m, c, 0, NULL, &a));
    lm_jv av = {LM_JV_STR, {.s = a}};
    int suffix = m[6] == 's';
    if (!affix_match(s, av, suffix)) {
      *out = obj;
      return LM_OK;
    }
    return lm_jv_str(x->a, suffix ? s->s : s->s + a->len, s->len - a->len, out);
  }
  *found = 0;
  return LM_OK;
}

/* ---- dict, list, loop ----------------------------------------------------------------------- */

static lm_status dict_method(lm_jctx *x, lm_jv obj, const char *m, const lm_jcall *c, lm_jv *out,
                             int *found) {
  const lm_jdict *d = obj.u.d;
  *found = 1;
  if (!strcmp(m, "get")) {
    lm_jv key, def = lm_jv_none();
    if (!lm_jcall_arg(c, 0, NULL, &key)) return method_err(obj, m, "expected at least 1 argument");
    lm_jcall_arg(c, 1, NULL, &def);
    if (!lm_jv_dict_get(obj, key, out)) *out = def;
    return LM_OK;
  }
  if (!strcmp(m, "items"))
    return lm_jinja_apply_filter(x, lm_jinja_filter_id("items"), obj, c, out);
  if (!strcmp(m, "keys") || !strcmp(m, "values")) {
    LM_TRY(lm_jv_list(x->a, d->n, out));
    for (size_t i = 0; i < d->n; i++)
      LM_TRY(lm_jv_list_push(x->a, *out, m[0] == 'k' ? d->k[i] : d->v[i]));
    return LM_OK;
  }
  *found = 0;
  return LM_OK;
}

static lm_status list_method(lm_jv obj, const char *m, const lm_jcall *c, lm_jv *out, int *found) {
  const lm_jlist *l = obj.u.l;
  lm_jv v;
  *found = 1;
  if (!strcmp(m, "index") || !strcmp(m, "count")) {
    if (!lm_jcall_arg(c, 0, NULL, &v)) return method_err(obj, m, "takes exactly one argument");
    int64_t n = 0;
    for (size_t i = 0; i < l->n; i++)
      if (lm_jv_equal(l->v[i], v)) {
        if (m[0] == 'i') {
          *out = lm_jv_int((int64_t)i);
          return LM_OK;
        }
        n++;
      }
    if (m[0] == 'i') return method_err(obj, m, "value is not in list");
    *out = lm_jv_int(n);
    return LM_OK;
  }
  *found = 0;
  return LM_OK;
}

lm_status lm_jinja_call_method(lm_jctx *x, lm_jv obj, const char *name, const lm_jcall *c,
                               lm_jv *out, int *found) {
  *found = 0;
  switch (obj.kind) {
  case LM_JV_STR: return str_method(x, obj, name, c, out, found);
  case LM_JV_DICT: return dict_method(x, obj, name, c, out, found);
  case LM_JV_LIST: return list_method(obj, name, c, out, found);
  case LM_JV_LOOP:
    if (!strcmp(name, "cycle")) {
      *found = 1;
      if (c->nargs == 0) return LM_ERRF(LM_ERR_INVALID, "loop.cycle() needs at least one value");
      *out = c->args[((lm_jloop *)obj.u.p)->index0 % c->nargs];
    }
    return LM_OK;
  default: return LM_OK;
  }
}

/* ---- globals -------------------------------------------------------------------------------- */

const char *const lm_jinja_global_names[LM_JFN_COUNT] = {"",     "range",           "namespace",
                                                         "dict", "raise_exception", "strftime_now"};

static lm_status g_range(lm_jctx *x, const lm_jcall *c, lm_jv *out) {
  int64_t start = 0, stop, stepv = 1;
  for (size_t i = 0; i < c->nargs; i++)
    if (!is_int(c->args[i])) return LM_ERRF(LM_ERR_INVALID, "range(): arguments must be integers");
  if (c->nargs == 1)
    stop = ival(c->args[0]);
  else if (c->nargs == 2 || c->nargs == 3) {
    start = ival(c->args[0]), stop = ival(c->args[1]);
    if (c->nargs == 3) stepv = ival(c->args[2]);
  } else {
    return LM_ERRF(LM_ERR_INVALID, "range() takes 1 to 3 arguments");
  }
  if (stepv == 0) return LM_ERRF(LM_ERR_INVALID, "range() arg 3 must not be zero");
  double count = stepv > 0 ? ((double)stop - (double)start) / (double)stepv
                           : ((double)start - (double)stop) / (double)-stepv;
  if (count > (double)x->lim.max_steps)
    return LM_ERRF(LM_ERR_INVALID, "range() longer than the step limit");
  LM_TRY(lm_jv_list(x->a, count > 0 ? (size_t)count + 1 : 0, out));
  for (int64_t i = start; stepv > 0 ? i < stop : i > stop; i += stepv) {
    LM_TRY(lm_jv_list_push(x->a, *out, lm_jv_int(i)));
    if ((stepv > 0 && i > INT64_MAX - stepv) || (stepv < 0 && i < INT64_MIN - stepv)) break;
  }
  return LM_OK;
}

/* namespace(...) and dict(...): an optional mapping, then keyword arguments. */
static lm_status g_mapping(lm_jctx *x, const lm_jcall *c, int ns, lm_jv *out) {
  LM_TRY(lm_jv_dict(x->a, c->nkw, out));
  if (c->nargs > 1)
    return LM_ERRF(LM_ERR_INVALID, "%s() takes at most one positional argument",
                   ns ? "namespace" : "dict");
  if (c->nargs == 1) {
    lm_jv m = c->args[0];
    if (m.kind != LM_JV_DICT && m.kind != LM_JV_NS)
      return LM_ERRF(LM_ERR_INVALID, "%s(): argument must be a mapping", ns ? "namespace" : "dict");
    for (size_t i = 0; i < m.u.d->n; i++)
      LM_TRY(lm_jv_dict_set(x->a, *out, m.u.d->k[i], m.u.d->v[i]));
  }
  for (size_t i = 0; i < c->nkw; i++) {
    lm_jv k;
    LM_TRY(lm_jv_cstr(x->a, c->kwnames[i], &k));
    LM_TRY(lm_jv_dict_set(x->a, *out, k, c->kwvals[i]));
  }
  if (ns) out->kind = LM_JV_NS;
  return LM_OK;
}

static lm_status g_strftime(lm_jctx *x, const lm_jcall *c, lm_jv *out) {
  lm_jv fmt;
  if (!lm_jcall_arg(c, 0, NULL, &fmt) || fmt.kind != LM_JV_STR)
    return LM_ERRF(LM_ERR_INVALID, "strftime_now() needs a format");
  time_t now = time(NULL);
  struct tm tmv;
  localtime_r(&now, &tmv);
  char buf[512];
  size_t n = fmt.u.s->len ? strftime(buf, sizeof buf, fmt.u.s->s, &tmv) : 0;
  if (n == 0 && fmt.u.s->len)
    return LM_ERRF(LM_ERR_INVALID, "strftime_now(): result empty or longer than 512 bytes");
  return lm_jv_str(x->a, buf, n, out);
}

lm_status lm_jinja_call_global(lm_jctx *x, int id, const lm_jcall *c, lm_jv *out) {
  switch (id) {
  case LM_JFN_RANGE: return g_range(x, c, out);
  case LM_JFN_NAMESPACE: return g_mapping(x, c, 1, out);
  case LM_JFN_DICT: return g_mapping(x, c, 0, out);
  case LM_JFN_RAISE: {
    lm_jv msg = lm_jv_undef();
    lm_jcall_arg(c, 0, NULL, &msg);
    lm_jbuf b = {0};
    lm_status s = lm_jv_put_str(&b, msg);
    if (s == LM_OK) s = LM_ERRF(LM_ERR_INVALID, "raise_exception: %s", b.data ? b.data : "");
    lm_jbuf_free(&b);
    return s;
  }
  case LM_JFN_STRFTIME: return g_strftime(x, c, out);
  }
  return LM_ERRF(LM_ERR_INVALID, "unknown function");
}

/* ---- printf-style formatting ---------------------------------------------------------------- */

static lm_status fmt_one(lm_jbuf *b, char conv, const char *flags, int width, int prec, lm_jv v) {
  char spec[32], tmp[512];
  int n;
  if (conv == 's' || conv == 'r') {
    lm_jbuf t = {0};
    lm_status s = conv == 's' ? lm_jv_put_str(&t, v) : lm_jv_put_repr(&t, v);
    size_t len = t.len;
    if (s == LM_OK && prec >= 0) len = lm_jutf8_offset(t.data ? t.data : "", t.len, (size_t)prec);
    int cps = (int)lm_jutf8_count(t.data ? t.data : "", len), left = strchr(flags, '-') != NULL;
    for (int i = cps; s == LM_OK && !left && i < width; i++)
      s = lm_jbuf_putc(b, ' ');
    if (s == LM_OK) s = lm_jbuf_put(b, t.data ? t.data : "", len);
    for (int i = cps; s == LM_OK && left && i < width; i++)
      s = lm_jbuf_putc(b, ' ');
    lm_jbuf_free(&t);
    return s;
  }
  if (strchr("dioxXc", conv)) {
    int64_t iv;
    if (is_int(v))
      iv = ival(v);
    else if (v.kind == LM_JV_FLOAT && conv != 'c' && v.u.f > -9.2e18 && v.u.f < 9.2e18)
      iv = (int64_t)v.u.f;
    else
      return LM_ERRF(LM_ERR_INVALID, "%%%c format: a number is required, not %s", conv,
                     lm_jv_type_name(v));
    if (conv == 'c') {
      char enc[4];
      return iv >= 0 && iv <= 0x10FFFF ? lm_jbuf_put(b, enc, lm_jutf8_put((uint32_t)iv, enc))
                                       : LM_ERRF(LM_ERR_INVALID, "%%c arg not in range");
    }
    snprintf(spec, sizeof spec, "%%%s*.*ll%c", flags, conv == 'i' ? 'd' : conv);
    n = snprintf(tmp, sizeof tmp, spec, width, prec < 0 ? 1 : prec, (long long)iv);
  } else if (strchr("eEfFgG", conv)) {
    if (!is_int(v) && v.kind != LM_JV_FLOAT)
      return LM_ERRF(LM_ERR_INVALID, "%%%c format: a real number is required, not %s", conv,
                     lm_jv_type_name(v));
    double f = v.kind == LM_JV_FLOAT ? v.u.f : (double)ival(v);
    snprintf(spec, sizeof spec, "%%%s*.*%c", flags, conv);
    n = snprintf(tmp, sizeof tmp, spec, width, prec < 0 ? 6 : prec, f);
  } else {
    return LM_ERRF(LM_ERR_UNSUPPORTED, "unsupported format character '%c'", conv);
  }
  if (n < 0 || (size_t)n >= sizeof tmp) return LM_ERRF(LM_ERR_INVALID, "formatted value too long");
  return lm_jbuf_put(b, tmp, (size_t)n);
}

lm_status lm_jinja_percent_format(lm_jctx *x, lm_jv fmt, lm_jv args, lm_jv *out) {
  const lm_jstr *f = fmt.u.s;
  lm_jbuf b = {0};
  lm_status s = LM_OK;
  size_t argi = 0;
  int is_tuple = args.kind == LM_JV_LIST && args.u.l->tuple;
  for (size_t i = 0; i < f->len && s == LM_OK; i++) {
    if (f->s[i] != '%') {
      s = lm_jbuf_putc(&b, f->s[i]);
      continue;
    }
    if (++i >= f->len) {
      s = LM_ERRF(LM_ERR_INVALID, "incomplete format");
      break;
    }
    lm_jv v = args;
    int named = 0;
    if (f->s[i] == '(') { /* %(name)s */
      named = 1;
      const char *close = memchr(f->s + i, ')', f->len - i);
      if (!close || args.kind != LM_JV_DICT) {
        s = LM_ERRF(LM_ERR_INVALID, "format requires a mapping");
        break;
      }
      lm_jv key;
      if ((s = lm_jv_str(x->a, f->s + i + 1, (size_t)(close - f->s) - i - 1, &key)) != LM_OK) break;
      if (!lm_jv_dict_get(args, key, &v)) {
        s = LM_ERRF(LM_ERR_INVALID, "format: missing key '%s'", key.u.s->s);
        break;
      }
      i = (size_t)(close - f->s) + 1;
    }
    char flags[8];
    size_t nf = 0;
    while (i < f->len && strchr("-+ #0", f->s[i]) && nf < sizeof flags - 1)
      flags[nf++] = f->s[i++];
    flags[nf] = '\0';
    int width = 0, prec = -1;
    while (i < f->len && f->s[i] >= '0' && f->s[i] <= '9' && width < 10000)
      width = width * 10 + (f->s[i++] - '0');
    if (i < f->len && f->s[i] == '.') {
      prec = 0;
      for (i++; i < f->len && f->s[i] >= '0' && f->s[i] <= '9' && prec < 10000; i++)
        prec = prec * 10 + (f->s[i] - '0');
    }
    if (i >= f->len) {
      s = LM_ERRF(LM_ERR_INVALID, "incomplete format");
      break;
    }
    char conv = f->s[i];
    if (conv == '%') {
      s = lm_jbuf_putc(&b, '%');
      continue;
    }
    if (!named) {
      if (is_tuple) {
        if (argi >= args.u.l->n) {
          s = LM_ERRF(LM_ERR_INVALID, "not enough arguments for format string");
          break;
        }
        v = args.u.l->v[argi++];
      } else if (argi++ > 0 && args.kind != LM_JV_DICT) {
        s = LM_ERRF(LM_ERR_INVALID, "not enough arguments for format string");
        break;
      }
    }
    if (width > 4096 || prec > 4096) {
      s = LM_ERRF(LM_ERR_INVALID, "format width or precision too large");
      break;
    }
    s = fmt_one(&b, conv, flags, width, prec, v);
  }
  if (s == LM_OK && is_tuple && argi < args.u.l->n)
    s = LM_ERRF(LM_ERR_INVALID, "not all arguments converted during string formatting");
  if (s == LM_OK) s = lm_jv_str(x->a, b.data ? b.data : "", b.len, out);
  lm_jbuf_free(&b);
  return s;
}
