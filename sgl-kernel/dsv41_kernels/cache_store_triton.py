"""Triton cache stores and the indexer's query quantization: R token rows per program, fused norm /
RoPE / quantize / paged store, every byte equal to the torch twin's (`cache_store.py`, `indexer.py`;
byte layouts in `sglang_dsv41.quant.layouts`). Slots < 0 are skipped; pool rows not named by `slots`
are never touched.

Bandwidth, not latency. A program walks its R rows in segments of SEG elements; a segment is a tile
[R, groups, chunks, 4] of int32 words (bf16 pairs, 16-byte loads) split into the even and odd
elements x0 / x1, so that a quantization group is a (chunk, word) block, an FP4 byte is a pair and
the group reductions of R independent rows overlap. Only segments that reach the RoPE dims (the last
2 * RP) pay for the rotation; SEG trades lanes against RoPE work, and by default is the smallest that
fills every lane (R * SEG / 8 >= 32 * num_warps). The window's RMSNorm statistic is the fp32 sum of
squares of `reduction.mean_square` in its fixed order (`triton_numerics.ordered_sumsq`), taken in a
first pass over the row (the second pass re-reads it from L1). Encoders (`triton_numerics`):
hardware bf16 / e4m3 conversions, power-of-two reciprocals from the bits, and on the GPU the E2M1
rounding of two elements per f16x2 instruction; under the interpreter (or `portable=True`) the fp32
bit-level formulation of the same steps.

  window KV       MXFP8: amax, UE8M0 scale, e4m3 of y * (1 / s)
  compressed KV   FP4 with e4m3 scales: RN(amax / 6) (an FMA-corrected product on the GPU), the code
                  of RN(x / s) from x * ~(1 / s) snapped to 11-12 bits (`snap12`)
  index key/query two FP4 stages from one group maximum (`_index_scales`); keys packed, queries
                  dequantized to bf16
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv41_kernels.cache_store import compressed_kv_store, index_key_store, window_kv_store
from dsv41_kernels.triton_numerics import (
    INTERPRET,
    NO_FMA,
    bf16_rne,
    e2m1_rne,
    e4m3_decode,
    e4m3_rne,
    index_fp4_byte_f16x2,
    index_fp4_qdq_f16x2,
    kv_fp4_byte_f16x2,
    next_pow2,
    ordered_sumsq,
    pair_amax,
    pow2_ceil,
    rms_rstd,
    snap12,
    sumsq_chunks,
)
from sglang_dsv41.reduction import cascade_step

FAST = not INTERPRET
"""Hardware conversions on the GPU; the exact bit-level helpers under the interpreter."""


# ------------------------------------------------------------------------------------ tiles
@triton.jit
def _columns(S0: tl.constexpr, SEG: tl.constexpr, GS: tl.constexpr):
    """Element index [1, NG, C, 8] of segment [S0, S0 + SEG) tiled (groups of GS, chunks of 8)."""
    NG: tl.constexpr = SEG // GS
    C: tl.constexpr = GS // 8
    return (S0 + tl.arange(0, NG)[:, None, None] * GS + tl.arange(0, C)[None, :, None] * 8
            + tl.arange(0, 8)[None, None, :])[None]


@triton.jit
def _words(ptr, pair, ok, PAD: tl.constexpr):
    """bf16 pairs at `ptr` (bf16 pointer) + 2 * pair, loaded as int32 words -> (x0 even, x1 odd) fp32.
    Masked lanes read 0 where PAD (columns past the row end take part in group maxima); otherwise they
    only belong to rows that are not stored and are left undefined."""
    if PAD:
        w = tl.load(ptr.to(tl.pointer_type(tl.int32)) + pair, mask=ok, other=0)
    else:
        w = tl.load(ptr.to(tl.pointer_type(tl.int32)) + pair, mask=ok)
    return (w << 16).to(tl.float32, bitcast=True), (w & -65536).to(tl.float32, bitcast=True)


@triton.jit
def _segment(row_ptr, row_ok, S0: tl.constexpr, SEG: tl.constexpr, GS: tl.constexpr, D: tl.constexpr):
    """Elements [S0, S0 + SEG) of R rows (bf16 row_ptr, row_ok [R, 1, 1, 1]) in groups of GS:
    -> (pair int32 [1, NG, C, 4] pair index, ok [R, NG, C, 4], x0, x1 fp32 [R, NG, C, 4])."""
    pair = _pair_index(S0, SEG, GS)
    ok = row_ok & (pair < D // 2)
    x0, x1 = _words(row_ptr, pair, ok, S0 + SEG > D)
    return pair, ok, x0, x1


@triton.jit
def _pair_index(S0: tl.constexpr, SEG: tl.constexpr, GS: tl.constexpr):
    """Pair index (element // 2) of the [1, NG, C, 4] halves of a segment."""
    NG: tl.constexpr = SEG // GS
    C: tl.constexpr = GS // 8
    return (S0 // 2 + tl.arange(0, NG)[:, None, None] * (GS // 2) + tl.arange(0, C)[None, :, None] * 4
            + tl.arange(0, 4)[None, None, :])[None]


@triton.jit
def _rope(x0, x1, pair, cos_row, sin_row, row_ok, NP: tl.constexpr, RP: tl.constexpr, FAST: tl.constexpr):
    """Rotate the pairs j = pair - (NP - RP) in [0, RP) by the fp32 cos/sin rows, bf16-rounded
    (layers.rope.apply_rope); other pairs unchanged."""
    j = pair - (NP - RP)
    rot = (j >= 0) & (j < RP)
    c = tl.load(cos_row + j, mask=rot & row_ok)  # masked lanes: unused (the where below)
    s = tl.load(sin_row + j, mask=rot & row_ok)
    y0 = bf16_rne(x0 * c - x1 * s, FAST)
    y1 = bf16_rne(x0 * s + x1 * c, FAST)
    return tl.where(rot, y0, x0), tl.where(rot, y1, x1)


# ------------------------------------------------------------------------------------ quantizers
@triton.jit
def _mxfp8(y0, y1):
    """MXFP8 per (chunk, pair) group of [R, G, C, 4] halves (quant.fp8.mxfp8_quant)
    -> (y0 / s, y1 / s to be e4m3-encoded, UE8M0 byte of the scale int32 [R, G, 1, 1])."""
    amax = pair_amax(y0, y1)
    _, inv, e = pow2_ceil(tl.where(amax < 1e-4, 1e-4, amax) * (1.0 / 448.0))
    return y0 * inv, y1 * inv, e  # x / s == x * (1 / s) exactly for a power-of-two s


@triton.jit
def _kv_code(x, rcp):
    """E2M1 code (sign kept) of clamp(RN(x / s), -6, 6) from rcp = RN(1 / s), s an e4m3 scale."""
    m, _ = e2m1_rne(snap12(tl.minimum(tl.abs(x) * rcp, 6.0)))
    return m | ((x.to(tl.int32, bitcast=True) >> 28) & 8)


@triton.jit
def _kv_fp4(x0, x1, FAST: tl.constexpr):
    """Compressed-KV FP4 per 16-group (quant.fp4.kv_fp4_quant) -> (packed bytes int32 [R, G, C, 4],
    e4m3 scale bytes uint8 [R, G, 1, 1]). A NaN group stores codes 0 and the NaN scale 0x7F."""
    amax = pair_amax(x0, x1)
    amax = tl.where(amax < 6.0 * 2.0**-9, 6.0 * 2.0**-9, amax)
    if FAST:
        # RN(amax / 6) by one FMA correction of amax * RN(1/6) (exact for every bf16 amax; inf kept)
        q = amax * (1.0 / 6.0)
        q = tl.where(amax < float("inf"), tl.fma(tl.fma(q, -6.0, amax), 1.0 / 6.0, q), amax)
        s8 = e4m3_rne(q, FAST)
        b = kv_fp4_byte_f16x2(x0, x1, 1.0 / e4m3_decode(s8, FAST))  # ~1 / s suffices: see snap12
    else:
        s8 = e4m3_rne(tl.math.div_rn(amax, 6.0), FAST)
        rcp = tl.math.div_rn(1.0, e4m3_decode(s8, FAST))
        b = _kv_code(x0, rcp) | (_kv_code(x1, rcp) << 4)
    return tl.where(amax == amax, b, 0), s8


@triton.jit
def _index_scales(x0, x1):
    """Per 32-group scales of the indexer's two FP4 stages -> (inv1 = 1 / s1, m2 = s1 / scale, scale,
    its UE8M0 byte, finite), all [R, G, 1, 1]. Stage 1 (quant.fp4.index_fp4_stage1) rounds x / s1 onto
    the E2M1 grid and multiplies back by s1; stage 2 (layouts.index_fp4_pack) takes the group maximum
    of that, which is the rounded maximum (the rounding is monotone), so it needs no second reduction.
    Non-finite groups (a NaN or inf input, or a stage-1 value overflowing) store codes 0 and byte 255."""
    amax = pair_amax(x0, x1)
    s1, inv1, _ = pow2_ceil(tl.where(amax < 6.0 * 2.0**-126, 6.0 * 2.0**-126, amax) * (1.0 / 6.0))
    _, top = e2m1_rne(tl.minimum(amax * inv1, 6.0, propagate_nan=tl.PropagateNan.ALL))
    sc = (top * s1) * (1.0 / 6.0)
    scale, inv, e = pow2_ceil(tl.where(sc < 1e-4, 1e-4, sc))
    return inv1, s1 * inv, scale, e, sc < float("inf")


@triton.jit
def _index_codes(x, inv1, m2):
    """Stage-2 magnitude code and value of one element (portable twin of index_fp4_byte_f16x2)."""
    _, a = e2m1_rne(tl.minimum(tl.abs(x) * inv1, 6.0))
    return e2m1_rne(tl.minimum(a * m2, 6.0))


@triton.jit
def _f16x2_bits(m2):
    """fp32 power of two (clamped to >= 2**-24) -> its f16 bits in both halves of an int32."""
    b = tl.maximum(m2, 2.0**-24).to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    return b | (b << 16)


# ------------------------------------------------------------------------------------ kernels
@triton.jit
def _window_kv_store_kernel(
    kv_ptr, kv_rs, w_ptr, cos_ptr, sin_ptr, cs_rs, slot_ptr, pool_ptr, pool_rs, eps, n,
    D: tl.constexpr, DP: tl.constexpr, RP: tl.constexpr, R: tl.constexpr, SEG: tl.constexpr, FAST: tl.constexpr,
    SS_STEP: tl.constexpr, SS_G: tl.constexpr,
):
    NP: tl.constexpr = D // 2
    NG: tl.constexpr = SEG // 32
    r = tl.program_id(0) * R + tl.arange(0, R)
    slot = tl.load(slot_ptr + r, mask=r < n, other=-1).to(tl.int64)
    row_ok = (slot >= 0)[:, None, None, None]
    rows = r.to(tl.int64) * kv_rs
    src = kv_ptr + rows[:, None, None, None]
    dst = pool_ptr + (slot * pool_rs)[:, None, None, None]
    cs = (r * cs_rs)[:, None, None, None]
    # RMSNorm statistic (reduction.mean_square): fp32 sum of squares in the fixed order, fp32 rstd
    ss = ordered_sumsq(kv_ptr + rows[:, None, None], (slot >= 0)[:, None, None], D, SS_STEP, SS_G)
    rstd = rms_rstd(ss, D * 1.0, eps)[:, None, None, None]
    for i in tl.static_range(0, DP // SEG):
        S0 = i * SEG
        if S0 < D:
            pair, m, x0, x1 = _segment(src, row_ok, S0, SEG, 32, D)
            # weights in the rows' layout (a load per row, from L1, instead of a shuffle)
            w0, w1 = _words(w_ptr + 0 * rows[:, None, None, None], pair, pair < NP, S0 + SEG > D)
            y0 = bf16_rne(w0 * (x0 * rstd), FAST)
            y1 = bf16_rne(w1 * (x1 * rstd), FAST)
            if S0 + SEG > D - 2 * RP:
                y0, y1 = _rope(y0, y1, pair, cos_ptr + cs, sin_ptr + cs, row_ok, NP, RP, FAST)
            v0, v1, s = _mxfp8(y0, y1)
            col = _columns(S0, SEG, 32)
            q = e4m3_rne(tl.reshape(tl.join(v0, v1), (R, NG, 4, 8)), FAST)
            tl.store(dst + col, q, mask=row_ok & (col < D))
            g = S0 // 32 + tl.arange(0, NG)[None, :, None, None]
            tl.store(dst + D + g, s.to(tl.uint8), mask=row_ok & (g < D // 32))


@triton.jit
def _compressed_kv_store_kernel(
    x_ptr, x_rs, cos_ptr, sin_ptr, cs_rs, slot_ptr, pool_ptr, pool_rs, n,
    D: tl.constexpr, DP: tl.constexpr, RP: tl.constexpr, R: tl.constexpr, SEG: tl.constexpr, FAST: tl.constexpr,
):
    NP: tl.constexpr = D // 2
    r = tl.program_id(0) * R + tl.arange(0, R)
    slot = tl.load(slot_ptr + r, mask=r < n, other=-1).to(tl.int64)
    row_ok = (slot >= 0)[:, None, None, None]
    src = x_ptr + (r.to(tl.int64) * x_rs)[:, None, None, None]
    dst = pool_ptr + (slot * pool_rs)[:, None, None, None]
    cs = (r * cs_rs)[:, None, None, None]
    for i in tl.static_range(0, DP // SEG):
        S0 = i * SEG
        if S0 < D:
            pair, m, x0, x1 = _segment(src, row_ok, S0, SEG, 16, D)
            if S0 + SEG > D - 2 * RP:
                x0, x1 = _rope(x0, x1, pair, cos_ptr + cs, sin_ptr + cs, row_ok, NP, RP, FAST)
            b, s8 = _kv_fp4(x0, x1, FAST)
            tl.store(dst + pair, b.to(tl.uint8), mask=m)
            g = S0 // 16 + tl.arange(0, SEG // 16)[None, :, None, None]
            tl.store(dst + NP + g, s8, mask=row_ok & (g < D // 16))


@triton.jit
def _index_fp4_kernel(
    x_ptr, x_st, x_sh, cos_ptr, sin_ptr, cs_rs, slot_ptr, out_ptr, out_rs, n,
    H: tl.constexpr, D: tl.constexpr, DP: tl.constexpr, RP: tl.constexpr, R: tl.constexpr, SEG: tl.constexpr,
    QDQ: tl.constexpr, FAST: tl.constexpr,
):
    """Rows r = t * H + h of x [T, H, D]. QDQ: out [n, D] bf16 = the two-stage round trip (queries);
    else out is the index-key pool and row r goes to slot slot_ptr[r] (H = 1)."""
    NP: tl.constexpr = D // 2
    r = tl.program_id(0) * R + tl.arange(0, R)
    t = r // H
    if QDQ:
        ok = r < n
        dst = out_ptr + (r.to(tl.int64) * out_rs)[:, None, None, None]
    else:
        slot = tl.load(slot_ptr + r, mask=r < n, other=-1).to(tl.int64)
        ok = slot >= 0
        dst = out_ptr + (slot * out_rs)[:, None, None, None]
    row_ok = ok[:, None, None, None]
    src = x_ptr + (t.to(tl.int64) * x_st + (r % H) * x_sh)[:, None, None, None]
    cs = (t * cs_rs)[:, None, None, None]
    for i in tl.static_range(0, DP // SEG):
        S0 = i * SEG
        if S0 < D:
            pair, m, x0, x1 = _segment(src, row_ok, S0, SEG, 32, D)
            if S0 + SEG > D - 2 * RP:
                x0, x1 = _rope(x0, x1, pair, cos_ptr + cs, sin_ptr + cs, row_ok, NP, RP, FAST)
            inv1, m2, scale, e, fin = _index_scales(x0, x1)
            if QDQ:
                sq = tl.where(fin, scale, float("nan"))  # UE8M0 byte 255 dequantizes to NaN
                if FAST:  # bf16 pairs as int32 words
                    y = index_fp4_qdq_f16x2(x0, x1, inv1, _f16x2_bits(m2), sq)
                    tl.store(dst.to(tl.pointer_type(tl.int32)) + pair, y, mask=m)
                else:
                    m0, a0 = _index_codes(x0, inv1, m2)
                    m1, a1 = _index_codes(x1, inv1, m2)
                    y0 = tl.where((x0 < 0) & (m0 > 0), -a0, a0) * sq  # -0 is stored as +0
                    y1 = tl.where((x1 < 0) & (m1 > 0), -a1, a1) * sq
                    col = _columns(S0, SEG, 32)
                    y = tl.reshape(tl.join(y0, y1), (R, SEG // 32, 4, 8)).to(tl.bfloat16)
                    tl.store(dst + col, y, mask=row_ok & (col < D))
            else:
                if FAST:
                    b = index_fp4_byte_f16x2(x0, x1, inv1, _f16x2_bits(m2))
                else:
                    m0, _ = _index_codes(x0, inv1, m2)
                    m1, _ = _index_codes(x1, inv1, m2)
                    b = (m0 | tl.where((x0 < 0) & (m0 > 0), 8, 0)) | ((m1 | tl.where((x1 < 0) & (m1 > 0), 8, 0)) << 4)
                tl.store(dst + pair, tl.where(fin, b, 0).to(tl.uint8), mask=m)
                g = S0 // 32 + tl.arange(0, SEG // 32)[None, :, None, None]
                tl.store(dst + NP + g, e.to(tl.uint8), mask=row_ok & (g < D // 32))


# ------------------------------------------------------------------------------------ wrappers
# Launch keywords of every wrapper (the benchmark sweeps them): rows = token rows per program (a power
# of two), num_warps, seg = elements per segment (default: the smallest that fills the lanes, see the
# module doc), portable = run the interpreter's formulation of the encoders (no hardware conversions,
# no inline PTX) on the GPU too; same bytes, slower, for bisecting.
def _words_ok(x: torch.Tensor, *strides: int) -> bool:
    """Rows are read as int32 words: 4-byte aligned base, even element strides."""
    return x.data_ptr() % 4 == 0 and all(st % 2 == 0 for st in strides)


def _check_rows(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, slots: torch.Tensor, pool: torch.Tensor,
                row_bytes: int, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n, d = x.shape
    assert d % group == 0 and pool.dtype == torch.uint8 and pool.dim() == 2 and pool.size(1) == row_bytes, (x.shape, pool.shape)
    assert pool.stride(1) == 1 and slots.shape == (n,) and cos.shape == sin.shape and cos.size(0) == n
    assert 2 * cos.size(1) <= d and cos.dtype == sin.dtype == torch.float32 and x.dtype == torch.bfloat16
    if x.stride(1) != 1 or not _words_ok(x, x.stride(0)):
        x = x.contiguous()
    return x, cos.contiguous(), sin.contiguous()


def _tile(d: int, group: int, rows: int, num_warps: int, seg: int | None) -> int:
    """Segment length: the smallest power of two >= one group with rows * seg / 8 >= 32 * num_warps.
    Defaults measured on the H200 (benchmark/results/2026-11-29-h200-kernels.md, store variants):
    window 2 rows / 1 warp; compressed 2 / 1 with 256-element segments; index key 4 / 1 with whole
    rows; query quant 16 / 1."""
    dp = next_pow2(d)
    if seg is None:
        seg = min(dp, max(group, next_pow2(256 * num_warps // rows)))
    assert seg % group == 0 and dp % seg == 0 and rows == next_pow2(rows), (rows, seg)
    return seg


def _meta(d: int, cos: torch.Tensor, rows: int, num_warps: int, seg: int, group: int, portable: bool) -> dict:
    """Launch keywords shared by the store kernels: row width, RoPE width, tile and encoder path."""
    return dict(D=d, DP=next_pow2(d), RP=cos.size(1), R=rows, SEG=_tile(d, group, rows, num_warps, seg),
                FAST=FAST and not portable, num_warps=num_warps, **NO_FMA)


@window_kv_store.triton_impl
def window_kv_store_triton(kv, norm_weight, eps, cos, sin, slots, pool, rows: int = 2, num_warps: int = 1,
                           seg: int | None = None, portable: bool = False):
    n, d = kv.shape
    if n == 0:
        return
    kv, cos, sin = _check_rows(kv, cos, sin, slots, pool, d + d // 32, 32)
    w = norm_weight.contiguous()
    if not _words_ok(w):
        w = w.clone()
    step = cascade_step(d // 32)
    _window_kv_store_kernel[(triton.cdiv(n, rows),)](
        kv, kv.stride(0), w, cos, sin, cos.stride(0), slots.contiguous(), pool, pool.stride(0), float(eps), n,
        SS_STEP=step, SS_G=sumsq_chunks(d, step), **_meta(d, cos, rows, num_warps, seg, 32, portable),
    )


@compressed_kv_store.triton_impl
def compressed_kv_store_triton(latent, cos, sin, slots, pool, rows: int = 2, num_warps: int = 1, seg: int | None = None,
                               portable: bool = False):
    n, d = latent.shape
    if n == 0:
        return
    latent, cos, sin = _check_rows(latent, cos, sin, slots, pool, d // 2 + d // 16, 16)
    _compressed_kv_store_kernel[(triton.cdiv(n, rows),)](
        latent, latent.stride(0), cos, sin, cos.stride(0), slots.contiguous(), pool, pool.stride(0), n,
        **_meta(d, cos, rows, num_warps, seg or min(next_pow2(d), 256), 16, portable),
    )


@index_key_store.triton_impl
def index_key_store_triton(k, cos, sin, slots, pool, rows: int = 4, num_warps: int = 1, seg: int | None = None,
                           portable: bool = False):
    n, d = k.shape
    if n == 0:
        return
    k, cos, sin = _check_rows(k, cos, sin, slots, pool, d // 2 + d // 32, 32)
    _index_fp4_kernel[(triton.cdiv(n, rows),)](
        k, k.stride(0), 0, cos, sin, cos.stride(0), slots.contiguous(), pool, pool.stride(0), n,
        H=1, QDQ=False, **_meta(d, cos, rows, num_warps, seg or next_pow2(d), 32, portable),
    )


def index_query_quant_triton(q, cos, sin, rows: int = 16, num_warps: int = 1, seg: int | None = None,
                             portable: bool = False):
    """ops.index_query_quant (indexer.py) with the same signature and bytes: bf16 [T, Hi, di] -> bf16
    [T, Hi, di], the two-stage FP4 round trip of rope(q); a row per (token, head), through the key
    store's kernel (QDQ)."""
    t, hi, d = q.shape
    assert d % 32 == 0 and cos.shape == sin.shape and cos.size(0) == t and 2 * cos.size(1) <= d
    assert q.dtype == torch.bfloat16 and cos.dtype == sin.dtype == torch.float32
    out = torch.empty(t, hi, d, dtype=torch.bfloat16, device=q.device)
    if t * hi == 0:
        return out
    if q.stride(2) != 1 or not _words_ok(q, q.stride(0), q.stride(1)):
        q = q.contiguous()
    cos, sin = cos.contiguous(), sin.contiguous()
    _index_fp4_kernel[(triton.cdiv(t * hi, rows),)](
        q, q.stride(0), q.stride(1), cos, sin, cos.stride(0), q, out, d, t * hi,
        H=hi, QDQ=True, **_meta(d, cos, rows, num_warps, seg, 32, portable),
    )
    return out


__all__ = ["compressed_kv_store_triton", "index_key_store_triton", "index_query_quant_triton", "window_kv_store_triton"]
