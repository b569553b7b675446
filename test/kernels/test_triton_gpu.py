"""GPU tests: every Triton kernel against its torch twin (oracle) over cases.GRID, fresh seeded inputs
per case (seed in the test id). Skipped without CUDA. Run as a script to print a pass list."""

from __future__ import annotations

import pytest
import torch

from kernel_cases import GRID, KIND, build, case_id, exact_attention, exact_index_scores, run
from kernel_compare import assert_attention, assert_index_scores, assert_match

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (Triton kernels)")

SEEDS = (0, 1)
PARAMS = [pytest.param(op, p, s, id=case_id(op, p, 1000 * i + s)) for i, (op, p) in enumerate(GRID) for s in SEEDS]


@pytest.mark.parametrize("op, params, seed", PARAMS)
def test_triton_matches_twin(op, params, seed):
    from dsv41_kernels import ops

    impl = getattr(ops, op)
    assert impl.triton is not None, f"{op} has no Triton kernel"
    case = build(op, params, seed, "cuda")
    got = run(op, impl.triton, case)  # kernel first (no reuse of freshly freed reference buffers)
    torch.cuda.synchronize()
    want = run(op, impl.torch, case)
    if op == "sparse_attention_paged":
        assert_attention(got, want, exact_attention(case))
    elif op == "index_scores":
        assert_index_scores(got, want, exact_index_scores(case))
    else:
        assert_match(got, want, KIND[op], what=op)


@pytest.mark.parametrize("config", [(16, 1, 4), (16, 1, 8), (16, 2, 4), (16, 4, 4), (16, 8, 4), (32, 1, 8), (32, 2, 8), (32, 4, 8),
                                    (32, 8, 8, 2, 64), (32, 16, 8, 2, 32), (64, 1, 8, 2, 64), (64, 2, 8, 3, 32),
                                    (32, 1, 8, 1, 64)])
def test_attention_launch_configs(config):
    """Every (heads per program, splits, warps[, stages, keys per block]) the benchmark may pick gives the
    twin's output."""
    from dsv41_kernels import ops

    case = build("sparse_attention_paged", dict(t=9, h=64, d=512, w=128, k=512, short=True), 77, "cuda")
    got = ops.sparse_attention_paged.triton(*case["args"], config=config)
    want = ops.sparse_attention_paged.torch(*case["args"])
    assert_attention(got, want, exact_attention(case), what=f"attention {config}")


def test_attention_prefill_path(monkeypatch):
    """From attention_prefill.ROWS query rows a call runs the library-GEMM prefill path: against the fp64 oracle
    no worse than the twin (kernel_compare "attention"); in deterministic mode the same call runs the kernel
    (bitwise its explicit-config result)."""
    from dsv41_kernels import ops
    from dsv41_kernels.attention_prefill import ROWS

    case = build("sparse_attention_paged", dict(t=ROWS + 40, h=16, d=512, w=128, k=512, short=True), 78, "cuda")
    got = ops.sparse_attention_paged.triton(*case["args"])
    kern = ops.sparse_attention_paged.triton(*case["args"], config=(16, 1, 8))
    assert not torch.equal(got.view(torch.int16), kern.view(torch.int16)), "the prefill path did not run"
    assert_attention(got, ops.sparse_attention_paged.torch(*case["args"]), exact_attention(case), what="attention prefill path")
    assert (got[1] == 0).all(), "a row with no valid key is not zero"
    monkeypatch.setenv("SGLANG_DSV41_DETERMINISTIC", "1")
    assert torch.equal(ops.sparse_attention_paged.triton(*case["args"]).view(torch.int16), kern.view(torch.int16))


STORE_LAUNCHES = [dict(rows=1, num_warps=1), dict(rows=4, num_warps=1), dict(rows=8, num_warps=2), dict(rows=16, num_warps=4),
                  dict(rows=4, num_warps=2, seg=512), dict(rows=8, num_warps=1, seg=64), dict(portable=True)]
STORE_CASES = [("window_kv_store", dict(n=83, d=512, special=True, ties=True)), ("window_kv_store", dict(n=9, d=96)),
               ("compressed_kv_store", dict(n=83, d=512, special=True, ties=True)), ("compressed_kv_store", dict(n=9, d=80)),
               ("index_key_store", dict(n=83, d=128, special=True, ties=True)),
               ("index_query_quant", dict(t=11, h=32, d=128, special=True, ties=True))]


@pytest.mark.parametrize("launch", STORE_LAUNCHES, ids=lambda k: "-".join(f"{a}{b}" for a, b in k.items()))
@pytest.mark.parametrize("op, params", STORE_CASES, ids=lambda v: v if isinstance(v, str) else "-".join(f"{a}{b}" for a, b in v.items()))
def test_store_launch_configs(op, params, launch):
    """Every launch the benchmark may pick (rows per program, warps, segment, portable encoders) gives the
    twin's bytes; index_query_quant here is cache_store_triton's kernel (the benchmark's "new")."""
    from dsv41_kernels import cache_store_triton, ops
    from dsv41_kernels.triton_numerics import next_pow2

    impl = getattr(ops, op)
    fn = cache_store_triton.index_query_quant_triton if op == "index_query_quant" else impl.triton
    if launch.get("seg", 0) > next_pow2(params["d"]):
        pytest.skip("segment longer than the row")
    case = build(op, params, 5, "cuda")
    got = run(op, lambda *a: fn(*a, **launch), case)
    torch.cuda.synchronize()
    assert_match(got, run(op, impl.torch, case), KIND[op], what=f"{op} {launch}")


@pytest.fixture(scope="module")
def encoder_kernels():
    """Tiny kernels around the GPU-only encoders of triton_numerics (hardware conversions, f16x2 PTX):
    one element pair per lane, so that they can be checked over every bf16 input."""
    import triton
    import triton.language as tl

    from dsv41_kernels import triton_numerics as tn

    @triton.jit
    def pairs(x_ptr, a_ptr, b_ptr, c_ptr, out_ptr, n, WHAT: tl.constexpr, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        ok = i < n
        x0 = tl.load(x_ptr + 2 * i, mask=ok)
        x1 = tl.load(x_ptr + 2 * i + 1, mask=ok)
        a = tl.load(a_ptr + i, mask=ok)
        if WHAT == 0:
            y = tn.kv_fp4_byte_f16x2(x0, x1, a)
        elif WHAT == 1:
            y = tn.index_fp4_byte_f16x2(x0, x1, a, tl.load(b_ptr + i, mask=ok))
        elif WHAT == 2:
            y = tn.index_fp4_qdq_f16x2(x0, x1, a, tl.load(b_ptr + i, mask=ok), tl.load(c_ptr + i, mask=ok))
        else:  # bf16 and e4m3 conversions of x0 * a
            v = x0 * a
            y = tn.bf16_rne(v, True).to(tl.int32, bitcast=True) ^ (tn.e4m3_rne(v, True).to(tl.int32) << 8)
        tl.store(out_ptr + i, y, mask=ok)

    def launch(what, x, a, b=None, c=None):
        n = a.numel()
        out = torch.empty(n, dtype=torch.int32, device="cuda")
        b = a if b is None else b
        c = a if c is None else c
        pairs[(triton.cdiv(n, 1024),)](x, a, b, c, out, n, WHAT=what, BLOCK=1024, num_warps=4, enable_fp_fusion=False)
        return out

    return launch


def _all_bf16() -> torch.Tensor:
    """Every non-negative finite bf16 value and +inf / NaN, as fp32 on the GPU, negated copies appended."""
    x = (torch.arange(0, 0x7F81, dtype=torch.int32) << 16).view(torch.float32)
    x = torch.cat([x, torch.tensor([float("nan")]), -x])
    return x.cuda()


def test_kv_fp4_byte_f16x2_exhaustive(encoder_kernels):
    """Codes of clamp(RN(x / s)) for every bf16 x and e4m3 scale s (rcp = 1.0 / s as the kernel takes it)."""
    from sglang_dsv41.quant.fp4 import e2m1_codes

    x = _all_bf16()
    x = x[~x.isnan()]
    x = torch.cat([x, x[:1]]) if x.numel() % 2 else x
    for s in torch.arange(1, 0x7F, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).float().cuda():
        want = e2m1_codes((x / s).clamp(-6, 6)).to(torch.int32)
        want = want[0::2] | (want[1::2] << 4)
        got = encoder_kernels(0, x, torch.full((x.numel() // 2,), 1.0, device="cuda") / s) & 0xFF
        bad = (got != want).nonzero()
        assert bad.numel() == 0, f"s={s.item()}: x={x[2 * bad[0]].item()}, {x[2 * bad[0] + 1].item()}: {got[bad[0]].item()} != {want[bad[0]].item()}"


@pytest.mark.parametrize("k1, j", [(0, 0), (-3, 0), (5, -2), (2, -1), (0, -20), (-126, 0), (100, -30)])
def test_index_fp4_f16x2_exhaustive(encoder_kernels, k1, j):
    """Both FP4 stages of one element, every bf16 x: stage 1 rounds x / 2^k1 onto the E2M1 grid (clamp 6),
    stage 2 scales that by 2^j (m2 = s1 / scale, clamped to >= 2^-24 like the kernel; j <= 0 here since
    j > 0 only comes with stage-1 maxima small enough to stay <= 6) and rounds again; key byte (sign
    where the code is not 0) and the dequantized bf16 pair (times sq)."""
    from sglang_dsv41.quant.fp4 import e2m1_codes, e2m1_round, e2m1_values

    x = _all_bf16()
    x = x[~x.isnan() & ~x.isinf()]
    x = torch.cat([x, x[:1]]) if x.numel() % 2 else x
    n = x.numel() // 2
    inv1 = torch.full((n,), 2.0 ** -k1, device="cuda")
    m2 = max(2.0 ** j, 2.0 ** -24)
    m2h = torch.tensor(m2, dtype=torch.float16).view(torch.int16).to(torch.int32).item() & 0xFFFF
    m2h = torch.full((n,), m2h | (m2h << 16), dtype=torch.int32, device="cuda")
    sq = torch.full((n,), 2.0 ** -7, device="cuda")
    v2 = e2m1_round((x * 2.0 ** -k1).clamp(-6, 6)).abs() * m2
    codes = e2m1_codes(v2.clamp(max=6)).to(torch.int32)
    codes = codes | torch.where((x < 0) & (codes > 0), 8, 0)
    want = codes[0::2] | (codes[1::2] << 4)
    got = encoder_kernels(1, x, inv1, m2h) & 0xFF
    bad = (got != want).nonzero()
    assert bad.numel() == 0, f"x={x[2 * bad[0]].item()}, {x[2 * bad[0] + 1].item()}: {got[bad[0]].item()} != {want[bad[0]].item()}"
    y = (e2m1_values(codes.to(torch.uint8)) * 2.0 ** -7).bfloat16().view(torch.int16).to(torch.int32) & 0xFFFF
    want = y[0::2] | (y[1::2] << 16)
    got = encoder_kernels(2, x, inv1, m2h, sq)
    bad = (got != want).nonzero()
    assert bad.numel() == 0, f"qdq x={x[2 * bad[0]].item()}: {got[bad[0]].item():#x} != {want[bad[0]].item():#x}"


def test_bf16_and_e4m3_conversions(encoder_kernels):
    """bf16_rne / e4m3_rne (FAST) of products against torch's RNE casts, NaN payloads aside."""
    from sglang_dsv41.quant.fp8 import e4m3_satfinite

    g = torch.Generator(device="cuda").manual_seed(0)
    bits = torch.randint(-2**31, 2**31 - 1, (1 << 22,), generator=g, device="cuda", dtype=torch.int64).to(torch.int32)
    x = torch.cat([bits.view(torch.float32), _all_bf16(), torch.tensor([0.0, -0.0, 448.0, 464.0, -464.0, 2.0**-10], device="cuda")])
    x = torch.cat([x, x[:1]]) if x.numel() % 2 else x
    a = torch.tensor([1.0, 0.75, 2.0**-9, 3.0])
    for scale in a:
        v = x[0::2] * scale.item()
        got = encoder_kernels(3, x, torch.full_like(v, scale.item()))
        b16 = (got & 0xFFFF0000).view(torch.float32)
        want16 = v.bfloat16().float()
        assert torch.equal(b16.isnan(), want16.isnan()) and torch.equal(b16[~b16.isnan()].view(torch.int32), want16[~want16.isnan()].view(torch.int32))
        e8 = (got >> 8) & 0xFF  # the e4m3 byte sits in bits 8..15 (below the bf16 bits)
        assert torch.equal(e8, e4m3_satfinite(v).view(torch.uint8).to(torch.int32)), f"e4m3 at scale {scale}"


def test_dispatch_uses_triton_on_cuda_and_twin_when_forced(monkeypatch):
    from dsv41_kernels import ops

    op = ops.topk_select
    x = torch.randn(2, 100, device="cuda")
    assert op.uses_triton((x, 5))
    monkeypatch.setenv("SGLANG_DSV41_TORCH_OPS", "1")
    assert not op.uses_triton((x, 5))


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", "-rA"]))
