"""Byte layouts of DeepSeek-V4.1's stored (quantized) caches. All slots are uint8 [..., nbytes].

Window KV, FP8 (D = 512 -> 528 B per token)::

    [ D bytes: e4m3 values, element j at byte j | D/32 bytes: UE8M0 exponent of 32-group g ]

Compressed KV latent, FP4 (D = 512 -> 288 B per token)::

    [ D/2 bytes: E2M1 codes, byte i = code[2i] | code[2i+1] << 4 |
      D/16 bytes: e4m3 scale of 16-group g ]

Indexer key, FP4 (d = 128 -> 68 B per token)::

    [ d/2 bytes: E2M1 codes (low nibble = even element) | d/32 bytes: UE8M0 exponent of 32-group g ]

  For d = 128 the last four bytes, read as a little-endian int32, hold group g's exponent in byte g.

UE8M0 exponent byte e means 2**(e-127); 255 is NaN (written for a NaN/inf scale).
For every layout ``unpack(pack(x)) == qdq(x)`` bitwise (NaN positions included).
"""

from __future__ import annotations

import torch

from .fp4 import (
    FP4_E2M1_MAX,
    FP4_MAX_INV,
    INDEX_AMAX_FLOOR,
    INDEX_FP4_BLOCK,
    KV_FP4_BLOCK,
    e2m1_codes,
    e2m1_values,
    index_fp4_stage1,
    kv_fp4_dequant,
    kv_fp4_quant,
    pack_nibbles,
    unpack_nibbles,
    _fp4_ue8m0_quant,
)
from .fp8 import (
    MX_BLOCK,
    _f32_const,
    _groups,
    e8m0_to_fp32,
    fp32_pow2_to_exponent_byte,
    mxfp8_qdq,
    mxfp8_qdq_ste,
    mxfp8_quant,
    ue8m0_ceil_scale,
)

from .ste import fake_quant, keep_mask

INDEX_STAGE2_SCALE_FLOOR = 1e-4


def window_kv_nbytes(d: int) -> int:
    """Bytes per token of the FP8 window-KV slot: d + d/32 (528 for d = 512)."""
    return d + d // MX_BLOCK


def kv_fp4_nbytes(d: int) -> int:
    """Bytes per token of the FP4 compressed-KV slot: d/2 + d/16 (288 for d = 512)."""
    return d // 2 + d // KV_FP4_BLOCK


def index_fp4_nbytes(d: int) -> int:
    """Bytes per token of the FP4 indexer-key slot: d/2 + d/32 (68 for d = 128)."""
    return d // 2 + d // INDEX_FP4_BLOCK


# ---------------------------------------------------------------- window KV (FP8)
def window_kv_pack(x: torch.Tensor) -> torch.Tensor:
    """bf16 [..., D] -> uint8 [..., D + D/32]: MXFP8 (per 32) values then exponent bytes."""
    q, s = mxfp8_quant(x, MX_BLOCK)
    return torch.cat((q.view(torch.uint8), fp32_pow2_to_exponent_byte(s)), dim=-1)


def window_kv_unpack(slot: torch.Tensor) -> torch.Tensor:
    """uint8 [..., D + D/32] -> bf16 [..., D] = bf16(e4m3 * 2**(e-127))."""
    d = slot.shape[-1] * MX_BLOCK // (MX_BLOCK + 1)
    q = slot[..., :d].contiguous().view(torch.float8_e4m3fn).to(torch.float32)
    s = e8m0_to_fp32(slot[..., d:])
    y = q.unflatten(-1, (d // MX_BLOCK, MX_BLOCK)) * s.unsqueeze(-1)
    return y.flatten(-2).to(torch.bfloat16)


def window_kv_qdq(x: torch.Tensor) -> torch.Tensor:
    """bf16 [..., D] -> bf16 [..., D]; equals window_kv_unpack(window_kv_pack(x)) bitwise."""
    return mxfp8_qdq(x, MX_BLOCK)


# ---------------------------------------------------------------- compressed KV (FP4)
def kv_fp4_pack(x: torch.Tensor) -> torch.Tensor:
    """bf16 [..., D] -> uint8 [..., D/2 + D/16]: packed E2M1 codes then e4m3 scale bytes."""
    codes, s8 = kv_fp4_quant(x)
    return torch.cat((pack_nibbles(codes), s8.view(torch.uint8)), dim=-1)


def kv_fp4_unpack(slot: torch.Tensor) -> torch.Tensor:
    """uint8 [..., D/2 + D/16] -> bf16 [..., D]; equals kv_fp4_qdq(x) bitwise."""
    half = slot.shape[-1] * 8 // 9  # D/2 of D/2 + D/16
    codes = unpack_nibbles(slot[..., :half])
    s8 = slot[..., half:].contiguous().view(torch.float8_e4m3fn)
    return kv_fp4_dequant(codes, s8)


# ---------------------------------------------------------------- indexer keys (FP4)
def index_fp4_pack(x: torch.Tensor) -> torch.Tensor:
    """Indexer FP4 stage 2: bf16 [..., d] -> uint8 [..., d/2 + d/32].

    Per 32-group: scale = ue8m0_ceil(max(amax * fp32(1/6), 1e-4), 1.0) = 2**ceil(log2(max(amax/6,
    1e-4))); codes = RNE E2M1 of clamp(x/scale, -6, 6) with -0 normalised to +0 (code 8 -> 0);
    the scale is stored as its UE8M0 exponent byte.
    """
    xg = _groups(x, INDEX_FP4_BLOCK)
    amax = xg.abs().amax(dim=-1, keepdim=True)
    scaled = amax * _f32_const(FP4_MAX_INV, amax)
    scale = ue8m0_ceil_scale(scaled.clamp(min=INDEX_STAGE2_SCALE_FLOOR), 1.0)
    codes = e2m1_codes((xg / scale).clamp(-FP4_E2M1_MAX, FP4_E2M1_MAX))
    codes = torch.where(codes == 8, torch.zeros_like(codes), codes).flatten(-2)
    return torch.cat((pack_nibbles(codes), fp32_pow2_to_exponent_byte(scale.squeeze(-1))), dim=-1)


def index_fp4_unpack(slot: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """uint8 [..., d/2 + d/32] -> ``dtype`` (fp32 or bf16) [..., d] = E2M1 value * 2**(e-127)."""
    half = slot.shape[-1] * INDEX_FP4_BLOCK // (INDEX_FP4_BLOCK + 2)  # d/2 of d/2 + d/32
    vals = e2m1_values(unpack_nibbles(slot[..., :half]))
    s = e8m0_to_fp32(slot[..., half:])
    y = vals.unflatten(-1, (s.shape[-1], INDEX_FP4_BLOCK)) * s.unsqueeze(-1)
    return y.flatten(-2).to(dtype)


def index_fp4_qdq(x: torch.Tensor) -> torch.Tensor:
    """Two-stage indexer round trip of the reference: bf16 [..., d] -> bf16 [..., d].

    = index_fp4_unpack(index_fp4_pack(index_fp4_stage1(x)), bf16). Stage 2 is lossless on stage-1
    output except for -0 (becomes +0) and groups whose amax/6 < 1e-4 (scale floored to 2**-13).
    """
    return index_fp4_unpack(index_fp4_pack(index_fp4_stage1(x)), torch.bfloat16)


# ---------------------------------------------------------------- straight-through forms (QAT)
def window_kv_qdq_ste(x: torch.Tensor) -> torch.Tensor:
    """`window_kv_qdq` (= MXFP8 over all D dims) with STE gradient."""
    return mxfp8_qdq_ste(x)


def index_fp4_qdq_keep(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    _, s1 = _fp4_ue8m0_quant(x, INDEX_FP4_BLOCK, INDEX_AMAX_FLOOR)
    y1 = index_fp4_stage1(x)
    slot = index_fp4_pack(y1)
    s2 = e8m0_to_fp32(slot[..., x.shape[-1] // 2:])
    keep = keep_mask(x, s1.squeeze(-1), INDEX_FP4_BLOCK, FP4_E2M1_MAX) & keep_mask(y1, s2, INDEX_FP4_BLOCK, FP4_E2M1_MAX)
    return index_fp4_unpack(slot, torch.bfloat16), keep


def index_fp4_qdq_ste(x: torch.Tensor) -> torch.Tensor:
    """`index_fp4_qdq` (two-stage indexer FP4, queries and keys) with STE gradient."""
    return fake_quant(x, index_fp4_qdq_keep)
