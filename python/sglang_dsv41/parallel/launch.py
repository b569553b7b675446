"""Process-group setup for the offline driver and benchmarks under `torchrun --nproc-per-node N`.

torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT; `init_from_env(device)`
starts the default group with NCCL for CUDA (one GPU per local rank) and gloo for the CPU, and
returns the group's `Collectives` and this rank's device. Without torchrun's variables it is one
process (no group). An engine that owns its groups (SGLang) never calls this: it passes its group to
`Collectives.from_torch`.
"""

from __future__ import annotations

import os

import torch


def init_from_env(device: str) -> tuple["Collectives", str]:  # noqa: F821
    from sglang_dsv41.parallel.collectives import Collectives

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return Collectives(), device
    import torch.distributed as dist

    cuda = torch.device(device).type == "cuda"
    if cuda:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device = f"cuda:{local}"
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo")
    return Collectives.from_torch(None), device


def finish() -> None:
    """Tear the default group down (torchrun workers should, before exiting)."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
