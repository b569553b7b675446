"""Block-scaled GEMMs of the quantized linears: dense FP8 (W8A8) and routed-expert MXFP4 (W4A8).

Both quantize the activations to MXFP8 (E4M3 + power-of-two scale per 1x32 group, `mxfp8_quant`)
and compute, in fp32 (docs/numerics.md, "GEMM block partials"):
    p[kb]  = the exact sum of the 32 products q[m, k] * w[n, k] of block kb, rounded once to fp32
    acc    = +0, then for kb in K order: acc = acc + (p[kb] * a_scale[m, kb]) * w_scale[n, kb]
and round acc to bf16 once. Weight scales:
  fp8_linear  w e4m3 [N, K], w_scale e8m0/uint8 [ceil(N/32), K/32] (one per 32x32 tile)
  fp4_linear  w_packed uint8/int8 [N, K/2] (E2M1, low nibble = even element), w_scale [N, K/32]

The twins here are the kernel package's own formulation of that math, independent of
`sglang_dsv41.quant.blockwise_scaled_mm` (which the layers use): their own E2M1 decode and a
float64 einsum per block (products of E4M3 / E2M1 values and their 32-term sums are exact in
float64, so any order gives the same partial), where the layers use a batched bmm. Both give the
same bits (test/core/test_reduction_order.py). Only storage formats come from `sglang_dsv41.quant`.

The Triton kernels use the fp8 tensor cores for the 32-term partials (like DeepSeek's own GPU
kernel), whose internal order is not this one, so they match the twins within an fp8 tolerance
(test/kernels/test_gemm_gpu.py); the scale products and K-order accumulation are the twins'. Twins
and kernels are batch invariant: a row's result does not depend on the other rows (no split-K).
"""

from __future__ import annotations

import torch

from dsv41_kernels.registry import register
from sglang_dsv41.quant import e8m0_to_fp32, mxfp8_quant

BLOCK = 32
_PASS_ELEMS = 1 << 20  # fp32 partials per pass ([blocks, M, N]); bounds the working set


def _e2m1_decode(packed: torch.Tensor) -> torch.Tensor:
    """uint8/int8 [N, K/2] -> fp32 [N, K]: element 2i in the low nibble, 2i+1 in the high one.
    Code s e1 e0 m: e = 0 -> m * 0.5; else (1 + m/2) * 2**(e-1); bit 3 negates (code 8 = -0)."""
    b = packed.view(torch.uint8).to(torch.int32)
    codes = torch.stack([b & 15, b >> 4], dim=-1).flatten(-2)
    e, m = (codes >> 1) & 3, (codes & 1).float()
    mag = torch.where(e == 0, m * 0.5, torch.ldexp(1.0 + 0.5 * m, e - 1))
    return torch.where((codes & 8) != 0, -mag, mag)


def _scaled_mm(q: torch.Tensor, q_scale: torch.Tensor, wv: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """q fp32 [M, K] (E4M3 values), q_scale fp32 [M, K/32]; wv fp32 [N, K], w_scale fp32 [N, K/32]
    -> fp32 [M, N] (exact block partials, scaled, added in K order)."""
    m, k = q.shape
    n = wv.shape[0]
    nb = k // BLOCK
    qb = q.view(m, nb, BLOCK).permute(1, 2, 0)  # [KB, 32, M]
    wb = wv.view(n, nb, BLOCK).permute(1, 2, 0)  # [KB, 32, N]
    acc = torch.zeros(m, n, dtype=torch.float32, device=q.device)
    step = max(1, _PASS_ELEMS // max(1, m * n))
    for b0 in range(0, nb, step):
        b1 = min(nb, b0 + step)
        # exact block sums in float64 (at most 32 products of <= 8 significant bits), one rounding
        p = torch.einsum("bjm,bjn->bmn", qb[b0:b1].double(), wb[b0:b1].double()).float() + 0.0
        p = p * q_scale[:, b0:b1].t()[:, :, None]
        p = p * w_scale[:, b0:b1].t()[:, None, :]
        for i in range(b1 - b0):
            acc = acc + p[i]
    return acc


@register("fp8_linear")
def fp8_linear(x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, block: int = BLOCK) -> torch.Tensor:
    """Dense FP8 GEMM: bf16 [..., K] -> bf16 [..., N]. w float8_e4m3fn [N, K]; w_scale
    float8_e8m0fnu or uint8 [ceil(N/block), K/block] (one per block x block weight tile)."""
    n, k = w.shape
    if block != BLOCK:
        raise ValueError(f"fp8_linear: MX blocks of {BLOCK} only (got {block})")
    q, qs = mxfp8_quant(x.reshape(-1, k), BLOCK)
    ws = e8m0_to_fp32(w_scale)[torch.arange(n, device=w.device) // BLOCK]  # [N, K/32], row n -> tile n // 32
    out = _scaled_mm(q.float(), qs, w.float(), ws[:, : k // BLOCK])
    return out.to(torch.bfloat16).reshape(*x.shape[:-1], n)


@register("fp4_linear")
def fp4_linear(x: torch.Tensor, w_packed: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """Routed-expert W4A8 GEMM: bf16 [..., K] -> bf16 [..., N]. w_packed uint8/int8 [N, K/2]
    (E2M1 codes), w_scale float8_e8m0fnu or uint8 [N, K/32]."""
    n, k = w_packed.shape[0], 2 * w_packed.shape[1]
    q, qs = mxfp8_quant(x.reshape(-1, k), BLOCK)
    out = _scaled_mm(q.float(), qs, _e2m1_decode(w_packed), e8m0_to_fp32(w_scale)[:, : k // BLOCK])
    return out.to(torch.bfloat16).reshape(*x.shape[:-1], n)


from dsv41_kernels.registry import attach_kernels  # noqa: E402

attach_kernels("dsv41_kernels.gemm_triton", "fp8_linear", "fp4_linear")
