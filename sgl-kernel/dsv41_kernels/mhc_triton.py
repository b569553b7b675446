"""Triton mHC ops (`dsv41_kernels.mhc`): the gates (one launch per call, ROWS rows per program) and the
stream collapse / expand (end of file).

Per row: the sum of squares of the n*H stream values in `reduction.ordered_sum`'s order
(`triton_numerics.ordered_sumsq`), rstd = rsqrt(sum / D + norm_eps) (`rms_rstd`), the (2+n)n mixes
times rstd, times their part's scale, plus base; pre / post through the sigmoid; the n x n Sinkhorn held
in registers as an [ROWS, NP, NP] tile (NP = next power of two >= n; padded entries are never read back). Each
row or column sum is an explicit chain of adds of single entries picked out of the tile (a pick is a
sum of one value and zeros, hence exact), so it adds in the twin's order. Launched without FMA
contraction, every division IEEE (`div_rn`), so that it equals the twin bit for bit on the GPU
(test/kernels/test_mhc_gpu.py).

Transcendentals (exp, sigmoid): `transcendentals.py`, torch's bits on each device.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv41_kernels.mhc import hc_mult, mhc_collapse, mhc_expand, mhc_gates
from dsv41_kernels.transcendentals import exp_f32, sigmoid_f32
from dsv41_kernels.triton_numerics import (INTERPRET, NO_FMA, bf16_round, max_nan, ordered_sumsq, rms_rstd,
                                           stat_launch, sumsq_chunks)
from sglang_dsv41.reduction import cascade_step


@triton.jit
def _pick(v, idx, i: tl.constexpr, AXIS: tl.constexpr):
    """v[..., i, ...] along AXIS (dropped), as a sum of one value and zeros (exact; +0 for -0)."""
    return tl.sum(tl.where(idx == i, v, 0.0), axis=AXIS)


@triton.jit
def _ordered_fold(m, idx, N: tl.constexpr, AXIS: tl.constexpr):
    """m [R, NP, NP] -> the sum over AXIS kept as size 1, entries 0..N-1 added in order from entry 0
    (AXIS 2, idx = column index kk: row sums; AXIS 1, idx = row index jj: column sums)."""
    s = tl.sum(tl.where(idx == 0, m, 0.0), axis=AXIS, keep_dims=True)
    for i in tl.static_range(1, N):
        s = s + tl.sum(tl.where(idx == i, m, 0.0), axis=AXIS, keep_dims=True)
    return s


@triton.jit
def gates_rstd(x_ptr, x_rs, row, ok, norm_eps, D: tl.constexpr, STEP: tl.constexpr, G: tl.constexpr):
    """rsqrt(mean_square + norm_eps) fp32 [R] of rows `row` [R] int64 (live where ok) of x [*, D] (row
    stride x_rs, unit columns): the gates' statistic."""
    ss = ordered_sumsq(x_ptr + row[:, None, None] * x_rs, ok[:, None, None], D, STEP, G)
    return rms_rstd(ss, D * 1.0, norm_eps)


@triton.jit
def gates_rows(rstd, mix_ptr, mix_rs, base_ptr, scale_ptr, pre_ptr, post_ptr, comb_ptr, row, ok, iters, hc_eps,
               N: tl.constexpr, NP: tl.constexpr):
    """The gates of rows `row` [R] int64 (live where ok) given their `gates_rstd`: mix [*, (2+N)N] (row
    stride mix_rs, unit columns), base [(2+N)N], scale [3] -> the same rows of pre, post [*, N] and comb
    [*, N, N] contiguous fp32."""
    s0 = tl.load(scale_ptr)
    s1 = tl.load(scale_ptr + 1)
    s2 = tl.load(scale_ptr + 2)

    # pre / post: [R, NP]
    j = tl.arange(0, NP)[None, :]
    jok = j < N
    ok2 = ok[:, None] & jok
    mrow = mix_ptr + row[:, None] * mix_rs
    zp = (tl.load(mrow + j, mask=ok2, other=0.0) * rstd[:, None]) * s0 + tl.load(base_ptr + j, mask=jok, other=0.0)
    zq = (tl.load(mrow + N + j, mask=ok2, other=0.0) * rstd[:, None]) * s1 + tl.load(base_ptr + N + j, mask=jok,
                                                                                    other=0.0)
    tl.store(pre_ptr + row[:, None] * N + j, sigmoid_f32(zp) + hc_eps, mask=ok2)
    tl.store(post_ptr + row[:, None] * N + j, sigmoid_f32(zq) * 2.0, mask=ok2)

    # comb: Sinkhorn on [R, NP, NP], entry (jj, kk) = mix column 2N + jj*N + kk
    jj = tl.arange(0, NP)[None, :, None]
    kk = tl.arange(0, NP)[None, None, :]
    cok = (jj < N) & (kk < N)
    ok3 = ok[:, None, None] & cok
    off = 2 * N + jj * N + kk
    c = (tl.load(mix_ptr + row[:, None, None] * mix_rs + off, mask=ok3, other=0.0) * rstd[:, None, None]) * s2
    c = c + tl.load(base_ptr + off, mask=cok, other=0.0)
    c = tl.where(cok, c, float("-inf"))
    m = exp_f32(c - tl.reduce(c, 2, max_nan, keep_dims=True))  # NaN-propagating row max (torch.amax)
    m = tl.math.div_rn(m, _ordered_fold(m, kk, N, 2)) + hc_eps
    m = tl.math.div_rn(m, _ordered_fold(m, jj, N, 1) + hc_eps)
    for _ in range(1, iters):
        m = tl.math.div_rn(m, _ordered_fold(m, kk, N, 2) + hc_eps)
        m = tl.math.div_rn(m, _ordered_fold(m, jj, N, 1) + hc_eps)
    tl.store(comb_ptr + row[:, None, None] * (N * N) + jj * N + kk, m, mask=ok3)


@triton.jit
def _mhc_gates_kernel(x_ptr, x_rs, mix_ptr, mix_rs, base_ptr, scale_ptr, pre_ptr, post_ptr, comb_ptr, T, iters,
                      hc_eps, norm_eps, N: tl.constexpr, NP: tl.constexpr, D: tl.constexpr, STEP: tl.constexpr,
                      G: tl.constexpr, ROWS: tl.constexpr):
    """x [T, D], mix [T, (2+N)N] (`gates_rows`) -> pre, post [T, N], comb [T, N, N]; ROWS rows per program."""
    row = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    ok = row < T
    rstd = gates_rstd(x_ptr, x_rs, row, ok, norm_eps, D, STEP, G)
    gates_rows(rstd, mix_ptr, mix_rs, base_ptr, scale_ptr, pre_ptr, post_ptr, comb_ptr, row, ok, iters, hc_eps, N, NP)


def _unit_cols(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


@mhc_gates.triton_impl
def mhc_gates_triton(x, mix, base, scale, iters: int, hc_eps: float, norm_eps: float, rows: int | None = None,
                     num_warps: int | None = None, chunks: int | None = None):
    """Same contract as the twin for 2-D x with n*H % 32 == 0 (bf16 / fp32) and fp32 mix / base / scale;
    other inputs, and calls that need autograd, run the twin. Launch: `rows` rows per program,
    `chunks` cascade chunks per statistic loop iteration (a power of two), `num_warps` (rows and warps by
    default from `triton_numerics.stat_launch`)."""
    n = hc_mult(base.numel())
    d = x.size(-1)
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (x, mix, base, scale))
    if (grad or x.dim() != 2 or d % 32 or x.dtype not in (torch.bfloat16, torch.float32)
            or any(t.dtype != torch.float32 for t in (mix, base, scale)) or mix.shape != (x.size(0), base.numel())):
        return mhc_gates.torch(x, mix, base, scale, iters, hc_eps, norm_eps)
    x, mix = _unit_cols(x), _unit_cols(mix)
    t = x.size(0)
    pre = torch.empty(t, n, dtype=torch.float32, device=x.device)
    post = torch.empty(t, n, dtype=torch.float32, device=x.device)
    comb = torch.empty(t, n, n, dtype=torch.float32, device=x.device)
    if t:
        rows, num_warps = stat_launch(t, d, rows, num_warps)
        step = cascade_step(d // 32)
        chunks = sumsq_chunks(d, step, chunks)
        _mhc_gates_kernel[(triton.cdiv(t, rows),)](
            x, x.stride(0), mix, mix.stride(0), base.contiguous(), scale.contiguous(), pre, post, comb, t,
            max(int(iters), 1), float(hc_eps), float(norm_eps), N=n, NP=triton.next_power_of_2(n), D=d,
            STEP=step, G=chunks, ROWS=rows, num_warps=num_warps, **NO_FMA)
    return pre, post, comb


# ------------------------------------------------------------------ stream collapse / expand
# Memory bound: one program per (TB tokens, BH columns of H), every input element read once (bf16 or
# fp32, 16-byte loads along H), the output written once. The n streams are a constexpr loop (N <= 4);
# the expand keeps its n outputs as an [TB, NP, BH] tile (NP = next power of two >= N, padded rows
# masked) so each stream is loaded once and added into all n sums. Products and adds are separate IEEE
# fp32 ops (NO_FMA), sums start from +0 and run over j ascending (the twins' order); the one bf16
# rounding at the end is the GPU's cvt.rn (RNE, packed in pairs by ptxas). The interpreter's bf16 <->
# fp32 casts truncate and get subnormals wrong (bf16 1e-39 reads as 5.9e-39, a 9e-41 result is stored
# as 0), so under it both conversions go through the bits (`bf16_round` for the rounding).
_INTERP = tl.constexpr(INTERPRET)


@triton.jit
def _widen(x):
    """Loaded bf16 | fp32 values -> fp32, exactly."""
    if _INTERP:
        if x.dtype == tl.bfloat16:
            x = (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    return x.to(tl.float32)


@triton.jit
def _store_out(ptr, v, mask, OUT_BF16: tl.constexpr):
    """Store fp32 v rounded once to the output dtype (bf16 RNE, or fp32 as is)."""
    if OUT_BF16:
        if _INTERP:
            tl.store(ptr, (bf16_round(v).to(tl.uint32, bitcast=True) >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True),
                     mask=mask)
        else:
            tl.store(ptr, v.to(tl.bfloat16), mask=mask)
    else:
        tl.store(ptr, v, mask=mask)


@triton.jit
def _collapse_kernel(r_ptr, r_ts, r_ns, pre_ptr, out_ptr, T, H, N: tl.constexpr, TB: tl.constexpr, BH: tl.constexpr,
                     OUT_BF16: tl.constexpr):
    """R [T, N, H] (strides r_ts, r_ns, 1), pre [T, N] contiguous fp32 -> out [T, H] contiguous."""
    tok = (tl.program_id(0).to(tl.int64) * TB + tl.arange(0, TB))[:, None]  # [TB, 1]
    col = (tl.program_id(1) * BH + tl.arange(0, BH))[None, :]  # [1, BH]
    collapse_tile(r_ptr, r_ts, r_ns, pre_ptr, out_ptr, tok, col, tok < T, H, N, OUT_BF16)


@triton.jit
def collapse_tile(r_ptr, r_ts, r_ns, pre_ptr, out_ptr, tok, col, tok_ok, H, N: tl.constexpr, OUT_BF16: tl.constexpr):
    """The collapse of tokens tok [TB, 1] int64 (live where tok_ok) at columns col [1, BH] (< H live):
    R [*, N, H] (strides r_ts, r_ns, 1), pre [*, N] contiguous fp32 -> out [*, H] contiguous."""
    ok = tok_ok & (col < H)
    acc = tl.zeros(ok.shape, tl.float32)
    for j in tl.static_range(N):
        r = tl.load(r_ptr + tok * r_ts + j * r_ns + col, mask=ok, other=0.0)
        p = tl.load(pre_ptr + tok * N + j, mask=tok_ok, other=0.0)
        acc = acc + p * _widen(r)
    _store_out(out_ptr + tok * H + col, acc, ok, OUT_BF16)


@triton.jit
def _expand_kernel(y_ptr, y_ts, r_ptr, r_ts, r_ns, post_ptr, comb_ptr, out_ptr, T, H, N: tl.constexpr,
                   NP: tl.constexpr, TB: tl.constexpr, BH: tl.constexpr, OUT_BF16: tl.constexpr):
    """y [T, H] (strides y_ts, 1), R [T, N, H] (strides r_ts, r_ns, 1), post [T, N], comb [T, N, N]
    contiguous fp32 -> out [T, N, H] contiguous; tile [TB, NP (output stream k), BH]."""
    tok = (tl.program_id(0).to(tl.int64) * TB + tl.arange(0, TB))[:, None, None]
    k = tl.arange(0, NP)[None, :, None]
    col = (tl.program_id(1) * BH + tl.arange(0, BH))[None, None, :]
    tok_ok = tok < T
    ok = tok_ok & (col < H)  # [TB, 1, BH]
    kok = tok_ok & (k < N)  # [TB, NP, 1]
    mixed = tl.zeros([TB, NP, BH], tl.float32)
    for j in tl.static_range(N):
        r = _widen(tl.load(r_ptr + tok * r_ts + j * r_ns + col, mask=ok, other=0.0))  # [TB, 1, BH]
        c = tl.load(comb_ptr + tok * (N * N) + j * N + k, mask=kok, other=0.0)  # comb[:, j, k]: [TB, NP, 1]
        mixed = mixed + c * r
    yv = _widen(tl.load(y_ptr + tok * y_ts + col, mask=ok, other=0.0))
    pv = tl.load(post_ptr + tok * N + k, mask=kok, other=0.0)
    _store_out(out_ptr + (tok * N + k) * H + col, pv * yv + mixed, ok & (k < N), OUT_BF16)


_FLOATS = (torch.bfloat16, torch.float32)


def _stream_launch(t: int, tb: int | None, block_h: int | None, num_warps: int | None, big_tb: int):
    """Tokens per program, BH, warps: BH 1024 (16-byte loads for 4 warps) once there are enough tokens
    to fill the GPU, else 256 (more programs at decode sizes); `big_tb` tokens per program from T = 2048."""
    block_h = block_h or (1024 if t >= 64 else 256)
    return tb or (big_tb if t >= 2048 else 1), block_h, num_warps or max(1, block_h // 256)


def _unit_last(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 or t.numel() == 0 else t.contiguous()


@mhc_collapse.triton_impl
def mhc_collapse_triton(streams, pre, tb: int | None = None, block_h: int | None = None, num_warps: int | None = None):
    """Same contract as the twin for 3-D bf16 / fp32 streams with 1 <= n <= 4 and fp32 pre [T, n];
    other inputs, and calls that need autograd, run the twin. streams may be strided (unit stride
    along H, else copied). Launch: `tb` tokens per program, `block_h` columns, `num_warps`."""
    grad = torch.is_grad_enabled() and (streams.requires_grad or pre.requires_grad)
    if (grad or streams.dim() != 3 or streams.dtype not in _FLOATS or pre.dtype != torch.float32
            or not 1 <= streams.size(1) <= 4 or pre.shape != streams.shape[:2]):
        return mhc_collapse.torch(streams, pre)
    t, n, h = streams.shape
    out = torch.empty(t, h, dtype=streams.dtype, device=streams.device)
    if t and h:
        streams, pre = _unit_last(streams), pre.contiguous()
        tb, block_h, num_warps = _stream_launch(t, tb, block_h, num_warps, 4)
        _collapse_kernel[(triton.cdiv(t, tb), triton.cdiv(h, block_h))](
            streams, streams.stride(0), streams.stride(1), pre, out, t, h, N=n, TB=tb, BH=block_h,
            OUT_BF16=out.dtype == torch.bfloat16, num_warps=num_warps, **NO_FMA)
    return out


@mhc_expand.triton_impl
def mhc_expand_triton(y, streams, post, comb, tb: int | None = None, block_h: int | None = None,
                      num_warps: int | None = None):
    """Same contract as the twin for bf16 / fp32 y [T, H] and streams [T, n, H] with 1 <= n <= 4, fp32
    post [T, n] and comb [T, n, n]; other inputs, and calls that need autograd, run the twin. y and
    streams may be strided (unit stride along H, else copied). Launch as `mhc_collapse_triton`."""
    args = (y, streams, post, comb)
    grad = torch.is_grad_enabled() and any(a.requires_grad for a in args)
    if (grad or streams.dim() != 3 or y.dim() != 2 or streams.dtype not in _FLOATS or y.dtype not in _FLOATS
            or post.dtype != torch.float32 or comb.dtype != torch.float32 or not 1 <= streams.size(1) <= 4
            or y.shape != (streams.size(0), streams.size(2)) or post.shape != streams.shape[:2]
            or comb.shape != (*streams.shape[:2], streams.size(1))):
        return mhc_expand.torch(*args)
    t, n, h = streams.shape
    out = torch.empty(t, n, h, dtype=y.dtype, device=y.device)
    if t and h:
        y, streams, post, comb = _unit_last(y), _unit_last(streams), post.contiguous(), comb.contiguous()
        tb, block_h, num_warps = _stream_launch(t, tb, block_h, num_warps, 2)
        _expand_kernel[(triton.cdiv(t, tb), triton.cdiv(h, block_h))](
            y, y.stride(0), streams, streams.stride(0), streams.stride(1), post, comb, out, t, h, N=n,
            NP=triton.next_power_of_2(n), TB=tb, BH=block_h, OUT_BF16=out.dtype == torch.bfloat16,
            num_warps=num_warps, **NO_FMA)
    return out


__all__ = ["collapse_tile", "gates_rows", "gates_rstd", "mhc_collapse_triton", "mhc_expand_triton", "mhc_gates_triton"]
