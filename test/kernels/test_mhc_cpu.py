"""CPU: the mHC ops (dsv41_kernels.mhc; twins = the layers' functions in `sglang_dsv41.shared_math`). The
`mhc_gates` twin equals DeepSeek's hc_mixes + hc_split_sinkhorn (../shared/official) bit for bit on corner
cases, and a hand-worked fp32 case; `collapse` / `expand` (explicit sequential sums) equal their former
formulation (`_old_collapse` / `_old_expand` below, torch CPU's `.sum(dim=1)`, DeepSeek's hc_pre /
hc_post) bit for bit, and hand-worked sums whose bits depend on the order; `Block`'s mHC slots (and the
model's final `mhc_collapse`) follow the kernels / exact numerics policies, and the tiny model's logits are the
same bits with the former formulation or the twins in those slots; the Triton kernels through the
interpreter (one subprocess, mhc_interp.py) equal the twins bit for bit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from mhc_cases import HC_EPS, NORM_EPS, assert_bits_equal, assert_gates_equal, build_gates, build_streams
from check_runner import run_script

CASES = [(1, 4, 128, "bf16", False, 20), (37, 4, 128, "bf16", True, 20), (9, 4, 5120, "bf16", True, 20),
         (12, 4, 64, "fp32", True, 20), (8, 3, 32, "bf16", True, 7), (8, 1, 96, "fp32", True, 1), (0, 4, 128, "bf16", False, 20)]


@pytest.mark.parametrize("t, n, h, dt, extreme, iters", CASES)
def test_twin_gates_equal_official(t, n, h, dt, extreme, iters):
    """Oracle: DeepSeek's Block.hc_mixes after its GEMM (rsqrt(mean(x^2) + eps) on the raw mix), then
    kernel_cpu.hc_split_sinkhorn, on the corner rows of mhc_cases (zero rows, overflowing squares,
    underflowing exps, NaN / inf mixes, ties)."""
    from official import kernel_cpu

    from dsv41_kernels import ops

    x, mix, base, scale = build_gates(t, n, h, seed=t + n + h, dtype=torch.bfloat16 if dt == "bf16" else torch.float32,
                                      extreme=extreme)
    mixes = mix * torch.rsqrt(x.float().square().mean(-1, keepdim=True) + NORM_EPS)
    want = kernel_cpu().hc_split_sinkhorn(mixes, scale, base, n, iters, HC_EPS)
    assert_gates_equal(ops.mhc_gates.torch(x, mix, base, scale, iters, HC_EPS, NORM_EPS), want, what=f"t{t} n{n}")


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


def test_block_slot_follows_the_kernels_policy(tiny_model):
    """The kernels policy points every Block's `mhc_gates` at the table's op, exact() restores the layer
    function; with the twin table a block's (pre, post, comb) are the layer default's bits."""
    from dsv41_kernels.op_table import OpTable
    from sglang_dsv41.layers.block import Block
    from sglang_dsv41.layers.mhc import gates
    from sglang_dsv41.numerics import NumericsPolicy, apply_numerics

    block = tiny_model.layers[1]
    n, h = tiny_model.cfg.hc.hc_mult, tiny_model.cfg.hidden_size
    g = torch.Generator().manual_seed(8)
    streams = (torch.randn(21, n, h, generator=g) * 3).bfloat16()
    with torch.inference_mode():
        want = [block.hc_mix(site, streams) for site in ("attn", "ffn")]
        table = OpTable.twins()
        try:
            apply_numerics(tiny_model, NumericsPolicy.kernels(table))
            assert all(b.__dict__.get("mhc_gates") is table.mhc_gates for b in tiny_model.layers)
            got = [block.hc_mix(site, streams) for site in ("attn", "ffn")]
        finally:
            apply_numerics(tiny_model, NumericsPolicy.exact())
    assert all("mhc_gates" not in b.__dict__ and b.mhc_gates is gates for b in tiny_model.layers)
    assert {a: s.kernel for a, s in Block.numerics_slots.items()} == {
        "mhc_gates": "mhc_gates", "mhc_collapse": "mhc_collapse", "mhc_expand": "mhc_expand", "fp32_gemm": "fp32_linear"}
    for site, a, b in zip(("attn", "ffn"), got, want):
        assert_gates_equal(a, b, what=site)


def test_block_enter_follows_the_kernels_policy(tiny_model):
    """With fp32_gemm, mhc and norm on kernels a Block's `enter` runs the table's `mhc_enter` (the weights,
    eps and previous pre of the site handed over: the twin table gives the four slots' bits); a policy with
    one of those families exact keeps the slots; exact() removes the op."""
    from dataclasses import replace

    from dsv41_kernels.op_table import OpTable
    from sglang_dsv41.numerics import Mode, NumericsPolicy, apply_numerics

    block = tiny_model.layers[1]
    n, h = tiny_model.cfg.hc.hc_mult, tiny_model.cfg.hidden_size
    g = torch.Generator().manual_seed(9)
    streams = (torch.randn(13, n, h, generator=g) * 3).bfloat16()
    prev = torch.rand(13, n, generator=g) + 0.1
    calls = []
    table, counts = OpTable.twins().counting()
    with torch.inference_mode():
        want = [block.enter(site, streams, prev) for site in ("attn", "ffn")]
        try:
            apply_numerics(tiny_model, replace(NumericsPolicy.kernels(table), norm=Mode.EXACT))
            assert "_enter" not in block.__dict__
            apply_numerics(tiny_model, NumericsPolicy.kernels(table))
            assert all(b.__dict__.get("_enter") is table.mhc_enter for b in tiny_model.layers)
            got = [block.enter(site, streams, prev) for site in ("attn", "ffn")]
            calls.append(counts[("mhc_enter", "torch")])
        finally:
            apply_numerics(tiny_model, NumericsPolicy.exact())
    assert calls == [2] and all("_enter" not in b.__dict__ for b in tiny_model.layers)
    for site, a, b in zip(("attn", "ffn"), got, want):
        assert_gates_equal(a[:3], b[:3], what=site)
        assert_bits_equal(a[3], b[3], what=site)


def _old_collapse(streams, pre):
    """The former `layers.mhc.collapse` (oracle, kept verbatim)."""
    return (pre.unsqueeze(-1) * streams.float()).sum(dim=1).to(streams.dtype)


def _old_expand(y, streams, post, comb):
    """The former `layers.mhc.expand` (oracle, kept verbatim)."""
    mixed = (comb.unsqueeze(-1) * streams.float().unsqueeze(-2)).sum(dim=1)
    return (post.unsqueeze(-1) * y.float().unsqueeze(-2) + mixed).to(y.dtype)


STREAM_CASES = [(t, n, h, dt, ex) for n in (1, 2, 3, 4) for t, h, dt, ex in
                ((17, 96, "bf16", True), (12, 40, "fp32", True), (3, 256, "bf16", False), (0, 64, "bf16", False))]


def _streams(t, n, h, dt, ex, seed=0):
    return build_streams(t, n, h, seed=seed + 100 * n + t, dtype=torch.bfloat16 if dt == "bf16" else torch.float32,
                         extreme=ex)


@pytest.mark.parametrize("t, n, h, dt, ex", STREAM_CASES)
def test_layer_collapse_expand_equal_former_formula(t, n, h, dt, ex):
    from sglang_dsv41.layers.mhc import collapse, expand

    y, r, pre, post, comb = _streams(t, n, h, dt, ex)
    assert_bits_equal(collapse(r, pre), _old_collapse(r, pre), what="collapse")
    assert_bits_equal(expand(y, r, post, comb), _old_expand(y, r, post, comb), what="expand")
    if t:  # a bf16 y with fp32 streams (output: y's dtype) and the gates a sublayer really gives
        pre, post = pre.abs() + 1e-6, pre.abs() * 2
        comb = comb.abs().softmax(-1)
        assert_bits_equal(expand(y.bfloat16(), r.float(), post, comb), _old_expand(y.bfloat16(), r.float(), post, comb))
        assert_bits_equal(collapse(r, pre), _old_collapse(r, pre))


def test_collapse_expand_hand_worked_order():
    """fp32, n = 3, pre = 1: ((0 + 2**24) + 1) + 1 = 2**24 (each 1 is a tie to even, lost), whereas the
    exact sum is 2**24 + 2; all -0 terms give +0 (the sum starts at +0); expand adds post * y last:
    (2 * 3) + ((0 + 0.5 * 2**24) + ..) for a column of comb."""
    from dsv41_kernels import ops

    r = torch.tensor([[[2.0**24, -0.0], [1.0, -0.0], [1.0, -0.0]]])  # [1, 3, 2]
    pre = torch.ones(1, 3)
    out = ops.mhc_collapse.torch(r, pre)
    assert out.tolist() == [[2.0**24, 0.0]] and not torch.signbit(out[0, 1])
    comb = torch.tensor([[[1.0, 0.0, 0.5], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]])  # column k: comb[:, j, k]
    post, y = torch.tensor([[0.0, 2.0, 2.0]]), torch.tensor([[3.0, -0.0]])
    out = ops.mhc_expand.torch(y, r, post, comb)
    assert out[0, 0].tolist() == [2.0**24, 0.0] and not torch.signbit(out[0, 0, 1])  # 0 * 3 + 2**24
    assert out[0, 1].tolist() == [6.0, 0.0] and not torch.signbit(out[0, 1, 1])  # 2 * -0 + (+0) = +0
    assert out[0, 2].tolist() == [6.0 + 2.0**23, 0.0]


def test_layer_collapse_expand_keep_gradients():
    from sglang_dsv41.layers.mhc import collapse, expand

    y, r, pre, post, comb = (a.float().requires_grad_() for a in _streams(5, 4, 32, "fp32", False))
    (collapse(r, pre).sum() + (expand(y, r, post, comb) * torch.arange(4.0).view(1, 4, 1)).sum()).backward()
    for a in (y, r, pre, post, comb):
        assert a.grad is not None and bool(torch.isfinite(a.grad).all()) and a.grad.abs().sum() > 0


def test_mhc_stream_slots_follow_the_kernels_policy(tiny_model, tiny_reference):
    """The kernels policy points every Block's `mhc_collapse` / `mhc_expand` and the model's final
    `mhc_collapse` at the table's ops, exact() restores the layer functions. The tiny model's
    reference logits are the same bits with the twins, and with the former formulation, in those slots."""
    from dsv41_kernels.op_table import OpTable
    from sglang_dsv41.layers.mhc import collapse, expand
    from sglang_dsv41.layers.transformer import DeepseekV41
    from sglang_dsv41.numerics import NumericsPolicy, apply_numerics

    ids = torch.randint(3, tiny_model.cfg.vocab_size, (48,), generator=torch.Generator().manual_seed(4))
    slotted = [(b, "mhc_collapse") for b in tiny_model.layers] + [(b, "mhc_expand") for b in tiny_model.layers]
    slotted.append((tiny_model, "mhc_collapse"))
    assert {a: s.kernel for a, s in DeepseekV41.numerics_slots.items()} == {"mhc_collapse": "mhc_collapse"}
    table = OpTable.twins()
    try:
        apply_numerics(tiny_model, NumericsPolicy.kernels(table))
        assert all(m.__dict__.get(a) is getattr(table, a) for m, a in slotted)
    finally:
        apply_numerics(tiny_model, NumericsPolicy.exact())
    assert all(a not in m.__dict__ for m, a in slotted)
    assert all(b.mhc_collapse is collapse and b.mhc_expand is expand for b in tiny_model.layers)
    assert tiny_model.mhc_collapse is collapse
    with torch.inference_mode():
        want = tiny_reference.forward(ids).logits
        for fns in ({"mhc_collapse": table.mhc_collapse, "mhc_expand": table.mhc_expand},
                    {"mhc_collapse": _old_collapse, "mhc_expand": _old_expand}):
            try:
                for m, a in slotted:
                    setattr(m, a, fns[a])
                got = tiny_reference.forward(ids).logits
            finally:
                for m, a in slotted:
                    m.__dict__.pop(a, None)
            assert torch.equal(got.view(torch.int32), want.view(torch.int32)), fns["mhc_collapse"]


@pytest.mark.interp
def test_mhc_kernel_under_interpreter():
    pytest.importorskip("triton")
    # the interpreter's exp / sigmoid are torch's CPU ones (mhc_triton.py): pin them to the scalar kernels;
    # 11 gates + 11 sums of squares + 15 collapse / expand + 6 site entry checks
    run_script(Path(__file__).with_name("mhc_interp.py"), 43, pin_cpu_kernels=True)
