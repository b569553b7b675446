"""Train/serve mismatch under split schedules: one SGLang server (CPU, tiny model), pairs of
same-prompt requests sent a random 0-0.2 s apart (so SGLang prefills them together or the second
while the first decodes, usually with a radix-cache hit on the first's prompt), varying prompt and
response lengths, and now and then a third request on the same prompt that is aborted mid-decode.
Every returned logprob (sampled at temperature 1, logprobs of the raw distribution) is compared
with the trainer's (`train.logprobs.response_logprobs`, the one forward over a dense KV), scored
after the server has stopped: the expected mismatch is exactly 0 on every token.

    python benchmark/split_schedule_mismatch.py --pairs 260 [--model DIR] [--seed 0] [--budget-s S]
        [--results benchmark/results/DATE-cpu-split-schedule-mismatch.md] [-- EXTRA SERVER ARGS]

Exit status 1 when any logprob differs (test/server/test_split_schedule_stress.py runs a
budget-limited form in the suite).

Server: `python -m sglang.launch_server --rl-on-policy-target sglang_dsv41` (the RL test server's flag,
docs/rl.md); this process runs SGLANG_DSV41_DETERMINISTIC=1 and MKL_CBWR=COMPATIBLE, as the flag sets them
in the server. Every request has its own `sampling_seed` (deterministic sampling draws from the seed, so
unseeded requests of one prompt would all give the same response). `--model` defaults to a fresh `tiny`
checkpoint (seed 0). The table counts responses, tokens, responses with
any differing logprob and the largest |d|, per schedule class read from the server log ("split":
some prefill of the pair ran while another request was decoding).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import random
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "python"), str(ROOT / "sgl-kernel"), str(ROOT / "test" / "server")]
os.environ.setdefault("ATEN_CPU_CAPABILITY", "default")  # the CPU kernels the server uses
os.environ.setdefault("MKL_CBWR", "COMPATIBLE")  # the same MKL code path in both processes (docs/rl.md)
os.environ["SGLANG_DSV41_DETERMINISTIC"] = "1"

from launch import start_server, stop_server  # noqa: E402  (test/server/launch.py: one real SGLang server)
import requests  # noqa: E402
import torch  # noqa: E402

SERVER_FLAGS = ["--rl-on-policy-target", "sglang_dsv41"]


@dataclass
class Response:
    pair: int
    prompt: list[int]
    response: list[int]
    logprobs: list[float]
    finish: str
    aborted_peer: bool
    rid: str = ""
    split: bool = False
    diffs: list[float] = field(default_factory=list)


def generate(url: str, prompt: list[int], max_new: int, rid: str, seed: int, out: dict) -> None:
    body = {"input_ids": prompt, "rid": rid, "return_logprob": True,
            "sampling_params": {"max_new_tokens": max_new, "temperature": 1.0, "ignore_eos": True,
                                "sampling_seed": seed}}
    r = requests.post(url + "/generate", json=body, timeout=600)
    out[rid] = (r.status_code, r.json() if r.headers.get("content-type", "").startswith("application/json") else r.text)


def run_pair(url: str, i: int, prompt: list[int], news: tuple[int, int], delay: float, abort_after: float | None):
    """Two requests of `prompt` `delay` s apart (and, with `abort_after`, a third one aborted that
    long after the first) -> their (rid, status, body)."""
    out: dict = {}
    rids = [f"p{i}-a", f"p{i}-b"]
    threads = [threading.Thread(target=generate, args=(url, prompt, news[0], rids[0], 3 * i, out))]
    threads[0].start()
    time.sleep(delay)
    threads.append(threading.Thread(target=generate, args=(url, prompt, news[1], rids[1], 3 * i + 1, out)))
    threads[-1].start()
    if abort_after is not None:
        rid = f"p{i}-x"
        threads.append(threading.Thread(target=generate, args=(url, prompt, 64, rid, 3 * i + 2, out)))
        threads[-1].start()
        time.sleep(abort_after)
        requests.post(url + "/abort_request", json={"rid": rid}, timeout=60)
    for t in threads:
        t.join()
    return out


def collect(out: dict, i: int, prompt: list[int], aborted_peer: bool) -> list[Response]:
    got = []
    for rid in (f"p{i}-a", f"p{i}-b"):
        status, body = out[rid]
        if status != 200:
            raise SystemExit(f"request {rid}: HTTP {status}: {str(body)[:300]}")
        meta = body["meta_info"]
        lps = meta["output_token_logprobs"]
        got.append(Response(i, prompt, [int(t) for t in body["output_ids"]], [float(x[0]) for x in lps],
                            (meta.get("finish_reason") or {}).get("type", "?"), aborted_peer, rid))
    return got


def run_pairs(url: str, vocab: int, log: Path, a) -> list[Response]:
    """Send the pairs (stopping early once `a.budget_s` seconds have passed); scoring waits until the
    server is stopped (`score`), so the trainer's forward does not compete with it for the cores."""
    from sglang_dsv41.train.mismatch import random_prompts

    rng = random.Random(a.seed)
    responses: list[Response] = []
    t0 = time.monotonic()
    for i in range(a.pairs):
        if a.budget_s and time.monotonic() - t0 > a.budget_s:
            break
        plen = rng.randint(4, 20)
        prompt = random_prompts(1, plen, vocab, seed=a.seed * 100003 + i)[0]
        news = (rng.randint(2, 12), rng.randint(2, 12))
        delay = rng.uniform(0.0, a.max_delay)
        abort_after = rng.uniform(0.0, 0.3) if a.abort_every and i % a.abort_every == a.abort_every - 1 else None
        before = log.stat().st_size
        out = run_pair(url, i, prompt, news, delay, abort_after)
        seg = log.read_text(errors="replace")[before:]
        split = any("Prefill batch" in ln and "#running-req: 0," not in ln for ln in seg.splitlines())
        got = collect(out, i, prompt, abort_after is not None)
        for r in got:
            r.split = split
        responses.extend(got)
        print(f"pair {i}: prompt {plen}, new {news}, delay {delay:.3f} s, abort {abort_after is not None}, split {split}", flush=True)
    return responses


def score(model, responses: list[Response]) -> None:
    """Each response's logprobs minus the trainer's (`response_logprobs`, the one dense forward)."""
    from sglang_dsv41.train.logprobs import response_logprobs

    with torch.no_grad():
        for r in responses:
            lp = response_logprobs(model, r.prompt, r.response)[0]
            r.diffs = (lp.double() - torch.tensor(r.logprobs, dtype=torch.float64)).tolist()


def main(argv: list[str] | None = None) -> int:
    """-> exit status: 1 when any response has a differing logprob."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="checkpoint directory (default: a fresh tiny checkpoint, seed 0)")
    p.add_argument("--pairs", type=int, default=260)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-delay", type=float, default=0.2)
    p.add_argument("--abort-every", type=int, default=5, help="every k-th pair also sends an aborted request")
    p.add_argument("--budget-s", type=float, default=0.0, help="stop sending pairs after this many seconds (0: no limit)")
    p.add_argument("--results", default=None, help="markdown file to write the table and the run facts to")
    p.add_argument("--log", default=None, help="server log path (default: a temporary file)")
    p.add_argument("server_args", nargs="*", help="extra server flags (after --)")
    a = p.parse_args(argv)

    from sglang_dsv41.checkpoint.loader import load_model

    tmp = Path(tempfile.mkdtemp(prefix="split_mismatch_"))
    model_dir = a.model
    if model_dir is None:
        from sglang_dsv41.tiny import write_tiny_checkpoint

        model_dir = str(write_tiny_checkpoint(tmp / "tiny", "tiny", seed=0))
    log = Path(a.log) if a.log else tmp / "server.log"
    t_start = time.monotonic()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that `finally` stops the server
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT / "python"), str(ROOT / "sgl-kernel"),
                                          os.environ.get("PYTHONPATH", "")])}
    server = start_server(model_dir, log, *SERVER_FLAGS, *a.server_args, env=env)
    model = load_model(model_dir, progress=False)
    try:
        responses = run_pairs(server.url, model.cfg.vocab_size, log, a)
    finally:
        stop_server(server.proc)
    score(model, responses)
    wall = time.monotonic() - t_start
    bad = [r for r in responses if any(d != 0 for d in r.diffs)]
    for r in bad:
        print(f"MISMATCH pair {r.pair} ({r.rid}): prompt {len(r.prompt)}, response {len(r.response)}, split {r.split}, "
              f"finish {r.finish}, diffs {[f'{d:.3g}' for d in r.diffs]}")
    rows = []
    for name, sel in (("split", lambda r: r.split), ("together", lambda r: not r.split), ("all", lambda r: True)):
        rs = [r for r in responses if sel(r)]
        nb = [r for r in rs if r in bad]
        dmax = max((abs(d) for r in rs for d in r.diffs), default=0.0)
        rows.append((name, len(rs), sum(len(r.response) for r in rs), len(nb), dmax))
    table = ["| schedule | responses | tokens | responses with a differing logprob | max abs dlogp |",
             "|---|---|---|---|---|"] + [f"| {n} | {c} | {t} | {b} | {d:.3g} |" for n, c, t, b, d in rows]
    print("\n".join(table))
    if a.results:
        write_results(Path(a.results), table, a, len(responses) // 2, wall, argv)
    return 1 if bad else 0


def write_results(path: Path, table: list[str], a, pairs: int, wall: float, argv) -> None:
    import sglang

    cpu = next((ln.split(":", 1)[1].strip() for ln in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
                if ln.startswith("Model name")), platform.processor())
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    cmd = "python benchmark/split_schedule_mismatch.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    text = [f"# Train/serve mismatch under split schedules, {datetime.date.today().isoformat()}", "",
            f"- command: `{cmd}`",
            f"- device: {cpu}, {os.cpu_count()} cores (CPU server, torch threads at their default)",
            f"- versions: torch {torch.__version__}, sglang {sglang.__version__}, code at commit {commit}",
            f"- pairs sent: {pairs} of {a.pairs} (seed {a.seed}; budget {a.budget_s or 'none'} s), delays uniform in [0, {a.max_delay}] s, every {a.abort_every}th pair "
            f"with a third request on the prompt aborted 0-0.3 s in; wall time {wall:.0f} s", "", *table, ""]
    path.write_text("\n".join(text))
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
