"""GPU: the fused mHC gates kernel (`mhc_gates`, one launch) against its torch twin, bit for bit, at the
model's width D = 4 * 5120 and on the corners of mhc_cases (overflowing squares, underflowing exp,
NaN / inf mixes); every launch config the benchmark may pick; the layer function on CUDA equals the twin;
CUDA-graph capture (no host sync). Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from mhc_cases import HC_EPS, NORM_EPS, assert_gates_equal, build_gates

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (Triton kernels)")


def _ops():
    from dsv41_kernels import ops

    return ops


@pytest.mark.parametrize("t", [1, 7, 64, 8192])
@pytest.mark.parametrize("extreme", [False, True])
def test_gates_bitwise_release_width(t, extreme):
    ops = _ops()
    x, mix, base, scale = build_gates(t, 4, 5120, seed=t, extreme=extreme, device="cuda")
    args = (x, mix, base, scale, 20, HC_EPS, NORM_EPS)
    got = ops.mhc_gates.triton(*args)
    torch.cuda.synchronize()
    assert_gates_equal(got, ops.mhc_gates.torch(*args), what=f"t={t}")


@pytest.mark.parametrize("launch", [dict(rows=1), dict(rows=2), dict(rows=4), dict(rows=8), dict(rows=1, chunks=1),
                                    dict(rows=1, chunks=16), dict(rows=4, chunks=2, num_warps=2),
                                    dict(rows=8, num_warps=4)], ids=lambda k: "-".join(f"{a}{b}" for a, b in k.items()))
def test_launch_configs(launch):
    ops = _ops()
    x, mix, base, scale = build_gates(301, 4, 5120, seed=3, extreme=True, device="cuda")
    args = (x, mix, base, scale, 20, HC_EPS, NORM_EPS)
    assert_gates_equal(ops.mhc_gates.triton(*args, **launch), ops.mhc_gates.torch(*args), what=str(launch))


@pytest.mark.parametrize("t, n, h, dtype, iters, mix_scale", [(33, 4, 128, torch.bfloat16, 20, 3.0), (17, 4, 256, torch.float32, 20, 30.0),
                                                              (9, 3, 96, torch.bfloat16, 5, 3.0), (5, 1, 64, torch.float32, 1, 3.0),
                                                              (40, 4, 512, torch.bfloat16, 20, 1e3)])
def test_gates_bitwise_small_presets(t, n, h, dtype, iters, mix_scale):
    ops = _ops()
    x, mix, base, scale = build_gates(t, n, h, seed=n * h, dtype=dtype, mix_scale=mix_scale, extreme=True, device="cuda")
    args = (x, mix, base, scale, iters, HC_EPS, NORM_EPS)
    assert_gates_equal(ops.mhc_gates.triton(*args), ops.mhc_gates.torch(*args), what=f"n={n} h={h}")


def test_layer_gates_on_cuda_equal_twin():
    from sglang_dsv41.layers.mhc import gates

    x, mix, base, scale = build_gates(64, 4, 5120, seed=11, extreme=True, device="cuda")
    args = (x, mix, base, scale, 20, HC_EPS, NORM_EPS)
    assert_gates_equal(gates(*args), _ops().mhc_gates.torch(*args))


def test_gates_no_host_sync():
    """Captured in a CUDA graph and replayed on new streams: the same bits as a direct call."""
    ops = _ops()
    x, mix, base, scale = build_gates(8, 4, 5120, seed=12, device="cuda")
    args = (x, mix, base, scale, 20, HC_EPS, NORM_EPS)
    ops.mhc_gates.triton(*args)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = ops.mhc_gates.triton(*args)
    x2, mix2, _, _ = build_gates(8, 4, 5120, seed=13, device="cuda")
    x.copy_(x2)
    mix.copy_(mix2)
    g.replay()
    torch.cuda.synchronize()
    assert_gates_equal(out, ops.mhc_gates.torch(*args))


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", "-rA"]))
