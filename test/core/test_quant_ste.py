"""CPU: the straight-through forms of the quantizers (`quant.*_ste`, quant/ste.py).

Oracles: the forward value of each op is the serving quantizer of `sglang_dsv41.quant` (bitwise);
the gradient is the upstream gradient where |x / scale| <= the format's max and zero where the
quantizer clipped. Formats whose scale is a ceil power of two of amax / max cannot clip: their
gradient must be the identity on every element, extreme groups included. The compressed-KV FP4
scale is an RNE E4M3 of amax / 6, which can round down: the groups built below clip exactly the
elements computed by hand.
"""

from __future__ import annotations

import pytest
import torch

from sglang_dsv41 import quant


def _x(shape, seed=0, scale=1.0, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * scale
    # extreme groups: huge and tiny magnitudes, exact powers of two, zeros, negative zero
    x[0, :32] = torch.logspace(-8, 3, 32)
    x[1, :32] = 2.0 ** torch.arange(-16, 16).float()
    x[2, :32] = 0.0
    x[2, 5] = -0.0
    x[3, :32] = 1e-6
    return x.to(dtype)


def _grad(op, x):
    x = x.clone().requires_grad_(True)
    y = op(x)
    up = torch.randn(y.shape, generator=torch.Generator().manual_seed(7)).to(y.dtype)
    y.backward(up)
    return y.detach(), x.grad, up


CASES = {
    "mxfp8_act": (quant.mxfp8_qdq_ste, quant.mxfp8_qdq, torch.bfloat16),
    "window_kv": (quant.window_kv_qdq_ste, quant.window_kv_qdq, torch.bfloat16),
    "kv_fp4": (quant.kv_fp4_qdq_ste, quant.kv_fp4_qdq, torch.bfloat16),
    "index_fp4": (quant.index_fp4_qdq_ste, quant.index_fp4_qdq, torch.bfloat16),
    "fp8_block_weight": (quant.fp8_weight_qdq_ste, lambda w: quant.dequant_fp8_weight(*quant.quant_fp8_weight(w)), torch.float32),
    "mxfp4_weight": (quant.mxfp4_qdq_ste, lambda w: quant.dequant_mxfp4(*quant.quant_mxfp4(w)), torch.float32),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_forward_is_the_serving_quantizer_bitwise(name):
    op, serving, dtype = CASES[name]
    x = _x((8, 128), seed=1, dtype=dtype)
    got = op(x)
    want = serving(x)
    assert got.dtype == want.dtype
    assert torch.equal(got.view(torch.int16 if got.dtype == torch.bfloat16 else torch.int32),
                       want.view(torch.int16 if want.dtype == torch.bfloat16 else torch.int32))


@pytest.mark.parametrize("name", ["mxfp8_act", "window_kv", "index_fp4", "fp8_block_weight", "mxfp4_weight"])
def test_ceil_scaled_formats_never_clip_gradient_is_identity(name):
    op, _, dtype = CASES[name]
    x = _x((8, 128), seed=2, scale=50.0, dtype=dtype)
    y, gx, up = _grad(op, x)
    assert torch.equal(gx, up.to(dtype))


def test_kv_fp4_gradient_zero_exactly_where_clipped():
    # group of 16: amax = 6 * 1.0625 -> amax/6 = 1.0625 rounds (RNE, 3 mantissa bits) DOWN to 1.0,
    # so x / s = 6.375 is clipped to 6; every other element is inside the grid.
    x = torch.zeros(4, 64)
    x[0, :16] = torch.linspace(-3, 3, 16)
    x[0, 3] = 6.375
    # amax/6 = 1.1875 rounds UP to 1.25: nothing clipped in this group
    x[0, 16:32] = torch.linspace(-2, 2, 16)
    x[0, 20] = -7.125
    # saturated scale: amax / 6 > 448 -> scale 448, elements above 6 * 448 = 2688 clip
    x[1, :16] = torch.tensor([3000.0, -2700.0, 2688.0, 100.0] + [1.0] * 12)
    x = x.to(torch.bfloat16)
    y, gx, up = _grad(quant.kv_fp4_qdq_ste, x)
    clipped = torch.zeros(4, 64, dtype=torch.bool)
    clipped[0, 3] = True
    clipped[1, 0] = clipped[1, 1] = True
    assert torch.equal(y, quant.kv_fp4_qdq(x))
    assert y[0, 3].item() == 6.0 and y[1, 0].item() == 2688.0  # they really were clipped
    assert torch.equal(gx[clipped], torch.zeros(3, dtype=torch.bfloat16))
    assert torch.equal(gx[~clipped], up[~clipped])


def test_kv_fp4_random_rows_clip_where_the_max_exceeds_six_scales():
    x = torch.randn(64, 128, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    _, gx, up = _grad(quant.kv_fp4_qdq_ste, x)
    _, s8 = quant.kv_fp4_quant(x)
    limit = 6 * s8.float().repeat_interleave(16, dim=-1)
    clipped = x.float().abs() > limit
    assert clipped.any() and clipped.sum() < 0.1 * x.numel()  # RNE scales round down in about half the groups
    assert torch.equal(gx[clipped], torch.zeros(int(clipped.sum()), dtype=torch.bfloat16))
    assert torch.equal(gx[~clipped], up[~clipped])


def test_nan_elements_get_zero_gradient():
    x = torch.randn(2, 64).to(torch.bfloat16)
    x[0, 7] = float("nan")
    _, gx, up = _grad(quant.mxfp8_qdq_ste, x)
    assert gx[0, 7] == 0 and torch.equal(gx[1], up[1])


@pytest.mark.parametrize("fmt", ["fp8", "fp4"])
def test_linear_value_is_the_serving_gemm_and_gradient_is_ste(fmt):
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(5, 64, generator=g) * 3).to(torch.bfloat16).requires_grad_(True)
    w = (torch.randn(96, 64, generator=g) / 8).requires_grad_(True)
    if fmt == "fp8":
        y = quant.fp8_linear_ste(x, w)
        want = quant.fp8_linear(x.detach(), *quant.quant_fp8_weight(w.detach()))
        wdq = quant.dequant_fp8_weight(*quant.quant_fp8_weight(w.detach()))
    else:
        y = quant.fp4_linear_ste(x, w)
        want = quant.fp4_linear(x.detach(), *quant.quant_mxfp4(w.detach()))
        wdq = quant.dequant_mxfp4(*quant.quant_mxfp4(w.detach()))
    assert torch.equal(y.detach(), want)
    up = torch.randn(y.shape, generator=g).to(torch.bfloat16)
    y.backward(up)
    xdq = quant.mxfp8_qdq(x.detach()).float()
    assert torch.equal(x.grad, (up.float() @ wdq).to(torch.bfloat16))
    assert torch.equal(w.grad, up.float().t() @ xdq)


def test_exact_value_takes_value_from_exact_and_gradient_from_surrogate():
    x = torch.tensor([1.3, -2.7, 0.4], requires_grad=True)
    y = quant.exact_value(lambda t: torch.round(t), lambda t: 2 * t, x)
    assert torch.equal(y.detach(), torch.tensor([1.0, -3.0, 0.0]))
    y.sum().backward()
    assert torch.equal(x.grad, torch.full((3,), 2.0))
