"""Block-diagonal FP8 linear on bf16 operands: the attention's `wo_a` (op `fp8_group_linear`).

    fp8_group_linear(x, w, w_scale, block=32) -> bf16 [T, G, N]
        x bf16 [T, G, K]; w float8_e4m3fn [G*N, K] (group g owns rows g*N .. g*N + N-1);
        w_scale float8_e8m0fnu or uint8 [ceil(G*N/block), ceil(K/block)] (one per block x block tile)
        out[t, g, n] = bf16( sum_k x[t, g, k] * W[g*N + n, k] ),  W = E4M3 value x 2**scale, exact in bf16

DeepSeek's reference runs this as a bf16 einsum on the dequantized weight; the twin does the same
(its own dequantization: torch's E4M3 decode times the UE8M0 powers of two), so the fp32 addition order
of each output is the library GEMM's. Deterministic mode: fixed 64-row products (`row_tiled`), so a
row does not depend on the others. The Triton kernel (group_gemm_triton.py) multiplies the same bf16
operands with fp32 accumulation in K order of 32-wide MMAs: within the bf16 GEMM tolerance of the twin.
"""

from __future__ import annotations

import torch

from dsv41_kernels.registry import attach_kernels, register
from sglang_dsv41.determinism import deterministic, row_tiled
from sglang_dsv41.quant import e8m0_to_fp32


def _weight_bf16(w: torch.Tensor, w_scale: torch.Tensor, block: int) -> torch.Tensor:
    """bf16 [R, K]: each E4M3 weight times its tile's power of two (exact: at most 4 significant bits)."""
    r, k = w.shape
    s = e8m0_to_fp32(w_scale).repeat_interleave(block, 0)[:r].repeat_interleave(block, 1)[:, :k]
    return (w.float() * s).to(torch.bfloat16)


@register("fp8_group_linear")
def fp8_group_linear(x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, block: int = 32) -> torch.Tensor:
    """x bf16 [T, G, K] -> bf16 [T, G, N] (module docstring)."""
    t, g, k = x.shape
    wb = _weight_bf16(w, w_scale, block).view(g, -1, k)

    def product(rows: torch.Tensor) -> torch.Tensor:
        return torch.einsum("tgd,gnd->tgn", rows, wb)

    return row_tiled(product, x) if deterministic() else product(x)


attach_kernels("dsv41_kernels.group_gemm_triton", "fp8_group_linear")
