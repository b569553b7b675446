"""End-to-end prefill + greedy decode through the standalone driver (paged runtime, no SGLang), each
time printed next to its floor (benchmark/roofline.py: bytes / HBM bandwidth for decode, matrix
FLOPs / bf16 matmul rate for prefill; both ceilings measured in the same run on CUDA).

    python benchmark/driver_bench.py --preset bench --prompts 8 --prompt-len 8192 --decode 32 \\
        --chunk 8192 [--warmup] [--no-graph] [--fast-weights] [--tokens-out tokens.json] [--results-dir DIR]
    python benchmark/driver_bench.py --preset bench --fast-weights --sweep 8,64 --context 8192 --steps 16 \\
        --check --profile [--skip-e2e]

The end-to-end row: prefill / decode throughput, peak memory and the ops the timed run really
called (each call of the op table counted by the implementation that ran; with decode graphs the
decode ops are counted once, at capture). Decode runs as one captured CUDA graph per batch size
unless --no-graph.
--sweep B1,B2: decode steps of B requests at --context cached tokens without a prefill (the pools
  are filled with finite random bytes, tokens teacher-forced): the driver loop with graphs, the
  graph replay alone, the serving path's step (runtime.decode_graphs.DecodeGraphSet: a static decode
  batch as the SGLang adapter builds it, loaded into its bucket's graph and replayed; host work
  included, no token read), the fixed-shape step run eagerly, and the eager step (--no-graph's path).
--check (CUDA): host syncs of one step (torch.cuda.set_sync_debug_mode) for the eager and the
  fixed-shape step, and graph replay vs the eager fixed-shape step vs the eager step, bitwise, over
  a short real prefill + decode.
--dspark [--simulate-accept-len X]: DSpark speculative decoding vs plain decode per batch size of --sweep
  (or --prompts), graphs and eager, random weights with X tokens committed per verify (dspark_bench.py).
--profile (CUDA): torch.profiler of one graph replay and one eager fixed-shape step per sweep batch,
  and (end to end) of one prompt's prefill: the ops with the most device time; --kernel-order N adds
  the replay's first N kernels in launch order (what one layer launches).
Everything printed is also written to <results-dir>/<date>-<device>-decode-graph.md (with --sweep /
--check / --profile) or appended to <date>-<device>-driver.md, with the date, device and command.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import sys
import time
import warnings
from collections import Counter
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "python"), str(ROOT / "sgl-kernel"), str(ROOT / "benchmark")]

from roofline import decode_bytes, measure_ceilings, prefill_flops  # noqa: E402
from sglang_dsv41.checkpoint.loader import load_model  # noqa: E402
from sglang_dsv41.runtime.batch import Batch  # noqa: E402
from sglang_dsv41.runtime.decode_graphs import DecodeGraphSet, GraphBuckets  # noqa: E402
from sglang_dsv41.runtime.driver import Driver, Sequence, random_prompts  # noqa: E402
from sglang_dsv41.runtime.graph import DecodeGraph  # noqa: E402
from sglang_dsv41.numerics import NumericsPolicy, apply_numerics  # noqa: E402
from sglang_dsv41.runtime.kernels import kernel_table  # noqa: E402
from sglang_dsv41.tiny import random_model, write_tiny_checkpoint  # noqa: E402

LOG: list[str] = []


def say(text: str = "") -> None:
    print(text, flush=True)
    LOG.append(text)


def sync(dev: str) -> None:
    if dev == "cuda":
        torch.cuda.synchronize()


# ---------------------------------------------------------------------------------------- floors
def decode_floor(model, ceil, batch: int, context: int, experts=None) -> tuple[float, dict]:
    b = decode_bytes(model, batch, context, experts)
    return (b["total"] / (ceil["hbm_tb_s"] * 1e12) * 1e3 if ceil else float("nan")), b


def active_experts(out) -> dict[int, int]:
    return {lid: int(torch.unique(t).numel()) for lid, t in out.decisions.routed_experts.items()}


# ---------------------------------------------------------------------------------------- sweep
def synthetic_seqs(drv: Driver, batch: int, context: int, steps: int, seed: int) -> tuple[list[Sequence], list[list[int]]]:
    g = torch.Generator().manual_seed(seed)
    toks = torch.randint(3, drv.model.cfg.vocab_size, (batch, context + steps + 1), generator=g).tolist()
    seqs = [Sequence(i, t[:context], context, cached=context) for i, t in enumerate(toks)]
    for s in seqs:
        drv.pools.clear_request(s.req_slot)
    drv._table(seqs, context)
    return seqs, [t[context:] for t in toks]


def reset(seqs: list[Sequence], context: int) -> None:
    for s in seqs:
        s.tokens, s.cached = s.tokens[:context], context


def loop_ms(drv: Driver, seqs, context: int, steps: int, teacher, graphs) -> float:
    """ms per decode step of the driver loop (host work, one token read per step included)."""
    drv.graphs = graphs
    reset(seqs, context)
    _, st = drv.run(seqs, steps + 1, teacher=teacher, release=False)
    return st["decode_s"] / steps * 1e3


def event_ms(fn, reps: int) -> float:
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(reps):
        fn()
    e.record()
    e.synchronize()
    return s.elapsed_time(e) / reps


def serving_path_ms(drv: Driver, g: DecodeGraph, seqs, context: int, steps: int) -> float:
    """ms per decode step of the serving path's graph set (the adapter's runtime part): the static decode
    batch the adapter builds from SGLang's batch (one row per request, its token table, n-gram history),
    `DecodeGraphSet.forward` = load into the bucket's graph + replay; wall time over `steps` steps."""
    dev, B = drv.device, len(seqs)
    t = lambda x: torch.tensor(x, dtype=torch.int64, device=dev)  # noqa: E731
    pos, rows = t([context - 1] * B), torch.arange(B, device=dev)
    batch = Batch(input_ids=t([s.tokens[context - 1] for s in seqs]), positions=pos, req_index=rows,
                  req_slots=t([s.req_slot for s in seqs]), prefix_lens=pos, extend_lens=torch.ones_like(pos),
                  token_table=g.token_table.clone(), history=t([s.tokens[context - 1 - g.hw: context - 1] for s in seqs]),
                  logits_rows=rows, seq_capacity=g.capacity, static=True)
    graphs = DecodeGraphSet(drv.runtime, GraphBuckets((B,), (g.capacity,)), g.hw, scratch_slots=drv.page_size)
    graphs.forward(batch, context)  # capture
    sync(dev)
    t0 = time.perf_counter()
    for _ in range(steps):
        graphs.forward(batch, context)
    sync(dev)
    assert not graphs.fallbacks, graphs.fallbacks
    return (time.perf_counter() - t0) / steps * 1e3


def top_ops(prof, n: int = 12) -> tuple[float, list, str, list]:
    """(device ms in all, the n largest (kernel, launches, ms), a line on launch counts, every small kernel
    (kernel, launches, ms) by launches). Only kernels: a
    host op (`aten::mm`) is charged its kernels' device time too, so counting it beside them counted that
    time twice."""
    evs = [e for e in prof.key_averages() if e.self_device_time_total > 0 and not e.key.startswith("aten::")]
    total = sum(e.self_device_time_total for e in evs) / 1e3
    evs.sort(key=lambda e: -e.self_device_time_total)
    small = sorted((e for e in evs if e.self_device_time_total < SMALL_US * e.count), key=lambda e: -e.count)
    line = (f"{sum(e.count for e in evs)} kernel launches; {sum(e.count for e in small)} of them (in "
            f"{len(small)} kernels) average under {SMALL_US} us, {sum(e.self_device_time_total for e in small) / 1e3:.2f} ms in all")
    return total, [(e.key[:90], e.count, e.self_device_time_total / 1e3) for e in evs[:n]], line, \
        [(e.key[:160], e.count, e.self_device_time_total / 1e3) for e in small]


def launch_order(prof) -> list[tuple[str, float]]:
    """(kernel name up to 90 characters, us) of every device kernel of a profile, in start order."""
    evs = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    evs.sort(key=lambda e: e.time_range.start)
    return [(e.name[:90], e.time_range.elapsed_us()) for e in evs]


SMALL_US = 5
"""Kernels averaging under this many microseconds a launch count as small in the profile's launch line."""
SMALL_ROWS = 30
"""Small kernels listed after a graph replay's profile."""


def sweep(a, model, table, dev, ceil) -> None:
    batches = [int(x) for x in a.sweep.split(",")]
    ctx, steps = a.context, a.steps
    drv = Driver(model, max(batches) * (ctx + steps + 2 * a.page_size), max(batches), a.page_size, dev, ops=table, graphs=True)
    with torch.inference_mode():
        for pool in [*drv.pools.window, *drv.pools.compressed.values(), *drv.pools.index_keys.values()]:
            pool.random_(0, 0x70)  # finite FP8 / FP4 codes and scales
    bw = ceil["hbm_tb_s"] if ceil else float("nan")
    say(f"\n### Decode steps at {ctx} cached tokens (synthetic context, {steps} timed steps; floor = bytes / "
        f"{bw:.2f} TB/s)\n")
    say("| batch | path | ms / step | tok/s | floor ms (weights + KV GB) | x floor |")
    say("|---|---|---|---|---|---|")
    for B in batches:
        seqs, teacher = synthetic_seqs(drv, B, ctx, steps, a.seed + B)
        teach = {s.req_slot: t for s, t in zip(seqs, teacher)}
        tlist = [teach.get(i, []) for i in range(max(batches))]
        graphs: dict = {}
        loop_ms(drv, seqs, ctx, 2, tlist, graphs)  # capture (and Triton compile)
        g_ms = loop_ms(drv, seqs, ctx, steps, tlist, graphs)
        g = next(iter(graphs.values()))
        experts = active_experts(g.out)
        replay_ms = event_ms(g.graph.replay, steps) if g.graph is not None else float("nan")
        floor, b = decode_floor(model, ceil, B, ctx, experts)
        set_ms = serving_path_ms(drv, g, seqs, ctx, steps)
        static = DecodeGraph(drv.runtime, B, g.capacity, g.hw, capture=False)
        static.set_table(g.token_table)
        reset(seqs, ctx)
        args = ([s.tokens[-1] for s in seqs], [ctx - 1] * B, [s.req_slot for s in seqs],
                [s.tokens[ctx - 1 - g.hw : ctx - 1] for s in seqs])
        static.step(*args)
        sync(dev)
        t0 = time.perf_counter()
        for _ in range(a.eager_steps):
            static.step(*args)
        sync(dev)
        static_ms = (time.perf_counter() - t0) / a.eager_steps * 1e3
        loop_ms(drv, seqs, ctx, a.eager_warmup, tlist, None)  # eager warm-up (Triton specialises on n % 16)
        e_ms = loop_ms(drv, seqs, ctx, a.eager_steps, tlist, None)
        gb = f"{floor:.3f} ({b['weights'] / 1e9:.2f} + {b['kv'] / 1e9:.2f})"
        for path, ms in (("graph, driver loop", g_ms), ("graph replay only", replay_ms),
                         ("serving path (graph set: load + replay)", set_ms),
                         ("fixed shapes, eager", static_ms), ("eager (--no-graph)", e_ms)):
            say(f"| {B} | {path} | {ms:.2f} | {B / ms * 1e3:.0f} | {gb} | {ms / floor:.1f} |")
        if a.profile and dev == "cuda":
            from torch.profiler import ProfilerActivity, profile

            for what, fn in (("graph replay", g.graph.replay), ("fixed-shape step, eager", lambda: static.step(*args))):
                with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                    fn()
                    sync(dev)
                total, rows, launches, small = top_ops(prof)
                say(f"\nProfile, batch {B}, one {what}: {total:.2f} ms of device time in all ({launches}); "
                    "top ops by self device time:\n")
                say("| op / kernel | calls | ms | share |")
                say("|---|---|---|---|")
                for name, calls, ms in rows:
                    say(f"| `{name.replace('|', '/')}` | {calls} | {ms:.3f} | {ms / max(total, 1e-9):.0%} |")
                if what == "graph replay" and a.kernel_order:
                    order = launch_order(prof)
                    say(f"\nThe first {min(a.kernel_order, len(order))} of the replay's {len(order)} kernels in launch order:\n")
                    say("| # | kernel | us |")
                    say("|---|---|---|")
                    for i, (name, us) in enumerate(order[: a.kernel_order]):
                        say(f"| {i} | `{name.replace('|', '/')}` | {us:.1f} |")
                if what == "graph replay":
                    say(f"\nSmall kernels (under {SMALL_US} us a launch) by launches, the first {SMALL_ROWS}:\n")
                    say("| kernel | launches | ms |")
                    say("|---|---|---|")
                    for name, calls, ms in small[:SMALL_ROWS]:
                        say(f"| `{name.replace('|', '/')}` | {calls} | {ms:.3f} |")
            say("")
        drv.release(seqs)
        del static, graphs, g
        say("")


# ---------------------------------------------------------------------------------------- check
def syncs_of(fn) -> Counter:
    sites: Counter = Counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    for w in caught:
        if "synchroniz" in str(w.message):
            sites[f"{Path(w.filename).name}:{w.lineno}"] += 1
    return sites


def check(a, model, table, dev) -> None:
    say("\n### Checks\n")
    prompts = random_prompts(model.cfg.vocab_size, a.check_batch, a.check_len, a.seed + 1)
    runs = {}
    modes = (("eager", False, None), ("fixed shapes, eager", True, False)) + ((("graph", True, True),) if dev == "cuda" else ())
    for name, graphs, capture in modes:
        drv = Driver(model, a.check_batch * (a.check_len + a.check_decode + 2 * a.page_size), a.check_batch,
                     a.page_size, dev, ops=table, graphs=graphs)
        drv.graph_capture = capture
        trace: list = []
        new, _ = drv.generate(prompts, a.check_decode, a.chunk, trace=trace)
        runs[name] = (new, trace, drv)
    base_new, base_trace, _ = runs["fixed shapes, eager"]
    for name in [m[0] for m in modes[::-1] if m[0] != "fixed shapes, eager"]:
        new, trace, _ = runs[name]
        n_prefill = len(trace) - (a.check_decode - 1)
        same = [torch.equal(x.logits, y.logits) for x, y in zip(trace[n_prefill:], base_trace[n_prefill:])]
        diff = max(float((x.logits - y.logits).abs().max()) for x, y in zip(trace[n_prefill:], base_trace[n_prefill:]))
        say(f"- {name} vs fixed-shape eager step, {a.check_batch} x {a.check_len} prompts, {a.check_decode - 1} decode "
            f"steps: logits bitwise equal in {sum(same)}/{len(same)} steps (max |diff| {diff:.3g}); tokens equal: {new == base_new}")
    if dev != "cuda":
        return
    # host syncs of one decode step on each path
    drv = runs["eager"][2]
    seqs = [Sequence(i, p + [3], len(p)) for i, p in enumerate(prompts)]
    for s in seqs:
        drv.pools.clear_request(s.req_slot)
    drv.run(seqs, 1, a.chunk, release=False)  # prefill only
    eager = syncs_of(lambda: drv.step(seqs, [1] * len(seqs)))
    drv.graphs, drv.graph_capture = {}, False
    g = drv.decode_graph(seqs, 3)
    static = syncs_of(lambda: drv.graph_step(g, seqs))
    for name, sites in (("eager step", eager), ("fixed-shape step (what the graph captures)", static)):
        where = ", ".join(f"{k} x{v}" for k, v in sites.most_common()) or "none"
        say(f"- host syncs of one {name}: {sum(sites.values())} ({where})")
    drv.release(seqs)


# ---------------------------------------------------------------------------------------- invariance
def batch_invariance(a, model, table, dev) -> None:
    """Request 0 (same pages, same tokens, same pool bytes) decoded for 3 steps inside batches of
    each size, deterministic mode off and on, with graphs and eagerly: its logits compared bitwise."""
    import os

    from sglang_dsv41.determinism import DETERMINISTIC_ENV

    sizes = [int(x) for x in a.batch_invariance.split(",")]
    ctx, steps, P, nmax = a.invariance_context, 3, a.page_size, max(sizes)
    drv = Driver(model, nmax * (ctx + 3 * P), nmax, P, dev, ops=table)
    with torch.inference_mode():
        torch.manual_seed(a.seed)
        for pool in [*drv.pools.window, *drv.pools.compressed.values(), *drv.pools.index_keys.values()]:
            pool.random_(0, 0x70)
    g = torch.Generator().manual_seed(a.seed)
    toks = torch.randint(3, model.cfg.vocab_size, (nmax, ctx + steps + 1), generator=g).tolist()
    pages = [[drv.alloc.alloc() for _ in range(-(-(ctx + steps + P) // P))] for _ in range(nmax)]
    results = {}
    prev = os.environ.get(DETERMINISTIC_ENV)
    try:
        for det in ("0", "1"):
            os.environ[DETERMINISTIC_ENV] = det
            for path in ("graph", "eager"):
                graphs = {} if path == "graph" else None
                for B in sizes:
                    seqs = [Sequence(i, toks[i][:ctx], ctx, list(pages[i]), cached=ctx) for i in range(B)]
                    for s in seqs:
                        drv.pools.clear_request(s.req_slot)
                    drv.graphs = graphs
                    trace: list = []
                    drv.run(seqs, steps + 1, teacher=[t[ctx:] for t in toks], trace=trace, release=False)
                    results[det, path, B] = torch.stack([t.logits[0] for t in trace])
    finally:
        if prev is None:
            os.environ.pop(DETERMINISTIC_ENV, None)
        else:
            os.environ[DETERMINISTIC_ENV] = prev

    def cmp(x, y) -> str:
        return "equal" if torch.equal(x, y) else f"differ (max abs {float((x - y).abs().max()):.3g})"

    say(f"\n### Batch invariance: request 0 at {ctx} cached tokens, {steps} decode steps, inside batches of "
        f"{', '.join(map(str, sizes))} (logits bitwise)\n")
    say("| SGLANG_DSV41_DETERMINISTIC | path | " + " | ".join(f"batch {B} vs {sizes[0]}" for B in sizes[1:])
        + " | " + " | ".join(f"graph vs eager, batch {B}" for B in sizes) + " |")
    say("|---|---|" + "---|" * (2 * len(sizes) - 1))
    for det in ("0", "1"):
        for path in ("graph", "eager"):
            cells = [cmp(results[det, path, B], results[det, path, sizes[0]]) for B in sizes[1:]]
            cells += [cmp(results[det, "graph", B], results[det, "eager", B]) if path == "graph" else "" for B in sizes]
            say(f"| {det} | {path} | " + " | ".join(cells) + " |")
    drv.graphs = None


# ---------------------------------------------------------------------------------------- e2e
def e2e(a, model, table, calls, dev, ceil, name) -> None:
    prompts = random_prompts(model.cfg.vocab_size, a.prompts, a.prompt_len, a.seed)
    drv = Driver(model, a.prompts * (a.prompt_len + a.decode + 2 * a.page_size), a.prompts, a.page_size, dev, ops=table,
                 decoder_replay=a.decoder_replay, encoder_replay=a.encoder_replay,
                 graphs=not a.no_graph and not a.encoder_replay)
    if a.warmup:  # one prompt compiles every prefill kernel (chunks are per-prompt); decode graphs are
        drv.generate(prompts[:1], 2, a.chunk)  # captured before the decode timer starts (stats graph_s)
    calls.clear()
    if dev == "cuda":
        torch.cuda.reset_peak_memory_stats()
    new, st = drv.generate(prompts, a.decode, a.chunk)
    peak = torch.cuda.max_memory_allocated() / 2**30 if dev == "cuda" else float("nan")
    used = ", ".join(f"{n} ({impl} x{c})" for (n, impl), c in sorted(calls.items()))
    modes = "+".join(m for m, on in (("decoder replay", a.decoder_replay), ("encoder replay", a.encoder_replay),
                                      ("no graph", a.no_graph)) if on)
    f = prefill_flops(model, a.prompt_len)
    pf_floor = a.prompts * f["total"] / (ceil["mma_tflops"] * 1e12) if ceil else float("nan")
    steps = max(a.decode - 1, 1)
    ms = st["decode_s"] / steps * 1e3
    d_floor, _ = decode_floor(model, ceil, a.prompts, a.prompt_len + a.decode // 2)
    say("\n| preset | prompts | decode steps | chunk | prefill s | prefill floor s (MMA) | prefill tok/s | decode ms/step | "
        "decode floor ms (HBM) | decode tok/s | graph capture s | peak GiB | ops called (implementation x calls) |")
    say("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    say(f"| {a.preset}{' (' + modes + ')' if modes else ''} | {a.prompts} x {a.prompt_len} | {a.decode} | {a.chunk} | "
        f"{st['prefill_s']:.2f} | {pf_floor:.2f} ({f['total'] * a.prompts / 1e12:.0f} TFLOP) | {st['prefill_tok_s']:.0f} | "
        f"{ms:.2f} | {d_floor:.2f} | {st['decode_tok_s']:.1f} | {st['graph_s']:.2f} | {peak:.1f} | {used or 'none'} |")
    if a.tokens_out:
        Path(a.tokens_out).write_text(json.dumps({"prompts_seed": a.seed, "tokens": new}))
    if a.profile and dev == "cuda":  # what limits prefill: one prompt's chunked prefill (+ its first token)
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            drv.generate(prompts[:1], 1, a.chunk)
            sync(dev)
        total, rows, _, _ = top_ops(prof)
        say(f"\nProfile, prefill of one {a.prompt_len}-token prompt: {total:.2f} ms of device time in all; "
            "top ops by self device time:\n")
        say("| op / kernel | calls | ms | share |")
        say("|---|---|---|---|")
        for name_, calls_, ms_ in rows:
            say(f"| `{name_.replace('|', '/')}` | {calls_} | {ms_:.3f} | {ms_ / max(total, 1e-9):.0%} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="small")
    ap.add_argument("--model", help="existing checkpoint dir (default: generate the preset)")
    ap.add_argument("--fast-weights", action="store_true", help="random weights drawn in memory on the device (any preset)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--decode", type=int, default=16)
    ap.add_argument("--chunk", type=int, default=8192)
    ap.add_argument("--page-size", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokens-out")
    ap.add_argument("--warmup", action="store_true", help="compile the kernels and capture the decode graph untimed first")
    ap.add_argument("--no-graph", action="store_true", help="eager decode steps in the end-to-end run")
    ap.add_argument("--decoder-replay", action="store_true", help="decoder SWA bounded replay (tail-only prefill)")
    ap.add_argument("--encoder-replay", action="store_true", help="encoder SWA bounded replay (window KV in request rings)")
    ap.add_argument("--sweep", help="comma-separated batch sizes: decode steps at --context without a prefill")
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--eager-steps", type=int, default=3)
    ap.add_argument("--eager-warmup", type=int, default=16, help="untimed eager steps first (new widths compile)")
    ap.add_argument("--batch-invariance", help="comma-separated batch sizes: request 0's decode logits in each, "
                    "deterministic mode off and on, graph and eager")
    ap.add_argument("--invariance-context", type=int, default=1024)
    ap.add_argument("--check", action="store_true", help="CUDA: host syncs per step, graph vs eager bitwise")
    ap.add_argument("--check-batch", type=int, default=8)
    ap.add_argument("--check-len", type=int, default=1000)
    ap.add_argument("--check-decode", type=int, default=6)
    ap.add_argument("--profile", action="store_true", help="CUDA: top ops of one step per sweep batch")
    ap.add_argument("--kernel-order", type=int, default=0, metavar="N",
                    help="with --profile: the first N kernels of the graph replay in launch order")
    ap.add_argument("--skip-e2e", action="store_true")
    ap.add_argument("--results-dir", default=str(ROOT / "benchmark" / "results"))
    ap.add_argument("--dspark", action="store_true", help="DSpark speculative decode vs plain decode, graphs and eager, "
                    "per batch size of --sweep (else --prompts): benchmark/dspark_bench.py")
    ap.add_argument("--simulate-accept-len", type=float, default=3.0,
                    help="--dspark on random weights: committed tokens per verify (forced acceptance)")
    a = ap.parse_args()
    if a.kernel_order < 0:
        ap.error(f"--kernel-order must be >= 0, got {a.kernel_order}")
    if a.dspark:
        import dspark_bench

        return dspark_bench.main(["--preset", a.preset, "--batches", a.sweep or str(a.prompts), "--prompt-len",
                                  str(a.prompt_len), "--decode", str(a.decode), "--page-size", str(a.page_size),
                                  "--simulate-accept-len", str(a.simulate_accept_len), "--results-dir", a.results_dir])
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    name = torch.cuda.get_device_name() if dev == "cuda" else "cpu"
    t0 = time.perf_counter()
    if a.model:
        model = load_model(Path(a.model), device=dev, progress=False)
    elif a.fast_weights or a.preset == "release":  # in memory: seconds, not minutes of sampling and writing
        model = random_model(a.preset, Path("/tmp/dsv41-bench") / f"{a.preset}-mem", dev, fast=True)
    else:
        model = load_model(write_tiny_checkpoint(Path("/tmp/dsv41-bench") / a.preset, a.preset, 0, dev), device=dev, progress=False)
    t_load = time.perf_counter() - t0
    table, calls = kernel_table(dev).counting()
    apply_numerics(model, NumericsPolicy.kernels(table))
    ceil = measure_ceilings(dev) if dev == "cuda" else None
    day = datetime.date.today().isoformat()
    cmd = "python " + " ".join(shlex.quote(x) for x in sys.argv)
    say(f"## {day} {name}, torch {torch.__version__}" + (f", triton {__import__('triton').__version__}" if dev == "cuda" else "")
        + f" (model built in {t_load:.1f} s)\n`{cmd}`\n")
    if ceil:
        say(f"Ceilings measured in this run: HBM copy {ceil['hbm_tb_s']:.2f} TB/s (read + write), "
            f"bf16 matmul {ceil['mma_tflops']:.0f} TFLOP/s.")
    extra = a.sweep or a.check or a.profile or a.batch_invariance
    try:
        if a.check:
            check(a, model, table, dev)
        if a.batch_invariance:
            batch_invariance(a, model, table, dev)
        if a.sweep:
            sweep(a, model, table, dev, ceil)
        if not a.skip_e2e:
            e2e(a, model, table, calls, dev, ceil, name)
    finally:
        out = Path(a.results_dir) / f"{day}-{'h200' if 'H200' in name else dev}-{'decode-graph' if extra else 'driver'}.md"
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("a") as f:
            f.write("\n" + "\n".join(LOG) + "\n")


if __name__ == "__main__":
    main()
