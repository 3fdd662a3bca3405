/* hub_scan.c — what the cache holds: each models--ORG--REPO folder with its refs, its
 * snapshots and the bytes of its blobs (`lumen ls`). Folders that are not repositories, and
 * refs that do not name a commit, are passed over: the cache is shared with other tools. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/status.h"
#include "hub/hub.h"
#include "hub/hub_env.h"

/* models--ORG--REPO → ORG/REPO (neither part may hold "--", so the first one splits). */
static int folder_id(const char *name, char *id, size_t n) {
  if (strncmp(name, "models--", 8)) return 0;
  const char *rest = name + 8, *sep = strstr(rest, "--");
  if (!sep) return 0;
  snprintf(id, n, "%.*s/%s", (int)(sep - rest), rest, sep + 2);
  return lm_hub_id_valid(id);
}

static lm_status add_rev(lm_hub_cached *c, const char *name, const char *commit) {
  for (size_t i = 0; i < c->n_revs; i++) /* a snapshot already named by a ref */
    if (!name[0] && !strcmp(c->revs[i].commit, commit)) return LM_OK;
  lm_hub_rev *r = realloc(c->revs, (c->n_revs + 1) * sizeof *r);
  if (!r) return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  c->revs = r;
  snprintf(r[c->n_revs].name, sizeof r->name, "%s", name);
  snprintf(r[c->n_revs].commit, sizeof r->commit, "%s", commit);
  c->n_revs++;
  return LM_OK;
}

/* refs/ and its subfolders (refs/pr/1): each file names a commit. */
static lm_status scan_refs(lm_hub_cached *c, const char *rel, int depth) {
  char dir[LM_HUB_PATH_MAX + 300];
  snprintf(dir, sizeof dir, "%s/refs%s%s", c->dir, rel[0] ? "/" : "", rel);
  DIR *d = depth < 4 ? opendir(dir) : NULL;
  if (!d) return LM_OK;
  struct dirent *e;
  lm_status s = LM_OK;
  while (!s && (e = readdir(d))) {
    if (e->d_name[0] == '.' || strstr(e->d_name, ".lumen-")) continue;
    char sub[LM_HUB_REV_MAX + 300], commit[41];
    snprintf(sub, sizeof sub, "%s%s%s", rel, rel[0] ? "/" : "", e->d_name);
    if (!lm_hub_rev_valid(sub)) continue;
    if (lm_hub_read_ref(c->dir, sub, commit) == LM_OK) {
      s = add_rev(c, sub, commit);
      if (!s && !strcmp(sub, "main") && c->n_revs > 1) { /* main first */
        lm_hub_rev m = c->revs[c->n_revs - 1];
        memmove(c->revs + 1, c->revs, (c->n_revs - 1) * sizeof *c->revs);
        c->revs[0] = m;
      }
    } else {
      lm_err_clear();
      s = scan_refs(c, sub, depth + 1);
    }
  }
  closedir(d);
  return s;
}

static lm_status scan_snapshots(lm_hub_cached *c) {
  char dir[LM_HUB_PATH_MAX + 16];
  snprintf(dir, sizeof dir, "%s/snapshots", c->dir);
  DIR *d = opendir(dir);
  if (!d) return LM_OK;
  struct dirent *e;
  lm_status s = LM_OK;
  while (!s && (e = readdir(d)))
    if (lm_hub_is_commit(e->d_name)) s = add_rev(c, "", e->d_name);
  closedir(d);
  return s;
}

static void scan_blobs(lm_hub_cached *c) {
  char dir[LM_HUB_PATH_MAX + 16];
  snprintf(dir, sizeof dir, "%s/blobs", c->dir);
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d))) {
    char p[LM_HUB_PATH_MAX + 300];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    if (e->d_name[0] == '.' || lstat(p, &st) || !S_ISREG(st.st_mode)) continue;
    size_t k = strlen(e->d_name);
    if (k > 11 && !strcmp(e->d_name + k - 11, ".incomplete"))
      c->partial = 1;
    else
      c->size += (int64_t)st.st_size;
  }
  closedir(d);
}

static lm_status scan_repo(lm_hub_cache_list *l, const char *name) {
  char id[LM_HUB_ID_MAX + 1];
  if (strlen(name) > LM_HUB_ID_MAX + 16 || !folder_id(name, id, sizeof id)) return LM_OK;
  lm_hub_cached *r = realloc(l->repos, (l->n + 1) * sizeof *r);
  if (!r) return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  l->repos = r;
  lm_hub_cached *c = &r[l->n++];
  memset(c, 0, sizeof *c);
  snprintf(c->id, sizeof c->id, "%s", id);
  LM_TRY(lm_hub_path(c->dir, sizeof c->dir, "%s/%s", l->root, name));
  scan_blobs(c);
  LM_TRY(scan_refs(c, "", 0));
  return scan_snapshots(c);
}

static int by_id(const void *a, const void *b) {
  return strcmp(((const lm_hub_cached *)a)->id, ((const lm_hub_cached *)b)->id);
}

lm_status lm_hub_scan(lm_hub_cache_list *out) {
  memset(out, 0, sizeof *out);
  LM_TRY(lm_hub_cache_root(out->root, sizeof out->root));
  DIR *d = opendir(out->root);
  if (!d) return LM_OK;
  struct dirent *e;
  lm_status s = LM_OK;
  while (!s && (e = readdir(d)))
    s = scan_repo(out, e->d_name);
  closedir(d);
  if (s) {
    lm_hub_cache_list_free(out);
    return s;
  }
  if (out->n) qsort(out->repos, out->n, sizeof *out->repos, by_id);
  return LM_OK;
}

void lm_hub_cache_list_free(lm_hub_cache_list *l) {
  for (size_t i = 0; i < l->n; i++)
    free(l->repos[i].revs);
  free(l->repos);
  l->repos = NULL;
  l->n = 0;
}
