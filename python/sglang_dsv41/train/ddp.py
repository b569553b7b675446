"""Data parallel training with torch.distributed DDP (gloo on CPU, NCCL on GPUs; the same code).

Each rank holds a full trainable model (train/trainable.py) and runs THE forward on its own slice of
the global batch; `DistributedDataParallel` averages the gradients (one all-reduce per bucket)
before the optimizer step, so every rank applies the same update. `find_unused_parameters=True` is
required: experts no token of a rank routed to, and the indexer (top-k only), get no gradient there.

Loss normalisation: a rank's loss is its summed token cross-entropy times world / N, where N is the
target-token count of the GLOBAL batch (all-reduced), so DDP's gradient average equals the gradient
of the global mean over tokens: one process on the concatenated batch, bit for bit on the CPU
(test/train/test_ddp.py) when both run with the same torch thread count. The thread count matters:
MKL's fp32 GEMM splits the K reduction over threads for some shapes (`layers.linear.fp32_linear`, the
mHC mixes), so the forward's last bits, and through the FP8 roundings and top-k its decisions, depend
on `torch.get_num_threads()`. Give every rank, and any process it is compared with, the same count.
Launch: `torchrun --nproc-per-node K ...` (env:// rendezvous), or
`init(rank, world, backend, init_method)` from a spawned process.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from sglang_dsv41.layers.transformer import DeepseekV41


def init(rank: int | None = None, world: int | None = None, backend: str | None = None,
         init_method: str = "env://") -> tuple[int, int]:
    """Join the process group (gloo on CPU, NCCL when CUDA is available unless `backend` says
    otherwise) -> (rank, world size)."""
    if not dist.is_initialized():
        backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        kw = {} if rank is None else {"rank": rank, "world_size": world}
        dist.init_process_group(backend, init_method=init_method, **kw)
    return dist.get_rank(), dist.get_world_size()


def wrap(model: DeepseekV41, device: torch.device | None = None) -> DistributedDataParallel:
    """DDP over a trainable model (its forward is `DeepseekV41.forward(ids, kv, replay)`). Frozen
    tensors (Engram FP8 tables, router bias) are left out of DDP's start-up broadcast: every rank
    loads them from the same checkpoint, and gloo cannot broadcast float8."""
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, frozen)
    ids = [device.index] if device is not None and device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids, find_unused_parameters=True)


def global_count(n: torch.Tensor | int) -> torch.Tensor:
    """Sum of a per-rank count over all ranks (fp32 scalar, the same on every rank)."""
    t = torch.as_tensor(n, dtype=torch.float32).clone()
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t)
    return t.cpu()


def shard(items: list, rank: int, world: int) -> list:
    """The rank's contiguous slice of a global batch (sizes differ by at most one)."""
    per, extra = divmod(len(items), world)
    start = rank * per + min(rank, extra)
    return items[start: start + per + (rank < extra)]
