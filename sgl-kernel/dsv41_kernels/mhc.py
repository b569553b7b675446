"""mHC ops: a hyper-connection site's gates after its fp32 GEMM, and the stream collapse / expand.

    mhc_gates(x, mix, base, scale, iters, hc_eps, norm_eps) -> (pre [T,n], post [T,n], comb [T,n,n]) fp32

x [T, n*H] bf16|fp32 are the site's flattened input streams, mix [T, (2+n)n] fp32 their raw GEMM with
the site's fn (before the rsqrt), base [(2+n)n] and scale [3] fp32; n comes from base.numel(). In
fp32, every step one IEEE operation in this order:
  z    = (mix * rsqrt(mean_square(x) + norm_eps)) * scale[part] + base   (part 0: pre, 1: post, 2: comb)
  pre  = sigmoid(z[:n]) + hc_eps,   post = 2 * sigmoid(z[n:2n])
  comb = Sinkhorn of z[2n:] as [n, n] (row-major): m = exp(c - rowmax(c)); m = m / rowsum + hc_eps;
         m = m / (colsum + hc_eps); then iters - 1 times m = m / (rowsum + hc_eps), m = m / (colsum + hc_eps)
Row sums add the columns left to right, column sums the rows top to bottom, one rounding per add.
The statistic is `sglang_dsv41.reduction.mean_square` (DeepSeek's fp32 order). sigmoid and exp are
torch's on the tensor's device; the Triton kernel (mhc_triton.py) reproduces them on CUDA.
The twins are the layers' functions (`sglang_dsv41.shared_math`); the gates' torch formulation is
~160 small launches per call on a GPU.

    mhc_collapse(streams, pre) -> [T, H]               (dtype of streams)
    mhc_expand(y, streams, post, comb) -> [T, n, H]     (dtype of y)

streams [T, n, H] bf16|fp32 (the residual streams R), pre / post [T, n] and comb [T, n, n] fp32 (row-major
(j, k)), y [T, H] bf16|fp32 (the sublayer output). In fp32, each product and each add rounded once:
  collapse:  acc = +0;  acc = acc + pre[:, j] * R[:, j]                   for j = 0, 1, .., n-1
  expand:    mixed_k = +0;  mixed_k = mixed_k + comb[:, j, k] * R[:, j]   for j = 0, 1, .., n-1
             out[:, k] = (post[:, k] * y) + mixed_k
then one round-to-nearest-even cast to the output dtype. The +0 start matters only for signed zeros
(all-(-0) terms give +0). The twins' [T, H] fp32 temporaries are ~3n (collapse) and ~3n^2 (expand)
launches on a GPU; the kernels (mhc_triton.py) read each input once and write the output once.

    mhc_enter(streams, fn, base, scale, iters, hc_eps, norm_eps, prev_pre, weight) -> (pre, post, comb, x)

A site's whole entry: its mix GEMM (`fp32_linear(flat(streams), fn)`), its gates, and the sublayer input
x [T, H] = rms_norm(mhc_collapse(streams, prev_pre), weight, norm_eps) in the streams' dtype, prev_pre the
previous site's pre (twin `shared_math.mhc_enter`: the ops above in sequence). The kernel
(mhc_enter_triton.py) is two launches where the ops above take five: the GEMM's chunk partials, then one
launch that folds them and runs the gates beside the collapse and norm; its bits are those of the
fp32_linear, mhc_gates, mhc_collapse and rms_norm kernels called in sequence.
"""

from __future__ import annotations

import torch

from dsv41_kernels.registry import attach_kernels, register
from sglang_dsv41 import shared_math
from sglang_dsv41.shared_math import hc_mult_of as hc_mult  # noqa: F401 - n from the mix width (mhc_triton)


@register("mhc_gates")
def mhc_gates(x: torch.Tensor, mix: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, iters: int,
              hc_eps: float, norm_eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [T, n*H] bf16|fp32, mix [T, (2+n)n] fp32, base [(2+n)n] fp32, scale [3] fp32
    -> (pre [T, n], post [T, n], comb [T, n, n]) fp32 (module docstring; twin `shared_math.mhc_gates`)."""
    return shared_math.mhc_gates(x, mix, base, scale, iters, hc_eps, norm_eps)


@register("mhc_collapse")
def mhc_collapse(streams: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    """streams [T, n, H] bf16|fp32, pre [T, n] fp32 -> [T, H] in streams' dtype (module docstring; twin
    `shared_math.mhc_collapse`)."""
    return shared_math.mhc_collapse(streams, pre)


@register("mhc_expand")
def mhc_expand(y: torch.Tensor, streams: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """y [T, H], streams [T, n, H] (bf16|fp32), post [T, n], comb [T, n, n] fp32 -> [T, n, H] in y's dtype
    (module docstring; twin `shared_math.mhc_expand`)."""
    return shared_math.mhc_expand(y, streams, post, comb)


@register("mhc_enter")
def mhc_enter(streams: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, iters: int,
              hc_eps: float, norm_eps: float, prev_pre: torch.Tensor,
              weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """streams [T, n, H], fn [(2+n)n, nH], base, scale, prev_pre [T, n], weight [H] -> (pre, post, comb, x [T, H])
    (module docstring; twin `shared_math.mhc_enter`)."""
    return shared_math.mhc_enter(streams, fn, base, scale, iters, hc_eps, norm_eps, prev_pre, weight)


attach_kernels("dsv41_kernels.mhc_triton", "mhc_gates", "mhc_collapse", "mhc_expand")
attach_kernels("dsv41_kernels.mhc_enter_triton", "mhc_enter")
