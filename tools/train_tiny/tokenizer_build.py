"""The tokenizer of lumen-tiny-kjv: a BPE trained on the corpus, shipped in the shape of the Gemma 3/4
tokenizer.json (normalizer Replace " "->"▁", pre_tokenizer Split " " MergedWithPrevious (a no-op after the
normalizer), BPE with byte_fallback and <unk>, decoder Replace "▁"->" " + ByteFallback + Fuse, a
TemplateProcessing post-processor that prepends <bos>), so lumen's Gemma tokenizer path serves it.

Ids: 0..22 the special tokens below (Gemma 4's control tokens at low ids of our choosing), 23..278 the byte
tokens <0x00>..<0xFF>, then the learned tokens in training order (alphabet first, then one per merge).

Training pre-splits the text (before each "▁", digits one by one, punctuation and "\n" alone), so no learned
token contains "▁" except as its first character, and none joins a digit, a punctuation mark or a newline to
anything. Hence merges can never cross those boundaries, and the shipped tokenizer, which does not pre-split,
encodes exactly as the training one (train.py checks this on the whole training set).

Two trainers: HF `tokenizers` (used on the GPU machine) and a stdlib one (for --dry-run here; same
pre-splitting and JSON, its merge order may differ from HF's on ties)."""

import heapq
import json
import re
import string
import unicodedata
from collections import Counter, defaultdict

SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>",
            "<|turn>", "<turn|>", "<|think|>", "<|channel>", "<channel|>",
            "<|tool>", "<tool|>", "<|tool_call>", "<tool_call|>", "<|tool_response>", "<tool_response|>",
            '<|"|>',
            "<|image>", "<image|>", "<|audio>", "<audio|>", "<|image|>", "<|audio|>", "<|video|>"]
BYTE_TOKENS = ["<0x%02X>" % b for b in range(256)]
SPACE = "\u2581"
# Every printable ASCII character (space as ▁) and the newline are single tokens, so chat and tool syntax
# ({}[]:_"|<>) never needs byte fallback.
ALPHABET = [SPACE if c == " " else c for c in (chr(i) for i in range(0x20, 0x7F))] + ["\n"]


def special_id(tok):
    return SPECIALS.index(tok)


# ---------------------------------------------------------------- pre-splitting (training only)

def _is_punct(c):
    return c in string.punctuation or unicodedata.category(c).startswith("P")


def presplit(text):
    """Pieces of one special-free text, as the training pre_tokenizer (TRAIN_PRETOKENIZER) cuts them."""
    s = text.replace(" ", SPACE)
    pieces = [p for p in re.split("(?=%s)" % SPACE, s) if p]
    out = []
    for p in pieces:
        cur = ""
        for c in p:
            if c.isdigit() or _is_punct(c) or c == "\n":
                if cur:
                    out.append(cur)
                out.append(c)
                cur = ""
            else:
                cur += c
        if cur:
            out.append(cur)
    return out


# The training pre_tokenizer, as tokenizer.json JSON (presplit() above is its stdlib twin).
TRAIN_PRETOKENIZER = {"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"String": SPACE}, "behavior": "MergedWithNext", "invert": False},
    {"type": "Digits", "individual_digits": True},
    {"type": "Punctuation", "behavior": "Isolated"},
    {"type": "Split", "pattern": {"String": "\n"}, "behavior": "Isolated", "invert": False}]}


def _training_tokenizer_json():
    """An empty BPE with the Gemma normalizer and the training pre_tokenizer, for BpeTrainer."""
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
            "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": SPACE},
            "pre_tokenizer": TRAIN_PRETOKENIZER, "post_processor": None, "decoder": None,
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                      "ignore_merges": False, "vocab": {}, "merges": []}}


# ---------------------------------------------------------------- trainers

def n_learned(vocab_size):
    n = vocab_size - len(SPECIALS) - len(BYTE_TOKENS)
    if n <= len(ALPHABET):
        raise ValueError("vocab_size %d leaves no room for merges" % vocab_size)
    return n


def train_hf(texts, vocab_size):
    """Learned tokens (in id order) and merges, from HF tokenizers' BpeTrainer."""
    from tokenizers import Tokenizer, trainers
    tok = Tokenizer.from_str(json.dumps(_training_tokenizer_json(), ensure_ascii=False))
    trainer = trainers.BpeTrainer(vocab_size=n_learned(vocab_size), min_frequency=2, show_progress=False,
                                  initial_alphabet=ALPHABET, special_tokens=[])
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    model = json.loads(tok.to_str())["model"]
    learned = [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, list) else m.split(" ", 1) for m in model["merges"]]
    return learned, merges


def train_stdlib(texts, vocab_size):
    """The same pre-splitting and target size, with a plain BPE (most frequent pair, ties by first seen)."""
    words = Counter()
    for t in texts:
        words.update(presplit(t))
    alphabet = list(ALPHABET) + sorted({c for w in words for c in w} - set(ALPHABET))
    seqs = [list(w) for w in words]
    counts = [words[w] for w in words]
    pair_count = defaultdict(int)
    where = defaultdict(set)
    for wi, s in enumerate(seqs):
        for a, b in zip(s, s[1:]):
            pair_count[(a, b)] += counts[wi]
            where[(a, b)].add(wi)
    heap = [(-c, p) for p, c in pair_count.items()]
    heapq.heapify(heap)
    learned, merges = list(alphabet), []
    target = n_learned(vocab_size)
    while len(learned) < target and heap:
        negc, pair = heapq.heappop(heap)
        cur = pair_count.get(pair, 0)
        if cur != -negc:                      # a stale entry: requeue with the current count
            if cur >= 2:
                heapq.heappush(heap, (-cur, pair))
            continue
        if cur < 2:
            break
        new = pair[0] + pair[1]
        merges.append([pair[0], pair[1]])
        learned.append(new)
        touched = set()
        for wi in list(where[pair]):
            s, c = seqs[wi], counts[wi]
            for a, b in zip(s, s[1:]):
                pair_count[(a, b)] -= c
                where[(a, b)].discard(wi)
            i, out = 0, []
            while i < len(s):
                if i + 1 < len(s) and s[i] == pair[0] and s[i + 1] == pair[1]:
                    out.append(new)
                    i += 2
                else:
                    out.append(s[i])
                    i += 1
            seqs[wi] = out
            for a, b in zip(out, out[1:]):
                pair_count[(a, b)] += c
                where[(a, b)].add(wi)
                touched.add((a, b))
        pair_count.pop(pair, None)
        for p in touched:
            if pair_count.get(p, 0) >= 2:
                heapq.heappush(heap, (-pair_count[p], p))
    return learned, merges


# ---------------------------------------------------------------- the shipped files

def build_tokenizer_json(learned, merges, vocab_size):
    """tokenizer.json in the Gemma 3/4 shape; unused ids (if training learned fewer tokens) are filled."""
    vocab = {}
    for t in SPECIALS + BYTE_TOKENS:
        vocab[t] = len(vocab)
    for t in learned:
        if t in vocab:
            raise ValueError("learned token %r collides with a reserved one" % t)
        vocab[t] = len(vocab)
    k = 0
    while len(vocab) < vocab_size:
        vocab["<unused%d>" % k] = len(vocab)
        k += 1
    if len(vocab) != vocab_size:
        raise ValueError("vocab has %d entries, want %d" % (len(vocab), vocab_size))
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, t in enumerate(SPECIALS)]
    bos = {"SpecialToken": {"id": "<bos>", "type_id": 0}}
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": SPACE},
        "pre_tokenizer": {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious",
                          "invert": False},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [bos, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": "<bos>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<bos>": {"id": "<bos>", "ids": [special_id("<bos>")], "tokens": ["<bos>"]}}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": SPACE}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }


def tokenizer_config(max_len):
    added = {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False, "special": True} for i, t in enumerate(SPECIALS)}
    return {"add_bos_token": True, "add_eos_token": False, "added_tokens_decoder": added,
            "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>",
            "clean_up_tokenization_spaces": False, "model_max_length": max_len, "padding_side": "left",
            "spaces_between_special_tokens": False, "tokenizer_class": "PreTrainedTokenizerFast"}


# ---------------------------------------------------------------- a stdlib encoder (dry run, cross-checks)

class StdlibBPE:
    """Encodes like the shipped tokenizer.json (special tokens first, then BPE per pre-split piece, byte
    fallback for characters outside the vocabulary)."""

    def __init__(self, tj):
        self.vocab = tj["model"]["vocab"]
        self.rank = {(a, b): i for i, (a, b) in enumerate(tj["model"]["merges"])}
        self.special = {a["content"]: a["id"] for a in tj["added_tokens"]}
        self.split_re = re.compile("(%s)" % "|".join(re.escape(s) for s in
                                                     sorted(self.special, key=len, reverse=True)))
        self.inv = {i: t for t, i in self.vocab.items()}

    def _bpe(self, piece):
        syms = list(piece)
        while len(syms) > 1:
            best = min(((self.rank.get((a, b), 1 << 30), i) for i, (a, b) in enumerate(zip(syms, syms[1:]))))
            if best[0] == 1 << 30:
                break
            i = best[1]
            syms[i:i + 2] = [syms[i] + syms[i + 1]]
        ids = []
        for s in syms:
            if s in self.vocab:
                ids.append(self.vocab[s])
            else:
                ids.extend(self.vocab["<0x%02X>" % b] for b in s.encode("utf-8"))
        return ids

    def encode(self, text, add_bos=False):
        ids = [special_id("<bos>")] if add_bos else []
        for part in self.split_re.split(text):
            if not part:
                continue
            if part in self.special:
                ids.append(self.special[part])
            else:
                for p in presplit(part):
                    ids.extend(self._bpe(p))
        return ids

    def decode(self, ids):
        out, buf = [], b""
        for i in ids:
            t = self.inv[i]
            if re.fullmatch(r"<0x[0-9A-F]{2}>", t):
                buf += bytes([int(t[3:5], 16)])
                continue
            if buf:
                out.append(buf.decode("utf-8", "replace"))
                buf = b""
            out.append(t.replace(SPACE, " "))
        if buf:
            out.append(buf.decode("utf-8", "replace"))
        return "".join(out)
