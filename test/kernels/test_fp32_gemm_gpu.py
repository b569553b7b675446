"""GPU: the fp32 GEMM kernel `fp32_linear` (fp32_gemm_triton.py) against its twin within
fp32_gemm_cases.tolerance (K * 2**-22 * sum_k |x w|) at the model's shapes: lm head (bench vocab 1024,
released 129280 at 8 rows), router (16 / 384 experts), mHC mix (fp32 fn [24, 20480], bf16 streams),
compressor (512 outputs); batch invariance bit for bit (rows alone vs among 300); every launch config
bit for bit equal (and every bf16 config one warpgroup MMA in its PTX); CUDA-graph capture; non-contiguous
x. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from fp32_gemm_cases import assert_bits_equal, assert_within, build

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (Triton kernels)")

BF, F32 = torch.bfloat16, torch.float32
HID = 5120
# (what, m, n, k, w dtype)
SHAPES = [("head-bench", m, 1024, HID, BF) for m in (1, 8, 64, 300, 8192)] + [
    ("head-release", 8, 129280, HID, BF),
    ("router", 8, 16, HID, BF), ("router", 8192, 16, HID, BF), ("router", 8, 384, HID, BF), ("router", 2048, 384, HID, BF),
    ("hc_mix", 1, 24, 4 * HID, F32), ("hc_mix", 8, 24, 4 * HID, F32), ("hc_mix", 300, 24, 4 * HID, F32),
    ("hc_mix", 8192, 24, 4 * HID, F32), ("compressor", 64, 512, HID, BF), ("compressor", 4096, 512, HID, BF)]
TC_CONFIGS = [(16, 64, 128, True, False, 4, 4), (16, 64, 128, True, True, 4, 4), (32, 64, 64, True, True, 4, 3),
              (64, 64, 128, True, False, 4, 3), (64, 16, 64, False, False, 4, 4), (64, 128, 64, False, True, 8, 4),
              (128, 128, 64, False, False, 8, 4), (128, 64, 32, False, False, 4, 3)]
FMA_CONFIGS = [(16, 32, 32, False, False, 4, 3), (16, 32, 32, False, True, 4, 3), (32, 32, 32, False, False, 4, 3),
               (64, 32, 16, False, True, 4, 3), (64, 32, 32, False, False, 8, 3), (32, 64, 16, False, False, 4, 3)]


@pytest.fixture(autouse=True)
def _no_tf32():
    """The twin's cuBLAS sgemm must be IEEE fp32 (TF32 would round the operands)."""
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = old


def _ops():
    from dsv41_kernels import ops

    return ops


@pytest.mark.parametrize("what, m, n, k, wdt", SHAPES, ids=lambda v: str(v).replace("torch.", ""))
def test_kernel_within_tolerance_of_twin(what, m, n, k, wdt):
    ops = _ops()
    x, w = build(m, n, k, BF, wdt, seed=m + n, device="cuda")
    got = ops.fp32_linear(x, w)  # dispatches to the kernel on CUDA
    assert ops.fp32_linear.uses_triton((x, w))
    assert_within(got, ops.fp32_linear.torch(x, w), x, w, what=what)


@pytest.mark.parametrize("xdt, wdt", [(F32, BF), (F32, F32), (BF, F32)], ids=lambda d: str(d)[6:])
def test_fp32_operands_within_tolerance(xdt, wdt):
    ops = _ops()
    x, w = build(77, 200, 3000, xdt, wdt, seed=5, device="cuda")
    assert_within(ops.fp32_linear.triton(x, w), ops.fp32_linear.torch(x, w), x, w)


@pytest.mark.parametrize("n, k, wdt", [(1024, HID, BF), (384, HID, BF), (16, HID, BF), (24, 4 * HID, F32)],
                         ids=lambda v: str(v).replace("torch.", ""))
def test_rows_alone_equal_rows_in_a_batch(n, k, wdt, monkeypatch):
    """Deterministic mode (the default's decode mHC mix takes shorter chunks, docs/numerics.md)."""
    monkeypatch.setenv("SGLANG_DSV41_DETERMINISTIC", "1")
    ops = _ops()
    x, w = build(300, n, k, BF, wdt, seed=n, device="cuda")
    full = ops.fp32_linear.triton(x, w)
    for a, b in ((0, 1), (0, 7), (0, 64), (5, 6), (64, 128), (250, 300), (299, 300)):
        assert_bits_equal(ops.fp32_linear.triton(x[a:b], w), full[a:b], what=f"rows {a}:{b}")


@pytest.mark.parametrize("wdt, k, configs", [(BF, HID, TC_CONFIGS), (F32, 4 * HID, FMA_CONFIGS)], ids=["bf16", "fp32w"])
def test_every_config_same_bits(wdt, k, configs):
    ops = _ops()
    n = 384 if wdt == BF else 24
    x, w = build(70, n, k, BF, wdt, seed=3, device="cuda")
    want = ops.fp32_linear.triton(x, w)
    for cfg in configs:
        assert_bits_equal(ops.fp32_linear.triton(x, w, config=cfg), want, what=str(cfg))


@pytest.mark.parametrize("cfg", TC_CONFIGS, ids=str)
def test_bf16_configs_are_warpgroup_mma(cfg):
    """Batch invariance of the bf16 path rests on every config issuing the same MMA instruction."""
    import triton.language as tl

    from dsv41_kernels.fp32_gemm_triton import CHUNK, _fp32_gemm_kernel

    bm, bn, bk, swap, split, warps, stages = cfg
    x, w = build(70, 384, HID, BF, BF, seed=1, device="cuda")
    out = torch.empty(5, 70, 384, device="cuda")
    kernel = _fp32_gemm_kernel[(1,)](x, x.stride(0), w, w.stride(0), out, 70, 384, HID, BM=bm, BN=bn, BK=bk,
                                     OPER=tl.bfloat16, IEEE=False, SWAP=swap, SPLIT=split, GROUP_M=8, CHUNK=CHUNK,
                                     num_warps=warps, num_stages=stages)
    ptx = kernel.asm["ptx"]
    assert "wgmma.mma_async" in ptx and "mma.sync" not in ptx, cfg


def test_cuda_graph_capture():
    ops = _ops()
    cases = [build(8, 1024, HID, BF, BF, seed=1, device="cuda"), build(8, 24, 4 * HID, BF, F32, seed=2, device="cuda"),
             build(300, 384, HID, BF, BF, seed=3, device="cuda")]
    outs = [ops.fp32_linear.triton(x, w) for x, w in cases]  # compile outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        outs = [ops.fp32_linear.triton(x, w) for x, w in cases]
    for i, (x, w) in enumerate(cases):
        x.copy_(build(x.size(0), w.size(0), w.size(1), BF, w.dtype, seed=10 + i, device="cuda")[0])
    g.replay()
    torch.cuda.synchronize()
    for (x, w), got in zip(cases, outs):
        assert_bits_equal(got, ops.fp32_linear.triton(x, w), what="graph replay vs eager")


def test_non_contiguous_x():
    ops = _ops()
    x, w = build(40, 24, 4 * HID, BF, F32, seed=4, device="cuda")
    want = ops.fp32_linear.triton(x, w)
    wide = torch.cat([x, x[:, :128]], dim=1)
    assert_bits_equal(ops.fp32_linear.triton(wide[:, : 4 * HID], w), want, what="row stride != K")
    spaced = torch.stack([x, x], dim=-1).flatten(1)[:, ::2]
    assert_bits_equal(ops.fp32_linear.triton(spaced, w), want, what="column stride 2")
    assert_bits_equal(ops.fp32_linear.triton(x.t().contiguous().t(), w), want, what="column-major x")
    assert_bits_equal(ops.fp32_linear.triton(x.view(5, 8, 4 * HID), w), want.view(5, 8, 24), what="leading dims")


def test_layer_slots_on_cuda():
    """The layers' default (the twin's formulation) and the kernel in a Gate's slot agree within the tolerance."""
    from sglang_dsv41.layers.linear import fp32_linear

    ops = _ops()
    x, w = build(33, 384, HID, BF, BF, seed=9, device="cuda")
    assert_within(ops.fp32_linear(x, w), fp32_linear(x, w), x, w)
    assert ops.fp32_linear(x[:0], w).shape == (0, 384)
