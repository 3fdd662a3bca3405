"""mlx_affine.py — MLX affine quantization (mx.quantize, mode "affine") re-implemented in numpy, plus
bf16 rounding, LSB-first bit packing and dequantization. Used by gen_fixtures.py to write MLX-quantized
checkpoints and quantized-KV references; it has no torch dependency so it can be checked on its own.

Two rules are implemented, because MLX's kernels differ in two details:
  "mlx_cpu"  the op-level definition (mlx/ops.cpp affine_quantize fallback) and the CPU kernel
             (mlx/backend/cpu/quantized.cpp quantize): per group, w_min/w_max are the true min/max,
             rounding is rint (ties to even). This is the canonical rule of every fixture.
  "mlx_gpu"  the Metal and CUDA kernels (affine_quantize in metal/kernels/quantized.h and
             cuda/quantized/affine_quantize.cu): w_max starts at 0 (so w_max = max(0, max(w))),
             w_min starts at +max (true min), rounding is round-half-away-from-zero.
Per group (all arithmetic in float32, exactly as the C++):
    scale = max((w_max - w_min) / (2^bits - 1), 1e-7)
    side  = |w_min| > |w_max|;  scale = side ? scale : -scale;  edge = side ? w_min : w_max
    q0    = round(edge / scale)
    if q0 != 0: scale = edge / q0; bias = edge   else: bias = 0
    q     = clamp(round((w - bias) / scale), 0, 2^bits - 1)
Codes use the float32 scale; the stored scale and bias are then rounded to the storage dtype (bf16
here, round-to-nearest-even), and dequantization is w' = f32(bf16 scale) * q + f32(bf16 bias).
"""

import numpy as np

SUPPORTED_BITS = (2, 3, 4, 5, 6, 8)
SUPPORTED_GROUPS = (32, 64, 128)
RULES = ("mlx_cpu", "mlx_gpu")


def f32_to_bf16_bits(x):
    """float32 -> bf16 bit patterns (uint16), round to nearest even; NaNs stay quiet NaNs."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    is_nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    lsb = (u >> np.uint32(16)) & np.uint32(1)
    r = ((u + np.uint32(0x7FFF) + lsb) >> np.uint32(16)).astype(np.uint16)
    qnan = ((u >> np.uint32(16)) | np.uint32(0x0040)).astype(np.uint16)
    return np.where(is_nan, qnan, r).astype(np.uint16)


def bf16_bits_to_f32(b):
    """bf16 bit patterns (uint16) -> float32 (exact)."""
    b = np.ascontiguousarray(b, dtype=np.uint16)
    return (b.astype(np.uint32) << np.uint32(16)).view(np.float32)


def bf16_round(x):
    """float32 values rounded to the nearest bf16 value, returned as float32."""
    return bf16_bits_to_f32(f32_to_bf16_bits(x))


def _round(x, rule):
    if rule == "mlx_cpu":
        return np.rint(x)  # ties to even, like std::rint / mx.round
    # round half away from zero (Metal/CUDA `round`); exact: x - trunc(x) is exact in float32
    t = np.trunc(x)
    tie = np.abs(x - t) == np.float32(0.5)
    return np.where(tie, t + np.sign(x), np.rint(x)).astype(np.float32)


def quantize(w, bits, group_size, rule="mlx_cpu"):
    """Quantizes w [..., n] along the last axis in groups of group_size.
    Returns (codes uint8 [..., n], scales float32 [..., n/gs], biases float32 [..., n/gs]); the
    scales/biases are the float32 values BEFORE rounding to the storage dtype."""
    if bits not in SUPPORTED_BITS:
        raise ValueError(f"unsupported bits {bits}")
    if group_size not in SUPPORTED_GROUPS:
        raise ValueError(f"unsupported group size {group_size}")
    if rule not in RULES:
        raise ValueError(f"unknown rule {rule}")
    w = np.ascontiguousarray(w, dtype=np.float32)
    n = w.shape[-1]
    if n % group_size:
        raise ValueError(f"last dim {n} not divisible by group size {group_size}")
    lead = w.shape[:-1]
    g = w.reshape(-1, n // group_size, group_size)
    n_bins = np.float32((1 << bits) - 1)
    eps = np.float32(1e-7)
    zero = np.float32(0.0)
    w_max = g.max(axis=-1)
    w_min = g.min(axis=-1)
    if rule == "mlx_gpu":
        w_max = np.maximum(w_max, zero)
    side = np.abs(w_min) > np.abs(w_max)
    scale = np.maximum((w_max - w_min) / n_bins, eps).astype(np.float32)
    scale = np.where(side, scale, -scale).astype(np.float32)
    edge = np.where(side, w_min, w_max).astype(np.float32)
    q0 = _round((edge / scale).astype(np.float32), rule)
    nonzero = q0 != zero
    safe_q0 = np.where(nonzero, q0, np.float32(1.0)).astype(np.float32)
    scale = np.where(nonzero, (edge / safe_q0).astype(np.float32), scale).astype(np.float32)
    bias = np.where(nonzero, edge, zero).astype(np.float32)
    q = _round(((g - bias[..., None]) / scale[..., None]).astype(np.float32), rule)
    q = np.clip(q, zero, n_bins).astype(np.uint8)
    return (q.reshape(*lead, n), scale.reshape(*lead, n // group_size),
            bias.reshape(*lead, n // group_size))


def pack(codes, bits):
    """codes uint8 [..., n] -> uint32 words [..., n*bits/32]: one little-endian bit stream per row,
    code k at bits [k*bits, (k+1)*bits) counted from bit 0 of byte 0 (MLX's layout for every width)."""
    codes = np.ascontiguousarray(codes, dtype=np.uint8)
    n = codes.shape[-1]
    if (n * bits) % 32:
        raise ValueError(f"row of {n} codes x {bits} bits is not a whole number of u32 words")
    if int(codes.max(initial=0)) >= (1 << bits):
        raise ValueError("code out of range")
    lead = codes.shape[:-1]
    c = codes.reshape(-1, n)
    shifts = np.arange(bits, dtype=np.uint8)
    bitplanes = ((c[:, :, None] >> shifts) & np.uint8(1)).astype(np.uint8)  # [R, n, bits], LSB first
    stream = bitplanes.reshape(c.shape[0], n * bits)
    by = np.packbits(stream, axis=-1, bitorder="little")  # [R, n*bits/8]
    words = np.ascontiguousarray(by).view("<u4")
    return words.reshape(*lead, n * bits // 32).astype(np.uint32)


def unpack(words, bits, n):
    """Inverse of pack: uint32 words [..., n*bits/32] -> codes uint8 [..., n]."""
    words = np.ascontiguousarray(words, dtype="<u4")
    lead = words.shape[:-1]
    by = words.reshape(-1, words.shape[-1]).view(np.uint8)
    stream = np.unpackbits(by, axis=-1, bitorder="little")[:, : n * bits]
    planes = stream.reshape(-1, n, bits).astype(np.uint16)
    vals = (planes << np.arange(bits, dtype=np.uint16)).sum(axis=-1)
    return vals.astype(np.uint8).reshape(*lead, n)


def dequantize(codes, scales_bf16, biases_bf16, group_size):
    """w' = f32(scale) * q + f32(bias) per group, in float32 (the product is exact)."""
    codes = np.asarray(codes, dtype=np.uint8)
    s = bf16_bits_to_f32(scales_bf16)
    b = bf16_bits_to_f32(biases_bf16)
    n = codes.shape[-1]
    lead = codes.shape[:-1]
    q = codes.reshape(*lead, n // group_size, group_size).astype(np.float32)
    out = s[..., None] * q + b[..., None]
    return out.astype(np.float32).reshape(*lead, n)


def quantize_store(w, bits, group_size, rule="mlx_cpu"):
    """What a quantized store holds: (codes, scale bf16 bits, bias bf16 bits)."""
    codes, s, b = quantize(w, bits, group_size, rule)
    return codes, f32_to_bf16_bits(s), f32_to_bf16_bits(b)


def fake_quant(x, bits, group_size, rule="mlx_cpu"):
    """quantize -> store (bf16 scale/bias) -> dequantize, along the last axis; float32 result."""
    codes, s16, b16 = quantize_store(x, bits, group_size, rule)
    return dequantize(codes, s16, b16, group_size)


def self_test():
    """Internal consistency checks (no MLX needed). Returns a list of failure strings."""
    fails = []
    rng = np.random.default_rng(7)
    for bits in SUPPORTED_BITS:
        for gs in SUPPORTED_GROUPS:
            x = (rng.standard_normal((3, 256)) * 0.7).astype(np.float32)
            codes, s16, b16 = quantize_store(x, bits, gs)
            words = pack(codes, bits)
            if words.shape != (3, 256 * bits // 32):
                fails.append(f"pack shape bits={bits} gs={gs}: {words.shape}")
            if not np.array_equal(unpack(words, bits, 256), codes):
                fails.append(f"pack/unpack round trip bits={bits} gs={gs}")
            # every element whose code is not clamped at 2^bits-1 dequantizes within half a
            # (bf16-rounded) step plus what the bf16 rounding of scale/bias adds. (scale = edge/q0
            # makes zero exact but can shrink the step, so the far end of a group may clamp.)
            deq = dequantize(codes, s16, b16, gs)
            step = np.abs(bf16_bits_to_f32(s16)).repeat(gs, axis=-1)
            gmax = np.abs(x).reshape(3, -1, gs).max(axis=-1).repeat(gs, axis=-1)
            err = np.abs(deq - x)
            tol = 0.5 * step * (1 + 2.0 ** -7) + gmax * 2.0 ** -8 + step * (2 ** bits) * 2.0 ** -8
            free = codes < (1 << bits) - 1
            if not np.all(err[free] <= tol[free]):
                fails.append(f"dequant error bits={bits} gs={gs}: max {float(err[free].max())}")
            # the group edge of larger magnitude is reproduced up to the bf16 rounding of the bias
            gx = x.reshape(3, -1, gs)
            edge = np.where(np.abs(gx.min(-1)) > np.abs(gx.max(-1)), gx.min(-1), gx.max(-1))
            if not np.array_equal(bf16_bits_to_f32(b16), bf16_round(edge)):
                fails.append(f"bias != bf16(edge) bits={bits} gs={gs}")
    # bit layout against hand-computed words (4-bit: code k at bits 4k of word k/8)
    c = np.tile(np.arange(16, dtype=np.uint8), 2)[None, :]  # 32 codes 0..15,0..15
    w4 = pack(c, 4)
    exp = [0x76543210, 0xFEDCBA98, 0x76543210, 0xFEDCBA98]
    if [int(v) for v in w4[0]] != exp:
        fails.append(f"4-bit layout {[hex(int(v)) for v in w4[0]]}")
    c3 = np.array([[1, 2, 3, 4, 5, 6, 7, 0] * 4], dtype=np.uint8)  # 32 codes x 3 bits = 3 words
    stream = 0
    for k, v in enumerate(c3[0]):
        stream |= int(v) << (3 * k)
    exp3 = [(stream >> (32 * i)) & 0xFFFFFFFF for i in range(3)]
    if [int(v) for v in pack(c3, 3)[0]] != exp3:
        fails.append("3-bit layout")
    # bf16 rounding: ties to even
    t = np.array([1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8, -(1.0 + 2.0 ** -8)], dtype=np.float32)
    if [int(v) for v in f32_to_bf16_bits(t)] != [0x3F80, 0x3F82, 0xBF80]:
        fails.append(f"bf16 RNE {[hex(int(v)) for v in f32_to_bf16_bits(t)]}")
    # a rint tie that the two rules round differently: group [0, 15, 6.5, ...] at 4 bits
    g = np.zeros(32, dtype=np.float32)
    g[1] = 15.0
    g[2] = 6.5
    qc, _, _ = quantize(g[None], 4, 32, "mlx_cpu")
    qg, _, _ = quantize(g[None], 4, 32, "mlx_gpu")
    if int(qc[0, 2]) != 8 or int(qg[0, 2]) != 9:
        fails.append(f"tie rule cpu={int(qc[0, 2])} gpu={int(qg[0, 2])} (expected 8 and 9)")
    return fails
