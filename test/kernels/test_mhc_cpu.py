"""CPU: the `mhc_gates` op (dsv41_kernels.mhc). Its twin equals the layer function `layers.mhc.gates`
bit for bit and a hand-worked fp32 case; `Block`'s `mhc_gates` slot follows `use_kernels` / `use_torch`
and the slotted twin leaves the tiny model's gates unchanged; the Triton kernel through the interpreter
(one subprocess, mhc_interp.py) equals the twin bit for bit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from mhc_cases import HC_EPS, NORM_EPS, assert_gates_equal, build_gates

CASES = [(1, 4, 128, "bf16", False, 20), (37, 4, 128, "bf16", True, 20), (9, 4, 5120, "bf16", True, 20),
         (12, 4, 64, "fp32", True, 20), (8, 3, 32, "bf16", True, 7), (8, 1, 96, "fp32", True, 1), (0, 4, 128, "bf16", False, 20)]


@pytest.mark.parametrize("t, n, h, dt, extreme, iters", CASES)
def test_twin_equals_layer_gates(t, n, h, dt, extreme, iters):
    from dsv41_kernels import ops
    from sglang_dsv41.layers.mhc import gates

    x, mix, base, scale = build_gates(t, n, h, seed=t + n + h, dtype=torch.bfloat16 if dt == "bf16" else torch.float32,
                                      extreme=extreme)
    args = (x, mix, base, scale, iters, HC_EPS, NORM_EPS)
    assert_gates_equal(ops.mhc_gates.torch(*args), gates(*args), what=f"t{t} n{n}")


def test_twin_hand_worked_n1():
    """n = 1, mix = 0, base = 0: pre = sigmoid(0) + eps, post = 2 sigmoid(0) = 1, and the 1 x 1 Sinkhorn
    from exp(0) = 1: m = 1 / 1 + eps, m = m / (m + eps), then iters - 1 times m / (m + eps) twice,
    each step one fp32 rounding (NumPy scalars)."""
    from dsv41_kernels import ops

    x = torch.ones(2, 32)
    pre, post, comb = ops.mhc_gates.torch(x, torch.zeros(2, 3), torch.zeros(3), torch.ones(3), 4, 1e-3, 1e-6)
    e = np.float32(1e-3)
    m = np.float32(1) / np.float32(1) + e
    m = m / (m + e)
    for _ in range(3):
        m = m / (m + e)
        m = m / (m + e)
    assert pre.tolist() == [[float(np.float32(0.5) + e)]] * 2
    assert post.tolist() == [[1.0]] * 2
    assert comb.view(2).tolist() == [float(m)] * 2


def test_twin_rejects_bad_mix_width():
    from dsv41_kernels import ops

    with pytest.raises(ValueError, match="not \\(2 \\+ n\\) \\* n"):
        ops.mhc_gates.torch(torch.ones(1, 32), torch.zeros(1, 10), torch.zeros(10), torch.ones(3), 1, 1e-6, 1e-6)


def test_block_slot_follows_use_kernels(tiny_model):
    """use_kernels points every Block's `mhc_gates` at the table's op, use_torch restores the layer
    function; with the twin table a block's (pre, post, comb) are the layer default's bits."""
    from dsv41_kernels.op_table import OpTable
    from sglang_dsv41.layers.block import Block
    from sglang_dsv41.layers.mhc import gates
    from sglang_dsv41.runtime.kernels import use_kernels, use_torch

    block = tiny_model.layers[1]
    n, h = tiny_model.cfg.hc.hc_mult, tiny_model.cfg.hidden_size
    g = torch.Generator().manual_seed(8)
    streams = (torch.randn(21, n, h, generator=g) * 3).bfloat16()
    with torch.inference_mode():
        want = [block.hc_mix(site, streams) for site in ("attn", "ffn")]
        table = OpTable.twins()
        try:
            use_kernels(tiny_model, table)
            assert all(b.__dict__.get("mhc_gates") is table.mhc_gates for b in tiny_model.layers)
            got = [block.hc_mix(site, streams) for site in ("attn", "ffn")]
        finally:
            use_torch(tiny_model)
    assert all("mhc_gates" not in b.__dict__ and b.mhc_gates is gates for b in tiny_model.layers)
    assert Block.kernel_slots == {"mhc_gates": "mhc_gates"}
    for site, a, b in zip(("attn", "ffn"), got, want):
        assert_gates_equal(a, b, what=site)


@pytest.mark.interp
def test_mhc_kernel_under_interpreter():
    pytest.importorskip("triton")
    # the interpreter's exp / sigmoid are torch's CPU ones (mhc_triton.py): pin them to the scalar kernels
    env = dict(os.environ, TRITON_INTERPRET="1", ATEN_CPU_CAPABILITY="default", PYTHONWARNINGS="ignore")
    script = Path(__file__).with_name("mhc_interp.py")
    res = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith(("PASS", "FAIL"))]
    assert len(lines) == 22, res.stdout[-2000:] + res.stderr[-2000:]
    assert res.returncode == 0, "\n".join(ln for ln in lines if ln.startswith("FAIL"))
