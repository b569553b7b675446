"""The collectives of a sharded model, over one torch.distributed process group passed in.

    exact_sum(t)    all-reduce of a zero-filled 16-bit tensor on its int32 view: exactly one rank
                    holds a non-zero word per element pair, so the sum is bit for bit the owner's
                    value (-0.0 included). The embedding and the Engram rows (spec model 5.5).
    exact_scatter_last(t)  the same exact sum, but each rank receives only its 1/size of the last
                    dim (a reduce-scatter): the MoE's routed slots, per output-column slice.
    gather_last(t, n)  all-gather along the last dim of equal-width (zero-padded) parts, cut to n
                    columns: the vocabulary-parallel lm head, the input and output of the
                    split-output GEMMs (wo_b, the shared expert's w2) and the MoE output.
No collective adds two floating-point numbers, so a sharded forward is bit for bit the
single-process forward (docs/parallel.md), and every rank holds the same bits afterwards.

`Collectives()` is one process alone: every call returns its input. `Collectives.from_torch(group)`
wraps a group (None: the default world group); an engine passes its own TP group (the SGLang
adapter passes `get_tp_group().device_group`): gloo for CPU tensors, NCCL for CUDA tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Collectives:
    rank: int = 0
    size: int = 1
    group: Any = None
    """torch.distributed ProcessGroup (None with size > 1: the default group)."""
    cpu_group: Any = None
    """Optional gloo group for object broadcasts / barriers (SGLang's `cpu_group`)."""

    @staticmethod
    def from_torch(group=None, cpu_group=None) -> "Collectives":
        import torch.distributed as dist

        if not dist.is_initialized() or dist.get_world_size(group) == 1:
            return Collectives()
        return Collectives(dist.get_rank(group), dist.get_world_size(group), group, cpu_group)

    def exact_sum(self, t: torch.Tensor) -> torch.Tensor:
        """bf16 [..., even] zero everywhere this rank does not own -> every rank's owned values."""
        if self.size == 1:
            return t
        import torch.distributed as dist

        t = t.contiguous()
        dist.all_reduce(t.view(torch.int32), op=dist.ReduceOp.SUM, group=self.group)
        return t

    def exact_scatter_last(self, t: torch.Tensor) -> torch.Tensor:
        """16-bit [..., L] zero where this rank owns nothing, L / size even -> [..., L / size]: columns
        [rank * L / size, (rank + 1) * L / size) of the exact sum over the group."""
        if self.size == 1:
            return t
        import torch.distributed as dist

        w = t.size(-1) // self.size
        parts = t.unflatten(-1, (self.size, w)).movedim(-2, 0).contiguous()  # [size, ..., w]
        out = torch.empty(parts.shape[1:], dtype=t.dtype, device=t.device)
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        # input [size * lead, ...] -> output [lead, ...]: rank r receives the sum of every rank's part r
        flat_in = parts.view(torch.int32).flatten(0, 1) if parts.dim() > 1 else parts.view(torch.int32)
        scatter(out.view(torch.int32), flat_in, op=dist.ReduceOp.SUM, group=self.group)
        return out

    def gather_last(self, t: torch.Tensor, n: int | None = None) -> torch.Tensor:
        """[..., w] on every rank (w equal on all ranks) -> [..., n] = cat(rank 0, rank 1, ...)[..., :n]
        (n None: all size * w columns)."""
        if self.size == 1:
            return t if n is None else t[..., :n]
        import torch.distributed as dist

        t = t.contiguous()
        parts = [torch.empty_like(t) for _ in range(self.size)]
        dist.all_gather(parts, t, group=self.group)
        out = torch.cat(parts, dim=-1)
        return out if n is None else out[..., :n]

    def gather_objects(self, obj: Any) -> list[Any]:
        """Every rank's picklable `obj` (tests and startup checks; on the CPU group when given)."""
        if self.size == 1:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, obj, group=self.cpu_group if self.cpu_group is not None else self.group)
        return out
