/* cli_version.c — `lumen version`. */
#include <stdio.h>
#include "cli/cli.h"

int lm_cli_version(int argc, char **argv) {
  (void)argc;
  (void)argv;
  printf("lumen %s\n", LUMEN_VERSION);
  return 0;
}
