"""Manifold-constrained hyper-connections (mHC), lagged ("single-pass") schedule of V4.1.

The residual is carried as n = hc_mult streams R [T, n, H] (bf16). Each sublayer site (attention,
FFN) owns fn [(2+n)n, nH], base [(2+n)n], scale [3] (fp32) and produces, from its *input* streams,
  pre  [T, n]    = sigmoid(mix[:n] * scale[0] + base[:n]) + eps
  post [T, n]    = 2 * sigmoid(mix[n:2n] * scale[1] + base[n:2n])
  comb [T, n, n] = Sinkhorn(mix[2n:] * scale[2] + base[2n:])   (row-major (j, k))
with mix = (flat(R) . fn^T) * rsqrt(mean(flat(R)^2) + rms_norm_eps), all fp32.
The lag: a sublayer's input is collapsed with the *previous* site's `pre` (spec model 3.4).

A site's gates are the fp32 GEMM `fp32_linear(flat(R), fn)` (in `Block.hc_mix`) followed by
`gates`: everything after the GEMM (statistic, affine, sigmoids, Sinkhorn), a pure function that
`Block` holds as the kernel slot `mhc_gates` (one fused launch on CUDA, docs/numerics.md). `collapse`
and `expand` are written as explicit sequential fp32 sums from +0 (the order torch CPU's `.sum` took)
and are the slots `mhc_collapse` / `mhc_expand` of `Block` (and `mhc_collapse` of the final collapse in
`DeepseekV41`), one fused launch each on CUDA.
"""

from __future__ import annotations

import math

import torch

from sglang_dsv41.reduction import mean_square, plain_mean_square


def row_sums(m: torch.Tensor) -> torch.Tensor:
    """m [..., n, n] -> [..., n, 1]: ((m[.., 0] + m[.., 1]) + m[.., 2]) + ... left to right in fp32
    (the order torch CPU's `.sum(-1)` adds n <= 4 elements in, written out so every device adds so)."""
    s = m[..., 0:1]
    for k in range(1, m.size(-1)):
        s = s + m[..., k : k + 1]
    return s


def col_sums(m: torch.Tensor) -> torch.Tensor:
    """m [..., n, n] -> [..., 1, n]: ((m[0] + m[1]) + m[2]) + ... over the rows, top to bottom."""
    s = m[..., 0:1, :]
    for j in range(1, m.size(-2)):
        s = s + m[..., j : j + 1, :]
    return s


def sinkhorn(c: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """c [..., n, n] fp32 logits -> approximately doubly-stochastic matrix (reference op order:
    exp(c - rowmax) / rowsum + eps, then column, then (iters-1) x (row, column) normalisations).
    Row and column sums are explicit sequential adds (`row_sums`, `col_sums`): for n <= 4 bitwise torch
    CPU's `.sum(-1)` / `.sum(-2)` of the reference (entries are >= 0, so its zero start changes nothing)."""
    m = torch.exp(c - c.amax(dim=-1, keepdim=True))
    m = m / row_sums(m) + eps
    m = m / (col_sums(m) + eps)
    for _ in range(iters - 1):
        m = m / (row_sums(m) + eps)
        m = m / (col_sums(m) + eps)
    return m


def collapse(streams: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    """streams [T, n, H] bf16|fp32, pre [T, n] fp32 -> [T, H] in the stream dtype:
    acc = +0; for j = 0..n-1: acc = acc + pre[:, j] * R[:, j] (each product and each add one fp32
    rounding), then one cast. The order of torch CPU's `.sum(dim=1)` of the products (bitwise, -0 -> +0),
    written out so every device adds so; the fused op `mhc_collapse` reproduces it. Differentiable."""
    acc = None
    for j in range(streams.size(1)):
        term = pre[:, j : j + 1] * streams[:, j].float()
        acc = term + 0.0 if acc is None else acc + term  # term + 0.0 == 0 + term: the sum starts at +0
    return acc.to(streams.dtype)


def expand(y: torch.Tensor, streams: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """y [T, H], streams [T, n, H] (bf16|fp32), post [T, n], comb [T, n, n] fp32 (row-major (j, k))
    -> R' [T, n, H] in y's dtype, per output stream k, in fp32:
      mixed[k] = +0; for j = 0..n-1: mixed[k] = mixed[k] + comb[:, j, k] * R[:, j]
      R'[:, k] = cast((post[:, k] * y) + mixed[k])
    every product and add one rounding, one cast at the end (the fused op `mhc_expand` reproduces it).
    Differentiable."""
    rf = [streams[:, j].float() for j in range(streams.size(1))]
    yf = y.float()
    out = []
    for k in range(len(rf)):
        mixed = None
        for j, r in enumerate(rf):
            term = comb[:, j, k : k + 1] * r
            mixed = term + 0.0 if mixed is None else mixed + term
        out.append(post[:, k : k + 1] * yf + mixed)
    return torch.stack(out, dim=1).to(y.dtype)


def identity_pre(num_tokens: int, hc_mult: int, device: torch.device | str | None = None) -> torch.Tensor:
    """The `pre` before layer 0: a one-hot on stream 0 (all streams are equal copies there)."""
    pre = torch.zeros(num_tokens, hc_mult, dtype=torch.float32, device=device)
    pre[:, 0] = 1.0
    return pre


def hc_mult_of(mix_dim: int) -> int:
    """n from the mix width (2 + n) * n."""
    n = math.isqrt(mix_dim + 1) - 1
    if n < 1 or (2 + n) * n != mix_dim:
        raise ValueError(f"mix width {mix_dim} is not (2 + n) * n")
    return n


def gates(
    x: torch.Tensor,
    mix: torch.Tensor,
    base: torch.Tensor,
    scale: torch.Tensor,
    iters: int,
    hc_eps: float,
    norm_eps: float,
    mean_sq=mean_square,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One site's gates after its GEMM. x [T, n*H] bf16|fp32 (the flattened input streams), mix
    [T, (2+n)n] fp32 = x . fn^T (raw, before the rsqrt), base [(2+n)n] fp32, scale [3] fp32, n from
    base -> (pre [T,n], post [T,n], comb [T,n,n]) fp32. Differentiable (plain torch ops). `mean_sq`:
    the fixed-order statistic, or the plain one (`gates_plain`, the FAST policy's `mhc_gates`)."""
    n = hc_mult_of(base.numel())
    mix = mix * torch.rsqrt(mean_sq(x) + norm_eps)
    pre = torch.sigmoid(mix[:, :n] * scale[0] + base[:n]) + hc_eps
    post = 2 * torch.sigmoid(mix[:, n : 2 * n] * scale[1] + base[n : 2 * n])
    c = (mix[:, 2 * n :] * scale[2] + base[2 * n :]).unflatten(-1, (n, n))
    return pre, post, sinkhorn(c, iters, hc_eps)


def gates_plain(x, mix, base, scale, iters: int, hc_eps: float, norm_eps: float):
    """`gates` with the plain mean square (the FAST form of the `mhc_gates` slot)."""
    return gates(x, mix, base, scale, iters, hc_eps, norm_eps, plain_mean_square)
