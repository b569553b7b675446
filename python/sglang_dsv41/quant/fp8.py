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

FP8_E4M3_MAX = 448.0
FP8_MAX_INV = 1.0 / 448.0  # used as fp32(1/448)
FP8_AMAX_FLOOR = 1e-4
MX_BLOCK = 32

_F32_EXP_MASK = 0xFF
_F32_MAN_MASK = 0x7FFFFF
_F32_POW2_M127_BITS = 0x00400000  # bits of 2**-127 (an fp32 subnormal)


def _f32_const(value: float, like: torch.Tensor) -> torch.Tensor:
    """0-dim fp32 tensor on ``like``'s device (avoids scalar fast paths such as a*(1/b))."""
    return torch.tensor(value, dtype=torch.float32, device=like.device)


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


def _inv_lsb_bound(v: torch.Tensor) -> torch.Tensor:
    """fp32 values with at most 4 significant bits and no fp32 subnormals (E4M3 / E2M1 values)
    -> float64 8 / 2**floor(log2|v|) >= 2**-lsb(v) (v is a multiple of 2**lsb); 0 for zeros."""
    top = (v.view(torch.int32) & 0x7F800000).view(torch.float32).double()  # 2**floor(log2|v|), 0 for 0
    return torch.where(top > 0, 8.0 / top, 0.0)


def block_partials(a3: torch.Tensor, b3: torch.Tensor) -> torch.Tensor:
    """Unscaled K-block partials in the fixed fp32 order. a3 fp32 [KB, M, block], b3 fp32
    [KB, N, block] -> fp32 [KB, M, N] with, for every block and (m, n):

        p = +0; for j in 0 .. block-1: p = fp32(p + a3[kb, m, j] * b3[kb, n, j])

    i.e. the block's products added one by one in K order from +0 (DeepSeek's CPU reference: its
    fp32 `a_blk @ b_blk.T` adds them in this order for M >= 2). Precondition: a3 and b3 hold E4M3 /
    E2M1 values (at most 4 significant bits, no fp32 subnormals), so every product is exact in fp32
    and fusing it into the add (FMA) or not gives the same bits: only the order of the adds matters.

    Computed exactly, not by emulating every add: in float64 the block sums S = sum_j p_j and
    T = sum_j |p_j| are exact (<= 41 significant bits). Every p_j is a multiple of 2**G (G: the
    smallest lsb exponent among the products), hence so is every prefix sum, whose magnitude is at
    most T: if T < 2**(G + 24) every prefix sum is an fp32 number, the fp32 loop never rounds, and it
    returns S (as +0 when S == 0). With U = sum_j ua_j * ub_j >= 2**-G (ua = `_inv_lsb_bound`, also a
    float64 GEMM), `T * U < 2**24` is sufficient. The other (kb, m, n) (a few percent on model
    activations) run the fp32 loop above literally.
    """
    blk = a3.shape[-1]
    a64, b64 = a3.double(), b3.double()
    s = torch.bmm(a64, b64.transpose(1, 2))
    t = torch.bmm(a64.abs(), b64.abs().transpose(1, 2))
    u = torch.bmm(_inv_lsb_bound(a3), _inv_lsb_bound(b3).transpose(1, 2))
    part = s.float() + 0.0  # -0 -> +0, like the loop's zero start
    kb, m, n = part.shape
    hit = (t * u >= 2.0**24).view(-1).nonzero().squeeze(1)  # NaN compares False: S is NaN there too
    if hit.numel():
        ia = (hit // (m * n)) * m + (hit // n) % m  # rows of a3 / b3 flattened to [KB * M | N, block]
        ib = (hit // (m * n)) * n + hit % n
        p = a3.reshape(kb * m, blk).index_select(0, ia) * b3.reshape(kb * n, blk).index_select(0, ib)
        p = p.t().contiguous()  # [block, R], exact products
        acc = torch.zeros(p.shape[1], dtype=torch.float32, device=p.device)
        for j in range(blk):
            acc = acc + p[j]
        part.view(-1)[hit] = acc
    return part


def blockwise_scaled_mm(
    a: torch.Tensor, a_s: torch.Tensor, b: torch.Tensor, b_s: torch.Tensor, block: int = MX_BLOCK
) -> torch.Tensor:
    """Block-scaled GEMM accumulation in DeepSeek's reference order, fp32 throughout.

    a: fp32 [M, K] unscaled quantized values; a_s: fp32 [M, K/block];
    b: fp32 [N, K]; b_s: fp32 [N, K/block]. Returns fp32 [M, N]:
        acc = +0
        for kb in K order:
            p   = block partial (`block_partials`: the block's products added one by one in K order)
            acc = fp32(acc + fp32(fp32(p * a_s[m, kb]) * b_s[n, kb]))
    exactly the operations of DeepSeek's `_block_scaled_gemm` (kernel_cpu.py) for M >= 2. The
    order is fixed by definition, so a row's result does not depend on the batch, the device or
    the kernel (docs/numerics.md).
    """
    m, k = a.shape
    n = b.shape[0]
    nblk = k // block
    a3 = a.view(m, nblk, block).transpose(0, 1)  # [KB, M, block]
    b3 = b.view(n, nblk, block).transpose(0, 1)  # [KB, N, block]
    acc = torch.zeros(m, n, dtype=torch.float32, device=a.device)
    chunk = max(1, (1 << 20) // max(1, m * n))  # blocks per pass: [chunk, M, N] partials
    for c0 in range(0, nblk, chunk):
        c1 = min(nblk, c0 + chunk)
        part = block_partials(a3[c0:c1], b3[c0:c1])
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
