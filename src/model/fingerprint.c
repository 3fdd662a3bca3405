/* fingerprint.c — lumen's 4-lane hash and the model fingerprint (see fingerprint.h). */
#include "model/fingerprint.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/rng.h"
#include "base/status.h"
#include "io/file_util.h"

#define PHI 0x9e3779b97f4a7c15ull /* 2^64 / golden ratio */
#define K1 0xc2b2ae3d27d4eb4full
#define K2 0x9fb21c651e98df25ull
#define K3 0x165667b19e3779f9ull

static inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

/* Little-endian words whatever the host: the digest is portable. */
static inline uint64_t load_le64(const uint8_t *p) {
  uint64_t v;
  memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  v = __builtin_bswap64(v);
#endif
  return v;
}

static inline uint64_t lane_step(uint64_t lane, uint64_t w) {
  return rotl(lane ^ rotl(w * K1, 31), 27) * K2 + K3;
}

/* The lanes live in locals: stores through lane[] could alias the input bytes and would force
 * the compiler to reload them every block. */
static void absorb_blocks(uint64_t lane[4], const uint8_t *p, size_t nblocks) {
  uint64_t a = lane[0], b = lane[1], c = lane[2], d = lane[3];
  for (size_t i = 0; i < nblocks; i++, p += 32) {
    a = lane_step(a, load_le64(p));
    b = lane_step(b, load_le64(p + 8));
    c = lane_step(c, load_le64(p + 16));
    d = lane_step(d, load_le64(p + 24));
  }
  lane[0] = a, lane[1] = b, lane[2] = c, lane[3] = d;
}

void lm_hasher_init(lm_hasher *h, uint64_t seed) {
  memset(h, 0, sizeof *h);
  h->seed = seed;
  for (int i = 0; i < 4; i++)
    h->lane[i] = lm_mix64(seed + (uint64_t)(i + 1) * PHI);
}

void lm_hasher_update(lm_hasher *h, const void *data, size_t n) {
  const uint8_t *p = data;
  h->total += n;
  if (h->nbuf) { /* top up a partial block first */
    size_t take = 32 - h->nbuf < n ? 32 - h->nbuf : n;
    memcpy(h->buf + h->nbuf, p, take);
    h->nbuf += take;
    p += take;
    n -= take;
    if (h->nbuf < 32) return;
    absorb_blocks(h->lane, h->buf, 1);
    h->nbuf = 0;
  }
  absorb_blocks(h->lane, p, n / 32);
  p += n / 32 * 32;
  n %= 32;
  memcpy(h->buf, p, n);
  h->nbuf = n;
}

void lm_hasher_u64(lm_hasher *h, uint64_t v) {
  uint8_t b[8];
  for (int i = 0; i < 8; i++)
    b[i] = (uint8_t)(v >> (8 * i));
  lm_hasher_update(h, b, 8);
}

void lm_hasher_field(lm_hasher *h, const void *data, size_t n) {
  lm_hasher_u64(h, n);
  lm_hasher_update(h, data, n);
}

/* The lanes after the zero-padded tail block, and the chained value every output word mixes in. */
static uint64_t finish(const lm_hasher *h, uint64_t lane[4]) {
  memcpy(lane, h->lane, sizeof h->lane);
  if (h->nbuf) {
    uint8_t last[32] = {0};
    memcpy(last, h->buf, h->nbuf);
    absorb_blocks(lane, last, 1);
  }
  uint64_t c = lm_mix64(h->total * K3 ^ h->seed);
  for (int i = 0; i < 4; i++)
    c = lm_mix64(c ^ lane[i]);
  return c;
}

void lm_hasher_final(const lm_hasher *h, uint8_t out[32]) {
  uint64_t lane[4], c = finish(h, lane);
  for (int j = 0; j < 4; j++) {
    uint64_t w = lm_mix64(c ^ lm_mix64(lane[j] + (uint64_t)(j + 1) * PHI));
    for (int b = 0; b < 8; b++)
      out[8 * j + b] = (uint8_t)(w >> (8 * b));
  }
}

uint64_t lm_hash64(const void *data, size_t n, uint64_t seed) {
  lm_hasher h;
  lm_hasher_init(&h, seed);
  lm_hasher_update(&h, data, n);
  uint64_t lane[4], c = finish(&h, lane);
  return lm_mix64(c ^ lm_mix64(lane[0] + PHI)); /* = digest word 0 */
}

/* Absorbs a whole file as one field (config files: kilobytes; capped at 100 MB). */
static lm_status hash_file(lm_hasher *h, const char *path) {
  FILE *f;
  lm_status os = lm_file_fopen_regular(path, &f);
  if (os) return lm_err_prefix(os, "model fingerprint");
  lm_status s = LM_OK;
  char *buf = NULL;
  long len = -1;
  if (fseek(f, 0, SEEK_END) == 0) len = ftell(f);
  if (len < 0 || len > 100L * 1000 * 1000 || fseek(f, 0, SEEK_SET) != 0)
    s = LM_ERRF(LM_ERR_IO, "%s: cannot size the file for the model fingerprint", path);
  else if (!(buf = malloc((size_t)len + 1)))
    s = LM_ERRF(LM_ERR_NOMEM, "out of memory");
  else if (fread(buf, 1, (size_t)len, f) != (size_t)len)
    s = LM_ERRF(LM_ERR_IO, "%s: read error for the model fingerprint", path);
  if (!s) lm_hasher_field(h, buf, (size_t)len);
  free(buf);
  fclose(f);
  return s;
}

static void hash_quant(lm_hasher *h, const lm_quant_config *q) {
  lm_hasher_u64(h, (uint64_t)q->present);
  lm_hasher_u64(h, (uint64_t)(int64_t)q->bits);
  lm_hasher_u64(h, (uint64_t)(int64_t)q->group);
  lm_hasher_u64(h, (uint64_t)(int64_t)q->n);
  for (int i = 0; i < q->n; i++) {
    const lm_quant_entry *e = &q->entries[i];
    lm_hasher_field(h, e->path, strlen(e->path));
    lm_hasher_u64(h, (uint64_t)(int64_t)e->bits);
    lm_hasher_u64(h, (uint64_t)(int64_t)e->group);
  }
}

/* ---- the weights' digest, cached by file identity ------------------------------------------ */

/* Where digests are kept: $LUMEN_CACHE_DIR, else $XDG_CACHE_HOME/lumen, else ~/.cache/lumen
 * (each + /weights-digest). 0 when none can be named. */
static int cache_dir(char *buf, size_t n) {
  const char *d = getenv("LUMEN_CACHE_DIR"), *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
  int k = d && *d   ? snprintf(buf, n, "%s/weights-digest", d)
          : x && *x ? snprintf(buf, n, "%s/lumen/weights-digest", x)
          : h && *h ? snprintf(buf, n, "%s/.cache/lumen/weights-digest", h)
                    : -1;
  return k > 0 && (size_t)k < n;
}

static int mkdirs(char *path) { /* mkdir -p, modifying path in place temporarily */
  for (char *p = path + 1; *p; p++)
    if (*p == '/') {
      *p = '\0';
      int bad = mkdir(path, 0700) && errno != EEXIST;
      *p = '/';
      if (bad) return -1;
    }
  return mkdir(path, 0700) && errno != EEXIST ? -1 : 0;
}

/* The cache entry of a file: its device, inode, size, and modification and change times to the
 * nanosecond. Rewriting the file in place changes the times; replacing it changes the inode. */
static int cache_path(const struct stat *st, uint64_t hlen, char *buf, size_t n) {
  char dir[4096];
  if (!cache_dir(dir, sizeof dir)) return 0;
  int k = snprintf(buf, n, "%s/%llx-%llx-%llx-%llx.%09ld-%llx.%09ld-%llx", dir,
                   (unsigned long long)st->st_dev, (unsigned long long)st->st_ino,
                   (unsigned long long)st->st_size, (unsigned long long)st->st_mtim.tv_sec,
                   st->st_mtim.tv_nsec, (unsigned long long)st->st_ctim.tv_sec, st->st_ctim.tv_nsec,
                   (unsigned long long)hlen);
  return k > 0 && (size_t)k < n;
}

static int cache_get(const char *path, uint8_t out[32]) {
  int fd;
  if (lm_file_open_regular(path, &fd, NULL)) {
    lm_err_clear();
    return 0;
  }
  ssize_t k = read(fd, out, 32);
  close(fd);
  return k == 32;
}

/* Best effort: a cache that cannot be written only costs the next load a re-hash. */
static void cache_put(const char *path, const uint8_t d[32]) {
  char tmp[4200], dir[4096];
  if (snprintf(tmp, sizeof tmp, "%s.tmp-XXXXXX", path) >= (int)sizeof tmp ||
      !cache_dir(dir, sizeof dir) || mkdirs(dir))
    return;
  int fd = mkstemp(tmp);
  if (fd < 0) return;
  int ok = write(fd, d, 32) == 32;
  ok = !close(fd) && ok;
  if (!ok || rename(tmp, path)) unlink(tmp);
}

/* The digest of one safetensors file's data section (everything after its header): read once per
 * file version, then taken from the cache. */
static lm_status data_digest(const lm_st_file *f, uint8_t out[32]) {
  int fd;
  struct stat st;
  lm_status s = lm_file_open_regular(f->path, &fd, &st);
  if (s) return lm_err_prefix(s, "model fingerprint");
  uint64_t start = 8 + f->header_len, size = (uint64_t)st.st_size;
  char cp[4400];
  int cached = cache_path(&st, f->header_len, cp, sizeof cp);
  if (cached && cache_get(cp, out)) {
    close(fd);
    return LM_OK;
  }
  lm_hasher h;
  lm_hasher_init(&h, 0x77656967687473ull); /* "weights" */
  if (size > start) {
    void *p = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      close(fd);
      return LM_ERRF(LM_ERR_IO, "%s: cannot map for the model fingerprint: %s", f->path,
                     strerror(errno));
    }
    (void)madvise(p, (size_t)size, MADV_SEQUENTIAL);
    lm_hasher_field(&h, (const uint8_t *)p + start, (size_t)(size - start));
    munmap(p, (size_t)size);
  }
  close(fd);
  lm_hasher_final(&h, out);
  if (cached) cache_put(cp, out);
  return LM_OK;
}

static lm_status hash_safetensors(lm_hasher *h, const lm_safetensors *st) {
  size_t n = st ? lm_st_file_count(st) : 0;
  lm_hasher_u64(h, n);
  for (size_t i = 0; i < n; i++) {
    const lm_st_file *f = lm_st_file_at(st, i);
    uint8_t d[32];
    lm_hasher_u64(h, f->size);
    lm_hasher_field(h, f->header_json, (size_t)f->header_len);
    LM_TRY(data_digest(f, d));
    lm_hasher_field(h, d, sizeof d);
  }
  return LM_OK;
}

lm_status lm_model_fingerprint(const lm_model *m, uint8_t out[LM_FINGERPRINT_BYTES]) {
  static const char tag_ckpt[] = "lumen model fingerprint v2: checkpoint";
  static const char tag_synth[] = "lumen model fingerprint v1: synthetic";
  lm_hasher h;
  lm_hasher_init(&h, 0);
  if (m->synth.on) {
    lm_hasher_field(&h, tag_synth, sizeof tag_synth - 1);
    LM_TRY(hash_file(&h, m->dir)); /* a synthetic model's dir is its preset file */
    lm_hasher_u64(&h, (uint64_t)(int64_t)m->synth.bits);
    lm_hasher_u64(&h, (uint64_t)(int64_t)m->synth.group);
    lm_hasher_u64(&h, m->synth.seed);
  } else {
    char path[4200];
    snprintf(path, sizeof path, "%.4096s/config.json", m->dir);
    lm_hasher_field(&h, tag_ckpt, sizeof tag_ckpt - 1);
    LM_TRY(hash_file(&h, path));
    hash_quant(&h, &m->quant);
    LM_TRY(hash_safetensors(&h, m->st));
  }
  lm_hasher_final(&h, out);
  return LM_OK;
}

const char *lm_fingerprint_short(const uint8_t fp[LM_FINGERPRINT_BYTES], char buf[17]) {
  for (int i = 0; i < 8; i++)
    snprintf(buf + 2 * i, 3, "%02x", fp[i]);
  return buf;
}
