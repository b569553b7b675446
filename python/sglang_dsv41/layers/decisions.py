"""Discrete choices of one forward: routed experts, index top-k, candidate blocks.

The same dataclass records what a forward chose and, passed back as `replay`, forces those choices
(guides/numerics.md step 3: compare values with decisions held equal). Tensors cover the rows the
layer ran on (all rows, or the decoder tail after narrowing); any layer may be left out of a replay.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Decisions:
    routed_experts: dict[int, torch.Tensor] = field(default_factory=dict)
    """layer -> int32 [rows, top_k] expert ids (ordered by biased score)."""
    topk: dict[int, torch.Tensor] = field(default_factory=dict)
    """index-source layer -> int32 [rows, K] compressed positions, ascending, -1 padded."""
    candidates: dict[int, torch.Tensor] = field(default_factory=dict)
    """candidate-source layer -> bool [rows, n] True inside the kept blocks (n = compressed
    positions the KV scored: the whole sequence (dense KV) or the batch's widest row (paged KV))."""

    def forced(self, kind: str, layer_id: int) -> torch.Tensor | None:
        """The forced tensor of `kind` ('routed_experts' | 'topk' | 'candidates') for a layer, if any."""
        return getattr(self, kind).get(layer_id)

    def to(self, device: torch.device | str) -> "Decisions":
        move = lambda d: {k: v.to(device) for k, v in d.items()}  # noqa: E731
        return Decisions(move(self.routed_experts), move(self.topk), move(self.candidates))
