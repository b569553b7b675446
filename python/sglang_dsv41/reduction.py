"""Row reductions whose fp32 summation order is fixed by definition, not by the device or batch.

`mean_square(x)` is the RMSNorm statistic. Layers (`layers.norm`) and kernel twins
(`dsv41_kernels`) both call it, so every path rounds the same way; the Triton kernels reproduce the
same order in registers. The order is documented in docs/numerics.md.
"""

from __future__ import annotations

import torch


def mean_square(x: torch.Tensor) -> torch.Tensor:
    """x [..., d] any float dtype -> fp32 [..., 1] = mean(x^2) over the last dim."""
    ss = x.double().square().sum(-1, keepdim=True).float()
    return ss / torch.full((), float(x.size(-1)), dtype=torch.float32, device=x.device)
