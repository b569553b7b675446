"""Indexer ops: FP4 queries, scores straight from the FP4 index-key pool, top-k, candidate blocks."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dsv41_kernels.registry import register
from sglang_dsv41.layers import indexer as ref
from sglang_dsv41.layers.rope import apply_rope
from sglang_dsv41.quant import index_fp4_qdq, index_fp4_unpack


@register("index_query_quant")
def index_query_quant(q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """q bf16 [T, Hi, di] -> bf16 [T, Hi, di] = two-stage FP4 round trip of rope(q)."""
    return index_fp4_qdq(apply_rope(q, cos, sin))


@register("index_scores")
def index_scores(q: torch.Tensor, w: torch.Tensor, pool: torch.Tensor, slot_table: torch.Tensor, chunk: int = 64) -> torch.Tensor:
    """Paged scores. q bf16 [T, Hi, di] (FP4 grid), w bf16 [T, Hi], pool uint8 [S, di/2+di/32],
    slot_table int64 [T, n]: pool slot of compressed position j for row t, -1 = not visible.
    -> fp32 [T, n] = float(bf16 sum_h w_h relu(q_h . k_j)), -inf where the slot is -1."""
    out = []
    for s in range(0, q.size(0), chunk):
        slots = slot_table[s : s + chunk]
        keys = index_fp4_unpack(pool[slots.clamp_min(0)], dtype=torch.bfloat16)  # [t, n, di]
        logits = torch.einsum("thd,tnd->thn", q[s : s + chunk], keys)
        sc = (F.relu(logits) * w[s : s + chunk].unsqueeze(-1)).sum(dim=1).float()
        out.append(sc.masked_fill(slots < 0, float("-inf")))
    return torch.cat(out) if out else q.new_zeros(0, slot_table.size(1), dtype=torch.float32)


@register("topk_select")
def topk_select(scores: torch.Tensor, k: int) -> torch.Tensor:
    """scores [T, n] (-inf = not allowed) -> int32 [T, min(k, n)] positions ascending, -1 padded;
    exact top-k, ties to the lower position, -inf/NaN never selected."""
    return ref.select_topk(scores, k)


@register("candidate_blocks")
def candidate_blocks(scores: torch.Tensor, visible: torch.Tensor, topk_blocks: int, block_size: int) -> torch.Tensor:
    """scores [T, n] (-inf past `visible`), visible int [T] -> bool [T, n] kept-block mask
    (block key = max of its scores, newest block pinned, top `topk_blocks`, ties to lower block)."""
    return ref.select_candidate_blocks(scores, visible, topk_blocks, block_size)


try:  # attach the Triton kernels (importing them compiles nothing); twins only without Triton
    from dsv41_kernels import indexer_triton as _triton  # noqa: E402,F401
    from dsv41_kernels import topk_triton as _topk_triton  # noqa: E402,F401
except ImportError:  # pragma: no cover
    pass
