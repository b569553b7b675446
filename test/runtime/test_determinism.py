"""Deterministic mode (SGLANG_DSV41_DETERMINISTIC=1): the row-count-dependent GPU paths switch to
fixed shapes. On the CPU every path is already batch-invariant, so these tests pin the mechanism
(fixed 64-row GEMM calls, no attention key splits); the GPU check of rows across batches 1 / 7 / 64
is `benchmark/driver_bench.py --batch-invariance 1,7,64`."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sglang_dsv41.determinism import DETERMINISTIC_ENV, deterministic, row_tiled
from sglang_dsv41.layers.linear import BF16Linear


def test_env_values(monkeypatch):
    for value, want in (("1", True), ("true", True), ("0", False), ("", False), ("off", False)):
        monkeypatch.setenv(DETERMINISTIC_ENV, value)
        assert deterministic() is want
    monkeypatch.delenv(DETERMINISTIC_ENV)
    assert not deterministic()
    for bad in ("maybe", "2", "enabled"):  # never silently off
        monkeypatch.setenv(DETERMINISTIC_ENV, bad)
        with pytest.raises(ValueError, match=DETERMINISTIC_ENV):
            deterministic()


@pytest.mark.parametrize("m", [0, 1, 63, 64, 65, 130])
def test_row_tiled_calls_fixed_tiles(m):
    x = torch.randn(m, 3, 5, generator=torch.Generator().manual_seed(m))
    shapes = []

    def fn(t):
        shapes.append(tuple(t.shape))
        return t * 2 + 1

    out = row_tiled(fn, x)
    assert torch.equal(out, x * 2 + 1)
    assert all(s == (64, 3, 5) for s in shapes) and len(shapes) == -(-m // 64) or (m == 0 and shapes == [(0, 3, 5)])


def test_bf16_linear_deterministic_uses_64_row_gemms(monkeypatch):
    lin = BF16Linear(32, 16)
    lin.weight.data = torch.randn(16, 32, generator=torch.Generator().manual_seed(0)).bfloat16()
    x = torch.randn(2, 50, 32, generator=torch.Generator().manual_seed(1)).bfloat16()
    plain = lin(x)
    rows = []
    real = F.linear

    def spy(t, w):
        rows.append(t.shape[0])
        return real(t, w)

    monkeypatch.setenv(DETERMINISTIC_ENV, "1")
    monkeypatch.setattr(F, "linear", spy)
    out = lin(x)
    assert rows == [64, 64] and out.shape == plain.shape == (2, 50, 16)
    assert torch.equal(out, plain)  # the CPU GEMM is row-invariant already (conftest's scalar kernels)


def test_attention_never_splits_keys_in_deterministic_mode(monkeypatch):
    attention_triton = pytest.importorskip("dsv41_kernels.attention_triton", reason="needs triton")
    monkeypatch.delenv(DETERMINISTIC_ENV, raising=False)
    assert attention_triton._config(1, 64)[1] > 1  # the fast default splits small batches
    monkeypatch.setenv(DETERMINISTIC_ENV, "1")
    assert all(attention_triton._config(t, 64)[1] == 1 for t in (1, 7, 64))
