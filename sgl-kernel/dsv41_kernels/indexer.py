"""Indexer ops: FP4 queries, scores straight from the FP4 index-key pool, top-k, candidate blocks."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dsv41_kernels.registry import attach_kernels, register
from sglang_dsv41.quant import index_fp4_qdq, index_fp4_unpack
from sglang_dsv41.shared_math import apply_rope


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


def _order_key(x: torch.Tensor) -> torch.Tensor:
    """fp32 [...] -> int64 [...] in [0, 2^32): larger value <=> larger key; -0 == +0; NaN: see callers."""
    bits = (x + 0.0).view(torch.int32).long()  # x + 0.0 folds -0 into +0
    return torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits) + 2**31


def _rank_first(keys: torch.Tensor, k: int) -> torch.Tensor:
    """keys int64 [T, n] in [0, 2^32) -> int64 [T, k] (unordered): positions of the k largest keys;
    among equal keys the lower position wins (composite key * 2^31 + (2^31 - 1 - position), unique)."""
    n = keys.size(-1)
    low = 2**31 - 1 - torch.arange(n, device=keys.device)
    top = torch.topk(keys * 2**31 + low, k, dim=-1, largest=True, sorted=False).values
    return 2**31 - 1 - (top & (2**31 - 1))


@register("topk_select")
def topk_select(scores: torch.Tensor, k: int) -> torch.Tensor:
    """scores [T, n] (-inf = not allowed) -> int32 [T, min(k, n)] positions ascending, -1 padded;
    exact top-k, ties to the lower position, -inf/NaN never selected."""
    t, n = scores.shape
    kk = min(k, n)
    s = scores.float()
    s = torch.where(torch.isnan(s), float("-inf"), s)
    pos = _rank_first(_order_key(s), kk)  # [T, kk]
    ok = s.gather(-1, pos) > float("-inf")
    picked = torch.where(ok, pos, n).sort(dim=-1).values
    return torch.where(picked < n, picked, -1).to(torch.int32)


@register("candidate_blocks")
def candidate_blocks(scores: torch.Tensor, visible: torch.Tensor, topk_blocks: int, block_size: int) -> torch.Tensor:
    """scores [T, n] (-inf past `visible`), visible int [T] -> bool [T, n] kept-block mask
    (block key = max of its scores, newest block pinned, top `topk_blocks`, ties to lower block).

    Block maxima propagate NaN; the pinned block (holding position visible - 1) ranks as +inf.
    Ranking: NaN blocks first, then by key descending, lower block first among equals; of the top
    `topk_blocks` ranked blocks only those with a key > -inf (not NaN) are kept."""
    t, n = scores.shape
    nb = -(-n // block_size)
    s = scores.float()
    bmax = torch.full((t, nb), float("-inf"), dtype=torch.float32, device=s.device)
    for j in range(block_size):  # column j of every block, folded with a NaN-propagating maximum
        col = s[:, j::block_size]
        bmax[:, : col.size(1)] = torch.maximum(bmax[:, : col.size(1)], col)
    newest = torch.div(visible.to(s.device).long() - 1, block_size, rounding_mode="floor")
    blocks = torch.arange(nb, device=s.device)
    bmax = torch.where(blocks == newest.unsqueeze(-1), float("inf"), bmax)
    nan = torch.isnan(bmax)
    keys = torch.where(nan, 2**32 - 1, _order_key(torch.where(nan, 0.0, bmax)))  # NaN above +inf
    kk = min(topk_blocks, nb)
    top = _rank_first(keys, kk)
    chosen = bmax.gather(-1, top)
    keep = torch.zeros(t, nb, dtype=torch.bool, device=s.device)
    keep.scatter_(-1, top, chosen > float("-inf"))
    return keep.index_select(-1, torch.arange(n, device=s.device) // block_size)


attach_kernels("dsv41_kernels.indexer_triton", "index_query_quant", "index_scores")
attach_kernels("dsv41_kernels.topk_triton", "topk_select", "candidate_blocks")
