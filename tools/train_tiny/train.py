#!/usr/bin/env python3
"""Train lumen-tiny-kjv, the embedded demo model: a ~11.5M-parameter Gemma 4 text decoder (sliding and full
layers, per-layer embeddings, KV sharing) on the King James Bible, with a BPE tokenizer trained here.

Runs on the GPU machine (torch + transformers 5.17 + tokenizers + jinja2), from the repository root, in
wall-clock-bounded runs that checkpoint as they go:

    python3 tools/train_tiny/train.py --minutes 7 --export .train_tiny/export --pack "$OUT"
    python3 tools/train_tiny/train.py --resume .train_tiny/ckpt --minutes 7 --export ... --pack "$OUT"

Without --steps the schedule length is min(--epochs, what fits in this run's budget), measured after the
first steps and then fixed (stored in the checkpoint, printed, and recorded in train_meta.json; pass
--steps N to reproduce it). --dry-run builds the documents and a tokenizer with the stdlib fallbacks and
prints samples, without torch or tokenizers. See tools/train_tiny/README.md."""

import time

T_START = time.time()

import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import corpus  # noqa: E402
import geometry  # noqa: E402
import tokenizer_build as tb  # noqa: E402

MODEL_NAME = "lumen-tiny-kjv"
TEMPLATE_PATH = os.path.join(ROOT, "models", MODEL_NAME, "chat_template.jinja")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", default=os.path.join(ROOT, ".train_tiny", "corpus"))
    p.add_argument("--ckpt", default=os.path.join(ROOT, ".train_tiny", "ckpt"), help="checkpoint folder")
    p.add_argument("--resume", help="continue from the checkpoint in this folder")
    p.add_argument("--export", help="write the model folder (bf16 safetensors, configs, tokenizer, parity) here")
    p.add_argument("--pack", help="also write the export as .tgz parts of <= 15 MiB into this folder")
    p.add_argument("--minutes", type=float, default=7.0, help="wall budget of this run, setup and export included")
    p.add_argument("--export-reserve", type=float, default=80.0, help="seconds kept for eval + export")
    p.add_argument("--steps", type=int, default=0, help="schedule length (0: auto, see --epochs)")
    p.add_argument("--epochs", type=float, default=30.0, help="cap on the auto schedule, in passes over the data")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--min-lr-frac", type=float, default=0.1)
    p.add_argument("--warmup", type=int, default=150)
    p.add_argument("--wd", type=float, default=0.1)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--chat-share", type=float, default=0.25, help="share of chat text (by characters)")
    p.add_argument("--views", type=int, default=4, help="distinct document sets, used in turn by the epochs")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--log-every", type=int, default=25)
    p.add_argument("--eval-every", type=int, default=0, help="0: ten evaluations per schedule")
    p.add_argument("--ckpt-every-min", type=float, default=2.0)
    p.add_argument("--dry-run", action="store_true", help="stdlib only: build documents and a tokenizer, print")
    p.add_argument("--dry-out", default=os.path.join(ROOT, ".train_tiny", "dry"))
    return p.parse_args(argv)


class Log:
    """Prints with elapsed time and keeps a copy for train_log.txt."""

    def __init__(self):
        self.lines = []
        self.failed = []

    def __call__(self, *parts):
        line = "[%6.1fs] %s" % (time.time() - T_START, " ".join(str(p) for p in parts))
        print(line, flush=True)
        self.lines.append(line)


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# ---------------------------------------------------------------- data (shared by the dry run)

def load_data(args, log):
    path = os.path.join(args.corpus, "kjv.txt")
    if not os.path.exists(path):
        sys.exit("train: %s missing; run tools/train_tiny/prepare_corpus.sh first" % path)
    source = {}
    if os.path.exists(os.path.join(args.corpus, "SOURCE.json")):
        with open(os.path.join(args.corpus, "SOURCE.json")) as f:
            source = json.load(f)
    sha = sha256_file(path)
    if source.get("sha256") and source["sha256"] != sha:
        sys.exit("train: %s does not match its SOURCE.json sha256" % path)
    verses = corpus.read_verses(path)
    train_ch, held_ch = corpus.split_heldout(verses)
    log("corpus: %d verses, sha256 %s; %d training chapters, %d held-out chapters (%d verses)" % (
        len(verses), sha[:16], len(train_ch), len(held_ch), sum(len(v) for v in held_ch.values())))
    import jinja2  # noqa: F401  (a clear error if missing)
    with open(TEMPLATE_PATH, encoding="utf-8") as f:
        template = corpus.jinja_env().from_string(f.read())
    views = [corpus.build_view(train_ch, args.seed, v, template, args.chat_share) for v in range(args.views)]
    for i, (raw, chat) in enumerate(views):
        rc, cc = sum(len(t) for t, _ in raw), sum(len(t) for t in chat)
        log("view %d: %d raw documents (%d chars), %d chat documents (%d chars, %.1f%%)" % (
            i, len(raw), rc, len(chat), cc, 100.0 * cc / (rc + cc)))
    held = corpus.heldout_docs(held_ch)
    return {"verses": verses, "train": train_ch, "held": held_ch, "views": views, "heldout": held,
            "template": template, "source": source, "corpus_sha256": sha}


def tokenizer_texts(data):
    """What the BPE learns from: view 0's documents, with the special tokens cut out of the chats."""
    raw, chat = data["views"][0]
    texts = [t for t, _ in raw]
    for c in chat:
        for s in tb.SPECIALS:
            c = c.replace(s, "\n")
        texts.append(c)
    return texts


# ---------------------------------------------------------------- dry run (stdlib + jinja2)

def dry_run(args):
    log = Log()
    geometry.check_quantizable()
    log("geometry:\n" + geometry.describe())
    data = load_data(args, log)
    raw, chat = data["views"][0]
    for text, style in raw[:2]:
        log("raw document (%s):\n%s" % (style, text))
    for c in chat[:12]:
        log("chat document:\n" + c)
    tools = [c for c in chat if "<|tool_call>" in c]
    log("tool-call document:\n" + (tools[0] if tools else "(none)"))
    texts = tokenizer_texts(data)
    t0 = time.time()
    learned, merges = tb.train_stdlib(texts, geometry.GEOMETRY["vocab_size"])
    tj = tb.build_tokenizer_json(learned, merges, geometry.GEOMETRY["vocab_size"])
    log("stdlib BPE: %d learned tokens, %d merges in %.1fs" % (len(learned), len(merges), time.time() - t0))
    os.makedirs(args.dry_out, exist_ok=True)
    with open(os.path.join(args.dry_out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False)
    with open(os.path.join(args.dry_out, "tokenizer_config.json"), "w") as f:
        json.dump(tb.tokenizer_config(geometry.GEOMETRY["max_position_embeddings"]), f, indent=1)
    enc = tb.StdlibBPE(tj)
    n_raw = sum(len(enc.encode(t)) + 2 for t, _ in raw[:2000])
    c_raw = sum(len(t) for t, _ in raw[:2000])
    n_chat = sum(len(enc.encode(t)) for t in chat[:2000])
    c_chat = sum(len(t) for t in chat[:2000])
    log("chars/token: raw %.2f, chat %.2f" % (c_raw / n_raw, c_chat / n_chat))
    bad = sum(enc.decode(enc.encode(t)) != t for t, _ in raw)
    log("round trip: %d of %d raw documents differ" % (bad, len(raw)))
    ids = enc.encode(chat[0])
    log("first chat document as ids: %s" % ids[:48])
    log("  tokens: %s" % [enc.inv[i] for i in ids[:48]])
    per_view = [sum(len(t) for t, _ in r) / (c_raw / n_raw) + sum(len(t) for t in c) / (c_chat / n_chat)
                for r, c in data["views"]]
    log("estimated tokens per epoch: %s" % ", ".join("%.2fM" % (n / 1e6) for n in per_view))
    pc = geometry.param_count()
    log("parameters: %s total" % format(pc["total"], ","))
    log("dry run done; tokenizer in %s" % args.dry_out)


# ---------------------------------------------------------------- the real run

def main(argv=None):
    args = parse_args(argv)
    if args.dry_run:
        return dry_run(args)
    import trainer
    return trainer.run(args, Log(), load_data, tokenizer_texts, T_START)


if __name__ == "__main__":
    main()
