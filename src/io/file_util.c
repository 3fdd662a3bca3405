/* file_util.c — non-blocking, regular-files-only opening of inputs (file_util.h). */
#include "io/file_util.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "base/status.h"

static const char *kind(mode_t m) {
  return S_ISDIR(m)    ? "a directory"
         : S_ISFIFO(m) ? "a FIFO"
         : S_ISCHR(m)  ? "a character device"
         : S_ISBLK(m)  ? "a block device"
         : S_ISSOCK(m) ? "a socket"
                       : "not a regular file";
}

lm_status lm_file_open_regular(const char *path, int *fd, struct stat *st) {
  *fd = -1;
  int f = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (f < 0)
    return LM_ERRF(errno == ENOENT ? LM_ERR_NOT_FOUND : LM_ERR_IO, "%s: cannot open: %s", path,
                   strerror(errno));
  struct stat s;
  if (fstat(f, &s) != 0) {
    int e = errno;
    close(f);
    return LM_ERRF(LM_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
  }
  if (!S_ISREG(s.st_mode)) {
    close(f);
    return LM_ERRF(LM_ERR_IO, "%s: is %s, not a regular file", path, kind(s.st_mode));
  }
  int fl = fcntl(f, F_GETFL);
  if (fl < 0 || fcntl(f, F_SETFL, fl & ~O_NONBLOCK) < 0) {
    int e = errno;
    close(f);
    return LM_ERRF(LM_ERR_IO, "%s: fcntl: %s", path, strerror(e));
  }
  if (st) *st = s;
  *fd = f;
  return LM_OK;
}

lm_status lm_file_fopen_regular(const char *path, FILE **out) {
  *out = NULL;
  int fd;
  LM_TRY(lm_file_open_regular(path, &fd, NULL));
  FILE *f = fdopen(fd, "rb");
  if (!f) {
    int e = errno;
    close(fd);
    return LM_ERRF(LM_ERR_IO, "%s: fdopen: %s", path, strerror(e));
  }
  *out = f;
  return LM_OK;
}
