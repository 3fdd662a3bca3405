/* jinja_names.c — which variable names a compiled template refers to (jinja.h), so a caller can
 * pass a template only the variables it reads. */
#include <string.h>

#include "text/jinja.h"
#include "text/jinja_ast.h"

static int refers(const lm_jnode *n, const char *name);

static int refers_all(const lm_jnodes *v, const char *name) {
  for (size_t i = 0; i < v->n; i++)
    if (refers(v->v[i], name)) return 1;
  return 0;
}

/* Recursion is bounded by the parser's caps on block depth and expression height. */
static int refers(const lm_jnode *n, const char *name) {
  if (!n) return 0;
  if (n->type == LM_JN_NAME && n->name && !strcmp(n->name, name)) return 1;
  return refers(n->a, name) || refers(n->b, name) || refers(n->c, name) || refers(n->d, name) ||
         refers_all(&n->args, name) || refers_all(&n->kwvals, name) || refers_all(&n->body, name) ||
         refers_all(&n->orelse, name);
}

int lm_jinja_refers_to(const lm_jinja_template *t, const char *name) {
  return t && name && refers_all(&t->body, name);
}
