/* vocab.h — the vocabulary as the mask walk sees it: a byte trie of the token pieces in
 * depth-first preorder. A node's subtree is the contiguous range [i, end[i]) and the tokens of a
 * subtree are the contiguous range tok[ntok[i] .. ntok[end[i]]), so "every token below here" is
 * a range, never a search. Tokens of length 0 (special tokens) are not in the trie: no grammar
 * allows them. Immutable once built; shared by every matcher. */
#ifndef LM_GRAMMAR_VOCAB_H
#define LM_GRAMMAR_VOCAB_H

#include <stdint.h>

#include "grammar/grammar.h"

/* Longer pieces are treated as never allowed (no tokenizer has them; the walk's depth is bounded
 * by this). */
#define LM_GV_MAX_PIECE 1024u

struct lm_grammar_vocab {
  int32_t n; /* ids 0 .. n-1 */
  char *bytes;
  uint64_t *off; /* piece of id i: bytes + off[i], len[i] bytes */
  uint32_t *len;
  uint32_t max_len;
  uint64_t hash; /* of every piece: the mask caches are per vocabulary content */

  uint32_t n_nodes; /* node 0 is the root (the empty prefix) */
  uint8_t *nbyte;   /* the byte on the edge into the node */
  uint32_t *nend;   /* one past the last node of the subtree */
  uint32_t *ntok;   /* n_nodes + 1 entries: the node's tokens start at tok[ntok[i]] */
  int32_t *tok;     /* token ids in trie order */
  uint32_t n_tok;
  /* Per node, what the edges of its subtree (its own edge included) hold: the ASCII bytes as a
   * 128-bit set, and in nflags whether there are bytes >= 0x80 (LM_GV_NONASCII) and whether
   * every piece below reads, from this node's depth on, as well-formed UTF-8 that may stop in
   * the middle of its last character (LM_GV_UTF8). Lets the mask walk accept a whole subtree at
   * once where all of it leads a state back to itself (token_mask.c). */
  uint64_t (*nsum)[2];
  uint8_t *nflags;
};

enum { LM_GV_NONASCII = 1, LM_GV_UTF8 = 2 };

#endif
