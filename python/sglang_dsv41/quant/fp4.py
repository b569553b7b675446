"""FP4 (E2M1) numerics of DeepSeek-V4.1, bit-exact, pure torch (CPU or CUDA).

E2M1 code (4 bits): bit 3 = sign, bits 0..2 = magnitude index into
``(0, 0.5, 1, 1.5, 2, 3, 4, 6)``; codes 8..15 are the negatives (code 8 = -0).
Rounding of fp32 ``v`` (already clamped to [-6, 6]) is round-to-nearest-even between codes: at a
midpoint (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0) the even code wins, i.e. 0.25->0, 0.75->1,
1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4. The sign of ``v`` is kept (so -0.1 -> code 8 = -0).

Packing: two codes per byte, element ``2i`` in the LOW nibble and ``2i+1`` in the HIGH nibble.

Non-finite inputs (decided here): a NaN in a group makes the scale NaN and the group's values NaN
(NaN elements are stored as code 0; the NaN scale/exponent byte carries the NaN).
Indexer stage 1 / MXFP4 (UE8M0 scale): a +-inf makes the scale +inf and the whole group NaN.
Compressed-KV FP4 (E4M3 scale): inf/6 saturates the scale to 448, so a +-inf element becomes
+-6*448 = +-2688 and the rest of the group is quantized with scale 448. Nothing raises.
"""

from __future__ import annotations

import torch

from .fp8 import (
    MX_BLOCK,
    _f32_const,
    _groups,
    blockwise_scaled_mm,
    e4m3_satfinite,
    e8m0_to_fp32,
    fp32_pow2_to_e8m0,
    mxfp8_quant,
    ue8m0_ceil_scale,
    mxfp8_qdq_keep,
)
from .ste import fake_quant, keep_mask, quant_linear, ste

FP4_E2M1_MAX = 6.0
FP4_MAX_INV = 1.0 / 6.0  # used as fp32(1/6)
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
INDEX_FP4_BLOCK = 32
INDEX_AMAX_FLOOR = 6.0 * 2.0**-126
KV_FP4_BLOCK = 16
KV_AMAX_FLOOR = 6.0 * 2.0**-9
MXFP4_AMAX_FLOOR = 6.0 * 2.0**-126

# (threshold, inclusive): magnitude code = number of thresholds passed (RNE ties -> even code).
_E2M1_STEPS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True),
               (2.5, False), (3.5, True), (5.0, False))


def e2m1_table(device: torch.device | str | None = None) -> torch.Tensor:
    """fp32 [16]: value of each E2M1 code (index 8 is -0.0)."""
    mags = list(E2M1_MAGNITUDES)
    return torch.tensor(mags + [-m for m in mags], dtype=torch.float32, device=device)


def e2m1_codes(v: torch.Tensor) -> torch.Tensor:
    """fp32 values (clamped to [-6, 6] by the caller) -> uint8 E2M1 codes 0..15, same shape.

    RNE between codes, sign bit from ``signbit(v)`` (so -0 -> 8). |v| > 5 gives magnitude 6.
    NaN gives code 0 (E2M1 has no NaN; callers carry NaN through the scale), independent of the
    NaN's sign, so stored bytes do not depend on the device.
    """
    a = v.to(torch.float32).abs()
    mag = torch.zeros(v.shape, dtype=torch.uint8, device=v.device)
    for t, inclusive in _E2M1_STEPS:
        mag += (a >= t if inclusive else a > t).to(torch.uint8)
    neg = torch.signbit(v) & ~torch.isnan(v)
    return mag | (neg.to(torch.uint8) << 3)


def e2m1_values(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes 0..15 -> fp32 E2M1 values (unscaled), same shape."""
    return e2m1_table(codes.device)[codes.long()]


def e2m1_round(v: torch.Tensor) -> torch.Tensor:
    """fp32 -> fp32 rounded onto the E2M1 grid (RNE, sign kept, NaN propagated)."""
    v = v.to(torch.float32)
    return torch.where(torch.isnan(v), v, e2m1_values(e2m1_codes(v)))


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes [..., d] (d even) -> uint8 [..., d/2]; byte i = codes[2i] | codes[2i+1] << 4."""
    if codes.shape[-1] % 2:
        raise ValueError("last dim must be even to pack two FP4 codes per byte")
    c = codes.to(torch.uint8)
    return (c[..., 0::2] & 0xF) | ((c[..., 1::2] & 0xF) << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [..., d/2] -> uint8 codes [..., d] (low nibble = even element)."""
    lo = packed & 0xF
    hi = packed >> 4
    return torch.stack((lo, hi), dim=-1).flatten(-2)


def _fp4_ue8m0_quant(x: torch.Tensor, group: int, amax_floor: float):
    """Shared UE8M0-scaled FP4 quant: returns (codes [..., G, group], scale fp32 [..., G, 1])."""
    xg = _groups(x, group)
    amax = xg.abs().amax(dim=-1, keepdim=True).clamp(min=amax_floor)
    s = ue8m0_ceil_scale(amax, FP4_MAX_INV)
    v = (xg / s).clamp(-FP4_E2M1_MAX, FP4_E2M1_MAX)
    return v, s


def index_fp4_stage1(x: torch.Tensor) -> torch.Tensor:
    """Indexer FP4 stage 1 (fake quant of index queries / keys): bf16 [..., d] -> bf16 [..., d].

    Groups of 32 along the last dim: amax clamped >= 6*2**-126, s = ue8m0_ceil(amax, 1/6),
    v = clamp(x/s, -6, 6), out = bf16(e2m1_round(v) * s). Sign of zero kept.
    """
    v, s = _fp4_ue8m0_quant(x, INDEX_FP4_BLOCK, INDEX_AMAX_FLOOR)
    return (e2m1_round(v) * s).flatten(-2).to(torch.bfloat16)


def kv_fp4_quant(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Compressed-KV FP4 quant: bf16 [..., D] -> (codes uint8 [..., D], scale e4m3 [..., D/16]).

    Groups of 16: amax clamped >= 6*2**-9; s = e4m3_satfinite(amax / 6) (a true division);
    codes = RNE E2M1 of clamp(x / float(s), -6, 6) (sign of zero kept).
    """
    xg = _groups(x, KV_FP4_BLOCK)
    amax = xg.abs().amax(dim=-1, keepdim=True).clamp(min=KV_AMAX_FLOOR)
    s8 = e4m3_satfinite(amax / _f32_const(FP4_E2M1_MAX, amax))
    v = (xg / s8.to(torch.float32)).clamp(-FP4_E2M1_MAX, FP4_E2M1_MAX)
    return e2m1_codes(v).flatten(-2), s8.squeeze(-1)


def kv_fp4_dequant(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """(codes uint8 [..., D], scale e4m3 [..., D/16]) -> bf16 [..., D] = bf16(value * scale)."""
    vals = e2m1_values(codes).unflatten(-1, (scale.shape[-1], KV_FP4_BLOCK))
    return (vals * scale.to(torch.float32).unsqueeze(-1)).flatten(-2).to(torch.bfloat16)


def kv_fp4_qdq(x: torch.Tensor) -> torch.Tensor:
    """Compressed-KV FP4 fake quant: bf16 [..., D] -> bf16 [..., D] (see `kv_fp4_quant`)."""
    return kv_fp4_dequant(*kv_fp4_quant(x))


def quant_mxfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Routed-expert MXFP4 checkpoint writer: fp32 [..., K] -> (uint8 [..., K/2], e8m0 [..., K/32]).

    Per 32 consecutive elements: s = ue8m0_ceil(max(amax, 6*2**-126), 1/6), codes = RNE E2M1 of
    clamp(w/s, -6, 6) (-0 kept as code 8), packed low nibble = even element.
    """
    v, s = _fp4_ue8m0_quant(w, MX_BLOCK, MXFP4_AMAX_FLOOR)
    return pack_nibbles(e2m1_codes(v).flatten(-2)), fp32_pow2_to_e8m0(s.squeeze(-1))


def dequant_mxfp4(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """MXFP4 -> fp32: packed uint8 [..., K/2], scales e8m0 (or uint8) [..., K/32] -> [..., K]."""
    vals = e2m1_values(unpack_nibbles(packed)).unflatten(-1, (scales.shape[-1], MX_BLOCK))
    return (vals * e8m0_to_fp32(scales).unsqueeze(-1)).flatten(-2)


def fp4_linear(x: torch.Tensor, w_packed: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """Routed-expert FP4 GEMM as DeepSeek's reference computes it: bf16 [..., K] -> bf16 [..., N].

    x: bf16 [..., K] (MXFP8-quantized internally per 1x32); w_packed: uint8 [N, K/2];
    w_scale: float8_e8m0fnu or uint8 [N, K/32]. Per K block of 32, in order:
    acc += (q_x_blk @ e2m1(w_blk).T) * x_scale[:, kb:kb+1] * w_scale[:, kb]; then bf16.
    """
    n = w_packed.shape[0]
    k = w_packed.shape[1] * 2
    lead = x.shape[:-1]
    q, s = mxfp8_quant(x.reshape(-1, k), MX_BLOCK)
    wv = e2m1_values(unpack_nibbles(w_packed))
    out = blockwise_scaled_mm(q.to(torch.float32), s, wv, e8m0_to_fp32(w_scale), MX_BLOCK)
    return out.to(torch.bfloat16).reshape(*lead, n)


# ---------------------------------------------------------------- straight-through forms (QAT)
def quant_mxfp4_keep(w: torch.Tensor):
    """master [..., N, K] -> (int8 packed [..., N, K/2], e8m0 [..., N, K/32], keep bool [..., N, K],
    dequantized fp32 [..., N, K])."""
    packed, s = quant_mxfp4(w.float())
    return packed.view(torch.int8), s, keep_mask(w, e8m0_to_fp32(s), MX_BLOCK, FP4_E2M1_MAX), dequant_mxfp4(packed, s)


def mxfp4_qdq_ste(w: torch.Tensor) -> torch.Tensor:
    """master [..., N, K] -> same dtype on the MXFP4 grid (dequant of the exported bytes), STE."""
    _, _, keep, wdq = quant_mxfp4_keep(w.detach())
    return ste(w, wdq.to(w.dtype), keep)


def fp4_linear_ste(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x bf16 [..., K], master w [N, K] -> bf16 [..., N] = fp4_linear(x, *quant_mxfp4(w)) (W4A8), STE."""
    return quant_linear(x, w, quant_mxfp4_keep, fp4_linear, mxfp8_qdq_keep)


def kv_fp4_qdq_keep(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    codes, s8 = kv_fp4_quant(x)
    return kv_fp4_dequant(codes, s8), keep_mask(x, s8.float(), KV_FP4_BLOCK, FP4_E2M1_MAX)


def kv_fp4_qdq_ste(x: torch.Tensor) -> torch.Tensor:
    """`kv_fp4_qdq` with STE gradient (zero where the E4M3 scale made the element clip)."""
    return fake_quant(x, kv_fp4_qdq_keep)
