"""Sparse attention straight from the paged pools (window FP8 + selected compressed FP4)."""

from __future__ import annotations

import torch

from dsv41_kernels.registry import register
from sglang_dsv41.layers.sparse_attention import attend_gathered
from sglang_dsv41.quant import kv_fp4_unpack, window_kv_unpack


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
    out = []
    for s in range(0, q.size(0), chunk):
        ws = window_slots[s : s + chunk]
        keys = [window_kv_unpack(window_pool[ws.clamp_min(0)])]
        valid = [ws >= 0]
        if comp_slots is not None and comp_slots.size(1):
            cs = comp_slots[s : s + chunk]
            keys.append(kv_fp4_unpack(comp_pool[cs.clamp_min(0)]))
            valid.append(cs >= 0)
        out.append(attend_gathered(q[s : s + chunk], torch.cat(keys, 1), torch.cat(valid, 1), sink, scale))
    return torch.cat(out) if out else q.new_zeros(q.shape)


try:  # attach the Triton kernels (importing them compiles nothing); twins only without Triton
    from dsv41_kernels import attention_triton as _triton  # noqa: E402,F401
except ImportError:  # pragma: no cover
    pass
