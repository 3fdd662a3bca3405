/* cli_get.c — `lumen get ORG/REPO[@REV]`: a model from the Hugging Face hub into the standard
 * cache (src/hub/), its snapshot folder printed on stdout for scripts. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/status.h"
#include "cli/cli.h"
#include "cli/cli_args.h"
#include "cli/cli_common.h"
#include "cli/cli_progress.h"
#include "hub/hub.h"

static const char *get_help =
    "usage: lumen get ORG/REPO[@REV] [--include GLOB]... [--quiet] [--retries N]\n"
    "\n"
    "Downloads a revision (default main; a branch, tag or commit) of a Hugging Face model\n"
    "repository into the Hugging Face cache ($HF_HUB_CACHE, else $HF_HOME/hub, else\n"
    "~/.cache/huggingface/hub) in the layout huggingface_hub uses, so either tool finds what the\n"
    "other fetched; every command that takes a model then accepts ORG/REPO[@REV]. A download that\n"
    "was interrupted resumes where it stopped, LFS files are checked against the SHA-256 the hub\n"
    "reports, and two downloads of the same file wait for each other. Progress goes to stderr;\n"
    "the snapshot's folder is printed on stdout.\n"
    "\n"
    "  --include GLOB     fetch only the files that match (repeatable; '*' also matches '/',\n"
    "                     a pattern ending in '/' means a folder)\n"
    "  -q, --quiet        nothing on stderr but errors (HF_HUB_DISABLE_PROGRESS_BARS=1: no\n"
    "                     progress line)\n"
    "  --retries N        attempts after a broken or stalled transfer, each resuming (default 3)\n"
    "\n"
    "environment: HF_ENDPOINT (default https://huggingface.co); HF_TOKEN (else the file\n"
    "$HF_HOME/token) for private and gated repositories; HF_HUB_ETAG_TIMEOUT and\n"
    "HF_HUB_DOWNLOAD_TIMEOUT (seconds, default 10) for servers that stop answering.\n";

static void on_bytes(void *ctx, int64_t done, int64_t total) {
  lm_cli_progress_cb(ctx, done, total);
}

/* A line from the download, on a line of its own (the progress line is redrawn after it). */
static void on_note(void *ctx, const char *line) {
  lm_cli_progress_clear(ctx);
  fprintf(stderr, "lumen get: %s\n", line);
}

/* huggingface_hub's switch for its progress bars silences this one too. */
static int progress_disabled(void) {
  const char *v = getenv("HF_HUB_DISABLE_PROGRESS_BARS");
  return v && (!strcmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes"));
}

int lm_cli_get(int argc, char **argv) {
  static const struct option lo[] = {{"include", 1, 0, 'i'},
                                     {"quiet", 0, 0, 'q'},
                                     {"retries", 1, 0, 'r'},
                                     {"help", 0, 0, 'h'},
                                     {0, 0, 0, 0}};
  lm_hub_get_opts o = {.retries = 3};
  const char **inc = calloc((size_t)argc + 1, sizeof *inc);
  if (!inc) return lm_cli_fail("out of memory");
  int c, rc = 2, quiet = 0;
  char *end;
  optind = 1;
  while ((c = getopt_long(argc, argv, ":qh", lo, NULL)) != -1) {
    if (c == 'i')
      inc[o.n_include++] = optarg;
    else if (c == 'q')
      quiet = 1;
    else if (c == 'r') {
      long v = strtol(optarg, &end, 10);
      if (!*optarg || *end || v < 0 || v > 100) {
        fprintf(stderr, "lumen get: --retries must be 0..100 (got '%s')\n", optarg);
        goto out;
      }
      o.retries = (int)v;
    } else if (c == 'h') {
      fputs(get_help, stdout);
      rc = 0;
      goto out;
    } else {
      rc = lm_cli_flag_error(c, argc, argv, lo);
      goto out;
    }
  }
  if (optind != argc - 1) {
    fputs(get_help, stderr);
    goto out;
  }
  o.name = argv[optind];
  o.include = inc;
  lm_cli_progress pr;
  lm_cli_progress_start(&pr, "download", 0, "B");
  pr.quiet = quiet || progress_disabled();
  if (!quiet) o.events = (lm_hub_events){on_bytes, on_note, &pr};
  char snap[4096];
  lm_status s = lm_hub_get(&o, snap, sizeof snap);
  lm_cli_progress_end(&pr);
  rc = s ? lm_cli_fail(NULL) : 0;
  if (!rc) printf("%s\n", snap);
out:
  free(inc);
  return rc;
}
