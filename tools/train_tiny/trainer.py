"""The GPU part of train.py: tokenizer training, token streams, the transformers Gemma 4 model, the AdamW +
cosine loop with wall-clock budget and checkpoints, held-out evaluation, and the hand-off to export.py.

Model: Gemma4ForConditionalGeneration with vision_config=None and audio_config=None, so the state dict has
the published key layout (model.language_model.*, tied head). Training runs in fp32 weights with bf16
autocast and sdpa attention; the loss is computed here from the logits transformers returns, which are
already soft-capped (tanh(x/30)*30), so training sees exactly the function that inference runs."""

import json
import math
import os
import random
import time

import numpy as np
import torch
import torch.nn.functional as F

import geometry
import tokenizer_build as tb


# ---------------------------------------------------------------- tokenizer

def make_tokenizer(args, data, log, resume_dir):
    """Train the BPE (or reload it from the checkpoint) and check the shipped form against the trained one."""
    from tokenizers import Tokenizer
    path = os.path.join(resume_dir or args.ckpt, "tokenizer.json")
    V = geometry.GEOMETRY["vocab_size"]
    if resume_dir:
        with open(path, encoding="utf-8") as f:
            tj = json.load(f)
        log("tokenizer: reloaded from %s" % path)
        return tj, Tokenizer.from_str(json.dumps(tj))
    texts = data["tokenizer_texts"]
    t0 = time.time()
    learned, merges = tb.train_hf(texts, V)
    tj = tb.build_tokenizer_json(learned, merges, V)
    tok = Tokenizer.from_str(json.dumps(tj, ensure_ascii=False))
    log("tokenizer: %d learned tokens, %d merges, vocab %d (%.1fs)" % (
        len(learned), len(merges), tok.get_vocab_size(), time.time() - t0))
    check_tokenizer(tok, tj, texts, data, log)
    os.makedirs(args.ckpt, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False)
    return tj, tok


def check_tokenizer(tok, tj, texts, data, log):
    """The shipped tokenizer (no pre-split) must encode like the pre-splitting one; text must round-trip."""
    from tokenizers import Tokenizer
    twin = json.loads(json.dumps(tj))
    twin["pre_tokenizer"] = tb.TRAIN_PRETOKENIZER
    split_tok = Tokenizer.from_str(json.dumps(twin, ensure_ascii=False))
    a = tok.encode_batch(texts, add_special_tokens=False)
    b = split_tok.encode_batch(texts, add_special_tokens=False)
    diff = sum(x.ids != y.ids for x, y in zip(a, b))
    raw = [t for t, _ in data["views"][0][0]]
    dec = tok.decode_batch([e.ids for e in tok.encode_batch(raw, add_special_tokens=False)],
                           skip_special_tokens=False)
    bad_rt = sum(d != t for d, t in zip(dec, raw))
    probe = "<bos><|turn>user\nRecite John 3:16.<turn|>\n<|turn>model\n"
    ids = tok.encode(probe, add_special_tokens=False).ids
    log("tokenizer check: %d of %d texts encode differently without pre-split; %d of %d raw documents do "
        "not round-trip; probe %s" % (diff, len(texts), bad_rt, len(raw), ids))
    if diff or bad_rt:
        # Not fatal: every training text is tokenized by the shipped tokenizer, so training and inference
        # agree either way; but the premise in tokenizer_build's docstring would be wrong. Show examples.
        for x, y, t in [(x, y, t) for x, y, t in zip(a, b, texts) if x.ids != y.ids][:3]:
            log("WARNING tokenizer: %r -> %s vs pre-split %s" % (t[:60], x.tokens[:12], y.tokens[:12]))
    specials = [tok.token_to_id(s) for s in tb.SPECIALS]
    if specials != list(range(len(tb.SPECIALS))):
        raise SystemExit("special token ids moved: %s" % specials)


# ---------------------------------------------------------------- token streams

class Stream:
    """Documents concatenated in a shuffled order, cut into rows of seq+1 tokens that each start at a
    document start: every training sequence begins with <bos> at position 0, as at inference, and runs on
    into the following documents. A row starts at the first document start at or after the previous row's
    end, so an epoch (all rows, in a new order) sees each token about once; the tail of a document cut by
    a row end is seen in the other views, whose document orders differ."""

    def __init__(self, docs_ids, seq, device, rng):
        order = list(range(len(docs_ids)))
        rng.shuffle(order)
        starts, chunks, n, next_row = [], [], 0, 0
        for i in order:
            if n >= next_row:
                starts.append(n)
                next_row = n + seq
            chunks.append(docs_ids[i])
            n += len(docs_ids[i])
        flat = np.concatenate(chunks).astype(np.int64)
        flat = np.concatenate([flat, flat[:seq + 1]])           # the last row wraps around
        self.tokens = torch.from_numpy(flat).to(device)
        self.starts = torch.tensor(starts, dtype=torch.int64, device=device)
        self.n_tokens = n
        self.seq = seq
        self.offsets = torch.arange(seq + 1, device=device)

    def steps(self, batch):
        return len(self.starts) // batch

    def batch(self, perm, index, batch):
        s = self.starts[perm[index * batch:(index + 1) * batch]]
        w = self.tokens[s[:, None] + self.offsets[None, :]]
        return w[:, :-1], w[:, 1:]


def encode_docs(tok, raw, chat):
    """Raw text becomes <bos> text <eos>; chats are already rendered with their <bos>."""
    out = []
    for e in tok.encode_batch([t for t, _ in raw], add_special_tokens=False):
        out.append(np.array([geometry.BOS_ID] + e.ids + [geometry.EOS_ID], dtype=np.int32))
    for e in tok.encode_batch(chat, add_special_tokens=False):
        out.append(np.array(e.ids, dtype=np.int32))
    return out


def build_streams(args, data, tok, device, log):
    streams = []
    for v, (raw, chat) in enumerate(data["views"]):
        docs = encode_docs(tok, raw, chat)
        n_raw = sum(len(d) for d in docs[:len(raw)])
        n_chat = sum(len(d) for d in docs[len(raw):])
        st = Stream(docs, args.seq, device, random.Random("stream/%d/%d" % (args.seed, v)))
        streams.append(st)
        log("view %d: %d tokens (raw %d, chat %d = %.1f%%), %d documents, %d steps/epoch" % (
            v, st.n_tokens, n_raw, n_chat, 100.0 * n_chat / st.n_tokens, len(docs), st.steps(args.batch)))
    held_ids = encode_docs(tok, data["heldout"], [])
    flat = np.concatenate(held_ids).astype(np.int64)
    held_bytes = sum(len(t.encode("utf-8")) + 1 for t, _ in data["heldout"])
    log("held-out: %d documents, %d tokens, %d bytes" % (len(held_ids), len(flat), held_bytes))
    return streams, {"ids": flat, "docs": held_ids, "bytes": held_bytes}


# ---------------------------------------------------------------- model

def build_model(device, log):
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration, Gemma4TextConfig
    text = Gemma4TextConfig(**geometry.hf_text_kwargs())
    cfg = Gemma4Config(text_config=text, vision_config=None, audio_config=None, tie_word_embeddings=True,
                       **geometry.IMAGE_IDS)
    model = Gemma4ForConditionalGeneration._from_config(cfg, attn_implementation="sdpa", dtype=torch.float32)
    check_geometry(model)
    n = sum(p.numel() for p in model.parameters())
    want = geometry.param_count()["total"]
    log("model: %s parameters (analytic %s)" % (format(n, ","), format(want, ",")))
    if n != want:
        raise SystemExit("parameter count differs from geometry.param_count()")
    return model.to(device)


def check_geometry(model):
    """The instantiated layers must have the geometry geometry.py describes (and lumen will resolve)."""
    layers = model.model.language_model.layers
    for i, (lay, want) in enumerate(zip(layers, geometry.resolved_layers())):
        a = lay.self_attn
        got = {"type": a.layer_type, "head_dim": a.head_dim, "kv_shared": a.is_kv_shared_layer,
               "mlp": lay.mlp.intermediate_size}
        exp = {k: want[k] for k in got}
        if got != exp:
            raise SystemExit("layer %d: transformers built %s, geometry says %s" % (i, got, exp))
        if not a.is_kv_shared_layer and a.k_proj.out_features != want["kv_heads"] * want["head_dim"]:
            raise SystemExit("layer %d: k_proj has %d outputs" % (i, a.k_proj.out_features))


def optimizer(model, args):
    decay = [p for _, p in model.named_parameters() if p.ndim >= 2]
    rest = [p for _, p in model.named_parameters() if p.ndim < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": args.wd}, {"params": rest, "weight_decay": 0.0}],
                             lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)


def lr_at(step, total, args):
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    t = min(1.0, (step - args.warmup) / max(1, total - args.warmup))
    lo = args.lr * args.min_lr_frac
    return lo + 0.5 * (args.lr - lo) * (1.0 + math.cos(math.pi * t))


def loss_of(model, x, y):
    logits = model(input_ids=x).logits          # soft-capped by transformers
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))


@torch.no_grad()
def evaluate(model, held, seq, device, fp32=False, batch=32):
    """Mean next-token loss over the held-out stream cut into windows of `seq` tokens."""
    model.eval()
    ids = torch.from_numpy(held["ids"]).to(device)
    n = (len(ids) - 1) // seq
    total, count = 0.0, 0
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = not fp32
    for i in range(0, n, batch):
        rows = torch.arange(i, min(n, i + batch), device=device)
        idx = rows[:, None] * seq + torch.arange(seq + 1, device=device)[None, :]
        w = ids[idx]
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=not fp32):
            logits = model(input_ids=w[:, :-1]).logits
        total += F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1),
                                 reduction="sum").item()
        count += w[:, 1:].numel()
    torch.backends.cuda.matmul.allow_tf32 = prev
    model.train()
    return total / count, count


# ---------------------------------------------------------------- checkpoints

def save_checkpoint(path_dir, model, opt, state, log):
    os.makedirs(path_dir, exist_ok=True)
    blob = {"model": model.state_dict(), "optim": opt.state_dict(), "state": state,
            "rng": {"torch": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state_all(),
                    "python": random.getstate(), "numpy": np.random.get_state()}}
    tmp = os.path.join(path_dir, "ckpt.pt.tmp")
    torch.save(blob, tmp)
    os.replace(tmp, os.path.join(path_dir, "ckpt.pt"))
    log("checkpoint: step %d -> %s" % (state["step"], path_dir))


def load_checkpoint(path_dir, model, opt):
    blob = torch.load(os.path.join(path_dir, "ckpt.pt"), map_location="cpu", weights_only=False)
    model.load_state_dict(blob["model"])
    opt.load_state_dict(blob["optim"])
    torch.set_rng_state(blob["rng"]["torch"])
    torch.cuda.set_rng_state_all(blob["rng"]["cuda"])
    random.setstate(blob["rng"]["python"])
    np.random.set_state(blob["rng"]["numpy"])
    return blob["state"]


def data_signature(args, data, tj):
    tok_sha = __import__("hashlib").sha256(json.dumps(tj, sort_keys=True).encode()).hexdigest()
    return {"corpus_sha256": data["corpus_sha256"], "seed": args.seed, "views": args.views,
            "chat_share": args.chat_share, "seq": args.seq, "batch": args.batch, "tokenizer_sha256": tok_sha}


# ---------------------------------------------------------------- the loop

def epoch_perm(streams, seed, epoch, device):
    st = streams[epoch % len(streams)]
    g = np.random.default_rng([seed, epoch])
    return st, torch.from_numpy(g.permutation(len(st.starts))).to(device)


def steps_for_epochs(streams, epochs, batch):
    whole, frac = int(epochs), epochs - int(epochs)
    n = sum(streams[e % len(streams)].steps(batch) for e in range(whole))
    return n + int(frac * streams[whole % len(streams)].steps(batch))


def run(args, log, load_data, tokenizer_texts, t_start):
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    device = "cuda"
    deadline = t_start + args.minutes * 60.0 - (args.export_reserve if args.export else 20.0)
    import transformers
    log("torch %s, transformers %s, %s" % (torch.__version__, transformers.__version__,
                                           torch.cuda.get_device_name(0)))
    geometry.check_quantizable()
    log("geometry:\n" + geometry.describe())
    data = load_data(args, log)
    data["tokenizer_texts"] = tokenizer_texts(data)
    tj, tok = make_tokenizer(args, data, log, args.resume)
    streams, held = build_streams(args, data, tok, device, log)
    model = build_model(device, log)
    opt = optimizer(model, args)
    sig = data_signature(args, data, tj)
    state = {"step": 0, "total": args.steps or None, "epoch": 0, "index": 0, "tokens": 0, "loss_log": [],
             "eval_log": [], "train_seconds": 0.0, "runs": [], "sig": sig, "args": vars(args)}
    if args.resume:
        state = load_checkpoint(args.resume, model, opt)
        if state["sig"] != sig:
            raise SystemExit("resume: data/tokenizer signature differs: %s vs %s" % (state["sig"], sig))
        if args.steps:
            state["total"] = args.steps
        log("resume: step %d of %s, epoch %d" % (state["step"], state["total"], state["epoch"]))
    cap = steps_for_epochs(streams, args.epochs, args.batch)
    train_loop(args, model, opt, streams, held, state, cap, deadline, device, log)
    final = finish(args, model, held, state, device, log)
    save_checkpoint(args.ckpt, model, opt, state, log)
    if args.export:
        import export
        export.export_all(args, model, tj, tok, data, held, state, final, log)
    log("done in %.1fs%s" % (time.time() - t_start,
                             "; FAILED export steps: %s" % ", ".join(log.failed) if log.failed else ""))


def train_loop(args, model, opt, streams, held, state, cap, deadline, device, log):
    model.train()
    st, perm = epoch_perm(streams, args.seed, state["epoch"], device)
    run_start, last_ckpt, calib_t = time.time(), time.time(), None
    acc, acc_n, t_log = 0.0, 0, time.time()
    first_step = state["step"]
    while state["total"] is None or state["step"] < state["total"]:
        if time.time() > deadline:
            log("budget reached at step %d" % state["step"])
            break
        step = state["step"]
        total = state["total"] or cap
        for g in opt.param_groups:
            g["lr"] = lr_at(step, total, args)
        x, y = st.batch(perm, state["index"], args.batch)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_of(model, x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        state["step"] += 1
        state["tokens"] += x.numel()
        state["index"] += 1
        if state["index"] >= st.steps(args.batch):
            state["epoch"] += 1
            state["index"] = 0
            st, perm = epoch_perm(streams, args.seed, state["epoch"], device)
        acc += loss.detach()
        acc_n += 1
        done = state["step"] - first_step
        if done == 10:
            torch.cuda.synchronize()
            calib_t = time.time()
        if state["total"] is None and done == 40:
            torch.cuda.synchronize()
            per_step = (time.time() - calib_t) / 30.0
            fit = state["step"] + int((deadline - time.time()) / per_step * 0.95)
            state["total"] = max(state["step"] + 1, min(cap, fit))
            log("schedule: %d steps (%.1f ms/step; the budget fits %d, --epochs %.1f gives %d)" % (
                state["total"], per_step * 1e3, fit, args.epochs, cap))
        if state["step"] % args.log_every == 0:
            log_step(args, state, acc / acc_n, gnorm, t_log, opt, log)
            acc, acc_n, t_log = 0.0, 0, time.time()
        every = args.eval_every or max(50, (state["total"] or cap) // 10)
        if state["step"] % every == 0:
            hl, _ = evaluate(model, held, args.seq, device)
            state["eval_log"].append({"step": state["step"], "heldout_loss": hl})
            log("eval step %d: held-out loss %.4f ppl %.2f" % (state["step"], hl, math.exp(hl)))
        if time.time() - last_ckpt > args.ckpt_every_min * 60:
            state["train_seconds"] += time.time() - run_start
            run_start = last_ckpt = time.time()
            save_checkpoint(args.ckpt, model, opt, state, log)
    torch.cuda.synchronize()
    state["train_seconds"] += time.time() - run_start
    state["runs"].append({"first_step": first_step, "last_step": state["step"]})


def log_step(args, state, loss, gnorm, t_log, opt, log):
    loss = float(loss)
    dt = time.time() - t_log
    tps = args.log_every * args.batch * args.seq / max(dt, 1e-9)
    row = {"step": state["step"], "tokens": state["tokens"], "lr": opt.param_groups[0]["lr"],
           "train_loss": loss, "grad_norm": float(gnorm)}
    state["loss_log"].append(row)
    log("step %d/%s epoch %d lr %.2e loss %.4f gnorm %.2f %.0f tok/s" % (
        state["step"], state["total"], state["epoch"], row["lr"], loss, row["grad_norm"], tps))


def finish(args, model, held, state, device, log):
    hl16, _ = evaluate(model, held, args.seq, device)
    hl32, n = evaluate(model, held, args.seq, device, fp32=True)
    bpb = hl32 * n / (held["bytes"] * math.log(2))
    complete = state["total"] is not None and state["step"] >= state["total"]
    log("final: step %d/%s (%s), held-out loss %.4f ppl %.2f (fp32; bf16 autocast %.4f), %.3f bits/byte" % (
        state["step"], state["total"], "complete" if complete else "partial", hl32, math.exp(hl32), hl16, bpb))
    return {"heldout_loss_fp32": hl32, "heldout_ppl_fp32": math.exp(hl32), "heldout_loss_bf16": hl16,
            "heldout_tokens": n, "heldout_bytes": held["bytes"], "bits_per_byte": bpb, "complete": complete}
