"""Bit-exact quantization helpers for the Triton kernels (device functions only; nothing compiles here).

Each helper reproduces one function of `sglang_dsv41.quant` bit for bit, on fp32 tensors of any
shape. They avoid every Triton conversion whose rounding differs between the GPU and the CPU
interpreter (`TRITON_INTERPRET=1` truncates fp32 -> bf16 and decodes e4m3 NaN as 480), so the same
source gives the same bytes in both. NaN rules follow `quant/fp8.py` and `quant/fp4.py`:
comparisons with NaN are false, so clamps are written with `tl.where` (min/max would drop NaN).

Kernels that call `rope` or `ordered_sumsq` must be launched with `enable_fp_fusion=False` (`NO_FMA`):
the twins round every product and sum separately.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

NO_FMA = {"enable_fp_fusion": False}
"""Launch options of every kernel that reproduces rounded fp32 arithmetic (RoPE, norms, scales)."""

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
"""Read once, like triton.jit does: kernels were built for the CPU interpreter."""

DOT_DTYPE = tl.float32 if INTERPRET else tl.bfloat16
"""Operand type of tl.dot on bf16 values: the interpreter multiplies bf16 operands wrongly (3.8),
so it gets the (exact) fp32 copies; GPUs use bf16 tensor cores."""


# ---------------------------------------------------------------------------------- basic
@triton.jit
def max_nan(a, b):
    """Combine function for `tl.reduce`: max that propagates NaN (like torch.amax)."""
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def clamp_nan(x, lo, hi):
    """clamp(x, lo, hi) keeping NaN (torch.clamp semantics)."""
    return tl.where(x < lo, lo, tl.where(x > hi, hi, x))


@triton.jit
def bf16_round(x):
    """fp32 -> fp32 holding RNE(bf16(x)); NaN stays NaN, overflow goes to inf (torch's cast)."""
    b = x.to(tl.int32, bitcast=True)
    r = (b + 0x7FFF + ((b >> 16) & 1)) & -65536
    return tl.where(x != x, x, r.to(tl.float32, bitcast=True))


@triton.jit
def bf16_bits(x):
    """fp32 -> int16 bits of torch's bf16 cast (RNE), for a store through an int16 view of a bf16 tensor:
    exact for every value also under the interpreter, whose fp32 -> bf16 conversion maps subnormals wrong."""
    return (bf16_round(x).to(tl.int32, bitcast=True) >> 16).to(tl.int16)


# ---------------------------------------------------------------------------------- UE8M0
@triton.jit
def ue8m0_ceil(x):
    """fp32 x (= amax * max_inv) -> 2**ceil(log2 x) from the IEEE bits (quant.fp8.ue8m0_ceil_scale)."""
    b = x.to(tl.int32, bitcast=True)
    e = (b >> 23) & 0xFF
    up = ((b & 0x7FFFFF) != 0).to(tl.int32)
    out = ((e + up) << 23).to(tl.float32, bitcast=True)
    return tl.where(x != x, x, out)


@triton.jit
def e8m0_value(e):
    """UE8M0 exponent byte (any int type) -> fp32 2**(e-127); 0 -> 2**-127, 255 -> NaN."""
    e = e.to(tl.int32) & 0xFF
    v = tl.where(e == 0, 0x00400000, e << 23).to(tl.float32, bitcast=True)
    return tl.where(e == 255, float("nan"), v)


# ---------------------------------------------------------------------------------- E4M3
@triton.jit
def e4m3_byte(x):
    """fp32 -> float8_e4m3fn byte (int32 0..255): clamp to +-448, RNE, -0 kept, NaN -> 0x7F
    (quant.fp8.e4m3_satfinite)."""
    nan = x != x
    y = clamp_nan(x, -448.0, 448.0)
    b = y.to(tl.int32, bitcast=True)
    sign = (b >> 24) & 0x80
    a = tl.abs(y)
    ab = a.to(tl.int32, bitcast=True)
    r = ab + 0x7FFFF + ((ab >> 20) & 1)  # RNE to 3 mantissa bits
    normal = (((r >> 23) - 120) << 3) | ((r >> 20) & 7)
    sub = ((a * 512.0 + 8388608.0) - 8388608.0).to(tl.int32)  # RNE of a / 2**-9, a < 2**-6
    code = tl.where(a < 0.015625, sub, normal) | sign
    return tl.where(nan, 0x7F, code)


@triton.jit
def e4m3_value(c):
    """float8_e4m3fn byte (any int type) -> fp32 exactly; 0x7F / 0xFF -> NaN."""
    c = c.to(tl.int32) & 0xFF
    e = (c >> 3) & 15
    m = c & 7
    v = tl.where(e == 0, m.to(tl.float32) * 0.001953125, (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True))
    v = tl.where((c & 0x80) != 0, -v, v)
    return tl.where((c & 0x7F) == 0x7F, float("nan"), v)


# ---------------------------------------------------------------------------------- E2M1
@triton.jit
def e2m1_value(c):
    """E2M1 code (any int type, low 4 bits used) -> fp32 value (code 8 -> -0.0)."""
    c = c.to(tl.int32)
    m = (c & 7).to(tl.float32)
    v = tl.where(m < 4.0, m * 0.5, tl.where(m < 6.0, m - 2.0, m * 2.0 - 8.0))
    return tl.where((c & 8) != 0, -v, v)


# ---------------------------------------------------------------------------------- RoPE / norm
@triton.jit
def rope_pairs(x0, x1, c, s):
    """One interleaved pair rotation in fp32, each product and sum rounded (layers.rope.apply_rope)."""
    return x0 * c - x1 * s, x0 * s + x1 * c


@triton.jit
def _pick(v, idx, i: tl.constexpr):
    """v [R, 4|8, ...] -> v[:, i] as [R, ...]: a sum of one value and zeros, hence exact."""
    return tl.sum(tl.where(idx == i, v, 0.0), axis=1)


@triton.jit
def ordered_sumsq(src, ok, D: tl.constexpr, STEP: tl.constexpr, G: tl.constexpr):
    """Sum of squares of D bf16/fp32 elements per row in the fixed order of
    `sglang_dsv41.reduction.ordered_sum` (= torch CPU `x.float().square().sum(-1)` under
    ATEN_CPU_CAPABILITY=default). src: pointer [R, 1, 1] to each row's first element (unit stride),
    ok [R, 1, 1] (masked rows read zeros); D % 32 == 0; STEP = reduction.cascade_step(D // 32);
    G = cascade chunks per loop iteration, a power of two (`sumsq_chunks`). -> fp32 [R].
    Row r of 32 elements is a [4, 8] tile (ilp column k, lane l) = s[32r + 8k + l]; the rows are added
    in the cascade of chunks of STEP, then the 4 columns in order, then the 8 lanes in order.
    Each iteration loads the STEP rows of G chunks at once (level 0 of the cascade: independent sums),
    then adds the G chunk sums into level 1 one at a time in chunk order. A loop, not an unrolled
    sequence of D / 32 loads: Triton's coalescing pass takes time quadratic in the number of loads
    (sm_90 on a 2-core CPU: D = 5120 unrolled compiled in 12.5 s, D = 20480 in over 200 s).
    Launch with NO_FMA (the squares of fp32 inputs round before the add)."""
    tl.static_assert(D % 32 == 0)
    NROWS: tl.constexpr = D // 32
    FULL: tl.constexpr = NROWS // STEP
    col = (tl.arange(0, 4)[:, None] * 8 + tl.arange(0, 8)[None, :])[None]  # [1, 4, 8]
    zero = tl.zeros(col.shape, tl.float32) + tl.zeros(ok.shape, tl.float32)  # [R, 4, 8]
    gi = tl.arange(0, G)[None, :, None, None]  # [1, G, 1, 1]
    zero4 = zero[:, None, :, :] + tl.zeros(gi.shape, tl.float32)  # [R, G, 4, 8]
    a1 = zero
    a2 = zero
    a3 = zero
    for c0 in range(0, FULL, G):
        chunk = c0 + gi
        first = src[:, :, :, None] + chunk * (STEP * 32) + col[:, None, :, :]  # [R, G, 4, 8]
        live = ok[:, :, :, None] & (chunk < FULL)
        a0 = zero4
        for j in tl.static_range(STEP):  # level 0 of G chunks at once: each adds its STEP rows in order
            x = tl.load(first + j * 32, mask=live, other=0.0).to(tl.float32)
            a0 = a0 + x * x
        for g in tl.static_range(G):  # then level 1 (and the pushes up) one chunk at a time
            valid = c0 + g < FULL
            a1 = tl.where(valid, a1 + _pick(a0, gi, g), a1)
            done = (c0 + g + 1) * STEP  # rows consumed
            up2 = valid & (done % (STEP * STEP) == 0)
            up3 = up2 & (done % (STEP * STEP * STEP) == 0)
            a2 = tl.where(up2, a2 + a1, a2)
            a1 = tl.where(up2, zero, a1)
            a3 = tl.where(up3, a3 + a2, a3)
            a2 = tl.where(up3, zero, a2)
    return sumsq_finish(src, ok, col, zero, a1, a2, a3, FULL * STEP, NROWS)


def sumsq_chunks(d: int, step: int, chunks: int | None = None) -> int:
    """`ordered_sumsq`'s G for a row of d elements and cascade step `step`: `chunks` if given (a power of
    two, else ValueError), by default up to 8 chunks per iteration."""
    if chunks is not None:
        if not isinstance(chunks, int) or chunks < 1 or chunks & (chunks - 1):
            raise ValueError(f"chunks must be a power of two >= 1, got {chunks!r}")
        return chunks
    return min(8, triton.next_power_of_2(max(1, d // 32 // step)))


WIDE_STAT_D = 4096
"""Rows of at least this many elements (RMSNorm of the hidden size, the mHC statistic of n x hidden) run
their decode-size statistic on 4 warps (`stat_launch`)."""


def stat_launch(m: int, d: int, rows: int | None, num_warps: int | None) -> tuple[int, int]:
    """(rows per program, num_warps) of a fixed-order RMS statistic kernel (rms_norm, mhc_gates) over m
    rows of d elements; explicit arguments win. Up to 256 rows one row per program, on 4 warps for wide
    rows: H100, 8 and 64 rows (benchmark/results/2026-12-05-h100-decode-stats.md), rms_norm d = 5120 7.5
    -> 4.6 us, mhc_gates 4 x 5120 12.4 -> 9.1 us (8 chunks per iteration, the `sumsq_chunks` default
    there), same bits; narrower rows were within noise of 1 warp. Prefill sizes: 4 rows per program,
    1 warp."""
    rows = rows or (1 if m <= 256 else 4)
    return rows, num_warps or (4 if m <= 256 and d >= WIDE_STAT_D else 1)


@triton.jit
def sumsq_finish(src, ok, col, zero, a1, a2, a3, FIRST: tl.constexpr, NROWS: tl.constexpr):
    """End of `ordered_sumsq`'s order, given the cascade levels a1..a3 [R, 4, 8] after the full chunks:
    rows FIRST..NROWS-1 (less than a chunk) into a fresh a0, ((a0 + a1) + a2) + a3, then the 4 ilp
    columns and the 8 lanes in order -> fp32 [R]. col = the [1, 4, 8] offsets of a row of 32."""
    a0 = zero
    for r in tl.static_range(FIRST, NROWS):
        x = tl.load(src + r * 32 + col, mask=ok, other=0.0).to(tl.float32)
        a0 = a0 + x * x
    acc = ((a0 + a1) + a2) + a3  # [R, 4, 8]
    k = tl.arange(0, 4)[None, :, None]
    v = ((_pick(acc, k, 0) + _pick(acc, k, 1)) + _pick(acc, k, 2)) + _pick(acc, k, 3)  # [R, 8]
    lane = tl.arange(0, 8)[None, :]
    total = _pick(v, lane, 0)
    for i in tl.static_range(1, 8):
        total = total + _pick(v, lane, i)
    return total


@triton.jit
def rms_rstd(sumsq, d, eps):
    """fp32 sum of squares (`ordered_sumsq`) -> fp32 rsqrt(sumsq / d + eps), the IEEE division of
    reduction.mean_square then layers.norm's rsqrt."""
    ms = tl.math.div_rn(sumsq, d)
    return tl.math.rsqrt(ms + eps)


# ---------------------------------------------------------------------------------- fast paths
# Per-element encoders of the bandwidth-bound stores (cache_store_triton.py). FAST (a constexpr,
# `not INTERPRET`) selects the hardware conversions, which the interpreter does not reproduce:
# fp32 -> bf16 is cvt.rn.bf16x2.f32 (RNE, overflow to inf) and fp32 -> e4m3 is
# cvt.rn.satfinite.e4m3x2.f32 (RNE, |x| > 448 -> +-448, -0 kept). NOTE: the e4m3 path maps NaN to
# 0x7F only because the value comes out of an fp32 multiply or divide, whose NaN result is the
# canonical +NaN on NVIDIA GPUs (no payload, sign clear), which the conversion encodes as 0x7F.
@triton.jit
def bf16_rne(x, FAST: tl.constexpr):
    """fp32 -> fp32 holding RNE(bf16(x)) (same values as `bf16_round`; NaN payloads may differ).
    FAST: one packed cvt per two elements (a plain .to(bf16) compiles to one slow F2F each)."""
    if FAST:
        return tl.inline_asm_elementwise(
            "{ .reg .b32 t; cvt.rn.bf16x2.f32 t, $3, $2; shl.b32 $0, t, 16; and.b32 $1, t, 0xffff0000; }",
            "=f,=f,f,f", [x], dtype=tl.float32, is_pure=True, pack=2)
    else:
        return bf16_round(x)


@triton.jit
def e4m3_rne(v, FAST: tl.constexpr):
    """fp32 product or quotient -> float8_e4m3fn byte as uint8 (quant.fp8.e4m3_satfinite; see NOTE)."""
    if FAST:
        return v.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    else:
        return e4m3_byte(v).to(tl.uint8)


@triton.jit
def e4m3_decode(b, FAST: tl.constexpr):
    """float8_e4m3fn byte (uint8) -> fp32 exactly, 0x7F / 0xFF -> NaN."""
    if FAST:
        return b.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    else:
        return e4m3_value(b)


@triton.jit
def e2m1_decode(c, FAST: tl.constexpr):
    """E2M1 code (int32, low 4 bits) -> fp32 exactly (`e2m1_value`). FAST: the code's bits s e1 e0 m placed as
    an fp16's sign, low exponent bits and top mantissa bit are the value times 2**-14 (e = 0 lands on fp16
    subnormals m * 2**-15), so one bit pattern and one widening replace the selects."""
    if FAST:
        h = (((c & 7) << 9) | ((c & 8) << 12)).to(tl.int16)
        return h.to(tl.float16, bitcast=True).to(tl.float32) * 16384.0
    else:
        return e2m1_value(c)


@triton.jit
def pow2_ceil(x):
    """x > 0 (fp32; inf and NaN allowed) -> (s = ue8m0_ceil(x), 1 / s exactly (0 for inf, NaN for NaN),
    UE8M0 byte of s as int32 (quant.fp8.fp32_pow2_to_exponent_byte)), from the bits; valid while s <= 2**126."""
    sb = (x.to(tl.int32, bitcast=True) + 0x7FFFFF) & 0x7F800000
    nan = x != x
    s = tl.where(nan, x, sb.to(tl.float32, bitcast=True))
    inv = tl.where(sb < 0x7F800000, (0x7F000000 - sb).to(tl.float32, bitcast=True), 0.0)
    return s, tl.where(nan, x, inv), tl.where(nan, 255, sb >> 23)


@triton.jit
def e2m1_rne(a):
    """a = |v| in [0, 6] (fp32) -> (E2M1 magnitude code int32 0..7, its value fp32), RNE between codes
    (quant.fp4.e2m1_codes). One add rounds a onto the grid of its binade: c = 2**(max(e, 0) + 22)
    has ulp 2**(max(e, 0) - 1), the E2M1 step there; the code is the step count plus 2 max(e, 0).
    NaN a gives a garbage code and a NaN value."""
    e = tl.maximum(a.to(tl.int32, bitcast=True) & 0x7F800000, 0x3F800000)
    cb = e + (22 << 23)
    c = cb.to(tl.float32, bitcast=True)
    s = a + c
    return s.to(tl.int32, bitcast=True) - cb + ((e >> 22) - 254), s - c


@triton.jit
def snap12(a):
    """Round fp32 a (>= 0) to 12 significant bits. Used on x * RN(1/s) for the E2M1 code of RN(x / s)
    with x bf16 and s e4m3: x / s is either exactly on an E2M1 rounding threshold or at least 2**-9
    (relative) away from it, so snapping the one-rounding-off product restores exact ties and keeps
    every other value on its side (checked exhaustively over bf16 x and e4m3 s)."""
    return ((a.to(tl.int32, bitcast=True) + 0x400) & -2048).to(tl.float32, bitcast=True)


@triton.jit
def pair_amax(x0, x1):
    """NaN-propagating max |x| over axes 2 and 3 of both halves [R, G, C, P] -> [R, G, 1, 1]."""
    a = max_nan(tl.abs(x0), tl.abs(x1))
    return tl.reduce(tl.reduce(a, 3, max_nan, keep_dims=True), 2, max_nan, keep_dims=True)


# ---------------------------------------------------------------------------------- packed E2M1 (GPU)
# Two elements per f16x2 register: after a scale, |v| is rounded once to f16 (cvt.rn.f16x2.f32, exact
# for the power-of-two scales; for an e4m3 scale it is the 11-bit snap of `snap12`), clamped to
# [0, 6], and one f16x2 add of c = 2**(max(e, 0) + 9) rounds it onto the E2M1 grid (the f16 ulp of
# c is the E2M1 step, like `e2m1_rne` in fp32). s - c is the rounded magnitude; the integer
# difference of the bits is the step count k, and the code is k + 2 max(e, 0) = k + (e16 >> 9) - 30
# per 16-bit half. A byte of two codes is lo + 16 hi, folded from the halves as n + (n >> 12), less
# 510 = 30 + 16 * 30 when the -30 is left out of both halves; a sign adds 8 to its half.
# The algorithms are checked against the twins by an exact CPU emulation (all bf16 x and e4m3
# scales for the compressed KV; all bf16 x and random groups for the indexer); the interpreter runs
# the fp32 formulation of the same steps instead.
_E2M1_F16 = """
    mov.b32 k6, 0x46004600;
    mov.b32 k1, 0x3C003C00;
"""
_E2M1_GRID = """
    max.f16x2 e, h, k1;
    and.b32 e, e, 0x7C007C00;
    add.u32 c, e, 0x24002400;
    add.rn.f16x2 s, h, c;
"""
_KV_BYTE = tl.constexpr("{ .reg .f32 a0, a1; .reg .b32 h, e, c, s, t, k6, k1;" + _E2M1_F16 + """
    mul.f32 a0, $1, $3;
    mul.f32 a1, $2, $3;
    cvt.rn.f16x2.f32 h, a1, a0;      // h.lo = even element, h.hi = odd (the 11-bit snap)
    and.b32 t, h, 0x80008000;         // signs (x / s has the sign of x; -0 kept)
    and.b32 h, h, 0x7FFF7FFF;
    min.f16x2 h, h, k6;               // clamp to 6; NaN -> 6 (NaN groups are zeroed by the caller)""" + _E2M1_GRID + """
    sub.u32 s, s, c;                  // steps k per half
    shr.u32 e, e, 9;
    add.u32 s, s, e;                  // code + 30 per half
    shr.u32 t, t, 12;
    add.u32 s, s, t;                  // + 8 where negative
    shr.u32 t, s, 12;
    add.u32 s, s, t;
    sub.u32 $0, s, 510; }""")
_INDEX_STAGES = _E2M1_F16 + """
    abs.f32 a0, $1;
    abs.f32 a1, $2;
    mul.f32 a0, a0, $3;
    mul.f32 a1, a1, $3;
    cvt.rn.f16x2.f32 h, a1, a0;      // exact (power-of-two scale) in the f16 range; below it < 0.25
    min.NaN.f16x2 h, h, k6;           // stage 1 clamp, NaN kept (non-finite groups)""" + _E2M1_GRID + """
    sub.rn.f16x2 h, s, c;             // stage-1 magnitude (exact)
    mul.rn.f16x2 h, h, $4;            // times s1 / scale: stage-2 value, <= 6 (no clamp)""" + _E2M1_GRID + """
    mov.b32 t, $1;
    mov.b32 n, $2;
    prmt.b32 t, t, n, 0x7030;         // bit 15 = sign of x0, bit 31 = sign of x1
"""
_INDEX_BYTE = tl.constexpr("{ .reg .f32 a0, a1; .reg .b32 h, e, c, s, t, n, k6, k1;" + _INDEX_STAGES + """
    sub.u32 n, s, c;
    shr.u32 e, e, 9;
    add.u32 n, n, e;                  // code + 30 per half
    add.u32 s, n, 0x7FE17FE1;         // bit 15 / 31 set where the code is not 0 (-0 stored as +0)
    and.b32 t, t, s;
    and.b32 t, t, 0x80008000;
    shr.u32 t, t, 12;
    add.u32 n, n, t;
    shr.u32 t, n, 12;
    add.u32 n, n, t;
    sub.u32 $0, n, 510; }""")
_INDEX_QDQ = tl.constexpr("{ .reg .f32 a0, a1; .reg .b32 h, e, c, s, t, n, k6, k1; .reg .b16 lo, hi;" + _INDEX_STAGES + """
    sub.rn.f16x2 h, s, c;             // stage-2 magnitude
    add.u32 n, h, 0x7FFF7FFF;         // bit 15 / 31 set where it is not 0 (-0 comes out +0)
    and.b32 t, t, n;
    and.b32 t, t, 0x80008000;
    or.b32 h, h, t;
    mov.b32 {lo, hi}, h;
    cvt.f32.f16 a0, lo;
    cvt.f32.f16 a1, hi;
    mul.f32 a0, a0, $5;
    mul.f32 a1, a1, $5;
    cvt.rn.bf16x2.f32 $0, a1, a0; }""")


@triton.jit
def kv_fp4_byte_f16x2(x0, x1, rcp):
    """Compressed-KV byte (code(x0) | code(x1) << 4, int32) of clamp(RN(x / s), -6, 6) given rcp ~ 1 / s
    (relative error < 2**-14), s an e4m3 scale; NaN elements give code 7 (the caller zeroes NaN groups)."""
    return tl.inline_asm_elementwise(_KV_BYTE, "=r,f,f,f", [x0, x1, rcp], dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def index_fp4_byte_f16x2(x0, x1, inv1, m2):
    """Indexer key byte (int32) of the two FP4 stages: stage-1 magnitudes of |x| * inv1 on the E2M1 grid,
    times m2 = s1 / scale (f16x2 bits, both halves), rounded again; sign of x where the code is not 0.
    Non-finite groups give garbage (the caller zeroes them)."""
    return tl.inline_asm_elementwise(_INDEX_BYTE, "=r,f,f,f,r", [x0, x1, inv1, m2], dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def index_fp4_qdq_f16x2(x0, x1, inv1, m2, sq):
    """Indexer query round trip of a pair -> bf16x2 bits (int32): the signed stage-2 value times sq
    (the scale, NaN for non-finite groups); -0 comes out as +0 like the twin's unpack."""
    return tl.inline_asm_elementwise(_INDEX_QDQ, "=r,f,f,f,r,f", [x0, x1, inv1, m2, sq], dtype=tl.int32, is_pure=True,
                                     pack=1)


def next_pow2(n: int) -> int:
    return triton.next_power_of_2(max(1, int(n)))
