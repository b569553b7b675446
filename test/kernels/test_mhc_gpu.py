"""GPU: the fused mHC kernels against their torch twins, bit for bit. Gates (`mhc_gates`, one launch) at
the model's width D = 4 * 5120 and on the corners of mhc_cases (overflowing squares, underflowing exp,
NaN / inf mixes); every launch config the benchmark may pick; the layer function on CUDA equals the twin;
CUDA-graph capture (no host sync). Stream collapse / expand (`mhc_collapse`, `mhc_expand`) at n = 4,
H = 5120 for T = 1 .. 8192 with mhc_cases' extreme rows (inf, NaN, -0, near the bf16 maximum,
subnormals), other n, fp32 streams, strided inputs, launch configs, the layer functions on CUDA, and
CUDA-graph capture. The fused site entry (`mhc_enter`) against the fp32_linear kernel followed by the
gates / collapse / norm twins, bit for bit, in fast and deterministic mode (the GEMM split or not),
and under CUDA-graph replay. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from mhc_cases import (HC_EPS, NORM_EPS, assert_bits_equal, assert_gates_equal, build_enter, build_gates, build_streams,
                       enter_oracle)

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


def _check_streams(y, r, pre, post, comb, what="", **launch):
    ops = _ops()
    got_c = ops.mhc_collapse.triton(r, pre, **launch)
    got_e = ops.mhc_expand.triton(y, r, post, comb, **launch)
    torch.cuda.synchronize()
    assert_bits_equal(got_c, ops.mhc_collapse.torch(r, pre), what=f"collapse {what}")
    assert_bits_equal(got_e, ops.mhc_expand.torch(y, r, post, comb), what=f"expand {what}")


@pytest.mark.parametrize("t", [1, 7, 64, 8192])
@pytest.mark.parametrize("extreme", [False, True])
def test_collapse_expand_bitwise_release_width(t, extreme):
    _check_streams(*build_streams(t, 4, 5120, seed=t, extreme=extreme, device="cuda"), what=f"t={t}")


@pytest.mark.parametrize("t, n, h, dtype, y_dtype", [(13, 1, 5120, torch.bfloat16, torch.bfloat16),
                                                     (29, 2, 1000, torch.bfloat16, torch.bfloat16),
                                                     (40, 3, 96, torch.bfloat16, torch.bfloat16),
                                                     (33, 4, 5120, torch.float32, torch.float32),
                                                     (33, 4, 520, torch.float32, torch.bfloat16)])
def test_collapse_expand_bitwise_other_shapes(t, n, h, dtype, y_dtype):
    y, r, pre, post, comb = build_streams(t, n, h, seed=n * h, dtype=dtype, extreme=True, device="cuda")
    _check_streams(y.to(y_dtype), r, pre, post, comb, what=f"n={n} h={h} {dtype}")


@pytest.mark.parametrize("launch", [dict(tb=1, block_h=1024), dict(tb=4, block_h=1024),
                                    dict(tb=2, block_h=2048, num_warps=8), dict(tb=4, block_h=512, num_warps=4),
                                    dict(tb=1, block_h=256, num_warps=1)],
                         ids=lambda k: "-".join(f"{a}{b}" for a, b in k.items()))
def test_collapse_expand_launch_configs(launch):
    _check_streams(*build_streams(301, 4, 5120, seed=5, extreme=True, device="cuda"), what=str(launch), **launch)


def test_collapse_expand_strided_inputs():
    """Streams / y as column slices of wider rows (what a caller's narrowing or a concat could pass)."""
    ops = _ops()
    y, r, pre, post, comb = build_streams(70, 4, 5120, seed=6, extreme=True, device="cuda")
    wide_r = torch.cat([r, r[:, :, :128]], dim=2)[:, :, :5120]
    wide_y = torch.cat([y, y[:, :64]], dim=1)[:, :5120]
    assert_bits_equal(ops.mhc_collapse.triton(wide_r, pre), ops.mhc_collapse.torch(r, pre))
    assert_bits_equal(ops.mhc_expand.triton(wide_y, wide_r, post, comb), ops.mhc_expand.torch(y, r, post, comb))


def test_layer_collapse_expand_on_cuda_equal_twins():
    from sglang_dsv41.layers.mhc import collapse, expand

    ops = _ops()
    y, r, pre, post, comb = build_streams(64, 4, 5120, seed=7, extreme=True, device="cuda")
    assert_bits_equal(collapse(r, pre), ops.mhc_collapse.torch(r, pre))
    assert_bits_equal(expand(y, r, post, comb), ops.mhc_expand.torch(y, r, post, comb))


def test_collapse_expand_no_host_sync():
    """Captured in a CUDA graph and replayed on new inputs: the twins' bits."""
    ops = _ops()
    y, r, pre, post, comb = build_streams(8, 4, 5120, seed=8, device="cuda")
    ops.mhc_collapse.triton(r, pre), ops.mhc_expand.triton(y, r, post, comb)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out_c = ops.mhc_collapse.triton(r, pre)
        out_e = ops.mhc_expand.triton(y, r, post, comb)
    for dst, src in zip((y, r, pre, post, comb), build_streams(8, 4, 5120, seed=9, extreme=False, device="cuda")):
        dst.copy_(src)
    g.replay()
    torch.cuda.synchronize()
    assert_bits_equal(out_c, ops.mhc_collapse.torch(r, pre))
    assert_bits_equal(out_e, ops.mhc_expand.torch(y, r, post, comb))


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", "-rA"]))


@pytest.mark.parametrize("t", [1, 8, 64, 300, 2048])
@pytest.mark.parametrize("det", ["0", "1"])
def test_enter_bitwise(t, det, monkeypatch):
    """(pre, post, comb, x) of the fused entry = the twins of the gates, collapse and norm on the
    fp32_linear kernel's mix (what the unfused kernels compute: they equal those twins bit for bit);
    x, which does not depend on the mix, equals the whole twin; the mix within fp32 tolerance of it."""
    monkeypatch.setenv("SGLANG_DSV41_DETERMINISTIC", det)
    ops = _ops()
    args = build_enter(t, 4, 5120, seed=t + 5, extreme=t >= 8, device="cuda")
    got = ops.mhc_enter.triton(*args)
    mix = ops.fp32_linear.triton(args[0].flatten(1), args[1])
    want = enter_oracle(args, mix)
    assert_gates_equal(got[:3], want[:3], what=f"t={t} det={det}")
    assert_bits_equal(got[3], want[3], what=f"t={t} det={det} x")
    assert_bits_equal(got[3], ops.mhc_enter.torch(*args)[3], what="x vs the twin")


@pytest.mark.parametrize("launch", [dict(rows=1, num_warps=1), dict(rows=4), dict(rows=2, num_warps=8)],
                         ids=lambda k: "-".join(f"{a}{b}" for a, b in k.items()))
def test_enter_launch_configs(launch):
    ops = _ops()
    args = build_enter(37, 4, 5120, seed=6, extreme=True, device="cuda")
    mix = ops.fp32_linear.triton(args[0].flatten(1), args[1])
    got = ops.mhc_enter.triton(*args, **launch)
    want = enter_oracle(args, mix)
    assert_gates_equal(got[:3], want[:3], what=str(launch))
    assert_bits_equal(got[3], want[3], what=str(launch))


def test_enter_no_host_sync():
    """Captured in a CUDA graph and replayed on new streams and previous pre: the bits of a direct call."""
    ops = _ops()
    args = build_enter(8, 4, 5120, seed=14, device="cuda")
    ops.mhc_enter.triton(*args)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = ops.mhc_enter.triton(*args)
    new = build_enter(8, 4, 5120, seed=15, device="cuda")
    args[0].copy_(new[0])
    args[7].copy_(new[7])
    g.replay()
    torch.cuda.synchronize()
    want = ops.mhc_enter.triton(*args)
    assert_gates_equal(out[:3], want[:3])
    assert_bits_equal(out[3], want[3])
