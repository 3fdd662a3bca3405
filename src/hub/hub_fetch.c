/* hub_fetch.c — downloading one blob into the cache (see hub_fetch.h). */
#include "hub/hub_fetch.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/status.h"
#include "hub/hub_cache.h"
#include "hub/hub_error.h"
#include "hub/hub_lock.h"
#include "hub/hub_sha256.h"

typedef struct sink_ctx {
  int fd;
  int64_t have;   /* bytes in the .incomplete file */
  int64_t expect; /* -1: unknown */
  int64_t asked;  /* the offset this transfer asked for */
  int started;    /* this transfer has delivered bytes */
  int hashing;    /* lfs: sha follows the file's content */
  lm_sha256 sha;
  lm_hub_meter *meter;
  const char *path; /* for messages */
} sink_ctx;

/* A 200 to a Range request: the server sends the whole file, so start the file over. */
static int restart(sink_ctx *s) {
  if (ftruncate(s->fd, 0) || lseek(s->fd, 0, SEEK_SET) < 0) {
    LM_ERRF(LM_ERR_IO, "%s: cannot truncate: %s", s->path, strerror(errno));
    return -1;
  }
  s->meter->total += s->have; /* those bytes come again */
  s->have = 0;
  lm_sha256_init(&s->sha);
  return 0;
}

static int first_bytes(sink_ctx *s, const lm_hub_head *h) {
  s->started = 1;
  if (h->status == 200 && s->asked > 0) return restart(s);
  if (h->status == 206 && h->range_start != s->asked) {
    LM_ERRF(LM_ERR_IO, "%s: the server resumed at byte %lld, not at %lld", s->path,
            (long long)h->range_start, (long long)s->asked);
    return -1;
  }
  return 0;
}

static int on_bytes(void *ctx, const lm_hub_head *h, const void *data, size_t n) {
  sink_ctx *s = ctx;
  if (!s->started && first_bytes(s, h)) return -1;
  if (s->expect >= 0 && s->have + (int64_t)n > s->expect) {
    LM_ERRF(LM_ERR_CORRUPT, "%s: the server sent more than the %lld bytes it announced", s->path,
            (long long)s->expect);
    return -1;
  }
  for (const char *p = data; n;) {
    ssize_t w = write(s->fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      LM_ERRF(LM_ERR_IO, "%s: write failed: %s", s->path, strerror(errno));
      return -1;
    }
    if (s->hashing) lm_sha256_update(&s->sha, p, (size_t)w);
    lm_hub_meter_add(s->meter, w);
    s->have += w;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

/* The transfer loop: resumes from what the file holds until it is complete, the attempts run
 * out, or the server answers with an error status (left in *status for the caller to word). */
static lm_status transfer(const lm_hub_fetch_ctx *c, const char *url, sink_ctx *s,
                          const lm_hub_file *f, long *status) {
  for (int attempt = 0;; attempt++) {
    if (s->expect >= 0 && s->have == s->expect) return LM_OK;
    lm_hub_head head;
    int retry = 0;
    s->asked = s->have;
    s->started = 0;
    lm_status st = lm_hub_http_download(c->http, url, s->have, on_bytes, s, &head, &retry);
    *status = head.status;
    int ok_status = head.status == 200 || head.status == 206;
    if (st && !retry) return st; /* the sink's error, or one trying again cannot help */
    if (!st && !ok_status && !retry) return LM_OK;
    if (!st && ok_status && (s->expect < 0 || s->have == s->expect)) return LM_OK;
    if (!st) LM_ERRF(LM_ERR_IO, "%s", ok_status ? "the transfer ended early" : "the server failed");
    if (attempt >= c->retries)
      return lm_err_prefix(LM_ERR_IO,
                           "%s: download interrupted at %lld of %lld bytes; run the command again "
                           "to resume",
                           f->path, (long long)s->have, (long long)s->expect);
    lm_hub_note(c->meter->ev, "%s: %s; retrying from byte %lld", f->path, lm_errmsg(),
                (long long)s->have);
    sleep((unsigned)(attempt < 4 ? attempt + 1 : 5));
  }
}

/* The .incomplete file opened for appending; what it already holds is hashed (an LFS blob is
 * checked as a whole). */
static lm_status open_partial(const char *path, const lm_hub_file *f, sink_ctx *s) {
  s->fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (s->fd < 0) return LM_ERRF(LM_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
  off_t end = lseek(s->fd, 0, SEEK_END);
  if (end < 0) return LM_ERRF(LM_ERR_IO, "%s: cannot seek: %s", path, strerror(errno));
  s->have = end;
  if (f->size >= 0 && s->have > f->size) { /* not a prefix of this blob: start over */
    if (ftruncate(s->fd, 0) || lseek(s->fd, 0, SEEK_SET) < 0)
      return LM_ERRF(LM_ERR_IO, "%s: cannot truncate: %s", path, strerror(errno));
    s->have = 0;
  }
  lm_sha256_init(&s->sha);
  s->hashing = f->lfs;
  if (s->hashing && s->have > 0) LM_TRY(lm_sha256_file(&s->sha, path));
  return LM_OK;
}

/* Size and, for LFS, content against what the hub announced; a mismatch deletes the partial
 * file so that nothing corrupt stays in the cache. */
static lm_status verify(const char *partial, sink_ctx *s, const lm_hub_file *f) {
  if (f->size >= 0 && s->have != f->size) {
    unlink(partial);
    return LM_ERRF(LM_ERR_CORRUPT, "%s: got %lld bytes, the hub announced %lld (deleted)", f->path,
                   (long long)s->have, (long long)f->size);
  }
  if (!s->hashing) return LM_OK;
  uint8_t d[32];
  char hex[65];
  lm_sha256_final(&s->sha, d);
  lm_sha256_hex(d, hex);
  if (strcasecmp(hex, f->etag)) {
    unlink(partial);
    return LM_ERRF(LM_ERR_CORRUPT,
                   "%s: the download is corrupt: its SHA-256 is %s, the hub says %s (the partial "
                   "file was deleted; run the command again)",
                   f->path, hex, f->etag);
  }
  return LM_OK;
}

static lm_status fetch_locked(const lm_hub_fetch_ctx *c, const char *url, lm_hub_file *f,
                              const char *blob) {
  struct stat st;
  if (stat(blob, &st) == 0) { /* another process finished it while this one waited */
    lm_hub_meter_add(c->meter, (int64_t)st.st_size - f->had);
    return LM_OK;
  }
  char partial[LM_HUB_PATH_MAX];
  LM_TRY(lm_hub_path(partial, sizeof partial, "%s.incomplete", blob));
  sink_ctx s = {.fd = -1, .expect = f->size, .meter = c->meter, .path = partial};
  lm_status r = open_partial(partial, f, &s);
  lm_hub_meter_add(c->meter, s.have - f->had); /* another process's partial file, meanwhile */
  long status = 0;
  if (!r) r = transfer(c, url, &s, f, &status);
  if (s.fd >= 0 && close(s.fd) && !r) r = LM_ERRF(LM_ERR_IO, "%s: close failed", partial);
  if (!r && status && status != 200 && status != 206 && !(f->size >= 0 && s.have == f->size)) {
    lm_hub_head h;
    lm_hub_head_reset(&h);
    h.status = status;
    r = lm_hub_http_error(&h, c->http->env, c->id, c->rev, f->path);
  }
  if (r) {
    if (!s.have) unlink(partial); /* nothing to resume: no empty .incomplete left behind */
    return r;
  }
  LM_TRY(verify(partial, &s, f));
  if (rename(partial, blob))
    return LM_ERRF(LM_ERR_IO, "%s: cannot move into place: %s", blob, strerror(errno));
  return LM_OK;
}

void lm_hub_meter_add(lm_hub_meter *m, int64_t n) {
  m->done += n;
  if (n && m->ev->progress) m->ev->progress(m->ev->ctx, m->done, m->total);
}

void lm_hub_note(const lm_hub_events *ev, const char *fmt, ...) {
  if (!ev->note) return;
  char line[1536];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  ev->note(ev->ctx, line);
}

lm_status lm_hub_fetch(const lm_hub_fetch_ctx *c, const char *url, lm_hub_file *f) {
  char blob[LM_HUB_PATH_MAX], lock[LM_HUB_PATH_MAX];
  LM_TRY(lm_hub_path(blob, sizeof blob, "%s/%s", c->blobs, f->etag));
  LM_TRY(lm_hub_path(lock, sizeof lock, "%s/%s.lock", c->locks, f->etag));
  int fd;
  lm_status s = lm_hub_lock(lock, 0, &fd);
  if (s == LM_ERR_STATE) {
    lm_hub_note(c->meter->ev, "%s: another download of it is under way; waiting", f->path);
    s = lm_hub_lock(lock, 1, &fd);
  }
  if (s) return s;
  s = fetch_locked(c, url, f, blob);
  lm_hub_unlock(fd);
  return s;
}
