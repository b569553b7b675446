"""Inputs for the grouped MoE op (`moe_experts`): random MXFP4 experts, distinct top-k ids per row."""

from __future__ import annotations

import torch

from sglang_dsv41.quant import quant_mxfp4


def build_moe(t: int, k: int, e: int, hid: int, inter: int, seed: int, device: str = "cpu", scale: float = 0.05):
    """-> (x, ids, weights, w1, s1, w3, s3, w2, s2) with int8 packed weights (as MXFP4Linear stores them),
    ids int64 [t, k] distinct per row (every expert id used when t*k >= e), weights fp32 in (0, 1)."""
    g = torch.Generator().manual_seed(seed)

    def experts(n: int, kk: int):
        w, s = quant_mxfp4(torch.randn(e, n, kk, generator=g) * scale)
        return w.view(torch.int8).to(device), s.to(device)

    w1, s1 = experts(inter, hid)
    w3, s3 = experts(inter, hid)
    w2, s2 = experts(hid, inter)
    x = (torch.randn(t, hid, generator=g) * torch.pow(10.0, torch.rand(t, 1, generator=g) * 2 - 1)).bfloat16().to(device)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]) if t else torch.zeros(0, k, dtype=torch.long)
    weights = torch.rand(t, k, generator=g)
    return x, ids.to(device), weights.to(device), w1, s1, w3, s3, w2, s2


def assert_moe_close(got: torch.Tensor, want: torch.Tensor, what: str = "moe_experts") -> None:
    """Per (token, slot) output row: relative L2 error <= 2^-3 and 1 - cos <= 1e-2; over all rows, the
    relative Frobenius error <= 2^-5. h = the SwiGLU output is re-quantized to MXFP8 before w2, so a
    one-ulp change of g or u (the fp8 tensor-core partials of w1 / w3, Triton's exp in silu) moves an
    element of h by one E4M3 step (2^-4 relative) or a group's scale: rows are compared by norm, not
    element by element. Calibrated on the CPU by perturbing 10% of g and u by one bf16 ulp (worst row
    of 8000 with I = 256: 0.064, 1 - cos 1.3e-3); a wrong expert, slot or routing weight gives ~1."""
    g, w = got.double().cpu().flatten(0, -2), want.double().cpu().flatten(0, -2)
    assert g.shape == w.shape, (g.shape, w.shape)
    assert torch.isfinite(g).all() and torch.isfinite(w).all(), f"{what}: non-finite output"
    wn = w.norm(dim=-1)
    live = wn > 0
    err = (g - w).norm(dim=-1)[live] / wn[live]
    cos = torch.nn.functional.cosine_similarity(g[live], w[live], dim=-1)
    assert (g[~live] == 0).all(), f"{what}: rows that should be zero are not"
    if err.numel():
        worst = int(err.argmax())
        assert err[worst] <= 2.0**-3, f"{what}: live row {worst} relative L2 error {err[worst]:.3e}"
        assert (1 - cos).max() <= 1e-2, f"{what}: 1 - cos {(1 - cos).max():.3e}"
        assert (g - w).norm() <= 2.0**-5 * w.norm(), f"{what}: relative Frobenius error {(g - w).norm() / w.norm():.3e}"
