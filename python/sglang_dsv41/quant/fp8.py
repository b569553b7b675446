"""FP8 (E4M3) and UE8M0 numerics of DeepSeek-V4.1, bit-exact, pure torch (CPU or CUDA).

Conventions used throughout:

* ``e4m3`` is ``torch.float8_e4m3fn`` (1 sign, 4 exponent, 3 mantissa bits, max 448, NaN 0x7F/0xFF).
* ``UE8M0`` is an unsigned power-of-two scale stored as one exponent byte ``e`` meaning
  ``2**(e - 127)``; byte 255 is NaN. torch's dtype for it is ``torch.float8_e8m0fnu``.
* Scales are computed by *multiplying* with the fp32 constant ``fp32(1/448)`` (never dividing),
  then rounding up to a power of two from the IEEE bits (`ue8m0_ceil_scale`).
* Quantized value = ``e4m3_satfinite(x_fp32 / scale)``: clamp to [-448, 448], then RNE cast.

Non-finite inputs (decided here, the reference is silent): a NaN anywhere in a 32-group makes the
group's amax NaN, the scale NaN and every quantized value of the group NaN (no exception). A +-inf
makes amax = inf and the scale +inf; every element of the group then becomes ``x / inf`` = +-0 (the
inf element itself NaN), so the fake-quantized group is all NaN (``0 * inf``), and an UE8M0 byte of
such a scale is 255 (NaN), which dequantizes the group to NaN as well. Sign of zero is preserved.
"""

from __future__ import annotations

import torch

from .ste import fake_quant, keep_mask, quant_linear, ste

FP8_E4M3_MAX = 448.0
FP8_MAX_INV = 1.0 / 448.0  # used as fp32(1/448)
FP8_AMAX_FLOOR = 1e-4
MX_BLOCK = 32

_F32_EXP_MASK = 0xFF
_F32_MAN_MASK = 0x7FFFFF
_F32_POW2_M127_BITS = 0x00400000  # bits of 2**-127 (an fp32 subnormal)


def _f32_const(value: float, like: torch.Tensor) -> torch.Tensor:
    """0-dim fp32 tensor on ``like``'s device (avoids scalar fast paths such as a*(1/b))."""
    return torch.full((), value, dtype=torch.float32, device=like.device)  # a fill: no host copy (graph-capturable)


def ue8m0_ceil_scale(amax: torch.Tensor, max_inv: float) -> torch.Tensor:
    """Power-of-two scale ``2**ceil(log2(fp32(amax) * fp32(max_inv)))``, computed from IEEE bits.

    amax: any float tensor (non-negative); max_inv: python float, used as an fp32 constant
    (e.g. 1/448, 1/6 or 1.0). Returns fp32, same shape. For x = amax*max_inv with biased exponent
    ``E`` and mantissa ``m``: result bits are ``(E + (m != 0)) << 23``. Hence x = 0 gives 0.0,
    subnormal x gives 2**-126, x = inf gives +inf, and NaN x gives NaN.
    """
    x = amax.to(torch.float32) * _f32_const(max_inv, amax)
    bits = x.view(torch.int32)
    exp = (bits >> 23) & _F32_EXP_MASK
    round_up = ((bits & _F32_MAN_MASK) != 0).to(torch.int32)
    out = ((exp + round_up) << 23).view(torch.float32)
    return torch.where(torch.isnan(x), x, out)


def e8m0_to_fp32(t: torch.Tensor) -> torch.Tensor:
    """UE8M0 -> fp32. t: ``float8_e8m0fnu`` or ``uint8`` exponent bytes, any shape.

    Byte e -> ``2**(e-127)`` exactly (e = 0 -> 2**-127, an fp32 subnormal); e = 255 -> NaN.
    """
    if t.dtype == torch.float8_e8m0fnu:
        t = t.view(torch.uint8)
    if t.dtype != torch.uint8:
        raise TypeError(f"expected float8_e8m0fnu or uint8, got {t.dtype}")
    e = t.to(torch.int32)
    bits = torch.where(e == 0, torch.full_like(e, _F32_POW2_M127_BITS), e << 23)
    out = bits.view(torch.float32)
    return torch.where(e == 255, torch.full_like(out, float("nan")), out)


def fp32_pow2_to_exponent_byte(t: torch.Tensor) -> torch.Tensor:
    """Exact power of two (fp32) -> UE8M0 exponent byte (uint8), from the IEEE bits.

    Meaningful for powers of two in [2**-127, 2**127]; +-inf and NaN give 255 (NaN). Other inputs
    just yield their biased exponent field (so 0 and subnormals below 2**-127 give 0, and a
    non-power of two is truncated toward its lower power of two). Sign is ignored.
    """
    bits = t.to(torch.float32).view(torch.int32)
    e = (bits >> 23) & _F32_EXP_MASK
    e = torch.where((bits & 0x7FFFFFFF) == _F32_POW2_M127_BITS, torch.zeros_like(e), e)
    return e.to(torch.uint8)


def fp32_pow2_to_e8m0(t: torch.Tensor) -> torch.Tensor:
    """Exact power of two (fp32) -> ``float8_e8m0fnu`` (see `fp32_pow2_to_exponent_byte`)."""
    return fp32_pow2_to_exponent_byte(t).view(torch.float8_e8m0fnu)


def e4m3_satfinite(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> ``float8_e4m3fn``: clamp to [-448, 448] then round-to-nearest-even.

    +-inf saturates to +-448, -0 stays -0. Same shape. Every NaN becomes the canonical byte 0x7F
    (+NaN), so stored bytes do not depend on the device's NaN sign propagation.
    """
    y = x.to(torch.float32).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX)
    q = y.to(torch.float8_e4m3fn).view(torch.uint8)
    q = torch.where(torch.isnan(y), torch.full_like(q, 0x7F), q)
    return q.view(torch.float8_e4m3fn)


def _groups(x: torch.Tensor, group: int) -> torch.Tensor:
    k = x.shape[-1]
    if k % group != 0:
        raise ValueError(f"last dim {k} is not a multiple of the group size {group}")
    return x.to(torch.float32).unflatten(-1, (k // group, group))


def mxfp8_quant(x: torch.Tensor, group: int = MX_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP8 activation quantization (per 1x32 group along the last dim).

    x: bf16 (any float) [..., K], K % group == 0.
    Returns ``q`` float8_e4m3fn [..., K] and ``s`` fp32 [..., K/group] (powers of two), where
    amax = max|x| over the group clamped to >= 1e-4, s = ue8m0_ceil(amax, 1/448),
    q = e4m3_satfinite(x / s). Dequantized value = q.float() * s. See module doc for NaN/inf.
    """
    xg = _groups(x, group)
    amax = xg.abs().amax(dim=-1, keepdim=True).clamp(min=FP8_AMAX_FLOOR)
    s = ue8m0_ceil_scale(amax, FP8_MAX_INV)
    q = e4m3_satfinite(xg / s)
    return q.flatten(-2), s.squeeze(-1)


def mxfp8_qdq(x: torch.Tensor, group: int = MX_BLOCK) -> torch.Tensor:
    """Fake MXFP8 quant: bf16 [..., K] -> bf16 [..., K] = bf16(q.float() * s)."""
    q, s = mxfp8_quant(x, group)
    y = q.to(torch.float32).unflatten(-1, (s.shape[-1], group)) * s.unsqueeze(-1)
    return y.flatten(-2).to(torch.bfloat16)


def _expand_block_scale(s: torch.Tensor, n: int, k: int, block: int) -> torch.Tensor:
    return s.repeat_interleave(block, dim=0)[:n].repeat_interleave(block, dim=1)[:, :k]


def dequant_fp8_weight(w: torch.Tensor, s: torch.Tensor, block: int = MX_BLOCK) -> torch.Tensor:
    """Dense FP8 checkpoint weight -> fp32 [N, K].

    w: float8_e4m3fn [N, K]; s: float8_e8m0fnu (or uint8 exponent bytes)
    [ceil(N/block), ceil(K/block)], one scale per block x block tile. out = w.float() * 2**(e-127).
    """
    n, k = w.shape
    return w.to(torch.float32) * _expand_block_scale(e8m0_to_fp32(s), n, k, block)


def quant_fp8_weight(w: torch.Tensor, block: int = MX_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 [N, K] -> (float8_e4m3fn [N, K], float8_e8m0fnu [ceil(N/block), ceil(K/block)]).

    Per block x block tile (ragged edge tiles use only their real elements): amax floored at 1e-4,
    scale = ue8m0_ceil(amax, 1/448) (= 2**ceil(log2(amax/448))), q = e4m3_satfinite(w / scale).
    An inf/NaN in a tile gives scale byte 255 (NaN) for that tile.
    """
    n, k = w.shape
    nb, kb = -(-n // block), -(-k // block)
    wf = w.to(torch.float32)
    padded = torch.nn.functional.pad(wf, (0, kb * block - k, 0, nb * block - n))
    tiles = padded.view(nb, block, kb, block)
    amax = tiles.abs().amax(dim=(1, 3)).clamp(min=FP8_AMAX_FLOOR)
    s = ue8m0_ceil_scale(amax, FP8_MAX_INV)
    q = e4m3_satfinite(wf / _expand_block_scale(s, n, k, block))
    return q, fp32_pow2_to_e8m0(s)


def dequant_engram_rows(w: torch.Tensor, s: torch.Tensor, group: int = MX_BLOCK) -> torch.Tensor:
    """Engram table rows -> bf16 [R, 256].

    w: float8_e4m3fn [R, 256]; s: float8_e8m0fnu (or uint8) [R, 256/group] (one per 32 columns;
    264 bytes per row in total). out = bf16(fp32(w) * 2**(e-127)) with a single final rounding
    (e = 0 means 2**-127; e = 255 gives NaN).
    """
    sf = e8m0_to_fp32(s).repeat_interleave(group, dim=-1)
    return (w.to(torch.float32) * sf).to(torch.bfloat16)


def blockwise_scaled_mm(
    a: torch.Tensor, a_s: torch.Tensor, b: torch.Tensor, b_s: torch.Tensor, block: int = MX_BLOCK
) -> torch.Tensor:
    """Block-scaled GEMM accumulation, fp32, in a fixed order (docs/numerics.md, "GEMM block partials").

    a: fp32 [M, K] unscaled quantized values (E4M3); a_s: fp32 [M, K/block];
    b: fp32 [N, K] (E4M3 or E2M1 values); b_s: fp32 [N, K/block]. Returns fp32 [M, N]:
        acc = +0
        for kb in K order:
            p   = fp32(exact sum of the block's 32 products)     (one rounding)
            acc = fp32(acc + fp32(fp32(p * a_s[m, kb]) * b_s[n, kb]))
    Every product of E4M3 x E4M3 (or E2M1 x E4M3) values is exact and a 32-term sum of them is exact
    in float64, so the partial does not depend on any kernel's order: a row's result is independent
    of the batch and the device. DeepSeek's CPU forward sums each block with an fp32 matmul over the
    call's rows instead, in the order MKL picks for that shape (in K order inside large calls, other
    orders for few rows, narrow outputs and a thread's last rows: docs/numerics.md choice 4b, so its
    rows depend on the batch); the two differ only in a block whose running sum needs more than 24
    bits (about 1% of blocks on model activations), at the last bit of that partial.
    """
    m, k = a.shape
    n = b.shape[0]
    nblk = k // block
    a3 = a.view(m, nblk, block).transpose(0, 1)  # [KB, M, block]
    b3 = b.view(n, nblk, block).permute(1, 2, 0)  # [KB, block, N]
    acc = torch.zeros(m, n, dtype=torch.float32, device=a.device)
    chunk = max(1, (1 << 22) // max(1, m * n))  # blocks per pass: [chunk, M, N] partials
    for c0 in range(0, nblk, chunk):
        c1 = min(nblk, c0 + chunk)
        part = torch.bmm(a3[c0:c1].double(), b3[c0:c1].double()).float() + 0.0  # exact, one rounding; -0 -> +0
        part = part * a_s[:, c0:c1].t().unsqueeze(-1) * b_s[:, c0:c1].t().unsqueeze(1)
        for i in range(c1 - c0):
            acc += part[i]
    return acc


def fp8_linear(
    x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, block: int = MX_BLOCK
) -> torch.Tensor:
    """Dense FP8 GEMM as DeepSeek's reference computes it: bf16 [..., K] -> bf16 [..., N].

    x: bf16 [..., K] (quantized internally with `mxfp8_quant`, 1 x block groups);
    w: float8_e4m3fn [N, K]; w_scale: float8_e8m0fnu or uint8 [ceil(N/block), K/block]
    (row scale = repeat_interleave(block) truncated to N). fp32 accumulation in K-block order,
    one final cast to bf16.
    """
    n, k = w.shape
    lead = x.shape[:-1]
    q, s = mxfp8_quant(x.reshape(-1, k), block)
    ws = e8m0_to_fp32(w_scale).repeat_interleave(block, dim=0)[:n]
    out = blockwise_scaled_mm(q.to(torch.float32), s, w.to(torch.float32), ws, block)
    return out.to(torch.bfloat16).reshape(*lead, n)


# ---------------------------------------------------------------- straight-through forms (QAT)
def mxfp8_qdq_keep(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (mxfp8_qdq(x), keep bool [..., K]: the element was not clipped)."""
    q, s = mxfp8_quant(x, MX_BLOCK)
    y = (q.float().unflatten(-1, (s.shape[-1], MX_BLOCK)) * s.unsqueeze(-1)).flatten(-2).to(torch.bfloat16)
    return y, keep_mask(x, s, MX_BLOCK, FP8_E4M3_MAX)


def mxfp8_qdq_ste(x: torch.Tensor) -> torch.Tensor:
    """`mxfp8_qdq` (activations before every FP8/FP4 GEMM; the FP8 window KV) with STE gradient."""
    return fake_quant(x, mxfp8_qdq_keep)


def quant_fp8_weight_keep(w: torch.Tensor, block: int = MX_BLOCK):
    """master [N, K] -> (e4m3 [N, K], e8m0 [N/b, K/b], keep bool [N, K], dequantized fp32 [N, K])."""
    q, s = quant_fp8_weight(w.float(), block)
    wdq = dequant_fp8_weight(q, s, block)
    keep = (w.float() / _expand_block_scale(e8m0_to_fp32(s), *w.shape, block)).abs() <= FP8_E4M3_MAX
    return q, s, keep, wdq


def fp8_weight_qdq_ste(w: torch.Tensor, block: int = MX_BLOCK) -> torch.Tensor:
    """master [N, K] -> same dtype on the FP8 32x32-tile grid (dequant of the exported bytes), STE."""
    _, _, keep, wdq = quant_fp8_weight_keep(w.detach(), block)
    return ste(w, wdq.to(w.dtype), keep)


def fp8_linear_ste(x: torch.Tensor, w: torch.Tensor, block: int = MX_BLOCK) -> torch.Tensor:
    """x bf16 [..., K], master w [N, K] -> bf16 [..., N] = fp8_linear(x, *quant_fp8_weight(w)),
    STE backward (ste.quant_linear)."""
    return quant_linear(x, w, lambda t: quant_fp8_weight_keep(t, block),
                        lambda a, q, s: fp8_linear(a, q, s, block), mxfp8_qdq_keep)


def fp8_linear_plain_ste(x: torch.Tensor, w: torch.Tensor, block: int = MX_BLOCK) -> torch.Tensor:
    """The same roundings as `fp8_linear_ste` (MXFP8(x), FP8 tiles of w, STE), one plain bf16
    matmul instead of the block-exact accumulation (the FAST gemm)."""
    return torch.nn.functional.linear(mxfp8_qdq_ste(x), fp8_weight_qdq_ste(w, block).to(torch.bfloat16))
