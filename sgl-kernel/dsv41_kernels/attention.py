"""Sparse attention straight from the paged pools (window FP8 + selected compressed FP4).

Twin: gathers each row's keys from the two pools (byte layouts in `sglang_dsv41.quant.layouts`),
window slots first, and runs the block-64 online softmax of `sglang_dsv41.shared_math.attend_gathered`.
"""

from __future__ import annotations

import torch

from dsv41_kernels.registry import attach_kernels, register
from sglang_dsv41.quant import kv_fp4_unpack, window_kv_unpack
from sglang_dsv41.shared_math import attend_gathered


def _gather(pool: torch.Tensor, slots: torch.Tensor, unpack) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 pool [S, bytes], slots int [t, k] (-1 = none) -> (bf16 keys [t, k, D], valid bool [t, k])."""
    valid = slots >= 0
    rows = pool.index_select(0, torch.where(valid, slots, 0).reshape(-1).long())
    return unpack(rows).unflatten(0, slots.shape), valid


@register("sparse_attention_paged")
def sparse_attention_paged(
    q: torch.Tensor,
    window_pool: torch.Tensor,
    window_slots: torch.Tensor,
    comp_pool: torch.Tensor | None,
    comp_slots: torch.Tensor | None,
    sink: torch.Tensor,
    scale: float,
    chunk: int = 64,
) -> torch.Tensor:
    """q bf16 [T, h, D]; window_pool uint8 [S, D+D/32], window_slots int64 [T, W] (-1 = none, oldest
    first); comp_pool uint8 [S2, D/2+D/16], comp_slots int64 [T, K] (-1 = none, positions ascending)
    or None; sink fp32 [h]. Keys per row = window slots then compressed slots, in that order.
    -> bf16 [T, h, D]."""
    out = torch.empty_like(q)
    with_comp = comp_slots is not None and comp_slots.size(1) > 0
    for lo in range(0, q.size(0), chunk):
        hi = min(lo + chunk, q.size(0))
        keys, valid = _gather(window_pool, window_slots[lo:hi], window_kv_unpack)
        if with_comp:
            ck, cv = _gather(comp_pool, comp_slots[lo:hi], kv_fp4_unpack)
            keys, valid = torch.cat([keys, ck], dim=1), torch.cat([valid, cv], dim=1)
        out[lo:hi] = attend_gathered(q[lo:hi], keys, valid, sink, scale)
    return out


attach_kernels("dsv41_kernels.attention_triton", "sparse_attention_paged")
