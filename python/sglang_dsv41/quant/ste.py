"""Straight-through autograd for the quantizers (QAT): the value is the quantizer's, bit for bit.

Backward (straight-through estimator): the incoming gradient passes unchanged where the element was
NOT clipped by the quantizer (|x / scale| <= the format's max) and is zero where it was clipped; the
scale is treated as a constant; NaN elements get zero gradient. Each quantizer's STE form sits next
to it (`fp8.mxfp8_qdq_ste`, `fp4.kv_fp4_qdq_ste`, `layouts.index_fp4_qdq_ste`, ...); this module
holds only the autograd mechanism:

  fake_quant(x, qdq_keep)         y = qdq(x), dy/dx = keep            (qdq_keep: x -> (y, keep))
  ste(x, value, keep)             a value computed by the caller, gradient keep
  quant_linear(x, w, fmt...)      y = the exact GEMM of (x, quantized w); fp32 STE backward
                                  dx = (dy Q(W)) * keep(x), dW = (dy^T Q(x)) * keep(W)
  exact_value(exact, surrogate, *inputs)
                                  the value of a non-differentiable exact function, the gradient of a
                                  differentiable surrogate recomputed in backward
"""

from __future__ import annotations

from typing import Callable

import torch


def keep_mask(x: torch.Tensor, scale: torch.Tensor, group: int, qmax: float) -> torch.Tensor:
    """bool [..., K]: |x / s| <= qmax (the quantizer did not clip). scale fp32 [..., K/group]."""
    xg = x.float().unflatten(-1, (scale.shape[-1], group))
    return ((xg / scale.unsqueeze(-1)).abs() <= qmax).flatten(-2)


def _masked(gy: torch.Tensor, keep: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    if keep is None:
        return gy.to(dtype)
    return torch.where(keep, gy, torch.zeros((), dtype=gy.dtype, device=gy.device)).to(dtype)


def fake_quant(x: torch.Tensor, qdq_keep: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """qdq(x) exactly, gradient 1 where kept (qdq_keep returns (value, keep bool like x))."""
    value, keep = qdq_keep(x.detach())
    return ste(x, value, keep)


class _Precomputed(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, value: torch.Tensor, keep: torch.Tensor | None):
        ctx.save_for_backward(keep)
        ctx.in_dtype = x.dtype
        return value

    @staticmethod
    def backward(ctx, gy: torch.Tensor):
        (keep,) = ctx.saved_tensors
        return _masked(gy, keep, ctx.in_dtype), None, None


def ste(x: torch.Tensor, value: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
    """`value` (x's fake quant, computed once by the caller) with gradient to x: 1 where `keep`
    (everywhere when None), else 0."""
    return _Precomputed.apply(x, value.detach(), keep)


class _QuantLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, quantize_w, gemm, act_qdq_keep):
        q, s, keep_w, wdq = quantize_w(w)
        y = gemm(x, q, s)
        ctx.save_for_backward(x, wdq, keep_w)
        ctx.w_dtype, ctx.act_qdq_keep = w.dtype, act_qdq_keep
        return y

    @staticmethod
    def backward(ctx, gy: torch.Tensor):
        x, wdq, keep_w = ctx.saved_tensors
        x2 = x.reshape(-1, x.shape[-1])
        g2 = gy.reshape(-1, gy.shape[-1]).float()
        xdq, keep_x = ctx.act_qdq_keep(x2)
        gx = gw = None
        if ctx.needs_input_grad[0]:
            gx = torch.where(keep_x, g2 @ wdq, 0.0).to(x.dtype).reshape(x.shape)
        if ctx.needs_input_grad[1]:
            gw = torch.where(keep_w, g2.t() @ xdq.float(), 0.0).to(ctx.w_dtype)
        return gx, gw, None, None, None


def quant_linear(x: torch.Tensor, w: torch.Tensor, quantize_w: Callable, gemm: Callable, act_qdq_keep: Callable):
    """x bf16 [..., K], master w [N, K] -> gemm(x, *quantize_w(w)[:2]) with the fp32 STE backward.
    quantize_w: w -> (q, s, keep bool [N, K], dequantized fp32 [N, K]); act_qdq_keep: the
    activation rounding x2 [M, K] -> (value, keep)."""
    return _QuantLinear.apply(x, w, quantize_w, gemm, act_qdq_keep)


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
