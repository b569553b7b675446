"""Tensor-parallel replacements of single-process modules (same call, same parameter names).

    GatherFP8Linear        FP8Linear over this rank's OUTPUT rows: all-gather the input's column
                           parts (x [..., K/size] per rank -> [..., K]), run the `gemm` slot (so kernels
                           apply) over the full K in K order, all-gather the outputs. Every output
                           element is the single-process dot product: exact (no partial sums). wo_b,
                           and the shared expert's w2 (parallel/ep.py).
    VocabParallelEmbedding rows [lo, hi) of the vocabulary; foreign ids give zero rows; exact
                           all-reduce on the int32 view (one owner per id) -> the same bits as one process.
    VocabParallelHead      fp32 logits of this rank's vocabulary rows, all-gathered -> [R, vocab];
                           every column is the same dot product as one process computes.
    ShardedEngramTable     Engram rows [lo, hi) (`shard_range`, spec model 5.5); the zero-fill +
                           exact all-reduce lookup of the spec's default device-shard mode.

Each keeps its base class's numerics slots (`gemm`, `fp32_gemm`, `gather`), so the kernels numerics policy (`numerics.apply_numerics`)
applied after `shard` points them at the op table as usual.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sglang_dsv41.layers.engram import EngramTable
from sglang_dsv41.layers.linear import FP8Linear
from sglang_dsv41.layers.transformer import Embedding, Head
from sglang_dsv41.parallel.collectives import Collectives


def _owned(ids: torch.Tensor, lo: int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """ids int64 [...] -> (local ids with foreign ones at 0, owned bool [...])."""
    local = ids - lo
    owned = (local >= 0) & (local < rows)
    return torch.where(owned, local, torch.zeros_like(local)), owned


class GatherFP8Linear(FP8Linear):
    """weight F8_E4M3 [N/size, K] = rows [lo, hi) of the full weight, scale [N/size/32, K/32]."""

    def __init__(self, in_features: int, out_local: int, block: int, comm: Collectives, gather_output: bool = True):
        super().__init__(in_features, out_local, block)
        self.comm, self.gather_output = comm, gather_output

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x bf16 [..., K/size] (this rank's input columns, ranks in column order) -> bf16 [..., N]
        (or this rank's [..., N/size] with gather_output=False), the same bits as one process."""
        y = super().forward(self.comm.gather_last(x))
        return self.comm.gather_last(y) if self.gather_output else y


class VocabParallelEmbedding(Embedding):
    def __init__(self, lo: int, hi: int, hidden: int, comm: Collectives):
        super().__init__(hi - lo, hidden)
        self.lo, self.comm = lo, comm

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids int64 [N] -> bf16 [N, H]."""
        local, owned = _owned(ids, self.lo, self.weight.size(0))
        e = F.embedding(local, self.weight).masked_fill(~owned.unsqueeze(-1), 0)
        return self.comm.exact_sum(e)


class VocabParallelHead(Head):
    def __init__(self, lo: int, hi: int, width: int, vocab: int, hidden: int, comm: Collectives):
        """Rows [lo, hi) of the head; `width` = ceil(vocab / size), every rank's padded part."""
        super().__init__(hi - lo, hidden)
        self.width, self.vocab, self.comm = width, vocab, comm

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """h bf16 [R, H] -> fp32 [R, vocab]."""
        part = self.fp32_gemm(h, self.weight)  # Head's slot: the same per-column dot products
        if part.size(-1) < self.width:
            part = F.pad(part, (0, self.width - part.size(-1)))
        return self.comm.gather_last(part, self.vocab)


class ShardedEngramTable(EngramTable):
    def __init__(self, lo: int, hi: int, head_dim: int, comm: Collectives):
        super().__init__(hi - lo, head_dim)
        self.lo, self.comm = lo, comm

    def forward(self, row_ids: torch.Tensor) -> torch.Tensor:
        """row_ids int64 [...] (global) -> bf16 [..., head_dim], the same bits as the whole table."""
        local, owned = _owned(row_ids, self.lo, self.weight.size(0))
        rows = self.gather(self.weight, self.scale, local).masked_fill(~owned.unsqueeze(-1), 0)
        return self.comm.exact_sum(rows)

    def extra_repr(self) -> str:
        return f"rows {self.lo}..{self.lo + self.weight.size(0) - 1} of this rank"
