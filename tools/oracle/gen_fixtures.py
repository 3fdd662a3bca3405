#!/usr/bin/env python3
"""gen_fixtures.py — lumen's reference-fixture generator.

Builds tiny random Gemma 4 models with Hugging Face transformers 5.17.0 (the reference of
docs/oracle.md), saves them in the checkpoint layouts lumen must read (HF bf16, sharded HF, the
published `gemma4_unified` config, MLX affine-quantized), and stores the teacher-forced logits of the
fp32 eager reference and of transformers' own bf16 run, plus quantized-KV references and the codes of
the MLX affine quantizer. See tools/oracle/README.md for the formats and tolerances.

    python3 tools/oracle/gen_fixtures.py --out DIR [--only NAME ...] [--device cpu|cuda]

Every fixture is independent: a failure prints its traceback and the run goes on; the exit status
is 1 if any fixture failed. Runs on CPU by default (deterministic; the models are tiny).
"""

import argparse
import copy
import hashlib
import json
import os
import platform
import shlex
import shutil
import struct
import sys
import tempfile
import time
import traceback
import zlib

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mlx_affine as mq  # noqa: E402

# ----------------------------------------------------------------------------------------------
# Fixed choices (documented in README.md)
# ----------------------------------------------------------------------------------------------
V = 512                 # vocab (main and PLE tables)
T = 40                  # tokens per fixture (BOS + 39 random ids in [3, V))
W = 8                   # sliding window: T/W = 5 windows, so every ring wraps several times
BOS = 2
SOFTCAP = 30.0
STD_LINEAR = 0.25       # every Linear and expert weight ~ N(0, 0.25^2)
STD_EMBED = 0.3         # embed_tokens ~ N(0, 0.3^2) (tied head: logit std ~ 0.3*sqrt(H)); scaled
EMBED_FACTORS = (1.0, 0.75, 0.5)  # down by these factors until max|logit| <= MAX_ABS_LOGIT
MAX_ABS_LOGIT = 16.0    # well below the softcap of 30
STD_PLE = 0.25          # embed_tokens_per_layer ~ N(0, 0.25^2) (times sqrt(Pd) in the model)
STD_ROUTER = 1.5        # router.proj: its input has RMS ~H^-0.5, so this gives logits of std ~1.5
UNIFORM = (0.6, 1.4)    # norm weights, layer_scalar, router.scale, router.per_expert_scale
QK_SCORE_STD = 3.0      # q_norm/k_norm weights are U(0.6,1.4) * qk_norm_scale(head_dim) (see below)
ID_CANDIDATES = 16      # id sequences tried per model, first one with clear margins wins
GAP_REL = 1e-3          # wanted: top-1 minus top-2 logit >= GAP_REL * max|ref| at every position
ROUTE_MARGIN = 5e-5     # wanted: router prob gap at the top-k boundary >= this, every token/layer

ROPE = {
    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                       "rope_theta": 1000000.0},
}

TOP_TOKEN_IDS = {  # Gemma4Config / Gemma4UnifiedConfig multimodal token ids (defaults)
    "boi_token_id": 255999, "eoi_token_id": 258882, "image_token_id": 258880,
    "video_token_id": 258884, "boa_token_id": 256000, "eoa_token_index": 258883,
    "audio_token_id": 258881,
}


def pattern(n, period):
    """(period-1) sliding layers then one full layer, repeated; the last layer is full."""
    lt = ["full_attention" if (i + 1) % period == 0 else "sliding_attention" for i in range(n)]
    lt[-1] = "full_attention"
    return lt


def common_text(**kw):
    d = dict(
        vocab_size=V, hidden_activation="gelu_pytorch_tanh", max_position_embeddings=131072,
        initializer_range=0.02, rms_norm_eps=1e-6, use_cache=True, pad_token_id=0, bos_token_id=BOS,
        eos_token_id=[1, 106], tie_word_embeddings=True, rope_parameters=copy.deepcopy(ROPE),
        attention_bias=False, attention_dropout=0.0, sliding_window=W,
        final_logit_softcapping=SOFTCAP, attention_k_eq_v=False, num_kv_shared_layers=0,
        use_double_wide_mlp=False,
    )
    d.update(kw)
    return d


def gemma4_text(**kw):
    d = common_text(hidden_size_per_layer_input=0, vocab_size_per_layer_input=V,
                    enable_moe_block=False, num_experts=None, top_k_experts=None,
                    moe_intermediate_size=None, use_bidirectional_attention=None)
    d.update(kw)
    return d


SPECS = {
    # E2B-like: PLE, KV sharing (donors 4 and 5, not the last layers), double-wide MLP on the shared
    # layers, one KV head, 4:1 pattern.
    "e2b_like": {"family": "gemma4", "seed": 2001, "text": gemma4_text(
        hidden_size=64, intermediate_size=96, num_hidden_layers=10, num_attention_heads=8,
        num_key_value_heads=1, head_dim=16, global_head_dim=32, layer_types=pattern(10, 5),
        hidden_size_per_layer_input=16, vocab_size_per_layer_input=V, num_kv_shared_layers=4,
        use_double_wide_mlp=True)},
    # E4B-like: 5:1 pattern, 2 KV heads, KV sharing (donors 5 and 7), PLE, no double-wide.
    # T = 160: over 40 positions the bf16 mean KL of this model is a noisy draw (equally valid
    # rounding orders give 0.012-0.036), too noisy to hold a bf16 engine to 1.5x transformers'
    # single run; 4x the positions halve that spread. More ids need more candidates to find a
    # sequence without near-tied argmaxes.
    "e4b_like": {"family": "gemma4", "seed": 2002, "T": 160, "id_candidates": 64,
                 "text": gemma4_text(
        hidden_size=64, intermediate_size=96, num_hidden_layers=12, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, global_head_dim=64, layer_types=pattern(12, 6),
        hidden_size_per_layer_input=16, vocab_size_per_layer_input=V, num_kv_shared_layers=4)},
    # 12B-like (gemma4_unified): k_eq_v with one global KV head, no PLE, no sharing.
    "12b_like": {"family": "gemma4_unified", "seed": 2003, "text": common_text(
        hidden_size=64, intermediate_size=48, num_hidden_layers=12, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, global_head_dim=64, num_global_key_value_heads=1,
        attention_k_eq_v=True, layer_types=pattern(12, 6), use_bidirectional_attention="vision")},
    # 26B-A4B-like: MoE (8 experts, top 2) parallel to the dense MLP, k_eq_v with 2 global KV heads.
    "moe_like": {"family": "gemma4", "seed": 2004, "text": gemma4_text(
        hidden_size=64, intermediate_size=96, num_hidden_layers=6, num_attention_heads=8,
        num_key_value_heads=2, head_dim=16, global_head_dim=32, num_global_key_value_heads=2,
        attention_k_eq_v=True, layer_types=pattern(6, 3), enable_moe_block=True, num_experts=8,
        top_k_experts=2, moe_intermediate_size=32, use_bidirectional_attention="vision")},
}

E2B_MLX_PLAN = {
    "language_model.model.layers.4.self_attn.o_proj": {"group_size": 64, "bits": 8},
    "language_model.model.embed_tokens_per_layer": {"group_size": 32, "bits": 8},
    "language_model.model.layers.1.mlp.down_proj": False,
}
MOE_MLX_PLAN = {
    "language_model.model.layers.0.self_attn.q_proj": {"group_size": 32, "bits": 6},
    "language_model.model.layers.1.mlp.up_proj": {"group_size": 32, "bits": 5},
    "language_model.model.layers.2.mlp.gate_proj": {"group_size": 64, "bits": 2},
    "language_model.model.layers.3.mlp.down_proj": False,
}
for _l in range(SPECS["moe_like"]["text"]["num_hidden_layers"]):
    MOE_MLX_PLAN[f"language_model.model.layers.{_l}.experts.switch_glu.down_proj"] = {
        "group_size": 32, "bits": 3}
MLX_DEFAULT = {"group_size": 32, "bits": 4, "mode": "affine"}
ROUTER_QUANT = {"group_size": 64, "bits": 8}  # forced by mlx-lm / mlx-vlm quant_predicate

KV_FIXTURES = {  # cache index (= layer index over the donor prefix 0..7 of e4b_like) -> (bits, gs)
    "e4b_like_kv8": {i: (8, 32) for i in range(8)},
    "e4b_like_kv4": {i: (4, 32) for i in range(8)},
    "e4b_like_kvmix": {0: (8, 32), 1: (4, 32), 3: (8, 32), 5: (4, 64), 7: (8, 32)},
}

# ----------------------------------------------------------------------------------------------
# Libraries (imported in main so that an import failure is reported cleanly)
# ----------------------------------------------------------------------------------------------


class Libs:
    pass


L = Libs()


def load_libs():
    import torch
    import transformers
    import safetensors
    import safetensors.torch
    from transformers.cache_utils import DynamicCache, DynamicLayer, DynamicSlidingWindowLayer
    from transformers.configuration_utils import PreTrainedConfig
    from transformers.models.gemma4.configuration_gemma4 import Gemma4Config, Gemma4TextConfig
    from transformers.models.gemma4.modeling_gemma4 import (
        Gemma4ForConditionalGeneration, Gemma4TextExperts, Gemma4TextRouter)
    try:
        transformers.utils.logging.disable_progress_bar()
    except Exception:
        pass
    L.torch = torch
    L.transformers = transformers
    L.safetensors = safetensors
    L.st_torch = safetensors.torch
    L.DynamicCache = DynamicCache
    L.DynamicLayer = DynamicLayer
    L.DynamicSlidingWindowLayer = DynamicSlidingWindowLayer
    L.PreTrainedConfig = PreTrainedConfig
    L.Gemma4TextRouter = Gemma4TextRouter
    L.Gemma4TextExperts = Gemma4TextExperts
    L.families = {"gemma4": (Gemma4Config, Gemma4TextConfig, Gemma4ForConditionalGeneration)}
    L.unified_error = None
    try:
        from transformers.models.gemma4_unified.configuration_gemma4_unified import (
            Gemma4UnifiedConfig, Gemma4UnifiedTextConfig)
        from transformers.models.gemma4_unified.modeling_gemma4_unified import (
            Gemma4UnifiedForConditionalGeneration)
        L.families["gemma4_unified"] = (Gemma4UnifiedConfig, Gemma4UnifiedTextConfig,
                                        Gemma4UnifiedForConditionalGeneration)
    except Exception as e:  # only the 12b fixture needs it
        L.unified_error = f"{type(e).__name__}: {e}"


def family_classes(family):
    if family not in L.families:
        raise RuntimeError(f"model family {family} unavailable: {L.unified_error}")
    return L.families[family]


def versions():
    return {"transformers": L.transformers.__version__, "torch": L.torch.__version__,
            "safetensors": getattr(L.safetensors, "__version__", "?"), "numpy": np.__version__,
            "python": platform.python_version()}


# ----------------------------------------------------------------------------------------------
# Config, model construction, eager enforcement
# ----------------------------------------------------------------------------------------------


def set_eager(cfg):
    # The setters recurse into sub-configs (configuration_utils.py _attn_implementation /
    # _experts_implementation); set the text config directly as well.
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"
    tc = getattr(cfg, "text_config", None)
    if tc is not None:
        tc._attn_implementation = "eager"
        tc._experts_implementation = "eager"


def build_config(spec):
    config_cls, text_cls, _ = family_classes(spec["family"])
    tc = text_cls(**copy.deepcopy(spec["text"]))
    cfg = config_cls(text_config=tc, vision_config=None, audio_config=None)
    set_eager(cfg)
    return cfg


def force_eager(model):
    """Every config a module reads must say eager (attention and experts); verify it."""
    for m in model.modules():
        c = getattr(m, "config", None)
        if isinstance(c, L.PreTrainedConfig):
            if c._attn_implementation != "eager":
                c._attn_implementation = "eager"
            if c._experts_implementation != "eager":
                c._experts_implementation = "eager"
    bad = []
    for name, m in model.named_modules():
        c = getattr(m, "config", None)
        if isinstance(c, L.PreTrainedConfig):
            if c._attn_implementation != "eager":
                bad.append(f"{name}: attn={c._attn_implementation}")
            if isinstance(m, L.Gemma4TextExperts) and c._experts_implementation != "eager":
                bad.append(f"{name}: experts={c._experts_implementation}")
    if bad:
        raise RuntimeError("eager not in force: " + "; ".join(bad[:5]))


def language_model(model):
    return model.model.language_model


def ensure_tied(model, notes):
    emb = model.get_input_embeddings().weight
    if model.lm_head.weight.data_ptr() != emb.data_ptr():
        model.lm_head.weight = emb
        notes.append("lm_head was not tied after construction/load; tied by the generator")


def new_model(cfg, notes):
    _, _, model_cls = family_classes(cfg.model_type)
    L.torch.manual_seed(0)
    model = model_cls(copy.deepcopy(cfg))
    model.eval()
    force_eager(model)
    ensure_tied(model, notes)
    return model


def load_hf(family, dirpath, dtype, device, cfg, notes):
    config_cls, _, model_cls = family_classes(family)
    if cfg is None:
        cfg = config_cls.from_pretrained(dirpath)
    cfg = copy.deepcopy(cfg)
    set_eager(cfg)
    model = model_cls.from_pretrained(dirpath, config=cfg, dtype=dtype, attn_implementation="eager",
                                      experts_implementation="eager")
    model.eval()
    force_eager(model)
    ensure_tied(model, notes)
    odd = [f"{n}:{p.dtype}" for n, p in model.named_parameters() if p.dtype != dtype]
    if odd and dtype == L.torch.float32:
        raise RuntimeError(f"parameters not loaded as float32: {odd[:5]}")
    if odd:
        notes.append(f"transformers kept {len(odd)} parameters out of {dtype}: {odd[:3]}")
    return model.to(device)


# ----------------------------------------------------------------------------------------------
# Geometry: spec §1.2 resolution vs what transformers built
# ----------------------------------------------------------------------------------------------


def expected_geometry(spec):
    t = spec["text"]
    nl, lt = t["num_hidden_layers"], t["layer_types"]
    nks = t.get("num_kv_shared_layers", 0)
    first = nl - nks
    keqv = t.get("attention_k_eq_v", False)
    nglob = t.get("num_global_key_value_heads")
    gdim = t.get("global_head_dim", 512)
    out = []
    for i in range(nl):
        full = lt[i] == "full_attention"
        shared = nks > 0 and i >= first
        out.append({
            "layer": i, "type": lt[i], "head_dim": gdim if full else t["head_dim"],
            "kv_heads": nglob if (full and keqv and nglob is not None) else t["num_key_value_heads"],
            "k_eq_v": bool(full and keqv), "shared": shared,
            "donor": max(j for j in range(first) if lt[j] == lt[i]) if shared else i,
            "mlp": t["intermediate_size"] * (2 if (t.get("use_double_wide_mlp") and shared
                                                   and first > 0) else 1),
            "window": None if full else t["sliding_window"],
        })
    return out


def hf_layer_geometry(model):
    lm = language_model(model)
    nh = lm.config.num_attention_heads
    donors = {}
    for i, layer in enumerate(lm.layers):
        if layer.self_attn.store_full_length_kv:
            donors[layer.self_attn.layer_type] = i
    out = []
    for i, layer in enumerate(lm.layers):
        a = layer.self_attn
        kv = nh // a.num_key_value_groups
        shared = bool(a.is_kv_shared_layer)
        if a.q_proj.out_features != nh * a.head_dim:
            raise RuntimeError(f"layer {i}: q_proj {a.q_proj.out_features} != {nh}*{a.head_dim}")
        if shared:
            if hasattr(a, "k_proj"):
                raise RuntimeError(f"layer {i}: KV-shared layer has k_proj")
        else:
            if a.k_proj.out_features != kv * a.head_dim:
                raise RuntimeError(f"layer {i}: k_proj {a.k_proj.out_features} != {kv}*{a.head_dim}")
            if (a.v_proj is None) != bool(a.use_alternative_attention):
                raise RuntimeError(f"layer {i}: v_proj presence disagrees with k_eq_v")
        out.append({
            "layer": i, "type": a.layer_type, "head_dim": a.head_dim, "kv_heads": kv,
            "k_eq_v": bool(a.use_alternative_attention), "shared": shared,
            "donor": donors[a.layer_type] if shared else i, "mlp": layer.mlp.intermediate_size,
            "window": a.sliding_window,
        })
    return out


def hf_full_geometry(model):
    lm = language_model(model)
    tc = lm.config
    rot = {}
    for lt in ("sliding_attention", "full_attention"):
        buf = getattr(lm.rotary_emb, f"{lt}_inv_freq", None)
        if buf is not None:
            rot[lt] = [float(v) for v in buf.detach().float().cpu()]
    return {
        "layers": hf_layer_geometry(model),
        "shapes": {k: list(v.shape) for k, v in model.state_dict().items()},
        "rope_inv_freq": rot,
        "config": {k: getattr(tc, k, None) for k in (
            "vocab_size", "hidden_size", "num_hidden_layers", "sliding_window", "layer_types",
            "final_logit_softcapping", "rms_norm_eps", "hidden_size_per_layer_input",
            "num_kv_shared_layers", "attention_k_eq_v", "enable_moe_block", "num_experts",
            "top_k_experts", "moe_intermediate_size", "use_bidirectional_attention",
            "tie_word_embeddings", "hidden_activation")},
    }


def diff_dicts(a, b, path=""):
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b), key=str):
            if k not in a or k not in b:
                out.append(f"{path}/{k}: only in {'second' if k not in a else 'first'}")
            else:
                out.extend(diff_dicts(a[k], b[k], f"{path}/{k}"))
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        out = []
        for i, (x, y) in enumerate(zip(a, b)):
            out.extend(diff_dicts(x, y, f"{path}[{i}]"))
        return out
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def check_geometry(spec, model, what):
    got = hf_layer_geometry(model)
    d = diff_dicts(expected_geometry(spec), got)
    if d:
        raise RuntimeError(f"{what}: transformers' geometry differs from spec §1.2: " + "; ".join(d[:8]))
    return got


def check_same_geometry(model_a, model_b, what):
    d = diff_dicts(hf_full_geometry(model_a), hf_full_geometry(model_b))
    if d:
        raise RuntimeError(f"{what}: geometry differs: " + "; ".join(d[:8]))


# ----------------------------------------------------------------------------------------------
# Weights
# ----------------------------------------------------------------------------------------------


def unique_state(model):
    """(name, tensor) of the state dict with tied duplicates dropped (first name wins)."""
    seen = set()
    out = []
    for name, t in model.state_dict(keep_vars=True).items():
        key = (t.data_ptr(), t.numel(), str(t.dtype))
        if key in seen:
            continue
        seen.add(key)
        out.append((name, t))
    return out


def qk_norm_scale(head_dim):
    """Scores are q.k of two per-head RMS-normed vectors (no 1/sqrt(d)): std ~ sqrt(d)*E[w^2]. The
    q/k norm weights are scaled so that the score std is about QK_SCORE_STD; with weights ~1 the
    softmax is so peaked that transformers' own bf16 run (scores rounded to bf16) is far off."""
    if not QK_SCORE_STD:
        return 1.0
    ew2 = (UNIFORM[0] ** 2 + UNIFORM[0] * UNIFORM[1] + UNIFORM[1] ** 2) / 3.0
    return float(np.sqrt(QK_SCORE_STD / (ew2 * np.sqrt(head_dim))))


def init_kind(name, t, embed_factor):
    parts = name.split(".")
    last, mod = parts[-1], (parts[-2] if len(parts) > 1 else "")
    if last == "layer_scalar":
        return "uniform", None
    if last == "weight" and mod in ("q_norm", "k_norm") and t.dim() == 1:
        return "uniform", qk_norm_scale(int(t.shape[0]))
    if name.endswith("router.scale") or name.endswith("router.per_expert_scale"):
        return "uniform", None
    if last == "weight" and t.dim() == 1 and "norm" in mod:
        return "uniform", None
    if name.endswith("embed_tokens_per_layer.weight"):
        return "normal", STD_PLE
    if name.endswith("embed_tokens.weight"):
        return "normal", STD_EMBED * embed_factor
    if name.endswith("router.proj.weight"):
        return "normal", STD_ROUTER
    if mod == "experts" and last in ("gate_up_proj", "down_proj") and t.dim() == 3:
        return "normal", STD_LINEAR
    if last == "weight" and t.dim() == 2:
        return "normal", STD_LINEAR
    raise RuntimeError(f"no initialization rule for {name} {tuple(t.shape)}: would stay at init")


def randomize(model, seed, embed_factor):
    """Randomizes every parameter and persistent buffer (seeded per tensor name), rounded to bf16.
    Returns {name: bf16 cpu tensor} without the tied lm_head."""
    torch = L.torch
    weights = {}
    for name, t in unique_state(model):
        if name == "lm_head.weight":
            raise RuntimeError("lm_head.weight is not tied to embed_tokens")
        kind, std = init_kind(name, t, embed_factor)
        g = torch.Generator(device="cpu")
        g.manual_seed((seed * 1000003 + zlib.crc32(name.encode())) % (2 ** 62))
        if kind == "uniform":
            v = torch.rand(tuple(t.shape), generator=g, dtype=torch.float32)
            v = (v * (UNIFORM[1] - UNIFORM[0]) + UNIFORM[0]) * (std or 1.0)
        else:
            v = torch.randn(tuple(t.shape), generator=g, dtype=torch.float32) * std
        v = v.to(torch.bfloat16)
        with torch.no_grad():
            t.copy_(v.to(t.dtype))
        weights[name] = v.clone()
    return weights


def apply_weights(model, weights):
    """Copies {name: tensor} into the model (every unique state entry must be covered)."""
    torch = L.torch
    names = set()
    for name, t in unique_state(model):
        if name not in weights:
            raise RuntimeError(f"no weight for {name}")
        src = weights[name]
        if tuple(src.shape) != tuple(t.shape):
            raise RuntimeError(f"{name}: shape {tuple(src.shape)} != model {tuple(t.shape)}")
        with torch.no_grad():
            t.copy_(src.to(dtype=t.dtype, device=t.device))
        names.add(name)
    extra = sorted(set(weights) - names)
    if extra:
        raise RuntimeError(f"weights not in the model: {extra[:5]}")


def check_loaded_weights(model, weights, dtype):
    """The loaded model must hold exactly the stored values (bf16 weights, upcast if fp32)."""
    torch = L.torch
    sd = dict(unique_state(model))
    missing = [n for n in weights if n not in sd]
    if missing:
        raise RuntimeError(f"loaded model lacks {missing[:5]}")
    for name, src in weights.items():
        got = sd[name].detach().cpu()
        if not torch.equal(got, src.to(dtype)):
            raise RuntimeError(f"{name}: loaded values differ from the stored weights")
    for name in sd:
        if name not in weights and name != "lm_head.weight":
            raise RuntimeError(f"loaded model has {name} that the checkpoint does not")


def read_checkpoint(dirpath):
    """{name: tensor} from model.safetensors or a sharded index; validates the index."""
    idx_path = os.path.join(dirpath, "model.safetensors.index.json")
    out = {}
    if os.path.exists(idx_path):
        with open(idx_path) as f:
            idx = json.load(f)
        files = sorted(set(idx["weight_map"].values()))
        for fn in files:
            part = L.st_torch.load_file(os.path.join(dirpath, fn))
            for k, v in part.items():
                if idx["weight_map"].get(k) != fn:
                    raise RuntimeError(f"index maps {k} to {idx['weight_map'].get(k)}, found in {fn}")
                out[k] = v
        if set(out) != set(idx["weight_map"]):
            raise RuntimeError("index lists tensors absent from the shards")
    else:
        out = L.st_torch.load_file(os.path.join(dirpath, "model.safetensors"))
    return out


def save_hf_checkpoint(cfg, weights, dirpath, notes, max_shard_size=None, dtype=None):
    """Builds the model, applies `weights`, converts to `dtype` (bf16 default) and save_pretrained()s
    it; then verifies the files hold exactly `weights` under the module names."""
    torch = L.torch
    dtype = dtype or torch.bfloat16
    model = new_model(cfg, notes)
    apply_weights(model, weights)
    model = model.to(dtype)
    kw = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(dirpath, **kw)
    stored = read_checkpoint(dirpath)
    if set(stored) != set(weights):
        only_f = sorted(set(stored) - set(weights))[:4]
        only_w = sorted(set(weights) - set(stored))[:4]
        notes.append(f"save_pretrained renamed tensors (files-only {only_f}, model-only {only_w});"
                     " re-saved with save_original_format=False")
        model.save_pretrained(dirpath, save_original_format=False, **kw)
        stored = read_checkpoint(dirpath)
        if set(stored) != set(weights):
            raise RuntimeError("saved tensor names differ from the module names")
    for k, v in weights.items():
        if stored[k].dtype != dtype or not torch.equal(stored[k], v.to(dtype)):
            raise RuntimeError(f"saved {k} differs from the generated weights")
    del model


# ----------------------------------------------------------------------------------------------
# Forward passes, caches, quantized KV
# ----------------------------------------------------------------------------------------------


def fwd(model, ids, device, cache=None):
    torch = L.torch
    x = torch.tensor([list(ids)], dtype=torch.long, device=device)
    with torch.no_grad():
        if cache is None:
            out = model(input_ids=x, use_cache=False)
        else:
            out = model(input_ids=x, past_key_values=cache, use_cache=True)
    lg = out.logits
    if lg.dim() != 3 or lg.shape[0] != 1 or lg.shape[1] != len(ids):
        raise RuntimeError(f"unexpected logits shape {tuple(lg.shape)}")
    return lg[0].detach().to(torch.float32).cpu().numpy()


def kv_fake_quant(x, bits, gs):
    """quantize -> bf16 scale/bias -> dequantize along head_dim (the last axis)."""
    torch = L.torch
    a = x.detach().to(torch.float32).cpu().numpy()
    d = mq.fake_quant(a, bits, gs)
    return torch.from_numpy(d).to(device=x.device, dtype=x.dtype)


def make_cache(model, kv_spec, counters):
    """A DynamicCache as transformers builds it; layers listed in kv_spec get their `update` wrapped
    so the incoming K/V are replaced by their quantize->dequantize values before being stored and
    returned (so every read, the writing chunk's included, sees the stored values)."""
    cache = L.DynamicCache(config=model.config)
    if kv_spec:
        n = len(cache.layers)
        for idx, (bits, gs) in sorted(kv_spec.items()):
            if idx >= n:
                raise RuntimeError(f"kv layer {idx} outside the cache ({n} layers)")
            layer = cache.layers[idx]
            if type(layer) not in (L.DynamicLayer, L.DynamicSlidingWindowLayer):
                raise RuntimeError(f"cache layer {idx} is {type(layer).__name__}")
            orig = layer.update

            def wrapped(key_states, value_states, *args, _orig=orig, _bits=bits, _gs=gs, _idx=idx,
                        **kwargs):
                counters[_idx] = counters.get(_idx, 0) + 1
                return _orig(kv_fake_quant(key_states, _bits, _gs),
                             kv_fake_quant(value_states, _bits, _gs), *args, **kwargs)

            layer.update = wrapped
    return cache


def one_pass(model, ids, device, kv_spec):
    """Teacher-forced logits of one forward over all ids. Without KV quantization: no cache at all.
    With it: a fresh (hooked) cache, which gives the same masks and positions as no cache."""
    if not kv_spec:
        return fwd(model, ids, device, None)
    counters = {}
    cache = make_cache(model, kv_spec, counters)
    out = fwd(model, ids, device, cache)
    if set(counters) != set(kv_spec):
        raise RuntimeError(f"kv hooks fired for {sorted(counters)}, wanted {sorted(kv_spec)}")
    return out


def cached_decode(model, ids, device, kv_spec):
    """Prefill the first half through a DynamicCache, then one token at a time."""
    counters = {}
    cache = make_cache(model, kv_spec, counters)
    half = len(ids) // 2
    rows = [fwd(model, ids[:half], device, cache)]
    for t in range(half, len(ids)):
        rows.append(fwd(model, ids[t:t + 1], device, cache))
    if kv_spec and set(counters) != set(kv_spec):
        raise RuntimeError("kv hooks did not fire during cached decode")
    return np.concatenate(rows, axis=0), half, len(cache.layers)


class RouterTap:
    """Records every router's (probabilities, top-k index) during a forward."""

    def __init__(self, model):
        self.records = []
        self.handles = []
        for name, m in model.named_modules():
            if isinstance(m, L.Gemma4TextRouter):
                layer = int(name.split("layers.")[1].split(".")[0])
                self.handles.append(m.register_forward_hook(self._hook(layer)))

    def _hook(self, layer):
        def hook(mod, inp, out):
            probs, _, idx = out
            self.records.append((layer, probs.detach().float().cpu().numpy(),
                                 idx.detach().cpu().numpy()))
        return hook

    def remove(self):
        for h in self.handles:
            h.remove()

    def summary(self, n_experts, top_k):
        per_layer = {}
        gaps = []
        for layer, probs, idx in self.records:
            s = -np.sort(-probs, axis=-1)
            gaps.append(float((s[:, top_k - 1] - s[:, top_k]).min()))
            counts = np.bincount(idx.reshape(-1), minlength=n_experts)
            sets = {tuple(sorted(int(v) for v in row)) for row in idx}
            per_layer[layer] = {"usage": [int(c) for c in counts], "distinct_sets": len(sets)}
        used = set()
        for d in per_layer.values():
            used |= {e for e, c in enumerate(d["usage"]) if c}
        return {"top_k": top_k, "per_layer": {str(k): v for k, v in sorted(per_layer.items())},
                "experts_used": len(used), "min_topk_prob_margin": min(gaps) if gaps else None}


def routing_ok(r, n_experts):
    if r["experts_used"] < n_experts:
        return False
    for d in r["per_layer"].values():
        if sum(1 for c in d["usage"] if c) < 4 or d["distinct_sets"] < 3:
            return False
    return True


def margins(logits):
    s = -np.sort(-logits.astype(np.float64), axis=-1)
    return float((s[:, 0] - s[:, 1]).min())


def make_ids(seed, n):
    rng = np.random.default_rng(seed)
    return [BOS] + [int(v) for v in rng.integers(3, V, size=n - 1)]


def select_ids(model, seed, moe_cfg, n=T, candidates=ID_CANDIDATES):
    """Tries `candidates` id sequences of n tokens on the in-memory fp32 model; keeps the first
    whose argmax and routing decisions are not near ties (so a correct fp32 engine cannot flip
    them)."""
    best = None
    for c in range(candidates):
        ids = make_ids(seed * 100 + c, n)
        tap = RouterTap(model) if moe_cfg else None
        try:
            lg = fwd(model, ids, "cpu")
        finally:
            if tap:
                tap.remove()
        mx = float(np.abs(lg).max())
        gap = margins(lg)
        info = {"candidate": c, "ids_seed": seed * 100 + c, "max_abs": mx, "min_top2_gap": gap,
                "min_top2_gap_rel": gap / mx}
        score = gap / (GAP_REL * mx)
        good = gap >= GAP_REL * mx
        if moe_cfg:
            r = tap.summary(*moe_cfg)
            info["routing"] = r
            good = good and routing_ok(r, moe_cfg[0]) and r["min_topk_prob_margin"] >= ROUTE_MARGIN
            score = min(score, r["min_topk_prob_margin"] / ROUTE_MARGIN) if routing_ok(
                r, moe_cfg[0]) else -1.0
        if good:
            return ids, info
        if best is None or score > best[2]:
            best = (ids, info, score)
    ids, info, score = best
    if score < 0:
        raise RuntimeError("routing is degenerate for every candidate id sequence")
    info["note"] = "no candidate met every margin; kept the best"
    return ids, info


# ----------------------------------------------------------------------------------------------
# Statistics and output
# ----------------------------------------------------------------------------------------------


def log_softmax(x):
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def compare_stats(ref, other):
    lr, lo = log_softmax(ref), log_softmax(other)
    kl = (np.exp(lr) * (lr - lo)).sum(axis=-1)
    agree = int((ref.argmax(-1) == other.argmax(-1)).sum())
    return {"mean_kl": float(kl.mean()), "max_kl": float(kl.max()), "argmax_agree": agree,
            "positions": int(ref.shape[0]), "max_abs_diff": float(np.abs(ref - other).max())}


def write_logits(path, a):
    np.ascontiguousarray(a, dtype="<f4").tofile(path)


def file_list(fdir):
    out = {}
    for fn in sorted(os.listdir(fdir)):
        p = os.path.join(fdir, fn)
        if os.path.isfile(p) and fn != "meta.json":
            with open(p, "rb") as f:
                data = f.read()
            out[fn] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    return out


def write_json(path, obj, indent=2):
    with open(path, "w") as f:
        json.dump(obj, f, indent=indent, sort_keys=False)
        f.write("\n")


class Ctx:
    def __init__(self, out, device, argv):
        self.out = out
        self.device = device
        self.argv = argv

    def fixture_dir(self, name):
        d = os.path.join(self.out, name)
        if os.path.isdir(d):
            shutil.rmtree(d)
        os.makedirs(d)
        return d


def tolerance_block(stats, max_abs_ref, kv):
    bf16 = {"mean_kl_max": max(1e-3, 1.5 * stats["mean_kl"]),
            "argmax_agree_min": stats["argmax_agree"] - 1}
    if kv:
        fp32 = {"statistical": "quantized KV: fp32 paths use the bf16 bound as well", **bf16}
    else:
        fp32 = {"max_abs_logit_diff": 1e-3 * max_abs_ref, "argmax": "equal at every position"}
    return {"fp32": fp32, "bf16": bf16}


def reference_run(ctx, m32, m16, ids, kv_spec=None, moe_cfg=None):
    tap = RouterTap(m32) if moe_cfg else None
    try:
        ref = one_pass(m32, ids, ctx.device, kv_spec)
    finally:
        if tap:
            tap.remove()
    routing = tap.summary(*moe_cfg) if moe_cfg else None
    bf = one_pass(m16, ids, ctx.device, kv_spec)
    max_abs = float(np.abs(ref).max())
    stats = compare_stats(ref, bf)
    try:
        dec, half, n_cache = cached_decode(m32, ids, ctx.device, kv_spec)
        dec_diff = float(np.abs(dec - ref).max())
        dec_info = {"prefill": half, "then": "one token per step", "cache_layers": n_cache,
                    "max_abs_diff_vs_one_pass": dec_diff,
                    "rel": dec_diff / max_abs if max_abs else None,
                    "within_fp32_tolerance": bool(dec_diff <= 1e-3 * max_abs),
                    "argmax_equal": bool((dec.argmax(-1) == ref.argmax(-1)).all())}
        if kv_spec:
            dec_info["note"] = ("informational: K/V of single-token steps may differ from the "
                                "one-pass K/V in the last bit, which can move a quantization code")
    except Exception as e:  # a sanity check of the reference; never loses the fixture
        traceback.print_exc()
        dec_info = {"error": f"{type(e).__name__}: {e}", "max_abs_diff_vs_one_pass": None,
                    "within_fp32_tolerance": False}
    res = {
        "ref": ref, "bf16": bf, "max_abs_ref": max_abs, "stats": stats, "routing": routing,
        "cached_decode": dec_info, "min_top2_gap": margins(ref), "kv": bool(kv_spec),
    }
    if not np.all(np.isfinite(ref)) or not np.all(np.isfinite(bf)):
        raise RuntimeError("non-finite logits")
    if max_abs > 0.9 * SOFTCAP:
        raise RuntimeError(f"max|logit| {max_abs:.2f} too close to the softcap")
    return res


def finish_fixture(ctx, name, fdir, ids, res, meta_extra):
    with open(os.path.join(fdir, "ids.txt"), "w") as f:
        f.write(",".join(str(i) for i in ids) + "\n")
    write_logits(os.path.join(fdir, "logits.f32"), res["ref"])
    write_logits(os.path.join(fdir, "logits_bf16.f32"), res["bf16"])
    kv = meta_extra.get("kv_quant") is not None
    meta = {
        "name": name, "T": len(ids), "V": int(res["ref"].shape[1]),
        "description": meta_extra.pop("description"), "features": meta_extra.pop("features"),
        "max_abs_ref": res["max_abs_ref"], "min_top2_gap_ref": res["min_top2_gap"],
        "hf_bf16_vs_ref": res["stats"], "tolerance": tolerance_block(res["stats"],
                                                                       res["max_abs_ref"], kv),
        "cached_decode_check": res["cached_decode"],
    }
    if res["routing"] is not None:
        meta["routing_ref"] = res["routing"]
    meta.update(meta_extra)
    meta["reference"] = ("transformers eager attention + eager experts, fp32 weights loaded from the "
                         "stored checkpoint, one forward over all T ids (teacher-forced)")
    meta["versions"] = versions()
    meta["command"] = " ".join(shlex.quote(a) for a in ctx.argv)
    meta["device"] = ctx.device
    meta["files"] = file_list(fdir)
    write_json(os.path.join(fdir, "meta.json"), meta)
    return {"name": name, "T": len(ids), "V": int(res["ref"].shape[1]),
            "max_abs_ref": res["max_abs_ref"], "mean_kl": res["stats"]["mean_kl"],
            "agree": res["stats"]["argmax_agree"],
            "decode_diff": res["cached_decode"]["max_abs_diff_vs_one_pass"],
            "decode_ok": res["cached_decode"]["within_fp32_tolerance"] or res["kv"]}


# ----------------------------------------------------------------------------------------------
# Base models (built once per process, deterministic)
# ----------------------------------------------------------------------------------------------

_BASE = {}


def moe_cfg_of(spec):
    t = spec["text"]
    return (t["num_experts"], t["top_k_experts"]) if t.get("enable_moe_block") else None


def base_artifacts(name, n=None):
    """Config, bf16 weights and ids (n of them; default: the spec's T) of a base model; the
    embedding std is scaled down until max|logit| <= MAX_ABS_LOGIT. Each tensor is seeded by
    its name, so n changes the weights only if it changes that scale (meta.init records it;
    1.0 for every fixture here)."""
    spec = SPECS[name]
    n = n or spec.get("T", T)
    # a spec's candidate count belongs to its own T; other lengths keep the default, so their
    # selection is the one made before the spec's T grew
    cands = spec.get("id_candidates", ID_CANDIDATES) if n == spec.get("T", T) else ID_CANDIDATES
    if (name, n) in _BASE:
        return _BASE[(name, n)]
    notes = []
    cfg = build_config(spec)
    for factor in EMBED_FACTORS:
        model = new_model(cfg, notes)
        geometry = check_geometry(spec, model, name)
        weights = randomize(model, spec["seed"], factor)
        ids, sel = select_ids(model, spec["seed"], moe_cfg_of(spec), n, cands)
        del model
        if sel["max_abs"] <= MAX_ABS_LOGIT:
            break
    art = {"spec": spec, "cfg": cfg, "weights": weights, "ids": ids, "selection": sel,
           "embed_factor": factor, "geometry": geometry, "notes": notes}
    _BASE[(name, n)] = art
    return art


def init_meta(art):
    t = art["spec"]["text"]
    return {
        "linear_std": STD_LINEAR,
        "embed_tokens_std": STD_EMBED * art["embed_factor"],
        "embed_tokens_per_layer_std": STD_PLE if t.get("hidden_size_per_layer_input") else None,
        "router_proj_std": STD_ROUTER if t.get("enable_moe_block") else None,
        "uniform": list(UNIFORM),
        "uniform_applies_to": "every norm weight, layer_scalar, router.scale, router.per_expert_scale",
        "qk_norm_scale": {str(d): qk_norm_scale(d) for d in sorted({t["head_dim"],
                                                                     t["global_head_dim"]})},
        "qk_norm_note": f"q_norm/k_norm weights are U{tuple(UNIFORM)} times qk_norm_scale(head_dim), "
                        f"so that attention scores have std ~{QK_SCORE_STD}",
        "rounding": "all weights rounded to bf16 before the reference is computed",
        "seed": art["spec"]["seed"],
    }


def param_count(weights):
    return int(sum(int(np.prod(v.shape)) for v in weights.values()))


def published_config(spec, extra_top=None):
    """config.json in the form of released checkpoints: nested text_config with global_head_dim
    (and num_global_key_value_heads with k_eq_v), explicit layer_types, no per_layer_config."""
    family = spec["family"]
    text = copy.deepcopy(spec["text"])
    text["model_type"] = "gemma4_text" if family == "gemma4" else "gemma4_unified_text"
    text["dtype"] = "bfloat16"
    top = {"architectures": ["Gemma4ForConditionalGeneration" if family == "gemma4"
                             else "Gemma4UnifiedForConditionalGeneration"],
           "model_type": family, "text_config": dict(sorted(text.items())),
           "vision_config": None, "audio_config": None}
    top.update(TOP_TOKEN_IDS)
    top.update({"initializer_range": 0.02, "tie_word_embeddings": True, "dtype": "bfloat16",
                "transformers_version": L.transformers.__version__})
    if extra_top:
        top.update(extra_top)
    return top


def config_from_json_dict(family, d):
    """Loads a config dict the way from_pretrained does (through a config.json file)."""
    config_cls, _, _ = family_classes(family)
    tmp = tempfile.mkdtemp(prefix="lumen_cfg_")
    try:
        write_json(os.path.join(tmp, "config.json"), d)
        cfg = config_cls.from_pretrained(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    set_eager(cfg)
    return cfg


# ----------------------------------------------------------------------------------------------
# HF-layout fixtures
# ----------------------------------------------------------------------------------------------


def hf_fixture(ctx, name, description, features, max_shard_size=None, hand_config=False):
    torch = L.torch
    art = base_artifacts(name)
    spec = art["spec"]
    notes = list(art["notes"])
    fdir = ctx.fixture_dir(name)
    if max_shard_size == "three_shards":  # greedy packing at total/2.5 gives three shards
        max_shard_size = int(sum(v.numel() * 2 for v in art["weights"].values()) / 2.5)
    save_hf_checkpoint(art["cfg"], art["weights"], fdir, notes, max_shard_size=max_shard_size)
    cfg_used = None
    extra = {}
    if hand_config:
        pub = published_config(spec)
        write_json(os.path.join(fdir, "config.json"), pub)
        cfg_used = config_from_json_dict(spec["family"], pub)
        if cfg_used.model_type != spec["family"]:
            raise RuntimeError(f"hand-written config loads as {cfg_used.model_type}")
        a = new_model(art["cfg"], notes)
        b = new_model(cfg_used, notes)
        check_same_geometry(a, b, "hand-written config vs constructor config")
        check_geometry(spec, b, "hand-written config")
        del a, b
        extra["config_form"] = ("published (hand-written): nested text_config, global_head_dim, "
                                "num_global_key_value_heads, layer_types, no per_layer_config; "
                                "verified to load to the constructor config's geometry")
    else:
        with open(os.path.join(fdir, "config.json")) as f:
            saved = json.load(f)
        if "per_layer_config" not in saved.get("text_config", {}):
            notes.append("save_pretrained did not write per_layer_config")
        extra["config_form"] = "as save_pretrained writes it (text_config.per_layer_config)"
    shards = sorted(fn for fn in os.listdir(fdir) if fn.endswith(".safetensors"))
    if max_shard_size is not None and len(shards) < 2:
        raise RuntimeError(f"wanted a sharded checkpoint, got {shards}")
    m32 = load_hf(spec["family"], fdir, torch.float32, ctx.device, cfg_used, notes)
    check_loaded_weights(m32, art["weights"], torch.float32)
    m16 = load_hf(spec["family"], fdir, torch.bfloat16, ctx.device, cfg_used, notes)
    check_loaded_weights(m16, art["weights"], torch.bfloat16)
    res = reference_run(ctx, m32, m16, art["ids"], moe_cfg=moe_cfg_of(spec))
    extra.update({
        "description": description, "features": features, "family": spec["family"],
        "checkpoint": {"files": shards, "sharded": len(shards) > 1, "dtype": "bfloat16",
                       "layout": "HF model.language_model.*", "parameters": param_count(art["weights"])},
        "geometry": art["geometry"], "init": init_meta(art), "ids_selection": art["selection"],
        "notes": notes,
    })
    return finish_fixture(ctx, name, fdir, art["ids"], res, extra)


def fx_e2b_like(ctx):
    return hf_fixture(ctx, "e2b_like",
                      "E2B-like: PLE, KV sharing (donors 4/5), double-wide MLP on shared layers, "
                      "1 KV head, 4:1 sliding:full, head_dim 16 / global 32, W=8, softcap 30",
                      ["ple", "kv_sharing", "double_wide_mlp", "gqa_single_kv_head",
                       "sliding_window_wraps", "proportional_rope", "final_softcap",
                       "layer_scalar", "tied_head", "per_layer_config_json"])


def fx_e4b_like(ctx):
    return hf_fixture(ctx, "e4b_like",
                      "E4B-like: 5:1 sliding:full, 2 KV heads, KV sharing (donors 5/7), PLE, "
                      "head_dim 32 / global 64, W=8; sharded checkpoint",
                      ["ple", "kv_sharing", "gqa", "sliding_window_wraps", "proportional_rope",
                       "final_softcap", "layer_scalar", "tied_head", "sharded_safetensors",
                       "per_layer_config_json"],
                      max_shard_size="three_shards")


def fx_12b_like(ctx):
    return hf_fixture(ctx, "12b_like",
                      "12B-like (gemma4_unified, no vision/audio): attention_k_eq_v with one "
                      "global KV head, no PLE, no KV sharing; hand-written published config.json",
                      ["gemma4_unified", "k_eq_v", "global_kv_heads", "gqa", "published_config_json",
                       "sliding_window_wraps", "proportional_rope", "final_softcap", "layer_scalar",
                       "tied_head", "use_bidirectional_attention_vision_text_only"],
                      hand_config=True)


def fx_moe_like(ctx):
    return hf_fixture(ctx, "moe_like",
                      "26B-A4B-like: MoE block (8 experts, top-2, moe_intermediate 32) parallel to "
                      "the dense MLP, attention_k_eq_v with 2 global KV heads, no PLE",
                      ["moe", "router", "experts_gate_up_proj", "k_eq_v", "global_kv_heads", "gqa",
                       "sliding_window_wraps", "proportional_rope", "final_softcap",
                       "layer_scalar", "tied_head", "per_layer_config_json"])


# ----------------------------------------------------------------------------------------------
# MLX affine-quantized fixtures
# ----------------------------------------------------------------------------------------------

_SELFTEST = {}


def quantizer_selftest():
    """mlx_affine's own checks plus its bf16 rounding against torch's; cached."""
    if "result" not in _SELFTEST:
        torch = L.torch
        fails = mq.self_test()
        rng = np.random.default_rng(3)
        x = np.concatenate([(rng.standard_normal(4096) * 10.0 ** rng.integers(-8, 8, 4096)),
                            [0.0, -0.0, 1.0, 65504.0, 3.0e38, -3.0e38, 1e-40]]).astype(np.float32)
        mine = mq.f32_to_bf16_bits(x)
        theirs = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
        if not np.array_equal(mine, theirs):
            fails.append(f"bf16 rounding differs from torch at {int((mine != theirs).sum())} values")
        _SELFTEST["result"] = fails
    if _SELFTEST["result"]:
        raise RuntimeError("quantizer self-test failed: " + "; ".join(_SELFTEST["result"]))


def bf16_bytes(a):
    return mq.f32_to_bf16_bits(np.asarray(a, dtype=np.float32)).astype("<u2").tobytes()


def write_safetensors(path, tensors, metadata):
    """tensors: {name: (dtype, shape, bytes)}; written in name order, header padded to 8 bytes."""
    header = {"__metadata__": metadata}
    offset = 0
    blobs = []
    for name in sorted(tensors):
        dt, shape, data = tensors[name]
        n = int(np.prod(shape)) * {"U32": 4, "BF16": 2, "F32": 4}[dt]
        if n != len(data):
            raise RuntimeError(f"{name}: {len(data)} bytes for {dt}{list(shape)}")
        header[name] = {"dtype": dt, "shape": [int(s) for s in shape],
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * ((8 - len(hb) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for b in blobs:
            f.write(b)


def read_safetensors_raw(path):
    with open(path, "rb") as f:
        data = f.read()
    (hlen,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + hlen])
    body = data[8 + hlen:]
    header.pop("__metadata__", None)
    end = 0
    for name, h in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        a, b = h["data_offsets"]
        if a != end:
            raise RuntimeError(f"{name}: gap/overlap at {a}")
        end = b
    if end != len(body):
        raise RuntimeError("trailing bytes")
    return header, body


def mlx_convert(art, plan):
    """HF bf16 weights -> MLX tensors (sanitized names, switch_glu experts, quantized modules).
    Returns (tensors, quantization dict, dequantized HF-named fp32 weights, module table,
    {module path: dequantized array})."""
    torch = L.torch
    t = art["spec"]["text"]
    nl, nks = t["num_hidden_layers"], t.get("num_kv_shared_layers", 0)
    first_shared = nl - nks
    qcfg = dict(MLX_DEFAULT)
    tensors = {}
    deq = {}
    deq_mod = {}
    table = []
    used_plan = set()

    def decide(path, in_features):
        if path.endswith("router.proj"):
            if in_features % ROUTER_QUANT["group_size"]:
                raise RuntimeError(f"{path}: in {in_features} not divisible by 64")
            qcfg[path] = dict(ROUTER_QUANT)
            return ROUTER_QUANT["bits"], ROUTER_QUANT["group_size"], "override (router, forced)"
        if path in plan:
            used_plan.add(path)
            v = plan[path]
            if v is False:
                qcfg[path] = False
                return None, None, "false (left in bf16)"
            if in_features % v["group_size"]:
                raise RuntimeError(f"{path}: in {in_features} not divisible by {v['group_size']}")
            qcfg[path] = {"group_size": v["group_size"], "bits": v["bits"]}
            return v["bits"], v["group_size"], "override"
        if in_features % MLX_DEFAULT["group_size"]:
            return None, None, "not quantizable (in % group_size != 0), bf16, no entry"
        return MLX_DEFAULT["bits"], MLX_DEFAULT["group_size"], "default"

    for name, w16 in art["weights"].items():
        if not name.startswith("model.language_model."):
            raise RuntimeError(f"unexpected tensor {name}")
        rest = name[len("model.language_model."):]
        li = int(rest.split(".")[1]) if rest.startswith("layers.") else None
        if li is not None and nks and li >= first_shared and any(
                s in rest for s in (".self_attn.k_proj", ".self_attn.v_proj", ".self_attn.k_norm")):
            continue  # mlx-lm sanitize drops them (the HF model has none anyway)
        w = w16.to(torch.float32).numpy()
        mbase = "language_model.model." + rest
        if rest.endswith(".experts.gate_up_proj"):
            im = w.shape[1] // 2
            sw = mbase[:-len(".gate_up_proj")] + ".switch_glu."
            items = [(sw + "gate_proj", w[:, :im, :]), (sw + "up_proj", w[:, im:, :])]
        elif rest.endswith(".experts.down_proj"):
            items = [(mbase[:-len(".down_proj")] + ".switch_glu.down_proj", w)]
        elif rest.endswith(".weight") and w.ndim == 2:
            items = [(mbase[:-len(".weight")], w)]
        else:  # norms, layer_scalar, router.scale / per_expert_scale: bf16 as is
            tensors[mbase] = ("BF16", list(w.shape), bf16_bytes(w))
            deq[name] = torch.from_numpy(w.copy())
            table.append({"tensor": mbase, "kind": "bf16 (never quantized)", "shape": list(w.shape)})
            continue
        parts = []
        for path, arr in items:
            arr = np.ascontiguousarray(arr, dtype=np.float32)
            bits, gs, why = decide(path, arr.shape[-1])
            if bits is None:
                tensors[path + ".weight"] = ("BF16", list(arr.shape), bf16_bytes(arr))
                parts.append(arr)
                table.append({"module": path, "kind": why, "shape": list(arr.shape)})
                continue
            codes, s16, b16 = mq.quantize_store(arr, bits, gs)
            words = mq.pack(codes, bits)
            tensors[path + ".weight"] = ("U32", list(words.shape), words.astype("<u4").tobytes())
            tensors[path + ".scales"] = ("BF16", list(s16.shape), s16.astype("<u2").tobytes())
            tensors[path + ".biases"] = ("BF16", list(b16.shape), b16.astype("<u2").tobytes())
            deq_mod[path] = mq.dequantize(codes, s16, b16, gs)
            parts.append(deq_mod[path])
            table.append({"module": path, "kind": why, "bits": bits, "group_size": gs,
                          "shape": list(arr.shape), "weight_shape": list(words.shape)})
        full = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)
        deq[name] = torch.from_numpy(np.ascontiguousarray(full, dtype=np.float32))
    unused = sorted(set(plan) - used_plan)
    if unused:
        raise RuntimeError(f"plan entries match no module: {unused}")
    return tensors, qcfg, deq, table, deq_mod


def mlx_verify_file(path, table, deq_by_module):
    """Reads the written file back (own parser, and safetensors when it can) and re-dequantizes."""
    header, body = read_safetensors_raw(path)
    checks = {"own_parser": "ok"}
    for row in table:
        if "bits" not in row:
            continue
        p = row["module"]
        h = header[p + ".weight"]
        a, b = h["data_offsets"]
        words = np.frombuffer(body[a:b], dtype="<u4").reshape(h["shape"])
        s = header[p + ".scales"]
        s16 = np.frombuffer(body[s["data_offsets"][0]:s["data_offsets"][1]], dtype="<u2").reshape(
            s["shape"])
        bb = header[p + ".biases"]
        b16 = np.frombuffer(body[bb["data_offsets"][0]:bb["data_offsets"][1]],
                            dtype="<u2").reshape(bb["shape"])
        n_in = s16.shape[-1] * row["group_size"]
        if words.shape[-1] * 32 != n_in * row["bits"]:
            raise RuntimeError(f"{p}: weight/scales shapes disagree with bits {row['bits']}")
        codes = mq.unpack(words, row["bits"], n_in)
        if not np.array_equal(mq.dequantize(codes, s16, b16, row["group_size"]), deq_by_module[p]):
            raise RuntimeError(f"{p}: file does not dequantize to the reference weights")
    try:
        with L.safetensors.safe_open(path, framework="pt") as f:
            keys = list(f.keys())
            for k in keys:
                f.get_tensor(k)
        checks["safetensors_pt"] = f"ok ({len(keys)} tensors)"
    except Exception as e:  # e.g. a safetensors build without U32 for torch
        checks["safetensors_pt"] = f"could not read back: {type(e).__name__}: {e}"
    return checks


def mlx_fixture(ctx, name, base, plan, description, features):
    torch = L.torch
    quantizer_selftest()
    art = base_artifacts(base)
    spec = art["spec"]
    notes = list(art["notes"])
    fdir = ctx.fixture_dir(name)
    tensors, qcfg, deq, table, deq_mod = mlx_convert(art, plan)
    st_path = os.path.join(fdir, "model.safetensors")
    write_safetensors(st_path, tensors, {"format": "mlx"})
    # the file, read back and dequantized, must give exactly the weights the reference uses
    file_checks = mlx_verify_file(st_path, table, deq_mod)
    cfg_json = published_config(spec, {"quantization": qcfg, "quantization_config": copy.deepcopy(qcfg)})
    write_json(os.path.join(fdir, "config.json"), cfg_json)
    # transformers must read the published text config to the same geometry (quantization keys
    # stripped: they are MLX's, not an HF quantizer's)
    stripped = {k: v for k, v in cfg_json.items() if k not in ("quantization", "quantization_config")}
    cfg_pub = config_from_json_dict(spec["family"], stripped)
    a = new_model(art["cfg"], notes)
    b = new_model(cfg_pub, notes)
    check_same_geometry(a, b, "published config vs constructor config")
    del a, b
    # reference: the dequantized weights in fp32, through an HF checkpoint (fp32) and from_pretrained
    model = new_model(art["cfg"], notes)
    apply_weights(model, deq)
    ids, sel = select_ids(model, spec["seed"] + 50, moe_cfg_of(spec))
    del model
    tmp = tempfile.mkdtemp(prefix="lumen_mlxref_")
    try:
        save_hf_checkpoint(art["cfg"], deq, tmp, notes, dtype=torch.float32)
        m32 = load_hf(spec["family"], tmp, torch.float32, ctx.device, None, notes)
        check_loaded_weights(m32, deq, torch.float32)
        m16 = load_hf(spec["family"], tmp, torch.bfloat16, ctx.device, None, notes)
        res = reference_run(ctx, m32, m16, ids, moe_cfg=moe_cfg_of(spec))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    n_q = sum(1 for r in table if "bits" in r)
    widths = sorted({r["bits"] for r in table if "bits" in r})
    extra = {
        "description": description, "features": features, "family": spec["family"],
        "base_model": base,
        "checkpoint": {"files": ["model.safetensors"], "layout": "MLX language_model.model.*",
                       "metadata": {"format": "mlx"}, "quantized_modules": n_q, "bit_widths": widths,
                       "file_checks": file_checks},
        "quantization": qcfg, "modules": table,
        "config_form": "published (nested text_config, global_head_dim, no per_layer_config) + "
                       "quantization / quantization_config",
        "reference_weights": "w = f32(bf16 scale) * q + f32(bf16 bias) in fp32 for quantized modules "
                             "(stored bf16 values otherwise), loaded into the HF model in fp32; the "
                             "bf16 run loads the same fp32 weights with dtype=bfloat16 (RNE cast)",
        "quant_rule": "mlx_cpu (see README)",
        "geometry": art["geometry"], "init": init_meta(art), "ids_selection": sel, "notes": notes,
    }
    return finish_fixture(ctx, name, fdir, ids, res, extra)


def fx_e2b_like_mlx4(ctx):
    return mlx_fixture(ctx, "e2b_like_mlx4", "e2b_like", E2B_MLX_PLAN,
                       "e2b_like quantized the way mlx-lm converts Gemma 4: affine 4-bit g32 default, "
                       "8-bit overrides (o_proj of layer 4 at g64, embed_tokens_per_layer), one module "
                       "false, quantized tied embed_tokens, per_layer_projection (in=16) left bf16",
                       ["mlx_layout", "affine_q4", "affine_q8", "group_32", "group_64",
                        "quantized_embedding", "quantized_tied_head", "quantized_ple_table",
                        "per_module_override", "module_false", "unquantizable_module_bf16",
                        "kv_shared_layers_without_kv_tensors", "ple", "kv_sharing",
                        "double_wide_mlp"])


def fx_moe_like_mlx4(ctx):
    return mlx_fixture(ctx, "moe_like_mlx4", "moe_like", MOE_MLX_PLAN,
                       "moe_like quantized for MLX: 4-bit g32 default, router.proj 8-bit g64 (forced), "
                       "switch_glu experts (gate = first half of gate_up_proj), expert down_proj at "
                       "3 bits, one q_proj at 6 bits, one up_proj at 5 bits, one gate_proj at 2 bits "
                       "g64, one module false",
                       ["mlx_layout", "switch_glu_experts", "affine_q2", "affine_q3", "affine_q4",
                        "affine_q5", "affine_q6", "affine_q8", "group_32", "group_64",
                        "router_q8", "per_module_override", "module_false", "quantized_embedding",
                        "quantized_tied_head", "moe", "k_eq_v"])


# ----------------------------------------------------------------------------------------------
# Quantized-KV fixtures (weights of e4b_like)
# ----------------------------------------------------------------------------------------------


def kv_fixture(ctx, name):
    torch = L.torch
    quantizer_selftest()
    kv_spec = KV_FIXTURES[name]
    # T = 40 ids (e4b_like itself has 160): with quantized K/V, bf16 runs move many codes and the
    # argmax agreement of one engine already spreads by ~8 of 160 positions between feeding
    # modes, so oracle.md's "HF's agreement - 1 position" is only meaningful at its 40.
    art = base_artifacts("e4b_like", T)
    spec = art["spec"]
    notes = list(art["notes"])
    fdir = ctx.fixture_dir(name)
    tmp = tempfile.mkdtemp(prefix="lumen_kv_")
    try:
        save_hf_checkpoint(art["cfg"], art["weights"], tmp, notes)
        shutil.copyfile(os.path.join(tmp, "config.json"), os.path.join(fdir, "config.json"))
        sibling = os.path.join(ctx.out, "e4b_like")
        if os.path.isdir(sibling):
            theirs = read_checkpoint(sibling)
            ours = read_checkpoint(tmp)
            if set(theirs) != set(ours) or any(not torch.equal(theirs[k], ours[k]) for k in ours):
                raise RuntimeError("../e4b_like holds different weights than this fixture's model")
            weights_check = "verified equal to ../e4b_like in this output"
        else:
            weights_check = "../e4b_like not in this output; weights regenerated from the same spec"
        m32 = load_hf(spec["family"], tmp, torch.float32, ctx.device, None, notes)
        check_loaded_weights(m32, art["weights"], torch.float32)
        m16 = load_hf(spec["family"], tmp, torch.bfloat16, ctx.device, None, notes)
        res = reference_run(ctx, m32, m16, art["ids"], kv_spec=kv_spec)
        plain = one_pass(m32, art["ids"], ctx.device, None)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    vs_plain = compare_stats(res["ref"], plain)
    bound = max(1e-3, 1.5 * res["stats"]["mean_kl"])
    kv_list = [{"layer_idx": i, "bits": b, "group_size": g} for i, (b, g) in sorted(kv_spec.items())]
    if name == "e4b_like_kvmix":
        write_json(os.path.join(fdir, "kv_config.json"), kv_list)
    t = spec["text"]
    n_cache = t["num_hidden_layers"] - t["num_kv_shared_layers"]
    extra = {
        "description": f"e4b_like with K and V quantize->dequantize on append ({name[9:]})",
        "features": ["kv_quant", "kv_sharing_reads_donor_quantized", "sliding_window_wraps"] +
                    (["kv_config_mixed_layers", "group_64"] if name.endswith("kvmix") else []),
        "weights": "../e4b_like (same model; no safetensors here)", "weights_check": weights_check,
        "kv_quant": {
            "layers": kv_list, "cache_layers": n_cache,
            "unquantized_layers": [i for i in range(n_cache) if i not in kv_spec],
            "rule": "mlx_cpu affine along head_dim, codes from fp32 K/V, scale/bias rounded to bf16, "
                    "stored value = f32(bf16 scale)*q + f32(bf16 bias)",
            "where": "cache layer update (full and sliding layers): every attention read, the writing "
                     "chunk's queries included, sees the stored values; KV-shared layers read their "
                     "donor's stored values",
            "kv_config_json": "kv_config.json" if name.endswith("kvmix") else None,
            "vs_unquantized_model": {
                **vs_plain,
                "what": "this reference against the unquantized e4b_like fp32 reference (same ids): "
                        "roughly what a path that skipped the KV quantization would score",
                "bf16_style_bound": bound,
                "bound_detects_missing_quantization": bool(vs_plain["mean_kl"] > bound),
            },
        },
        "geometry": art["geometry"], "init": init_meta(art), "ids": "same as e4b_like",
        "notes": notes,
    }
    return finish_fixture(ctx, name, fdir, art["ids"], res, extra)


def fx_kv8(ctx):
    return kv_fixture(ctx, "e4b_like_kv8")


def fx_kv4(ctx):
    return kv_fixture(ctx, "e4b_like_kv4")


def fx_kvmix(ctx):
    return kv_fixture(ctx, "e4b_like_kvmix")


# ----------------------------------------------------------------------------------------------
# Quantizer codes (bit-exact unit-test data)
# ----------------------------------------------------------------------------------------------


def code_vectors():
    rng = np.random.default_rng(123)
    n = 128
    vec = {}
    vec["normal_f32"] = rng.standard_normal(n).astype(np.float32)
    vec["normal_bf16"] = mq.bf16_round(rng.standard_normal(n).astype(np.float32))
    vec["const_pos"] = np.full(n, 0.3, dtype=np.float32)
    vec["const_neg"] = np.full(n, -1.25, dtype=np.float32)
    vec["zeros"] = np.zeros(n, dtype=np.float32)
    z = rng.uniform(0.0, 2.0, n).astype(np.float32)
    z[::32] = 0.0
    vec["zero_min_edge_pos"] = z
    z = -rng.uniform(0.0, 2.0, n).astype(np.float32)
    z[5::32] = 0.0
    vec["zero_max_edge_neg"] = z
    a = rng.uniform(-0.1, 0.2, n).astype(np.float32)
    a[7::32] = -3.0
    vec["negative_dominated"] = a
    a = rng.uniform(-0.2, 0.1, n).astype(np.float32)
    a[9::32] = 3.0
    vec["positive_dominated"] = a
    vec["all_negative"] = -rng.uniform(0.5, 1.5, n).astype(np.float32)
    vec["all_positive"] = rng.uniform(0.5, 1.5, n).astype(np.float32)
    vec["large"] = (rng.standard_normal(n) * 3.0e4).astype(np.float32)
    vec["small"] = (rng.standard_normal(n) * 1.0e-5).astype(np.float32)
    vec["tiny_below_eps"] = (rng.standard_normal(n) * 1.0e-9).astype(np.float32)
    g4 = [0.0, 15.0] + [k + 0.5 for k in range(15)] + [float(k) for k in range(15)]
    vec["ties_4bit"] = np.array(g4 * 4, dtype=np.float32)
    g8 = [0.0, 255.0] + [k * 8 + 0.5 for k in range(30)]
    vec["ties_8bit"] = np.array(g8 * 4, dtype=np.float32)
    oh = np.zeros(n, dtype=np.float32)
    oh[3::32] = 1.0
    vec["one_hot"] = oh
    vec["alternating"] = np.array([1.0, -1.0] * (n // 2), dtype=np.float32)
    mixed = np.concatenate([-rng.uniform(0, 1, 32), rng.uniform(0, 1, 32),
                            rng.standard_normal(32) * 100, np.full(32, 7.0)]).astype(np.float32)
    vec["mixed_groups"] = mixed
    return vec


def fx_kv_quant_codes(ctx):
    quantizer_selftest()
    fdir = ctx.fixture_dir("kv_quant_codes")
    vecs = code_vectors()
    names = list(vecs)
    cases = []
    combos = [("mlx_cpu", b, g) for b in (4, 8) for g in (32, 64, 128)]
    combos += [("mlx_cpu", b, g) for b in (2, 3, 5, 6) for g in (32, 64)]
    combos += [("mlx_gpu", b, g) for b in (4, 8) for g in (32, 64, 128)]
    n_diff = 0
    for vi, vn in enumerate(names):
        x = vecs[vn]
        for rule, bits, gs in combos:
            codes, s16, b16 = mq.quantize_store(x, bits, gs, rule)
            case = {"vector": vi, "rule": rule, "bits": bits, "group_size": gs,
                    "codes": [int(c) for c in codes],
                    "scales_bf16": [int(v) for v in s16], "biases_bf16": [int(v) for v in b16]}
            if rule == "mlx_cpu":
                case["packed_u32"] = [int(w) for w in mq.pack(codes, bits)]
            else:
                ref_codes, ref_s, ref_b = mq.quantize_store(x, bits, gs, "mlx_cpu")
                case["differs_from_mlx_cpu"] = bool(not np.array_equal(ref_codes, codes) or
                                                    not np.array_equal(ref_s, s16) or
                                                    not np.array_equal(ref_b, b16))
                n_diff += case["differs_from_mlx_cpu"]
            cases.append(case)
    obj = {
        "format": "lumen kv_quant_codes v1",
        "doc": "see tools/oracle/README.md (kv_quant_codes)",
        "canonical_rule": "mlx_cpu",
        "rules": {
            "mlx_cpu": "MLX op definition and CPU kernel: true group min/max, rint (ties to even)",
            "mlx_gpu": "MLX Metal/CUDA kernels: w_max = max(0, group max), round half away from zero",
        },
        "vectors": [{"name": vn, "n": int(vecs[vn].size),
                     "x_f32_bits": [int(u) for u in vecs[vn].view(np.uint32)],
                     "x": [float(v) for v in vecs[vn]]} for vn in names],
        "cases": cases,
    }
    with open(os.path.join(fdir, "codes.json"), "w") as f:
        json.dump(obj, f, separators=(",", ":"))
        f.write("\n")
    meta = {"name": "kv_quant_codes", "vectors": len(names), "cases": len(cases),
            "gpu_rule_cases_differing_from_cpu_rule": n_diff,
            "combos": [list(c) for c in combos], "versions": versions(),
            "command": " ".join(shlex.quote(a) for a in ctx.argv)}
    meta["files"] = file_list(fdir)
    write_json(os.path.join(fdir, "meta.json"), meta)
    print(f"    {len(names)} vectors, {len(cases)} cases, {n_diff} gpu-rule cases differ from cpu rule",
          flush=True)
    return {"name": "kv_quant_codes", "T": None, "V": None, "max_abs_ref": None, "mean_kl": None,
            "agree": None, "decode_diff": None, "decode_ok": None,
            "info": f"{len(names)} vectors x {len(combos)} (rule,bits,group)"}


# ----------------------------------------------------------------------------------------------
# Driver
# ----------------------------------------------------------------------------------------------

FIXTURES = [
    ("e2b_like", fx_e2b_like),
    ("e4b_like", fx_e4b_like),
    ("12b_like", fx_12b_like),
    ("moe_like", fx_moe_like),
    ("e2b_like_mlx4", fx_e2b_like_mlx4),
    ("moe_like_mlx4", fx_moe_like_mlx4),
    ("e4b_like_kv8", fx_kv8),
    ("e4b_like_kv4", fx_kv4),
    ("e4b_like_kvmix", fx_kvmix),
    ("kv_quant_codes", fx_kv_quant_codes),
]


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def summary_line(r):
    if r.get("info"):
        return f"{r['name']:<16} {r['info']}"
    return (f"{r['name']:<16} T={r['T']} V={r['V']} max|ref|={r['max_abs_ref']:.3f} "
            f"bf16: meanKL={r['mean_kl']:.5f} argmax={r['agree']}/{r['T']} "
            f"cached-decode max|d|={fmt(r['decode_diff'], '.2e')}{'' if r['decode_ok'] else ' (!)'}")


def table(results, failed, timings):
    head = (f"{'fixture':<16} {'status':<6} {'T':>4} {'V':>5} {'max|ref|':>9} {'bf16 KL':>9} "
            f"{'argmax':>7} {'decode|d|':>10} {'secs':>6}")
    lines = [head, "-" * len(head)]
    for name, _ in FIXTURES:
        if name in results:
            r = results[name]
            agree = "-" if r["agree"] is None else f"{r['agree']}/{r['T']}"
            lines.append(f"{name:<16} {'ok':<6} {fmt(r['T'], '>4')} {fmt(r['V'], '>5')} "
                         f"{fmt(r['max_abs_ref'], '>9.3f')} {fmt(r['mean_kl'], '>9.5f')} "
                         f"{agree:>7} {fmt(r['decode_diff'], '>10.2e')} {timings[name]:>6.1f}")
        elif name in failed:
            lines.append(f"{name:<16} {'FAILED':<6} {'':>4} {'':>5} {'':>9} {'':>9} {'':>7} {'':>10} "
                         f"{timings[name]:>6.1f}   {failed[name]}")
    return "\n".join(lines)


def dir_bytes(d):
    n = 0
    for root, _, files in os.walk(d):
        for fn in files:
            n += os.path.getsize(os.path.join(root, fn))
    return n



def run_fixtures(fixtures, only, ctx, summary):
    """Runs each (name, fn) of fixtures (those named in `only`, when given) on ctx, a line per
    fixture; a failure prints its traceback and the next one runs. Returns (results, failed,
    timings) keyed by name: fn's result, the error text, the seconds taken."""
    results, failed, timings = {}, {}, {}
    for name, fn in fixtures:
        if only and name not in only:
            continue
        t0 = time.time()
        print(f"[{name}] ...", flush=True)
        try:
            r = fn(ctx)
            results[name] = r
            timings[name] = time.time() - t0
            print(f"[ok] {summary(r)} ({timings[name]:.1f}s)", flush=True)
        except Exception as e:
            timings[name] = time.time() - t0
            failed[name] = f"{type(e).__name__}: {e}"[:300]
            print(f"[FAILED] {name}: {type(e).__name__}: {e}", flush=True)
            traceback.print_exc()
            sys.stderr.flush()
    return results, failed, timings

def main(argv=None):
    argv = list(sys.argv if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=False, help="output directory (one folder per fixture)")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="generate only these fixtures")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                    help="device of the HF forward passes (weights are always generated on CPU)")
    ap.add_argument("--list", action="store_true", help="list the fixture names and exit")
    args = ap.parse_args(argv[1:])
    names = [n for n, _ in FIXTURES]
    if args.list:
        print("\n".join(names))
        return 0
    if not args.out:
        ap.error("--out is required")
    if args.only:
        bad = [n for n in args.only if n not in names]
        if bad:
            ap.error(f"unknown fixture(s) {bad}; known: {names}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        load_libs()
    except Exception:
        traceback.print_exc()
        print("cannot import torch / transformers / safetensors", file=sys.stderr)
        return 2
    torch = L.torch
    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: no CUDA device", file=sys.stderr)
        return 2
    torch.use_deterministic_algorithms(True, warn_only=True)
    os.makedirs(args.out, exist_ok=True)
    ctx = Ctx(args.out, args.device, argv)
    print(f"lumen fixtures -> {args.out} ({versions()}, device {args.device})", flush=True)
    if L.unified_error:
        print(f"note: gemma4_unified unavailable: {L.unified_error}", flush=True)
    t_all = time.time()
    results, failed, timings = run_fixtures(FIXTURES, args.only, ctx, summary_line)
    tab = table(results, failed, timings)
    total = dir_bytes(args.out)
    foot = (f"\ntotal {total / 1e6:.2f} MB in {args.out}; {len(results)} ok, {len(failed)} failed; "
            f"{time.time() - t_all:.1f}s\nversions: {json.dumps(versions())}\n"
            f"command: {' '.join(shlex.quote(a) for a in argv)}\n")
    print("\n" + tab + foot, flush=True)
    with open(os.path.join(args.out, "SUMMARY.txt"), "w") as f:
        f.write(tab + "\n" + foot)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
