"""fp32 GEMM whose rows are batch invariant: the lm head, the MoE router, the mHC mixes, the compressor.

    fp32_linear(x, w) -> fp32 [..., N] = fp32(x) @ fp32(w)^T

x [..., K] bf16|fp32, w [N, K] bf16|fp32 (both widened exactly). A row of the result depends only on
its own row of x and on w, never on how many other rows share the call.

The twin is the layers' function `sglang_dsv41.shared_math.fp32_linear`: torch GEMMs of exactly
ROW_TILE rows (`determinism.row_tiled`, the last tile zero-padded), so the BLAS sees one shape whatever
M is and picks one summation order; on CPU the op always runs it, so the CPU runtime equals the
reference forward. On a GPU the twin widens the whole
weight to fp32 on every call and launches one sgemm per 64 rows.

The Triton kernel (fp32_gemm_triton.py) sums each output in its own fixed order (chunks of K, every
product exact or rounded once, fp32 adds), independent of M and of the launch config; it differs
from the twin's BLAS order, so it matches the twin within a stated fp32 tolerance
(test/kernels/test_fp32_gemm_gpu.py), not bitwise.
"""

from __future__ import annotations

import torch

from dsv41_kernels.registry import attach_kernels, register
from sglang_dsv41 import shared_math


@register("fp32_linear")
def fp32_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [..., K] bf16|fp32, w [N, K] bf16|fp32 -> fp32 [..., N], ROW_TILE-row fp32 GEMMs (module docstring)."""
    return shared_math.fp32_linear(x, w)


attach_kernels("dsv41_kernels.fp32_gemm_triton", "fp32_linear")
