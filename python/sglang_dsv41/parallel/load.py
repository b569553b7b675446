"""Load one rank's part of a checkpoint: the meta model is sharded first, then each tensor's slice
is read from the safetensors file (`get_slice`: only those bytes), so no rank ever holds a whole
split tensor or another rank's experts.

    comm  = Collectives.from_torch(group)
    plan  = ParallelPlan(world=comm.size, rank=comm.rank, tp=N, ep=N)
    model = load_sharded_model("deepseek-v4.1-tiny", plan, comm, device)
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from sglang_dsv41.checkpoint.loader import load_model
from sglang_dsv41.layers.transformer import DeepseekV41
from sglang_dsv41.parallel.collectives import Collectives
from sglang_dsv41.parallel.mesh import ParallelPlan
from sglang_dsv41.parallel.shard import TensorShard, shard, tensor_shards


@dataclass
class Sharding:
    """The `sharding` argument of `checkpoint.loader.load_model` for one rank."""

    plan: ParallelPlan
    comm: Collectives
    shards: dict[str, TensorShard | None] | None = None

    def apply(self, model: DeepseekV41) -> None:
        shard(model, self.plan, self.comm)
        self.shards = tensor_shards(model.cfg, self.plan)

    def select(self, name: str) -> tuple[str, tuple[slice, ...] | None] | None:
        s = self.shards.get(name, TensorShard(name))
        return None if s is None else (s.name, s.index)


def load_sharded_model(path: str | os.PathLike, plan: ParallelPlan, comm: Collectives,
                       device: str | torch.device = "cpu", progress: bool = True) -> DeepseekV41:
    """`load_model` for rank `plan.rank` of `plan` (ParallelError naming the flag if it cannot split)."""
    if plan.world != comm.size or plan.rank != comm.rank:
        raise ValueError(f"plan is rank {plan.rank} of {plan.world} but the group is rank {comm.rank} of {comm.size}")
    return load_model(path, device=device, progress=progress, sharding=Sharding(plan, comm))
