"""Fake-quant ops with straight-through gradients (QAT), one per serving rounding.

Forward: the bit-exact quantizer of `sglang_dsv41.quant` (the same functions the serving forward
calls), so a value computed here equals the serving value bit for bit. Backward (straight-through
estimator): the incoming gradient passes unchanged where the element was NOT clipped by the
quantizer (|x / scale| <= the format's max) and is zero where it was clipped; the scale is treated as
a constant. NaN elements get zero gradient.

| op                    | rounding (serving)                                   | can clip?                         |
|-----------------------|------------------------------------------------------|-----------------------------------|
| `fp8_block_weight`    | dense FP8 weight, E4M3 per 32x32 tile, UE8M0 scale   | no (scale = ceil pow2 of amax/448)|
| `mxfp8_act`           | MXFP8 activation, E4M3 per 1x32, UE8M0 (amax >= 1e-4)| no                                |
| `mxfp4_weight`        | routed-expert MXFP4, E2M1 per 1x32, UE8M0            | no (scale = ceil pow2 of amax/6)  |
| `window_kv`           | FP8 window KV (= MXFP8 over all D dims)              | no                                |
| `kv_fp4`              | FP4 compressed KV, E2M1 per 16, E4M3 scale (RNE)     | yes: amax/6 rounded down in E4M3, |
|                       |                                                      |   or amax > 6*448 (scale saturates)|
| `index_fp4`           | two-stage indexer FP4 (stage 1 UE8M0 fake quant,     | no (both scales ceil pow2)        |
|                       |   stage 2 the 68-byte packer)                        |                                   |

GEMMs: `fp8_linear_ste` / `mxfp4_linear_ste` return exactly `quant.fp8_linear` / `quant.fp4_linear`
of (activations, quantized master weight) and back-propagate y = Q(x) Q(W)^T in fp32:
dx = (dy Q(W)) * keep(x), dW = (dy^T Q(x)) * keep(W). `exact_value(exact, surrogate, ...)` is the
general form: the value from an exact (non-differentiable) function, the gradient from a
differentiable surrogate recomputed in backward.
"""

from __future__ import annotations

from typing import Callable

import torch

from sglang_dsv41.quant import (
    FP4_E2M1_MAX,
    FP8_E4M3_MAX,
    dequant_fp8_weight,
    dequant_mxfp4,
    e8m0_to_fp32,
    fp4_linear,
    fp8_linear,
    index_fp4_pack,
    index_fp4_stage1,
    index_fp4_unpack,
    kv_fp4_dequant,
    kv_fp4_quant,
    mxfp8_quant,
    quant_fp8_weight,
    quant_mxfp4,
)
from sglang_dsv41.quant.fp4 import INDEX_AMAX_FLOOR, INDEX_FP4_BLOCK, KV_FP4_BLOCK, _fp4_ue8m0_quant

MX = 32


# ---------------------------------------------------------------- masks and scales
def _keep(x: torch.Tensor, scale: torch.Tensor, group: int, qmax: float) -> torch.Tensor:
    """bool [..., K]: |x / s| <= qmax (the quantizer did not clip). scale fp32 [..., K/group]."""
    xg = x.float().unflatten(-1, (scale.shape[-1], group))
    return ((xg / scale.unsqueeze(-1)).abs() <= qmax).flatten(-2)


def block_scale(scale_e8m0: torch.Tensor, n: int, k: int, block: int = MX) -> torch.Tensor:
    """UE8M0 [ceil(N/b), ceil(K/b)] -> fp32 [N, K] (each element's tile scale)."""
    s = e8m0_to_fp32(scale_e8m0)
    return s.repeat_interleave(block, 0)[:n].repeat_interleave(block, 1)[:, :k]


def quantize_fp8_block(w: torch.Tensor, block: int = MX) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """master [N, K] -> (e4m3 [N, K], e8m0 [N/b, K/b], keep bool [N, K]) = the checkpoint bytes."""
    q, s = quant_fp8_weight(w.float(), block)
    keep = (w.float() / block_scale(s, *w.shape, block)).abs() <= FP8_E4M3_MAX
    return q, s, keep


def quantize_mxfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """master [..., N, K] -> (int8 packed [..., N, K/2], e8m0 [..., N, K/32], keep bool [..., N, K])."""
    packed, s = quant_mxfp4(w.float())
    return packed.view(torch.int8), s, _keep(w, e8m0_to_fp32(s), MX, FP4_E2M1_MAX)


# ---------------------------------------------------------------- elementwise fake quant
class _FakeQuant(torch.autograd.Function):
    """y = qdq(x) exactly; dy/dx = 1 where kept, 0 elsewhere."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, qdq: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]):
        y, keep = qdq(x)
        ctx.save_for_backward(keep)
        ctx.in_dtype = x.dtype
        return y

    @staticmethod
    def backward(ctx, gy: torch.Tensor):
        (keep,) = ctx.saved_tensors
        return torch.where(keep, gy, torch.zeros((), dtype=gy.dtype, device=gy.device)).to(ctx.in_dtype), None


def _fp8_block_qdq(w: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    q, s, keep = quantize_fp8_block(w, block)
    return dequant_fp8_weight(q, s, block).to(w.dtype), keep


def _mxfp8_qdq(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    q, s = mxfp8_quant(x, MX)
    y = (q.float().unflatten(-1, (s.shape[-1], MX)) * s.unsqueeze(-1)).flatten(-2).to(torch.bfloat16)
    return y, _keep(x, s, MX, FP8_E4M3_MAX)


def _mxfp4_qdq(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    packed, s, keep = quantize_mxfp4(w)
    return dequant_mxfp4(packed.view(torch.uint8), s).to(w.dtype), keep


def _kv_fp4_qdq(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    codes, s8 = kv_fp4_quant(x)
    return kv_fp4_dequant(codes, s8), _keep(x, s8.float(), KV_FP4_BLOCK, FP4_E2M1_MAX)


def _index_fp4_qdq(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    _, s1 = _fp4_ue8m0_quant(x, INDEX_FP4_BLOCK, INDEX_AMAX_FLOOR)
    y1 = index_fp4_stage1(x)
    slot = index_fp4_pack(y1)
    half = x.shape[-1] // 2
    s2 = e8m0_to_fp32(slot[..., half:])
    keep = _keep(x, s1.squeeze(-1), INDEX_FP4_BLOCK, FP4_E2M1_MAX) & _keep(y1, s2, INDEX_FP4_BLOCK, FP4_E2M1_MAX)
    return index_fp4_unpack(slot, torch.bfloat16), keep


class _Precomputed(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, value: torch.Tensor, keep: torch.Tensor):
        ctx.save_for_backward(keep)
        ctx.in_dtype = x.dtype
        return value

    @staticmethod
    def backward(ctx, gy: torch.Tensor):
        (keep,) = ctx.saved_tensors
        return torch.where(keep, gy, torch.zeros((), dtype=gy.dtype, device=gy.device)).to(ctx.in_dtype), None, None


def ste(x: torch.Tensor, value: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """`value` (x's fake quant, computed once by the caller) with gradient 1 where `keep`, else 0."""
    return _Precomputed.apply(x, value, keep)


def fp8_block_weight(w: torch.Tensor, block: int = MX) -> torch.Tensor:
    """master fp32/bf16 [N, K] -> same dtype [N, K] on the FP8 32x32-tile grid (= dequant of the
    exported E4M3 + UE8M0 bytes)."""
    return _FakeQuant.apply(w, lambda t: _fp8_block_qdq(t, block))


def mxfp8_act(x: torch.Tensor) -> torch.Tensor:
    """bf16 [..., K] -> bf16 [..., K] = `quant.mxfp8_qdq(x)` (activations before every FP8/FP4 GEMM)."""
    return _FakeQuant.apply(x, _mxfp8_qdq)


def mxfp4_weight(w: torch.Tensor) -> torch.Tensor:
    """master [..., N, K] -> same dtype on the MXFP4 grid (= dequant of the exported packed E2M1)."""
    return _FakeQuant.apply(w, _mxfp4_qdq)


def window_kv(x: torch.Tensor) -> torch.Tensor:
    """bf16 [..., D] -> bf16 = `quant.window_kv_qdq(x)` (FP8 window KV, RoPE dims included)."""
    return _FakeQuant.apply(x, _mxfp8_qdq)


def kv_fp4(x: torch.Tensor) -> torch.Tensor:
    """bf16 [..., D] -> bf16 = `quant.kv_fp4_qdq(x)` (FP4 compressed KV, E4M3 scale per 16)."""
    return _FakeQuant.apply(x, _kv_fp4_qdq)


def index_fp4(x: torch.Tensor) -> torch.Tensor:
    """bf16 [..., d] -> bf16 = `quant.index_fp4_qdq(x)` (two-stage indexer FP4, q and k)."""
    return _FakeQuant.apply(x, _index_fp4_qdq)


# ---------------------------------------------------------------- GEMMs
class _QuantLinear(torch.autograd.Function):
    """y = exact serving GEMM of (x, quantized master); STE backward in fp32."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, fmt: str, block: int):
        if fmt == "fp8":
            q, s, keep_w = quantize_fp8_block(w, block)
            y = fp8_linear(x, q, s, block)
            wdq = dequant_fp8_weight(q, s, block)
        else:
            q, s, keep_w = quantize_mxfp4(w)
            y = fp4_linear(x, q, s)
            wdq = dequant_mxfp4(q.view(torch.uint8), s)
        ctx.save_for_backward(x, wdq, keep_w)
        ctx.w_dtype = w.dtype
        return y

    @staticmethod
    def backward(ctx, gy: torch.Tensor):
        x, wdq, keep_w = ctx.saved_tensors
        k = x.shape[-1]
        x2 = x.reshape(-1, k)
        g2 = gy.reshape(-1, gy.shape[-1]).float()
        gx = gw = None
        if ctx.needs_input_grad[0]:
            q, s = mxfp8_quant(x2, MX)
            keep_x = _keep(x2, s, MX, FP8_E4M3_MAX)
            gx = torch.where(keep_x, g2 @ wdq, 0.0).to(x.dtype).reshape(x.shape)
        if ctx.needs_input_grad[1]:
            xdq, _ = _mxfp8_qdq(x2)
            gw = torch.where(keep_w, g2.t() @ xdq.float(), 0.0).to(ctx.w_dtype)
        return gx, gw, None, None


def fp8_linear_ste(x: torch.Tensor, w: torch.Tensor, block: int = MX) -> torch.Tensor:
    """x bf16 [..., K], master w [N, K] -> bf16 [..., N] = `quant.fp8_linear(x, *quant_fp8_weight(w))`."""
    return _QuantLinear.apply(x, w, "fp8", block)


def mxfp4_linear_ste(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x bf16 [..., K], master w [N, K] -> bf16 [..., N] = `quant.fp4_linear(x, *quant_mxfp4(w))` (W4A8)."""
    return _QuantLinear.apply(x, w, "fp4", MX)


class _ExactValue(torch.autograd.Function):
    @staticmethod
    def forward(ctx, exact, surrogate, *inputs):
        ctx.surrogate = surrogate
        ctx.save_for_backward(*inputs)
        return exact(*inputs)

    @staticmethod
    def backward(ctx, *grads):
        inputs = ctx.saved_tensors
        need = ctx.needs_input_grad[2:]
        with torch.enable_grad():
            leaves = [t.detach().requires_grad_(n) for t, n in zip(inputs, need)]
            out = ctx.surrogate(*leaves)
            outs = out if isinstance(out, tuple) else (out,)
            wrt = [t for t, n in zip(leaves, need) if n]
            got = iter(torch.autograd.grad(outs, wrt, grads, allow_unused=True)) if wrt else iter(())
        return (None, None, *[next(got) if n else None for n in need])


def exact_value(exact: Callable, surrogate: Callable, *inputs: torch.Tensor):
    """`exact(*inputs)` (any ops, bit-exact, no autograd) with the gradient of `surrogate(*inputs)`
    (differentiable, same shape), recomputed in backward. Non-float inputs must not require grad."""
    return _ExactValue.apply(exact, surrogate, *inputs)
