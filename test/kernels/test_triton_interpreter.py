"""CPU: the Triton kernels run through Triton's interpreter (TRITON_INTERPRET=1, one subprocess, ~15 s)
on small cases and must match their torch twins (oracle) with the GPU tolerance table."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")


@pytest.mark.interp
def test_triton_kernels_under_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONWARNINGS="ignore")
    script = Path(__file__).with_name("interp_check.py")
    res = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith(("PASS", "FAIL"))]
    assert lines, res.stderr[-2000:]
    fails = [ln for ln in lines if ln.startswith("FAIL")]
    assert not fails and res.returncode == 0, "\n".join(fails) or res.stderr[-2000:]
