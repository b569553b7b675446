"""CPU: tensor / expert parallelism (python/sglang_dsv41/parallel, docs/parallel.md).

Oracle: the single-process model on the same prompts through the same paged driver (prefill in
chunks, then batched decode), with its decisions. Two gloo processes run TP=2, EP=2 and TP=2+EP=2,
each loaded with slice reads. Tolerance: zero. No collective of a sharded forward adds two
floating-point numbers (split-output GEMMs are all-gathered, the MoE slots and the embedding /
Engram rows are zero-filled and summed as integers with one owner per word), and the GEMMs' per-element
math does not depend on how many output rows a rank computes, so the logits must be equal bit for
bit, and the routing, top-k and candidate decisions identical, on every rank.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from sglang_dsv41.config import ModelConfig
from sglang_dsv41.parallel import ParallelError, ParallelPlan, tensor_shards
from sglang_dsv41.runtime.driver import Driver, random_prompts

PLANS = ((2, 1), (1, 2), (2, 2))
"""(tp, ep) over 2 ranks."""
PROMPTS, PROMPT_LEN, DECODE, CHUNK, PAGE = 2, 100, 2, 128, 64


def _run(model) -> list[dict]:
    """The driver's steps: logits rows and decisions, on the CPU."""
    prompts = random_prompts(model.cfg.vocab_size, PROMPTS, PROMPT_LEN, seed=3)
    drv = Driver(model, PROMPTS * (PROMPT_LEN + DECODE + PAGE), PROMPTS, PAGE)
    trace: list = []
    with torch.inference_mode():
        drv.generate(prompts, DECODE, CHUNK, trace=trace)
    return [{"logits": t.logits, "routed": t.routed_experts, "topk": t.topk, "candidates": t.candidates} for t in trace]


def _param_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _rank(rank: int, world: int, ckpt: str, init_file: str, out: str) -> None:
    sys.path[:0] = [str(Path(__file__).resolve().parents[2] / "python"), str(Path(__file__).resolve().parents[2] / "sgl-kernel")]
    torch.set_num_threads(1)
    import torch.distributed as dist

    from sglang_dsv41.parallel import Collectives, load_sharded_model

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    comm = Collectives.from_torch()
    results = {}
    for tp, ep in PLANS:
        t0 = time.perf_counter()
        model = load_sharded_model(ckpt, ParallelPlan(world, rank, tp, ep), comm, progress=False)
        results[(tp, ep)] = {"steps": _run(model), "bytes": _param_bytes(model),
                             "experts": len(model.layers[0].ffn.experts), "heads": model.layers[0].attn.n_heads,
                             "seconds": time.perf_counter() - t0}
    torch.save(results, out)
    dist.destroy_process_group()


def _same_decisions(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_two_gloo_ranks_equal_one_process_bit_for_bit(tiny_dir, tiny_model, tmp_path):
    ctx = mp.get_context("spawn")
    outs = [tmp_path / f"rank{r}.pt" for r in range(2)]
    procs = [ctx.Process(target=_rank, args=(r, 2, str(tiny_dir), str(tmp_path / "init"), str(outs[r]))) for r in range(2)]
    for p in procs:
        p.start()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the ranks: on CPU the forward's bits depend on the intra-op thread count
    try:
        want = _run(tiny_model)  # meanwhile: one process
    finally:
        torch.set_num_threads(threads)
    for p in procs:
        p.join(timeout=300)
        assert p.exitcode == 0
    cfg, full_bytes = tiny_model.cfg, _param_bytes(tiny_model)
    assert len(want) == -(-PROMPTS * PROMPT_LEN // CHUNK) + DECODE - 1  # prefill chunks, then decode steps
    assert any(t.shape[0] and (t >= 0).all(1).any() for s in want for t in s["topk"].values())  # top-k kept some
    for rank, out in enumerate(outs):
        got = torch.load(out)
        for (tp, ep), res in got.items():
            where = f"rank {rank} tp={tp} ep={ep}"
            assert res["heads"] == cfg.attention.n_heads // tp, where
            assert res["experts"] == cfg.moe.n_routed_experts // ep, where
            assert res["bytes"] < full_bytes, where
            assert len(res["steps"]) == len(want), where
            for i, (g, w) in enumerate(zip(res["steps"], want)):
                assert torch.equal(g["logits"], w["logits"]), f"{where} step {i}: max |diff| {(g['logits'] - w['logits']).abs().max()}"
                for kind in ("routed", "topk", "candidates"):
                    assert _same_decisions(g[kind], w[kind]), f"{where} step {i}: {kind} differ"


def test_every_split_tensor_is_covered_once_in_rank_order(tiny_model):
    """Rank parts of every split tensor, concatenated in rank order, give the whole tensor; routed
    experts are held by exactly one rank each."""
    cfg, full = tiny_model.cfg, tiny_model.state_dict()
    world = 2
    shards = [tensor_shards(cfg, ParallelPlan(world, r, 2, 2)) for r in range(world)]
    assert shards[0].keys() == shards[1].keys()
    split = 0
    for name in shards[0]:
        parts = [s[name] for s in shards]
        if any(p is None for p in parts):  # a routed expert tensor: one owner
            assert sum(p is not None for p in parts) == 1, name
            continue
        split += 1
        assert all(p.dim == 0 for p in parts), name
        assert parts[0].lo == 0 and parts[-1].hi == full[name].size(0), name
        assert all(a.hi == b.lo for a, b in zip(parts, parts[1:])), name
        assert torch.equal(torch.cat([p.take(full[name]) for p in parts]), full[name]), name
    assert split > 10 * cfg.num_layers // 2


def test_plans_that_cannot_split_name_the_flag(tiny_model):
    cfg: ModelConfig = tiny_model.cfg
    with pytest.raises(ParallelError, match=r"^--tp 3: must be 1 or the number of ranks \(2\)"):
        ParallelPlan(2, 0, 3, 1).check(cfg)
    with pytest.raises(ParallelError, match=r"^--ep-size 16: hidden_size=256 must split into whole 32-row FP8 blocks"):
        ParallelPlan(16, 0, 1, 16).check(cfg, {"tp": "--tp-size", "ep": "--ep-size"})
    with pytest.raises(ParallelError, match=r"^--tp 8: does not divide num_attention_heads=4"):
        ParallelPlan(8, 0, 8, 1).check(cfg)


def test_server_args_accept_tp_and_ep_and_name_what_cannot_run(monkeypatch):
    """SGLang flags (sglang/model/server_args.py): --tp-size N with --ep-size 1 or N are served; the rest
    fails at startup naming the flag."""
    from types import SimpleNamespace

    from sglang_dsv41.sglang.model.server_args import CPU_BIND_VAR, _flag_errors, validate_flags

    monkeypatch.setenv(CPU_BIND_VAR, "0|1")
    for tp, ep in ((2, 1), (2, 2), (8, 8)):
        assert _flag_errors(SimpleNamespace(tp_size=tp, ep_size=ep), on_cpu=True) == []
    with pytest.raises(ValueError, match=r"^--ep-size: must be 1 or --tp-size \(4\)"):
        validate_flags(SimpleNamespace(tp_size=4, ep_size=2), on_cpu=False)
    with pytest.raises(ValueError, match=r"^--enable-dp-attention: data-parallel attention"):
        validate_flags(SimpleNamespace(tp_size=2, enable_dp_attention=True), on_cpu=False)
    monkeypatch.delenv(CPU_BIND_VAR)
    with pytest.raises(ValueError, match=rf"^--tp-size: 2 ranks on the CPU need {CPU_BIND_VAR}"):
        validate_flags(SimpleNamespace(tp_size=2), on_cpu=True)
    assert _flag_errors(SimpleNamespace(tp_size=2), on_cpu=False) == []
