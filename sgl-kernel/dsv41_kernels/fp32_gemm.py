"""fp32 GEMM whose rows are batch invariant: the lm head, the MoE router, the mHC mixes, the compressor.

    fp32_linear(x, w) -> fp32 [..., N] = fp32(x) @ fp32(w)^T

x [..., K] bf16|fp32, w [N, K] bf16|fp32 (both widened exactly). A row of the result depends only on
its own row of x and on w, never on how many other rows share the call.

The twin is the layers' formulation (`sglang_dsv41.layers.linear.fp32_linear`), written through the
same shared helper `sglang_dsv41.determinism.row_tiled`: torch GEMMs of exactly ROW_TILE rows (the
last tile zero-padded), so the BLAS sees one shape whatever M is and picks one summation order. The
two give the same bits on every device (test/kernels/test_fp32_gemm_cpu.py); on CPU the op always
runs this twin, so the CPU runtime equals the reference forward. On a GPU the twin widens the whole
weight to fp32 on every call and launches one sgemm per 64 rows.

The Triton kernel (fp32_gemm_triton.py) sums each output in its own fixed order (chunks of K, every
product exact or rounded once, fp32 adds), independent of M and of the launch config; it differs
from the twin's BLAS order, so it matches the twin within a stated fp32 tolerance
(test/kernels/test_fp32_gemm_gpu.py), not bitwise.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dsv41_kernels.registry import attach_kernels, register
from sglang_dsv41.determinism import row_tiled


@register("fp32_linear")
def fp32_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [..., K] bf16|fp32, w [N, K] bf16|fp32 -> fp32 [..., N], ROW_TILE-row fp32 GEMMs (module docstring)."""
    wf = w.float()
    rows = row_tiled(lambda t: F.linear(t, wf), x.reshape(-1, x.size(-1)).float())
    return rows.reshape(*x.shape[:-1], w.size(0))


attach_kernels("dsv41_kernels.fp32_gemm_triton", "fp32_linear")
