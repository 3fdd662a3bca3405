/* parse_call.c — one tool call's text to {name, arguments JSON}: Gemma 4's value syntax and the
 * generic JSON form.
 *
 * Gemma 4 value syntax (gemma4-chat.md §6, the inverse of the template's format_argument):
 *   value  = STR | object | array | number | true | false | null      (also True / False / None)
 *   STR    = <|"|> any* <|"|>      shortest match, no escapes
 *   object = { [key : value (, key : value)*] }    key: raw text up to ':' or a <|"|>-quoted string
 *   array  = [ [value (, value)*] ]
 * Whitespace between tokens is skipped. Values are built as interpreter values and printed with
 * json.dumps' rules, which keeps int vs float, integers of any size, and JSON-escapes strings. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "text/jinja_value.h"
#include "text/parse.h"

#define Q "<|\"|>"
#define QLEN 5
#define LM_PARSE_MAX_DEPTH 64

typedef struct areader {
  lm_jarena *a;
  const char *s;
  size_t n, i;
  int depth;
} areader;

static lm_status bad(const areader *r, const char *what) {
  return LM_ERRF(LM_ERR_INVALID, "tool call: %s at byte %zu", what, r->i);
}

static void skip_ws(areader *r) {
  while (r->i < r->n &&
         (r->s[r->i] == ' ' || r->s[r->i] == '\t' || r->s[r->i] == '\n' || r->s[r->i] == '\r'))
    r->i++;
}

static int at_quote(const areader *r) {
  return r->n - r->i >= QLEN && memcmp(r->s + r->i, Q, QLEN) == 0;
}

static lm_status read_str(areader *r, lm_jv *out) {
  r->i += QLEN;
  const char *end = r->n > r->i ? memmem(r->s + r->i, r->n - r->i, Q, QLEN) : NULL;
  if (!end) return bad(r, "unterminated <|\"|> string");
  size_t len = (size_t)(end - (r->s + r->i));
  LM_TRY(lm_jv_str(r->a, r->s + r->i, len, out));
  r->i += len + QLEN;
  return LM_OK;
}

/* A bare literal: true/false/null (and Python's spellings) or a number, up to , } or ]. */
static lm_status read_literal(areader *r, lm_jv *out) {
  size_t start = r->i;
  while (r->i < r->n && !strchr(",}]", r->s[r->i]) && !at_quote(r))
    r->i++;
  size_t end = r->i;
  while (end > start && strchr(" \t\r\n", r->s[end - 1]))
    end--;
  const char *t = r->s + start;
  size_t n = end - start;
#define IS(w) (n == sizeof(w) - 1 && memcmp(t, w, n) == 0)
  if (IS("true") || IS("True"))
    *out = lm_jv_bool(1);
  else if (IS("false") || IS("False"))
    *out = lm_jv_bool(0);
  else if (IS("null") || IS("None"))
    *out = lm_jv_none();
#undef IS
  else {
    /* JSON numbers as written; Python's extra forms (+1, .5, 5., 1_000) through strtod/strtoll */
    char buf[400];
    size_t m = 0;
    if (n == 0 || n >= sizeof buf) return bad(r, "bad value");
    for (size_t k = 0; k < n; k++)
      if (t[k] != '_') buf[m++] = t[k];
    buf[m] = '\0';
    const char *p = buf[0] == '+' ? buf + 1 : buf;
    if (lm_jv_parse_json(r->a, p, strlen(p), out) == LM_OK && lm_jv_is_num(*out)) return LM_OK;
    int digits = 0;
    for (const char *q = p; *q; q++)
      digits += *q >= '0' && *q <= '9';
    char *e;
    double d = strtod(p, &e);
    if (*e != '\0' || !digits || !isfinite(d) || strpbrk(p, "xXpP")) return bad(r, "bad value");
    if (strpbrk(p, ".eE")) {
      *out = lm_jv_float(d);
    } else { /* leading zeros ("007"): Python's int() reads them, JSON does not */
      char z[400];
      size_t k = 0, j = 0;
      if (p[0] == '-') z[k++] = '-', j = 1;
      while (p[j] == '0' && p[j + 1])
        j++;
      strcpy(z + k, p + j);
      if (lm_jv_parse_json(r->a, z, strlen(z), out) != LM_OK) return bad(r, "bad value");
    }
  }
  return LM_OK;
}

static lm_status read_value(areader *r, lm_jv *out);

static lm_status read_object(areader *r, lm_jv *out) {
  if (++r->depth > LM_PARSE_MAX_DEPTH) return bad(r, "nesting too deep");
  r->i++; /* { */
  LM_TRY(lm_jv_dict(r->a, 0, out));
  skip_ws(r);
  if (r->i < r->n && r->s[r->i] == '}') {
    r->i++;
    r->depth--;
    return LM_OK;
  }
  for (;;) {
    skip_ws(r);
    lm_jv key, val;
    if (at_quote(r)) {
      LM_TRY(read_str(r, &key));
    } else {
      size_t start = r->i;
      while (r->i < r->n && r->s[r->i] != ':' && !strchr("{}[],", r->s[r->i]) && !at_quote(r))
        r->i++;
      size_t end = r->i;
      while (end > start && strchr(" \t\r\n", r->s[end - 1]))
        end--;
      if (end == start) return bad(r, "missing key");
      LM_TRY(lm_jv_str(r->a, r->s + start, end - start, &key));
    }
    skip_ws(r);
    if (r->i >= r->n || r->s[r->i] != ':') return bad(r, "missing ':' after key");
    r->i++;
    LM_TRY(read_value(r, &val));
    LM_TRY(lm_jv_dict_set(r->a, *out, key, val));
    skip_ws(r);
    if (r->i < r->n && r->s[r->i] == ',') {
      r->i++;
    } else if (r->i < r->n && r->s[r->i] == '}') {
      r->i++;
      r->depth--;
      return LM_OK;
    } else {
      return bad(r, "expected ',' or '}'");
    }
  }
}

static lm_status read_array(areader *r, lm_jv *out) {
  if (++r->depth > LM_PARSE_MAX_DEPTH) return bad(r, "nesting too deep");
  r->i++; /* [ */
  LM_TRY(lm_jv_list(r->a, 0, out));
  skip_ws(r);
  if (r->i < r->n && r->s[r->i] == ']') {
    r->i++;
    r->depth--;
    return LM_OK;
  }
  for (;;) {
    lm_jv v;
    LM_TRY(read_value(r, &v));
    LM_TRY(lm_jv_list_push(r->a, *out, v));
    skip_ws(r);
    if (r->i < r->n && r->s[r->i] == ',') {
      r->i++;
    } else if (r->i < r->n && r->s[r->i] == ']') {
      r->i++;
      r->depth--;
      return LM_OK;
    } else {
      return bad(r, "expected ',' or ']'");
    }
  }
}

static lm_status read_value(areader *r, lm_jv *out) {
  skip_ws(r);
  if (r->i >= r->n) return bad(r, "missing value");
  if (at_quote(r)) return read_str(r, out);
  if (r->s[r->i] == '{') return read_object(r, out);
  if (r->s[r->i] == '[') return read_array(r, out);
  return read_literal(r, out);
}

static int name_char(unsigned char c) {
  /* [\w.:-]: MCP tool names contain '.', ':' and '-'; any non-ASCII byte counts as a word character
   */
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '.' || c == ':' || c == '-' || c >= 0x80;
}

static lm_status dup_out(const char *s, size_t n, char **out) {
  *out = malloc(n + 1);
  if (!*out) return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  memcpy(*out, s, n);
  (*out)[n] = '\0';
  return LM_OK;
}

/* JSON has no inf/nan ("1e999" reads as inf): such arguments are refused rather than printed
 * invalid. */
static int all_finite(lm_jv v) {
  if (v.kind == LM_JV_FLOAT) return isfinite(v.u.f);
  if (v.kind == LM_JV_LIST)
    for (size_t i = 0; i < v.u.l->n; i++)
      if (!all_finite(v.u.l->v[i])) return 0;
  if (v.kind == LM_JV_DICT)
    for (size_t i = 0; i < v.u.d->n; i++)
      if (!all_finite(v.u.d->v[i])) return 0;
  return 1;
}

/* Prints an object value as the arguments JSON (json.dumps default separators). */
static lm_status args_json(lm_jv args, char **out) {
  if (!all_finite(args))
    return LM_ERRF(LM_ERR_INVALID, "tool call: a number is out of range (inf or nan)");
  lm_jbuf b = {0};
  lm_jv_json_opts o = {-1, 0, 0, NULL, NULL};
  lm_status s = lm_jv_put_json(&b, args, &o);
  if (s == LM_OK) s = lm_jbuf_take(&b, out);
  lm_jbuf_free(&b);
  return s;
}

static lm_status gemma4_call(lm_jarena *a, const char *body, size_t len, char **name,
                             char **arguments) {
  areader r = {a, body, len, 0, 0};
  skip_ws(&r);
  if (r.n - r.i < 5 || memcmp(body + r.i, "call:", 5) != 0) return bad(&r, "missing 'call:'");
  r.i += 5;
  size_t ns = r.i;
  while (r.i < r.n && name_char((unsigned char)body[r.i]))
    r.i++;
  if (r.i == ns) return bad(&r, "missing function name");
  size_t ne = r.i;
  skip_ws(&r);
  if (r.i >= r.n || body[r.i] != '{') return bad(&r, "expected '{' after the function name");
  lm_jv args;
  LM_TRY(read_object(&r, &args));
  skip_ws(&r);
  if (r.i != r.n) return bad(&r, "text after the arguments");
  LM_TRY(args_json(args, arguments));
  lm_status s = dup_out(body + ns, ne - ns, name);
  if (s != LM_OK) {
    free(*arguments);
    *arguments = NULL;
  }
  return s;
}

lm_status lm_parse_gemma4_call(const char *body, size_t len, char **name, char **arguments_json) {
  *name = *arguments_json = NULL;
  lm_jarena *a;
  LM_TRY(lm_jarena_create(64u << 20, &a));
  lm_status s = gemma4_call(a, body, len, name, arguments_json);
  lm_jarena_free(a);
  return s;
}

static lm_status json_call(lm_jarena *a, const char *body, size_t len, char **name,
                           char **arguments) {
  lm_jv v, nm, args = lm_jv_undef();
  lm_status s = lm_jv_parse_json(a, body, len, &v);
  if (s != LM_OK) return lm_err_prefix(s, "tool call");
  if (v.kind != LM_JV_DICT) return LM_ERRF(LM_ERR_INVALID, "tool call: not a JSON object");
  if (!lm_jv_dict_gets(v, "name", &nm) || nm.kind != LM_JV_STR || nm.u.s->len == 0)
    return LM_ERRF(LM_ERR_INVALID, "tool call: missing \"name\"");
  if (!lm_jv_dict_gets(v, "arguments", &args)) lm_jv_dict_gets(v, "parameters", &args);
  if (args.kind == LM_JV_STR) { /* some models emit arguments as a JSON string */
    lm_jv inner;
    if (lm_jv_parse_json(a, args.u.s->s, args.u.s->len, &inner) != LM_OK ||
        inner.kind != LM_JV_DICT)
      return LM_ERRF(LM_ERR_INVALID, "tool call: \"arguments\" string is not a JSON object");
    args = inner;
  }
  if (args.kind == LM_JV_UNDEF || args.kind == LM_JV_NONE) LM_TRY(lm_jv_dict(a, 0, &args));
  if (args.kind != LM_JV_DICT)
    return LM_ERRF(LM_ERR_INVALID, "tool call: \"arguments\" is not an object");
  LM_TRY(args_json(args, arguments));
  s = dup_out(nm.u.s->s, nm.u.s->len, name);
  if (s != LM_OK) {
    free(*arguments);
    *arguments = NULL;
  }
  return s;
}

lm_status lm_parse_json_call(const char *body, size_t len, char **name, char **arguments_json) {
  *name = *arguments_json = NULL;
  lm_jarena *a;
  LM_TRY(lm_jarena_create(64u << 20, &a));
  lm_status s = json_call(a, body, len, name, arguments_json);
  lm_jarena_free(a);
  return s;
}
