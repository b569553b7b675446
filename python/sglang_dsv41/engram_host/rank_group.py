"""The few collectives the Engram host table needs from its tensor-parallel group.

    broadcast(obj)        rank 0's picklable object on every rank (the shared table's (pid, fd))
    barrier()             every rank has reached this point
    all_reduce_sum(t)     in-place integer sum of `t` over the group (the per_rank lookup: exactly
                          one rank holds a non-zero word per row, so the sum is exact, bit for bit)

`RankGroup()` is one process alone (no collectives). `RankGroup.from_torch(group)` wraps a
torch.distributed process group; an engine passes its TP group (the SGLang adapter does).
Tests build simulated ranks by handing in plain functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch


def _same(obj: Any) -> Any:
    return obj


def _nothing(*_args) -> None:
    return None


@dataclass(frozen=True)
class RankGroup:
    rank: int = 0
    size: int = 1
    broadcast: Callable[[Any], Any] = _same
    barrier: Callable[[], None] = _nothing
    all_reduce_sum: Callable[[torch.Tensor], None] = _nothing

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.size:
            raise ValueError(f"rank {self.rank} outside a group of {self.size}")

    @staticmethod
    def from_torch(group=None, cpu_group=None) -> "RankGroup":
        """A torch.distributed group (None: the default group). `cpu_group` (gloo) carries the
        object broadcast and the barrier when given; the sum runs on `group`."""
        import torch.distributed as dist

        if not dist.is_initialized() or dist.get_world_size(group) == 1:
            return RankGroup()
        meta = cpu_group if cpu_group is not None else group
        src = dist.get_global_rank(meta, 0) if meta is not None else 0

        def broadcast(obj: Any) -> Any:
            box = [obj]
            dist.broadcast_object_list(box, src=src, group=meta)
            return box[0]

        def all_reduce_sum(t: torch.Tensor) -> None:
            dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)

        return RankGroup(dist.get_rank(group), dist.get_world_size(group), broadcast,
                         lambda: dist.barrier(group=meta), all_reduce_sum)
