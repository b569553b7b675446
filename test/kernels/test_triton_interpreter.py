"""CPU: the Triton kernels run through Triton's interpreter (TRITON_INTERPRET=1, one subprocess, ~15 s)
on small cases and must match their torch twins (oracle) with the GPU tolerance table."""

from __future__ import annotations

from pathlib import Path

import pytest

from check_runner import run_script

pytest.importorskip("triton")


@pytest.mark.interp
def test_triton_kernels_under_interpreter():
    run_script(Path(__file__).with_name("interp_check.py"), timeout=300)
