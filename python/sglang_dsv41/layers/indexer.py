"""V4.1 FP4 indexer (spec attention 4.2-4.3): scores compressed positions, keeps the top-k.

Keys (written by the KV source): k = FP4(rope(k_norm(wk(latent)), group_pos)).
Queries: q = FP4(rope(wq_b(qr), pos)) [T, Hi, di]; head weights w = bf16(bf16(weights_proj(x)) * s),
s = di^-0.5 * Hi^-0.5. FP4 is the two-stage round trip (UE8M0 per 32 fake quant, then the 68-byte
packer). Score(t, j) = sum_h w_h * relu(q_h . k_j), computed in bf16 as the reference does.
Selection: exact top-k over visible positions (j < (t+1) // ratio); ties go to the lower position;
the result lists positions ascending, padded with -1. Candidate source: block keys = max over
`block_size` scores, newest block pinned, top `topk_blocks` blocks kept; consumers mask the rest.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sglang_dsv41.config import ModelConfig
from sglang_dsv41.layers.linear import BF16Linear, FP8Linear
from sglang_dsv41.layers.norm import RMSNorm
from sglang_dsv41.layers.rope import apply_rope
from sglang_dsv41.numerics import Slot
from sglang_dsv41.quant import index_fp4_qdq, index_fp4_qdq_ste


def query_quant(q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """q bf16 [T, Hi, di] -> bf16 [T, Hi, di] = two-stage FP4 round trip of rope(q)."""
    return index_fp4_qdq(apply_rope(q, cos, sin))


def query_quant_ste(q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """`query_quant` with the straight-through FP4 round trip (TRAIN)."""
    return index_fp4_qdq_ste(apply_rope(q, cos, sin))


def index_scores(q: torch.Tensor, w: torch.Tensor, keys: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
    """q [T, Hi, di], w [T, Hi], keys [n, di] (bf16) -> bf16 [T, n] = sum_h w_h relu(q_h . k)."""
    out = []
    for s in range(0, q.size(0), chunk):
        logits = torch.einsum("thd,nd->thn", q[s : s + chunk], keys)
        out.append((F.relu(logits) * w[s : s + chunk].unsqueeze(-1)).sum(dim=1))
    return torch.cat(out) if out else q.new_zeros(0, keys.size(0))


def mask_invisible(scores: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """-inf where position j >= visible[t] (visible int [T] = compressed positions each row sees)."""
    pos = torch.arange(scores.size(-1), device=scores.device)
    return scores.masked_fill(pos >= visible.unsqueeze(-1), float("-inf"))


def select_topk(scores: torch.Tensor, k: int) -> torch.Tensor:
    """scores [T, n] (-inf = not allowed) -> int32 [T, min(k, n)] positions ascending, -1 padded.
    Exact top-k; among equal scores the lower position wins (stable sort); -inf/NaN never selected."""
    kk = min(k, scores.size(-1))
    s = scores.float().nan_to_num(nan=float("-inf"), posinf=float("inf"), neginf=float("-inf"))
    vals, order = torch.sort(s, dim=-1, descending=True, stable=True)
    vals, order = vals[:, :kk], order[:, :kk]
    big = scores.size(-1)
    picked = torch.where(vals > float("-inf"), order, big).sort(dim=-1).values
    return torch.where(picked == big, -1, picked).to(torch.int32)


def select_candidate_blocks(scores: torch.Tensor, visible: torch.Tensor, topk_blocks: int, block_size: int) -> torch.Tensor:
    """Level one of the two-level top-k. scores [T, n] with invisible positions at -inf.
    Returns bool [T, n]: True inside the kept blocks. The block holding the row's newest visible
    position is always kept; a row with <= topk_blocks reachable blocks keeps all of them."""
    n = scores.size(-1)
    padded = F.pad(scores.float(), (0, -n % block_size), value=float("-inf"))
    block_max = padded.unflatten(-1, (-1, block_size)).amax(dim=-1)
    nb = block_max.size(-1)
    newest = torch.div(visible - 1, block_size, rounding_mode="floor")
    block_max = block_max.masked_fill(torch.arange(nb, device=scores.device) == newest.unsqueeze(-1), float("inf"))
    kk = min(topk_blocks, nb)
    vals, order = torch.sort(block_max, dim=-1, descending=True, stable=True)
    keep = torch.zeros_like(block_max, dtype=torch.bool)
    keep.scatter_(-1, order[:, :kk], vals[:, :kk] > float("-inf"))
    return keep.repeat_interleave(block_size, dim=-1)[:, :n]


class Indexer(nn.Module):
    # numerics slots (sglang_dsv41/numerics.py): pure-torch defaults, replaced by `apply_numerics`
    numerics_slots = {"query_quant": Slot("quant", kernel="index_query_quant", train=query_quant_ste),
                      "key_quant": Slot("quant", train=index_fp4_qdq_ste),
                      "select_topk": Slot("indexer", kernel="topk_select"),
                      "select_candidates": Slot("indexer", kernel="candidate_blocks")}
    query_quant = staticmethod(query_quant)
    key_quant = staticmethod(index_fp4_qdq)  # bf16 [n, di] -> the two-stage FP4 grid
    select_topk = staticmethod(select_topk)
    select_candidates = staticmethod(select_candidate_blocks)

    def __init__(self, cfg: ModelConfig, owns_keys: bool):
        super().__init__()
        c = cfg.compression
        self.n_heads, self.head_dim = c.index_n_heads, c.index_head_dim
        self.weight_scale = c.index_weight_scale
        self.wq_b = FP8Linear(cfg.attention.q_lora_rank, c.index_n_heads * c.index_head_dim, cfg.weight_block_size)
        self.weights_proj = BF16Linear(cfg.hidden_size, c.index_n_heads)
        if owns_keys:
            self.wk = BF16Linear(cfg.attention.head_dim, c.index_head_dim)
            self.k_norm = RMSNorm(c.index_head_dim, cfg.rms_norm_eps)

    def keys(self, latent: torch.Tensor, rotate) -> torch.Tensor:
        """latent [n, D] bf16 (pre-RoPE) -> index keys bf16 [n, di]; `rotate(t)` applies group RoPE."""
        return self.key_quant(rotate(self.k_norm(self.wk(latent))))

    def queries(self, qr: torch.Tensor, freqs: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """qr [T, q_lora] bf16, freqs (cos, sin) of the rows -> bf16 [T, Hi, di] on the FP4 grid."""
        q = self.wq_b(qr).unflatten(-1, (self.n_heads, self.head_dim))
        return self.query_quant(q, *freqs)

    def head_weights(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, H] bf16 -> bf16 [T, Hi]."""
        return self.weights_proj(x) * self.weight_scale
