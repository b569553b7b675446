"""DSpark decode speed on the standalone driver: plain decode vs speculative decode, side by side in
one run, with a simulated acceptance (random-weight presets accept almost nothing: the commit takes
a fixed schedule of accept lengths with the given mean, runtime/speculative.py `simulate_accept`).

    python benchmark/dspark_bench.py --preset bench --batches 1,8,64 --prompt-len 1024 --decode 48 \\
        --simulate-accept-len 3.0 [--results-dir DIR]

Per batch size B: B random prompts of --prompt-len tokens prefilled, then --decode new tokens each by
  plain, graph    the driver's decode with one CUDA graph per batch size (today's serving path)
  plain, eager    the same steps without graphs
  DSpark, graph   draft (gamma rows per request) + verify (gamma + 1 rows) + commit per step, as the two
                  CUDA graphs of runtime/spec_graph.py (per batch size)
  DSpark, eager   the same steps without graphs
tokens/s = B x decoded tokens / decode time; "step" = decode time / steps (a DSpark step commits
--simulate-accept-len tokens per request on average). "DSpark graph / plain graph" is what a user
gets; the eager ratio is the algorithmic gain without launch overheads. Printed and appended to <results-dir>/<date>-<device>-dspark.md with the command.
--model M --task N: checkpoint M's own drafter (no simulation) on N held-out task prompts, one request
at a time (batch 1), greedy until end-of-sentence: plain decode vs DSpark, tokens/s and the measured
accept length (the same tokens either way).
"""

from __future__ import annotations

import argparse
import datetime
import shlex
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "python"), str(ROOT / "sgl-kernel")]

from sglang_dsv41.numerics import NumericsPolicy, apply_numerics  # noqa: E402
from sglang_dsv41.runtime.driver import Driver, random_prompts  # noqa: E402
from sglang_dsv41.runtime.kernels import kernel_table  # noqa: E402
from sglang_dsv41.runtime.speculative import SpecDecoder  # noqa: E402
from sglang_dsv41.tiny import random_model  # noqa: E402

LOG: list[str] = []


def say(text: str = "") -> None:
    print(text, flush=True)
    LOG.append(text)


def plain(model, table, dev, prompts, new, page, graphs: bool) -> tuple[float, float]:
    """-> (decode tokens/s, ms per step); one untimed run first (kernel compiles, graph capture)."""
    tokens = len(prompts) * (len(prompts[0]) + new + 8) + len(prompts) * page
    drv = Driver(model, tokens, len(prompts), page, dev, ops=table, graphs=graphs)
    drv.generate(prompts, 4)
    _, st = drv.generate(prompts, new)
    return st["decode_tok_s"], 1000 * st["decode_s"] / max(new - 1, 1)


def spec(model, table, dev, prompts, new, page, accept: float, graphs: bool) -> tuple[float, float, float]:
    """-> (decode tokens/s, ms per step, measured accept length); one untimed run first."""
    g = model.cfg.dspark.block_size
    tokens = len(prompts) * (len(prompts[0]) + new + 2 * (g + 1) + 8) + 2 * len(prompts) * page
    drv = Driver(model, tokens, len(prompts), page, dev, ops=table, speculative=True)
    dec = SpecDecoder(drv, graphs=graphs)
    dec.generate(prompts, 8, simulate_accept=accept)
    out, st = dec.generate(prompts, new, simulate_accept=accept)
    steps = st.verifies / len(prompts)
    return st.committed / st.decode_s, 1000 * st.decode_s / max(steps, 1), st.accept_length


def task_rows(a, dev) -> None:
    """The trained drafter of `a.model` on held-out task prompts, batch 1, greedy, until EOS."""
    from sglang_dsv41.checkpoint.loader import load_model
    from sglang_dsv41.train import task
    from sglang_dsv41.train.dspark import sample_problems

    model = load_model(a.model, device=dev, progress=False)
    table = kernel_table(dev)
    apply_numerics(model, NumericsPolicy.kernels(table))
    renderer = task.ChatRenderer(a.model)
    prompts = [renderer.prompt(p.question) for p in sample_problems({1: 1, 2: 4}, a.task, "test", seed=2)]
    eos = renderer.eos_id
    plain_drv = Driver(model, 4096, 1, 64, dev, ops=table, graphs=dev == "cuda")
    spec_drv = Driver(model, 4096, 1, 64, dev, ops=table, speculative=True)
    dec = SpecDecoder(spec_drv, graphs=dev == "cuda")
    t_plain = t_spec = 0.0
    n_plain = n_spec = verifies = same = 0
    for p in prompts:
        _, st = plain_drv.generate([p], 24)  # plain decode has no EOS stop: time per token
        t_plain += st["decode_s"]
        n_plain += 23
        new, ss = dec.generate([p], 24, eos=(eos,))
        ref, _ = plain_drv.generate([p], len(new[0]))
        same += ref[0] == new[0]
        t_spec += ss.decode_s
        n_spec += ss.committed
        verifies += ss.verifies
    say(f"`{a.model}` ({model.cfg.dspark.n_stages}-stage drafter, gamma {model.cfg.dspark.block_size}), "
        f"{a.task} held-out task prompts (levels 1:1, 2:4, test split), one request at a time, greedy; DSpark "
        f"until end-of-sentence, plain decode timed per token over 23 steps.\n")
    say("| plain tok/s | DSpark tok/s | DSpark / plain | accept length (of gamma + 1) | DSpark tokens == plain |")
    say("|---|---|---|---|---|")
    say(f"| {n_plain / t_plain:,.1f} | {n_spec / t_spec:,.1f} | {(n_spec / t_spec) / (n_plain / t_plain):.2f}x | "
        f"{n_spec / max(verifies, 1):.2f} | {same} of {len(prompts)} |")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="bench")
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--prompt-len", type=int, default=1024)
    ap.add_argument("--decode", type=int, default=48)
    ap.add_argument("--page-size", type=int, default=256)
    ap.add_argument("--simulate-accept-len", type=float, default=3.0)
    ap.add_argument("--results-dir", default=str(ROOT / "benchmark" / "results"))
    ap.add_argument("--model", help="a checkpoint with a trained drafter (with --task)")
    ap.add_argument("--task", type=int, default=0, help="held-out task prompts for --model's own drafter")
    a = ap.parse_args(argv)
    if not 1.0 <= a.simulate_accept_len <= 6.0 or a.decode < 2 or a.prompt_len < 1 or a.task < 0:
        ap.error("--simulate-accept-len must be in 1 .. gamma + 1, --decode >= 2, --prompt-len >= 1, --task >= 0")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    name = torch.cuda.get_device_name() if dev == "cuda" else "cpu"
    day = datetime.date.today().isoformat()
    if a.task:
        if not a.model:
            ap.error("--task needs --model (a checkpoint with a trained drafter)")
        say(f"## {day} {name}, torch {torch.__version__}, {torch.get_num_threads()} threads\n"
            f"`python {' '.join(shlex.quote(x) for x in sys.argv)}`\n")
        task_rows(a, dev)
        out = Path(a.results_dir) / f"{day}-{'h200' if 'H200' in name else dev}-dspark-default.md"
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("a") as f:
            f.write("\n" + "\n".join(LOG) + "\n")
        return
    model = random_model(a.preset, Path("/tmp/dsv41-bench") / f"{a.preset}-mem", dev, fast=True)
    table = kernel_table(dev)
    apply_numerics(model, NumericsPolicy.kernels(table))
    cmd = "python " + " ".join(shlex.quote(x) for x in sys.argv)
    ds = model.cfg.dspark
    say(f"## {day} {name}, torch {torch.__version__}"
        + (f", triton {__import__('triton').__version__}" if dev == "cuda" else "") + f"\n`{cmd}`\n")
    say(f"`{a.preset}` preset (random weights), drafter: {ds.n_stages} stages, gamma {ds.block_size}; "
        f"prompts {a.prompt_len} tokens, {a.decode} new tokens per request; simulated accept length "
        f"{a.simulate_accept_len} (committed tokens per verify, bonus included).\n")
    say("| batch | plain graph tok/s | plain graph ms/step | plain eager tok/s | DSpark graph tok/s | DSpark graph "
        "ms/step | DSpark eager tok/s | accept len | DSpark graph / plain graph | DSpark graph step / plain graph step "
        "| DSpark eager / plain eager |")
    say("|---|---|---|---|---|---|---|---|---|---|---|")
    cuda = dev == "cuda"
    for b in [int(x) for x in a.batches.split(",")]:
        prompts = random_prompts(model.cfg.vocab_size, b, a.prompt_len, seed=b)
        t0 = time.perf_counter()
        g_tps, g_ms = plain(model, table, dev, prompts, a.decode, a.page_size, graphs=cuda)
        e_tps, _ = plain(model, table, dev, prompts, a.decode, a.page_size, graphs=False)
        sg_tps, sg_ms, acc = spec(model, table, dev, prompts, a.decode, a.page_size, a.simulate_accept_len, graphs=cuda)
        se_tps, _, _ = spec(model, table, dev, prompts, a.decode, a.page_size, a.simulate_accept_len, graphs=False)
        say(f"| {b} | {g_tps:,.0f} | {g_ms:.2f} | {e_tps:,.0f} | {sg_tps:,.0f} | {sg_ms:.2f} | {se_tps:,.0f} | {acc:.2f} | "
            f"{sg_tps / g_tps:.2f}x | {sg_ms / g_ms:.2f}x | {se_tps / e_tps:.2f}x |")
        print(f"  (batch {b}: {time.perf_counter() - t0:.0f} s)", flush=True)
    out = Path(a.results_dir) / f"{day}-{'h200' if 'H200' in name else dev}-dspark.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a") as f:
        f.write("\n" + "\n".join(LOG) + "\n")


if __name__ == "__main__":
    main()
