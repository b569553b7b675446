"""`--tp-size N` / `--ep-size N` for DeepseekV41ForCausalLM: our parallel plan over SGLang's groups.

SGLang launches one scheduler per TP rank and initialises its model-parallel state before it builds
the model; `sglang_sharding(cfg)` reads that state (no process launching of our own):
    get_tp_group()                        the group every collective runs on (device_group: NCCL on
                                          CUDA, gloo on CPU; cpu_group for object gathers)
    get_moe_expert_parallel_world_size()  --ep-size (SGLang's MoE EP group lies inside the TP group)
and returns the plan (tp = the TP size, ep = 1 or the TP size) with its Collectives, or None for
one rank. The model class shards its meta model with it and slices SGLang's weight stream through
`tensor_shards` (SGLang reads whole tensors; each rank keeps its part and drops the rest).
"""

from __future__ import annotations

from sglang_dsv41.config import ModelConfig
from sglang_dsv41.parallel import SGLANG_FLAGS, Collectives, ParallelPlan


def sglang_sharding(cfg: ModelConfig) -> tuple[ParallelPlan, Collectives] | None:
    """ParallelError (naming --tp-size / --ep-size) if the plan cannot split `cfg`."""
    from sglang.srt.distributed.parallel_state import get_moe_expert_parallel_world_size, get_tp_group

    try:
        tp = get_tp_group()
    except AssertionError:  # no model-parallel state: a bare build outside a scheduler
        return None
    if tp.world_size == 1:
        return None
    comm = Collectives(tp.rank_in_group, tp.world_size, tp.device_group, tp.cpu_group)
    plan = ParallelPlan(tp.world_size, tp.rank_in_group, tp.world_size, get_moe_expert_parallel_world_size())
    return plan.check(cfg, SGLANG_FLAGS), comm
