/* hub_sha256.h — SHA-256 (FIPS 180-4), streaming. The hub names every LFS file by the SHA-256
 * of its contents (X-Linked-Etag), so a download is checked against it before it joins the
 * cache. */
#ifndef LM_HUB_SHA256_H
#define LM_HUB_SHA256_H

#include <stddef.h>
#include <stdint.h>

#include "lumen.h"

typedef struct lm_sha256 {
  uint32_t h[8];
  uint64_t bytes; /* message length so far */
  uint8_t block[64];
  size_t fill; /* bytes waiting in block */
} lm_sha256;

void lm_sha256_init(lm_sha256 *s);
void lm_sha256_update(lm_sha256 *s, const void *data, size_t n);
/* Pads, finishes and writes the 32-byte digest; s must be initialized again before reuse. */
void lm_sha256_final(lm_sha256 *s, uint8_t digest[32]);
/* The digest as 64 lowercase hex digits and a NUL. */
void lm_sha256_hex(const uint8_t digest[32], char hex[65]);
/* Feeds the whole content of the file at path into s (a resumed download hashes what it already
 * has before the rest arrives). */
lm_status lm_sha256_file(lm_sha256 *s, const char *path);

#endif
