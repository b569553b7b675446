"""GPU: the grouped W4A8 MoE kernels (`moe_experts`, two launches over all experts) against their
torch twin (row tolerance of moe_cases.assert_moe_close), bitwise batch invariance and config
independence in deterministic mode, the fast mode's K split at decode, the one-launch routing tables (bitwise the torch ops'), the bf16 prefill path (moe_prefill)
against the twin and its expert chunks, CUDA-graph capture (no host sync); `moe_combine`, the RMSNorm
kernel, the shared expert's `swiglu` and the router `moe_route` bitwise against their twins on CUDA;
`moe_gate` bitwise against the kernels it fuses.
Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from moe_cases import assert_moe_close, build_moe

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (Triton kernels)")


def _ops():
    from dsv41_kernels import ops

    return ops


@pytest.mark.parametrize("t, k, e, hid, inter", [(1, 6, 16, 512, 256), (7, 6, 16, 512, 256), (64, 6, 16, 1024, 512),
                                                 (300, 6, 16, 512, 2304 // 4), (2, 2, 256, 256, 96), (0, 6, 16, 512, 256),
                                                 (1000, 8, 32, 512, 256)])
def test_moe_matches_twin(t, k, e, hid, inter):
    ops = _ops()
    args = build_moe(t, k, e, hid, inter, seed=t + e, device="cuda")
    got = ops.moe_experts.triton(*args, 10.0)
    torch.cuda.synchronize()
    want = ops.moe_experts.torch(*args, 10.0)
    assert got.shape == want.shape == (t, k, hid)
    if t:
        assert_moe_close(got, want)


def test_combine_bitwise_twin():
    """`moe_combine` (one launch) == its twin bit for bit (NaN as NaN), also on column slices, and at a decode
    step's and a prefill chunk's shapes."""
    from moe_cases import combine_cases, same_bits

    ops = _ops()
    g = torch.Generator(device="cuda").manual_seed(1)
    big = [(torch.randn(t, 6, 5120, device="cuda", generator=g).bfloat16(), torch.randn(t, 5120, device="cuda", generator=g).bfloat16())
           for t in (8, 8192)]
    for routed, shared in combine_cases("cuda") + big:
        assert same_bits(ops.moe_combine.triton(routed, shared), ops.moe_combine.torch(routed, shared)), tuple(routed.shape)


def test_moe_no_limit_and_large_values():
    ops = _ops()
    args = build_moe(33, 6, 16, 512, 256, seed=3, device="cuda", scale=0.5)
    assert_moe_close(ops.moe_experts.triton(*args, 0.0), ops.moe_experts.torch(*args, 0.0))


def test_moe_batch_invariant_and_config_independent(monkeypatch):
    """Deterministic mode: rows of a 300-token call equal (bitwise) the same tokens alone, in a 17-token call,
    in a 64-token call (24 pairs per expert: the 32-pair decode tiles) and under every tile config (the
    pairs' grouping, the tile shape and the packed scale words change no bit; hidden 512 and inter 256
    are 16 and 8 K blocks, so the packed scale words run in both GEMMs). Without it, the
    300-token call (112 pairs per expert) would take the bf16 prefill path (test_bf16_prefill_path)."""
    from dsv41_kernels.moe_triton import moe_experts_triton

    monkeypatch.setenv("SGLANG_DSV41_DETERMINISTIC", "1")

    x, ids, wts, *w = build_moe(300, 6, 16, 512, 256, seed=5, device="cuda")
    full = moe_experts_triton(x, ids, wts, *w, 10.0).view(torch.int16)
    for s, n in ((0, 1), (150, 1), (17, 17), (283, 17), (100, 64)):  # 64 tokens: 32-pair decode tiles
        part = moe_experts_triton(x[s : s + n], ids[s : s + n], wts[s : s + n], *w, 10.0).view(torch.int16)
        assert torch.equal(part, full[s : s + n]), f"tokens {s}..{s + n - 1}"
    for cfg in ((64, 32, 32, 4, 4), (64, 64, 128, 4, 4), (64, 128, 64, 4, 3), (128, 64, 64, 8, 3),
                (16, 64, 64, 4, 4, True), (32, 64, 128, 4, 3, True), (64, 128, 64, 8, 3, True)):
        got = moe_experts_triton(x, ids, wts, *w, 10.0, config=cfg).view(torch.int16)
        assert torch.equal(got, full), f"config {cfg}"


@pytest.mark.parametrize("t", [1, 8, 64])
def test_moe_k_split(t, monkeypatch):
    """Fast-mode decode splits K (`split_counts`): within the twin's tolerance for the picked splits and for
    others (uneven last runs); a register cap and another pipeline depth keep the bits; deterministic mode
    does not split (bitwise the unsplit config)."""
    from dsv41_kernels.moe_triton import moe_experts_triton, pick_config, split_counts

    ops = _ops()
    args = build_moe(t, 6, 16, 1024, 768, seed=70 + t, device="cuda")
    want = ops.moe_experts.torch(*args, 10.0)
    base = pick_config(t * 6, 16)
    assert max(split_counts(t * 6, 16, 768, 1024, *base[:3], torch.device("cuda"))) > 1
    for cfg in (None, base + (2, 3), base + (5, 2), base + (8, 6)):
        assert_moe_close(moe_experts_triton(*args, 10.0, config=cfg), want, f"moe_experts split {cfg}")
    capped = moe_experts_triton(*args, 10.0, config=base[:4] + (3,) + base[5:] + (2, 3, 80))  # MAXNREG 80, 3 stages
    assert torch.equal(capped.view(torch.int16), moe_experts_triton(*args, 10.0, config=base + (2, 3)).view(torch.int16))
    monkeypatch.setenv("SGLANG_DSV41_DETERMINISTIC", "1")
    plain = moe_experts_triton(*args, 10.0, config=base)
    assert torch.equal(moe_experts_triton(*args, 10.0).view(torch.int16), plain.view(torch.int16))


@pytest.mark.parametrize("t", [1, 8, 64])
def test_moe_stream_k(t):
    """The stream-K schedule (`_moe_stream_kernel`, config element STREAM): within the twin's tolerance at 1 /
    4 programs per SM (items cut into segments, the last arrival folds them) and with few programs (runs of
    whole items); the same bits on a second call and under a register cap (MAXNREG 128)."""
    from dsv41_kernels.moe_triton import moe_experts_triton, pick_config

    ops = _ops()
    args = build_moe(t, 6, 16, 1024, 768, seed=90 + t, device="cuda")
    want = ops.moe_experts.torch(*args, 10.0)
    base = pick_config(t * 6, 16)
    for per_sm in (1, 4, 0.05):
        cfg = base + (1, 1, None, per_sm)
        got = moe_experts_triton(*args, 10.0, config=cfg)
        assert_moe_close(got, want, f"moe_experts stream {cfg}")
        again = moe_experts_triton(*args, 10.0, config=base + (1, 1, 128, per_sm))
        assert torch.equal(again.view(torch.int16), got.view(torch.int16)), f"stream {cfg}: second call / MAXNREG 128"


@pytest.mark.parametrize("t, k, e", [(1, 6, 16), (8, 6, 16), (64, 6, 16), (85, 6, 384), (256, 2, 3)])
def test_fused_routing_tables(t, k, e):
    """The one-launch routing tables equal the torch ops' integers on the GPU."""
    from dsv41_kernels.moe_routing_triton import routing_tiles_fused
    from dsv41_kernels.moe_triton import routing_tiles

    g = torch.Generator().manual_seed(t)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).cuda()
    w = torch.rand(t, k, generator=g).cuda()
    for got, want in zip(routing_tiles_fused(ids, w, e, 16), routing_tiles(ids, w, e, 16)):
        assert got.dtype == want.dtype and torch.equal(got, want)


def test_bf16_prefill_path(monkeypatch):
    """A call with >= moe_prefill.ROWS_PER_EXPERT pairs per expert runs the bf16 prefill path: within the twin's
    tolerance; split into expert chunks (CHUNK_BYTES small, one host read) it gives the same bits; in
    deterministic mode the same call runs the grouped fp8 kernel (bitwise its explicit-config result)."""
    from dsv41_kernels import moe_prefill
    from dsv41_kernels.moe_triton import moe_experts_triton, pick_config

    ops = _ops()
    t, k, e, hid, inter = 400, 6, 16, 1024, 512
    assert t * k >= moe_prefill.ROWS_PER_EXPERT * e
    x, ids, wts, *w = build_moe(t, k, e, hid, inter, seed=21, device="cuda")
    got = moe_experts_triton(x, ids, wts, *w, 10.0)
    fused = moe_experts_triton(x, ids, wts, *w, 10.0, config=pick_config(t * k))
    assert not torch.equal(got.view(torch.int16), fused.view(torch.int16)), "the bf16 path did not run"
    assert_moe_close(got, ops.moe_experts.torch(x, ids, wts, *w, 10.0), "moe_experts bf16 prefill")
    monkeypatch.setattr(moe_prefill, "CHUNK_BYTES", 5 * 3 * inter * hid * 2)  # 5 experts per chunk: 4 chunks
    assert torch.equal(moe_experts_triton(x, ids, wts, *w, 10.0).view(torch.int16), got.view(torch.int16))
    monkeypatch.setenv("SGLANG_DSV41_DETERMINISTIC", "1")
    assert torch.equal(moe_experts_triton(x, ids, wts, *w, 10.0).view(torch.int16), fused.view(torch.int16))


def test_moe_no_host_sync():
    """The grouped op launches without reading anything back: it can be captured in a CUDA graph and
    replayed on new routing."""
    ops = _ops()
    x, ids, wts, *w = build_moe(8, 6, 16, 512, 256, seed=9, device="cuda")
    ops.moe_experts.triton(x, ids, wts, *w, 10.0)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = ops.moe_experts.triton(x, ids, wts, *w, 10.0)
    ids.copy_(torch.stack([torch.randperm(16, device="cuda")[:6] for _ in range(8)]))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out.view(torch.int16), ops.moe_experts.triton(x, ids, wts, *w, 10.0).view(torch.int16))


@pytest.mark.parametrize("m, d, dtype", [(1, 5120, torch.bfloat16), (300, 512, torch.bfloat16), (7, 1280, torch.float32),
                                         (4099, 128, torch.bfloat16), (0, 512, torch.bfloat16), (5, 20480, torch.bfloat16)])
def test_rms_norm_bitwise(m, d, dtype):
    ops = _ops()
    g = torch.Generator().manual_seed(m + d)
    x = (torch.randn(m, d, generator=g) * torch.pow(10.0, torch.rand(m, 1, generator=g) * 6 - 3)).to(dtype).cuda()
    if m > 2:
        x[1] = 0
        x[2, 3] = float("nan")
    w = torch.rand(d, generator=g).bfloat16().cuda()
    got, want = ops.rms_norm.triton(x, w, 1e-20), ops.rms_norm.torch(x, w, 1e-20)
    assert got.dtype == want.dtype == dtype
    bits = torch.int16 if dtype == torch.bfloat16 else torch.int32
    gv, wv = got.view(bits), want.view(bits)
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    assert torch.equal(gv[~nan], wv[~nan])



def test_swiglu_bitwise_twin():
    """`swiglu` (one launch) == its CUDA twin bit for bit (libdevice exp, IEEE division: torch CUDA's silu),
    on special values, exp overflow and subnormal products, and at the bench decode / prefill shapes."""
    from moe_cases import same_bits, swiglu_cases

    ops = _ops()
    g = torch.Generator(device="cuda").manual_seed(3)
    big = [((torch.randn(t, 2304, device="cuda", generator=g) * 4).bfloat16(), torch.randn(t, 2304, device="cuda", generator=g).bfloat16(),
            10.0, None) for t in (8, 8192)]
    tiny = torch.full((2, 64), -87.5, device="cuda").bfloat16(), torch.full((2, 64), -0.0092, device="cuda").bfloat16()
    for gg, uu, limit, w in swiglu_cases("cuda") + big + [(*tiny, 10.0, None)]:
        assert same_bits(ops.swiglu.triton(gg, uu, limit, w), ops.swiglu.torch(gg, uu, limit, w)), tuple(gg.shape)


def test_route_bitwise_twin():
    """`moe_route` (one launch) == its CUDA twin: the same expert ids and bitwise the same weights (libdevice
    softplus, IEEE sqrt and division, `ordered_sum`'s order), also at the release's 384 experts for a
    prefill chunk."""
    from moe_cases import route_cases

    ops = _ops()
    g = torch.Generator(device="cuda").manual_seed(4)
    big = [(torch.randn(2048, 384, device="cuda", generator=g) * 3, torch.randn(384, device="cuda", generator=g) * 0.1,
            6, 2.5, True, None)]
    for case in route_cases("cuda") + big:
        w, ids = ops.moe_route.triton(*case)
        want_w, want_ids = ops.moe_route.torch(*case)
        assert torch.equal(ids, want_ids), tuple(case[0].shape)
        assert torch.equal(w.view(torch.int32), want_w.view(torch.int32)), tuple(case[0].shape)



def test_gate_bitwise_kernels():
    """`moe_gate` (the logits GEMM's chunk partials, then one route launch that folds them) == the
    `fp32_linear` kernel followed by the `moe_route` kernel, bit for bit (ids as int32), with one and several
    chunk partials, forced ids, and at 64 and 300 rows of the release's 384 experts."""
    from moe_cases import gate_cases

    ops = _ops()
    g = torch.Generator(device="cuda").manual_seed(8)
    big = [((torch.randn(t, 5120, device="cuda", generator=g) * 2).bfloat16(),
            (torch.randn(384, 5120, device="cuda", generator=g) * 0.05).bfloat16(),
            torch.randn(384, device="cuda", generator=g) * 0.1, 6, 2.5, True, None, None) for t in (1, 8, 64, 300)]
    for x, w, b, k, sc, nm, f, cfg in gate_cases("cuda") + big:
        got_w, got_ids = ops.moe_gate.triton(x, w, b, k, sc, nm, f, gemm_config=cfg)
        want_w, want_ids = ops.moe_route.triton(ops.fp32_linear.triton(x, w, config=cfg), b, k, sc, nm, f)
        assert got_ids.dtype == torch.int32 and torch.equal(got_ids, want_ids.int()), (tuple(x.shape), cfg)
        assert torch.equal(got_w.view(torch.int32), want_w.view(torch.int32)), (tuple(x.shape), cfg)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", "-rA"]))
