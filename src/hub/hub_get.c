/* hub_get.c — `lumen get`: a revision of a repository into the cache, as huggingface_hub's
 * snapshot_download does it: the revision API gives the commit and the file list; each selected
 * file's HEAD (at that commit) gives its etag and size; each blob is fetched under its lock and
 * linked from snapshots/COMMIT/; refs/REV is written last, so a name resolves only to a
 * snapshot whose files are all in place. */
#include "hub/hub.h"

#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/status.h"
#include "hub/hub_error.h"
#include "hub/hub_fetch.h"
#include "hub/hub_http.h"

#define LM_HUB_REVISION_CAP ((size_t)64 << 20)

typedef struct get_ctx {
  const lm_hub_get_opts *o;
  lm_hub_ref ref;
  lm_hub_env env;
  lm_hub_http http;
  lm_hub_revision rev;
  char repo[LM_HUB_PATH_MAX], blobs[LM_HUB_PATH_MAX], locks[LM_HUB_PATH_MAX];
  lm_hub_file *files;
  size_t n_files;
} get_ctx;

/* Retries a request that broke (not one the server refused). */
static lm_status with_retries(get_ctx *g, const char *url, char **body, size_t *n,
                              lm_hub_head *head) {
  for (int attempt = 0;; attempt++) {
    int retry = 0;
    lm_status s =
        body ? lm_hub_http_get_body(&g->http, url, LM_HUB_REVISION_CAP, body, n, head, &retry)
             : lm_hub_http_head(&g->http, url, head, &retry);
    if (!retry || attempt >= g->o->retries) {
      if (s) lm_err_prefix(s, "%s", url);
      return s;
    }
    if (!s && body) free(*body);
    sleep((unsigned)(attempt < 4 ? attempt + 1 : 5));
  }
}

static lm_status fetch_revision(get_ctx *g) {
  char url[8192];
  LM_TRY(lm_hub_path(url, sizeof url, "%s/api/models/%s/revision/", g->env.endpoint, g->ref.id));
  LM_TRY(lm_hub_url_append(url, sizeof url, g->ref.rev, 0));
  char *body = NULL;
  size_t n = 0;
  lm_hub_head head;
  LM_TRY(with_retries(g, url, &body, &n, &head));
  lm_status s = head.status == 200 ? lm_hub_revision_parse(body, n, &g->rev)
                                   : lm_hub_http_error(&head, &g->env, g->ref.id, g->ref.rev, NULL);
  if (s && head.status == 200) lm_err_prefix(s, "%s", url);
  free(body);
  return s;
}

/* huggingface_hub's filter: fnmatch, '*' crossing '/', a pattern ending in '/' means a folder. */
static int selected(const lm_hub_get_opts *o, const char *path) {
  if (!o->n_include) return 1;
  for (size_t i = 0; i < o->n_include; i++) {
    char pat[1100];
    size_t k = strlen(o->include[i]);
    snprintf(pat, sizeof pat, "%s%s", o->include[i], k && o->include[i][k - 1] == '/' ? "*" : "");
    if (!fnmatch(pat, path, 0)) return 1;
  }
  return 0;
}

static lm_status file_url(const get_ctx *g, const char *path, char *url, size_t n) {
  LM_TRY(lm_hub_path(url, n, "%s/%s/resolve/%s/", g->env.endpoint, g->ref.id, g->rev.sha));
  return lm_hub_url_append(url, n, path, 1);
}

/* HEAD of one file at the commit: etag, size, and the commit it really is at. */
static lm_status file_meta(get_ctx *g, const char *path, lm_hub_file *f) {
  char url[8192];
  LM_TRY(file_url(g, path, url, sizeof url));
  lm_hub_head h;
  LM_TRY(with_retries(g, url, NULL, NULL, &h));
  if (h.status < 200 || h.status > 399)
    return lm_hub_http_error(&h, &g->env, g->ref.id, g->ref.rev, path);
  if (!h.commit[0])
    return LM_ERRF(LM_ERR_CORRUPT,
                   "%s: the server sent no X-Repo-Commit header (is %s a Hugging Face hub?)", path,
                   g->env.endpoint);
  if (strcmp(h.commit, g->rev.sha))
    return LM_ERRF(LM_ERR_STATE, "%s: the server has it at commit %s, not %s", path, h.commit,
                   g->rev.sha);
  if (!h.etag[0])
    return LM_ERRF(LM_ERR_CORRUPT, "%s: the server sent no usable ETag or X-Linked-Etag", path);
  if (h.lfs && strlen(h.etag) != 64)
    return LM_ERRF(LM_ERR_CORRUPT, "%s: X-Linked-Etag '%s' is not a SHA-256", path, h.etag);
  f->path = path;
  memcpy(f->etag, h.etag, sizeof f->etag);
  f->lfs = h.lfs;
  f->size = h.size;
  return LM_OK;
}

static lm_status select_files(get_ctx *g) {
  g->files = calloc(g->rev.n_files + 1, sizeof *g->files);
  if (!g->files) return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  for (size_t i = 0; i < g->rev.n_files; i++)
    if (selected(g->o, g->rev.files[i]))
      LM_TRY(file_meta(g, g->rev.files[i], &g->files[g->n_files++]));
  if (!g->n_files)
    return LM_ERRF(LM_ERR_NOT_FOUND, "%s@%s: no file matches %s", g->ref.id, g->ref.rev,
                   g->o->n_include ? "the --include patterns" : "(the revision lists none)");
  return LM_OK;
}

static int64_t file_bytes(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 ? (int64_t)st.st_size : -1;
}

typedef struct tally {
  int64_t total, cached, partial; /* bytes: all, in complete blobs, in partial downloads */
  size_t n_cached;
} tally;

/* What each file already has (a complete blob or a partial download). */
static tally count_bytes(get_ctx *g) {
  tally t = {0};
  for (size_t i = 0; i < g->n_files; i++) {
    lm_hub_file *f = &g->files[i];
    char p[LM_HUB_PATH_MAX + 160];
    snprintf(p, sizeof p, "%s/%s", g->blobs, f->etag);
    int64_t b = file_bytes(p);
    if (b >= 0) {
      t.n_cached++;
      t.cached += b;
    } else {
      snprintf(p, sizeof p, "%s/%s.incomplete", g->blobs, f->etag);
      b = file_bytes(p);
      t.partial += b > 0 ? b : 0;
    }
    f->had = b < 0 ? 0 : b;
    t.total += f->size >= 0 ? f->size : f->had;
  }
  return t;
}

static lm_status fetch_all(get_ctx *g) {
  tally t = count_bytes(g);
  char cached[64] = "", partial[64] = "";
  if (t.n_cached) snprintf(cached, sizeof cached, "; %zu already cached", t.n_cached);
  if (t.partial) snprintf(partial, sizeof partial, "; resuming after %.1f MB", t.partial / 1e6);
  lm_hub_note(&g->o->events, "%s@%s is commit %.12s: %zu files, %.1f MB%s%s", g->ref.id, g->ref.rev,
              g->rev.sha, g->n_files, (double)t.total / 1e6, cached, partial);
  lm_hub_meter m = {0, t.total - t.cached - t.partial, &g->o->events};
  lm_hub_fetch_ctx fc = {&g->http, &m, g->ref.id, g->ref.rev, g->blobs, g->locks, g->o->retries};
  lm_status s = LM_OK;
  for (size_t i = 0; i < g->n_files && !s; i++) {
    char url[8192];
    s = file_url(g, g->files[i].path, url, sizeof url);
    if (!s) s = lm_hub_fetch(&fc, url, &g->files[i]);
    if (!s) s = lm_hub_link(g->repo, g->rev.sha, g->files[i].path, g->files[i].etag);
  }
  return s;
}

static lm_status run(get_ctx *g, char *snapshot, size_t n) {
  LM_TRY(lm_hub_ref_parse(g->o->name, &g->ref));
  LM_TRY(lm_hub_env_load(&g->env));
  if (g->env.offline)
    return LM_ERRF(LM_ERR_STATE, "HF_HUB_OFFLINE is set: not downloading %s (unset it to fetch)",
                   g->o->name);
  char folder[LM_HUB_ID_MAX + 16];
  lm_hub_repo_folder(g->ref.id, folder, sizeof folder);
  LM_TRY(lm_hub_path(g->repo, sizeof g->repo, "%s/%s", g->env.cache, folder));
  LM_TRY(lm_hub_path(g->blobs, sizeof g->blobs, "%s/blobs", g->repo));
  LM_TRY(lm_hub_path(g->locks, sizeof g->locks, "%s/.locks/%s", g->env.cache, folder));
  LM_TRY(lm_hub_http_init(&g->http, &g->env));
  LM_TRY(fetch_revision(g));
  LM_TRY(select_files(g));
  LM_TRY(lm_hub_mkdirs(g->blobs));
  LM_TRY(fetch_all(g));
  if (strcmp(g->ref.rev, g->rev.sha)) LM_TRY(lm_hub_write_ref(g->repo, g->ref.rev, g->rev.sha));
  return lm_hub_path(snapshot, n, "%s/snapshots/%s", g->repo, g->rev.sha);
}

lm_status lm_hub_get(const lm_hub_get_opts *o, char *snapshot, size_t n) {
  get_ctx *g = calloc(1, sizeof *g);
  if (!g) return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  g->o = o;
  lm_status s = run(g, snapshot, n);
  lm_hub_http_free(&g->http);
  lm_hub_revision_free(&g->rev);
  free(g->files);
  free(g);
  return s;
}
