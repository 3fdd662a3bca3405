/* gbnf.c — llama.cpp's GBNF → grammar IR.
 *
 *   rule     ::= name "::=" alternatives          (a rule ends at the end of its line)
 *   alts     ::= sequence ("|" sequence)*         (a newline may follow "::=" and "|")
 *   sequence ::= (item postfix*)*                 (newlines allowed only inside parentheses)
 *   item     ::= "literal" | [class] | [^class] | . | name | "(" alts ")"
 *   postfix  ::= * | + | ? | {m} | {m,} | {m,n}
 * Comments run from # to the end of the line. Literals and classes are Unicode (UTF-8 in the
 * text; escapes \n \r \t \\ \" \[ \] \- \xHH \uHHHH \UHHHHHHHH); "." is any character. The start
 * rule is "root". Errors name the line and column (1-based). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "base/status.h"
#include "grammar/grammar_ir.h"
#include "grammar/grammar_utf8.h"
#include "text/utf8.h"

#define GBNF_MAX_DEPTH 128
#define GBNF_MAX_COUNT 1000000u

typedef struct sym {
  char *name;
  int32_t rule;
  int defined;
  size_t use; /* offset of the first reference, for "undefined rule" */
} sym;

typedef struct gp {
  const char *s;
  size_t n, i;
  lm_gir *b;
  sym *syms;
  uint32_t n_syms, cap_syms;
  uint32_t *slot; /* name hash table: sym index + 1 */
  uint32_t slot_mask;
  int depth;
  uint32_t anon;
} gp;

static lm_status perr(const gp *p, size_t at, const char *fmt, ...) LM_PRINTF(3, 4);
static lm_status perr(const gp *p, size_t at, const char *fmt, ...) {
  int line = 1, col = 1;
  for (size_t k = 0; k < at && k < p->n; k++) {
    if (p->s[k] == '\n')
      line++, col = 1;
    else
      col++;
  }
  char msg[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return LM_ERRF(LM_ERR_INVALID, "gbnf:%d:%d: %s", line, col, msg);
}

static int at_end(const gp *p) { return p->i >= p->n; }
static char cur(const gp *p) { return p->i < p->n ? p->s[p->i] : '\0'; }

static int name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_';
}

/* Skips blanks and comments; newlines too when `nl`. */
static void skip(gp *p, int nl) {
  while (!at_end(p)) {
    char c = cur(p);
    if (c == ' ' || c == '\t' || (nl && (c == '\n' || c == '\r'))) {
      p->i++;
    } else if (c == '#') {
      while (!at_end(p) && cur(p) != '\n')
        p->i++;
    } else {
      break;
    }
  }
}

/* ---- symbols ------------------------------------------------------------------------------ */

static uint64_t name_hash(const char *s, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; i++)
    h = (h ^ (uint8_t)s[i]) * 0x100000001b3ull;
  return lm_mix64(h);
}

static lm_status sym_rehash(gp *p) {
  uint32_t n = p->slot_mask ? (p->slot_mask + 1) * 2 : 64;
  uint32_t *slot = calloc(n, sizeof *slot);
  if (!slot) return LM_ERRF(LM_ERR_NOMEM, "gbnf: out of memory");
  for (uint32_t k = 0; k < p->n_syms; k++) {
    uint32_t h = (uint32_t)name_hash(p->syms[k].name, strlen(p->syms[k].name)) & (n - 1);
    while (slot[h])
      h = (h + 1) & (n - 1);
    slot[h] = k + 1;
  }
  free(p->slot);
  p->slot = slot;
  p->slot_mask = n - 1;
  return LM_OK;
}

/* The symbol for name s[0..n), made (with its rule) on first sight. */
static lm_status sym_get(gp *p, const char *s, size_t n, size_t at, sym **out) {
  if (!p->slot) LM_TRY(sym_rehash(p));
  uint32_t h = (uint32_t)name_hash(s, n) & p->slot_mask;
  for (; p->slot[h]; h = (h + 1) & p->slot_mask) {
    sym *y = &p->syms[p->slot[h] - 1];
    if (strlen(y->name) == n && !memcmp(y->name, s, n)) {
      *out = y;
      return LM_OK;
    }
  }
  if (p->n_syms == p->cap_syms) {
    uint32_t c = p->cap_syms ? p->cap_syms * 2 : 32;
    sym *q = realloc(p->syms, c * sizeof *q);
    if (!q) return LM_ERRF(LM_ERR_NOMEM, "gbnf: out of memory");
    p->syms = q;
    p->cap_syms = c;
  }
  sym *y = &p->syms[p->n_syms];
  y->name = strndup(s, n);
  if (!y->name) return LM_ERRF(LM_ERR_NOMEM, "gbnf: out of memory");
  y->defined = 0;
  y->use = at;
  lm_status st = lm_gir_rule(p->b, y->name, &y->rule);
  if (st != LM_OK) {
    free(y->name);
    return st;
  }
  p->slot[h] = ++p->n_syms;
  if (p->n_syms * 2 > p->slot_mask) LM_TRY(sym_rehash(p));
  *out = &p->syms[p->n_syms - 1];
  return LM_OK;
}

/* ---- characters ----------------------------------------------------------------------------- */

static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* One character of a literal or class (an escape or a UTF-8 code point). */
static lm_status parse_char(gp *p, uint32_t *cp) {
  size_t at = p->i;
  if (at_end(p)) return perr(p, at, "unexpected end of input");
  if (cur(p) == '\\') {
    p->i++;
    char e = cur(p);
    p->i++;
    int digits = 0;
    switch (e) {
    case 'n': *cp = '\n'; return LM_OK;
    case 'r': *cp = '\r'; return LM_OK;
    case 't': *cp = '\t'; return LM_OK;
    case '\\':
    case '"':
    case '[':
    case ']':
    case '-':
    case '/':
    case '^': *cp = (uint8_t)e; return LM_OK;
    case 'x': digits = 2; break;
    case 'u': digits = 4; break;
    case 'U': digits = 8; break;
    default: return perr(p, at, "unknown escape '\\%.1s'", &p->s[at + 1 < p->n ? at + 1 : at]);
    }
    uint32_t v = 0;
    for (int k = 0; k < digits; k++) {
      int h = hexval(cur(p));
      if (h < 0 || at_end(p)) return perr(p, p->i, "expected %d hex digits", digits);
      v = v * 16 + (uint32_t)h;
      p->i++;
    }
    if (v > LM_CP_MAX || (v >= 0xD800 && v <= 0xDFFF))
      return perr(p, at, "escape is not a Unicode scalar value");
    *cp = v;
    return LM_OK;
  }
  int32_t c;
  size_t len = lm_utf8_next(p->s + p->i, p->n - p->i, &c);
  if (c < 0) return perr(p, at, "invalid UTF-8");
  *cp = (uint32_t)c;
  p->i += len;
  return LM_OK;
}

static lm_status parse_literal(gp *p, lm_gseq *q) {
  size_t at = p->i++;
  while (cur(p) != '"') {
    if (at_end(p) || cur(p) == '\n') return perr(p, at, "unterminated literal");
    uint32_t cp;
    LM_TRY(parse_char(p, &cp));
    char u[4];
    LM_TRY(lm_gseq_lit(p->b, q, u, lm_utf8_encode(cp, u)));
  }
  p->i++;
  return LM_OK;
}

static lm_status class_to_seq(gp *p, lm_cpset *set, size_t at, lm_gseq *q) {
  lm_status s = lm_cpset_normalize(set);
  if (s == LM_OK && set->n == 0) s = perr(p, at, "character class matches nothing");
  char name[48];
  snprintf(name, sizeof name, "class-%u", p->anon++);
  if (s == LM_OK) s = lm_gutf8_class(p->b, q, set, name);
  return s;
}

static lm_status parse_class(gp *p, lm_gseq *q) {
  size_t at = p->i++;
  int neg = cur(p) == '^';
  if (neg) p->i++;
  lm_cpset set = {0};
  lm_status s = LM_OK;
  while (s == LM_OK && cur(p) != ']') {
    if (at_end(p) || cur(p) == '\n') {
      s = perr(p, at, "unterminated character class");
      break;
    }
    uint32_t lo, hi;
    s = parse_char(p, &lo);
    hi = lo;
    if (s == LM_OK && cur(p) == '-' && p->i + 1 < p->n && p->s[p->i + 1] != ']') {
      p->i++;
      size_t rat = p->i;
      s = parse_char(p, &hi);
      if (s == LM_OK && hi < lo) s = perr(p, rat, "range end before its start");
    }
    if (s == LM_OK) s = lm_cpset_add(&set, lo, hi);
  }
  if (s == LM_OK) {
    p->i++;
    if (neg) s = lm_cpset_negate(&set);
  }
  if (s == LM_OK) s = class_to_seq(p, &set, at, q);
  lm_cpset_free(&set);
  return s;
}

static lm_status parse_dot(gp *p, lm_gseq *q) {
  size_t at = p->i++;
  lm_cpset set = {0};
  lm_status s = lm_cpset_add(&set, 0, LM_CP_MAX);
  if (s == LM_OK) s = class_to_seq(p, &set, at, q);
  lm_cpset_free(&set);
  return s;
}

/* ---- structure ----------------------------------------------------------------------------- */

static lm_status parse_alts(gp *p, int32_t rule);

static lm_status parse_count(gp *p, uint32_t *v) {
  size_t at = p->i;
  if (cur(p) < '0' || cur(p) > '9') return perr(p, at, "expected a number");
  uint64_t x = 0;
  while (cur(p) >= '0' && cur(p) <= '9' && !at_end(p)) {
    x = x * 10 + (uint64_t)(cur(p) - '0');
    if (x > GBNF_MAX_COUNT) return perr(p, at, "repetition count too large");
    p->i++;
  }
  *v = (uint32_t)x;
  return LM_OK;
}

/* Applies a postfix operator to the item q (which becomes [REPEAT body]). */
static lm_status apply_postfix(gp *p, lm_gseq *q, uint32_t min, uint32_t max) {
  int32_t body;
  if (q->n == 1 && q->e[0].kind == LM_GK_REF) {
    body = (int32_t)q->e[0].arg;
    q->n = 0;
  } else {
    char name[48];
    snprintf(name, sizeof name, "repeat-%u", p->anon++);
    LM_TRY(lm_gir_wrap(p->b, name, q, &body));
  }
  return lm_gseq_repeat(p->b, q, body, min, max);
}

static lm_status parse_postfix(gp *p, lm_gseq *q) {
  for (;;) {
    char c = cur(p);
    size_t at = p->i;
    uint32_t min, max;
    if (c == '*')
      min = 0, max = LM_G_INF, p->i++;
    else if (c == '+')
      min = 1, max = LM_G_INF, p->i++;
    else if (c == '?')
      min = 0, max = 1, p->i++;
    else if (c == '{') {
      p->i++;
      skip(p, 0);
      LM_TRY(parse_count(p, &min));
      skip(p, 0);
      max = min;
      if (cur(p) == ',') {
        p->i++;
        skip(p, 0);
        max = LM_G_INF;
        if (cur(p) != '}') LM_TRY(parse_count(p, &max));
        skip(p, 0);
      }
      if (cur(p) != '}') return perr(p, p->i, "expected '}'");
      p->i++;
      if (max < min) return perr(p, at, "repetition {m,n} with n < m");
    } else {
      return LM_OK;
    }
    LM_TRY(apply_postfix(p, q, min, max));
  }
}

static lm_status parse_group(gp *p, lm_gseq *q) {
  size_t at = p->i++;
  if (++p->depth > GBNF_MAX_DEPTH) return perr(p, at, "parentheses nested too deeply");
  char name[48];
  snprintf(name, sizeof name, "group-%u", p->anon++);
  int32_t rule;
  LM_TRY(lm_gir_rule(p->b, name, &rule));
  skip(p, 1);
  LM_TRY(parse_alts(p, rule));
  skip(p, 1);
  if (cur(p) != ')') return perr(p, at, "unclosed '('");
  p->i++;
  p->depth--;
  return lm_gseq_ref(p->b, q, rule);
}

static lm_status parse_name_ref(gp *p, lm_gseq *q) {
  size_t at = p->i;
  while (!at_end(p) && name_char(cur(p)))
    p->i++;
  sym *y;
  LM_TRY(sym_get(p, p->s + at, p->i - at, at, &y));
  return lm_gseq_ref(p->b, q, y->rule);
}

/* One item with its postfix operators, appended to seq; *none when no item starts here. */
static lm_status parse_item(gp *p, lm_gseq *seq, int *none) {
  lm_gseq q = {0};
  char c = cur(p);
  lm_status s;
  *none = 0;
  if (c == '"')
    s = parse_literal(p, &q);
  else if (c == '[')
    s = parse_class(p, &q);
  else if (c == '.')
    s = parse_dot(p, &q);
  else if (c == '(')
    s = parse_group(p, &q);
  else if (name_char(c))
    s = parse_name_ref(p, &q);
  else {
    *none = 1;
    return LM_OK;
  }
  if (s == LM_OK) s = parse_postfix(p, &q);
  if (s == LM_OK) s = lm_gseq_cat(p->b, seq, &q);
  lm_gseq_free(&q);
  return s;
}

static lm_status parse_seq(gp *p, int32_t rule) {
  lm_gseq seq = {0};
  lm_status s = LM_OK;
  for (;;) {
    skip(p, p->depth > 0);
    int none;
    s = parse_item(p, &seq, &none);
    if (s != LM_OK || none) break;
    /* A name followed by "::=" is the next rule: the line break before it is missing. */
  }
  if (s == LM_OK) s = lm_gir_add_alt(p->b, rule, &seq);
  lm_gseq_free(&seq);
  return s;
}

static lm_status parse_alts(gp *p, int32_t rule) {
  LM_TRY(parse_seq(p, rule));
  while (cur(p) == '|') {
    p->i++;
    skip(p, 1);
    LM_TRY(parse_seq(p, rule));
  }
  return LM_OK;
}

static lm_status parse_rule(gp *p) {
  size_t at = p->i;
  while (!at_end(p) && name_char(cur(p)))
    p->i++;
  if (p->i == at) return perr(p, at, "expected a rule name");
  sym *y;
  LM_TRY(sym_get(p, p->s + at, p->i - at, at, &y));
  if (y->defined) return perr(p, at, "rule '%s' is defined twice", y->name);
  y->defined = 1;
  int32_t rule = y->rule;
  skip(p, 0);
  if (p->i + 3 > p->n || memcmp(p->s + p->i, "::=", 3) != 0)
    return perr(p, p->i, "expected '::=' after the rule name");
  p->i += 3;
  skip(p, 1);
  LM_TRY(parse_alts(p, rule));
  skip(p, 0);
  if (!at_end(p) && cur(p) != '\n' && cur(p) != '\r') {
    char c[2] = {cur(p), 0};
    return perr(p, p->i, "unexpected '%s' (a rule ends at the end of its line)", c);
  }
  return LM_OK;
}

static lm_status parse_all(gp *p, int32_t *root) {
  skip(p, 1);
  while (!at_end(p)) {
    LM_TRY(parse_rule(p));
    skip(p, 1);
  }
  for (uint32_t k = 0; k < p->n_syms; k++)
    if (!p->syms[k].defined) return perr(p, p->syms[k].use, "undefined rule '%s'", p->syms[k].name);
  for (uint32_t k = 0; k < p->n_syms; k++)
    if (!strcmp(p->syms[k].name, "root")) {
      *root = p->syms[k].rule;
      return LM_OK;
    }
  return LM_ERRF(LM_ERR_INVALID, "gbnf: no rule named 'root'");
}

lm_status lm_grammar_from_gbnf(const char *text, size_t len, lm_grammar **out) {
  if (!out || (!text && len)) return LM_ERRF(LM_ERR_INVALID, "gbnf: NULL argument");
  gp p = {.s = text ? text : "", .n = len};
  if (memchr(p.s, '\0', len)) {
    size_t at = (size_t)((const char *)memchr(p.s, '\0', len) - p.s);
    return perr(&p, at, "NUL byte in the grammar");
  }
  lm_status s = lm_gir_create(&p.b);
  if (s != LM_OK) return s;
  int32_t root = -1;
  s = parse_all(&p, &root);
  if (s == LM_OK) s = lm_gir_finish(p.b, root, out);
  for (uint32_t k = 0; k < p.n_syms; k++)
    free(p.syms[k].name);
  free(p.syms);
  free(p.slot);
  lm_gir_free(p.b);
  return s;
}
