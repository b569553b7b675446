"""DSPARK through SGLang's real server: the embedded default's trained drafter on held-out task prompts.

    python benchmark/dspark_server_bench.py [--model deepseek-v4.1-tiny] [--prompts 40] [--max-new 24] \\
        [--results-dir DIR]

Starts `python -m sglang.launch_server --model M` twice on this machine, without and with
`--speculative-algorithm DSPARK`, and sends the same --prompts held-out arithmetic questions (the
task the model was trained on, rendered as chat requests) one at a time (batch 1), greedy, until
end-of-sentence or --max-new tokens. Per server: tokens/s = completion tokens / summed request
latency (SGLang's `e2e_latency`, prefill included); with DSPARK the accept length is SGLang's own
(completion tokens / verifies, from `meta_info`) and the accept rate by draft position is counted
from `spec_correct_drafts_histogram`. Printed and written to <results-dir>/<date>-<device>-dspark-server.md.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(model: str, extra: list[str], log: Path):
    port = _port()
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model", model, "--port", str(port), *extra]
    proc = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        if proc.poll() is not None:
            raise SystemExit(f"server exited ({proc.returncode}); log: {log}")
        try:
            if requests.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except requests.RequestException:
            pass
        time.sleep(1)
    os.killpg(proc.pid, signal.SIGKILL)
    raise SystemExit(f"server not healthy after 600 s; log: {log}")


def run(url: str, prompts: list[list[int]], max_new: int) -> list[dict]:
    out = []
    for ids in prompts:
        body = {"input_ids": ids, "sampling_params": {"max_new_tokens": max_new, "temperature": 0}}
        r = requests.post(url + "/generate", json=body, timeout=600)
        r.raise_for_status()
        out.append(r.json())
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="deepseek-v4.1-tiny")
    ap.add_argument("--prompts", type=int, default=40)
    ap.add_argument("--max-new", type=int, default=24)
    ap.add_argument("--results-dir", default=str(ROOT / "benchmark" / "results"))
    a = ap.parse_args(argv)
    if a.prompts < 1 or a.max_new < 2:
        ap.error(f"--prompts must be >= 1 and --max-new >= 2, got {a.prompts} and {a.max_new}")
    import sglang
    import torch

    from sglang_dsv41.config import ModelConfig
    from sglang_dsv41.embedded import resolve_model_path
    from sglang_dsv41.train.dspark import sample_problems
    from sglang_dsv41.train.task import ChatRenderer

    ds = ModelConfig.from_pretrained(resolve_model_path(a.model)).dspark
    if ds is None:
        ap.error(f"--model {a.model}: the checkpoint has no DSpark drafter")
    renderer = ChatRenderer(a.model)
    prompts = [renderer.prompt(p.question) for p in sample_problems({1: 1, 2: 4}, a.prompts, "test", seed=1)]
    logs = Path(tempfile.mkdtemp(prefix="dspark-server-"))
    results = {}
    for name, extra in (("plain", []), ("DSPARK", ["--speculative-algorithm", "DSPARK"])):
        proc, url = serve(a.model, extra, logs / f"dspark-server-{name}.log")
        try:
            run(url, prompts[:2], a.max_new)  # warm-up
            results[name] = run(url, prompts, a.max_new)
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
    rows = []
    for name, outs in results.items():
        tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
        secs = sum(o["meta_info"]["e2e_latency"] for o in outs)
        rows.append((name, tokens, secs, tokens / secs))
    spec = results["DSPARK"]
    verifies = sum(o["meta_info"]["spec_verify_ct"] for o in spec)
    accept = sum(o["meta_info"]["completion_tokens"] for o in spec) / verifies
    hist = [0] * (ds.block_size + 1)
    for o in spec:
        for k, n in enumerate(o["meta_info"].get("spec_correct_drafts_histogram") or []):
            hist[k] += n
    by_pos = [sum(hist[k:]) / max(sum(hist), 1) for k in range(1, ds.block_size + 1)]
    same = sum(p["output_ids"] == s["output_ids"] for p, s in zip(results["plain"], spec))

    device = f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"
    lines = [f"# DSPARK through the SGLang server: {a.model}, batch 1, greedy", "",
             f"- date: {datetime.date.today()}; device: {device}",
             f"- versions: sglang {sglang.__version__}, torch {torch.__version__}, python {platform.python_version()}",
             f"- command: `python {shlex.join(['benchmark/dspark_server_bench.py', *(argv or sys.argv[1:])])}`",
             f"- {a.prompts} held-out task prompts (test split, levels 1:1, 2:4), one request at a time, up to "
             f"{a.max_new} new tokens or end-of-sentence; gamma {ds.block_size}, {ds.n_stages} drafter stage(s)", "",
             "| server | completion tokens | summed latency (s) | tokens/s | vs plain |", "|---|---|---|---|---|"]
    base = rows[0][3]
    lines += [f"| {n} | {t} | {s:.2f} | {r:.1f} | {r / base:.2f}x |" for n, t, s, r in rows]
    decoded = sum(o["meta_info"]["completion_tokens"] - 1 for o in spec)  # the prefill samples the first token
    lines += ["", f"- accept length (SGLang's: completion tokens / verifies, the prefill's token included): {accept:.2f} "
              f"of {ds.block_size + 1} ({verifies} verifies)",
              f"- tokens per verify (the prefill's token not counted; EOS cuts the last block): "
              f"{decoded / verifies:.2f}",
              "- accept rate by draft position (verifies whose draft k was accepted): "
              + ", ".join(f"{k + 1}: {r:.2f}" for k, r in enumerate(by_pos)),
              f"- outputs identical to the plain server's: {same} of {a.prompts}"]
    text = "\n".join(lines) + "\n"
    print(text)
    out = Path(a.results_dir) / f"{datetime.date.today()}-cpu-dspark-server.md"
    out.write_text(text)
    print(f"written to {out}")


if __name__ == "__main__":
    main()
