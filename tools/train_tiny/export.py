"""Export of lumen-tiny-kjv (GPU machine): the model folder lumen ships, checked against transformers, plus
the parity material and printed samples.

Writes into --export DIR:
  model.safetensors        bf16, HF layout (model.language_model.*, no lm_head: tied)
  config.json              published form (text_config with global_head_dim), as the released checkpoints
  generation_config.json   stop ids <eos>, <turn|>, <|tool_response>; temperature 0.8, top_k 40, top_p 0.95
  tokenizer.json, tokenizer_config.json, chat_template.jinja
  loss_log.csv, train_meta.json, train_log.txt, samples.txt
  parity/                  reference computed by transformers on the CPU, fp32, eager attention, from the
                           files above: passage.ids.txt + passage.logits.f32 ([T, V] float32 little-endian),
                           passage.logits_bf16.f32 (same model run in bf16), greedy.json (32-token greedy
                           continuations of 4 prompts with per-step top-2 logits), config.transformers.json
                           (the config as save_pretrained writes it: per_layer_config form), meta.json
and with --pack DIR the folder as .tgz parts of <= 15 MiB plus SHA256SUMS (small parts are easier to bring
back from the GPU machine)."""

import copy
import csv
import hashlib
import json
import os
import re
import shutil
import sys
import tarfile

import torch

import corpus
import geometry
import tokenizer_build as tb

MODEL_NAME = "lumen-tiny-kjv"
HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATE_PATH = os.path.join(os.path.dirname(os.path.dirname(HERE)), "models", MODEL_NAME, "chat_template.jinja")
STOP_IDS = [geometry.EOS_ID, geometry.TURN_END_ID, geometry.TOOL_RESPONSE_ID]
PARITY_T = 96
GREEDY_N = 32
PART_BYTES = 15 * 1024 * 1024


def export_all(args, model, tj, tok, data, held, state, final, log):
    out = args.export
    if os.path.isdir(out):
        shutil.rmtree(out)
    os.makedirs(os.path.join(out, "parity"))
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    write_model_files(model, tj, out, log)
    try:
        guarded("save_pretrained comparison", log, compare_save_pretrained, model, out, log)
        guarded("transformers tokenizer check", log, check_transformers_tokenizer, out, tok, data, log)
        ref = guarded("reference load", log, load_reference, out, log)
        if ref is not None and guarded("config check", log, check_reference, ref, model, held, log) is not False:
            guarded("parity", log, parity, ref, tok, data, held, out, log)
            guarded("samples", log, samples, ref, tok, data, out, log)
        guarded("metadata", log, write_meta, args, state, final, data, out, log)
    finally:
        if args.pack:
            pack(out, args.pack, log)


def guarded(what, log, fn, *a):
    """Run one export step; a failure is logged (and the pack still written) instead of losing the run."""
    import traceback
    try:
        r = fn(*a)
        return True if r is None else r
    except (Exception, SystemExit) as e:  # noqa: B902 - the checks signal with SystemExit
        log("EXPORT STEP FAILED: %s: %r\n%s" % (what, e, traceback.format_exc()))
        log.failed.append(what)
        return False if what == "config check" else None


# ---------------------------------------------------------------- model folder

def bf16_state(model):
    sd = {}
    for k, v in model.state_dict().items():
        if k == "lm_head.weight":             # tied to model.language_model.embed_tokens.weight
            continue
        if not k.startswith("model.language_model."):
            raise SystemExit("unexpected tensor %s in the state dict" % k)
        sd[k] = v.detach().to("cpu", torch.bfloat16).contiguous()
    return sd


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


def write_model_files(model, tj, out, log):
    import transformers
    from safetensors.torch import save_file
    sd = bf16_state(model)
    save_file(sd, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    write_json(os.path.join(out, "config.json"), geometry.published_config(transformers_version=transformers.__version__))
    write_json(os.path.join(out, "generation_config.json"), geometry.generation_config())
    with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False)
    write_json(os.path.join(out, "tokenizer_config.json"),
               tb.tokenizer_config(geometry.GEOMETRY["max_position_embeddings"]))
    shutil.copyfile(TEMPLATE_PATH, os.path.join(out, "chat_template.jinja"))
    n = sum(v.numel() for v in sd.values())
    log("export: %d tensors, %s values, model.safetensors %.2f MB" % (
        len(sd), format(n, ","), os.path.getsize(os.path.join(out, "model.safetensors")) / 1e6))


def compare_save_pretrained(model, out, log):
    """Our safetensors must hold exactly what transformers' own save_pretrained writes."""
    from safetensors import safe_open
    tmp = os.path.join(out, "_save_pretrained")
    m16 = copy.deepcopy(model).to("cpu", torch.bfloat16)
    m16.save_pretrained(tmp)
    theirs = {}
    for f in sorted(os.listdir(tmp)):
        if f.endswith(".safetensors"):
            with safe_open(os.path.join(tmp, f), "pt") as g:
                for k in g.keys():
                    theirs[k] = g.get_tensor(k)
    ours = bf16_state(model)
    only_t, only_o = sorted(set(theirs) - set(ours)), sorted(set(ours) - set(theirs))
    diff = [k for k in set(ours) & set(theirs) if not torch.equal(ours[k], theirs[k])]
    shutil.copyfile(os.path.join(tmp, "config.json"), os.path.join(out, "parity", "config.transformers.json"))
    shutil.rmtree(tmp)
    log("save_pretrained comparison: %d tensors; only in theirs %s, only in ours %s, different %s" % (
        len(theirs), only_t[:5], only_o[:5], diff[:5]))
    if only_t or only_o or diff:
        log("WARNING: model.safetensors differs from save_pretrained's layout")


def check_transformers_tokenizer(out, tok, data, log):
    """AutoTokenizer on the folder must encode like tokenizer.json and render chats like our template."""
    from transformers import AutoTokenizer
    at = AutoTokenizer.from_pretrained(out)
    conv = corpus.PARITY_PROMPTS[3]["conv"]
    ours = corpus.render(data["template"], conv, add_generation_prompt=True)
    theirs = at.apply_chat_template(conv["messages"], tools=conv["tools"], tokenize=False,
                                    add_generation_prompt=True)
    raw = "In the beginning God created the heaven and the earth."
    same_ids = at(raw)["input_ids"] == tok.encode(raw).ids
    same_chat = at(ours, add_special_tokens=False)["input_ids"] == tok.encode(ours, add_special_tokens=False).ids
    log("AutoTokenizer (%s): raw ids same %s, chat ids same %s, apply_chat_template same %s" % (
        type(at).__name__, same_ids, same_chat, theirs == ours))


def load_reference(out, log):
    from transformers import Gemma4ForConditionalGeneration
    ref, info = Gemma4ForConditionalGeneration.from_pretrained(
        out, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    ref.eval()
    problems = {k: v for k, v in info.items() if v}
    log("reference: loaded %s from the export (fp32, eager, cpu); loading info problems: %s" % (
        type(ref).__name__, problems or "none"))
    if any(info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")):
        raise SystemExit("the exported checkpoint does not load cleanly")
    return ref


def check_reference(ref, model, held, log):
    """The published-form config.json must give the same model as the training config."""
    import trainer
    from transformers import Gemma4ForConditionalGeneration
    trainer.check_geometry(ref)
    twin = Gemma4ForConditionalGeneration._from_config(copy.deepcopy(model.config), attn_implementation="eager",
                                                       dtype=torch.float32)
    res = twin.load_state_dict({k: v.float() for k, v in bf16_state(model).items()}, strict=False)
    if set(res.missing_keys) - {"lm_head.weight"} or res.unexpected_keys:
        raise SystemExit("state dict does not fit the training config: %s" % (res,))
    twin.eval()
    ids = torch.tensor([held["docs"][0][:PARITY_T].tolist()])
    with torch.no_grad():
        a, b = ref(input_ids=ids).logits, twin(input_ids=ids).logits
    d = (a - b).abs().max().item()
    log("published config vs training config, same bf16 weights: max |dlogit| %.3g" % d)
    if d > 1e-4:
        raise SystemExit("config.json does not reproduce the trained model")


# ---------------------------------------------------------------- parity material

def prompt_ids(tok, data, p):
    if p["kind"] == "raw":
        return tok.encode(p["text"], add_special_tokens=True).ids, p["text"]
    text = corpus.render(data["template"], p["conv"], add_generation_prompt=True)
    return tok.encode(text, add_special_tokens=False).ids, text


@torch.no_grad()
def greedy_full(model, ids, n):
    """Greedy decoding by full recomputation at each step (no cache), with the top-2 logits."""
    ids, steps = list(ids), []
    for _ in range(n):
        logits = model(input_ids=torch.tensor([ids])).logits[0, -1].float()
        top = torch.topk(logits, 2)
        best = int(torch.argmax(logits))
        steps.append({"id": best, "logit": float(logits[best]), "second_id": int(top.indices[1]),
                      "second_logit": float(top.values[1]), "margin": float(top.values[0] - top.values[1])})
        ids.append(best)
    return steps


@torch.no_grad()
def generate(model, ids, n, sample=False, seed=0):
    from transformers import GenerationConfig
    if sample:
        gc = GenerationConfig(do_sample=True, temperature=0.8, top_k=40, top_p=0.95, max_new_tokens=n,
                              eos_token_id=STOP_IDS, pad_token_id=geometry.PAD_ID)
        torch.manual_seed(seed)
    else:
        gc = GenerationConfig(do_sample=False, max_new_tokens=n, eos_token_id=STOP_IDS,
                              pad_token_id=geometry.PAD_ID)
    out = model.generate(torch.tensor([ids]), generation_config=gc)
    return out[0, len(ids):].tolist()


def first_stop(seq):
    return next((i for i, t in enumerate(seq) if t in STOP_IDS), None)


def parity(ref, tok, data, held, out, log):
    pdir = os.path.join(out, "parity")
    k = next(i for i, (d, (_, style)) in enumerate(zip(held["docs"], data["heldout"]))
             if style == "prose" and len(d) > PARITY_T)
    ids = held["docs"][k][:PARITY_T].tolist()
    with torch.no_grad():
        l32 = ref(input_ids=torch.tensor([ids])).logits[0].float()
        ref16 = copy.deepcopy(ref).to(torch.bfloat16)
        l16 = ref16(input_ids=torch.tensor([ids])).logits[0].float()
    with open(os.path.join(pdir, "passage.ids.txt"), "w") as f:
        f.write(" ".join(map(str, ids)) + "\n")
    l32.numpy().astype("<f4").tofile(os.path.join(pdir, "passage.logits.f32"))
    l16.numpy().astype("<f4").tofile(os.path.join(pdir, "passage.logits_bf16.f32"))
    nll = torch.nn.functional.cross_entropy(l32[:-1], torch.tensor(ids[1:])).item()
    agree = (l32.argmax(-1) == l16.argmax(-1)).float().mean().item()
    log("parity passage: held-out document %d, T=%d, nll %.3f; bf16 vs fp32 max |dlogit| %.3f, argmax agree %.3f"
        % (k, len(ids), nll, (l32 - l16).abs().max().item(), agree))
    cases = []
    for p in corpus.PARITY_PROMPTS:
        pids, text = prompt_ids(tok, data, p)
        steps = greedy_full(ref, pids, GREEDY_N)
        greedy = [s["id"] for s in steps]
        cached = generate(ref, pids, GREEDY_N)
        stop = first_stop(greedy)
        upto = GREEDY_N if stop is None else stop + 1
        same = cached[:upto] == greedy[:upto]
        cases.append({"name": p["name"], "kind": p["kind"], "prompt": text, "prompt_ids": pids,
                      "greedy_ids": greedy, "greedy_text": tok.decode(greedy, skip_special_tokens=False),
                      "first_stop_index": stop, "min_margin": min(s["margin"] for s in steps),
                      "steps": steps, "hf_generate_agrees_to_first_stop": same})
        log("greedy %-12s min margin %.3f stop %s cached-generate agrees %s: %r" % (
            p["name"], cases[-1]["min_margin"], stop, same, cases[-1]["greedy_text"]))
    write_json(os.path.join(pdir, "greedy.json"), cases)
    import transformers
    write_json(os.path.join(pdir, "meta.json"), {
        "reference": "transformers %s, torch %s, CPU, float32 weights from the bf16 model.safetensors, "
                     "attn_implementation=eager" % (transformers.__version__, torch.__version__),
        "passage": {"ids": "passage.ids.txt", "logits": "passage.logits.f32", "logits_bf16": "passage.logits_bf16.f32",
                    "shape": [len(ids), int(l32.shape[-1])], "dtype": "float32 little-endian, row-major [T, V]",
                    "source": "held-out chapter text (prose), starts with <bos>", "nll": nll},
        "greedy": {"file": "greedy.json", "new_tokens": GREEDY_N, "method": "argmax of a full forward per step",
                   "raw prompts": "tokenized with <bos>", "chat prompts": "rendered by chat_template.jinja, "
                   "add_generation_prompt, tokenized without extra <bos>"},
        "model_sha256": sha256(os.path.join(out, "model.safetensors"))})


# ---------------------------------------------------------------- samples

def samples(ref, tok, data, out, log):
    lines = []
    prompts = list(corpus.PARITY_PROMPTS) + [
        {"name": "raw_and_god", "kind": "raw", "text": "And God said"},
        {"name": "demo", "kind": "chat", "conv": {"messages": [{"role": "user", "content": corpus.DEMO_PROMPT}],
                                                  "tools": None, "enable_thinking": False}},
        {"name": "chat_continue", "kind": "chat", "conv": {"messages": [
            {"role": "user", "content": "Continue: Blessed are the meek"}], "tools": None, "enable_thinking": False}},
        {"name": "chat_who", "kind": "chat", "conv": {"messages": [{"role": "user", "content": "Who are you?"}],
                                                      "tools": None, "enable_thinking": False}}]
    for p in prompts:
        ids, text = prompt_ids(tok, data, p)
        lines.append("=== %s: %r" % (p["name"], text))
        for label, gen in [("greedy", generate(ref, ids, 80)), ("sample seed 1", generate(ref, ids, 80, True, 1)),
                           ("sample seed 2", generate(ref, ids, 80, True, 2))]:
            lines.append("--- %s: %s" % (label, tok.decode(gen, skip_special_tokens=False)))
    lines += tool_round_trip(ref, tok, data)
    with open(os.path.join(out, "samples.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    for line in lines:
        log(line)


def tool_round_trip(ref, tok, data):
    """Prompt with the lookup tool, parse the model's call, answer it from the corpus, let the model finish."""
    conv = copy.deepcopy(corpus.PARITY_PROMPTS[3]["conv"])
    ids, text = prompt_ids(tok, data, {"kind": "chat", "conv": conv})
    first = tok.decode(generate(ref, ids, 60), skip_special_tokens=False)
    lines = ["=== tool round trip: %r" % text, "--- model: %s" % first]
    m = re.search(r'<\|tool_call>call:lookup_verse\{book:<\|"\|>(.*?)<\|"\|>,chapter:(\d+),verse:(\d+)\}'
                  r'<tool_call\|>', first)
    if not m:
        return lines + ["--- (no parsable lookup_verse call)"]
    book, c, v = m.group(1), int(m.group(2)), int(m.group(3))
    found = [x.text for x in data["verses"] if (x.book, x.chapter, x.verse) == (book, c, v)]
    result = found[0] if found else "No such verse."
    conv["messages"] += [
        {"role": "assistant", "tool_calls": [{"id": "call_0", "type": "function", "function": {
            "name": "lookup_verse", "arguments": {"book": book, "chapter": c, "verse": v}}}]},
        {"role": "tool", "tool_call_id": "call_0", "content": result}]
    ids2, text2 = prompt_ids(tok, data, {"kind": "chat", "conv": conv})
    answer = tok.decode(generate(ref, ids2, 80), skip_special_tokens=False)
    return lines + ["--- tool result: %s" % result, "--- model answer: %s" % answer]


# ---------------------------------------------------------------- metadata and packing

def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_meta(args, state, final, data, out, log):
    import tokenizers
    import transformers
    evals = {e["step"]: e["heldout_loss"] for e in state["eval_log"]}
    with open(os.path.join(out, "loss_log.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "tokens", "lr", "train_loss", "grad_norm", "heldout_loss"])
        rows = {r["step"]: r for r in state["loss_log"]}
        for step in sorted(set(rows) | set(evals)):
            r = rows.get(step, {})
            w.writerow([step, r.get("tokens", ""), "%.6g" % r["lr"] if r else "",
                        "%.5f" % r["train_loss"] if r else "", "%.4f" % r["grad_norm"] if r else "",
                        "%.5f" % evals[step] if step in evals else ""])
    held_chapters = ["%s %d" % k for k in data["held"]]
    meta = {
        "model": MODEL_NAME, "parameters": geometry.param_count(), "geometry": geometry.GEOMETRY,
        "layers": geometry.resolved_layers(), "corpus": data["source"], "corpus_sha256": data["corpus_sha256"],
        "heldout": dict(final, chapters=held_chapters),
        "schedule": {"steps_done": state["step"], "total_steps": state["total"], "epochs_done": state["epoch"],
                     "tokens_seen": state["tokens"], "train_seconds": state["train_seconds"],
                     "runs": state["runs"]},
        "args": {k: v for k, v in vars(args).items()}, "command": " ".join(sys.argv),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "tokenizers": tokenizers.__version__, "cuda_device": torch.cuda.get_device_name(0)},
        "files": {f: sha256(os.path.join(out, f)) for f in ("model.safetensors", "tokenizer.json", "config.json")}}
    write_json(os.path.join(out, "train_meta.json"), meta)
    with open(os.path.join(out, "train_log.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(log.lines) + "\n")
    log("export: %s written" % out)


def pack(out, dest, log):
    os.makedirs(dest, exist_ok=True)
    with open(os.path.join(out, "train_log.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(log.lines) + "\n")
    tgz = os.path.join(dest, MODEL_NAME + ".tgz")
    with tarfile.open(tgz, "w:gz") as t:
        t.add(out, arcname=MODEL_NAME)
    sums = {os.path.basename(tgz): sha256(tgz)}
    size = os.path.getsize(tgz)
    if size > PART_BYTES:
        with open(tgz, "rb") as f:
            i = 0
            while True:
                block = f.read(PART_BYTES)
                if not block:
                    break
                part = "%s.part%02d" % (tgz, i)
                with open(part, "wb") as g:
                    g.write(block)
                sums[os.path.basename(part)] = sha256(part)
                i += 1
        os.remove(tgz)
    with open(os.path.join(dest, "SHA256SUMS"), "w") as f:
        for name, h in sums.items():
            f.write("%s  %s\n" % (h, name))
    for name in ("train_log.txt", "samples.txt", "train_meta.json"):
        if os.path.exists(os.path.join(out, name)):
            shutil.copyfile(os.path.join(out, name), os.path.join(dest, name))
    log("pack: %s (%.1f MB) -> %s" % (os.path.basename(tgz), size / 1e6, sorted(os.listdir(dest))))
