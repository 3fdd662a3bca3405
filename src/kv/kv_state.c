/* kv_state.c — the KV state file: layout, the atomic writer, the validating parser and the
 * loader (format: docs/kv-state-format.md; API: kv_state.h). */
#include "kv/kv_state.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/status.h"
#include "io/file_util.h"
#include "kv/kv_snapshot.h"

static const char magic[8] = {'L', 'M', 'K', 'V', 'S', 'T', 'A', 'T'};
#define BOM 0x01020304u /* stored in the writer's byte order (the data blocks are, too) */

/* Checksum seeds: one per region, so a block copied into another region does not verify. */
enum {
  SEED_HEADER = 0x4c4b5601,
  SEED_TABLE = 0x4c4b5602,
  SEED_TOKENS = 0x4c4b5603,
  SEED_DATA = 0x4c4b5604
};

/* Fixed-header field offsets (docs/kv-state-format.md §2). */
enum {
  H_MAGIC = 0,
  H_VERSION = 8,
  H_BOM = 12,
  H_HEADER_BYTES = 16,
  H_ENTRY_BYTES = 20,
  H_N_CACHES = 24,
  H_FLAGS = 28,
  H_N_TOKENS = 32,
  H_TABLE_OFF = 40,
  H_TOKENS_OFF = 48,
  H_DATA_OFF = 56,
  H_FILE_SIZE = 64,
  H_FINGERPRINT = 72,
  H_TABLE_SUM = 104,
  H_TOKENS_SUM = 112,
  H_HEADER_SUM = 120
};
/* Cache-entry field offsets (§3). */
enum {
  E_PLAN_KIND = 0,
  E_PLAN_BITS = 4,
  E_PLAN_GROUP = 8,
  E_LAYOUT_KIND = 12,
  E_LAYOUT_BITS = 16,
  E_LAYOUT_GROUP = 20,
  E_HEADS = 24,
  E_HEAD_DIM = 28,
  E_PENDING = 32,
  E_DTYPE = 36,
  E_WINDOW = 40,
  E_QUANT_START = 48,
  E_N = 56,
  E_ROWS = 64,
  E_ARRAYS = 72,
  E_HIGH = 72 + 24 * LM_KV_ARRAYS,
  E_PLAN_VBITS = E_HIGH + 8,    /* turboquant's value bits (0 for every other kind) */
  E_LAYOUT_VBITS = E_HIGH + 12, /* the same of the layout */
  E_RESERVED = E_HIGH + 16
};
/* Limits that keep every product below 2^63: rows <= 2^31, row bytes <= 4096 * 4096 * 4. */
#define MAX_HEADS 4096
#define MAX_HEAD_DIM 4096
#define MAX_WINDOW ((int64_t)1 << 31)

/* ---- little-endian fields ------------------------------------------------------------------ */

static void put32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get32(const uint8_t *p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; i--)
    v = (v << 8) | p[i];
  return v;
}
static uint64_t get64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--)
    v = (v << 8) | p[i];
  return v;
}

static uint64_t align_up(uint64_t x) {
  return (x + LM_KV_STATE_ALIGN - 1) / LM_KV_STATE_ALIGN * LM_KV_STATE_ALIGN;
}

/* File codes of K/V element types (the lm_dtype enum is not a file format). */
static uint32_t dtype_code(lm_dtype t) {
  return t == LM_DT_F32 ? 1 : t == LM_DT_F16 ? 2 : t == LM_DT_BF16 ? 3 : 0;
}
static lm_dtype dtype_of(uint32_t c) {
  return c == 1 ? LM_DT_F32 : c == 2 ? LM_DT_F16 : c == 3 ? LM_DT_BF16 : LM_DT_COUNT;
}

/* Bytes of one row of array a for a cache of this layout (lm_kv_row_bytes on a descriptor). */
static int64_t layout_row_bytes(const lm_kv_spec *layout, lm_dtype dtype, int a) {
  lm_kv_cache c = {.kind = layout->kind,
                   .n_kv_heads = layout->n_kv_heads,
                   .head_dim = layout->head_dim,
                   .bits = layout->bits,
                   .group = layout->group,
                   .v_bits = layout->v_bits,
                   .dtype = dtype};
  return lm_kv_row_bytes(&c, a);
}

static int64_t rows_for(const lm_kv_spec *layout, int64_t n) {
  int64_t slots = lm_kv_ring_slots(layout->window);
  return lm_kv_kind_ring(layout->kind) && n > slots ? slots : n;
}

/* "kv:quant:8:64" or "kv:quant:8:64 from token 512" (a delayed quantization). */
static const char *plan_text(const lm_kv_spec *s, char *buf, size_t n) {
  char sig[64];
  lm_kv_spec_signature(s, sig, sizeof sig);
  if (lm_kv_kind_quant(s->kind) && s->quant_start > 0)
    snprintf(buf, n, "%s from token %lld", sig, (long long)s->quant_start);
  else
    snprintf(buf, n, "%s", sig);
  return buf;
}

/* ---- serialization --------------------------------------------------------------------------- */

static void put_entry(uint8_t *e, const lm_kv_state_cache *c) {
  memset(e, 0, LM_KV_STATE_ENTRY_BYTES);
  put32(e + E_PLAN_KIND, (uint32_t)c->plan.kind);
  put32(e + E_PLAN_BITS, (uint32_t)c->plan.bits);
  put32(e + E_PLAN_GROUP, (uint32_t)c->plan.group);
  put32(e + E_LAYOUT_KIND, (uint32_t)c->layout.kind);
  put32(e + E_LAYOUT_BITS, (uint32_t)c->layout.bits);
  put32(e + E_LAYOUT_GROUP, (uint32_t)c->layout.group);
  put32(e + E_HEADS, (uint32_t)c->plan.n_kv_heads);
  put32(e + E_HEAD_DIM, (uint32_t)c->plan.head_dim);
  put32(e + E_PENDING, (uint32_t)c->has_pending);
  put32(e + E_DTYPE, dtype_code(c->dtype));
  put64(e + E_WINDOW, (uint64_t)c->plan.window);
  put64(e + E_QUANT_START, (uint64_t)c->plan.quant_start);
  put64(e + E_N, (uint64_t)c->n);
  put64(e + E_ROWS, (uint64_t)c->rows);
  put64(e + E_HIGH, (uint64_t)c->high);
  put32(e + E_PLAN_VBITS, (uint32_t)c->plan.v_bits);
  put32(e + E_LAYOUT_VBITS, (uint32_t)c->layout.v_bits);
  for (int a = 0; a < LM_KV_ARRAYS; a++) {
    put64(e + E_ARRAYS + 24 * a, c->arrays[a].offset);
    put64(e + E_ARRAYS + 24 * a + 8, c->arrays[a].bytes);
    put64(e + E_ARRAYS + 24 * a + 16, c->arrays[a].checksum);
  }
}

/* The fixed header, table and token ids: everything before the first data block. */
static void put_header(uint8_t *h, const lm_kv_state_info *in) {
  uint64_t table_bytes = (uint64_t)in->n_caches * LM_KV_STATE_ENTRY_BYTES;
  uint64_t tokens_off = LM_KV_STATE_HEADER_BYTES + table_bytes,
           tokens_bytes = 4 * (uint64_t)in->n_tokens;
  for (int i = 0; i < in->n_caches; i++)
    put_entry(h + LM_KV_STATE_HEADER_BYTES + (size_t)i * LM_KV_STATE_ENTRY_BYTES, &in->caches[i]);
  if (tokens_bytes)
    memcpy(h + tokens_off, in->tokens, (size_t)tokens_bytes); /* host order, like the data */
  memcpy(h + H_MAGIC, magic, sizeof magic);
  put32(h + H_VERSION, LM_KV_STATE_VERSION);
  uint32_t bom = BOM;
  memcpy(h + H_BOM, &bom, 4);
  put32(h + H_HEADER_BYTES, LM_KV_STATE_HEADER_BYTES);
  put32(h + H_ENTRY_BYTES, LM_KV_STATE_ENTRY_BYTES);
  put32(h + H_N_CACHES, (uint32_t)in->n_caches);
  put32(h + H_FLAGS, 0);
  put64(h + H_N_TOKENS, (uint64_t)in->n_tokens);
  put64(h + H_TABLE_OFF, LM_KV_STATE_HEADER_BYTES);
  put64(h + H_TOKENS_OFF, tokens_off);
  put64(h + H_DATA_OFF, in->data_offset);
  put64(h + H_FILE_SIZE, in->file_size);
  memcpy(h + H_FINGERPRINT, in->fingerprint, LM_FINGERPRINT_BYTES);
  put64(h + H_TABLE_SUM, lm_hash64(h + LM_KV_STATE_HEADER_BYTES, (size_t)table_bytes, SEED_TABLE));
  put64(h + H_TOKENS_SUM, lm_hash64(h + tokens_off, (size_t)tokens_bytes, SEED_TOKENS));
  put64(h + H_HEADER_SUM, lm_hash64(h, H_HEADER_SUM, SEED_HEADER));
}

/* ---- parsing ----------------------------------------------------------------------------------
 */

void lm_kv_state_info_free(lm_kv_state_info *info) {
  if (!info) return;
  free(info->caches);
  free(info->tokens);
  free(info);
}

/* Fixed header: magic, version, byte order, checksum, sizes, and the regions' bounds. */
static lm_status parse_fixed(const uint8_t *b, uint64_t size, const char *name, int verify,
                             lm_kv_state_info *in) {
  if (size == 0) return LM_ERRF(LM_ERR_CORRUPT, "%s: empty file, not a KV state", name);
  if (size < LM_KV_STATE_HEADER_BYTES)
    return LM_ERRF(LM_ERR_CORRUPT, "%s: truncated: %llu bytes, shorter than the %d-byte header",
                   name, (unsigned long long)size, LM_KV_STATE_HEADER_BYTES);
  if (memcmp(b + H_MAGIC, magic, sizeof magic))
    return LM_ERRF(LM_ERR_CORRUPT, "%s: not a lumen KV state file (bad magic)", name);
  in->version = get32(b + H_VERSION);
  if (in->version != LM_KV_STATE_VERSION)
    return LM_ERRF(LM_ERR_UNSUPPORTED,
                   "%s: KV state format version %u; this build reads version %d", name, in->version,
                   LM_KV_STATE_VERSION);
  uint32_t bom;
  memcpy(&bom, b + H_BOM, 4);
  if (bom == 0x04030201u)
    return LM_ERRF(LM_ERR_UNSUPPORTED,
                   "%s: written on a machine of the other byte order; state files do not travel "
                   "across byte orders",
                   name);
  if (bom != BOM) return LM_ERRF(LM_ERR_CORRUPT, "%s: bad byte-order mark 0x%08x", name, bom);
  if ((verify & LM_KV_STATE_VERIFY_HEADER) &&
      lm_hash64(b, H_HEADER_SUM, SEED_HEADER) != get64(b + H_HEADER_SUM))
    return LM_ERRF(LM_ERR_CORRUPT, "%s: header checksum mismatch (the file is corrupt)", name);
  if (get32(b + H_HEADER_BYTES) != LM_KV_STATE_HEADER_BYTES ||
      get32(b + H_ENTRY_BYTES) != LM_KV_STATE_ENTRY_BYTES)
    return LM_ERRF(LM_ERR_CORRUPT, "%s: header/entry sizes %u/%u; version 1 has %d/%d", name,
                   get32(b + H_HEADER_BYTES), get32(b + H_ENTRY_BYTES), LM_KV_STATE_HEADER_BYTES,
                   LM_KV_STATE_ENTRY_BYTES);
  if (get32(b + H_FLAGS))
    return LM_ERRF(LM_ERR_CORRUPT, "%s: unknown flags 0x%x", name, get32(b + H_FLAGS));
  uint32_t nc = get32(b + H_N_CACHES);
  uint64_t nt = get64(b + H_N_TOKENS);
  if (nc > LM_KV_STATE_MAX_CACHES)
    return LM_ERRF(LM_ERR_CORRUPT, "%s: %u caches (at most %d)", name, nc, LM_KV_STATE_MAX_CACHES);
  if (nt > (uint64_t)LM_KV_STATE_MAX_TOKENS)
    return LM_ERRF(LM_ERR_CORRUPT, "%s: %llu tokens (at most 2^31)", name, (unsigned long long)nt);
  in->n_caches = (int)nc;
  in->n_tokens = (int64_t)nt;
  /* Regions follow each other exactly: header, table, token ids, padding to the first block. */
  uint64_t tokens_off = LM_KV_STATE_HEADER_BYTES + (uint64_t)nc * LM_KV_STATE_ENTRY_BYTES;
  in->data_offset = get64(b + H_DATA_OFF);
  in->file_size = get64(b + H_FILE_SIZE);
  if (get64(b + H_TABLE_OFF) != LM_KV_STATE_HEADER_BYTES || get64(b + H_TOKENS_OFF) != tokens_off ||
      in->data_offset != align_up(tokens_off + 4 * nt))
    return LM_ERRF(LM_ERR_CORRUPT,
                   "%s: region offsets do not follow the layout of %u caches and %llu tokens", name,
                   nc, (unsigned long long)nt);
  if (size < in->file_size)
    return LM_ERRF(LM_ERR_CORRUPT, "%s: truncated: %llu of %llu bytes", name,
                   (unsigned long long)size, (unsigned long long)in->file_size);
  if (size > in->file_size)
    return LM_ERRF(LM_ERR_CORRUPT, "%s: %llu bytes past the declared end (%llu)", name,
                   (unsigned long long)(size - in->file_size), (unsigned long long)in->file_size);
  if (in->data_offset > size)
    return LM_ERRF(LM_ERR_CORRUPT, "%s: data offset past the end of the file", name);
  memcpy(in->fingerprint, b + H_FINGERPRINT, LM_FINGERPRINT_BYTES);
  return LM_OK;
}

static int valid_quant(uint32_t bits, uint32_t group, uint32_t hd) {
  return (bits == 4 || bits == 8) && (group == 32 || group == 64 || group == 128) &&
         hd % group == 0;
}

/* A turboquant plan: key and value widths and a head dim the codec has, its fixed group, and
 * no delayed start (only the affine kinds are delayed). */
static lm_status parse_tq_plan(const uint8_t *e, const char *name, int i, lm_kv_spec *plan) {
  uint32_t kb = get32(e + E_PLAN_BITS), g = get32(e + E_PLAN_GROUP), vb = get32(e + E_PLAN_VBITS);
  lm_tq_params p;
  if (kb > 8 || vb > 8 || g != LM_TQ_BLOCK || get64(e + E_QUANT_START) ||
      lm_tq_params_init(&p, plan->head_dim, (int)kb, (int)vb))
    return LM_ERRF(LM_ERR_CORRUPT,
                   "%s: cache %d: bad turboquant plan k%u v%u group %u of head dim %d", name, i, kb,
                   vb, g, plan->head_dim);
  plan->bits = (int)kb, plan->group = (int)g, plan->v_bits = (int)vb;
  return LM_OK;
}

/* One entry's plan, layout and geometry (no data bounds yet). */
static lm_status parse_entry_specs(const uint8_t *e, const char *name, int i, int64_t n_tokens,
                                   lm_kv_state_cache *c) {
  uint32_t pk = get32(e + E_PLAN_KIND), lk = get32(e + E_LAYOUT_KIND), heads = get32(e + E_HEADS),
           hd = get32(e + E_HEAD_DIM), pend = get32(e + E_PENDING);
  uint64_t window = get64(e + E_WINDOW), qs = get64(e + E_QUANT_START);
  if (pk > LM_KV_TURBOQUANT || lk > LM_KV_TURBOQUANT)
    return LM_ERRF(LM_ERR_CORRUPT, "%s: cache %d: unknown cache kind %u/%u", name, i, pk, lk);
  if (heads < 1 || heads > MAX_HEADS || hd < 1 || hd > MAX_HEAD_DIM)
    return LM_ERRF(LM_ERR_CORRUPT, "%s: cache %d: geometry %u heads x %u out of range", name, i,
                   heads, hd);
  int ring = lm_kv_kind_ring((lm_kv_kind)pk);
  if (ring != lm_kv_kind_ring((lm_kv_kind)lk) ||
      (ring ? window < 1 || window > (uint64_t)MAX_WINDOW : window != 0))
    return LM_ERRF(LM_ERR_CORRUPT, "%s: cache %d: bad ring window %llu", name, i,
                   (unsigned long long)window);
  c->plan = (lm_kv_spec){.kind = (lm_kv_kind)pk,
                         .n_kv_heads = (int)heads,
                         .head_dim = (int)hd,
                         .window = (int64_t)window};
  c->layout = c->plan;
  c->layout.kind = (lm_kv_kind)lk;
  if (lm_kv_kind_quant(c->plan.kind)) {
    c->plan.bits = (int)get32(e + E_PLAN_BITS);
    c->plan.group = (int)get32(e + E_PLAN_GROUP);
    if (!valid_quant(get32(e + E_PLAN_BITS), get32(e + E_PLAN_GROUP), hd) ||
        qs > (uint64_t)LM_KV_STATE_MAX_TOKENS)
      return LM_ERRF(LM_ERR_CORRUPT, "%s: cache %d: bad quantization %u/%u of head dim %u", name, i,
                     get32(e + E_PLAN_BITS), get32(e + E_PLAN_GROUP), hd);
    c->plan.quant_start = (int64_t)qs;
  } else if (lm_kv_kind_tq(c->plan.kind)) {
    LM_TRY(parse_tq_plan(e, name, i, &c->plan));
  } else if (get32(e + E_PLAN_BITS) || get32(e + E_PLAN_GROUP) || qs) {
    return LM_ERRF(LM_ERR_CORRUPT, "%s: cache %d: a plain plan with quantization fields", name, i);
  }
  if (!lm_kv_kind_tq(c->plan.kind) && (get32(e + E_PLAN_VBITS) || get32(e + E_LAYOUT_VBITS)))
    return LM_ERRF(LM_ERR_CORRUPT, "%s: cache %d: value bits on a kind that has none", name, i);
  /* The layout is the plan itself, or (pending) its plain form until plan.quant_start. */
  int delayed = lm_kv_kind_quant(c->plan.kind) && c->plan.quant_start > 0;
  int plain_form = (lm_kv_kind)lk == (ring ? LM_KV_ROTATING_PLAIN : LM_KV_PLAIN);
  if (pend > 1 || (pend ? !delayed || !plain_form : lk != pk))
    return LM_ERRF(LM_ERR_CORRUPT,
                   "%s: cache %d: layout kind %u does not follow plan kind %u (pending %u)", name,
                   i, lk, pk, pend);
  c->has_pending = (int)pend;
  if (lm_kv_kind_quant(c->layout.kind)) {
    c->layout.bits = c->plan.bits, c->layout.group = c->plan.group;
    if (get32(e + E_LAYOUT_BITS) != (uint32_t)c->plan.bits ||
        get32(e + E_LAYOUT_GROUP) != (uint32_t)c->plan.group)
      return LM_ERRF(LM_ERR_CORRUPT, "%s: cache %d: layout quantization differs from the plan's",
                     name, i);
  } else if (lm_kv_kind_tq(c->layout.kind)) { /* never pending: the layout is the plan */
    c->layout.bits = c->plan.bits, c->layout.group = c->plan.group;
    c->layout.v_bits = c->plan.v_bits;
    if (get32(e + E_LAYOUT_BITS) != (uint32_t)c->plan.bits ||
        get32(e + E_LAYOUT_GROUP) != (uint32_t)c->plan.group ||
        get32(e + E_LAYOUT_VBITS) != (uint32_t)c->plan.v_bits)
      return LM_ERRF(LM_ERR_CORRUPT, "%s: cache %d: layout quantization differs from the plan's",
                     name, i);
  } else if (get32(e + E_LAYOUT_BITS) || get32(e + E_LAYOUT_GROUP)) {
    return LM_ERRF(LM_ERR_CORRUPT, "%s: cache %d: a plain layout with quantization fields", name,
                   i);
  }
  c->dtype = dtype_of(get32(e + E_DTYPE));
  if (lm_kv_kind_coded(c->layout.kind) ? get32(e + E_DTYPE) != 0 : c->dtype == LM_DT_COUNT)
    return LM_ERRF(LM_ERR_CORRUPT, "%s: cache %d: bad element type code %u", name, i,
                   get32(e + E_DTYPE));
  c->n = (int64_t)get64(e + E_N);
  c->rows = (int64_t)get64(e + E_ROWS);
  if (get64(e + E_N) != (uint64_t)n_tokens || c->rows != rows_for(&c->layout, n_tokens))
    return LM_ERRF(LM_ERR_CORRUPT,
                   "%s: cache %d: %llu tokens in %llu rows; the file holds %lld tokens", name, i,
                   (unsigned long long)get64(e + E_N), (unsigned long long)get64(e + E_ROWS),
                   (long long)n_tokens);
  /* a ring's high-water mark: at most its spare slots + 1 past n once it has wrapped */
  uint64_t hi = get64(e + E_HIGH), slots = (uint64_t)lm_kv_ring_slots(c->plan.window);
  if (ring ? hi < (uint64_t)n_tokens ||
                 (hi > slots && hi - (uint64_t)n_tokens > LM_KV_RING_SPARE + 1)
           : hi != (uint64_t)n_tokens)
    return LM_ERRF(LM_ERR_CORRUPT, "%s: cache %d: high-water mark %llu for %lld tokens", name, i,
                   (unsigned long long)hi, (long long)n_tokens);
  c->high = (int64_t)hi;
  for (int k = E_RESERVED; k < LM_KV_STATE_ENTRY_BYTES; k++)
    if (e[k]) return LM_ERRF(LM_ERR_CORRUPT, "%s: cache %d: reserved bytes are not zero", name, i);
  return LM_OK;
}

/* One entry's data blocks: the size its geometry implies, aligned, in order, inside the file. */
static lm_status parse_entry_blocks(const uint8_t *e, const char *name, int i, uint64_t size,
                                    uint64_t *cursor, lm_kv_state_cache *c) {
  static const char *names[LM_KV_ARRAYS] = {"K",        "V",        "K scales",
                                            "K biases", "V scales", "V biases"};
  for (int a = 0; a < LM_KV_ARRAYS; a++) {
    lm_kv_state_block *bl = &c->arrays[a];
    bl->offset = get64(e + E_ARRAYS + 24 * a);
    bl->bytes = get64(e + E_ARRAYS + 24 * a + 8);
    bl->checksum = get64(e + E_ARRAYS + 24 * a + 16);
    uint64_t want =
        (uint64_t)c->rows * (uint64_t)layout_row_bytes(&c->layout, c->dtype, a); /* < 2^57 */
    if (bl->bytes != want)
      return LM_ERRF(LM_ERR_CORRUPT,
                     "%s: cache %d: %s block of %llu bytes; its geometry needs %llu", name, i,
                     names[a], (unsigned long long)bl->bytes, (unsigned long long)want);
    if (!want) {
      if (bl->offset || bl->checksum)
        return LM_ERRF(LM_ERR_CORRUPT, "%s: cache %d: empty %s block with an offset", name, i,
                       names[a]);
      continue;
    }
    if (bl->offset % LM_KV_STATE_ALIGN || bl->offset < *cursor || bl->offset > size ||
        bl->bytes > size - bl->offset)
      return LM_ERRF(
          LM_ERR_CORRUPT,
          "%s: cache %d: %s block [%llu, +%llu) is misaligned, out of order or past the end "
          "(%llu bytes)",
          name, i, names[a], (unsigned long long)bl->offset, (unsigned long long)bl->bytes,
          (unsigned long long)size);
    *cursor = bl->offset + bl->bytes;
  }
  return LM_OK;
}

static lm_status verify_data(const uint8_t *b, const char *name, const lm_kv_state_info *in) {
  for (int i = 0; i < in->n_caches; i++)
    for (int a = 0; a < LM_KV_ARRAYS; a++) {
      const lm_kv_state_block *bl = &in->caches[i].arrays[a];
      if (bl->bytes && lm_hash64(b + bl->offset, (size_t)bl->bytes, SEED_DATA) != bl->checksum)
        return LM_ERRF(LM_ERR_CORRUPT,
                       "%s: cache %d: data checksum mismatch in array %d (the file is corrupt)",
                       name, i, a);
    }
  return LM_OK;
}

static lm_status parse_body(const uint8_t *b, uint64_t size, const char *name, int verify,
                            lm_kv_state_info *in) {
  LM_TRY(parse_fixed(b, size, name, verify, in));
  uint64_t table_bytes = (uint64_t)in->n_caches * LM_KV_STATE_ENTRY_BYTES;
  uint64_t tokens_off = LM_KV_STATE_HEADER_BYTES + table_bytes,
           tokens_bytes = 4 * (uint64_t)in->n_tokens;
  if (verify & LM_KV_STATE_VERIFY_HEADER) {
    if (lm_hash64(b + LM_KV_STATE_HEADER_BYTES, (size_t)table_bytes, SEED_TABLE) !=
        get64(b + H_TABLE_SUM))
      return LM_ERRF(LM_ERR_CORRUPT, "%s: cache table checksum mismatch (the file is corrupt)",
                     name);
    if (lm_hash64(b + tokens_off, (size_t)tokens_bytes, SEED_TOKENS) != get64(b + H_TOKENS_SUM))
      return LM_ERRF(LM_ERR_CORRUPT, "%s: token ids checksum mismatch (the file is corrupt)", name);
  }
  if (!(in->caches = calloc((size_t)(in->n_caches ? in->n_caches : 1), sizeof *in->caches)) ||
      !(in->tokens = malloc((size_t)(tokens_bytes ? tokens_bytes : 4))))
    return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  if (tokens_bytes) memcpy(in->tokens, b + tokens_off, (size_t)tokens_bytes);
  uint64_t cursor = in->data_offset;
  for (int i = 0; i < in->n_caches; i++) {
    const uint8_t *e = b + LM_KV_STATE_HEADER_BYTES + (size_t)i * LM_KV_STATE_ENTRY_BYTES;
    LM_TRY(parse_entry_specs(e, name, i, in->n_tokens, &in->caches[i]));
    LM_TRY(parse_entry_blocks(e, name, i, size, &cursor, &in->caches[i]));
  }
  if (cursor != in->file_size)
    return LM_ERRF(LM_ERR_CORRUPT, "%s: the last block ends at %llu, the file at %llu", name,
                   (unsigned long long)cursor, (unsigned long long)in->file_size);
  return (verify & LM_KV_STATE_VERIFY_DATA) ? verify_data(b, name, in) : LM_OK;
}

lm_status lm_kv_state_parse(const uint8_t *buf, uint64_t size, const char *name, int verify,
                            lm_kv_state_info **out) {
  *out = NULL;
  lm_kv_state_info *in = calloc(1, sizeof *in);
  if (!in) return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  lm_status s = parse_body(buf, size, name, verify, in);
  if (s) {
    lm_kv_state_info_free(in);
    return s;
  }
  *out = in;
  return LM_OK;
}

/* ---- saving ------------------------------------------------------------------------------------
 */

static lm_status pwrite_all(int fd, const void *p, size_t n, uint64_t off, const char *tmp) {
  const char *c = p;
  while (n) {
    ssize_t w = pwrite(fd, c, n, (off_t)off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0)
      return LM_ERRF(LM_ERR_IO, "%s: write failed: %s", tmp,
                     w < 0 ? strerror(errno) : "no progress");
    c += w, n -= (size_t)w, off += (uint64_t)w;
  }
  return LM_OK;
}

/* Describes kv in `in` and assigns every block its place (no data read yet). */
static lm_status plan_file(const lm_kv_set *kv, const int32_t *tokens, int64_t n,
                           lm_kv_state_info *in) {
  if (n < 0 || n > LM_KV_STATE_MAX_TOKENS || (n && !tokens) || kv->n > LM_KV_STATE_MAX_CACHES)
    return LM_ERRF(LM_ERR_INVALID, "KV state: %lld tokens / %d caches out of range", (long long)n,
                   kv->n);
  if (!(in->caches = calloc((size_t)(kv->n ? kv->n : 1), sizeof *in->caches)))
    return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  in->version = LM_KV_STATE_VERSION;
  in->n_caches = kv->n;
  in->n_tokens = n;
  in->tokens = (int32_t *)tokens; /* borrowed: the caller frees in->caches only */
  in->data_offset = align_up(LM_KV_STATE_HEADER_BYTES + (uint64_t)kv->n * LM_KV_STATE_ENTRY_BYTES +
                             4 * (uint64_t)n);
  uint64_t cursor = in->data_offset;
  for (int i = 0; i < kv->n; i++) {
    const lm_kv_cache *c = kv->caches[i];
    lm_kv_state_cache *e = &in->caches[i];
    if (c->n != n)
      return LM_ERRF(LM_ERR_INVALID, "KV state: cache %d holds %lld tokens, not the %lld given", i,
                     (long long)c->n, (long long)n);
    e->plan = lm_kv_plan_spec(c);
    e->layout = lm_kv_layout_spec(c);
    e->has_pending = c->has_pending;
    e->dtype = lm_kv_kind_coded(c->kind) ? LM_DT_COUNT : c->dtype;
    if (!lm_kv_kind_coded(c->kind) && !dtype_code(c->dtype))
      return LM_ERRF(LM_ERR_UNSUPPORTED, "KV state: cache %d stores %s elements", i,
                     lm_dtype_name(c->dtype));
    e->n = n;
    e->rows = lm_kv_held(c);
    e->high = lm_kv_high(c);
    for (int a = 0; a < LM_KV_ARRAYS; a++) {
      e->arrays[a].bytes = (uint64_t)(e->rows * lm_kv_row_bytes(c, a));
      if (!e->arrays[a].bytes) continue;
      e->arrays[a].offset = align_up(cursor);
      cursor = e->arrays[a].offset + e->arrays[a].bytes;
    }
  }
  in->file_size = cursor;
  return LM_OK;
}

/* Streams one array from the backend into the file through a host buffer, hashing it on the way. */
static lm_status write_block(int fd, const char *tmp, const lm_kv_cache *c, const void *src,
                             lm_kv_state_block *bl, uint8_t *buf, size_t cap) {
  lm_hasher h;
  lm_hasher_init(&h, SEED_DATA);
  for (uint64_t done = 0; done < bl->bytes;) {
    size_t k = bl->bytes - done < cap ? (size_t)(bl->bytes - done) : cap;
    LM_TRY(c->be->ops->download(c->be, buf, (const char *)src + done, k));
    lm_hasher_update(&h, buf, k);
    LM_TRY(pwrite_all(fd, buf, k, bl->offset + done, tmp));
    done += k;
  }
  uint8_t d[32];
  lm_hasher_final(&h, d);
  bl->checksum = get64(d); /* = lm_hash64(block, SEED_DATA) */
  return LM_OK;
}

static lm_status write_all(int fd, const char *tmp, const lm_kv_set *kv, lm_kv_state_info *in) {
  size_t cap = 16u << 20;
  uint8_t *buf = malloc(cap);
  size_t hb = (size_t)in->data_offset;
  uint8_t *head = calloc(1, hb);
  lm_status s = buf && head ? LM_OK : LM_ERRF(LM_ERR_NOMEM, "out of memory");
  for (int i = 0; i < kv->n && !s; i++) {
    const lm_kv_cache *c = kv->caches[i];
    const void *arr[LM_KV_ARRAYS] = {c->k, c->v, c->ks, c->kb, c->vs, c->vb};
    for (int a = 0; a < LM_KV_ARRAYS && !s; a++)
      if (in->caches[i].arrays[a].bytes)
        s = write_block(fd, tmp, c, arr[a], &in->caches[i].arrays[a], buf, cap);
    if (s) s = lm_err_prefix(s, "cache %d", i);
  }
  if (!s) { /* the header goes last, once every checksum is known */
    put_header(head, in);
    s = pwrite_all(fd, head, hb, 0, tmp);
  }
  if (!s && ftruncate(fd, (off_t)in->file_size))
    s = LM_ERRF(LM_ERR_IO, "%s: cannot size the file: %s", tmp, strerror(errno));
  if (!s && fsync(fd)) s = LM_ERRF(LM_ERR_IO, "%s: fsync failed: %s", tmp, strerror(errno));
  free(buf);
  free(head);
  return s;
}

/* Makes the rename durable; a filesystem that cannot fsync a directory still has the file. */
static void sync_dir(const char *path) {
  char *copy = strdup(path);
  if (!copy) return;
  int dfd = open(dirname(copy), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    (void)fsync(dfd);
    close(dfd);
  }
  free(copy);
}

/* NAME.tmp-XXXXXX, the temporary name of a save in progress. */
static int is_tmp_name(const char *name) {
  size_t n = strlen(name);
  if (n < 12 || memcmp(name + n - 11, ".tmp-", 5)) return 0;
  for (size_t i = n - 6; i < n; i++)
    if (!((name[i] >= 'a' && name[i] <= 'z') || (name[i] >= 'A' && name[i] <= 'Z') ||
          (name[i] >= '0' && name[i] <= '9')))
      return 0;
  return 1;
}

/* Removes the temporary files that interrupted saves left in path's directory. A save in
 * progress holds an exclusive lock on its file, so a file whose lock can be taken has no writer
 * any more. Best effort: a file that cannot be examined is left alone. */
static void remove_stale_tmp(const char *path) {
  char *copy = strdup(path);
  DIR *d = copy ? opendir(dirname(copy)) : NULL;
  struct dirent *e;
  while (d && (e = readdir(d)) != NULL) {
    if (!is_tmp_name(e->d_name)) continue;
    int fd = openat(dirfd(d), e->d_name, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (fd < 0) continue;
    if (!fstat(fd, &st) && S_ISREG(st.st_mode) && !flock(fd, LOCK_EX | LOCK_NB))
      (void)unlinkat(dirfd(d), e->d_name, 0);
    close(fd);
  }
  if (d) closedir(d);
  free(copy);
}

lm_status lm_kv_state_save(const char *path, const uint8_t fp[LM_FINGERPRINT_BYTES],
                           const lm_kv_set *kv, const int32_t *tokens, int64_t n) {
  lm_kv_state_info in = {0};
  memcpy(in.fingerprint, fp, LM_FINGERPRINT_BYTES);
  lm_status s = plan_file(kv, tokens, n, &in);
  char tmp[4200];
  int fd = -1;
  if (!s && snprintf(tmp, sizeof tmp, "%s.tmp-XXXXXX", path) >= (int)sizeof tmp)
    s = LM_ERRF(LM_ERR_INVALID, "KV state: path too long");
  if (!s) remove_stale_tmp(path);
  if (!s && (fd = mkstemp(tmp)) < 0)
    s = LM_ERRF(LM_ERR_IO, "%s: cannot create a temporary file next to it: %s", path,
                strerror(errno));
  if (!s && flock(fd, LOCK_EX | LOCK_NB)) /* held until close: marks the save as live */
    s = LM_ERRF(LM_ERR_IO, "%s: cannot lock: %s", tmp, strerror(errno));
  if (!s) s = write_all(fd, tmp, kv, &in);
  if (fd >= 0 && close(fd) && !s)
    s = LM_ERRF(LM_ERR_IO, "%s: close failed: %s", tmp, strerror(errno));
  if (!s && rename(tmp, path))
    s = LM_ERRF(LM_ERR_IO, "%s: cannot replace it with the new state: %s", path, strerror(errno));
  if (s && fd >= 0) unlink(tmp); /* nothing half-written stays behind */
  if (!s) sync_dir(path);
  free(in.caches);
  return s ? lm_err_prefix(s, "saving KV state") : LM_OK;
}

/* ---- loading ------------------------------------------------------------------------------------
 */

static void convert(void *dst, lm_dtype dt, const uint8_t *src, lm_dtype st, size_t n) {
  for (size_t i = 0; i < n; i++) {
    float f;
    if (st == LM_DT_F32)
      memcpy(&f, src + 4 * i, 4);
    else {
      uint16_t h;
      memcpy(&h, src + 2 * i, 2);
      f = st == LM_DT_BF16 ? lm_bf16_to_f32(h) : lm_f16_to_f32(h);
    }
    if (dt == LM_DT_F32)
      memcpy((uint8_t *)dst + 4 * i, &f, 4);
    else {
      uint16_t h = dt == LM_DT_BF16 ? lm_f32_to_bf16(f) : lm_f32_to_f16(f);
      memcpy((uint8_t *)dst + 2 * i, &h, 2);
    }
  }
}

/* Uploads one block into backend memory dst, converting K/V elements when the dtypes differ. */
static lm_status upload_block(lm_backend *be, void *dst, const uint8_t *src, uint64_t bytes,
                              lm_dtype from, lm_dtype to) {
  if (from == to || from == LM_DT_COUNT) return be->ops->upload(be, dst, src, (size_t)bytes);
  size_t fs = lm_dtype_size(from), ts = lm_dtype_size(to), chunk = 1u << 20; /* elements per pass */
  uint64_t n = bytes / fs;
  uint8_t *buf = malloc(chunk * ts);
  if (!buf) return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  lm_status s = LM_OK;
  for (uint64_t i = 0; i < n && !s; i += chunk) {
    size_t k = n - i < chunk ? (size_t)(n - i) : chunk;
    convert(buf, to, src + i * fs, from, k);
    s = be->ops->upload(be, (char *)dst + i * ts, buf, k * ts);
  }
  free(buf);
  return s;
}

static lm_status check_expect(const lm_kv_state_info *in, const lm_kv_state_expect *e,
                              const char *path) {
  if (e->fingerprint && memcmp(in->fingerprint, e->fingerprint, LM_FINGERPRINT_BYTES)) {
    char a[17], b[17];
    return LM_ERRF(
        LM_ERR_INVALID, "%s: saved for another model (fingerprint %s..., this model %s...)", path,
        lm_fingerprint_short(in->fingerprint, a), lm_fingerprint_short(e->fingerprint, b));
  }
  if (in->n_caches != e->n_specs)
    return LM_ERRF(LM_ERR_INVALID, "%s: %d caches; this session's plan has %d", path, in->n_caches,
                   e->n_specs);
  for (int i = 0; i < in->n_caches; i++)
    if (!lm_kv_spec_equal(&in->caches[i].plan, &e->specs[i])) {
      char a[96], b[96];
      return LM_ERRF(LM_ERR_INVALID, "%s: cache %d was saved as %s; this session's plan is %s",
                     path, i, plan_text(&in->caches[i].plan, a, sizeof a),
                     plan_text(&e->specs[i], b, sizeof b));
    }
  for (int64_t t = 0; e->vocab_size && t < in->n_tokens; t++)
    if (in->tokens[t] < 0 || in->tokens[t] >= e->vocab_size)
      return LM_ERRF(LM_ERR_CORRUPT, "%s: token %lld is id %d, outside the vocabulary of %lld",
                     path, (long long)t, in->tokens[t], (long long)e->vocab_size);
  return LM_OK;
}

/* One cache from its entry: fresh, then each block checksummed and uploaded. */
static lm_status restore_cache(const uint8_t *map, const lm_kv_state_cache *ec, lm_backend *be,
                               lm_kv_cache **out) {
  lm_kv_cache *c;
  LM_TRY(lm_kv_create_restored(be, &ec->plan, &ec->layout, ec->has_pending, &c));
  lm_status s =
      lm_kv_reserve(c, ec->n); /* plain kinds grow as a live session would; n is 0: no conversion */
  void **arr[LM_KV_ARRAYS] = {&c->k, &c->v, &c->ks, &c->kb, &c->vs, &c->vb};
  for (int a = 0; a < LM_KV_ARRAYS && !s; a++) {
    const lm_kv_state_block *bl = &ec->arrays[a];
    if (!bl->bytes) continue;
    if (lm_hash64(map + bl->offset, (size_t)bl->bytes, SEED_DATA) != bl->checksum)
      s = LM_ERRF(LM_ERR_CORRUPT, "data checksum mismatch in array %d (the file is corrupt)", a);
    else
      s = upload_block(be, *arr[a], map + bl->offset, bl->bytes,
                       a <= LM_KV_V ? ec->dtype : LM_DT_COUNT, c->dtype);
  }
  if (s) {
    lm_kv_free(c);
    return s;
  }
  c->n = ec->n;
  c->hi = ec->high;
  *out = c;
  return LM_OK;
}

static lm_status restore_set(const uint8_t *map, const lm_kv_state_info *in, lm_backend *be,
                             const char *path, lm_kv_set **out) {
  lm_kv_set *s = calloc(1, sizeof *s);
  if (!s || !(s->caches = calloc((size_t)(in->n_caches ? in->n_caches : 1), sizeof *s->caches))) {
    free(s);
    return LM_ERRF(LM_ERR_NOMEM, "out of memory");
  }
  for (int i = 0; i < in->n_caches; i++) {
    lm_status st = restore_cache(map, &in->caches[i], be, &s->caches[i]);
    if (st) {
      lm_kv_set_free(s);
      return lm_err_prefix(st, "%s: cache %d", path, i);
    }
    s->n = i + 1;
  }
  *out = s;
  return LM_OK;
}

/* Maps path read-only; *size 0 means an empty file (no mapping). */
static lm_status map_file(const char *path, const uint8_t **map, uint64_t *size) {
  int fd;
  *map = NULL;
  *size = 0;
  struct stat stt;
  lm_status s = lm_file_open_regular(path, &fd, &stt);
  if (s) return lm_err_prefix(s, "KV state file");
  *map = NULL;
  *size = s ? 0 : (uint64_t)stt.st_size;
  if (!s && *size) {
    void *p = mmap(NULL, (size_t)*size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED)
      s = LM_ERRF(LM_ERR_IO, "%s: cannot map: %s", path, strerror(errno));
    else
      *map = p, (void)madvise(p, (size_t)*size, MADV_SEQUENTIAL);
  }
  close(fd);
  return s;
}

lm_status lm_kv_state_load_ex(const char *path, const lm_kv_state_expect *e, lm_backend *be,
                              lm_kv_set **out, int32_t **tokens, int64_t *n_tokens) {
  *out = NULL;
  *tokens = NULL;
  *n_tokens = 0;
  const uint8_t *map = NULL;
  uint64_t size = 0;
  LM_TRY(map_file(path, &map, &size));
  lm_kv_state_info *in = NULL;
  lm_status s = lm_kv_state_parse(map, size, path, LM_KV_STATE_VERIFY_HEADER, &in);
  if (!s) s = check_expect(in, e, path);
  if (!s) s = restore_set(map, in, be, path, out);
  if (map) munmap((void *)map, (size_t)size);
  if (!s && in->n_tokens) {
    *tokens = in->tokens;
    in->tokens = NULL;
  }
  if (!s) *n_tokens = in->n_tokens;
  lm_kv_state_info_free(in);
  return s;
}

lm_status lm_kv_state_load(const char *path, const lm_model *m, const lm_kv_spec *specs,
                           lm_backend *be, lm_kv_set **out, int32_t **tokens, int64_t *n_tokens) {
  uint8_t fp[LM_FINGERPRINT_BYTES];
  *out = NULL;
  *tokens = NULL;
  *n_tokens = 0;
  LM_TRY(lm_model_fingerprint(m, fp));
  lm_kv_state_expect e = {.fingerprint = fp,
                          .specs = specs,
                          .n_specs = m->cfg.n_caches,
                          .vocab_size = m->cfg.vocab_size};
  return lm_kv_state_load_ex(path, &e, be, out, tokens, n_tokens);
}
