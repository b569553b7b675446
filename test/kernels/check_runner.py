"""Interpreter scripts: `run_checks` runs a script's named checks (one 'PASS name' / 'FAIL name: reason'
line each); `run_script` runs a script under TRITON_INTERPRET=1 in a subprocess from a pytest test and
asserts on those lines."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Callable, Iterable


def run_checks(checks: Iterable[tuple[str, Callable[[], None]]]) -> int:
    """Run every check (a failure does not stop the others) -> exit code: 1 if any failed, else 0."""
    bad = 0
    for name, fn in checks:
        try:
            fn()
            print(f"PASS {name}", flush=True)
        except Exception as e:  # noqa: BLE001 - report every case
            bad += 1
            print(f"FAIL {name}: {type(e).__name__}: {str(e)[:300]}", flush=True)
    return 1 if bad else 0


def run_script(script: Path, expected: int | None = None, timeout: int = 600, pin_cpu_kernels: bool = False) -> None:
    """Run `script` under Triton's interpreter; assert it printed `expected` PASS / FAIL lines (any number
    > 0 when None) and none FAIL. pin_cpu_kernels: ATEN_CPU_CAPABILITY=default, for scripts whose oracle
    uses torch's CPU transcendental functions (the interpreter runs the same ones)."""
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONWARNINGS="ignore")
    if pin_cpu_kernels:
        env["ATEN_CPU_CAPABILITY"] = "default"
    res = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=timeout)
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith(("PASS", "FAIL"))]
    assert lines and (expected is None or len(lines) == expected), res.stdout[-2000:] + res.stderr[-2000:]
    fails = [ln for ln in lines if ln.startswith("FAIL")]
    assert not fails and res.returncode == 0, "\n".join(fails) or res.stderr[-2000:]
