"""CPU: the fp32 GEMM op `fp32_linear` (dsv41_kernels.fp32_gemm; its twin is the layers' function
`shared_math.fp32_linear`, written through `determinism.row_tiled`) equals its former formulation
(`_old_fp32_linear` below, explicit padding and 64-row splits) bit for bit, for row counts around the
64-row tile, bf16 / fp32 operands and leading dims, and a row alone equals that row in a batch (the
float64 oracle with the fp32 bound: test_twin_oracles_math.py); the `fp32_gemm` slots of Head,
Gate, Block and BF16Linear follow the kernels / exact numerics policies, and the tiny model's reference logits are
the same bits with the op in those slots; the Triton kernel through the interpreter (one subprocess,
fp32_gemm_interp.py) against the twin within the tolerance and bitwise invariant over rows and configs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from fp32_gemm_cases import assert_bits_equal, build
from check_runner import run_script

ROWS = [0, 1, 63, 64, 65, 130]
DTYPES = [(torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32), (torch.float32, torch.bfloat16),
          (torch.float32, torch.float32)]


def _old_fp32_linear(x, w):
    """The former `layers.linear.fp32_linear` (oracle, kept verbatim but for the constant)."""
    lead, k = x.shape[:-1], x.shape[-1]
    xf = x.reshape(-1, k).float()
    wf = w.float()
    m = xf.size(0)
    pad = -m % 64
    if pad:
        xf = torch.cat([xf, xf.new_zeros(pad, k)])
    out = torch.cat([F.linear(t, wf) for t in xf.split(64)]) if xf.size(0) else xf.new_zeros(0, w.size(0))
    return out[:m].reshape(*lead, w.size(0))


@pytest.mark.parametrize("m", ROWS)
@pytest.mark.parametrize("xdt, wdt", DTYPES, ids=lambda d: str(d)[6:])
def test_twin_equals_former_formula(m, xdt, wdt):
    from dsv41_kernels import ops

    x, w = build(m, 24, 320, xdt, wdt, seed=m)
    want = _old_fp32_linear(x, w)
    assert want.shape == (m, 24) and want.dtype == torch.float32
    assert_bits_equal(ops.fp32_linear.torch(x, w), want, what="twin vs former")
    assert_bits_equal(ops.fp32_linear(x, w), want, what="op on CPU")  # dispatches to the twin


def test_leading_dims_and_rows_alone():
    from dsv41_kernels import ops

    x, w = build(130, 40, 200, torch.bfloat16, torch.bfloat16, seed=7)
    full = ops.fp32_linear.torch(x, w)
    assert_bits_equal(ops.fp32_linear.torch(x.view(2, 5, 13, 200), w), full.view(2, 5, 13, 40), what="leading dims")
    for a, b in ((0, 1), (5, 12), (64, 130), (100, 130)):  # a row's bits do not depend on the rows beside it
        assert_bits_equal(ops.fp32_linear.torch(x[a:b], w), full[a:b], what=f"rows {a}:{b}")
    exact = (x.double() @ w.double().T).float()
    assert torch.allclose(full, exact, rtol=1e-5, atol=1e-3)


def test_op_is_registered_with_its_kernel_module():
    from dsv41_kernels import registry

    op = registry.all_ops()["fp32_linear"]
    assert op.kernel_module == "dsv41_kernels.fp32_gemm_triton"
    x, w = build(3, 8, 16, torch.bfloat16, torch.bfloat16, seed=1)
    assert not op.uses_triton((x, w))  # CPU tensors: the twin


def _fp32_slots(model):
    from sglang_dsv41.layers.block import Block
    from sglang_dsv41.layers.linear import BF16Linear
    from sglang_dsv41.layers.moe import Gate
    from sglang_dsv41.layers.transformer import Head

    kinds = (Block, BF16Linear, Gate, Head)
    return [m for m in model.modules() if isinstance(m, kinds)]


def test_fp32_gemm_slots_follow_the_kernels_policy(tiny_model, tiny_reference):
    """The kernels policy points the `fp32_gemm` slot of every Block, Gate, Head and BF16Linear at the table's
    op (and the forward calls it), exact() restores the layer function; the reference logits are
    the same bits either way (on CPU the op runs its twin)."""
    from dsv41_kernels.op_table import OpTable
    from sglang_dsv41.layers.block import Block
    from sglang_dsv41.layers.linear import fp32_linear
    from sglang_dsv41.numerics import NumericsPolicy, apply_numerics

    slotted = _fp32_slots(tiny_model)
    kinds = {type(m).__name__ for m in slotted}
    assert {"Block", "Gate", "Head", "BF16Linear"} <= kinds, kinds
    assert Block.numerics_slots["fp32_gemm"].kernel == "fp32_linear"
    ids = torch.randint(3, tiny_model.cfg.vocab_size, (48,), generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        want = tiny_reference.forward(ids).logits
    table, calls = OpTable.kernels().counting()
    try:
        apply_numerics(tiny_model, NumericsPolicy.kernels(table))
        assert all(m.__dict__.get("fp32_gemm") is table.fp32_linear for m in slotted)
        with torch.inference_mode():
            got = tiny_reference.forward(ids).logits
    finally:
        apply_numerics(tiny_model, NumericsPolicy.exact())
    assert all("fp32_gemm" not in m.__dict__ and m.fp32_gemm is fp32_linear for m in slotted)
    n_layers = len(tiny_model.layers)
    assert calls[("fp32_linear", "torch")] >= 1, calls  # the head (and the compressors' BF16Linear)
    assert calls[("moe_gate", "torch")] == n_layers, calls  # the router's GEMM, inside `moe_gate` (Gate)
    assert calls[("mhc_enter", "torch")] == 2 * n_layers, calls  # the 2 mHC mixes of a layer (`Block.enter`)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


@pytest.mark.interp
def test_fp32_gemm_kernel_under_interpreter():
    pytest.importorskip("triton")
    # 7 shapes + layouts + (batch invariance, configs) x (bf16, fp32 weight)
    run_script(Path(__file__).with_name("fp32_gemm_interp.py"), 12, pin_cpu_kernels=True)
