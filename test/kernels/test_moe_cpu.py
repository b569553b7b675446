"""CPU: the grouped MoE (layer formulation and the `moe_experts` twin) equals the per-expert path bit
for bit (the official oracles of moe_experts / moe_combine / rms_norm: test_twin_oracles_*.py); the
layer transformations of
the kernels policy (stacked experts, kept `wo_a`, RoPE position tables) change no bit; the Triton kernels
of these ops through the interpreter (one subprocess)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from moe_cases import build_moe
from check_runner import run_script


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t.view(torch.int32)


def _per_expert(x, ids, weights, w1, s1, w3, s3, w2, s2, limit):
    """The per-expert loop the layer ran before grouping: rows of each expert, ascending id, fp32 sum."""
    from sglang_dsv41.layers.moe import swiglu
    from sglang_dsv41.quant import fp4_linear

    y = torch.zeros(x.shape, dtype=torch.float32)
    for e in torch.unique(ids).tolist():
        rows, slot = torch.where(ids == e)
        h = swiglu(fp4_linear(x[rows], w1[e], s1[e]), fp4_linear(x[rows], w3[e], s3[e]), limit, weights[rows, slot, None])
        y[rows] += fp4_linear(h.to(x.dtype), w2[e], s2[e]).float()
    return y


@pytest.mark.parametrize("t, k, e", [(1, 6, 16), (13, 6, 16), (40, 2, 5), (0, 6, 16)])
def test_grouped_equals_per_expert(t, k, e):
    from dsv41_kernels import ops
    from sglang_dsv41.layers.moe import routed_experts

    args = build_moe(t, k, e, 128, 64, seed=t + k)
    grouped = routed_experts(*args, 10.0)
    assert torch.equal(_bits(ops.moe_experts.torch(*args, 10.0)), _bits(grouped))
    y = torch.zeros(t, 128)
    for j in range(k):
        y = y + grouped[:, j].float()
    assert torch.equal(_bits(y), _bits(_per_expert(*args, 10.0)))


def test_moe_layer_uses_views_of_stacked_weights(tiny_model):
    moe = tiny_model.layers[0].ffn
    st = moe.expert_weights()
    assert st[0].shape[0] == len(moe.experts)
    assert moe.experts[1].w3.weight.data_ptr() == st[2][1].data_ptr()
    assert moe.expert_weights() is st  # built once
    x = (torch.randn(9, tiny_model.cfg.hidden_size) * 2).bfloat16()
    with torch.inference_mode():
        y, ids = moe(x)
        w, _ = moe.gate(x)
        want = _per_expert(x, ids.long(), w, *st, moe.shared_experts.limit) + moe.shared_experts(x).float()
    assert torch.equal(_bits(y), _bits(want.bfloat16()))


def test_layer_transformations_keep_bits(tiny_model):
    attn = tiny_model.layers[2].attn
    want = attn.wo_a.dequantized()
    attn.wo_a.keep_dequantized()
    try:
        assert attn.wo_a.dequantized() is attn.wo_a.dequantized()
        assert torch.equal(_bits(attn.wo_a.dequantized()), _bits(want))
    finally:
        attn.wo_a.keep_dequantized(False)
    pos = torch.tensor([0, 5, 300, 4095, 17])
    cos, sin = attn.rotary.freqs(pos)
    tab = attn.rotary.position_table(4096, "cpu")
    attn.rotary.use_table(tab)
    try:
        c2, s2 = attn.rotary.freqs(pos)
    finally:
        attn.rotary.use_table(None)
    assert torch.equal(_bits(c2), _bits(cos)) and torch.equal(_bits(s2), _bits(sin))


def test_fused_shared_expert_keeps_bits(tiny_model):
    """The kernels policy's [w1; w3] GEMM of the shared expert (linear.FusedRows): the same bits as two
    GEMMs, the parts' parameters views of the stacked weight (nothing held twice), and a replaced
    parameter falls back to the two GEMMs instead of using stale bytes."""
    from dsv41_kernels.op_table import OpTable
    from sglang_dsv41.numerics import NumericsPolicy

    se = tiny_model.layers[0].ffn.shared_experts
    x = (torch.randn(5, tiny_model.cfg.hidden_size) * 2).bfloat16()
    w = torch.rand(5, 1)
    with torch.inference_mode():
        want = se(x, w)
        g, u = se.w1(x), se.w3(x)
    se.apply_numerics(NumericsPolicy.kernels(OpTable.twins()), {})
    fused = se.__dict__["_w13"]
    kept = se.w3.weight.data
    try:
        assert fused.holds() and se.w3.weight.data_ptr() == fused.weight[se.w1.out_features].data_ptr()
        with torch.inference_mode():
            assert torch.equal(_bits(se(x, w)), _bits(want))
            g2, u2 = fused(x)
        assert torch.equal(_bits(g2), _bits(g)) and torch.equal(_bits(u2), _bits(u))
        with torch.no_grad():
            se.w3.weight.data = se.w3.weight.data.clone()
            se.w3.weight.data[0, 0] = 0.0
        assert not fused.holds()
        with torch.inference_mode():
            assert torch.equal(_bits(se.gate_up(x)[1]), _bits(se.w3(x)))
    finally:
        se.w3.weight.data = kept  # the fixture model is shared: its bytes back
        se.apply_numerics(NumericsPolicy.exact(), {})
    assert "_w13" not in se.__dict__
    with torch.inference_mode():
        assert torch.equal(_bits(se(x, w)), _bits(want))


def test_fused_attention_projection_keeps_bits(tiny_model):
    """The kernels policy's [wq_a; wkv] GEMM (Attention.project): the same bits as the two GEMMs, gone
    under the exact policy."""
    from dsv41_kernels.op_table import OpTable
    from sglang_dsv41.numerics import NumericsPolicy

    attn = tiny_model.layers[3].attn
    x = (torch.randn(7, tiny_model.cfg.hidden_size) * 2).bfloat16()
    with torch.inference_mode():
        want = attn.wq_a(x), attn.wkv(x)
    attn.apply_numerics(NumericsPolicy.kernels(OpTable.twins()), {})
    try:
        assert attn.__dict__["_qkv"].holds()
        with torch.inference_mode():
            got = attn.project(x)
        assert all(torch.equal(_bits(a), _bits(b)) for a, b in zip(got, want))
    finally:
        attn.apply_numerics(NumericsPolicy.exact(), {})
    assert "_qkv" not in attn.__dict__


@pytest.mark.interp
def test_kernels_under_interpreter():
    pytest.importorskip("triton")
    run_script(Path(__file__).with_name("moe_interp.py"), 8, timeout=300, pin_cpu_kernels=True)


@pytest.mark.interp
def test_bf16_operand_kernels_under_interpreter():
    """dequant_triton's kernels bitwise against the twins' dequantized operands, and the bf16 prefill paths
    (grouped MoE, dense fp8 / fp4) and the decode attention kernel within the twins' tolerance, through the
    interpreter (dequant_interp.py)."""
    pytest.importorskip("triton")
    run_script(Path(__file__).with_name("dequant_interp.py"), 9, timeout=300)


def test_gate_follows_the_kernels_policy(tiny_model):
    """With fp32_gemm and moe on kernels a Gate runs the table's `moe_gate` (weights, bias, k, scale and forced
    ids handed over: the twin table gives the two slots' weights bitwise and their ids as int32); a policy with
    one of those families exact keeps the slots; exact() removes the op."""
    from dataclasses import replace

    from dsv41_kernels.op_table import OpTable
    from sglang_dsv41.numerics import Mode, NumericsPolicy, apply_numerics

    gate = tiny_model.layers[1].ffn.gate
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(11, tiny_model.cfg.hidden_size, generator=g) * 2).bfloat16()
    table, counts = OpTable.twins().counting()
    with torch.inference_mode():
        want_w, want_ids = gate(x)
        forced = want_ids.flip(-1)
        want_fw, _ = gate(x, forced)
        try:
            apply_numerics(tiny_model, replace(NumericsPolicy.kernels(table), moe=Mode.EXACT))
            assert "_gate" not in gate.__dict__
            apply_numerics(tiny_model, NumericsPolicy.kernels(table))
            assert gate.__dict__.get("_gate") is table.moe_gate
            got_w, got_ids = gate(x)
            got_fw, got_fids = gate(x, forced)
            calls = counts[("moe_gate", "torch")]
        finally:
            apply_numerics(tiny_model, NumericsPolicy.exact())
    assert calls == 2 and "_gate" not in gate.__dict__
    assert want_ids.dtype == torch.int64 and got_ids.dtype == torch.int32
    assert torch.equal(got_ids.long(), want_ids) and torch.equal(got_fids.long(), forced)
    assert torch.equal(_bits(got_w), _bits(want_w)) and torch.equal(_bits(got_fw), _bits(want_fw))
