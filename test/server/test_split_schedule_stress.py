"""The split-schedule stress run (benchmark/split_schedule_mismatch.py) in a budget-limited form: its own
SGLang server on the tiny checkpoint, pairs of one prompt sent 0-0.2 s apart with varying lengths and
aborts for 90 s, every sampled token's server logprob equal to the trainer's (exit status 0). Before
the 64-key-tile fix (docs/rl.md, "Split schedules") about 1 response in 40 differed. A subprocess,
since the script sets the deterministic-mode environment for itself."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_split_schedules_serve_the_trainers_logprobs(tiny_dir, tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmark" / "split_schedule_mismatch.py"), "--model", str(tiny_dir),
                           "--pairs", "400", "--budget-s", "90", "--log", str(tmp_path / "server.log")],
                          capture_output=True, text=True, timeout=900, env={**os.environ})
    out = proc.stdout + proc.stderr
    row = re.search(r"^\| all \| (\d+) \| (\d+) \| (\d+) \|", proc.stdout, re.M)
    assert row, out[-3000:]
    responses, tokens, differing = map(int, row.groups())
    assert responses >= 20 and tokens >= responses, out[-3000:]
    assert differing == 0 and proc.returncode == 0, "\n".join(ln for ln in out.splitlines() if ln.startswith("MISMATCH"))
