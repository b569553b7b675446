"""Tensor and expert parallelism as a transformation of a built model (docs/parallel.md).

    mesh.py         ParallelPlan (tp / ep over one group; what this rank holds), ParallelError
    collectives.py  Collectives over a torch.distributed group (fp32 sum, exact sum, gather)
    tp.py           row-parallel wo_b, vocabulary-parallel embedding / head, sharded Engram table
    ep.py           ParallelMoE: experts by rank, shared expert by columns, one all-reduce
    shard.py        shard(model, plan, comm) and tensor_shards (this rank's slice of every tensor)
    load.py         load_sharded_model: slice reads from safetensors
    launch.py       torchrun / process-group setup for the offline driver
"""

from sglang_dsv41.parallel.collectives import Collectives
from sglang_dsv41.parallel.load import Sharding, load_sharded_model
from sglang_dsv41.parallel.mesh import DRIVER_FLAGS, SGLANG_FLAGS, ParallelError, ParallelPlan
from sglang_dsv41.parallel.shard import TensorShard, shard, take_shards, tensor_shards

__all__ = ["Collectives", "DRIVER_FLAGS", "ParallelError", "ParallelPlan", "SGLANG_FLAGS", "Sharding", "TensorShard",
           "load_sharded_model", "shard", "take_shards", "tensor_shards"]
