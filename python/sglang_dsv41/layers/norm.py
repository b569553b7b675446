"""RMSNorm with fp32 statistics (the reference's rounding: normalise in fp32, multiply by the weight
in fp32, one cast back to the input dtype). The mean square is `reduction.mean_square`: DeepSeek's fp32
summation order written out, the same on every device and batch (docs/numerics.md)."""

from __future__ import annotations

import torch
from torch import nn

from sglang_dsv41.numerics import Slot
from sglang_dsv41.reduction import plain_mean_square
from sglang_dsv41.shared_math import rms_norm


def rms_norm_plain(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """`rms_norm` with the plain mean square (the FAST form of the `norm` slot)."""
    return rms_norm(x, weight, eps, plain_mean_square)


class RMSNorm(nn.Module):
    numerics_slots = {"norm": Slot("norm", kernel="rms_norm", fast=rms_norm_plain)}
    norm = staticmethod(rms_norm)  # (x, weight, eps) -> x.dtype

    def __init__(self, dim: int, eps: float, dtype: torch.dtype = torch.bfloat16):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x, self.weight, self.eps)
