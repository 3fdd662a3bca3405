"""Geometry of lumen-tiny-kjv: a small Gemma 4 text decoder (E2B-style: 4:1 sliding:full layers, per-layer
embeddings, KV sharing, double-wide MLP on the KV-shared layers).

Stdlib only, so the dry run can print the geometry and the parameter count without torch. The same numbers
build the transformers config on the GPU machine (hf_text_kwargs) and the published-form config.json
(published_config); train.py checks the analytic count against the instantiated model.
Every matrix dimension is a multiple of 64 so `lumen quantize` can write MLX group-64 4-bit weights."""

import json

# Token ids fixed by the tokenizer (see tokenizer_build.SPECIALS).
PAD_ID, EOS_ID, BOS_ID = 0, 1, 2
TURN_END_ID = 5          # <turn|>
TOOL_RESPONSE_ID = 13    # <|tool_response>
IMAGE_IDS = {"boi_token_id": 16, "eoi_token_id": 17, "boa_token_id": 18, "eoa_token_index": 19,
             "image_token_id": 20, "audio_token_id": 21, "video_token_id": 22}

GEOMETRY = {
    "vocab_size": 4096,
    "hidden_size": 256,
    "intermediate_size": 512,          # 1024 on the KV-shared layers (use_double_wide_mlp)
    "num_hidden_layers": 10,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 64,                    # sliding layers
    "global_head_dim": 128,            # full layers
    "sliding_window": 128,
    "hidden_size_per_layer_input": 64,
    "num_kv_shared_layers": 4,
    "use_double_wide_mlp": True,
    "max_position_embeddings": 2048,
    "final_logit_softcapping": 30.0,
}


def layer_types(g=GEOMETRY):
    """4 sliding then 1 full, repeated (E2B's pattern); the last layer is full."""
    return ["full_attention" if (i + 1) % 5 == 0 else "sliding_attention" for i in range(g["num_hidden_layers"])]


def rope_parameters():
    return {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                               "rope_theta": 1000000.0}}


def resolved_layers(g=GEOMETRY):
    """Per layer: (type, head_dim, kv_heads, kv_shared, donor, mlp_width), as gemma4-spec.md §1.2 resolves it."""
    types = layer_types(g)
    n = g["num_hidden_layers"]
    first_shared = n - g["num_kv_shared_layers"]
    out = []
    for i, t in enumerate(types):
        full = t == "full_attention"
        shared = g["num_kv_shared_layers"] > 0 and i >= first_shared
        donor = max(j for j in range(first_shared) if types[j] == t) if shared else i
        wide = g["use_double_wide_mlp"] and shared and first_shared > 0
        out.append({"type": t, "head_dim": g["global_head_dim"] if full else g["head_dim"],
                    "kv_heads": g["num_key_value_heads"], "kv_shared": shared, "donor": donor,
                    "mlp": g["intermediate_size"] * (2 if wide else 1)})
    return out


def param_count(g=GEOMETRY):
    """Parameters by group (tied LM head counted once); the [1]-shaped layer_scalar buffers are not parameters."""
    H, V, L = g["hidden_size"], g["vocab_size"], g["num_hidden_layers"]
    Pd, nh = g["hidden_size_per_layer_input"], g["num_attention_heads"]
    groups = {"embed_tokens": V * H, "final_norm": H}
    if Pd:
        groups["ple_table"] = V * L * Pd
        groups["ple_projection"] = L * Pd * H + Pd
    attn = mlp = norms = ple = 0
    for lay in resolved_layers(g):
        hd, kv = lay["head_dim"], lay["kv_heads"]
        attn += 2 * nh * hd * H + hd                       # q_proj, o_proj, q_norm
        if not lay["kv_shared"]:
            attn += 2 * kv * hd * H + hd                   # k_proj, v_proj, k_norm
        mlp += 3 * H * lay["mlp"]
        norms += 4 * H
        if Pd:
            ple += 2 * Pd * H + H                          # gate, projection, post norm
    groups.update({"attention": attn, "mlp": mlp, "layer_norms": norms, "layer_ple": ple})
    groups["total"] = sum(groups.values())
    return groups


def check_quantizable(g=GEOMETRY):
    """Every matrix's input dim (the MLX group axis) and output dim must be a multiple of 64."""
    dims = [g["hidden_size"], g["intermediate_size"], g["vocab_size"], g["hidden_size_per_layer_input"],
            g["head_dim"] * g["num_attention_heads"], g["global_head_dim"] * g["num_attention_heads"],
            g["head_dim"] * g["num_key_value_heads"], g["global_head_dim"] * g["num_key_value_heads"],
            g["hidden_size_per_layer_input"] * g["num_hidden_layers"]]
    bad = [d for d in dims if d % 64]
    if bad:
        raise ValueError("dimensions not a multiple of 64: %s" % bad)
    for hd in (g["head_dim"], g["global_head_dim"]):
        if hd % 32:
            raise ValueError("head dim %d not a multiple of 32" % hd)


def hf_text_kwargs(g=GEOMETRY):
    """Keyword arguments for transformers' Gemma4TextConfig (global_head_dim is popped by its __post_init__)."""
    return dict(
        vocab_size=g["vocab_size"], hidden_size=g["hidden_size"], intermediate_size=g["intermediate_size"],
        num_hidden_layers=g["num_hidden_layers"], num_attention_heads=g["num_attention_heads"],
        num_key_value_heads=g["num_key_value_heads"], head_dim=g["head_dim"],
        global_head_dim=g["global_head_dim"], hidden_activation="gelu_pytorch_tanh",
        max_position_embeddings=g["max_position_embeddings"], rms_norm_eps=1e-6,
        pad_token_id=PAD_ID, eos_token_id=[EOS_ID, TURN_END_ID], bos_token_id=BOS_ID,
        tie_word_embeddings=True, rope_parameters=rope_parameters(), attention_bias=False,
        attention_dropout=0.0, sliding_window=g["sliding_window"], layer_types=layer_types(g),
        final_logit_softcapping=g["final_logit_softcapping"], use_bidirectional_attention=None,
        vocab_size_per_layer_input=g["vocab_size"], hidden_size_per_layer_input=g["hidden_size_per_layer_input"],
        attention_k_eq_v=False, num_kv_shared_layers=g["num_kv_shared_layers"], enable_moe_block=False,
        use_double_wide_mlp=g["use_double_wide_mlp"], initializer_range=0.02)


def published_config(g=GEOMETRY, transformers_version="5.17.0"):
    """config.json in the form the released checkpoints use (global_head_dim, not per_layer_config)."""
    text = {"model_type": "gemma4_text"}
    text.update({k: v for k, v in hf_text_kwargs(g).items()})
    text["dtype"] = "bfloat16"
    cfg = {"architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4",
           "text_config": text, "vision_config": None, "audio_config": None}
    cfg.update(IMAGE_IDS)
    cfg.update({"initializer_range": 0.02, "tie_word_embeddings": True, "dtype": "bfloat16",
                "transformers_version": transformers_version})
    return cfg


def generation_config():
    return {"bos_token_id": BOS_ID, "pad_token_id": PAD_ID,
            "eos_token_id": [EOS_ID, TURN_END_ID, TOOL_RESPONSE_ID],
            "do_sample": True, "temperature": 0.8, "top_k": 40, "top_p": 0.95,
            "transformers_version": "5.17.0"}


def describe(g=GEOMETRY):
    lines = ["layer  type     head_dim kv  shared(donor)  mlp"]
    for i, lay in enumerate(resolved_layers(g)):
        lines.append("%5d  %-7s  %8d %2d  %-13s  %d" % (
            i, lay["type"].split("_")[0], lay["head_dim"], lay["kv_heads"],
            ("yes (%d)" % lay["donor"]) if lay["kv_shared"] else "no", lay["mlp"]))
    pc = param_count(g)
    lines.append("parameters: " + ", ".join("%s %s" % (k, format(v, ",")) for k, v in pc.items()))
    return "\n".join(lines)


if __name__ == "__main__":
    check_quantizable()
    print(describe())
    print(json.dumps(published_config(), indent=1)[:400])
