"""RMSNorm with fp32 statistics (the reference's rounding: normalise in fp32, multiply by the weight
in fp32, one cast back to the input dtype); the mean square is order-independent (see rms_norm)."""

from __future__ import annotations

import torch
from torch import nn


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """x [..., d] any float dtype -> same dtype. weight [d] (bf16/fp32) or None (weightless)."""
    xf = x.float()
    # NOTE: the sum of squares is accumulated exactly (fp64 squares of bf16/fp32 values, one
    # rounding to fp32), then divided by d in IEEE fp32 (a device tensor: CUDA multiplies by the
    # reciprocal of a python scalar). A plain fp32 mean depends on the reduction order, which on
    # CUDA follows the batch size (block shape) and on the CPU the SIMD width; the fused Triton
    # kernels reproduce this definition bit for bit.
    ss = x.double().square().sum(-1, keepdim=True).float()
    ms = ss / torch.full((), float(x.size(-1)), dtype=torch.float32, device=x.device)
    y = xf * torch.rsqrt(ms + eps)
    if weight is not None:
        y = weight.float() * y
    return y.to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, dtype: torch.dtype = torch.bfloat16):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)
