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
The twin's torch formulation is ~160 small launches per call on a GPU.

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


@register("mhc_collapse")
def mhc_collapse(streams: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    """streams [T, n, H] bf16|fp32, pre [T, n] fp32 -> [T, H] in streams' dtype: sum over j from +0,
    j ascending, of pre[:, j] * R[:, j] in fp32 (module docstring), one cast."""
    t, n, h = streams.shape
    acc = torch.zeros(t, h, dtype=torch.float32, device=streams.device)
    for j in range(n):
        acc = acc + pre[:, j].unsqueeze(1) * streams[:, j].to(torch.float32)
    return acc.to(streams.dtype)


@register("mhc_expand")
def mhc_expand(y: torch.Tensor, streams: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """y [T, H], streams [T, n, H] (bf16|fp32), post [T, n], comb [T, n, n] fp32 -> [T, n, H] in y's
    dtype: out[:, k] = (post[:, k] * y) + (sum over j from +0, j ascending, of comb[:, j, k] * R[:, j]),
    fp32, one cast (module docstring)."""
    t, n, h = streams.shape
    mixed = [torch.zeros(t, h, dtype=torch.float32, device=streams.device) for _ in range(n)]
    for j in range(n):  # the source stream j outer: each mixed[k] still adds j = 0, 1, .. in order
        r = streams[:, j].to(torch.float32)
        for k in range(n):
            mixed[k] = mixed[k] + comb[:, j, k].unsqueeze(1) * r
    yf = y.to(torch.float32)
    return torch.stack([post[:, k].unsqueeze(1) * yf + mixed[k] for k in range(n)], dim=1).to(y.dtype)


attach_kernels("dsv41_kernels.mhc_triton", "mhc_gates", "mhc_collapse", "mhc_expand")
