/* hub_lock.c — flock(2) on a lock file (see hub_lock.h). */
#include "hub/hub_lock.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "base/status.h"
#include "hub/hub_cache.h"
#include "hub/hub_env.h"

lm_status lm_hub_lock(const char *path, int wait, int *fd) {
  *fd = -1;
  char dir[LM_HUB_PATH_MAX];
  LM_TRY(lm_hub_path(dir, sizeof dir, "%s", path));
  char *slash = strrchr(dir, '/');
  if (slash && slash != dir) {
    *slash = '\0';
    LM_TRY(lm_hub_mkdirs(dir));
  }
  int f = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (f < 0) return LM_ERRF(LM_ERR_IO, "%s: cannot open the lock: %s", path, strerror(errno));
  int r;
  while ((r = flock(f, LOCK_EX | (wait ? 0 : LOCK_NB))) && errno == EINTR)
    ;
  if (r) {
    int e = errno;
    close(f);
    if (e == EWOULDBLOCK) return LM_ERRF(LM_ERR_STATE, "%s: held by another process", path);
    return LM_ERRF(LM_ERR_IO, "%s: cannot lock: %s", path, strerror(e));
  }
  *fd = f;
  return LM_OK;
}

void lm_hub_unlock(int fd) {
  if (fd < 0) return;
  flock(fd, LOCK_UN);
  close(fd);
}
