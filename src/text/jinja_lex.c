/* jinja_lex.c — template text to tokens, with jinja2's whitespace control.
 *
 * Rules (jinja2 3.1 lexer, as transformers configures it: trim_blocks + lstrip_blocks):
 *   - `{%-`, `{{-`, `{#-` strip all whitespace before the tag; `-%}`, `-}}`, `-#}` strip it after.
 *   - trim_blocks drops the first newline after a block or comment tag (not after `}}`); `+%}`
 * keeps it.
 *   - lstrip_blocks drops spaces and tabs between a line start and a block or comment tag; `{%+`
 * keeps them. A line starts at the template start, after a newline in the text, or when the
 * previous tag ended by consuming a newline.
 *   - Inside a tag, the closing delimiter counts only when brackets are balanced (`{{ {'a': 1}}}`).
 *   - `{% raw %}…{% endraw %}` is text.
 * The caller has already turned \r\n into \n and removed one trailing newline
 * (keep_trailing_newline). */
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "text/jinja_ast.h"

typedef struct lexer {
  lm_jarena *a;
  const char *s;
  size_t n, i;
  int line;
  size_t line_start;
  lm_jtoks *out;
  const lm_jlex_opts *o;
} lexer;

static void advance(lexer *L, size_t to) {
  for (; L->i < to; L->i++)
    if (L->s[L->i] == '\n') L->line++, L->line_start = L->i + 1;
}

static lm_status lex_err(const lexer *L, size_t pos, const char *msg) {
  int line = L->line;
  size_t ls = L->line_start;
  for (size_t k = L->i; k < pos && k < L->n; k++)
    if (L->s[k] == '\n') line++, ls = k + 1;
  return LM_ERRF(LM_ERR_CORRUPT, "template syntax error at line %d col %d: %s", line,
                 (int)(pos - ls) + 1, msg);
}

static lm_status emit(lexer *L, lm_jtok_type type, size_t pos, const char *s, size_t n,
                      lm_jv value) {
  lm_jtoks *t = L->out;
  if (t->n == t->cap) {
    size_t cap = t->cap ? t->cap * 2 : 256;
    lm_jtok *v = realloc(t->v, cap * sizeof *v);
    if (!v) return LM_ERRF(LM_ERR_NOMEM, "out of memory (tokens)");
    t->v = v, t->cap = cap;
  }
  lm_jtok *k = &t->v[t->n++];
  k->type = type;
  k->s = s, k->n = n, k->value = value;
  int line = L->line;
  size_t ls = L->line_start;
  for (size_t q = L->i; q < pos && q < L->n; q++)
    if (L->s[q] == '\n') line++, ls = q + 1;
  k->line = line;
  k->col = (int)(pos - ls) + 1;
  return LM_OK;
}

/* ---- literals ------------------------------------------------------------------------------- */

static int hexval(char c) {
  return c >= '0' && c <= '9'   ? c - '0'
         : c >= 'a' && c <= 'f' ? c - 'a' + 10
         : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                : -1;
}

/* Python "unicode-escape" decoding of a literal body, as jinja2 applies it to string tokens. */
static lm_status unescape(lexer *L, const char *s, size_t n, lm_jv *out) {
  lm_jbuf b = {0};
  lm_status st = LM_OK;
  for (size_t i = 0; i < n && st == LM_OK; i++) {
    if (s[i] != '\\' || i + 1 >= n) {
      st = lm_jbuf_putc(&b, s[i]);
      continue;
    }
    char e = s[++i];
    int width = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
    const char *simple = strchr("nrtabfv\\'\"", e);
    if (e && simple) {
      static const char map[] = "\n\r\t\a\b\f\v\\'\"";
      st = lm_jbuf_putc(&b, map[simple - "nrtabfv\\'\""]);
    } else if (e == '\n') { /* line continuation */
    } else if (e >= '0' && e <= '7') {
      unsigned v = 0;
      size_t k = 0;
      for (; k < 3 && i + k < n && s[i + k] >= '0' && s[i + k] <= '7'; k++)
        v = v * 8 + (unsigned)(s[i + k] - '0');
      i += k - 1;
      char enc[4];
      st = lm_jbuf_put(&b, enc, lm_jutf8_put(v, enc));
    } else if (width) {
      uint32_t v = 0;
      size_t k = 0;
      for (; k < (size_t)width && i + 1 + k < n && hexval(s[i + 1 + k]) >= 0; k++)
        v = v * 16 + (uint32_t)hexval(s[i + 1 + k]);
      if (k != (size_t)width || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) {
        lm_jbuf_free(&b);
        return lex_err(L, L->i, "bad escape in string literal");
      }
      i += k;
      char enc[4];
      st = lm_jbuf_put(&b, enc, lm_jutf8_put(v, enc));
    } else { /* unknown escapes stay as written, as in Python */
      st = lm_jbuf_putc(&b, '\\');
      if (st == LM_OK) st = lm_jbuf_putc(&b, e);
    }
  }
  if (st == LM_OK) st = lm_jv_str(L->a, b.data ? b.data : "", b.len, out);
  lm_jbuf_free(&b);
  return st;
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }
static int is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
static int is_name_char(char c) { return is_name_start(c) || is_digit(c); }

static lm_status lex_number(lexer *L, size_t p, size_t *end) {
  size_t j = p;
  int is_float = 0;
  while (j < L->n &&
         (is_digit(L->s[j]) || (L->s[j] == '_' && j + 1 < L->n && is_digit(L->s[j + 1]))))
    j++;
  if (j + 1 < L->n && L->s[j] == '.' && is_digit(L->s[j + 1])) {
    is_float = 1;
    j++;
    while (j < L->n && (is_digit(L->s[j]) || L->s[j] == '_'))
      j++;
  }
  if (j < L->n && (L->s[j] == 'e' || L->s[j] == 'E')) {
    size_t k = j + 1;
    if (k < L->n && (L->s[k] == '+' || L->s[k] == '-')) k++;
    if (k < L->n && is_digit(L->s[k])) {
      is_float = 1;
      j = k;
      while (j < L->n && is_digit(L->s[j]))
        j++;
    }
  }
  char buf[128];
  size_t m = 0;
  for (size_t k = p; k < j && m + 1 < sizeof buf; k++)
    if (L->s[k] != '_') buf[m++] = L->s[k];
  buf[m] = '\0';
  if (j - p >= sizeof buf) return lex_err(L, p, "number literal too long");
  lm_jv v;
  if (is_float) {
    v = lm_jv_float(strtod(buf, NULL));
  } else {
    int64_t x = 0;
    int big = 0;
    for (size_t k = 0; k < m; k++) {
      int d = buf[k] - '0';
      if (x > (INT64_MAX - d) / 10)
        big = 1;
      else
        x = x * 10 + d;
    }
    if (big) {
      LM_TRY(lm_jv_str(L->a, buf, m, &v));
      v.kind = LM_JV_BIGINT;
    } else {
      v = lm_jv_int(x);
    }
  }
  *end = j;
  return emit(L, is_float ? LM_JT_FLOAT : LM_JT_INT, p, L->s + p, j - p, v);
}

/* ---- tags ----------------------------------------------------------------------------------- */

static const char *const OPS[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*",
                                  "/",  "%",  "~",  "<",  ">",  "(",  ")", "[", "]",
                                  "{",  "}",  ",",  ".",  ":",  "|",  "=", ";"};

/* Tokenizes the inside of a {{ }} or {% %} tag starting at L->i; stops after the closing delimiter
 * and reports the strip sign ('-', '+' or 0) that preceded it. */
static lm_status lex_tag(lexer *L, int is_block, char *end_sign) {
  int depth = 0;
  const char close = is_block ? '%' : '}';
  for (;;) {
    size_t p = L->i;
    while (p < L->n && (L->s[p] == ' ' || L->s[p] == '\t' || L->s[p] == '\n' || L->s[p] == '\r'))
      p++;
    advance(L, p);
    if (p >= L->n)
      return lex_err(L, p, is_block ? "unclosed block tag (missing '%}')" : "unclosed '{{'");
    const char *c = L->s + p;
    if (depth == 0) {
      int sign = (c[0] == '-' || (is_block && c[0] == '+')) ? 1 : 0;
      if (p + (size_t)sign + 1 < L->n && c[sign] == close && c[sign + 1] == '}') {
        *end_sign = sign ? c[0] : 0;
        LM_TRY(emit(L, is_block ? LM_JT_BLOCK_END : LM_JT_VAR_END, p, c, 0, lm_jv_undef()));
        advance(L, p + (size_t)sign + 2);
        return LM_OK;
      }
    }
    size_t end = p;
    if (is_name_start(c[0])) {
      while (end < L->n && is_name_char(L->s[end]))
        end++;
      LM_TRY(emit(L, LM_JT_NAME, p, c, end - p, lm_jv_undef()));
    } else if (is_digit(c[0])) {
      LM_TRY(lex_number(L, p, &end));
    } else if (c[0] == '\'' || c[0] == '"') {
      end = p + 1;
      while (end < L->n && L->s[end] != c[0])
        end += L->s[end] == '\\' && end + 1 < L->n ? 2 : 1;
      if (end >= L->n) return lex_err(L, p, "unterminated string literal");
      lm_jv v;
      LM_TRY(unescape(L, c + 1, end - p - 1, &v));
      LM_TRY(emit(L, LM_JT_STRING, p, c, end + 1 - p, v));
      end++;
    } else {
      size_t k, m = 0;
      for (k = 0; k < sizeof OPS / sizeof *OPS; k++) {
        m = strlen(OPS[k]);
        if (p + m <= L->n && memcmp(c, OPS[k], m) == 0) break;
      }
      if (k == sizeof OPS / sizeof *OPS) return lex_err(L, p, "unexpected character");
      if (strchr("([{", c[0]) && m == 1) depth++;
      if (strchr(")]}", c[0]) && m == 1 && --depth < 0) return lex_err(L, p, "unbalanced bracket");
      LM_TRY(emit(L, LM_JT_OP, p, OPS[k], m, lm_jv_undef()));
      end = p + m;
    }
    advance(L, end);
  }
}

/* Python whitespace after pos (for "-%}"). */
static size_t skip_ws(const lexer *L, size_t p) { return p + lm_py_lspace(L->s + p, L->n - p); }

/* Finds the next "{{", "{%" or "{#" at or after p; returns L->n if none. */
static size_t next_tag(const lexer *L, size_t p) {
  for (;;) {
    const char *q = memchr(L->s + p, '{', L->n - p);
    if (!q) return L->n;
    size_t k = (size_t)(q - L->s);
    if (k + 1 < L->n && (q[1] == '{' || q[1] == '%' || q[1] == '#')) return k;
    p = k + 1;
  }
}

/* Emits the text s[from..to), cut on the right by the next tag's whitespace control. */
static lm_status emit_data(lexer *L, size_t from, size_t to, int line_starting) {
  size_t end = to;
  if (to < L->n) {
    char kind = L->s[to + 1], sign = to + 2 < L->n ? L->s[to + 2] : 0;
    if (sign == '-') {
      end = from + (to - from) - lm_py_rspace(L->s + from, to - from);
    } else if (sign != '+' && kind != '{' && L->o->lstrip_blocks) {
      size_t l = to;
      while (l > from && L->s[l - 1] != '\n')
        l--;
      int all_ws = l < to && lm_py_lspace(L->s + l, to - l) == to - l;
      if ((l > from || line_starting) && all_ws) end = l;
    }
  }
  if (end > from) LM_TRY(emit(L, LM_JT_DATA, from, L->s + from, end - from, lm_jv_undef()));
  advance(L, to);
  return LM_OK;
}

/* After `{% raw %}`: everything up to `{% endraw %}` is one text token. */
static lm_status lex_raw(lexer *L, int *line_starting) {
  for (size_t p = L->i;;) {
    size_t t = next_tag(L, p);
    if (t >= L->n) return lex_err(L, L->i, "missing {% endraw %}");
    size_t q = t + 2;
    if (L->s[t + 1] == '%') {
      if (q < L->n && (L->s[q] == '-' || L->s[q] == '+')) q++;
      while (q < L->n && (L->s[q] == ' ' || L->s[q] == '\t' || L->s[q] == '\n'))
        q++;
      if (L->n - q >= 6 && memcmp(L->s + q, "endraw", 6) == 0) {
        q += 6;
        while (q < L->n && (L->s[q] == ' ' || L->s[q] == '\t' || L->s[q] == '\n'))
          q++;
        char sign = 0;
        if (q < L->n && (L->s[q] == '-' || L->s[q] == '+')) sign = L->s[q++];
        if (q + 1 < L->n && L->s[q] == '%' && L->s[q + 1] == '}') {
          LM_TRY(emit_data(L, L->i, t, *line_starting));
          q += 2;
          if (sign == '-')
            q = skip_ws(L, q);
          else if (sign != '+' && L->o->trim_blocks && q < L->n && L->s[q] == '\n')
            q++;
          *line_starting = L->s[q - 1] == '\n';
          advance(L, q);
          return LM_OK;
        }
      }
    }
    p = t + 2;
  }
}

lm_status lm_jinja_lex(lm_jarena *arena, const char *src, size_t len, const lm_jlex_opts *opts,
                       lm_jtoks *toks) {
  lexer L = {arena, src, len, 0, 1, 0, toks, opts};
  int line_starting = 1;
  while (L.i < L.n) {
    size_t t = next_tag(&L, L.i);
    LM_TRY(emit_data(&L, L.i, t, line_starting));
    if (t >= L.n) break;
    char kind = L.s[t + 1];
    size_t body = t + 2;
    if (body < L.n && (L.s[body] == '-' || (kind != '{' && L.s[body] == '+'))) body++;
    if (kind == '#') {
      const char *e = NULL;
      for (size_t p = body; p + 1 < L.n; p++)
        if (L.s[p] == '#' && L.s[p + 1] == '}') {
          e = L.s + p;
          break;
        }
      if (!e) return lex_err(&L, t, "unclosed comment (missing '#}')");
      size_t q = (size_t)(e - L.s) + 2;
      if (e > L.s + body && e[-1] == '-')
        q = skip_ws(&L, q);
      else if (!(e > L.s + body && e[-1] == '+') && opts->trim_blocks && q < L.n && L.s[q] == '\n')
        q++;
      line_starting = L.s[q - 1] == '\n';
      advance(&L, q);
      continue;
    }
    int is_block = kind == '%';
    LM_TRY(emit(&L, is_block ? LM_JT_BLOCK_BEGIN : LM_JT_VAR_BEGIN, t, L.s + t, 2, lm_jv_undef()));
    advance(&L, body);
    size_t first = toks->n;
    char sign = 0;
    LM_TRY(lex_tag(&L, is_block, &sign));
    size_t q = L.i;
    if (sign == '-')
      q = skip_ws(&L, q);
    else if (is_block && sign != '+' && opts->trim_blocks && q < L.n && L.s[q] == '\n')
      q++;
    line_starting = q > 0 && L.s[q - 1] == '\n';
    advance(&L, q);
    if (is_block && toks->n == first + 2 && toks->v[first].type == LM_JT_NAME &&
        toks->v[first].n == 3 && memcmp(toks->v[first].s, "raw", 3) == 0) {
      toks->n = first - 1; /* drop {% raw %} itself */
      LM_TRY(lex_raw(&L, &line_starting));
    }
  }
  return emit(&L, LM_JT_EOF, L.n, L.s + L.n, 0, lm_jv_undef());
}
