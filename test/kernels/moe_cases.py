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


def combine_cases(device: str = "cpu") -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(routed bf16 [T, k, H], shared bf16 [T, H]) for `moe_combine`: magnitudes over 10^+-4 (adds that round),
    signed zeros (all -0 gives +0: the sum starts from +0), inf / NaN, H not a multiple of the kernel's block,
    a column slice of a wider tensor (row strides != H, as the EP layer passes), T = 0."""
    g = torch.Generator().manual_seed(5)
    cases = []
    for t, k, h in ((3, 6, 640), (5, 2, 1500), (1, 1, 32)):
        mag = torch.pow(10.0, torch.randint(-4, 5, (t, k, h), generator=g).float())
        routed = (torch.randn(t, k, h, generator=g) * mag).bfloat16()
        shared = (torch.randn(t, h, generator=g) * 100).bfloat16()
        cases.append((routed, shared))
    routed, shared = cases[0]
    routed, shared = routed.clone(), shared.clone()
    routed[0, :, :4], shared[0, :4] = -0.0, -0.0
    routed[1, 2, 5], routed[1, 3, 6], shared[2, 7] = float("inf"), float("nan"), float("-inf")
    cases.append((routed, shared))
    wide_r, wide_s = torch.randn(4, 6, 900, generator=g).bfloat16(), torch.randn(4, 900, generator=g).bfloat16()
    cases.append((wide_r[..., 100:740], wide_s[:, 100:740]))
    cases.append((torch.zeros(0, 6, 64).bfloat16(), torch.zeros(0, 64).bfloat16()))
    return [(r.to(device), s.to(device)) for r, s in cases]


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equal bf16 tensors, any NaN equal to any NaN (NaN payloads and signs are not part of the contract)."""
    nan = a.isnan()
    return a.dtype == b.dtype and torch.equal(nan, b.isnan()) and torch.equal(a[~nan].view(torch.int16), b[~nan].view(torch.int16))


def swiglu_cases(device: str = "cpu") -> list[tuple]:
    """(g bf16 [t, I], u bf16 [t, I], limit, weight fp32 [t, 1] | None) for the `swiglu` op: magnitudes over
    10^+-3 around the limit, g far below -20 (exp overflow: silu -> -0) and above (silu -> g), NaN / inf
    entries, no clamp (limit 0), no weight, a column slice (row stride != I), t = 0."""
    g = torch.Generator().manual_seed(9)
    cases = []
    for t, n, limit, weighted in ((5, 2304, 10.0, False), (3, 700, 7.0, True), (4, 96, 0.0, True)):
        mag = torch.pow(10.0, torch.randint(-3, 3, (2, t, n), generator=g).float())
        gg, uu = (torch.randn(2, t, n, generator=g) * mag).bfloat16()
        gg[0, :8] = torch.tensor([-200.0, -88.0, -20.5, 20.5, 90.0, float("nan"), float("inf"), float("-inf")])
        uu[1, :3] = torch.tensor([float("nan"), float("-inf"), -0.0])
        w = torch.rand(t, 1, generator=g) * 2 if weighted else None
        cases.append((gg, uu, limit, w))
    wide = torch.randn(2, 3, 900, generator=g).bfloat16()
    cases.append((wide[0, :, 100:740], wide[1, :, 100:740], 10.0, None))
    cases.append((torch.zeros(0, 64).bfloat16(), torch.zeros(0, 64).bfloat16(), 10.0, torch.zeros(0, 1)))
    return [(a.to(device), b.to(device), lim, None if w is None else w.to(device)) for a, b, lim, w in cases]


def route_cases(device: str = "cpu") -> list[tuple]:
    """(logits fp32 [T, E], bias fp32 [E] | [T, E], k, scale, norm, forced | None) for `moe_route`: the
    release's 384 experts top-6, logits past softplus's threshold 20 and far below 0, E not a power of
    two, per-row biases (image rows), k = 1, no renormalisation, forced ids (int32), T = 0."""
    g = torch.Generator().manual_seed(13)
    cases = []
    for t, e, k, scale, norm in ((9, 384, 6, 2.5, True), (5, 16, 6, 1.0, True), (4, 40, 1, 1.5, True),
                                 (3, 100, 4, 1.0, False)):
        z = torch.randn(t, e, generator=g) * 4
        z[0, :3] = torch.tensor([25.0, -120.0, 20.0])
        bias = torch.randn(e, generator=g) * 0.1
        cases.append((z, bias, k, scale, norm, None))
    z, bias = torch.randn(6, 64, generator=g) * 3, torch.randn(6, 64, generator=g) * 0.2
    cases.append((z, bias, 6, 2.0, True, None))
    forced = torch.stack([torch.randperm(64, generator=g)[:6] for _ in range(6)]).int()
    cases.append((z, bias[0], 6, 2.0, True, forced))
    cases.append((torch.zeros(0, 384), torch.zeros(384), 6, 1.0, True, None))
    return [(z.to(device), b.to(device), k, sc, nm, None if f is None else f.to(device)) for z, b, k, sc, nm, f in cases]


def gate_cases(device: str = "cpu") -> list[tuple]:
    """(x bf16 [T, H], weight bf16 [E, H], bias fp32 [E] | [T, E], k, scale, norm, forced | None,
    fp32_gemm_triton config | None) for `moe_gate`: 16 and 384 experts top-6, one and several chunk partials
    of the logits GEMM (the route launch then folds them), per-row biases, forced ids, T = 0."""
    g = torch.Generator().manual_seed(17)
    cases = []
    for t, e, h, cfg in ((8, 16, 256, (16, 64, 32, True, True, 4, 2, 64)), (3, 40, 96, None),
                         (9, 384, 128, (16, 64, 32, True, True, 4, 2, 32)), (5, 16, 64, None)):
        x = (torch.randn(t, h, generator=g) * 2).bfloat16()
        w = (torch.randn(e, h, generator=g) * 0.3).bfloat16()
        cases.append((x, w, torch.randn(e, generator=g) * 0.1, 6, 2.5, True, None, cfg))
    x, w = (torch.randn(6, 64, generator=g)).bfloat16(), (torch.randn(64, 64, generator=g) * 0.3).bfloat16()
    forced = torch.stack([torch.randperm(64, generator=g)[:6] for _ in range(6)]).int()
    cases.append((x, w, torch.randn(6, 64, generator=g) * 0.2, 6, 2.0, True, None, None))
    cases.append((x, w, torch.randn(64, generator=g) * 0.2, 6, 2.0, True, forced, (16, 64, 32, True, True, 4, 2, 32)))
    cases.append((torch.zeros(0, 64).bfloat16(), w, torch.zeros(64), 6, 1.0, True, None, None))
    return [(x.to(device), w.to(device), b.to(device), k, sc, nm, None if f is None else f.to(device), cfg)
            for x, w, b, k, sc, nm, f, cfg in cases]
