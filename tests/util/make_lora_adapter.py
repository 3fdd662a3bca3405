#!/usr/bin/env python3
"""make_lora_adapter.py — writes a small PEFT LoRA adapter for a checkpoint, for tests.

    make_lora_adapter.py MODEL_DIR OUT_DIR [--rank R] [--seed S] [--modules q_proj,v_proj]
                         [--b-scale X]

OUT_DIR gets adapter_config.json and adapter_model.safetensors (f32 lora_A [r][in] and lora_B
[out][r] under the names PEFT saves, base_model.model.<module>.lora_A.weight) for each listed
projection of every layer that has it; the shapes come from the base's safetensors headers, so a
KV-shared layer without k/v projections simply gets none. lora_B is not zero (PEFT initializes it
to zero, which would change nothing): the adapter moves the model's output. Values come from a
seeded generator, so the same arguments write the same bytes. Standard library only.
"""
import argparse
import json
import os
import re
import struct
import sys

ATTN = {"q_proj", "k_proj", "v_proj", "o_proj"}
MLP = {"gate_proj", "up_proj", "down_proj"}


def header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n))


def base_shapes(model_dir):
    """{tensor name: shape} over the checkpoint's safetensors files."""
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    shapes = {}
    for name in files:
        for k, v in header(os.path.join(model_dir, name)).items():
            if k != "__metadata__":
                shapes[k] = v["shape"]
    return shapes


def targets(shapes, modules):
    """(module path, out, in) of each adapted projection, in layer order."""
    pat = re.compile(r"^(.*\.layers\.(\d+)\.(self_attn|mlp)\.(\w+))\.weight$")
    found = []
    for k, shape in shapes.items():
        m = pat.match(k)
        if not m or m.group(4) not in modules or len(shape) != 2:
            continue
        want = "self_attn" if m.group(4) in ATTN else "mlp"
        if m.group(3) == want:
            found.append((int(m.group(2)), m.group(1), shape[0], shape[1]))
    return [(path, rows, cols) for _, path, rows, cols in sorted(found)]


class Rng:
    """xorshift64*: uniform floats in [-1, 1)."""

    def __init__(self, seed):
        self.s = (seed * 0x9E3779B97F4A7C15 + 1) & 0xFFFFFFFFFFFFFFFF or 1

    def uniform(self):
        s = self.s
        s ^= s >> 12
        s ^= (s << 25) & 0xFFFFFFFFFFFFFFFF
        s ^= s >> 27
        self.s = s
        x = (s * 0x2545F4914F6CDD1D) & 0xFFFFFFFFFFFFFFFF
        return (x >> 11) / float(1 << 52) - 1.0


def write_safetensors(path, tensors):
    """tensors: [(name, shape, [floats])] as F32, in that order."""
    meta, offset = {}, 0
    for name, shape, vals in tensors:
        n = 4 * len(vals)
        meta[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    head = json.dumps(meta, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for _, _, vals in tensors:
            f.write(struct.pack("<%df" % len(vals), *vals))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("out_dir")
    ap.add_argument("--rank", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--modules", default="q_proj,v_proj,o_proj")
    ap.add_argument("--b-scale", type=float, default=0.5)
    a = ap.parse_args()
    modules = set(a.modules.split(","))
    bad = modules - ATTN - MLP
    if bad:
        sys.exit("make_lora_adapter: unknown modules %s" % ",".join(sorted(bad)))
    ts = targets(base_shapes(a.model_dir), modules)
    if not ts:
        sys.exit("make_lora_adapter: %s has none of %s" % (a.model_dir, a.modules))
    rng, r, tensors = Rng(a.seed), a.rank, []
    for path, rows, cols in ts:
        sa = cols**-0.5
        A = [sa * rng.uniform() for _ in range(r * cols)]
        B = [a.b_scale * rng.uniform() for _ in range(rows * r)]
        tensors.append(("base_model.model.%s.lora_A.weight" % path, [r, cols], A))
        tensors.append(("base_model.model.%s.lora_B.weight" % path, [rows, r], B))
    os.makedirs(a.out_dir, exist_ok=True)
    cfg = {
        "peft_type": "LORA",
        "r": r,
        "lora_alpha": 2 * r,
        "target_modules": sorted(modules),
        "bias": "none",
        "base_model_name_or_path": os.path.abspath(a.model_dir),
    }
    with open(os.path.join(a.out_dir, "adapter_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    write_safetensors(os.path.join(a.out_dir, "adapter_model.safetensors"), tensors)


if __name__ == "__main__":
    main()
