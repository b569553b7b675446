"""CPU: the quantizing twins of dsv41_kernels against independent oracles (none of them our own code).

| op                  | oracle                                                                   | rule    |
|---------------------|--------------------------------------------------------------------------|---------|
| window_kv_store     | official RMSNorm -> apply_rotary_emb -> act_quant(32, ue8m0) bytes       | bitwise |
| compressed_kv_store | official apply_rotary_emb -> fp4_act_quant(16, e4m3 scales) bytes        | bitwise |
| index_key_store     | official apply_rotary_emb -> fp4_act_quant(32) round trip; pool decoded  | bitwise |
|                     | by hand (E2M1 table x 2^(e-127)); hand-worked stage-2 scale floor        |         |
| index_query_quant   | official apply_rotary_emb -> fp4_act_quant(32) round trip                | bitwise |
| index_scores        | float64 head sum of the bf16 terms (keys from the official round trip)   | bitwise but head-sum ties (kernel_compare) |
| fp8_linear          | official act_quant + fp8_gemm (bf16 out): bitwise where its fp32 block   | bitwise |
| fp4_linear          | partials cannot round, else 1 bf16 ulp; and a hand-worked K-order case   | / 1 ulp |
| moe_experts         | official Expert (fp4 Linear, SwiGLU limit, weight before w2) per pair    | bitwise |
| moe_combine         | official MoE.forward's accumulation (fake gate / experts feed it)        | bitwise |
|                     | and a hand-worked case whose bits depend on the fp32 order               |         |
"Official": DeepSeek's kernel_cpu.py / model.py from ../shared/official (test/kernels/official.py; the
tests skip, naming the folder, when it is absent). Data avoids NaN / inf inputs (the official ports
do not define them) and, for the FP4 paths, groups with amax/6 < 1e-4 (the stored index keys floor
their stage-2 scale there, checked by hand below).
"""

from __future__ import annotations

import pytest
import torch
from kernel_compare import assert_index_scores, assert_match
from official import default_dtype, e8m0_bytes, kernel_cpu, model, rope

from dsv41_kernels import ops
from sglang_dsv41.quant import index_fp4_nbytes, index_fp4_pack, kv_fp4_nbytes, window_kv_nbytes

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def _g(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _rows(n: int, d: int, seed: int, lo: float = -2.0) -> torch.Tensor:
    """bf16 [n, d]: per-row scales 10^lo..10^2 and per-element spread over two decades, a zero row, a
    row of multiples of 1/32 (E2M1 / E4M3 rounding ties)."""
    g = _g(seed)
    x = torch.randn(n, d, generator=g) * torch.pow(10.0, torch.rand(n, 1, generator=g) * (2 - lo) + lo)
    x = x * torch.pow(10.0, torch.rand(n, d, generator=g) - 0.5)
    if n >= 4:
        x[1] = 0
        x[2] = torch.randint(-12, 13, (d,), generator=g) / 32.0
    return x.bfloat16()


def _rope_table(n: int, rd: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    pos = torch.randint(0, 1 << 20, (n,), generator=_g(seed)).float()
    ang = pos[:, None] * (1.0 / (160000.0 ** (torch.arange(0, rd, 2).float() / rd)))
    f = torch.polar(torch.ones_like(ang), ang)
    return f.real.contiguous(), f.imag.contiguous()


def _slots(n: int, seed: int) -> torch.Tensor:
    s = torch.randperm(n + 5, generator=_g(seed))[:n]
    s[::7] = -1
    return s


def _decode_index_pool(rows: torch.Tensor) -> torch.Tensor:
    """uint8 [n, d/2 + d/32] -> fp64 [n, d] by hand: E2M1 code (low nibble first) x 2^(e - 127)."""
    d = rows.size(1) * 32 // 17
    table = torch.tensor(E2M1 + [-v for v in E2M1], dtype=torch.float64)
    b = rows[:, : d // 2].long()
    vals = table[torch.stack([b & 15, b >> 4], -1).flatten(1)]
    scale = torch.pow(2.0, rows[:, d // 2 :].double() - 127).repeat_interleave(32, dim=1)
    return vals * scale


def _same_values(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """Equal as numbers (-0 == +0), NaN positions equal."""
    g, w = got.double(), want.double()
    ok = (g == w) | (torch.isnan(g) & torch.isnan(w))
    assert bool(ok.all()), f"{what}: {int((~ok).sum())} differ, first {(~ok).nonzero()[0].tolist()}"


# ------------------------------------------------------------------ cache stores, index queries
@pytest.mark.parametrize("n, d, rd, seed", [(37, 512, 64, 0), (9, 96, 32, 1)])
def test_window_kv_store_equals_official_bytes(n, d, rd, seed):
    kv, (cos, sin) = _rows(n, d, seed), _rope_table(n, rd, seed)
    weight = (torch.rand(d, generator=_g(seed + 9)) + 0.5).bfloat16()
    slots = _slots(n, seed)
    pool = torch.full((n + 5, window_kv_nbytes(d)), 0xAB, dtype=torch.uint8)
    ops.window_kv_store.torch(kv, weight, 1e-6, cos, sin, slots, pool)
    norm = model().RMSNorm(d, 1e-6)
    norm.weight.data = weight
    with torch.no_grad():
        y = rope(norm(kv), cos, sin)
    q, s = kernel_cpu().act_quant(y, 32, "ue8m0", torch.float8_e8m0fnu)
    want = torch.cat([q.view(torch.uint8), e8m0_bytes(s)], dim=-1)
    w = slots >= 0
    assert_match(pool[slots[w]], want[w], what="window kv bytes")
    untouched = torch.ones(n + 5, dtype=torch.bool)
    untouched[slots[w]] = False
    assert bool((pool[untouched] == 0xAB).all())


@pytest.mark.parametrize("n, d, rd, seed", [(24, 512, 64, 2), (7, 80, 16, 3)])
def test_compressed_kv_store_equals_official_bytes(n, d, rd, seed):
    latent, (cos, sin) = _rows(n, d, seed), _rope_table(n, rd, seed)
    slots = _slots(n, seed)
    pool = torch.full((n + 5, kv_fp4_nbytes(d)), 0x5C, dtype=torch.uint8)
    ops.compressed_kv_store.torch(latent, cos, sin, slots, pool)
    packed, s = kernel_cpu().fp4_act_quant(rope(latent, cos, sin), 16, scale_dtype=torch.float8_e4m3fn)
    want = torch.cat([packed.view(torch.uint8), s.view(torch.uint8)], dim=-1)
    w = slots >= 0
    assert_match(pool[slots[w]], want[w], what="compressed kv bytes")


@pytest.mark.parametrize("n, seed", [(40, 4), (5, 5)])
def test_index_key_store_equals_official_round_trip(n, seed):
    di, rd = 128, 64
    k, (cos, sin) = _rows(n, di, seed), _rope_table(n, rd, seed)
    slots = _slots(n, seed)
    pool = torch.zeros(n + 5, index_fp4_nbytes(di), dtype=torch.uint8)
    ops.index_key_store.torch(k, cos, sin, slots, pool)
    want = kernel_cpu().fp4_act_quant(rope(k, cos, sin), 32, True)
    w = slots >= 0
    _same_values(_decode_index_pool(pool[slots[w]]), want[w], "index keys")


def test_index_key_stage2_scale_floor_hand_worked():
    """A group whose amax is 6 * 2^-20 keeps its stage-1 values at scale 2^-20 in the official round
    trip, but the stored key floors its scale at 2^ceil(log2(1e-4)) = 2^-13, where 6 * 2^-20 / 2^-13
    = 0.047 rounds to E2M1 0: the group is stored as zeros with exponent byte 127 - 13 = 114; the other
    groups (amax 6) have scale 1 (byte 127) and keep their values."""
    k = torch.zeros(1, 128)
    k[0, :32] = torch.tensor([6.0, -3.0, 1.0, 0.5] * 8) * 2.0**-20
    k[0, 32:] = torch.tensor([6.0, 1.5, -4.0, 0.0] * 24)
    cos, sin = torch.ones(1, 32), torch.zeros(1, 32)  # identity rotation
    pool = torch.zeros(1, 68, dtype=torch.uint8)
    ops.index_key_store.torch(k.bfloat16(), cos, sin, torch.tensor([0]), pool)
    assert pool[0, 64:].tolist() == [114, 127, 127, 127]
    got = _decode_index_pool(pool)
    assert bool((got[0, :32] == 0).all()) and torch.equal(got[0, 32:], k[0, 32:].double())


@pytest.mark.parametrize("t, h, seed", [(19, 3, 6), (4, 32, 7)])
def test_index_query_quant_equals_official(t, h, seed):
    q = _rows(t * h, 128, seed).unflatten(0, (t, h))
    cos, sin = _rope_table(t, 64, seed)
    want = kernel_cpu().fp4_act_quant(rope(q, cos, sin), 32, True)
    _same_values(ops.index_query_quant.torch(q, cos, sin), want, "index queries")


@pytest.mark.parametrize("t, h, n, seed", [(11, 32, 300, 8), (3, 3, 70, 9)])
def test_index_scores_equal_float64_head_sum(t, h, n, seed):
    """Terms bf16(bf16(relu(q_h . k)) * w_h) (the FP4-grid dot is exact in fp32), summed in float64;
    the twin may differ only where the fp32 order of the head sum decides a bf16 tie."""
    fp4 = kernel_cpu().fp4_act_quant
    g = _g(seed)
    keys = fp4(_rows(n, 128, seed), 32, True)
    q = fp4(_rows(t * h, 128, seed + 1).unflatten(0, (t, h)), 32, True)
    w = torch.randn(t, h, generator=g).bfloat16()
    slot_of = torch.randperm(n + 9, generator=g)[:n]
    pool = torch.full((n + 9, 68), 0xFF, dtype=torch.uint8)
    pool[slot_of] = index_fp4_pack(keys)
    visible = torch.randint(0, n + 1, (t,), generator=g)
    table = torch.where(torch.arange(n) < visible[:, None], slot_of, -1)
    got = ops.index_scores.torch(q, w, pool, table)
    logits = torch.einsum("thd,nd->thn", q.double(), keys.double()).bfloat16()
    terms = (torch.relu(logits) * w.unsqueeze(-1)).double()
    exact = terms.sum(1).masked_fill(table < 0, float("-inf"))
    assert_index_scores(got, exact.float().bfloat16().float(), exact)
    assert bool(torch.isneginf(got[table < 0]).all())


# ------------------------------------------------------------------ GEMMs, MoE
def _weights(op: str, n: int, k: int, seed: int):
    from sglang_dsv41.quant import quant_fp8_weight, quant_mxfp4

    g = _g(seed)
    wf = torch.randn(n, k, generator=g) * torch.pow(10.0, torch.rand(n, 1, generator=g) * 2 - 3)
    return quant_fp8_weight(wf) if op == "fp8_linear" else quant_mxfp4(wf)


def official_linear(x: torch.Tensor, w: torch.Tensor, ws: torch.Tensor) -> torch.Tensor:
    """model.linear: act_quant(x, 32, ue8m0) and fp8_gemm / fp4_gemm by the weight's dtype, bf16 out."""
    weight = w.view(torch.float4_e2m1fn_x2) if w.dtype in (torch.uint8, torch.int8) else w
    weight.scale = ws.view(torch.float8_e8m0fnu)
    with default_dtype(torch.bfloat16):
        return model().linear(x, weight)


def _order_free(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """bool [M, N]: every 32-wide block partial of output (m, n) is exact in fp32 in any summation order
    (its products, at most 8 significant bits each, are multiples of u = 2^(e_min - 7) with 2^e_min <= the
    smallest |product|, and sum |products| < 2^24 u). x: official act_quant input (bf16 [M, K]); w: the
    weight values fp32 [N, K]."""
    q, _ = kernel_cpu().act_quant(x, 32, "ue8m0", torch.float8_e8m0fnu)
    m, k = q.shape
    prods = q.double().view(m, 1, k // 32, 32) * w.double().view(1, -1, k // 32, 32)
    mn = torch.where(prods != 0, prods.abs(), float("inf")).amin(-1)
    unit = torch.ldexp(torch.ones_like(mn), torch.frexp(mn).exponent - 8)
    return ((prods.abs().sum(-1) < unit * 2.0**24) | torch.isinf(mn)).all(-1)


@pytest.mark.parametrize("op", ["fp8_linear", "fp4_linear"])
@pytest.mark.parametrize("m, n, k", [(9, 100, 128), (3, 64, 256), (1, 33, 96), (64, 256, 2048)])
def test_gemm_twins_equal_official(op, m, n, k):
    """Bitwise where DeepSeek's fp32 block partials (`a_blk @ b_blk.T`, BLAS order) cannot round (5-98%
    of the outputs here); elsewhere within one bf16 ulp (docs/numerics.md 4b: its partial may be one fp32 ulp off the
    exact one the twin rounds once)."""
    if op == "fp4_linear" and n % 32:
        n += 32 - n % 32
    x = _rows(m, k, m + n)
    w, ws = _weights(op, n, k, k)
    got, want = getattr(ops, op).torch(x, w, ws), official_linear(x, w, ws)
    wv = w.float() if op == "fp8_linear" else kernel_cpu().unpack_fp4(w.view(torch.float4_e2m1fn_x2))
    exact = _order_free(x, wv)
    assert float(exact.double().mean()) > 0.03, "too few order-free outputs for the bitwise part"  # 5.6% at K = 2048
    assert_match(got[exact], want[exact], what=op)
    big = torch.maximum(got.float().abs(), want.float().abs())
    ulp = torch.ldexp(torch.ones_like(big), torch.frexp(big).exponent - 8)  # one bf16 ulp of the larger
    assert bool(((got.float() - want.float()).abs() <= ulp).all()), f"{op}: more than one bf16 ulp off"


@pytest.mark.parametrize("op", ["fp8_linear", "fp4_linear"])
def test_gemm_k_order_hand_worked(op):
    """Weights all 1 (scale 2^0); x = 32 x 2^19 | 1, 0.. | 1, 0.. | 32 x -2^19. MXFP8 gives block partials
    2^24, 1, 1, -2^24 (q = 256 at scales 2^11, 2^-8); added in K order from +0 in fp32: 2^24 + 1 and
    then + 1 round to even (2^24), so the result is 0 where the exact sum is 2 (and a reversed order gives 2)."""
    x = torch.zeros(1, 128)
    x[0, :32], x[0, 32], x[0, 64], x[0, 96:] = 2.0**19, 1.0, 1.0, -(2.0**19)
    if op == "fp8_linear":
        w, ws = torch.ones(32, 128).to(torch.float8_e4m3fn), torch.full((1, 4), 127, dtype=torch.uint8)
    else:
        w, ws = torch.full((32, 64), 0x22, dtype=torch.uint8), torch.full((32, 4), 127, dtype=torch.uint8)
    got = getattr(ops, op).torch(x.bfloat16(), w, ws)
    assert got.dtype == torch.bfloat16 and got.tolist() == [[0.0] * 32]


def _experts(e: int, hid: int, inter: int, seed: int):
    from moe_cases import build_moe

    return build_moe(13, 4, e, hid, inter, seed)


def test_moe_experts_equal_official_expert():
    x, ids, wts, w1, s1, w3, s3, w2, s2 = _experts(6, 128, 64, 11)
    limit = 0.5  # small: the clamps act on a good share of g and u
    got = ops.moe_experts.torch(x, ids, wts, w1, s1, w3, s3, w2, s2, limit)
    m = model()
    want = torch.empty_like(got)
    for e in range(w1.size(0)):
        with default_dtype(torch.bfloat16):
            ex = m.Expert(128, 64, dtype=torch.float4_e2m1fn_x2, swiglu_limit=limit)
        for lin, w, s in ((ex.w1, w1, s1), (ex.w3, w3, s3), (ex.w2, w2, s2)):
            lin.weight.data, lin.scale.data = w[e].view(torch.float4_e2m1fn_x2), s[e].view(torch.float8_e8m0fnu)
        rows, slot = torch.where(ids == e)
        if rows.numel():
            rank = (ids[rows].unsqueeze(-1) > ids[rows].unsqueeze(1)).sum(-1)  # [r, k]: position when sorted
            sorted_slot = rank[torch.arange(rows.numel()), slot]
            with default_dtype(torch.bfloat16), torch.no_grad():
                want[rows, sorted_slot] = ex(x[rows], wts[rows, slot, None])
    assert_match(got, want, what="moe_experts")


def test_moe_combine_equals_official_accumulation():
    """Official MoE.forward with its gate and experts replaced by fixed outputs: y = 0, then
    y[rows of expert i] += that expert's output for i ascending, then + shared, one cast."""
    m = model()
    g = _g(12)
    t, k, e, hid = 17, 4, 9, 64
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)])
    routed_by_id = {i: (torch.randn(t, hid, generator=g) * 10 ** float(torch.randint(-2, 4, (1,), generator=g))).bfloat16()
                    for i in range(e)}
    shared = torch.randn(t, hid, generator=g).bfloat16()
    sid = ids.sort(dim=1).values
    routed = torch.stack([torch.stack([routed_by_id[int(i)][r] for i in sid[r]]) for r in range(t)])
    moe = m.MoE.__new__(m.MoE)
    torch.nn.Module.__init__(moe)
    moe.dim, moe.n_routed_experts, moe.experts_start_idx, moe.experts_end_idx = hid, e, 0, e
    moe.gate = lambda x, mask: (torch.ones(t, k), ids)

    def expert(i):
        def run(xs, w):
            return routed_by_id[i][torch.where(ids == i)[0]]
        return run

    moe.experts = [expert(i) for i in range(e)]
    moe.shared_experts = lambda x: shared
    want = moe.forward(torch.zeros(t, hid, dtype=torch.bfloat16))
    assert_match(ops.moe_combine.torch(routed, shared), want, what="moe_combine")


def test_moe_combine_order_hand_worked():
    """Slots 2^24, 1, 1 and shared -2^24: in slot order the fp32 sum is 2^24 (+1 rounds to even twice),
    then 0; any other order of the additions that adds the ones together first gives 2."""
    routed = torch.tensor([[[2.0**24], [1.0], [1.0]]]).bfloat16()
    got = ops.moe_combine.torch(routed, torch.tensor([[-(2.0**24)]]).bfloat16())
    assert got.dtype == torch.bfloat16 and got.tolist() == [[0.0]]
