"""Inputs of the `mhc_gates` op for the kernel tests (CPU interpreter script and GPU tests).

build_gates(t, n, h, ...) -> (x, mix, base, scale): x [t, n*h] bf16|fp32 streams with per-row
magnitudes over 1e-3..1e3, mix [t, (2+n)n] fp32 at `mix_scale` (after the rsqrt it lands around
mix_scale), base / scale fp32 at checkpoint-like magnitudes. `extreme` adds rows that reach the
corners: a zero row (rstd = rsqrt(eps)), bf16 values whose squares overflow (rstd = 0), logits far
apart (exp underflows to 0 and subnormals), a NaN mix, an inf mix, ties, mixes exactly 0.
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
