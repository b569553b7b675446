"""End-to-end prefill + greedy decode through the standalone driver (paged runtime, no SGLang).

    python benchmark/driver_bench.py --preset bench --prompts 8 --prompt-len 8192 --decode 32 \
        --chunk 8192 [--warmup] [--tokens-out tokens.json] [--results-dir benchmark/results]

Prints one markdown row (prefill/decode throughput, peak memory, and the ops the timed run really
called: every call of the op table is counted by which implementation ran, Triton or torch twin;
model code outside the op table (mHC, router, MoE loop, norms, head) is plain torch) and appends it, with the date, device and command, to <results-dir>/<date>-<device>-driver.md.
The generated tokens can be written as json to compare devices (same seed -> same prompts).
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "python"), str(ROOT / "sgl-kernel")]

from sglang_dsv41.checkpoint.loader import load_model  # noqa: E402
from sglang_dsv41.runtime.driver import Driver, random_prompts  # noqa: E402
from sglang_dsv41.runtime.kernels import kernel_table, use_kernels  # noqa: E402
from sglang_dsv41.tiny import random_model, write_tiny_checkpoint  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="small")
    ap.add_argument("--model", help="existing checkpoint dir (default: generate the preset)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--decode", type=int, default=16)
    ap.add_argument("--chunk", type=int, default=8192)
    ap.add_argument("--page-size", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokens-out")
    ap.add_argument("--warmup", action="store_true", help="run the whole generate once untimed first (Triton JIT)")
    ap.add_argument("--decoder-replay", action="store_true", help="decoder SWA bounded replay (tail-only prefill)")
    ap.add_argument("--encoder-replay", action="store_true", help="encoder SWA bounded replay (window KV in request rings)")
    ap.add_argument("--results-dir", default=str(ROOT / "benchmark" / "results"))
    a = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    name = torch.cuda.get_device_name() if dev == "cuda" else "cpu"
    t0 = time.perf_counter()
    if a.model or a.preset not in ("release",):
        path = Path(a.model) if a.model else write_tiny_checkpoint(Path("/tmp/dsv41-bench") / a.preset, a.preset, 0, dev)
        model = load_model(path, device=dev, progress=False)
    else:  # the 40-layer preset is built in memory (seconds, not minutes of sampling and writing)
        model = random_model(a.preset, Path("/tmp/dsv41-bench") / f"{a.preset}-mem", dev, fast=True)
    t_load = time.perf_counter() - t0
    prompts = random_prompts(model.cfg.vocab_size, a.prompts, a.prompt_len, a.seed)
    table, calls = kernel_table(dev).counting()
    use_kernels(model, table)
    drv = Driver(model, a.prompts * (a.prompt_len + a.decode + a.page_size), a.prompts, a.page_size, dev, ops=table,
                 decoder_replay=a.decoder_replay, encoder_replay=a.encoder_replay)
    if a.warmup:
        drv.generate(prompts, a.decode, a.chunk)
    calls.clear()
    if dev == "cuda":
        torch.cuda.reset_peak_memory_stats()
    new, st = drv.generate(prompts, a.decode, a.chunk)
    peak = torch.cuda.max_memory_allocated() / 2**30 if dev == "cuda" else float("nan")
    used = ", ".join(f"{n} ({impl} x{c})" for (n, impl), c in sorted(calls.items()))
    modes = "+".join(m for m, on in (("decoder replay", a.decoder_replay), ("encoder replay", a.encoder_replay)) if on)
    row = (f"| {a.preset}{' (' + modes + ')' if modes else ''} | {a.prompts} x {a.prompt_len} | {a.decode} | {a.chunk} | {st['prefill_s']:.2f} | "
           f"{st['prefill_tok_s']:.0f} | {st['decode_s']:.2f} | {st['decode_tok_s']:.1f} | {peak:.1f} | "
           f"{used or 'none'} |")
    header = ("| preset | prompts | decode steps | chunk | prefill s | prefill tok/s | decode s | decode tok/s | "
              "peak GiB | ops called (implementation x calls) |\n|---|---|---|---|---|---|---|---|---|---|")
    print(header + "\n" + row, flush=True)
    if a.tokens_out:
        Path(a.tokens_out).write_text(json.dumps({"prompts_seed": a.seed, "tokens": new}))
    day = datetime.date.today().isoformat()
    out = Path(a.results_dir) / f"{day}-{'h200' if 'H200' in name else dev}-driver.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = "python " + " ".join(shlex.quote(x) for x in sys.argv)
    with out.open("a") as f:
        f.write(f"\n## {day} {name}, torch {torch.__version__} (load+generate checkpoint {t_load:.1f}s)\n`{cmd}`\n\n{header}\n{row}\n")


if __name__ == "__main__":
    main()
