"""Inputs and the tolerance for the fp32 GEMM op `fp32_linear` (interpreter script and GPU test).

Tolerance. With u = 2**-24 and S[m, n] = sum_k |x[m, k] * w[n, k]| (exact, float64):
  the twin (any BLAS order of K products, each exact or rounded once, fp32 adds) is within
      gamma_K * S ~ K u S of the exact dot product;
  the kernel's FMA path (fp32 operand) rounds each term at most CHUNK + C times on its way into the
      result (one chain per chunk, then C chunk adds): within (K + C) u S; under the interpreter
      (product rounded, then the add) within (K + C + 1) u S;
  its bf16 tensor-core path adds 16 exact products per MMA step in the hardware's own alignment and
      rounding; we allow it the FMA path's bound again (2 K u S).
So |kernel - twin| <= K * 2**-22 * S (4 K u S) covers both with margin; observed errors are ~sqrt(K) u S.
"""

from __future__ import annotations

import torch

U = 2.0**-24


def tolerance(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [M, K], w [N, K] -> float64 [M, N]: K * 2**-22 * sum_k |x w| (module docstring)."""
    s = x.double().abs() @ w.double().abs().T
    return 4 * x.size(-1) * U * s


def assert_within(got: torch.Tensor, want: torch.Tensor, x: torch.Tensor, w: torch.Tensor, what: str = "") -> None:
    """|got - want| <= tolerance(x, w) elementwise (got, want fp32 [M, N]; x [M, K], w [N, K])."""
    assert got.shape == want.shape and got.dtype == want.dtype == torch.float32, (got.shape, want.shape, what)
    err = (got.double() - want.double()).abs()
    tol = tolerance(x, w).to(err.device)
    bad = err > tol
    if bad.any():
        i = int(bad.flatten().nonzero()[0])
        raise AssertionError(f"{what}: {int(bad.sum())} entries off; first [{i}]: got {got.flatten()[i].item()!r}, "
                             f"want {want.flatten()[i].item()!r}, tol {tol.flatten()[i].item():.3g}")


def build(m: int, n: int, k: int, x_dtype: torch.dtype, w_dtype: torch.dtype, seed: int, device="cpu"):
    """(x [m, k], w [n, k]) with magnitudes over four decades, exact zeros, and a row / a column of
    pairwise-cancelling terms (a result near 0 whose error is set by S, not by the result)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.pow(10.0, torch.rand(m, k, generator=g) * 4 - 2)
    w = torch.randn(n, k, generator=g) * torch.pow(10.0, torch.rand(n, k, generator=g) * 2 - 1) * 0.05
    x[torch.rand(m, k, generator=g) < 0.05] = 0
    if m > 1 and k > 1:
        half = k // 2
        x[1, half : 2 * half] = -x[1, :half]
        if n:
            w[0, half : 2 * half] = w[0, :half]
    return x.to(x_dtype).to(device), w.to(w_dtype).to(device)


def assert_bits_equal(a: torch.Tensor, b: torch.Tensor, what: str = "") -> None:
    assert a.shape == b.shape, (a.shape, b.shape, what)
    same = a.view(torch.int32) == b.view(torch.int32)
    if not bool(same.all()):
        i = int((~same).flatten().nonzero()[0])
        raise AssertionError(f"{what}: {int((~same).sum())} of {a.numel()} differ; first [{i}]: "
                             f"{a.flatten()[i].item()!r} vs {b.flatten()[i].item()!r}")
