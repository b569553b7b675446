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
and `expand` are explicit sequential fp32 sums from +0 (the order torch CPU's `.sum` took) and are the
slots `mhc_collapse` / `mhc_expand` of `Block` (and `mhc_collapse` of the final collapse in
`DeepseekV41`), one fused launch each on CUDA. The math lives in `sglang_dsv41.shared_math` (the
kernel twins import the same functions).
"""

from __future__ import annotations

import torch

from sglang_dsv41.shared_math import col_sums, hc_mult_of, row_sums, sinkhorn  # noqa: F401 - re-exported
from sglang_dsv41.shared_math import mhc_collapse as collapse
from sglang_dsv41.shared_math import mhc_expand as expand
from sglang_dsv41.shared_math import mhc_gates as gates
from sglang_dsv41.reduction import plain_col_sums, plain_mean_square, plain_row_sums

__all__ = ["col_sums", "collapse", "expand", "gates", "gates_plain", "hc_mult_of", "identity_pre", "row_sums", "sinkhorn"]


def identity_pre(num_tokens: int, hc_mult: int, device: torch.device | str | None = None) -> torch.Tensor:
    """The `pre` before layer 0: a one-hot on stream 0 (all streams are equal copies there)."""
    pre = torch.zeros(num_tokens, hc_mult, dtype=torch.float32, device=device)
    pre[:, 0] = 1.0
    return pre


def gates_plain(x, mix, base, scale, iters: int, hc_eps: float, norm_eps: float):
    """`gates` with the plain mean square and Sinkhorn sums (the FAST form of the `mhc_gates` slot)."""
    return gates(x, mix, base, scale, iters, hc_eps, norm_eps, plain_mean_square, plain_row_sums, plain_col_sums)
