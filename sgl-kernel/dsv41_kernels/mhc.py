"""mHC gates op: everything of one hyper-connection site after its fp32 GEMM, as one kernel launch.

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
The twin's torch formulation is ~160 small launches per call on a GPU.
"""

from __future__ import annotations

import math

import torch

from dsv41_kernels.registry import attach_kernels, register
from sglang_dsv41.reduction import mean_square


def hc_mult(mix_dim: int) -> int:
    """n with (2 + n) * n == mix_dim (ValueError otherwise)."""
    n = math.isqrt(mix_dim + 1) - 1
    if n < 1 or n * (n + 2) != mix_dim:
        raise ValueError(f"mhc_gates: base has {mix_dim} entries, not (2 + n) * n for an integer n >= 1")
    return n


def _fold(m: torch.Tensor, dim: int) -> torch.Tensor:
    """Sequential fp32 sum over `dim` (index 0 first), kept as a size-1 dim."""
    parts = m.unbind(dim)
    acc = parts[0]
    for p in parts[1:]:
        acc = acc + p
    return acc.unsqueeze(dim)


def _sinkhorn(c: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """c [T, n, n] fp32 -> [T, n, n]; the first row step adds eps after the division, later ones before
    (iters < 1 runs one round, like iters == 1)."""
    m = torch.exp(c - c.amax(dim=-1, keepdim=True))
    for i in range(max(iters, 1)):
        rows = _fold(m, -1)
        m = m / rows + eps if i == 0 else m / (rows + eps)
        m = m / (_fold(m, -2) + eps)
    return m


@register("mhc_gates")
def mhc_gates(x: torch.Tensor, mix: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, iters: int,
              hc_eps: float, norm_eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [T, n*H] bf16|fp32, mix [T, (2+n)n] fp32, base [(2+n)n] fp32, scale [3] fp32
    -> (pre [T, n], post [T, n], comb [T, n, n]) fp32 (module docstring)."""
    n = hc_mult(base.numel())
    t = mix.size(0)
    part_scale = torch.cat([scale[0:1].expand(n), scale[1:2].expand(n), scale[2:3].expand(n * n)])
    z = (mix * torch.rsqrt(mean_square(x) + norm_eps)) * part_scale + base
    pre = torch.sigmoid(z[:, :n]) + hc_eps
    post = torch.sigmoid(z[:, n : 2 * n]) * 2
    comb = _sinkhorn(z[:, 2 * n :].reshape(t, n, n), iters, hc_eps)
    return pre, post, comb


attach_kernels("dsv41_kernels.mhc_triton", "mhc_gates")
