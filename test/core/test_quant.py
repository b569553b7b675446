"""Tests of sglang_dsv41.quant (FP8 / FP4 numerics and cache byte layouts).

Oracle: hand-worked values (computed on paper from the E4M3 / E2M1 / UE8M0 definitions: RNE ties,
satfinite clamps, amax floors, nibble order), independent brute-force formulations in float64
(nearest-grid search for E2M1, fully dequantized float64 matmul for the GEMMs, 2**(e-127) for
UE8M0), and torch's own float8_e8m0fnu decoding for the exponent-byte table. Seeded random inputs
give broad coverage; every check asserts concrete values or bit patterns.
"""

import math

import pytest
import torch

from sglang_dsv41.quant import (
    dequant_engram_rows, dequant_fp8_weight, dequant_mxfp4, e2m1_codes, e2m1_round, e4m3_satfinite,
    e8m0_to_fp32, fp4_linear, fp8_linear, fp32_pow2_to_e8m0, index_fp4_nbytes, index_fp4_pack,
    index_fp4_qdq, index_fp4_stage1, index_fp4_unpack, kv_fp4_nbytes, kv_fp4_pack, kv_fp4_qdq,
    kv_fp4_unpack, mxfp8_qdq, mxfp8_quant, pack_nibbles, quant_fp8_weight, quant_mxfp4,
    ue8m0_ceil_scale, unpack_nibbles, window_kv_nbytes, window_kv_pack, window_kv_qdq,
    window_kv_unpack,
)

BF16 = torch.bfloat16
F32 = torch.float32
NAN, INF = float("nan"), float("inf")
GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def bf(vals):
    return torch.tensor(vals, dtype=F32).to(BF16)


def up32(v, direction=INF):
    """Next fp32 after v (python floats' nextafter is float64-only)."""
    return torch.nextafter(torch.tensor(v, dtype=F32), torch.tensor(direction, dtype=F32)).item()


def bits16(t):
    return t.view(torch.int16).tolist()


def assert_bitwise(a, b):
    """Equal bit patterns, except that any NaN matches any NaN (payload/sign free)."""
    assert a.dtype == b.dtype and a.shape == b.shape
    an, bn = torch.isnan(a.float()), torch.isnan(b.float())
    assert torch.equal(an, bn)
    ia = a.view(torch.int16 if a.element_size() == 2 else torch.int32)
    ib = b.view(torch.int16 if b.element_size() == 2 else torch.int32)
    assert torch.equal(ia[~an], ib[~bn])


def group32(vals):
    return vals + [0.0] * (32 - len(vals))


def pow2(lo, hi, shape, g):
    """Random powers of two 2**k, k in [lo, hi), to spread magnitudes across groups."""
    return torch.exp2(torch.randint(lo, hi, shape, generator=g).float())


# ------------------------------------------------------------------ UE8M0 / E8M0 helpers
def test_ue8m0_ceil_hand_values():
    above448 = up32(448.0)
    amax = torch.tensor([448.0, above448, 224.0, 1e-4, 0.0, INF, NAN, 449.0, 1.0])
    got = ue8m0_ceil_scale(amax, 1 / 448).tolist()
    assert got[:5] == [1.0, 2.0, 0.5, 2.0**-22, 0.0]  # 448*fp32(1/448) is exactly 1
    assert got[5] == INF and math.isnan(got[6])
    assert got[7:] == [2.0, 2.0**-8]
    s6 = ue8m0_ceil_scale(torch.tensor([6.0, up32(6.0), 3.0, 3.1, 12.0]), 1 / 6)
    assert s6.tolist() == [1.0, 2.0, 0.5, 1.0, 2.0]
    s1 = ue8m0_ceil_scale(torch.tensor([1e-4, 2.0**-13, 2.0**-140, 2.0**-127]), 1.0)
    assert s1.tolist() == [2.0**-13, 2.0**-13, 2.0**-126, 2.0**-126]
    assert s1.dtype == F32


def test_e8m0_to_fp32_table():
    e = torch.arange(256, dtype=torch.uint8)
    got = e8m0_to_fp32(e)
    want = [2.0 ** (i - 127) for i in range(255)]
    assert got[:255].double().tolist() == want
    assert math.isnan(got[255].item())
    assert got[0].item() == 2.0**-127 and got[127].item() == 1.0
    assert_bitwise(e8m0_to_fp32(e.view(torch.float8_e8m0fnu)), got)
    assert_bitwise(e.view(torch.float8_e8m0fnu).float(), got)  # torch's own decoding agrees


def test_fp32_pow2_to_e8m0():
    p = torch.tensor([2.0 ** (i - 127) for i in range(255)], dtype=F32)
    out = fp32_pow2_to_e8m0(p)
    assert out.dtype == torch.float8_e8m0fnu
    assert out.view(torch.uint8).tolist() == list(range(255))
    assert fp32_pow2_to_e8m0(torch.tensor([INF, NAN])).view(torch.uint8).tolist() == [255, 255]


# ------------------------------------------------------------------ E4M3 / MXFP8
def test_e4m3_satfinite_ties_and_clamp():
    x = torch.tensor([1.0625, 1.1875, 2.0**-10, 3 * 2.0**-10, 248.0, 464.0, 1e6, -1e6, -INF,
                      -0.0, 0.3])
    q = e4m3_satfinite(x)
    assert q.dtype == torch.float8_e4m3fn
    v = q.float().tolist()
    # ties: 1.0625 -> 1.0 (even), 1.1875 -> 1.25, 2^-10 -> 0, 3*2^-10 -> 2^-8, 248 -> 256
    assert v[:5] == [1.0, 1.25, 0.0, 2.0**-8, 256.0]
    assert v[5:9] == [448.0, 448.0, -448.0, -448.0]
    assert q.view(torch.uint8)[9].item() == 0x80  # -0 kept
    assert v[10] == 0.3125  # 0.3 = 1.2*2^-2 -> nearest of 1.25*2^-2
    nans = torch.tensor([NAN, NAN])
    nans[1:] = nans[1:].neg()
    assert torch.signbit(nans).tolist() == [False, True]
    assert e4m3_satfinite(nans).view(torch.uint8).tolist() == [0x7F, 0x7F]  # canonical NaN
    assert e2m1_codes(nans).tolist() == [0, 0]  # NaN -> code 0, its scale carries the NaN


def test_mxfp8_quant_hand():
    g0 = group32([448.0, 1.0625, 1.1875, -3.0, 448.0])  # amax 448 -> s = 1
    g1 = group32([450.0, -300.0])  # amax 450 -> s = 2; 225 -> 224, -150 -> -144 (nearest)
    g2 = group32([2.0**-20, 3 * 2.0**-21])  # amax below 1e-4 floor -> s = 2^-22
    g3 = group32([])
    x = bf([g0 + g1, g2 + g3])
    q, s = mxfp8_quant(x)
    assert q.shape == (2, 64) and s.shape == (2, 2) and s.dtype == F32
    assert s.tolist() == [[1.0, 2.0], [2.0**-22, 2.0**-22]]
    qf = q.float()
    assert qf[0, :5].tolist() == [448.0, 1.0, 1.25, -3.0, 448.0]
    assert qf[0, 32:34].tolist() == [224.0, -144.0]  # -150 lies between -144 and -160
    assert qf[1, :2].tolist() == [4.0, 6.0]
    assert qf[1, 32:].abs().sum().item() == 0.0
    y = mxfp8_qdq(x)
    assert y.dtype == BF16
    assert y[0, 32:34].float().tolist() == [448.0, -288.0]
    assert y[1, :2].float().tolist() == [2.0**-20, 3 * 2.0**-21]


def test_mxfp8_nan_inf_negzero():
    x = bf([group32([1.0, NAN, 2.0]) + group32([1.0, INF, -3.0]) + group32([-0.0, 5.0])])
    q, s = mxfp8_quant(x)  # must not raise
    qf = q.float()
    assert torch.isnan(qf[0, :32]).all()  # a NaN poisons its whole group
    assert math.isnan(s[0, 0].item())
    assert s[0, 1].item() == INF  # inf makes the scale +inf
    assert torch.isnan(qf[0, 33]) and qf[0, 32].item() == 0.0 and q.view(torch.uint8)[0, 34] == 0x80
    assert q.view(torch.uint8)[0, 64].item() == 0x80 and s[0, 2].item() == 2.0**-6
    y = mxfp8_qdq(x).float()
    assert torch.isnan(y[0, :64]).all() and not torch.isnan(y[0, 64:]).any()
    assert y[0, 65].item() == 5.0 and bits16(mxfp8_qdq(x)[0, 64:65]) == [-32768]


# ------------------------------------------------------------------ E2M1 rounding / packing
def test_e2m1_midpoint_ties():
    mids = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
    want = [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    v = torch.tensor(mids + [-m for m in mids])
    assert e2m1_round(v).tolist() == want + [-w for w in want]
    up = torch.tensor([up32(m) for m in mids])
    assert e2m1_round(up).tolist() == [0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    down = torch.tensor([up32(m, 0.0) for m in mids])
    assert e2m1_round(down).tolist() == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0]
    c = e2m1_codes(torch.tensor([-0.1, -0.0, 0.0, -6.0, 6.0, 5.5, -0.6]))
    assert c.tolist() == [8, 8, 0, 15, 7, 7, 9]


def test_e2m1_matches_bruteforce():
    g = torch.Generator().manual_seed(0)
    v = (torch.rand(20000, generator=g) * 12 - 6).float()
    v = torch.cat([v, (torch.randint(-24, 25, (2000,), generator=g) / 4.0).float()])  # many ties
    grid = torch.tensor(GRID, dtype=torch.float64)
    dist = (v.double().abs()[:, None] - grid[None, :]).abs()
    best = dist.min(dim=1, keepdim=True).values
    cand = (dist == best) * 1000 - torch.arange(8) - (torch.arange(8) % 2) * 100  # prefer even
    idx = cand.argmax(dim=1)
    want = grid[idx] * torch.where(torch.signbit(v), -1.0, 1.0).double()
    assert torch.equal(e2m1_round(v).double(), want)


def test_nibble_packing_layout():
    codes = torch.tensor([[1, 2, 3, 4, 15, 8]], dtype=torch.uint8)
    packed = pack_nibbles(codes)
    assert packed.tolist() == [[0x21, 0x43, 0x8F]]  # even element in the low nibble
    allb = torch.arange(256, dtype=torch.uint8)
    un = unpack_nibbles(allb)
    assert un[2 * 0x5A].item() == 0xA and un[2 * 0x5A + 1].item() == 0x5
    assert torch.equal(pack_nibbles(un), allb)


# ------------------------------------------------------------------ indexer FP4
def test_index_stage1_hand():
    g0 = group32([6.0, 0.25, 0.75, 1.25, 2.5, 5.0, -0.1, -1.75])  # amax 6 -> s = 1
    g1 = group32([3.0, 0.375, -0.125])  # amax 3 -> s = 0.5: v = 6, 0.75 -> 1, -0.25 -> -0
    g2 = group32([-0.0])  # amax floor 6*2^-126 -> s = 2^-126; -0 kept
    y = index_fp4_stage1(bf([g0 + g1 + g2]))
    assert y.dtype == BF16 and y.shape == (1, 96)
    assert y[0, :8].float().tolist() == [6.0, 0.0, 1.0, 1.0, 2.0, 4.0, -0.0, -2.0]
    assert bits16(y[0, 6:7]) == [-32768]  # -0.1 -> code 8 = -0
    assert y[0, 32:35].float().tolist() == [3.0, 0.5, -0.0] and bits16(y[0, 34:35]) == [-32768]
    assert bits16(y[0, 64:65]) == [-32768]
    nan_inf = index_fp4_stage1(bf([group32([1.0, NAN]) + group32([INF, 1.0]) + group32([1.0])]))
    assert torch.isnan(nan_inf[0, :64].float()).all() and nan_inf[0, 64].item() == 1.0


def test_index_fp4_layout_and_bytes():
    assert index_fp4_nbytes(128) == 68
    g0 = group32([6.0, -1.0, 0.5, -0.0])  # scale 1 -> exponent 127
    g1 = group32([12.0])  # scale 2 -> 128
    g2 = group32([2.0**-20])  # amax/6 < 1e-4 -> scale 2^-13 -> 114
    g3 = group32([0.75])  # 0.75/6 = 0.125 -> exponent 124
    slot = index_fp4_pack(bf([g0 + g1 + g2 + g3]))
    assert slot.dtype == torch.uint8 and slot.shape == (1, 68)
    assert slot[0, 64:].tolist() == [127, 128, 114, 124]
    le32 = int.from_bytes(bytes(slot[0, 64:].tolist()), "little")
    assert le32 == 127 | 128 << 8 | 114 << 16 | 124 << 24
    assert slot[0, :2].tolist() == [0x7 | (0x8 + 2) << 4, 0x1 | 0x0 << 4]  # -0 -> code 0
    assert slot[0, 16].item() == 0x07 and slot[0, 48].item() == 0x07  # 12/2 = 6; 0.75/.125 = 6
    un = index_fp4_unpack(slot)
    assert un.dtype == F32 and un[0, :4].tolist() == [6.0, -1.0, 0.5, 0.0]
    assert bits16(index_fp4_unpack(slot, BF16)[0, 3:4]) == [0] and un[0, 64].item() == 0.0
    bad = bf([group32([INF]) + group32([NAN]) + group32([1.0]) * 2])
    bad = index_fp4_unpack(index_fp4_pack(bad))
    assert torch.isnan(bad[0, :64]).all() and bad[0, 64].item() == 1.0


def test_index_stage2_lossless_on_stage1_output():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 128, generator=g)
    exps = torch.randint(-8, 12, (64, 4), generator=g).float()
    x = (x.view(64, 4, 32) * torch.exp2(exps)[..., None]).view(64, 128)
    x[0, :32] = torch.randn(32, generator=g) * 2.0**-20  # tiny group: amax/6 < 1e-4
    x[1, 32:64] = 0.0
    y = index_fp4_stage1(x.to(BF16))
    z = index_fp4_qdq(x.to(BF16))
    assert torch.equal(z, index_fp4_unpack(index_fp4_pack(y), BF16))
    tiny = (y.float().abs().view(64, 4, 32).amax(-1) / 6 < 1e-4).repeat_interleave(32, -1)
    assert tiny.sum().item() == 64  # the group made tiny on purpose and the zero group
    assert (z.float()[1, 32:64] == 0).all()
    assert torch.equal(z.float()[~tiny], y.float()[~tiny])  # values equal (-0 -> +0 allowed)
    assert not torch.equal(z.float()[0, :32], y.float()[0, :32])  # lossy where amax is tiny
    assert (z.float()[0, :32] == 0).all()  # 2^-20-sized values vanish under scale 2^-13
    assert not torch.signbit(z.float()[z.float() == 0]).any()  # stage 2 never emits -0


# ------------------------------------------------------------------ compressed-KV FP4
def test_kv_fp4_hand_and_clamp():
    g0 = [6.375, 0.75, -0.25, 3.5] + [0.0] * 12  # 6.375/6 = 1.0625 -> e4m3 tie -> 1.0
    g1 = [2.0**-9, -0.0] + [0.0] * 14  # amax floor 6*2^-9 -> s = 2^-9
    g2 = [INF, 448.0, -1.0] + [0.0] * 13  # inf/6 saturates to 448
    g3 = [NAN, 1.0] + [0.0] * 14
    x = bf([g0 + g1 + g2 + g3])
    y = kv_fp4_qdq(x)
    assert y[0, :4].float().tolist() == [6.0, 1.0, -0.0, 4.0]  # clamp at 6*s, RNE ties
    assert bits16(y[0, 2:3]) == [-32768]
    assert y[0, 16:18].float().tolist() == [2.0**-9, -0.0] and bits16(y[0, 17:18]) == [-32768]
    assert y[0, 32:35].float().tolist() == [2688.0, 448.0, -0.0]  # -1/448 -> -0
    assert torch.isnan(y[0, 48:64].float()).all()
    assert kv_fp4_qdq(bf([[0.0] * 16])).float().abs().sum().item() == 0.0


def test_kv_fp4_layout_roundtrip():
    assert kv_fp4_nbytes(512) == 288
    x = bf([[1.0, -6.0, 0.5] + [0.0] * 13 + [12.0] + [0.0] * 15])
    slot = kv_fp4_pack(x)
    assert slot.shape == (1, 18)
    assert slot[0, :2].tolist() == [0x2 | 0xF << 4, 0x1]
    assert slot[0, 8].item() == 0x7  # element 16: 12 / s(=2) = 6 -> code 7
    assert slot[0, 16:].tolist() == [0x38, 0x40]  # e4m3 bytes of 1.0 and 2.0
    g = torch.Generator().manual_seed(2)
    r = torch.randn(4, 7, 512, generator=g) * pow2(-14, 10, (4, 7, 1), g)
    r[0, 0, :5] = torch.tensor([NAN, INF, -INF, -0.0, 1e-30])
    r = r.to(BF16)
    s = kv_fp4_pack(r)
    assert s.shape == (4, 7, 288) and s.dtype == torch.uint8
    assert_bitwise(kv_fp4_unpack(s), kv_fp4_qdq(r))
    out, ref = kv_fp4_qdq(r).float(), r.float()
    sc = s[..., 256:].contiguous().view(torch.float8_e4m3fn).float().repeat_interleave(16, -1)
    ok = torch.isfinite(out) & torch.isfinite(ref)
    v = ref.abs() / sc
    half = torch.where(v < 2, 0.25, torch.where(v < 4, 0.5, 1.0)) * sc  # half E2M1 step
    inside = ok & (v <= 6)
    assert ((out - ref).abs()[inside] <= half[inside]).all()
    assert torch.equal(out.abs()[ok & (v > 6)], 6 * sc[ok & (v > 6)])  # saturation at 6*s
    assert (ok & (v > 6)).any() and not torch.equal(out[ok], ref[ok])


# ------------------------------------------------------------------ window KV FP8
def test_window_kv_layout_roundtrip():
    assert window_kv_nbytes(512) == 528
    x = torch.zeros(1, 512)
    x[0, 0], x[0, 1], x[0, 32] = 448.0, -1.5, 1.0
    slot = window_kv_pack(x.to(BF16))
    assert slot.shape == (1, 528)
    assert slot[0, :2].tolist() == [0x7E, 0xBC]  # e4m3 448, -1.5
    assert slot[0, 32].item() == 0x78 and slot[0, 512:515].tolist() == [127, 119, 105]
    g = torch.Generator().manual_seed(3)
    r = torch.randn(3, 5, 512, generator=g) * pow2(-20, 20, (3, 5, 1), g)
    r[1, 2, 7], r[2, 0, 100] = NAN, -INF
    r = r.to(BF16)
    assert_bitwise(window_kv_unpack(window_kv_pack(r)), window_kv_qdq(r))
    assert torch.isnan(window_kv_qdq(r)[1, 2, :32].float()).all()
    assert window_kv_pack(r)[2, 0, 512 + 3].item() == 255  # inf scale -> NaN exponent byte


# ------------------------------------------------------------------ checkpoint formats
def test_fp8_weight_quant_dequant():
    w = torch.zeros(40, 72)
    w[0, 0], w[1, 1], w[33, 40], w[39, 71] = 448.0, 1.0625, 1.0, -0.0
    q, s = quant_fp8_weight(w)
    assert q.shape == (40, 72) and q.dtype == torch.float8_e4m3fn
    assert s.shape == (2, 3) and s.dtype == torch.float8_e8m0fnu
    assert s.view(torch.uint8).tolist() == [[127, 105, 105], [105, 119, 105]]
    d = dequant_fp8_weight(q, s)
    assert d[0, 0].item() == 448.0 and d[1, 1].item() == 1.0 and d[33, 40].item() == 1.0
    assert torch.signbit(d[39, 71]).item()
    g = torch.Generator().manual_seed(4)
    r = torch.randn(96, 160, generator=g) * pow2(-8, 8, (96, 1), g)
    q, s = quant_fp8_weight(r)
    d = dequant_fp8_weight(q, s)
    scale = e8m0_to_fp32(s).repeat_interleave(32, 0).repeat_interleave(32, 1)
    half_ulp = torch.maximum(r.abs() * 2.0**-4, scale * 2.0**-10)
    assert ((d - r).abs() <= half_ulp).all()
    assert not torch.equal(d, r)


def test_mxfp4_quant_dequant():
    w = torch.zeros(2, 64)
    w[0, :4] = torch.tensor([6.0, -0.0, 1.75, -5.0])
    w[1, 32] = 12.0
    packed, s = quant_mxfp4(w)
    assert packed.shape == (2, 32) and packed.dtype == torch.uint8
    assert s.view(torch.uint8).tolist() == [[127, 1], [1, 128]]  # floors 6*2^-126 -> 2^-126
    assert packed[0, :2].tolist() == [0x7 | 0x8 << 4, 0x4 | 0xE << 4]  # -0 kept as code 8
    d = dequant_mxfp4(packed, s)
    assert d[0, :4].tolist() == [6.0, -0.0, 2.0, -4.0] and d[1, 32].item() == 12.0
    g = torch.Generator().manual_seed(5)
    r = torch.randn(16, 256, generator=g)
    p, sc = quant_mxfp4(r)
    d = dequant_mxfp4(p, sc)
    scale = e8m0_to_fp32(sc).repeat_interleave(32, -1)
    assert ((d - r).abs() <= scale).all()  # half the coarsest step (2 * s / 2)
    assert torch.equal(e2m1_round(r / scale) * scale, d)


def test_engram_rows():
    codes = torch.arange(256, dtype=torch.uint8).view(1, 256).repeat(4, 1)
    w = codes.view(torch.float8_e4m3fn)
    s = [[127] * 8, [0] * 8, [254, 1, 100, 140, 127, 3, 5, 7], [120] * 8]
    s = torch.tensor(s, dtype=torch.uint8)
    out = dequant_engram_rows(w, s.view(torch.float8_e8m0fnu))
    assert out.shape == (4, 256) and out.dtype == BF16
    exp = torch.tensor([[2.0 ** (e - 127) for e in row] for row in s.tolist()], dtype=torch.float64)
    want = (w.double() * exp.repeat_interleave(32, -1)).to(BF16)
    assert_bitwise(out, want)
    assert out[0, 0x38].item() == 1.0 and out[1, 0x38].item() == 2.0**-127


# ------------------------------------------------------------------ GEMMs
def _ulp_dist_bf16(a, b):
    def ordered(t):
        i = t.view(torch.int16).to(torch.int32)
        return torch.where(i < 0, -(i & 0x7FFF), i)
    return (ordered(a) - ordered(b)).abs()


def test_fp8_linear_vs_float64():
    g = torch.Generator().manual_seed(6)
    x = (torch.randn(2, 5, 256, generator=g) * 3).to(BF16)
    q, s = quant_fp8_weight(torch.randn(72, 256, generator=g) * 0.05)
    out = fp8_linear(x, q, s)
    assert out.shape == (2, 5, 72) and out.dtype == BF16
    xq, xs = mxfp8_quant(x.reshape(-1, 256))
    xd = xq.double() * xs.double().repeat_interleave(32, -1)
    ref = (xd @ dequant_fp8_weight(q, s).double().T).to(BF16).reshape(2, 5, 72)
    dist = _ulp_dist_bf16(out, ref)
    assert dist.max().item() <= 1 and (dist == 0).float().mean().item() > 0.9


def test_fp8_linear_sequential_block_order():
    # block partials 2^24, 1, -2^24: sequential fp32 gives (2^24 + 1) - 2^24 = 0, exact is 1
    x = torch.zeros(1, 96)
    x[0, 0], x[0, 32], x[0, 64] = 2.0**24, 1.0, -(2.0**24)
    w = torch.ones(1, 96).to(torch.float8_e4m3fn)
    ws = torch.full((1, 3), 127, dtype=torch.uint8).view(torch.float8_e8m0fnu)
    assert fp8_linear(x.to(BF16), w, ws).item() == 0.0
    xr = torch.flip(x, [1])  # reversed order: (-2^24 + 1) + 2^24 = 1
    assert fp8_linear(xr.to(BF16), w, ws).item() == 1.0


def test_fp4_linear_hand_and_vs_float64():
    w = torch.zeros(2, 64)
    w[0, 0], w[0, 32], w[1, 1] = 6.0, 1.5, -3.0
    p, s = quant_mxfp4(w)
    x = torch.zeros(1, 64)
    x[0, 0], x[0, 1], x[0, 32] = 2.0, 1.0, 448.0
    out = fp4_linear(x.to(BF16), p, s)
    assert out.tolist() == [[2.0 * 6 + 448.0 * 1.5, -3.0]]
    g = torch.Generator().manual_seed(7)
    xr = (torch.randn(3, 4, 512, generator=g)).to(BF16)
    p, s = quant_mxfp4(torch.randn(48, 512, generator=g) * 0.02)
    out = fp4_linear(xr, p, s)
    xq, xs = mxfp8_quant(xr.reshape(-1, 512))
    xd = xq.double() * xs.double().repeat_interleave(32, -1)
    ref = (xd @ dequant_mxfp4(p, s).double().T).to(BF16).reshape(3, 4, 48)
    dist = _ulp_dist_bf16(out, ref)
    assert dist.max().item() <= 1 and (dist == 0).float().mean().item() > 0.9


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu():
    g = torch.Generator().manual_seed(8)
    x = (torch.randn(4, 16, 32, generator=g) * pow2(-30, 20, (4, 16, 1), g)).view(4, 512)
    x[0, :4] = torch.tensor([NAN, 1.0, -0.0, 0.0])
    x[1, 40], x[2, 300] = INF, -INF
    x = x.to(BF16)
    fns = (window_kv_pack, kv_fp4_pack, index_fp4_pack, mxfp8_qdq, kv_fp4_qdq, index_fp4_qdq,
           index_fp4_stage1, lambda t: mxfp8_quant(t)[0].view(torch.uint8))
    for fn in fns:
        a, b = fn(x.cuda()).cpu(), fn(x)
        if a.dtype == torch.uint8:
            assert torch.equal(a, b)
        else:
            assert_bitwise(a, b)
    xf = torch.randn(4, 512, generator=g).to(BF16)
    w = torch.randn(64, 512, generator=g)
    q, s = quant_fp8_weight(w)
    qc, sc = quant_fp8_weight(w.cuda())
    assert torch.equal(qc.cpu().view(torch.uint8), q.view(torch.uint8))
    assert torch.equal(sc.cpu().view(torch.uint8), s.view(torch.uint8))
    assert torch.equal(fp8_linear(xf.cuda(), q.cuda(), s.cuda()).cpu(), fp8_linear(xf, q, s))
    p, s4 = quant_mxfp4(torch.randn(48, 512, generator=g))
    assert torch.equal(fp4_linear(xf.cuda(), p.cuda(), s4.cuda()).cpu(), fp4_linear(xf, p, s4))
    assert torch.equal(dequant_mxfp4(p.cuda(), s4.cuda()).cpu(), dequant_mxfp4(p, s4))
