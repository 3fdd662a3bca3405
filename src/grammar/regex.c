/* regex.c — a recursive-descent parser of the pattern subset (regex.h) that builds IR directly:
 * an alternation is a rule, a quantified atom a REPEAT of a rule, a character set one element
 * (lm_json_char_class). Nesting is bounded, so a hostile pattern cannot exhaust the stack. */
#include "grammar/regex.h"

#include "text/utf8.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"

#define RX_MAX_DEPTH 64
#define RX_MAX_COUNT 100000u

typedef struct rx {
  const char *s;
  size_t n, i;
  lm_gir *b;
  const char *name;
  int depth;
  uint32_t anon;
} rx;

static lm_status rx_err(const rx *r, lm_status code, const char *what) {
  return LM_ERRF(code, "pattern: %s at offset %zu", what, r->i);
}

static int rx_end(const rx *r) { return r->i >= r->n; }
static char rx_cur(const rx *r) { return r->i < r->n ? r->s[r->i] : '\0'; }

static lm_status add_escape_alt(lm_gir *b, int32_t rule, uint32_t cp) {
  char lit[8];
  int n;
  switch (cp) {
  case '"': n = snprintf(lit, sizeof lit, "\\\""); break;
  case '\\': n = snprintf(lit, sizeof lit, "\\\\"); break;
  case '\b': n = snprintf(lit, sizeof lit, "\\b"); break;
  case '\f': n = snprintf(lit, sizeof lit, "\\f"); break;
  case '\n': n = snprintf(lit, sizeof lit, "\\n"); break;
  case '\r': n = snprintf(lit, sizeof lit, "\\r"); break;
  case '\t': n = snprintf(lit, sizeof lit, "\\t"); break;
  default: n = snprintf(lit, sizeof lit, "\\u%04x", cp); break;
  }
  lm_gseq q = {0};
  lm_status s = lm_gseq_lit(b, &q, lit, (size_t)n);
  if (s == LM_OK) s = lm_gir_add_alt(b, rule, &q);
  lm_gseq_free(&q);
  return s;
}

static int needs_escape(uint32_t cp) { return cp < 0x20 || cp == '"' || cp == '\\'; }

lm_status lm_json_char_class(lm_gir *b, lm_gseq *s, const lm_cpset *cps, const char *name) {
  lm_cpset raw = {0};
  uint32_t esc[34];
  int n_esc = 0;
  lm_status st = LM_OK;
  for (size_t i = 0; i < cps->n && st == LM_OK; i++) {
    uint32_t lo = cps->r[i].lo, hi = cps->r[i].hi;
    for (uint32_t c = lo; c <= hi && c < 0x5d; c++)
      if (needs_escape(c)) esc[n_esc++] = c;
    /* The raw part: the range minus what needs escaping (all of it below 0x5d). */
    static const uint32_t keep[3][2] = {{0x20, 0x21}, {0x23, 0x5b}, {0x5d, LM_CP_MAX}};
    for (int k = 0; k < 3 && st == LM_OK; k++) {
      uint32_t a = lo > keep[k][0] ? lo : keep[k][0], z = hi < keep[k][1] ? hi : keep[k][1];
      if (a <= z) st = lm_cpset_add(&raw, a, z);
    }
  }
  if (st == LM_OK) st = lm_cpset_normalize(&raw);
  if (st == LM_OK && n_esc == 0) st = lm_gutf8_class(b, s, &raw, name);
  if (st == LM_OK && n_esc > 0) {
    int32_t rule;
    st = lm_gir_rule(b, name, &rule);
    if (st == LM_OK && raw.n) {
      lm_gseq q = {0};
      st = lm_gutf8_class(b, &q, &raw, name);
      if (st == LM_OK) st = lm_gir_add_alt(b, rule, &q);
      lm_gseq_free(&q);
    }
    for (int k = 0; k < n_esc && st == LM_OK; k++)
      st = add_escape_alt(b, rule, esc[k]);
    if (st == LM_OK) st = lm_gseq_ref(b, s, rule);
  }
  lm_cpset_free(&raw);
  return st;
}

/* ---- character sets --------------------------------------------------------------------- */

static lm_status add_class_d(lm_cpset *s) { return lm_cpset_add(s, '0', '9'); }

static lm_status add_class_w(lm_cpset *s) {
  LM_TRY(lm_cpset_add(s, '0', '9'));
  LM_TRY(lm_cpset_add(s, 'A', 'Z'));
  LM_TRY(lm_cpset_add(s, 'a', 'z'));
  return lm_cpset_add(s, '_', '_');
}

static lm_status add_class_s(lm_cpset *s) {
  static const uint32_t sp[][2] = {
      {0x09, 0x0d},     {0x20, 0x20},     {0xa0, 0xa0},     {0x1680, 0x1680}, {0x2000, 0x200a},
      {0x2028, 0x2029}, {0x202f, 0x202f}, {0x205f, 0x205f}, {0x3000, 0x3000}, {0xfeff, 0xfeff}};
  for (size_t i = 0; i < sizeof sp / sizeof *sp; i++)
    LM_TRY(lm_cpset_add(s, sp[i][0], sp[i][1]));
  return LM_OK;
}

/* Adds the class escape \d \w \s (negated for upper case) to s; *done 0 when c is none. */
static lm_status class_escape(char c, lm_cpset *s, int *done) {
  lm_cpset t = {0};
  lm_status st = LM_OK;
  *done = 1;
  switch (c) {
  case 'd':
  case 'D': st = add_class_d(&t); break;
  case 'w':
  case 'W': st = add_class_w(&t); break;
  case 's':
  case 'S': st = add_class_s(&t); break;
  default: *done = 0; return LM_OK;
  }
  if (st == LM_OK && (c == 'D' || c == 'W' || c == 'S')) st = lm_cpset_negate(&t);
  for (size_t i = 0; i < t.n && st == LM_OK; i++)
    st = lm_cpset_add(s, t.r[i].lo, t.r[i].hi);
  lm_cpset_free(&t);
  return st;
}

static int hexv(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

static lm_status hex_digits(rx *r, int n, uint32_t *v) {
  *v = 0;
  for (int k = 0; k < n; k++) {
    int h = hexv(rx_cur(r));
    if (h < 0 || rx_end(r)) return rx_err(r, LM_ERR_INVALID, "expected a hex digit");
    *v = *v * 16 + (uint32_t)h;
    r->i++;
  }
  return LM_OK;
}

/* A single-character escape after the backslash (the backslash already consumed). */
static lm_status char_escape(rx *r, uint32_t *cp) {
  char c = rx_cur(r);
  if (rx_end(r)) return rx_err(r, LM_ERR_INVALID, "pattern ends with a backslash");
  r->i++;
  switch (c) {
  case 't': *cp = '\t'; return LM_OK;
  case 'n': *cp = '\n'; return LM_OK;
  case 'r': *cp = '\r'; return LM_OK;
  case 'f': *cp = '\f'; return LM_OK;
  case 'v': *cp = '\v'; return LM_OK;
  case '0': *cp = 0; return LM_OK;
  case 'x': return hex_digits(r, 2, cp);
  case 'u':
    if (rx_cur(r) == '{') {
      r->i++;
      uint32_t v = 0;
      int nd = 0;
      while (hexv(rx_cur(r)) >= 0 && nd < 7)
        v = v * 16 + (uint32_t)hexv(r->s[r->i++]), nd++;
      if (rx_cur(r) != '}' || nd == 0) return rx_err(r, LM_ERR_INVALID, "bad \\u{...} escape");
      r->i++;
      *cp = v;
    } else {
      LM_TRY(hex_digits(r, 4, cp));
    }
    if (*cp > LM_CP_MAX || (*cp >= 0xD800 && *cp <= 0xDFFF))
      return rx_err(r, LM_ERR_UNSUPPORTED, "a surrogate or out-of-range \\u escape");
    return LM_OK;
  case 'b':
  case 'B': return rx_err(r, LM_ERR_UNSUPPORTED, "word boundaries (\\b, \\B) are not supported");
  case 'p':
  case 'P': return rx_err(r, LM_ERR_UNSUPPORTED, "Unicode property classes are not supported");
  case 'k': return rx_err(r, LM_ERR_UNSUPPORTED, "backreferences are not supported");
  case 'c': return rx_err(r, LM_ERR_UNSUPPORTED, "control escapes (\\c) are not supported");
  default:
    if (c >= '1' && c <= '9')
      return rx_err(r, LM_ERR_UNSUPPORTED, "backreferences are not supported");
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
      return rx_err(r, LM_ERR_INVALID, "unknown escape");
    *cp = (uint8_t)c; /* escaped punctuation stands for itself */
    return LM_OK;
  }
}

static lm_status literal_cp(rx *r, uint32_t *cp) {
  int32_t c;
  size_t len = lm_utf8_next(r->s + r->i, r->n - r->i, &c);
  if (c < 0) return rx_err(r, LM_ERR_INVALID, "invalid UTF-8");
  *cp = (uint32_t)c;
  r->i += len;
  return LM_OK;
}

/* One class member's character: *set_done when it was a class escape added to s. */
static lm_status class_char(rx *r, lm_cpset *s, uint32_t *cp, int *set_done) {
  *set_done = 0;
  if (rx_cur(r) == '\\') {
    r->i++;
    LM_TRY(class_escape(rx_cur(r), s, set_done));
    if (*set_done) {
      r->i++;
      return LM_OK;
    }
    if (rx_cur(r) == 'b') { /* inside a class \b is the backspace */
      r->i++;
      *cp = '\b';
      return LM_OK;
    }
    return char_escape(r, cp);
  }
  return literal_cp(r, cp);
}

static lm_status parse_class(rx *r, lm_cpset *s) {
  r->i++;
  int neg = rx_cur(r) == '^';
  if (neg) r->i++;
  while (rx_cur(r) != ']') {
    if (rx_end(r)) return rx_err(r, LM_ERR_INVALID, "unterminated character class");
    uint32_t lo, hi;
    int set_done;
    LM_TRY(class_char(r, s, &lo, &set_done));
    if (set_done) continue;
    hi = lo;
    if (rx_cur(r) == '-' && r->i + 1 < r->n && r->s[r->i + 1] != ']') {
      r->i++;
      int hd;
      LM_TRY(class_char(r, s, &hi, &hd));
      if (hd) return rx_err(r, LM_ERR_INVALID, "a class escape cannot end a range");
      if (hi < lo) return rx_err(r, LM_ERR_INVALID, "range end before its start");
    }
    LM_TRY(lm_cpset_add(s, lo, hi));
  }
  r->i++;
  return neg ? lm_cpset_negate(s) : lm_cpset_normalize(s);
}

static lm_status emit_set(rx *r, lm_cpset *set, lm_gseq *q) {
  LM_TRY(lm_cpset_normalize(set));
  if (set->n == 0) return rx_err(r, LM_ERR_INVALID, "a character class that matches nothing");
  char name[96];
  snprintf(name, sizeof name, "%s-char-%u", r->name, r->anon++);
  return lm_json_char_class(r->b, q, set, name);
}

/* ---- structure ----------------------------------------------------------------------------- */

static lm_status parse_alt(rx *r, int32_t rule);

static lm_status parse_group(rx *r, lm_gseq *q) {
  r->i++;
  if (++r->depth > RX_MAX_DEPTH) return rx_err(r, LM_ERR_UNSUPPORTED, "groups nested too deeply");
  if (rx_cur(r) == '?') {
    r->i++;
    char c = rx_cur(r);
    if (c == ':') {
      r->i++;
    } else if (c == '<' && r->i + 1 < r->n && r->s[r->i + 1] != '=' && r->s[r->i + 1] != '!') {
      while (!rx_end(r) && rx_cur(r) != '>')
        r->i++;
      if (rx_end(r)) return rx_err(r, LM_ERR_INVALID, "unterminated group name");
      r->i++;
    } else {
      return rx_err(r, LM_ERR_UNSUPPORTED, "lookaround and inline flags are not supported");
    }
  }
  char name[96];
  snprintf(name, sizeof name, "%s-group-%u", r->name, r->anon++);
  int32_t rule;
  LM_TRY(lm_gir_rule(r->b, name, &rule));
  LM_TRY(parse_alt(r, rule));
  if (rx_cur(r) != ')') return rx_err(r, LM_ERR_INVALID, "unclosed '('");
  r->i++;
  r->depth--;
  return lm_gseq_ref(r->b, q, rule);
}

/* One atom into q; *none when none starts here ('|', ')' or the end). */
static lm_status parse_atom(rx *r, lm_gseq *q, int *none) {
  char c = rx_cur(r);
  *none = 0;
  if (rx_end(r) || c == '|' || c == ')') {
    *none = 1;
    return LM_OK;
  }
  if (c == '(') return parse_group(r, q);
  if (c == '*' || c == '+' || c == '?' || c == '{')
    return rx_err(r, LM_ERR_INVALID, "a quantifier with nothing to repeat");
  if (c == '^' || c == '$')
    return rx_err(r, LM_ERR_UNSUPPORTED, "'^' and '$' are supported only at the pattern's ends");
  lm_cpset set = {0};
  lm_status s = LM_OK;
  if (c == '[') {
    s = parse_class(r, &set);
  } else if (c == '.') { /* anything but a line terminator */
    r->i++;
    s = lm_cpset_add(&set, '\n', '\n');
    if (s == LM_OK) s = lm_cpset_add(&set, '\r', '\r');
    if (s == LM_OK) s = lm_cpset_add(&set, 0x2028, 0x2029);
    if (s == LM_OK) s = lm_cpset_negate(&set);
  } else if (c == '\\') {
    r->i++;
    int done;
    s = class_escape(rx_cur(r), &set, &done);
    if (s == LM_OK && done) r->i++;
    uint32_t cp;
    if (s == LM_OK && !done && (s = char_escape(r, &cp)) == LM_OK) s = lm_cpset_add(&set, cp, cp);
  } else {
    uint32_t cp;
    s = literal_cp(r, &cp);
    if (s == LM_OK) s = lm_cpset_add(&set, cp, cp);
  }
  if (s == LM_OK) s = emit_set(r, &set, q);
  lm_cpset_free(&set);
  return s;
}

static lm_status parse_count(rx *r, uint32_t *v) {
  if (rx_cur(r) < '0' || rx_cur(r) > '9') return rx_err(r, LM_ERR_INVALID, "expected a number");
  uint64_t x = 0;
  while (!rx_end(r) && rx_cur(r) >= '0' && rx_cur(r) <= '9') {
    x = x * 10 + (uint64_t)(rx_cur(r) - '0');
    if (x > RX_MAX_COUNT) return rx_err(r, LM_ERR_UNSUPPORTED, "a repetition count over 100000");
    r->i++;
  }
  *v = (uint32_t)x;
  return LM_OK;
}

/* A quantifier after an atom, if any: *has 0 when there is none (a '{' that does not start a
 * valid quantifier is a literal in ECMA-262's web syntax; here it is an error to stay simple). */
static lm_status parse_quant(rx *r, uint32_t *min, uint32_t *max, int *has) {
  char c = rx_cur(r);
  *has = 1;
  if (c == '*')
    *min = 0, *max = LM_G_INF, r->i++;
  else if (c == '+')
    *min = 1, *max = LM_G_INF, r->i++;
  else if (c == '?')
    *min = 0, *max = 1, r->i++;
  else if (c == '{') {
    r->i++;
    LM_TRY(parse_count(r, min));
    *max = *min;
    if (rx_cur(r) == ',') {
      r->i++;
      *max = LM_G_INF;
      if (rx_cur(r) != '}') LM_TRY(parse_count(r, max));
    }
    if (rx_cur(r) != '}') return rx_err(r, LM_ERR_INVALID, "expected '}'");
    r->i++;
    if (*max < *min) return rx_err(r, LM_ERR_INVALID, "repetition {n,m} with m < n");
  } else {
    *has = 0;
    return LM_OK;
  }
  if (rx_cur(r) == '?') r->i++; /* lazy: the same language */
  return LM_OK;
}

static lm_status parse_seq(rx *r, int32_t rule) {
  lm_gseq seq = {0};
  lm_status s = LM_OK;
  for (;;) {
    lm_gseq q = {0};
    int none;
    s = parse_atom(r, &q, &none);
    uint32_t min, max;
    int has = 0;
    if (s == LM_OK && !none) s = parse_quant(r, &min, &max, &has);
    if (s == LM_OK && has) {
      int32_t body;
      if (q.n == 1 && q.e[0].kind == LM_GK_REF) {
        body = (int32_t)q.e[0].arg;
        q.n = 0;
      } else {
        char name[96];
        snprintf(name, sizeof name, "%s-repeat-%u", r->name, r->anon++);
        s = lm_gir_wrap(r->b, name, &q, &body);
      }
      if (s == LM_OK) s = lm_gseq_repeat(r->b, &q, body, min, max);
    }
    if (s == LM_OK) s = lm_gseq_cat(r->b, &seq, &q);
    lm_gseq_free(&q);
    if (s != LM_OK || none) break;
  }
  if (s == LM_OK) s = lm_gir_add_alt(r->b, rule, &seq);
  lm_gseq_free(&seq);
  return s;
}

static lm_status parse_alt(rx *r, int32_t rule) {
  LM_TRY(parse_seq(r, rule));
  while (rx_cur(r) == '|' && !rx_end(r)) {
    r->i++;
    LM_TRY(parse_seq(r, rule));
  }
  return LM_OK;
}

/* A rule for any run of JSON string characters (the unanchored ends). */
static lm_status any_chars(rx *r, int32_t *rule) {
  lm_cpset all = {0};
  lm_gseq q = {0};
  char name[96];
  snprintf(name, sizeof name, "%s-any", r->name);
  lm_status s = lm_cpset_add(&all, 0, LM_CP_MAX);
  if (s == LM_OK) s = lm_cpset_normalize(&all);
  if (s == LM_OK) s = lm_json_char_class(r->b, &q, &all, name);
  if (s == LM_OK) s = lm_gir_wrap(r->b, name, &q, rule);
  lm_gseq_free(&q);
  lm_cpset_free(&all);
  return s;
}

/* Whether the pattern's last '$' is an anchor (not escaped by an odd run of backslashes). */
static int ends_with_anchor(const char *s, size_t n) {
  if (n == 0 || s[n - 1] != '$') return 0;
  size_t k = 0;
  while (k + 1 < n && s[n - 2 - k] == '\\')
    k++;
  return k % 2 == 0;
}

lm_status lm_regex_to_gir(lm_gir *b, const char *pattern, size_t len, const char *name,
                          int32_t *rule) {
  rx r = {.s = pattern, .n = len, .b = b, .name = name};
  int start = len > 0 && pattern[0] == '^';
  int end = ends_with_anchor(pattern, len);
  if (start) r.i = 1;
  if (end) r.n = len - 1;
  if (r.i > r.n) r.i = r.n;
  int32_t body;
  char nm[96];
  snprintf(nm, sizeof nm, "%s-body", name);
  LM_TRY(lm_gir_rule(b, nm, &body));
  LM_TRY(parse_alt(&r, body));
  if (!rx_end(&r)) return rx_err(&r, LM_ERR_INVALID, "unmatched ')'");
  if (start && end) {
    *rule = body;
    return LM_OK;
  }
  int32_t any;
  LM_TRY(any_chars(&r, &any));
  lm_gseq q = {0};
  lm_status s = start ? LM_OK : lm_gseq_repeat(b, &q, any, 0, LM_G_INF);
  if (s == LM_OK) s = lm_gseq_ref(b, &q, body);
  if (s == LM_OK && !end) s = lm_gseq_repeat(b, &q, any, 0, LM_G_INF);
  if (s == LM_OK) s = lm_gir_wrap(b, name, &q, rule);
  lm_gseq_free(&q);
  return s;
}
