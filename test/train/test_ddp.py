"""CPU: data parallel training (train/ddp.py) with 2 gloo processes equals one process on the
concatenated batch. Oracle: the gradients of one process running both sequences (the global mean
token loss); DDP's all-reduced gradients must match within fp32 summation-order tolerance.

Thread count: the oracle runs with the ranks' torch thread count (1). MKL's fp32 GEMM splits the K
reduction over threads for the shapes of `fp32_linear` (mHC mixes: [64, 1024] x [1024, 24]), so the
forward's values depend on `torch.get_num_threads()`; an FP8/MXFP8 rounding or a top-k then turns
that last-bit difference into a different forward (this was the 0.011 embedding-gradient gap: the
oracle ran with 2 threads). With equal thread counts each rank's gradient equals the oracle's
per-sequence contribution bit for bit, and the sums agree too: a rank's loss scale world / N is the
oracle's 1 / N times a power of two, DDP's gloo sum then divide by world undoes it exactly, and the
oracle's autograd adds the same two per-sequence totals. So the test asserts bitwise equality of every
gradient (measured: 471 of 471 tensors equal). Were a parameter's per-forward reads accumulated in a
different grouping, the gap would be fp32 summation order (a few ulps); that would show up here as
an exact-equality failure to look at, not be hidden by a tolerance.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F

from sglang_dsv41.reference.dense_kv import DenseKV
from sglang_dsv41.train import load_trainable, trainable_parameters

T = 8


def _seqs() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(21)
    return [torch.randint(3, 1000, (T,), generator=g) for _ in range(2)]


def _summed_ce(model, ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    out = model(ids, DenseKV(model.module.cfg if hasattr(model, "module") else model.cfg, T, "cpu"))
    return F.cross_entropy(out.logits[:-1], ids[1:], reduction="sum"), T - 1


def _rank(rank: int, world: int, ckpt: str, init_file: str, out: str) -> None:
    sys.path[:0] = [str(Path(__file__).resolve().parents[2] / "python")]
    torch.set_num_threads(1)
    from sglang_dsv41.train import ddp

    ddp.init(rank, world, "gloo", f"file://{init_file}")
    model = load_trainable(ckpt)
    wrapped = ddp.wrap(model)
    (ids,) = ddp.shard(_seqs(), rank, world)
    loss, n = _summed_ce(wrapped, ids)
    (loss * world / ddp.global_count(n)).backward()
    if rank == 0:
        torch.save({k: (torch.zeros_like(p) if p.grad is None else p.grad) for k, p in trainable_parameters(model)}, out)
    torch.distributed.destroy_process_group()


def test_two_gloo_processes_equal_one_process_on_the_concatenated_batch(tiny_dir, tmp_path):
    out = tmp_path / "grads.pt"
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank, args=(r, 2, str(tiny_dir), str(tmp_path / "init"), str(out))) for r in range(2)]
    for p in procs:
        p.start()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the ranks' thread count: the forward's values depend on it (module docstring)
    try:
        model = load_trainable(tiny_dir)  # meanwhile: one process, both sequences, global mean
        total = sum(_summed_ce(model, ids)[0] for ids in _seqs())
        (total / (2 * (T - 1))).backward()
    finally:
        torch.set_num_threads(threads)
    for p in procs:
        p.join(timeout=600)
        assert p.exitcode == 0
    got = torch.load(out)
    want = {k: (torch.zeros_like(p) if p.grad is None else p.grad) for k, p in trainable_parameters(model)}
    assert got.keys() == want.keys()
    nonzero = 0
    for k, w in want.items():
        torch.testing.assert_close(got[k], w, rtol=0, atol=0, msg=k)
        nonzero += bool(w.abs().sum() > 0)
    assert nonzero > 0.8 * len(want)
