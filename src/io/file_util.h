/* file_util.h — opening input files that may be hostile: a FIFO, a device or a directory where a
 * model file, a tokenizer or a state file is expected must be refused, never block open() or a
 * read. Symlinks are followed (Hugging Face cache snapshots are symlinks into blobs); what they
 * point to must be a regular file. */
#ifndef LM_IO_FILE_UTIL_H
#define LM_IO_FILE_UTIL_H

#include <stdio.h>
#include <sys/stat.h>

#include "lumen.h"

/* Opens path read-only with O_NONBLOCK (so a FIFO without a writer cannot hang the open), checks
 * with fstat that it is a regular file, then clears O_NONBLOCK. *fd is -1 on failure; st may be
 * NULL. Errors: LM_ERR_NOT_FOUND (no such file), LM_ERR_IO (cannot open, not a regular file). */
lm_status lm_file_open_regular(const char *path, int *fd, struct stat *st);
/* The same as a stdio stream opened "rb". */
lm_status lm_file_fopen_regular(const char *path, FILE **out);

#endif
