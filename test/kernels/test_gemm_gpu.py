"""GPU: the Triton block-scaled GEMMs (fp8_linear W8A8, fp4_linear W4A8) against their exact torch
twins, the oracle (`sglang_dsv41.quant.fp8_linear` / `fp4_linear`): tolerance kind "fp8_gemm"
(kernel_compare; bound from kernel_cases.gemm_slack) over M x (N, K) with fresh seeded inputs
(seed in the test id); bitwise batch invariance across row counts and tile configs (deterministic
mode); the fast mode's folded split-K of decode rows within the same tolerance; the MXFP8
activation quant kernel bitwise against `mxfp8_quant`; the bf16 prefill path (>= PREFILL_ROWS rows).
Skipped without CUDA. Runs as a script."""

from __future__ import annotations

import pytest
import torch

from kernel_cases import build_gemm, case_id, gemm_rows, gemm_slack
from kernel_compare import assert_match

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (Triton kernels)")

MS = (0, 1, 7, 64, 300)
NKS = ((100, 64), (100, 512), (1280, 512), (544, 5120), (2304, 5120))  # N ragged (100) and 32-aligned
# every one-pass tile config pick_config can choose, plus a few more: (BM, BN, num_warps, num_stages), and
# SWAP tiles (BM activation rows, BN weight rows as the MMA's M side, num_warps, num_stages, 0, True)
CONFIGS = [(64, 16, 4, 4), (64, 32, 4, 4), (64, 32, 4, 6), (64, 64, 4, 4), (64, 128, 4, 4), (128, 128, 8, 3),
           (64, 128, 8, 3), (128, 64, 4, 3), (64, 256, 8, 3), (16, 64, 4, 4, 0, True), (64, 64, 4, 6, 0, True),
           (16, 128, 8, 4, 0, True)]
# ordered split-K of <= 16 rows: (BM, BN, num_warps, num_stages, K blocks per program, SWAP)
SPLIT_CONFIGS = [(16, 64, 4, 3, 1, True), (16, 64, 4, 3, 5, True), (16, 128, 8, 3, 2, True), (64, 32, 4, 3, 3, False)]


def _params():
    out = []
    for op in ("fp8_linear", "fp4_linear"):
        for i, (n, k) in enumerate(NKS):
            for m in MS:
                p = dict(m=m, n=n, k=k, special=m >= 5, inf=m >= 6)
                if op == "fp4_linear" and i % 2:
                    p["int8"] = True  # MXFP4Linear stores the packed weight as int8
                if m == 7:
                    p["lead"] = True  # x [1, 7, K]
                seed = 100 * i + m
                out.append(pytest.param(op, p, seed, id=case_id(op, p, seed)))
    return out


def _ops():
    from dsv41_kernels import ops

    return ops


@pytest.mark.parametrize("op, params, seed", _params())
def test_gemm_matches_twin(op, params, seed):
    impl = getattr(_ops(), op)
    case = build_gemm(op, params, seed, "cuda")
    got = impl.triton(*case["args"])  # kernel first (no reuse of freshly freed reference buffers)
    torch.cuda.synchronize()
    want = impl.torch(*case["args"])
    assert_match(got, want, "fp8_gemm", what=op, bound=case["bound"])


@pytest.mark.parametrize("op", ["fp8_linear", "fp4_linear"])
@pytest.mark.parametrize("n, k", [(2304, 5120), (5120, 2304), (5120, 8192), (25600, 6144)])
def test_batch_invariance(op, n, k, monkeypatch):
    """Deterministic mode: rows of an M=300 call equal (bitwise) the same rows computed alone (M=1) and in
    an M=17 call (the shapes take the split-K, SWAP one-pass and 64-wide one-pass decode configs of
    pick_config; the Engram wkv's 25600 x 6144 takes SWAP tiles up to 16 rows, 64-wide ones above)."""
    monkeypatch.setenv("SGLANG_DSV41_DETERMINISTIC", "1")
    impl = getattr(_ops(), op)
    case = build_gemm(op, dict(m=300, n=n, k=k, special=True), 5, "cuda")
    x, w, ws = case["args"]
    full = impl.triton(x, w, ws).view(torch.int16)
    for i in (0, 1, 3, 150, 299):
        assert torch.equal(impl.triton(x[i : i + 1], w, ws).view(torch.int16), full[i : i + 1]), f"row {i} alone"
    for s in (0, 17, 283):
        assert torch.equal(impl.triton(x[s : s + 17], w, ws).view(torch.int16), full[s : s + 17]), f"rows {s}..{s + 16}"
    for s in (0, 40):
        assert torch.equal(impl.triton(x[s : s + 8], w, ws).view(torch.int16), full[s : s + 8]), f"rows {s}..{s + 7}"


@pytest.mark.parametrize("op", ["fp8_linear", "fp4_linear"])
def test_tile_configs_bitwise_equal(op):
    """Every tile config gives the same bits (the per-element arithmetic does not depend on the tile)."""
    impl = getattr(_ops(), op)
    case = build_gemm(op, dict(m=300, n=1000, k=512, special=True), 6, "cuda")
    ref = impl.triton(*case["args"], config=CONFIGS[0]).view(torch.int16)
    for cfg in CONFIGS[1:]:
        got = impl.triton(*case["args"], config=cfg).view(torch.int16)
        assert torch.equal(got, ref), f"config {cfg} differs from {CONFIGS[0]}"


@pytest.mark.parametrize("op", ["fp8_linear", "fp4_linear"])
@pytest.mark.parametrize("m", [1, 8, 16])
def test_split_k_configs_bitwise_equal(op, m):
    """The ordered split-K of decode rows (P of exact scaled block partials, summed in K order) gives the
    bits of the one-pass kernel, in both MMA orientations and for any K blocks per program."""
    impl = getattr(_ops(), op)
    case = build_gemm(op, dict(m=m, n=1000, k=512, special=True), 7 + m, "cuda")
    ref = impl.triton(*case["args"], config=CONFIGS[0]).view(torch.int16)
    for cfg in SPLIT_CONFIGS + [c for c in CONFIGS if len(c) == 6]:
        got = impl.triton(*case["args"], config=cfg).view(torch.int16)
        assert torch.equal(got, ref), f"config {cfg} differs from {CONFIGS[0]}"


@pytest.mark.parametrize("op", ["fp8_linear", "fp4_linear"])
@pytest.mark.parametrize("m", [17, 33, 64])
def test_split_k_wide_rows(op, m):
    """Split-K tiles of 64 rows (17 to 64 rows of x) give the one-pass kernel's bits: ordered, and folded
    with chunks of one block."""
    impl = getattr(_ops(), op)
    case = build_gemm(op, dict(m=m, n=1000, k=512, special=True), 90 + m, "cuda")
    ref = impl.triton(*case["args"], config=CONFIGS[0]).view(torch.int16)
    for cfg in ((64, 64, 4, 4, 2, True), (64, 32, 4, 3, 5, False), (64, 64, 4, 4, 1, True, True)):
        got = impl.triton(*case["args"], config=cfg).view(torch.int16)
        assert torch.equal(got, ref), f"config {cfg} differs from {CONFIGS[0]}"


@pytest.mark.parametrize("op", ["fp8_linear", "fp4_linear"])
@pytest.mark.parametrize("m", [1, 8, 16, 33, 64])
def test_folded_split_k(op, m, monkeypatch):
    """Fast mode, decode rows: the folded split-K (K-order chunk sums added in chunk order) is within the fp8
    tolerance of the twin for the picked chunk count and for others (chunks of 1, 3 and all K blocks);
    deterministic mode picks a config without it."""
    from dsv41_kernels.gemm_triton import fold_config, pick_config

    impl = getattr(_ops(), op)
    n, k = 1000, 8192
    case = build_gemm(op, dict(m=m, n=n, k=k, special=True, inf=True), 60 + m, "cuda")
    want = impl.torch(*case["args"])
    picked = pick_config(m, n, k, torch.device("cuda"), op == "fp4_linear")
    assert picked == fold_config(m, n, k, torch.device("cuda"), op == "fp4_linear") and picked[-1] is True
    for cfg in (None, picked[:4] + (1, True, True), picked[:4] + (3, True, True), picked[:4] + (k // 32, True, True)):
        assert_match(impl.triton(*case["args"], config=cfg), want, "fp8_gemm", what=f"{op} fold {cfg}", bound=case["bound"])
    monkeypatch.setenv("SGLANG_DSV41_DETERMINISTIC", "1")
    assert len(pick_config(m, n, k, torch.device("cuda"), op == "fp4_linear")) <= 6


@pytest.mark.parametrize("op, n, k", [("fp8_linear", 1280, 5120), ("fp8_linear", 100, 512), ("fp4_linear", 2304, 5120)])
def test_bf16_prefill_path(op, n, k, monkeypatch):
    """From gemm_triton.PREFILL_ROWS rows a GEMM runs on exact bf16 operands (dequant_triton) through the
    library's bf16 GEMM: within the fp8 kernel's tolerance of the twin (special rows included); in
    deterministic mode the same call runs the fp8 kernel (bitwise its explicit-config result)."""
    from dsv41_kernels.gemm_triton import PREFILL_ROWS, pick_config

    impl = getattr(_ops(), op)
    m = PREFILL_ROWS + 76
    case = build_gemm(op, dict(m=m, n=n, k=k, special=True, inf=True), 40 + n, "cuda")
    got = impl.triton(*case["args"])
    fused = impl.triton(*case["args"], config=pick_config(m, n, k, torch.device("cuda"), op == "fp4_linear"))
    assert not torch.equal(got.view(torch.int16), fused.view(torch.int16)), "the bf16 path did not run"
    assert_match(got, impl.torch(*case["args"]), "fp8_gemm", what=op + " bf16 prefill", bound=case["bound"])
    monkeypatch.setenv("SGLANG_DSV41_DETERMINISTIC", "1")
    assert torch.equal(impl.triton(*case["args"]).view(torch.int16), fused.view(torch.int16))


def test_bf16_operands_bitwise():
    """dequant_triton's hardware-conversion paths on the GPU, bit for bit (NaN as NaN) against the twins'
    values: the MXFP8 round trip (special rows: NaN, inf, saturation, zero groups; gathered rows), E2M1 and
    E4M3 weights times their scales (the interpreter checks the software paths: dequant_interp.py)."""
    from dsv41_kernels import dequant_triton as dq
    from dsv41_kernels.gemm import _e2m1_decode
    from moe_cases import same_bits
    from sglang_dsv41.quant import e8m0_to_fp32, mxfp8_quant

    g = torch.Generator().manual_seed(9)
    x = gemm_rows(300, 5120, g, special=True, inf=True)
    q, sc = mxfp8_quant(x.float(), 32)
    want = (q.float().unflatten(-1, (-1, 32)) * sc.unsqueeze(-1)).flatten(-2).bfloat16()
    xc = x.cuda()
    assert same_bits(dq.mxfp8_qdq(xc).cpu(), want)
    rows = torch.randint(0, 300 * 6, (1000,), generator=g)
    assert same_bits(dq.mxfp8_qdq(xc, rows.cuda(), 6).cpu(), want[rows // 6])
    w = torch.randint(0, 256, (3, 96, 160), dtype=torch.uint8, generator=g)
    s4 = torch.randint(90, 170, (3, 96, 11), dtype=torch.uint8, generator=g)
    out = dq.fp4_weight_bf16(w.cuda(), s4.cuda(), torch.empty(3, 96, 320, dtype=torch.bfloat16, device="cuda")).cpu()
    want4 = torch.stack([(_e2m1_decode(w[i]) * e8m0_to_fp32(s4[i])[:, :10].repeat_interleave(32, 1)).bfloat16()
                         for i in range(3)])
    assert same_bits(out, want4)
    w8 = torch.randint(0, 256, (100, 512), dtype=torch.uint8, generator=g).view(torch.float8_e4m3fn)  # NaN codes too
    s8 = torch.randint(100, 150, (4, 16), dtype=torch.uint8, generator=g)
    want8 = (w8.float() * e8m0_to_fp32(s8)[torch.arange(100) // 32][:, torch.arange(512) // 32]).bfloat16()
    assert same_bits(dq.fp8_weight_bf16(w8.cuda(), s8.cuda()).cpu(), want8)


def test_non_contiguous_input():
    ops = _ops()
    case = build_gemm("fp8_linear", dict(m=64, n=100, k=512), 8, "cuda")
    x, w, ws = case["args"]
    wide = torch.cat([x, torch.full_like(x[:, :64], float("nan"))], 1)[:, :512]  # row stride 576, NaN past K
    got, want = ops.fp8_linear.triton(wide, w, ws), ops.fp8_linear.triton(x, w, ws)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


def test_mxfp8_quant_kernel_bitwise():
    from dsv41_kernels.gemm_triton import mxfp8_quant_t
    from sglang_dsv41.quant import mxfp8_quant

    g = torch.Generator().manual_seed(3)
    for m, k in ((1, 32), (7, 96), (300, 5120), (4099, 64)):
        x = gemm_rows(m, k, g, special=m >= 6, inf=m >= 6).cuda()
        q, s = mxfp8_quant_t(x)
        wq, ws = mxfp8_quant(x)
        assert_match(q.view(torch.uint8), wq.view(torch.uint8), "bitwise", what=f"q m={m} k={k}")
        assert_match(s.t(), ws, "bitwise", what=f"scale m={m} k={k}")  # NaN payloads may differ


def test_mma_error_within_slack(capsys):
    """Stress the tensor core's 32-term partials (products spread over six decades in one block) and
    report how much of gemm_slack's 2^-8 budget the worst element uses, against the twin's exact fp32
    accumulator (before its bf16 rounding; the kernel's own rounding is half an ulp, 2^-8 |acc|)."""
    from sglang_dsv41.quant import blockwise_scaled_mm, dequant_fp8_weight, e8m0_to_fp32, mxfp8_quant

    ops = _ops()
    g = torch.Generator().manual_seed(11)
    k, n = 5120, 512
    x = (torch.randn(64, k, generator=g) * torch.pow(10.0, torch.rand(64, k, generator=g) * 6 - 3)).bfloat16().cuda()
    _, w, ws = build_gemm("fp8_linear", dict(m=1, n=n, k=k), 12, "cuda")["args"]
    got = ops.fp8_linear.triton(x, w, ws).double()
    q, s = mxfp8_quant(x)
    acc = blockwise_scaled_mm(q.float(), s, w.float(), e8m0_to_fp32(ws).repeat_interleave(32, 0)[:n]).double()
    budget = gemm_slack(x, dequant_fp8_weight(w, ws))
    used = (((got - acc).abs() - 2.0**-8 * acc.abs()).clamp_min(0) / budget).max().item()
    with capsys.disabled():
        print(f"\n[fp8 MMA] worst element uses {100 * used:.2f}% of the 2^-8 x sum|x w| slack")
    assert used <= 1.0


def test_dispatch_by_name(monkeypatch):
    ops = _ops()
    x = torch.zeros(2, 64, device="cuda", dtype=torch.bfloat16)
    assert ops.fp8_linear.uses_triton((x,)) and ops.fp4_linear.uses_triton((x,))
    monkeypatch.setenv("SGLANG_DSV41_TORCH_OPS", "fp8_linear")
    assert not ops.fp8_linear.uses_triton((x,)) and ops.fp4_linear.uses_triton((x,))


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", "-rA"]))
