/* cli_args.h — the flags people's fingers know. Before a verb parses its flags, the spellings
 * llama.cpp and mlx-lm use for the same meaning are rewritten to lumen's (`-c` → `--ctx`, `-m DIR`
 * → the model argument, `-np` → `--parallel`, …), flags that mean something lumen does differently
 * are refused with a hint (`-ngl`: the whole model runs on the chosen backend), and a verb's
 * getopt errors name the flag (with the closest known one) instead of reading it as another. */
#ifndef LM_CLI_ARGS_H
#define LM_CLI_ARGS_H

#include <getopt.h>

typedef struct lm_cli_args {
  int argc;
  char **argv; /* argv[0] is the verb; entries point into the caller's argv or into `owned` */
  char *owned; /* the rewritten "--flag=value" strings, one block */
} lm_cli_args;

/* Rewrites argv (argv[0] = the verb) into out. Returns 0, or 2 after printing why a flag is
 * refused. out is valid (and must be freed) only when 0 is returned. */
int lm_cli_args_normalize(int argc, char **argv, lm_cli_args *out);
void lm_cli_args_free(lm_cli_args *a);

/* The message for getopt_long's '?' (unknown flag) or ':' (missing value) result, given the
 * verb's long options: names the flag and the closest known one. Returns 2 (usage error).
 * Verbs pass an optstring that starts with ':' so a missing value is told apart. */
int lm_cli_flag_error(int c, int argc, char **argv, const struct option *lo);

/* A short flag's value written against it ("-ngl" read as -n "gl"): 2 after naming "-ngl" as an
 * unknown flag, unless the value is a number ("-n5"). Call with the flag's optarg. */
int lm_cli_attached_word(int argc, char **argv, const char *arg);

#endif
