"""benchmark/kernel_aot.py compiles a decode kernel for sm_90a on a machine without a GPU: the folded
split-K pass 1 at M = 8 (the smallest of its cases) has registers, no spills, its pipelined operand
copies and one warpgroup MMA per K block."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmark"))


def test_folded_split_k_compiles_for_sm90():
    pytest.importorskip("triton.backends.nvidia")
    import kernel_aot as KA

    name, fn, types, odd, const, warps, stages = next(c for c in KA.cases() if "wo_b" in c[0])
    assert const["FOLD"] and const["SWAP"], const
    r = KA.compile_kernel(fn, types, odd, const, warps, stages)
    assert 0 < r["regs"] <= 255 and r["spill"] == 0, r
    assert r["cp_async"] > 0, "the weight / activation tiles are no longer pipelined copies"
    assert r["wgmma"] == 1 and r["waits"] == ["0"], (r["wgmma"], r["waits"])


def test_router_and_swiglu_use_ieee_division_and_sqrt():
    """The router / SwiGLU kernels must round as torch CUDA's kernels do: IEEE divisions and square roots
    in their sm_90a PTX, no approximate ones (Triton's `/` on fp32 would be `div.full`)."""
    pytest.importorskip("triton.backends.nvidia")
    import kernel_aot as KA

    for name, fn, types, odd, const, warps, stages in (c for c in KA.cases() if c[1].__name__ in ("_route_kernel", "_swiglu_kernel")):
        r = KA.compile_kernel(fn, types, odd, const, warps, stages)
        assert r["ieee"] > 0 and r["approx"] == 0 and r["spill"] == 0, (name, r)
