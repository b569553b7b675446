"""Tensor / expert parallel scaling of the offline driver (docs/parallel.md), one launch per size:

    torchrun --nproc-per-node N benchmark/parallel_bench.py --tp N --ep N --preset release --out-dir DIR
    python benchmark/parallel_bench.py --report DIR [--results-dir benchmark/results]

Each launch (every rank builds the same seeded in-memory model, then `shard`s it; NCCL between the
GPUs of one host) measures, in this order:
  * the logits check: 2 prompts x 300 tokens (--check) prefilled in 128-token chunks, then 4 greedy decode
    steps; rank 0 saves every step's fp32 logits and decisions (`trace-tp<N>-ep<E>.pt`);
  * prefill: 8 prompts x 8192 tokens in 8192-token chunks (--prefill), tokens/s;
  * decode: batch 64 (--decode-batch) after 1024-token prompts, 16 steps, tokens/s;
and writes `run-tp<N>-ep<E>.json`. `--report DIR` prints the table: throughput per size, scaling
efficiency = throughput(N) / (N * throughput(1)), and the logits comparison of every size with
TP=1 (max |diff|, bitwise equal or not, decisions identical or not), and writes it to
<results-dir>/<date>-<device>-parallel.md with the commands. benchmark/parallel_bench.sh runs the
sizes 1, 2, 4, 8 and the report. Needs one GPU per rank; sharded decode steps run eagerly.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "python"), str(ROOT / "sgl-kernel")]

from sglang_dsv41.parallel import ParallelPlan, shard  # noqa: E402
from sglang_dsv41.parallel.launch import finish, init_from_env  # noqa: E402
from sglang_dsv41.runtime.driver import Driver, random_prompts  # noqa: E402
from sglang_dsv41.numerics import NumericsPolicy, apply_numerics  # noqa: E402
from sglang_dsv41.runtime.kernels import kernel_table  # noqa: E402
from sglang_dsv41.tiny import random_model  # noqa: E402


def _pair(text: str) -> tuple[int, int]:
    n, length = text.lower().split("x")
    return int(n), int(length)


def _drive(model, table, dev, n: int, length: int, decode: int, chunk: int, trace=None) -> dict:
    prompts = random_prompts(model.cfg.vocab_size, n, length, seed=0)
    page = 256
    drv = Driver(model, n * (length + decode + page), n, page, dev, ops=table)
    with torch.inference_mode():
        _, stats = drv.generate(prompts, decode, chunk, trace=trace)
    return stats


def run(a) -> None:
    comm, dev = init_from_env(a.device)
    cuda = dev.startswith("cuda")
    plan = ParallelPlan(comm.size, comm.rank, a.tp, a.ep)
    t0 = time.perf_counter()
    model = random_model(a.preset, Path("/tmp/dsv41-parallel") / f"{a.preset}-rank{comm.rank}", dev, fast=True)
    shard(model, plan, comm)
    if cuda:
        torch.cuda.empty_cache()
    table = kernel_table(dev)
    apply_numerics(model, NumericsPolicy.kernels(table))
    built = time.perf_counter() - t0
    trace: list = []
    cn, cl = _pair(a.check)
    _drive(model, table, dev, cn, cl, 5, 128, trace)
    _drive(model, table, dev, 2, 256, 2, 256)  # warm-up of the prefill / decode shapes
    pn, pl = _pair(a.prefill)
    prefill = _drive(model, table, dev, pn, pl, 1, a.chunk)
    decode = _drive(model, table, dev, a.decode_batch, a.decode_context, a.decode_steps + 1, a.chunk)
    mem = torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0
    mems = comm.gather_objects(mem)
    if comm.rank == 0:
        out = Path(a.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        tag = f"tp{a.tp}-ep{a.ep}"
        torch.save([{"logits": t.logits, "routed": t.routed_experts, "topk": t.topk, "candidates": t.candidates}
                    for t in trace], out / f"trace-{tag}.pt")
        rec = {"world": comm.size, "tp": a.tp, "ep": a.ep, "preset": a.preset, "build_s": built,
               "prefill_tok_s": prefill["prefill_tok_s"], "decode_tok_s": decode["decode_tok_s"],
               "prefill": a.prefill, "decode_batch": a.decode_batch, "decode_context": a.decode_context,
               "max_mem_gib": max(mems), "device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
               "cmd": "torchrun --nproc-per-node %d " % comm.size + " ".join(shlex.quote(x) for x in sys.argv)}
        (out / f"run-{tag}.json").write_text(json.dumps(rec, indent=2) + "\n")
        print(json.dumps(rec), flush=True)
    finish()


def _compare(got: list, want: list) -> tuple[float, bool, bool]:
    diff, equal, same = 0.0, len(got) == len(want), len(got) == len(want)
    for g, w in zip(got, want):
        diff = max(diff, (g["logits"] - w["logits"]).abs().max().item())
        equal &= torch.equal(g["logits"], w["logits"])
        for k in ("routed", "topk", "candidates"):
            same &= g[k].keys() == w[k].keys() and all(torch.equal(g[k][i], w[k][i]) for i in g[k])
    return diff, equal, same


def report(a) -> None:
    d = Path(a.report)
    runs = sorted((json.loads(p.read_text()) for p in d.glob("run-*.json")), key=lambda r: r["world"])
    base = next((r for r in runs if r["world"] == 1), None)
    if base is None:
        raise SystemExit(f"no single-GPU run (run-tp1-ep1.json) in {d}")
    want = torch.load(d / "trace-tp1-ep1.pt")
    lines = [f"## {datetime.date.today().isoformat()} {base['device']} x1..x{runs[-1]['world']}, torch {base['torch']}",
             "", f"Preset `{base['preset']}`; prefill {base['prefill']} tokens (chunk as run), decode batch "
             f"{base['decode_batch']} after {base['decode_context']}-token prompts. Commands:", ""]
    lines += [f"    {r['cmd']}" for r in runs] + ["", "| GPUs | tp | ep | prefill tok/s | eff. | decode tok/s | eff. | "
              "max GiB/GPU | logits vs 1 GPU (max abs diff) | bitwise | decisions identical |", "|" + "---|" * 11]
    for r in runs:
        diff, equal, same = _compare(torch.load(d / f"trace-tp{r['tp']}-ep{r['ep']}.pt"), want)
        pe = r["prefill_tok_s"] / (r["world"] * base["prefill_tok_s"])
        de = r["decode_tok_s"] / (r["world"] * base["decode_tok_s"])
        lines.append(f"| {r['world']} | {r['tp']} | {r['ep']} | {r['prefill_tok_s']:.0f} | {pe:.2f} | "
                     f"{r['decode_tok_s']:.0f} | {de:.2f} | {r['max_mem_gib']:.1f} | {diff:.3g} | {equal} | {same} |")
    text = "\n".join(lines)
    print(text)
    dev = "h200" if "H200" in base["device"] else base["device"].replace(" ", "-").lower()
    out = Path(a.results_dir) / f"{datetime.date.today().isoformat()}-{dev}-parallel.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a") as f:
        f.write("\n" + text + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--ep", type=int, default=1)
    ap.add_argument("--preset", default="release")
    ap.add_argument("--prefill", default="8x8192", help="prompts x tokens")
    ap.add_argument("--chunk", type=int, default=8192)
    ap.add_argument("--check", default="2x300", help="prompts x tokens of the logits check (128-token chunks, 4 decode steps)")
    ap.add_argument("--decode-batch", type=int, default=64)
    ap.add_argument("--decode-context", type=int, default=1024)
    ap.add_argument("--decode-steps", type=int, default=16)
    ap.add_argument("--out-dir", default="/tmp/dsv41-parallel/runs")
    ap.add_argument("--device", default="cuda", help="cpu: gloo, a smoke run of the script itself (tiny presets)")
    ap.add_argument("--report", help="a directory of runs: print and write the scaling table")
    ap.add_argument("--results-dir", default=str(ROOT / "benchmark" / "results"))
    a = ap.parse_args()
    if a.report:
        report(a)
    else:
        if a.device == "cuda" and (not torch.cuda.is_available()
                                   or torch.cuda.device_count() < int(os.environ.get("WORLD_SIZE", "1"))):
            raise SystemExit("parallel_bench needs one CUDA GPU per rank")
        run(a)


if __name__ == "__main__":
    main()
