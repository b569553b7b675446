"""Inputs of the mHC ops for the kernel tests (CPU tests, interpreter script and GPU tests).

build_gates(t, n, h, ...) -> (x, mix, base, scale): x [t, n*h] bf16|fp32 streams with per-row
magnitudes over 1e-3..1e3, mix [t, (2+n)n] fp32 at `mix_scale` (after the rsqrt it lands around
mix_scale), base / scale fp32 at checkpoint-like magnitudes. `extreme` adds rows that reach the
corners: a zero row (rstd = rsqrt(eps)), bf16 values whose squares overflow (rstd = 0), logits far
apart (exp underflows to 0 and subnormals), a NaN mix, an inf mix, ties, mixes exactly 0.

build_enter(t, n, h, ...) -> the arguments of `mhc_enter` (streams, fn, base, scale, iters, hc_eps,
norm_eps, prev_pre, weight): build_gates' x as the streams, an fp32 fn at 1/sqrt(nH), prev_pre in
0.1..1.1, a bf16 weight around 1. `enter_oracle(args, mix)` is the op's value given the mix GEMM's result
(the twins of the gates, collapse and norm on it), for kernels whose GEMM order is not the twin's.

build_streams(t, n, h, ...) -> (y, streams, pre, post, comb): the inputs of `mhc_collapse` /
`mhc_expand`, streams and y at per-element magnitudes over 1e-6..1e6, gates of either sign over
1e-3..1e1 (wider than the model's: pre, post > 0, comb in [0, 1]). `extreme` (t >= 12) adds rows of
+0, -0 (the sums start at +0: -0 terms give +0), inf / NaN streams and gates, stream values near the
bf16 maximum (fp32 sums that round to bf16 inf or stay just below), exact cancellations, subnormal
products and a 0 * inf.
"""

from __future__ import annotations

import torch

HC_EPS, NORM_EPS = 1e-6, 1e-6


def build_gates(t: int, n: int, h: int, seed: int, dtype: torch.dtype = torch.bfloat16, mix_scale: float = 3.0,
                extreme: bool = False, device: str = "cpu"):
    g = torch.Generator().manual_seed(seed)
    d, w = n * h, (2 + n) * n
    x = torch.randn(t, d, generator=g) * torch.pow(10.0, torch.rand(t, 1, generator=g) * 6 - 3)
    x = x * torch.pow(10.0, torch.rand(t, d, generator=g) - 0.5)  # wide range inside a row too
    rms = x.float().square().mean(-1, keepdim=True).sqrt()
    mix = torch.randn(t, w, generator=g) * mix_scale * rms  # ~ mix_scale after the rsqrt
    base = torch.randn(w, generator=g)
    scale = torch.rand(3, generator=g) * 2 + 0.05
    if extreme and t >= 8:
        x[0] = 0
        x[1, :: max(1, d // 7)] = 3e38  # squares overflow: rstd = 0
        mix[2] = torch.linspace(-400, 400, w) * rms[2]  # far-apart logits: exp -> 0 / subnormal
        mix[3, w // 2] = float("nan")
        mix[4, -1] = float("inf")
        mix[5] = 0
        mix[6, 2 * n :] = 7.0 * rms[6]  # all Sinkhorn logits equal (ties in the row max)
        x[7] = x[7] * 1e-30  # mean square underflows below eps
    return x.to(dtype).to(device), mix.to(device), base.to(device), scale.to(device)


def build_enter(t: int, n: int, h: int, seed: int, dtype: torch.dtype = torch.bfloat16, extreme: bool = False,
                device: str = "cpu", iters: int = 20) -> tuple:
    x, _, base, scale = build_gates(t, n, h, seed, dtype, extreme=extreme, device=device)
    g = torch.Generator().manual_seed(seed + 1)
    fn = torch.randn((2 + n) * n, n * h, generator=g) / (n * h) ** 0.5
    prev = torch.rand(t, n, generator=g) + 0.1
    weight = (1 + 0.2 * torch.randn(h, generator=g)).bfloat16()
    return (x.view(t, n, h), fn.to(device), base, scale, iters, HC_EPS, NORM_EPS, prev.to(device), weight.to(device))


def enter_oracle(args: tuple, mix: torch.Tensor) -> tuple:
    """`mhc_enter`'s value given mix = the site's GEMM: (pre, post, comb, x) from the twins."""
    from dsv41_kernels import ops

    streams, _, base, scale, iters, hc_eps, norm_eps, prev, weight = args
    gates = ops.mhc_gates.torch(streams.flatten(1), mix, base, scale, iters, hc_eps, norm_eps)
    return (*gates, ops.rms_norm.torch(ops.mhc_collapse.torch(streams, prev), weight, norm_eps))


def bits(t: torch.Tensor) -> torch.Tensor:
    """fp32 bit patterns, all NaNs one value (NaN payloads may differ between devices)."""
    b = t.float().contiguous().view(torch.int32)
    return torch.where(torch.isnan(t), torch.full_like(b, 0x7FC00000), b)


def assert_gates_equal(got, want, what: str = "") -> None:
    """(pre, post, comb) bitwise, NaN positions equal."""
    for name, a, b in zip(("pre", "post", "comb"), got, want):
        assert a.shape == b.shape and a.dtype == b.dtype == torch.float32, f"{what} {name}: {a.shape} {a.dtype} vs {b.shape} {b.dtype}"
        diff = (bits(a) != bits(b)).nonzero()
        assert diff.numel() == 0, (f"{what} {name}: {diff.size(0)} of {a.numel()} differ, first at {diff[0].tolist()}: "
                                   f"{a[tuple(diff[0])].item()!r} vs {b[tuple(diff[0])].item()!r}")


def build_streams(t: int, n: int, h: int, seed: int, dtype: torch.dtype = torch.bfloat16, extreme: bool = False,
                  device: str = "cpu"):
    g = torch.Generator().manual_seed(seed)

    def wide(*shape, lo=-6.0, hi=6.0):
        return torch.randn(*shape, generator=g) * torch.pow(10.0, torch.rand(*shape, generator=g) * (hi - lo) + lo)

    streams, y = wide(t, n, h), wide(t, h)
    pre, post, comb = wide(t, n, lo=-3, hi=1), wide(t, n, lo=-3, hi=1), wide(t, n, n, lo=-3, hi=1)
    if extreme and t >= 12:
        big = 3.3e38  # bf16 max is 3.3895e38: two or more such terms overflow fp32 or round to bf16 inf
        streams[0], y[0] = 0.0, 0.0
        streams[1], y[1] = -0.0, -0.0
        pre[2], post[2], comb[2] = -0.0, -0.0, -0.0  # -0 gates on finite streams
        streams[3, :, ::5] = float("inf")
        streams[3, -1, 1::7] = float("-inf")
        streams[4, 0, ::3] = float("nan")
        y[4, ::11] = float("nan")
        streams[5] = big * torch.sign(torch.randn(n, h, generator=g))
        pre[5], post[5], comb[5] = 1.0, 1.0, 0.5
        streams[6] = 1.69e38  # just below half of the bf16 max: sums near the bf16 overflow threshold
        y[6] = 1.7e38
        pre[6, :] = torch.linspace(0.5, 1.0, n)
        comb[6] = torch.linspace(0.25, 1.0, n * n).view(n, n)
        streams[7, 0] = streams[7, -1]
        pre[7, 0], pre[7, -1] = 1.0, -1.0 if n > 1 else 1.0  # exact cancellation (n > 1): a +0 partial sum
        streams[8] = 1e-30
        pre[8], post[8], comb[8] = 1e-10, 1e-10, 1e-10  # subnormal / underflowing products
        pre[9, 0], post[9, 0], comb[9, 0, 0] = float("inf"), float("inf"), float("inf")
        streams[9, 0, ::2] = 0.0  # 0 * inf = NaN
        y[9, ::3] = 0.0
        pre[10, -1], post[10, -1], comb[10, -1, 0] = float("nan"), float("nan"), float("nan")
        streams[11] = torch.where(torch.rand(n, h, generator=g) < 0.5, -0.0, 0.0)
        y[11] = -0.0
    cast = lambda x: x.to(dtype).to(device)  # noqa: E731
    return cast(y), cast(streams), pre.to(device), post.to(device), comb.to(device)


def assert_bits_equal(got: torch.Tensor, want: torch.Tensor, what: str = "") -> None:
    """Same shape and dtype, bitwise equal values (signed zeros included), NaN positions equal."""
    assert got.shape == want.shape and got.dtype == want.dtype, \
        f"{what}: {got.shape} {got.dtype} vs {want.shape} {want.dtype}"
    diff = (bits(got) != bits(want)).nonzero()
    assert diff.numel() == 0, (f"{what}: {diff.size(0)} of {got.numel()} differ, first at {diff[0].tolist()}: "
                               f"{got[tuple(diff[0])].item()!r} vs {want[tuple(diff[0])].item()!r}")
