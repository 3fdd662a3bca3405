/* cli.h — shared declarations of the lumen CLI verbs. Each verb lives in cli_<verb>.c and
 * is listed once in verbs.def. A verb returns the process exit code (0 ok, 1 error, 2 usage). */
#ifndef LM_CLI_H
#define LM_CLI_H
#include "lumen.h"

typedef struct lm_cli_verb {
  const char *name;
  int (*fn)(int argc, char **argv); /* argv[0] is the verb's name */
  const char *help;
} lm_cli_verb;

#define LM_VERB(name, fn, help) int fn(int argc, char **argv);
#include "cli/verbs.def"
#undef LM_VERB

#endif
