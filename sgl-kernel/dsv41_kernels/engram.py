"""Engram ops: row gather (+ dequant) from a device or pinned-host table, and the fused gate."""

from __future__ import annotations

import torch

from dsv41_kernels.registry import register
from sglang_dsv41.layers.engram import engram_gate as _gate
from sglang_dsv41.quant import dequant_engram_rows


@register("engram_gather")
def engram_gather(weight: torch.Tensor, scale: torch.Tensor, row_ids: torch.Tensor) -> torch.Tensor:
    """weight e4m3 [R, hd], scale e8m0 [R, hd/32] (GPU or pinned host), row_ids int64 [...] on the
    compute device -> bf16 [..., hd] on row_ids' device (fp32 dequant, one bf16 rounding)."""
    ids = row_ids.to(weight.device)
    return dequant_engram_rows(weight[ids], scale[ids]).to(row_ids.device)


@register("engram_gate")
def engram_gate(streams, kv, q_weight, k_weight, eps: float, token_mask=None):
    """streams bf16 [T, n, H], kv bf16 [T, (n+1)H] -> bf16 [T, n, H] (see layers.engram)."""
    return _gate(streams, kv, q_weight, k_weight, eps, token_mask)
