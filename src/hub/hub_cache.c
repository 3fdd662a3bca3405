/* hub_cache.c — paths, refs and snapshot links of the Hugging Face cache (layout in
 * hub_cache.h), and resolving a model name against it. */
#include "hub/hub_cache.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/status.h"
#include "hub/hub_env.h"

lm_status lm_hub_path(char *buf, size_t n, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(buf, n, fmt, ap);
  va_end(ap);
  if (k < 0 || (size_t)k >= n) return LM_ERRF(LM_ERR_INVALID, "path too long: %.200s...", buf);
  return LM_OK;
}

lm_status lm_hub_mkdirs(const char *path) {
  char p[LM_HUB_PATH_MAX];
  LM_TRY(lm_hub_path(p, sizeof p, "%s", path));
  for (char *c = p + 1;; c++) {
    if (*c != '/' && *c != '\0') continue;
    char keep = *c;
    *c = '\0';
    if (mkdir(p, 0755) && errno != EEXIST)
      return LM_ERRF(LM_ERR_IO, "%s: cannot create the folder: %s", p, strerror(errno));
    *c = keep;
    if (!keep) break;
  }
  struct stat st;
  if (stat(p, &st) || !S_ISDIR(st.st_mode)) return LM_ERRF(LM_ERR_IO, "%s: not a folder", p);
  return LM_OK;
}

/* Creates the folders above path. */
static lm_status mkparent(const char *path) {
  char p[LM_HUB_PATH_MAX];
  LM_TRY(lm_hub_path(p, sizeof p, "%s", path));
  char *slash = strrchr(p, '/');
  if (!slash || slash == p) return LM_OK;
  *slash = '\0';
  return lm_hub_mkdirs(p);
}

lm_status lm_hub_read_ref(const char *repo_dir, const char *rev, char commit[41]) {
  char path[LM_HUB_PATH_MAX];
  LM_TRY(lm_hub_path(path, sizeof path, "%s/refs/%s", repo_dir, rev));
  commit[0] = '\0';
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return LM_ERRF(LM_ERR_NOT_FOUND, "%s: no such ref", path);
  char buf[64];
  ssize_t r = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (r < 40) return LM_ERRF(LM_ERR_NOT_FOUND, "%s: not a commit", path);
  buf[r] = '\0';
  buf[strcspn(buf, " \t\r\n")] = '\0';
  if (!lm_hub_is_commit(buf)) return LM_ERRF(LM_ERR_NOT_FOUND, "%s: not a commit", path);
  memcpy(commit, buf, 41);
  return LM_OK;
}

lm_status lm_hub_write_ref(const char *repo_dir, const char *rev, const char *commit) {
  char path[LM_HUB_PATH_MAX], tmp[LM_HUB_PATH_MAX];
  LM_TRY(lm_hub_path(path, sizeof path, "%s/refs/%s", repo_dir, rev));
  LM_TRY(lm_hub_path(tmp, sizeof tmp, "%s.lumen-%ld", path, (long)getpid()));
  LM_TRY(mkparent(path));
  FILE *f = fopen(tmp, "w");
  if (!f) return LM_ERRF(LM_ERR_IO, "%s: cannot write: %s", tmp, strerror(errno));
  int bad = fputs(commit, f) < 0;
  bad |= fclose(f) != 0;
  if (bad || rename(tmp, path)) {
    int e = errno;
    unlink(tmp);
    return LM_ERRF(LM_ERR_IO, "%s: cannot write: %s", path, strerror(e));
  }
  return LM_OK;
}

lm_status lm_hub_link(const char *repo_dir, const char *commit, const char *file,
                      const char *blob) {
  char path[LM_HUB_PATH_MAX], tmp[LM_HUB_PATH_MAX], target[LM_HUB_PATH_MAX], cur[LM_HUB_PATH_MAX];
  LM_TRY(lm_hub_path(path, sizeof path, "%s/snapshots/%s/%s", repo_dir, commit, file));
  /* relative, as huggingface_hub makes them: up out of the file's folders, the commit's folder
   * and snapshots/, then into blobs/ (so the cache can be moved) */
  size_t k = 0;
  target[0] = '\0';
  for (const char *c = file; *c; c++)
    if (*c == '/') k += (size_t)snprintf(target + k, sizeof target - k, "../");
  LM_TRY(lm_hub_path(target + k, sizeof target - k, "../../blobs/%s", blob));
  ssize_t r = readlink(path, cur, sizeof cur - 1);
  if (r > 0 && (cur[r] = '\0', !strcmp(cur, target))) return LM_OK; /* already there */
  LM_TRY(mkparent(path));
  LM_TRY(lm_hub_path(tmp, sizeof tmp, "%s.lumen-%ld", path, (long)getpid()));
  unlink(tmp);
  if (symlink(target, tmp) || rename(tmp, path)) {
    int e = errno;
    unlink(tmp);
    return LM_ERRF(LM_ERR_IO, "%s: cannot link to the blob: %s", path, strerror(e));
  }
  return LM_OK;
}

static int is_dir(const char *p) {
  struct stat st;
  return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

lm_status lm_hub_snapshot(const char *root, const lm_hub_ref *r, char *dir, size_t n) {
  char folder[LM_HUB_ID_MAX + 16], repo[LM_HUB_PATH_MAX], get[LM_HUB_ID_MAX + LM_HUB_REV_MAX + 2];
  lm_hub_repo_folder(r->id, folder, sizeof folder);
  LM_TRY(lm_hub_path(repo, sizeof repo, "%s/%s", root, folder));
  snprintf(get, sizeof get, "%s%s%s", r->id, strcmp(r->rev, "main") ? "@" : "",
           strcmp(r->rev, "main") ? r->rev : "");
  if (!is_dir(repo))
    return LM_ERRF(LM_ERR_NOT_FOUND,
                   "%s is not a directory, and not in your Hugging Face cache (%s); to download "
                   "it: lumen get %s",
                   r->id, root, get);
  char commit[41];
  if (lm_hub_is_commit(r->rev))
    memcpy(commit, r->rev, 41);
  else if (lm_hub_read_ref(repo, r->rev, commit))
    return LM_ERRF(LM_ERR_NOT_FOUND,
                   "%s is in your Hugging Face cache (%s) but not its revision '%s'; to download "
                   "it: lumen get %s",
                   r->id, root, r->rev, get);
  LM_TRY(lm_hub_path(dir, n, "%s/snapshots/%s", repo, commit));
  if (!is_dir(dir))
    return LM_ERRF(LM_ERR_NOT_FOUND,
                   "%s@%s (commit %.12s) has no snapshot in your Hugging Face cache (%s); to "
                   "download it: lumen get %s",
                   r->id, r->rev, commit, root, get);
  return LM_OK;
}

lm_status lm_hub_resolve(const char *name, char *dir, size_t n) {
  struct stat st;
  if (!name || !*name) return LM_ERRF(LM_ERR_INVALID, "no model given");
  if (stat(name, &st) == 0) return lm_hub_path(dir, n, "%s", name);
  lm_hub_ref r;
  if (!lm_hub_looks_like_ref(name)) return LM_ERRF(LM_ERR_NOT_FOUND, "%s: no such directory", name);
  LM_TRY(lm_hub_ref_parse(name, &r));
  char root[LM_HUB_PATH_MAX];
  LM_TRY(lm_hub_cache_root(root, sizeof root));
  return lm_hub_snapshot(root, &r, dir, n);
}
