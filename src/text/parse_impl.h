/* parse_impl.h — the parser object shared by parse.c and the per-format state machines (internal).
 */
#ifndef LM_TEXT_PARSE_IMPL_H
#define LM_TEXT_PARSE_IMPL_H

#include "text/jinja_str.h"
#include "text/parse.h"

/* One output channel (content or reasoning): what was emitted, and what is held back (whitespace
 * that may turn out to be trailing, an incomplete UTF-8 sequence). */
typedef struct lm_pchan {
  lm_parse_kind kind;
  lm_jbuf held, all;
  int started; /* something was emitted: leading whitespace is no longer dropped */
} lm_pchan;

typedef struct lm_pcall {
  char *name, *arguments;
} lm_pcall;

struct lm_parser {
  lm_parser_opts o;
  int state;
  int stopped, finished;
  lm_pchan content, reasoning;
  lm_jbuf name;    /* GEMMA4: the channel-name line being read */
  lm_jbuf body;    /* the call in progress */
  lm_jbuf opener;  /* the text that opened it, returned with the body if the call does not parse */
  lm_jbuf pending; /* GENERIC: text not yet classified (may end in part of a tag) */
  lm_pcall *calls;
  size_t ncalls, cap_calls;
};

/* Most bytes a call body may take before it is given up on (and returned as content). */
#define LM_PARSE_MAX_CALL (4u << 20)

lm_status lm_pchan_put(lm_parser *p, lm_pchan *ch, const char *s, size_t n);
/* Records a parsed call and emits it (takes ownership of name and arguments). */
lm_status lm_parser_add_call(lm_parser *p, char *name, char *arguments);
/* Returns a call that did not parse to the content channel, verbatim: opener + body + closer. */
lm_status lm_parser_call_as_content(lm_parser *p, const char *closer, size_t closer_len);

lm_status lm_parse_gemma4_feed(lm_parser *p, int32_t id, const char *piece, size_t len);
lm_status lm_parse_gemma4_finish(lm_parser *p);
lm_status lm_parse_generic_feed(lm_parser *p, int32_t id, const char *piece, size_t len);
lm_status lm_parse_generic_finish(lm_parser *p);

#endif
