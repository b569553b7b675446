"""One comparison helper and one tolerance table for kernel tests (style guide, practice 6).

| kind        | rule                                                                   |
|-------------|------------------------------------------------------------------------|
| bitwise     | same shape/dtype; integer/byte tensors equal; float tensors equal bit   |
|             | for bit except NaN payloads (NaN positions must agree)                  |
| bf16        | bf16 attention / gate outputs: |d| <= 1e-3 + 2.01/128 |want| elementwise, |
|             | 1 - cos <= 5e-6, NaN/inf positions agree                                |
| attention   | bf16 attention against the common fp64 oracle: max |kernel - exact| <=  |
|             | 2 x max |twin - exact| + 1e-3 and 1 - cos(kernel, exact) <= 5e-6. The  |
|             | elementwise bf16 rule is tighter than the twin's own error when a few   |
|             | keys dominate (bf16 probabilities rounded against a split-local max)    |
| fp8_gemm    | block-scaled FP8/FP4 GEMM (bf16 out) vs its exact twin: NaN/inf         |
|             | positions agree; |d| <= 2^-7 |want| + bound elementwise, where the      |
|             | case supplies bound = 2^-8 x sum_k |x_dq w_dq| (kernel_cases.gemm_slack,  |
|             | which explains it); 1 - cos <= 1e-4 per row (fp8 paths, vLLM)          |
| index_scores| bitwise, except an element where kernel and twin are neighbouring bf16    |
|             | values and the exact head sum (kernel_cases.exact_index_scores) lies    |
|             | within 2^-18 relative of their midpoint: the fp32 order of the 32-term  |
|             | head sum decides such a tie (torch's CPU and CUDA twins differ there)   |
On failure the worst element's index and both values are printed.
"""

from __future__ import annotations

import torch

TOLERANCES = {"bf16": dict(rtol=2.01 / 128, atol=1e-3, cos=5e-6), "fp8_gemm": dict(rtol=2.0**-7, cos=1e-4)}


def _nan_aware_equal(got: torch.Tensor, want: torch.Tensor) -> tuple[bool, str]:
    gn, wn = torch.isnan(got), torch.isnan(want)
    if not torch.equal(gn, wn):
        i = (gn != wn).nonzero()[0].tolist()
        return False, f"NaN positions differ, first at {i}: got {got[tuple(i)]}, want {want[tuple(i)]}"
    bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[got.element_size()]
    g, w = got.masked_fill(gn, 0).view(bits), want.masked_fill(wn, 0).view(bits)
    if not torch.equal(g, w):
        i = (g != w).nonzero()
        j = tuple(i[0].tolist())
        return False, f"{i.size(0)} elements differ, first at {j}: got {got[j].item()!r}, want {want[j].item()!r}"
    return True, ""


def assert_match(got: torch.Tensor, want: torch.Tensor, kind: str = "bitwise", what: str = "",
                 bound: torch.Tensor | None = None) -> None:
    """`bound`: per-element absolute slack, required by (and only used for) kind "fp8_gemm"."""
    got, want = got.detach().cpu(), want.detach().cpu()
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    if kind == "fp8_gemm":
        assert bound is not None, f"{what}: fp8_gemm needs the case's bound"
        return _assert_fp8_gemm(got, want, bound.detach().cpu(), what)
    if kind == "bitwise":
        if got.is_floating_point():
            ok, msg = _nan_aware_equal(got, want)
            assert ok, f"{what}: {msg}"
        else:
            if not torch.equal(got, want):
                i = (got != want).nonzero()
                j = tuple(i[0].tolist())
                raise AssertionError(f"{what}: {i.size(0)} elements differ, first at {j}: got {got[j]}, want {want[j]}")
        return
    tol = TOLERANCES[kind]
    g, w = got.double(), want.double()
    gf, wf = torch.isfinite(g), torch.isfinite(w)
    assert torch.equal(gf, wf) and torch.equal(torch.isnan(g), torch.isnan(w)), f"{what}: non-finite positions differ"
    g, w = g[wf], w[wf]
    if g.numel() == 0:
        return
    err = (g - w).abs() - (tol["atol"] + tol["rtol"] * w.abs())
    j = int(err.argmax())
    assert err[j] <= 0, f"{what}: worst finite element {j}: got {g[j].item()!r}, want {w[j].item()!r}"
    if w.norm() > 0 and g.norm() > 0:
        cos = torch.nn.functional.cosine_similarity(g, w, dim=0).item()
        assert 1 - cos <= tol["cos"], f"{what}: 1 - cos = {1 - cos:.3e} > {tol['cos']}"


def _assert_fp8_gemm(got: torch.Tensor, want: torch.Tensor, bound: torch.Tensor, what: str) -> None:
    tol = TOLERANCES["fp8_gemm"]
    g, w = got.double().reshape(-1, got.size(-1)), want.double().reshape(-1, want.size(-1))
    assert torch.equal(torch.isnan(g), torch.isnan(w)), f"{what}: NaN positions differ"
    inf = torch.isinf(w)
    assert torch.equal(torch.isinf(g), inf) and torch.equal(g[inf], w[inf]), f"{what}: inf positions or signs differ"
    fin = torch.isfinite(w)
    err = torch.where(fin, (g - w).abs() - tol["rtol"] * w.abs() - bound.double().reshape(g.shape), 0.0)
    if err.numel() and err.max() > 0:
        j = tuple((err == err.max()).nonzero()[0].tolist())
        raise AssertionError(f"{what}: worst element {j}: got {g[j].item()!r}, want {w[j].item()!r}, "
                             f"slack {tol['rtol'] * abs(w[j].item()) + bound.reshape(g.shape)[j].item():.3e}")
    for r in range(g.size(0)):  # per output row (a wrong row scale shows here even if other rows are fine)
        gr, wr = g[r][fin[r]], w[r][fin[r]]
        if gr.numel() and gr.norm() > 0 and wr.norm() > 0:
            cos = torch.nn.functional.cosine_similarity(gr, wr, dim=0).item()
            assert 1 - cos <= tol["cos"], f"{what}: row {r}: 1 - cos = {1 - cos:.3e} > {tol['cos']}"
        else:
            assert torch.equal(gr == 0, wr == 0), f"{what}: row {r}: zero rows differ"


def assert_attention(got: torch.Tensor, twin: torch.Tensor, exact: torch.Tensor, what: str = "attention") -> None:
    g, t = got.detach().cpu().double(), twin.detach().cpu().double()
    assert torch.equal(torch.isnan(g), torch.isnan(t)), f"{what}: NaN positions differ"
    ok = torch.isfinite(exact) & torch.isfinite(t)
    eg, et = (g - exact)[ok].abs().max().item(), (t - exact)[ok].abs().max().item()
    assert eg <= 2 * et + 1e-3, f"{what}: max error vs fp64 {eg:.3e} > 2 x twin's {et:.3e} + 1e-3"
    if exact[ok].norm() > 0:
        cos = torch.nn.functional.cosine_similarity(g[ok], exact[ok], dim=0).item()
        assert 1 - cos <= 5e-6, f"{what}: 1 - cos vs fp64 = {1 - cos:.3e}"


def assert_index_scores(got: torch.Tensor, want: torch.Tensor, exact: torch.Tensor, what: str = "index_scores") -> None:
    """Kind "index_scores" (table above). got / want fp32 [T, n] holding bf16 values; exact fp64."""
    got, want, exact = got.detach().cpu(), want.detach().cpu(), exact.detach().cpu()
    assert got.shape == want.shape == exact.shape, f"{what}: shapes {got.shape} {want.shape} {exact.shape}"
    diff = ~((got == want) | (torch.isnan(got) & torch.isnan(want)))
    if not diff.any():
        return
    g, w, e = got[diff].double(), want[diff].double(), exact[diff]
    ulp = torch.ldexp(torch.ones_like(g), torch.frexp(torch.maximum(g.abs(), w.abs())).exponent - 8)
    neighbours = ((g - w).abs() <= ulp) & torch.isfinite(g) & torch.isfinite(w)
    mid = (g + w) / 2
    tie = (e - mid).abs() <= 2.0**-18 * mid.abs()
    bad = ~(neighbours & tie)
    if bad.any():
        j = tuple(diff.nonzero()[bad.nonzero()[0, 0]].tolist())
        raise AssertionError(f"{what}: {int(bad.sum())} of {int(diff.sum())} differing elements are not head-sum ties, "
                             f"first at {j}: got {got[j].item()!r}, want {want[j].item()!r}, exact {exact[j].item()!r}")
