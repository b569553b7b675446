"""DSpark decode speed on the standalone driver: plain decode vs speculative decode, side by side in
one run, with a simulated acceptance (random-weight presets accept almost nothing: the commit takes
a fixed schedule of accept lengths with the given mean, runtime/speculative.py `simulate_accept`).

    python benchmark/dspark_bench.py --preset bench --batches 1,8,64 --prompt-len 1024 --decode 48 \\
        --simulate-accept-len 3.0 [--results-dir DIR]

Per batch size B: B random prompts of --prompt-len tokens prefilled, then --decode new tokens each by
  plain, graph    the driver's decode with one CUDA graph per batch size (today's serving path)
  plain, eager    the same steps without graphs
  DSpark, eager   draft (gamma rows per request) + verify (gamma + 1 rows) + commit per step, no graphs
tokens/s = B x decoded tokens / decode time; "step" = decode time / steps (a DSpark step commits
--simulate-accept-len tokens per request on average). The speculative steps are not graph-captured
in this version: the ratio to "plain, graph" is what a user gets, the ratio to "plain, eager" the
algorithmic gain. Printed and appended to <results-dir>/<date>-<device>-dspark.md with the command.
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


def spec(model, table, dev, prompts, new, page, accept: float) -> tuple[float, float, float]:
    """-> (decode tokens/s, ms per step, measured accept length)."""
    g = model.cfg.dspark.block_size
    tokens = len(prompts) * (len(prompts[0]) + new + 2 * (g + 1) + 8) + len(prompts) * page
    drv = Driver(model, tokens, len(prompts), page, dev, ops=table, speculative=True)
    dec = SpecDecoder(drv)
    dec.generate(prompts, 8, simulate_accept=accept)
    out, st = dec.generate(prompts, new, simulate_accept=accept)
    steps = st.verifies / len(prompts)
    return st.committed / st.decode_s, 1000 * st.decode_s / max(steps, 1), st.accept_length


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="bench")
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--prompt-len", type=int, default=1024)
    ap.add_argument("--decode", type=int, default=48)
    ap.add_argument("--page-size", type=int, default=256)
    ap.add_argument("--simulate-accept-len", type=float, default=3.0)
    ap.add_argument("--results-dir", default=str(ROOT / "benchmark" / "results"))
    a = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    name = torch.cuda.get_device_name() if dev == "cuda" else "cpu"
    model = random_model(a.preset, Path("/tmp/dsv41-bench") / f"{a.preset}-mem", dev, fast=True)
    table = kernel_table(dev)
    apply_numerics(model, NumericsPolicy.kernels(table))
    day = datetime.date.today().isoformat()
    cmd = "python " + " ".join(shlex.quote(x) for x in sys.argv)
    ds = model.cfg.dspark
    say(f"## {day} {name}, torch {torch.__version__}"
        + (f", triton {__import__('triton').__version__}" if dev == "cuda" else "") + f"\n`{cmd}`\n")
    say(f"`{a.preset}` preset (random weights), drafter: {ds.n_stages} stages, gamma {ds.block_size}; "
        f"prompts {a.prompt_len} tokens, {a.decode} new tokens per request; simulated accept length "
        f"{a.simulate_accept_len} (committed tokens per verify, bonus included).\n")
    say("| batch | plain graph tok/s | plain graph ms/step | plain eager tok/s | DSpark eager tok/s | DSpark ms/step "
        "| accept len | DSpark / plain graph | DSpark / plain eager | DSpark step / plain graph step |")
    say("|---|---|---|---|---|---|---|---|---|---|")
    for b in [int(x) for x in a.batches.split(",")]:
        prompts = random_prompts(model.cfg.vocab_size, b, a.prompt_len, seed=b)
        t0 = time.perf_counter()
        g_tps, g_ms = plain(model, table, dev, prompts, a.decode, a.page_size, graphs=dev == "cuda")
        e_tps, _ = plain(model, table, dev, prompts, a.decode, a.page_size, graphs=False)
        s_tps, s_ms, acc = spec(model, table, dev, prompts, a.decode, a.page_size, a.simulate_accept_len)
        say(f"| {b} | {g_tps:,.0f} | {g_ms:.2f} | {e_tps:,.0f} | {s_tps:,.0f} | {s_ms:.2f} | {acc:.2f} | "
            f"{s_tps / g_tps:.2f}x | {s_tps / e_tps:.2f}x | {s_ms / g_ms:.2f}x |")
        print(f"  (batch {b}: {time.perf_counter() - t0:.0f} s)", flush=True)
    out = Path(a.results_dir) / f"{day}-{'h200' if 'H200' in name else dev}-dspark.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a") as f:
        f.write("\n" + "\n".join(LOG) + "\n")


if __name__ == "__main__":
    main()
