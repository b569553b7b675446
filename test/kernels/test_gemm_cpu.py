"""CPU: the GEMM kernels' MXFP8 activation quant (gemm_triton.mxfp8_quant_t) through Triton's
interpreter must give bitwise the bytes and scales of its oracle `sglang_dsv41.quant.mxfp8_quant`
(the GEMM itself runs through the interpreter in interp_check.py's grid). TRITON_INTERPRET must be
set before Triton decorates the kernels, hence a subprocess running this file as a script."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from check_runner import run_script

pytest.importorskip("triton")


def _check() -> int:
    import torch

    from dsv41_kernels.gemm_triton import mxfp8_quant_t
    from kernel_cases import gemm_rows
    from kernel_compare import assert_match
    from sglang_dsv41.quant import mxfp8_quant

    g = torch.Generator().manual_seed(3)
    bad = 0
    for m, k in ((1, 32), (7, 96), (70, 64), (9, 256)):
        x = gemm_rows(m, k, g, special=m >= 6, inf=m >= 6)  # zero, wide-range, huge, NaN, inf rows
        q, s = mxfp8_quant_t(x)
        wq, ws = mxfp8_quant(x)
        try:  # e4m3 bytes exactly (NaN is the canonical 0x7F); scales bitwise up to NaN payloads
            assert_match(q.view(torch.uint8), wq.view(torch.uint8), "bitwise", what="q")
            assert_match(s.t(), ws, "bitwise", what="scale")
            print(f"PASS mxfp8_quant_t m={m} k={k}", flush=True)
        except AssertionError as e:
            bad += 1
            print(f"FAIL mxfp8_quant_t m={m} k={k}: {e}", flush=True)
    return 1 if bad else 0


@pytest.mark.interp
def test_mxfp8_quant_kernel_bitwise_under_interpreter():
    run_script(Path(__file__), timeout=300)


if __name__ == "__main__":
    root = Path(__file__).resolve().parents[2]
    sys.path[:0] = [str(Path(__file__).resolve().parent), str(root / "python"), str(root / "sgl-kernel")]
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    raise SystemExit(_check())
