"""SWA bounded replay (spec attention 7): quality and speed, each mode on vs off, side by side.

    python benchmark/swa_replay.py quality --preset small --lens 512,2048,8192 --prompts 2 --gen 64
    python benchmark/swa_replay.py speed --preset release --prompts 8 --prompt-len 8192
    python benchmark/swa_replay.py ttft --preset release --cached 8192 --new 256

quality: greedy generation with full prefill gives the reference tokens; the replay run is teacher-
    forced on them, so every generated position compares the same context. Per position:
    KL(full || replay) of the next-token distribution and greedy agreement (argmax equal).
      decoder  the prompt prefilled tail-only (`--decoder-replay`), then decode
      encoder  a prefix hit: an earlier request cached the prompt's first pages, the hit request
               rebuilds its window from the last 128 cached tokens (request rings) and prefills the
               rest, vs a cold full prefill of the same text
speed: prefill throughput of `prompts x prompt-len` with decoder replay off / on (warm, after one
    untimed run); ttft: time to first token of a prefix hit (`cached` tokens cached + `new` tokens),
    window KV kept per token slot (exact hit) vs encoder replay (rings + 128 recomputed tokens).
Each command appends a markdown table with date, device, versions and command to
benchmark/results/<date>-<device>-swa-replay.md.
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

from sglang_dsv41.checkpoint.loader import load_model  # noqa: E402
from sglang_dsv41.runtime.driver import Driver, Sequence, random_prompts  # noqa: E402
from sglang_dsv41.numerics import NumericsPolicy, apply_numerics  # noqa: E402
from sglang_dsv41.runtime.kernels import kernel_table  # noqa: E402
from sglang_dsv41.tiny import random_model  # noqa: E402

PAGE = 64


def build(a):
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if a.model:
        model = load_model(a.model, device=dev, progress=False)
    else:
        model = random_model(a.preset, Path("/tmp/dsv41-bench") / f"{a.preset}-mem", dev, fast=a.preset in ("bench", "release"))
    table = kernel_table(dev)
    apply_numerics(model, NumericsPolicy.kernels(table))
    return model, table, dev


def driver(model, table, dev, tokens, n, **modes) -> Driver:
    return Driver(model, n * tokens + 4 * PAGE * n, n + 1, PAGE, dev, ops=table, **modes)


def sync(dev):
    if dev == "cuda":
        torch.cuda.synchronize()


def run_trace(drv: Driver, seqs, gen: int, chunk: int, teacher=None):
    trace: list = []
    new, _ = drv.run(seqs, gen, chunk, teacher=teacher, trace=trace)
    # per request: logits of the step that sampled each generated token (prefill's last row, then decodes)
    rows = {s.req_slot: [] for s in seqs}
    for st in trace:
        for slot, row in zip(st.req_slots, st.logits):
            rows[slot].append(row)
    per_req = [torch.stack(rows[s.req_slot][-gen:]) for s in seqs]
    return new, per_req


def compare(full: list[torch.Tensor], rep: list[torch.Tensor], toks: list[list[int]]):
    kl, agree = [], []
    for f, r, t in zip(full, rep, toks):
        lf, lr = torch.log_softmax(f.double(), -1), torch.log_softmax(r.double(), -1)
        kl.append((lf.exp() * (lf - lr)).sum(-1))
        agree.append((r.argmax(-1) == torch.tensor(t)).double())
    kl, agree = torch.cat(kl), torch.cat(agree)
    return {"kl_mean": kl.mean().item(), "kl_p99": torch.quantile(kl, 0.99).item(), "kl_max": kl.max().item(),
            "agree": agree.mean().item(), "n": kl.numel()}


def quality(a, model, table, dev) -> list[str]:
    rows = []
    for L in [int(x) for x in a.lens.split(",")]:
        prompts = random_prompts(model.cfg.vocab_size, a.prompts, L, a.seed)
        n = len(prompts)
        cold = driver(model, table, dev, L + a.gen, n)
        seqs = [Sequence(i, list(p), L) for i, p in enumerate(prompts)]
        toks, full = run_trace(cold, seqs, a.gen, a.chunk)
        teacher = {i: t for i, t in enumerate(toks)}
        dec = driver(model, table, dev, L + a.gen, n, decoder_replay=True)
        _, rep = run_trace(dec, [Sequence(i, list(p), L) for i, p in enumerate(prompts)], a.gen, a.chunk, teacher)
        rows.append(("decoder", L, compare(full, rep, toks)))
        # encoder: an earlier request caches all but the last 256 prompt tokens (whole pages)
        enc = driver(model, table, dev, 2 * (L + a.gen), 2 * n, encoder_replay=True)
        cached = (L - 256) // PAGE * PAGE
        srcs = [Sequence(n + i, list(p[:cached]), cached) for i, p in enumerate(prompts)]
        enc.run(srcs, 1, a.chunk, release=False)
        hits = [enc.fork(s, i, p[cached:]) for i, (s, p) in enumerate(zip(srcs, prompts))]
        _, rep = run_trace(enc, hits, a.gen, a.chunk, teacher)
        rows.append(("encoder (hit of %d)" % cached, L, compare(full, rep, toks)))
    head = ("| mode | prompt tokens | positions | KL mean | KL p99 | KL max | greedy agreement |\n"
            "|---|---|---|---|---|---|---|")
    body = [f"| {m} | {L} | {r['n']} | {r['kl_mean']:.3g} | {r['kl_p99']:.3g} | {r['kl_max']:.3g} | {r['agree']:.4f} |"
            for m, L, r in rows]
    return [f"quality, preset `{a.preset if not a.model else a.model}`, {a.prompts} prompts, {a.gen} generated tokens, "
            f"chunk {a.chunk}", "", head, *body]


def speed(a, model, table, dev) -> list[str]:
    prompts = random_prompts(model.cfg.vocab_size, a.prompts, a.prompt_len, a.seed)
    out = {}
    for on in (False, True):
        drv = driver(model, table, dev, a.prompt_len + 2, a.prompts, decoder_replay=on)
        drv.generate(prompts, 1, a.chunk)  # untimed: Triton JIT
        sync(dev)
        _, st = drv.generate(prompts, 1, a.chunk)
        out[on] = st["prefill_s"]
        del drv
    tok = a.prompts * a.prompt_len
    head = "| decoder replay | prefill s | prefill tok/s |\n|---|---|---|"
    body = [f"| {'on' if on else 'off'} | {s:.2f} | {tok / s:,.0f} |" for on, s in out.items()]
    return [f"prefill speed, preset `{a.preset}`, {a.prompts} x {a.prompt_len} tokens, chunk {a.chunk}; "
            f"speedup on/off: {out[False] / out[True]:.2f}x", "", head, *body]


def ttft(a, model, table, dev) -> list[str]:
    p = random_prompts(model.cfg.vocab_size, 1, a.cached + a.new, a.seed)[0]
    out = {}
    for enc in (False, True):
        drv = driver(model, table, dev, 2 * (a.cached + a.new), 4, encoder_replay=enc)
        src = Sequence(0, p[: a.cached], a.cached)
        drv.run([src], 1, a.chunk, release=False)
        times = []
        for rep in range(3):  # the first is untimed (JIT for the hit shapes)
            hit = drv.fork(src, 1 + rep % 2, p[a.cached:])
            sync(dev)
            t0 = time.perf_counter()
            drv.step([hit], [hit.prefill_len - hit.cached])
            sync(dev)
            times.append(time.perf_counter() - t0)
            drv.release([hit])
        out[enc] = min(times[1:])
    head = "| window KV | hit rows computed | TTFT ms |\n|---|---|---|"
    body = [f"| {'request rings (encoder replay)' if e else 'per token slot (exact hit)'} | "
            f"{a.new + (128 if e else 0)} | {s * 1e3:.1f} |" for e, s in out.items()]
    return [f"prefix-hit TTFT, preset `{a.preset}`, {a.cached} cached + {a.new} new tokens; ratio rings/slots "
            f"{out[True] / out[False]:.2f}x", "", head, *body]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["quality", "speed", "ttft"])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--model", help="a checkpoint dir instead of a random preset (e.g. the trained tiny)")
    ap.add_argument("--lens", default="512,2048,8192")
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=8192)
    ap.add_argument("--cached", type=int, default=8192)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--chunk", type=int, default=8192)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--results-dir", default=str(ROOT / "benchmark" / "results"))
    a = ap.parse_args()
    model, table, dev = build(a)
    lines = {"quality": quality, "speed": speed, "ttft": ttft}[a.what](a, model, table, dev)
    print("\n".join(lines), flush=True)
    name = torch.cuda.get_device_name() if dev == "cuda" else "cpu"
    day = datetime.date.today().isoformat()
    out = Path(a.results_dir) / f"{day}-{'h200' if 'H200' in name else dev}-swa-replay.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = "python " + " ".join(shlex.quote(x) for x in sys.argv)
    with out.open("a") as f:
        f.write(f"\n## {day} {name}, torch {torch.__version__}\n`{cmd}`\n\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
