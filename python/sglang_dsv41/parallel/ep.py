"""The MoE site split over ranks: routed experts by expert (EP), the shared expert by its
intermediate dim (with TP). Tokens are replicated: every rank holds every token (the attention
output is all-gathered), routes all of them with the replicated router (so every rank takes the same
decisions) and runs ITS experts on the (token, slot) pairs routed to them.

One process (layers/moe.py) computes, per token and output column, in fp32 from +0:
    y = slot_0 + slot_1 + ... + slot_{k-1} + shared,   cast once to bf16
with slots in ascending expert id, each a bf16 expert output (routing weight applied before w2).
The same sum, in the same order, runs here on output-column slices: rank r owns columns
C_r = [r*H/size, (r+1)*H/size) of the MoE output.
    slots   ep > 1: zero-filled [T, k, H] of this rank's experts -> exact reduce-scatter -> [T, k, C_r]
            (one expert owner per slot, so the integer sum is the owner's bits); ep = 1: every rank
            computed every slot, keep C_r.
    shared  tp > 1: h = swiglu(w1, w3) over this rank's intermediate columns (each a full dot product),
            all-gathered -> [T, I]; w2 holds rows C_r -> [T, C_r]. tp = 1: the whole expert, keep C_r.
    y       the `combine` slot (layers/moe.py) on C_r, all-gathered -> [T, H].
Every slot's bf16 value is the single-process value bit for bit (the grouped op's rows do not depend
on grouping), so the layer is exact: ParallelMoE == MoE bit for bit, for any plan.
"""

from __future__ import annotations

import torch
from torch import nn

from sglang_dsv41.config import ModelConfig
from sglang_dsv41.layers.linear import FP8Linear, MXFP4Linear
from sglang_dsv41.layers.moe import Expert, Gate, MoE
from sglang_dsv41.parallel.collectives import Collectives
from sglang_dsv41.parallel.mesh import ParallelPlan
from sglang_dsv41.parallel.tp import GatherFP8Linear


class ParallelMoE(MoE):
    """Parameter names as MoE: `gate.*`, `experts.<local j>.*` (global expert lo + j), `shared_experts.*`
    (w1 / w3: this rank's intermediate rows; w2: this rank's output rows, all intermediate columns).
    Kernel slot `routed` and `expert_weights` are MoE's."""

    def __init__(self, cfg: ModelConfig, plan: ParallelPlan, comm: Collectives):
        nn.Module.__init__(self)
        m, H, blk = cfg.moe, cfg.hidden_size, cfg.weight_block_size
        self.gate = Gate(cfg)
        self.lo, self.hi = plan.experts(cfg)
        self.experts = nn.ModuleList(Expert(H, m.moe_inter_dim, MXFP4Linear, m.swiglu_limit) for _ in range(self.hi - self.lo))
        self.shared_experts = Expert(H, m.moe_inter_dim, FP8Linear, m.swiglu_limit)
        if plan.tp > 1:
            inter = m.moe_inter_dim // plan.tp
            self.shared_experts.w1 = FP8Linear(H, inter, blk)
            self.shared_experts.w3 = FP8Linear(H, inter, blk)
            self.shared_experts.w2 = GatherFP8Linear(m.moe_inter_dim, H // plan.world, blk, comm, gather_output=False)
        self._stacked = None
        self.comm, self.split_experts, self.split_shared = comm, plan.ep > 1, plan.tp > 1
        self.cols = plan.hidden(cfg)

    def _slots(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """bf16 [T, k, C_r]: the routed slots (ascending expert id) on this rank's output columns."""
        stacked, limit = self.expert_weights(), self.shared_experts.limit
        if not self.split_experts:
            return self.routed(x, ids, weights, *stacked, limit)[..., self.cols[0]:self.cols[1]]
        t, k = ids.shape
        sid, order = ids.long().sort(dim=1)  # slot order of layers/moe.py
        sw = weights.gather(1, order)
        rows, cols = ((sid >= self.lo) & (sid < self.hi)).nonzero(as_tuple=True)
        slots = x.new_zeros(t, k, x.size(-1))
        if rows.numel():
            out = self.routed(x[rows], (sid[rows, cols] - self.lo).unsqueeze(1), sw[rows, cols].unsqueeze(1), *stacked, limit)
            slots[rows, cols] = out[:, 0]
        return self.comm.exact_scatter_last(slots)

    def _shared(self, x: torch.Tensor) -> torch.Tensor:
        """bf16 [T, C_r]: the shared expert's output on this rank's output columns."""
        se = self.shared_experts
        if not self.split_shared:
            return se(x)[..., self.cols[0]:self.cols[1]]
        return se.w2(se.swiglu(*se.gate_up(x), se.limit))

    def forward(self, x: torch.Tensor, forced: torch.Tensor | None = None,
                image_rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, H] bf16 (the same on every rank) -> (y bf16 [T, H] the same on every rank,
        routed expert ids int32 [T, k] (global ids, identical on every rank)); image_rows: see Gate."""
        weights, ids = self.gate(x, forced, image_rows)
        y = self.combine(self._slots(x, ids, weights), self._shared(x))
        return self.comm.gather_last(y), ids.to(torch.int32)

    def extra_repr(self) -> str:
        return f"experts {self.lo}..{self.hi - 1} of this rank, output columns {self.cols[0]}..{self.cols[1] - 1}"
