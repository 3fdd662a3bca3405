/* kv.h — KV caches as values with identities (architecture guide, "Caches are values").
 *
 * A cache holds the keys and values one donor layer wrote, for one sequence, in backend
 * memory. Every kind reports a stable signature(), bytes_per_token() and its capacity
 * (LM_KV_UNBOUNDED, or a ring's window); the memory for N tokens of context is
 * bytes_per_token × min(N, capacity). Kinds:
 *   kv:plain                        slot = position; grows (reserve) before a step, never during
 *   kv:rotating-plain               ring of window + LM_KV_RING_SPARE slots, slot = position %
 * slots kv:quant:<bits>:<group>         plain layout of MLX affine codes along head_dim (bits 4 or
 * 8, groups 32/64/128) + bf16 scales and biases, quantized on append
 *   kv:rotating-quant:<bits>:<group> the same in a ring
 *   kv:turboquant:<k>:<v>           plain layout of TurboQuant rows (kv/tq_codec.h): affine keys
 *                                   of k bits (2, 4, 5, 8), FWHT-rotated Lloyd-Max values of v
 *                                   bits (2-5), fp16 scales (and key zeros) per 32 elements of
 *                                   each head; full-attention layers only, never a ring
 * Quantized kinds store what lm_affine_quantize_row computes from the f32 K/V (codes from
 * the f32 scale; scale and bias rounded to bf16); every read, the writing chunk's own queries
 * included, sees f32(bf16 scale) * q + f32(bf16 bias), so results do not depend on chunking.
 * TurboQuant caches are read the same way, except that their values stay in the rotated
 * domain (centroid * scale): attention, linear in V, accumulates them so and un-rotates each
 * output row once.
 * Attention reads a cache in place (backend ops, dispatched on the signature); a step's
 * chunk is appended only after every layer that reads it has attended over it, so a ring
 * never loses keys the chunk's own queries still need.
 *
 * Rollback: a ring keeps LM_KV_RING_SPARE slots past its layer's window, so after it wraps the
 * last tokens can still be trimmed (speculative decoding's rejected drafts, a chat turn whose
 * ending the template re-renders). Each append past the ring overwrites the position `slots`
 * back; the cache remembers the highest length it reached since creation (`hi`), so positions
 * below hi - slots are known to be gone. A trim to n' is allowed while the next token's window,
 * positions n' - window + 1 .. n' - 1, is intact: n' >= hi - LM_KV_RING_SPARE - 1. */
#ifndef LM_KV_KV_H
#define LM_KV_KV_H

#include <stdint.h>

#include "backend/backend.h"
#include "kv/tq_codec.h"

#define LM_KV_UNBOUNDED INT64_MAX
/* Slots a ring keeps past its window: a wrapped ring can roll back this many tokens + 1. */
#define LM_KV_RING_SPARE 16
/* Slots of the ring of a layer with this sliding window. */
static inline int64_t lm_kv_ring_slots(int64_t window) { return window + LM_KV_RING_SPARE; }

typedef enum lm_kv_kind {
  LM_KV_PLAIN = 0,
  LM_KV_ROTATING_PLAIN = 1,
  LM_KV_QUANT = 2,
  LM_KV_ROTATING_QUANT = 3,
  LM_KV_TURBOQUANT = 4,
} lm_kv_kind;

/* The MLX affine kinds (the only ones --kv-quant-start delays). */
static inline int lm_kv_kind_quant(lm_kv_kind k) {
  return k == LM_KV_QUANT || k == LM_KV_ROTATING_QUANT;
}
static inline int lm_kv_kind_tq(lm_kv_kind k) { return k == LM_KV_TURBOQUANT; }
/* Kinds that store codes: a step stages its chunk (kv_stage) before attending. */
static inline int lm_kv_kind_coded(lm_kv_kind k) { return lm_kv_kind_quant(k) || lm_kv_kind_tq(k); }
static inline int lm_kv_kind_ring(lm_kv_kind k) {
  return k == LM_KV_ROTATING_PLAIN || k == LM_KV_ROTATING_QUANT;
}

/* What a session's cache set looks like: one entry per cache (donor layer). */
typedef struct lm_kv_spec {
  lm_kv_kind kind;
  int n_kv_heads, head_dim;
  int64_t window;      /* rotating kinds: the layer's sliding window (the ring has more slots) */
  int bits, group;     /* quantized kinds; turboquant: key bits, and group LM_TQ_BLOCK */
  int v_bits;          /* turboquant: value bits */
  int64_t quant_start; /* quantized kinds: stay plain until the cache holds this many tokens */
} lm_kv_spec;

/* Storage arrays of a cache: K and V rows (elements, or codes), and for quantized kinds the
 * per-group scales and biases of each. TurboQuant: key codes, value codes, key scales, key
 * zeros, value scales (fp16), no fifth array; each row is the heads' rows one after another. */
enum { LM_KV_K = 0, LM_KV_V, LM_KV_KS, LM_KV_KB, LM_KV_VS, LM_KV_VB, LM_KV_ARRAYS };

struct lm_kv_cache {
  lm_kv_kind kind;
  lm_backend *be;
  int n_kv_heads, head_dim;
  int bits, group; /* quantized kinds; turboquant: key bits, LM_TQ_BLOCK */
  int v_bits;      /* turboquant: value bits */
  lm_tq_params tq; /* turboquant: the codec's geometry and tables */
  lm_dtype dtype;  /* element type of plain K and V (the backend's activation dtype) */
  int64_t window;  /* ring slots for rotating kinds (lm_kv_ring_slots of the spec's); 0 for plain */
  int64_t spec_window; /* rotating kinds: the spec's (the layer's) window */
  int64_t slots;       /* allocated slots */
  int64_t n;           /* tokens appended so far = next position */
  int64_t hi;          /* rings: the highest n reached before the last trim or copy (lm_kv_high) */
  void *k, *v;         /* backend memory [slots][row]: elements (plain) or packed codes (quant) */
  void *ks, *kb, *vs, *vb; /* quant: bf16 [slots][n_kv_heads*head_dim/group] */
  lm_kv_spec pending; /* a plain cache that becomes this quantized kind at pending.quant_start */
  int has_pending;
};

/* Bytes of one slot's row of array a (LM_KV_K...). */
int64_t lm_kv_row_bytes(const lm_kv_cache *c, int a);

/* Bytes a token's staged K and V take for a quantized cache: the six arrays' rows in order
 * (K codes, V codes, K scales, K biases, V scales, V biases; turboquant's five the same way);
 * 0 for plain caches. The
 * workspace bound over every supported kind is lm_kv_stage_row_bound(w) for w = kv_heads*hd. */
int64_t lm_kv_stage_row_bytes(const lm_kv_cache *c);
static inline int64_t lm_kv_stage_row_bound(int64_t w) { return 2 * w + 4 * (w / 32) * 2; }

lm_status lm_kv_create(lm_backend *be, const lm_kv_spec *spec, lm_kv_cache **out);

/* Tokens a cache of this spec holds at most: LM_KV_UNBOUNDED, or a ring's slots. */
static inline int64_t lm_kv_spec_capacity(const lm_kv_spec *s) {
  return lm_kv_kind_ring(s->kind) ? lm_kv_ring_slots(s->window) : LM_KV_UNBOUNDED;
}

/* What a cache of this spec would report, without creating one (planning, `lumen info`).
 * act: the element type of plain caches (the backend's activation dtype). */
int64_t lm_kv_spec_bytes_per_token(const lm_kv_spec *spec, lm_dtype act);
const char *lm_kv_spec_signature(const lm_kv_spec *spec, char *buf, size_t n);
void lm_kv_free(lm_kv_cache *c);

/* 1 if sig is "kv:turboquant:K:V" with widths the codec has (a backend's supports_cache; the
 * head dim is checked when a cache is created). */
int lm_kv_tq_sig_ok(const char *sig);

/* "kv:plain", "kv:rotating-plain", ... written into buf (NUL-terminated). */
const char *lm_kv_signature(const lm_kv_cache *c, char *buf, size_t n);
/* Bytes stored per token held (keys + values). */
int64_t lm_kv_bytes_per_token(const lm_kv_cache *c);
/* Tokens it can hold: LM_KV_UNBOUNDED or the ring's slots. */
int64_t lm_kv_capacity(const lm_kv_cache *c);
/* Tokens it holds now: min(n, capacity). */
int64_t lm_kv_held(const lm_kv_cache *c);
/* Bytes it holds now. */
int64_t lm_kv_bytes(const lm_kv_cache *c);
/* Makes room for n_new more tokens (plain kinds grow; rings never need to), and converts a
 * cache that reached its --kv-quant-start length. Outside steps: the signature may change. */
lm_status lm_kv_reserve(lm_kv_cache *c, int64_t n_new);
/* Reallocates a plain cache to exactly max(slots, n, 1) slots, keeping its rows (snapshots
 * hold no slack; a later reserve grows it again); a ring keeps its window. Outside steps. */
lm_status lm_kv_fit(lm_kv_cache *c, int64_t slots);
/* Drops the last n tokens. A wrapped ring gives back at most what its spare slots kept (see
 * "Rollback" above); past that the positions are gone: LM_ERR_STATE, and the caller
 * re-prefills. */
lm_status lm_kv_trim(lm_kv_cache *c, int64_t n);
/* A ring's highest length reached (n only grows between trims and copies); n for plain kinds. */
static inline int64_t lm_kv_high(const lm_kv_cache *c) {
  return c->window && c->hi > c->n ? c->hi : c->n;
}
/* The shortest length a trim may reach: 0, or for a ring that has overwritten positions, the
 * one whose next token still finds its whole window. */
static inline int64_t lm_kv_min_len(const lm_kv_cache *c) {
  int64_t hi = lm_kv_high(c);
  return c->window && hi > c->window ? hi - LM_KV_RING_SPARE - 1 : 0;
}
/* Slot of absolute position pos (which must be held). */
static inline int64_t lm_kv_slot(const lm_kv_cache *c, int64_t pos) {
  return c->window ? pos % c->window : pos;
}
/* Oldest position still held. */
static inline int64_t lm_kv_first_held(const lm_kv_cache *c) {
  return c->window && c->n > c->window ? c->n - c->window : 0;
}

/* A sequence's caches: one per donor layer of the model. */
typedef struct lm_kv_set {
  int n;
  lm_kv_cache **caches;
} lm_kv_set;

lm_status lm_kv_set_create(lm_backend *be, const lm_kv_spec *specs, int n, lm_kv_set **out);
void lm_kv_set_free(lm_kv_set *s);
lm_status lm_kv_set_reserve(lm_kv_set *s, int64_t n_new);
lm_status lm_kv_set_trim(lm_kv_set *s, int64_t n);
/* The shortest length every cache of the set may be trimmed to. */
int64_t lm_kv_set_min_len(const lm_kv_set *s);
/* Tokens appended to the set (all its caches agree). */
int64_t lm_kv_set_len(const lm_kv_set *s);
int64_t lm_kv_set_bytes(const lm_kv_set *s);

#endif
