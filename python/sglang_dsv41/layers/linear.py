"""Linear layers in the checkpoint's storage formats.

* `FP8Linear`: weight F8_E4M3 [N, K] + `scale` UE8M0 [ceil(N/32), ceil(K/32)]; activations are
  rounded to MXFP8 (E4M3, UE8M0 per 1x32) and the GEMM accumulates 32-wide K blocks in K order.
* `MXFP4Linear`: routed experts, weight int8 [N, K/2] (E2M1 x2, low nibble = even element) +
  `scale` UE8M0 [N, K/32]; same MXFP8 activations (W4A8).
* `BF16Linear`: plain bf16 GEMM (router, compressor ratio 1, indexer wk/weights_proj).
Outputs are bf16. Parameters never require grad; quantized weights are consumed as stored.

Numerics slots (sglang_dsv41/numerics.py): the GEMM of `FP8Linear` / `MXFP4Linear` is the class
attribute `gemm`, the pure-torch `sglang_dsv41.quant` function; `BF16Linear.forward_fp32` goes
through `fp32_gemm` (`fp32_linear` from `sglang_dsv41.shared_math`;
FAST: `fp32_linear_plain`). `numerics_slots` names the op
that may replace each; `apply_numerics(model, policy)` sets the attribute on the instance. Nothing
here imports a kernel.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sglang_dsv41.determinism import deterministic, row_tiled
from sglang_dsv41.numerics import Slot
from sglang_dsv41.quant import dequant_fp8_weight, fp4_linear, fp8_linear
from sglang_dsv41.shared_math import fp32_linear  # batch-invariant fp32 GEMM (the `fp32_gemm` slots)


def fp32_linear_plain(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """fp32(x) @ fp32(w)^T as one GEMM (rows depend on the shape): the FAST form of `fp32_gemm`."""
    return F.linear(x.float(), w.float())


FP32_GEMM_SLOT = Slot("fp32_gemm", kernel="fp32_linear", fast=fp32_linear_plain)
"""The `fp32_gemm` slot of Head, Gate, Block (mHC mix) and BF16Linear."""


def _param(shape: tuple[int, ...], dtype: torch.dtype) -> nn.Parameter:
    return nn.Parameter(torch.zeros(shape, dtype=dtype), requires_grad=False)


class FP8Linear(nn.Module):
    numerics_slots = {"gemm": Slot("gemm", kernel="fp8_linear")}
    gemm = staticmethod(fp8_linear)  # (x, weight, scale, block) -> bf16

    def __init__(self, in_features: int, out_features: int, block: int = 32):
        super().__init__()
        self.in_features, self.out_features, self.block = in_features, out_features, block
        self.weight = _param((out_features, in_features), torch.float8_e4m3fn)
        self.scale = _param((-(-out_features // block), -(-in_features // block)), torch.float8_e8m0fnu)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gemm(x, self.weight, self.scale, self.block)

    def dequantized(self) -> torch.Tensor:
        """bf16 [N, K] (exact: E4M3 x power of two fits bf16); the kept copy if `keep_dequantized`."""
        kept = self.__dict__.get("_dequantized")
        if kept is not None:
            return kept
        return dequant_fp8_weight(self.weight, self.scale, self.block).to(torch.bfloat16)

    def keep_dequantized(self, keep: bool = True) -> None:
        """Transformation for layers that consume the bf16 weight (`wo_a`): compute it once now and
        return that copy from `dequantized` (same bits), or drop it (keep=False)."""
        self.__dict__.pop("_dequantized", None)
        if keep:
            with torch.inference_mode(False), torch.no_grad():
                self.__dict__["_dequantized"] = self.dequantized()


class FusedRows:
    """Transformation: the FP8Linear parts that read one input as one GEMM over their weights stacked
    along N (every part's out_features a multiple of the block, equal in_features). The parts' weight /
    scale become views of the stacked tensors (nothing is held twice, and in-place weight updates reach
    both); an output element's arithmetic does not depend on the other rows of the weight, so each
    part's columns are its own GEMM's. Not a module: the checkpoint names stay the parts'."""

    @staticmethod
    def of(parts: list) -> "FusedRows | None":
        """The fused GEMM of `parts`, or None where they cannot share one (not all FP8Linear on one device,
        block sizes or in_features differ, an out_features not a multiple of the block)."""
        first = parts[0]
        if not all(isinstance(p, FP8Linear) for p in parts) or any(
                p.block != first.block or p.in_features != first.in_features or p.out_features % p.block
                or p.weight.device != first.weight.device for p in parts):
            return None
        return FusedRows(parts)

    def __init__(self, parts: list[FP8Linear]):
        blk = parts[0].block
        self.parts, self.widths = parts, [p.out_features for p in parts]
        with torch.inference_mode(False), torch.no_grad():
            self.weight = torch.cat([p.weight.data for p in parts])
            self.scale = torch.cat([p.scale.data for p in parts])
            n0 = 0
            for p, n in zip(parts, self.widths):
                p.weight.data, p.scale.data = self.weight[n0:n0 + n], self.scale[n0 // blk:(n0 + n) // blk]
                n0 += n
        self.gemm, self.block = parts[0].gemm, blk  # the parts' (numerics-policy) GEMM

    def holds(self) -> bool:
        """Whether every part's parameters are still views of the stacked tensors (a replaced parameter
        makes the fused GEMM stale)."""
        n0 = 0
        for p, n in zip(self.parts, self.widths):
            if (p.weight.data_ptr() != self.weight[n0].data_ptr() or p.scale.data_ptr() != self.scale[n0 // self.block].data_ptr()
                    or p.gemm is not self.gemm):
                return False
            n0 += n
        return True

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """x [..., K] -> each part's bf16 output [..., N_i] (column slices of one GEMM's output)."""
        return self.gemm(x, self.weight, self.scale, self.block).split(self.widths, dim=-1)


class MXFP4Linear(nn.Module):
    numerics_slots = {"gemm": Slot("gemm", kernel="fp4_linear")}
    gemm = staticmethod(fp4_linear)  # (x, weight_packed, scale) -> bf16

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = _param((out_features, in_features // 2), torch.int8)
        self.scale = _param((out_features, in_features // 32), torch.float8_e8m0fnu)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gemm(x, self.weight, self.scale)


class BF16Linear(nn.Module):
    numerics_slots = {"fp32_gemm": FP32_GEMM_SLOT}  # forward_fp32 only
    fp32_gemm = staticmethod(fp32_linear)  # (x [..., K], w [N, K]) -> fp32 [..., N], batch-invariant rows

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.weight = _param((out_features, in_features), torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if deterministic():  # batch-invariant: fixed 64-row GEMMs (sglang_dsv41/determinism.py)
            return row_tiled(lambda t: F.linear(t, self.weight), x.reshape(-1, x.size(-1))).reshape(*x.shape[:-1], self.weight.size(0))
        return F.linear(x, self.weight)

    def forward_fp32(self, x: torch.Tensor) -> torch.Tensor:
        """fp32 GEMM of fp32(x) with the bf16 weight widened to fp32 (compressor ratio 2, router)."""
        return self.fp32_gemm(x, self.weight)
