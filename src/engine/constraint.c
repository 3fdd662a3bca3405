/* constraint.c — the per-sequence state machine of constraint.h.
 *
 *   START   nothing of the answer yet: the answer's first tokens, <|tool_call> (auto, with a call
 *           grammar; the only choice with required / named), <|channel> (once, when the model may
 *           reason), the stop ids when an empty answer is complete
 *   REASON  inside the reasoning channel: anything but the stop ids while an answer is still owed
 *           and <|tool_call> where no call may be made; <channel|> → START
 *   ANSWER  the answer's text has begun: its grammar (stop ids when complete), or free text
 *   CALL    inside a call: the call grammar, <tool_call|> once it is complete (only it once it is
 *           finished); <tool_call|> → AFTER
 *   AFTER   a call was made: another call or a stop id
 *   END     a stop id came (an ignore_eos sequence goes on sampling stop ids)
 */
#include "engine/constraint.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"

enum { C_START = 0, C_REASON, C_ANSWER, C_CALL, C_AFTER, C_END };

struct lm_constraint {
  lm_constraint_opts o;
  lm_matcher *answer, *call; /* NULL without the grammar */
  uint32_t *mask;            /* [words] */
  int64_t words;
  int phase;
  int reasoned; /* the channel was opened once: not again */
  int calls;    /* calls closed */
  /* what the next apply writes, decided by prepare for the current state */
  int prepared;
  int free_text;    /* 1: free text less a few ids; 0: the mask's ids only */
  int free_stops;   /* free text: the stop ids may come */
  int deny_channel; /* free text: <|channel> may not come (it was opened once) */
};

static int is_id(int32_t id, int32_t tok) { return tok >= 0 && id == tok; }

static int is_stop(const lm_constraint *c, int32_t id) {
  int32_t lo = 0, hi = c->o.n_stop_ids - 1;
  while (lo <= hi) {
    int32_t mid = lo + (hi - lo) / 2, v = c->o.stop_ids[mid];
    if (v == id) return 1;
    if (v < id)
      lo = mid + 1;
    else
      hi = mid - 1;
  }
  return 0;
}

lm_status lm_constraint_create(const lm_constraint_opts *o, lm_constraint **out) {
  *out = NULL;
  lm_constraint *c = calloc(1, sizeof *c);
  lm_status s = c ? LM_OK : LM_ERRF(LM_ERR_NOMEM, "out of memory (constraint)");
  if (!s) {
    c->o = *o;
    c->words = (o->n_vocab + 31) / 32;
    c->mask = calloc((size_t)(c->words ? c->words : 1), sizeof *c->mask);
    if (!c->mask) s = LM_ERRF(LM_ERR_NOMEM, "out of memory (constraint mask)");
  }
  if (!s && o->answer) s = lm_matcher_create(lm_grammar_ref_get(o->answer), o->vocab, &c->answer);
  if (!s && o->calls) s = lm_matcher_create(lm_grammar_ref_get(o->calls), o->vocab, &c->call);
  if (s) {
    if (c)
      lm_constraint_free(c);
    else {
      lm_grammar_ref_release(o->answer);
      lm_grammar_ref_release(o->calls);
    }
    return s;
  }
  c->phase = o->start_in_reasoning ? C_REASON : C_START;
  *out = c;
  return LM_OK;
}

void lm_constraint_free(lm_constraint *c) {
  if (!c) return;
  lm_matcher_free(c->answer);
  lm_matcher_free(c->call);
  lm_grammar_ref_release(c->o.answer);
  lm_grammar_ref_release(c->o.calls);
  free(c->mask);
  free(c);
}

/* ---- which ids --------------------------------------------------------------------------------
 */

/* A call may be opened: there is a grammar for it and the choice allows calls. */
static int may_call(const lm_constraint *c) {
  return c->call && c->o.call_open >= 0 && c->o.choice != LM_TOOLS_NONE;
}

/* The answer must be a call (required, named) until one was made. */
static int must_call(const lm_constraint *c) {
  return c->calls == 0 && (c->o.choice == LM_TOOLS_REQUIRED || c->o.choice == LM_TOOLS_NAMED) &&
         may_call(c);
}

/* An empty answer would do (the stop ids may end it before it starts). */
static int empty_ok(const lm_constraint *c) {
  if (must_call(c)) return 0;
  return !c->answer || lm_matcher_complete(c->answer);
}

static void allow(lm_constraint *c, int32_t id) {
  if (id >= 0 && id < c->o.n_vocab) c->mask[id / 32] |= 1u << (id % 32);
}

static void allow_stops(lm_constraint *c) {
  for (int32_t i = 0; i < c->o.n_stop_ids; i++)
    allow(c, c->o.stop_ids[i]);
}

static void deny(const lm_constraint *c, float *row, int32_t id) {
  if (id >= 0 && id < c->o.n_vocab) row[id] = -INFINITY;
}

/* KEEP[b][k]: all ones when bit k of the byte b is set, else zero: a mask byte as eight lane
 * masks, so a mixed byte is applied as a branchless blend the compiler vectorizes. */
#define KEEP_E(b, k) ((((b) >> (k)) & 1) ? 0xFFFFFFFFu : 0u)
#define KEEP_ROW(b)                                                                                \
  {                                                                                                \
    KEEP_E(b, 0), KEEP_E(b, 1), KEEP_E(b, 2), KEEP_E(b, 3), KEEP_E(b, 4), KEEP_E(b, 5),            \
        KEEP_E(b, 6), KEEP_E(b, 7)                                                                 \
  }
#define KEEP_4(b) KEEP_ROW(b), KEEP_ROW(b + 1), KEEP_ROW(b + 2), KEEP_ROW(b + 3)
#define KEEP_16(b) KEEP_4(b), KEEP_4(b + 4), KEEP_4(b + 8), KEEP_4(b + 12)
#define KEEP_64(b) KEEP_16(b), KEEP_16(b + 16), KEEP_16(b + 32), KEEP_16(b + 48)
static const uint32_t KEEP[256][8] = {KEEP_64(0), KEEP_64(64), KEEP_64(128), KEEP_64(192)};

#define NEG_INF_BITS 0xFF800000u /* -INFINITY as an IEEE-754 single */

/* Every id whose bit is clear becomes -inf. The row is the model's whole vocabulary (262,144 ids
 * for Gemma 4) and most words of a mask are all clear or all set: those take a store loop or
 * nothing, the few mixed ones a table blend (4x faster than a bit test per id, measured). */
static void apply_mask(const lm_constraint *c, float *row) {
  int64_t V = c->o.n_vocab, full = V / 32;
  for (int64_t w = 0; w < full; w++) {
    uint32_t m = c->mask[w], r[32];
    if (m == 0xFFFFFFFFu) continue;
    float *x = row + w * 32;
    if (!m) {
      for (int k = 0; k < 32; k++)
        x[k] = -INFINITY;
      continue;
    }
    memcpy(r, x, sizeof r); /* the floats as bits, without aliasing them */
    for (int q = 0; q < 4; q++) {
      const uint32_t *t = KEEP[(m >> (8 * q)) & 0xFFu];
      for (int k = 0; k < 8; k++)
        r[8 * q + k] = (r[8 * q + k] & t[k]) | (NEG_INF_BITS & ~t[k]);
    }
    memcpy(x, r, sizeof r);
  }
  for (int64_t i = full * 32; i < V; i++)
    if (!(c->mask[i / 32] >> (i % 32) & 1u)) row[i] = -INFINITY;
}

/* The grammar's mask of m (the words past its vocabulary stay clear). */
static lm_status fill(lm_constraint *c, lm_matcher *m) {
  memset(c->mask, 0, (size_t)c->words * sizeof *c->mask);
  return m ? lm_matcher_fill_mask(m, c->mask) : LM_OK;
}

/* Free text with a few ids taken away (reasoning, a free answer). */
static void apply_free(const lm_constraint *c, float *row) {
  if (c->deny_channel) deny(c, row, c->o.channel_open);
  if (!may_call(c)) deny(c, row, c->o.call_open);
  if (!c->free_stops)
    for (int32_t i = 0; i < c->o.n_stop_ids; i++)
      deny(c, row, c->o.stop_ids[i]);
}

static void set_free(lm_constraint *c, int stops, int deny_channel) {
  c->free_text = 1;
  c->free_stops = stops;
  c->deny_channel = deny_channel;
}

static lm_status prepare_start(lm_constraint *c) {
  if (!c->answer && !must_call(c)) { /* free text: the constraint is only about calls */
    set_free(c, 1, c->reasoned);
    return LM_OK;
  }
  LM_TRY(fill(c, must_call(c) ? NULL : c->answer));
  if (may_call(c)) allow(c, c->o.call_open);
  if (c->o.may_reason && !c->reasoned) allow(c, c->o.channel_open);
  if (empty_ok(c)) allow_stops(c);
  return LM_OK;
}

static lm_status prepare_phase(lm_constraint *c) {
  c->free_text = 0;
  switch (c->phase) {
  case C_START: return prepare_start(c);
  case C_REASON: set_free(c, empty_ok(c), 0); return LM_OK;
  case C_ANSWER:
    if (!c->answer) {
      set_free(c, 1, 0);
      return LM_OK;
    }
    LM_TRY(fill(c, c->answer));
    if (lm_matcher_complete(c->answer)) allow_stops(c);
    return LM_OK;
  case C_CALL:
    if (lm_matcher_finished(c->call)) {
      memset(c->mask, 0, (size_t)c->words * sizeof *c->mask);
    } else {
      LM_TRY(fill(c, c->call));
    }
    if (lm_matcher_complete(c->call)) allow(c, c->o.call_close);
    return LM_OK;
  case C_AFTER:
  case C_END:
    memset(c->mask, 0, (size_t)c->words * sizeof *c->mask);
    if (c->phase == C_AFTER && may_call(c)) allow(c, c->o.call_open);
    allow_stops(c);
    return LM_OK;
  }
  return LM_OK;
}

lm_status lm_constraint_prepare(lm_constraint *c) {
  if (c->prepared) return LM_OK;
  LM_TRY(prepare_phase(c));
  c->prepared = 1;
  return LM_OK;
}

lm_status lm_constraint_apply(lm_constraint *c, float *row) {
  LM_TRY(lm_constraint_prepare(c));
  if (c->free_text)
    apply_free(c, row);
  else
    apply_mask(c, row);
  return LM_OK;
}

/* ---- advancing ------------------------------------------------------------------------------- */

static lm_status refused(const char *what, int32_t id) {
  return LM_ERRF(LM_ERR_INVALID, "constrained decoding: id %d is not allowed %s", id, what);
}

static lm_status open_call(lm_constraint *c, int32_t id) {
  if (!may_call(c)) return refused("(no tool call may be made)", id);
  lm_matcher_reset(c->call);
  c->phase = C_CALL;
  return LM_OK;
}

static lm_status accept_start(lm_constraint *c, int32_t id) {
  if (is_id(id, c->o.channel_open) && c->o.may_reason && !c->reasoned) {
    c->phase = C_REASON;
    c->reasoned = 1;
    return LM_OK;
  }
  if (is_id(id, c->o.call_open) && (c->answer || must_call(c) || may_call(c)))
    return open_call(c, id);
  if (must_call(c)) return refused("(the answer must be a tool call)", id);
  if (c->answer && lm_matcher_accept(c->answer, id)) return refused("by the answer's grammar", id);
  c->phase = C_ANSWER;
  return LM_OK;
}

lm_status lm_constraint_accept(lm_constraint *c, int32_t id) {
  c->prepared = 0; /* a new state: the next apply prepares again */
  if (is_stop(c, id)) {
    if (c->phase == C_CALL || (c->phase != C_AFTER && c->phase != C_END && !empty_ok(c) &&
                               !(c->phase == C_ANSWER && lm_matcher_complete(c->answer))))
      return refused("before the answer is complete", id);
    c->phase = C_END;
    return LM_OK;
  }
  switch (c->phase) {
  case C_START: return accept_start(c, id);
  case C_REASON:
    if (is_id(id, c->o.channel_close)) {
      c->phase = C_START;
      c->reasoned = 1;
    } else if (is_id(id, c->o.call_open)) {
      return open_call(c, id);
    }
    return LM_OK;
  case C_ANSWER:
    if (!c->answer) return is_id(id, c->o.call_open) ? open_call(c, id) : LM_OK;
    return lm_matcher_accept(c->answer, id) ? refused("by the answer's grammar", id) : LM_OK;
  case C_CALL:
    if (is_id(id, c->o.call_close)) {
      if (!lm_matcher_complete(c->call)) return refused("(the call is not complete)", id);
      c->phase = C_AFTER;
      c->calls++;
      return LM_OK;
    }
    return lm_matcher_accept(c->call, id) ? refused("by the tool call grammar", id) : LM_OK;
  case C_AFTER:
    if (is_id(id, c->o.call_open)) return open_call(c, id);
    return refused("after a tool call (another call or the end)", id);
  default: return refused("after the end", id);
  }
}

int lm_constraint_finished(const lm_constraint *c) {
  return c->phase == C_ANSWER && c->answer && lm_matcher_finished(c->answer);
}
