"""RMSNorm op: the layers' `rms_norm` with its weight (twin: `sglang_dsv41.shared_math.rms_norm`), as one
kernel launch per call.

    rms_norm(x, weight, eps) -> x.dtype [..., d] = fp32 x * rsqrt(mean_square(x) + eps) * fp32 weight

The statistic is `sglang_dsv41.reduction.mean_square` (DeepSeek's fp32 summation order, the same on
every device and batch); the Triton kernel (norm_triton.py) adds in that order in registers
(`triton_numerics.ordered_sumsq`, no FMA contraction), so it equals the twin bit for bit on the GPU.
The twin's torch formulation of the order costs ~40 small launches per call on a GPU.
"""

from __future__ import annotations

import torch

from dsv41_kernels.registry import attach_kernels, register
from sglang_dsv41.shared_math import rms_norm as _rms_norm


@register("rms_norm")
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x bf16|fp32 [..., d], weight [d] (bf16|fp32) -> x.dtype [..., d]."""
    return _rms_norm(x, weight, eps)


attach_kernels("dsv41_kernels.norm_triton", "rms_norm")
