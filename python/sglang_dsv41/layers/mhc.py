"""Manifold-constrained hyper-connections (mHC), lagged ("single-pass") schedule of V4.1.

The residual is carried as n = hc_mult streams R [T, n, H] (bf16). Each sublayer site (attention,
FFN) owns fn [(2+n)n, nH], base [(2+n)n], scale [3] (fp32) and produces, from its *input* streams,
  pre  [T, n]    = sigmoid(mix[:n] * scale[0] + base[:n]) + eps
  post [T, n]    = 2 * sigmoid(mix[n:2n] * scale[1] + base[n:2n])
  comb [T, n, n] = Sinkhorn(mix[2n:] * scale[2] + base[2n:])   (row-major (j, k))
with mix = (flat(R) . fn^T) * rsqrt(mean(flat(R)^2) + rms_norm_eps), all fp32.
The lag: a sublayer's input is collapsed with the *previous* site's `pre` (spec model 3.4).
"""

from __future__ import annotations

import torch

from sglang_dsv41.layers.linear import fp32_linear
from sglang_dsv41.reduction import mean_square


def sinkhorn(c: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """c [..., n, n] fp32 logits -> approximately doubly-stochastic matrix (reference op order:
    exp(c - rowmax) / rowsum + eps, then column, then (iters-1) x (row, column) normalisations)."""
    m = torch.exp(c - c.amax(dim=-1, keepdim=True))
    m = m / m.sum(dim=-1, keepdim=True) + eps
    m = m / (m.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        m = m / (m.sum(dim=-1, keepdim=True) + eps)
        m = m / (m.sum(dim=-2, keepdim=True) + eps)
    return m


def collapse(streams: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    """sum_j pre[j] * R[:, j] in fp32, one cast to the stream dtype. [T,n,H] x [T,n] -> [T,H]."""
    return (pre.unsqueeze(-1) * streams.float()).sum(dim=1).to(streams.dtype)


def expand(y: torch.Tensor, streams: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """R'[:, k] = post[k] * y + sum_j comb[j, k] * R[:, j] (fp32, one cast). y [T,H] -> [T,n,H]."""
    mixed = (comb.unsqueeze(-1) * streams.float().unsqueeze(-2)).sum(dim=1)
    return (post.unsqueeze(-1) * y.float().unsqueeze(-2) + mixed).to(y.dtype)


def identity_pre(num_tokens: int, hc_mult: int, device: torch.device | str | None = None) -> torch.Tensor:
    """The `pre` before layer 0: a one-hot on stream 0 (all streams are equal copies there)."""
    pre = torch.zeros(num_tokens, hc_mult, dtype=torch.float32, device=device)
    pre[:, 0] = 1.0
    return pre


def mix_stats(
    streams: torch.Tensor,
    fn: torch.Tensor,
    base: torch.Tensor,
    scale: torch.Tensor,
    sinkhorn_iters: int,
    hc_eps: float,
    norm_eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """streams [T, n, H] -> (pre [T,n], post [T,n], comb [T,n,n]), fp32, for one site's params."""
    n = streams.size(1)
    x = streams.flatten(1).float()
    mix = fp32_linear(x, fn) * torch.rsqrt(mean_square(x) + norm_eps)
    pre = torch.sigmoid(mix[:, :n] * scale[0] + base[:n]) + hc_eps
    post = 2 * torch.sigmoid(mix[:, n : 2 * n] * scale[1] + base[n : 2 * n])
    c = (mix[:, 2 * n :] * scale[2] + base[2 * n :]).unflatten(-1, (n, n))
    return pre, post, sinkhorn(c, sinkhorn_iters, hc_eps)
