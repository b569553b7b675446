"""Triton RMSNorm in the fixed fp32 order (`dsv41_kernels.norm`), ROWS rows per program.

Per row: the sum of squares in `reduction.ordered_sum`'s order (`ordered_sumsq`), an IEEE division
by d, rsqrt(+ eps), then x * rstd * weight in fp32 (two roundings, as the twin), one cast. Launched
without FMA contraction: bitwise equal to the twin on the GPU (the interpreter, too)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv41_kernels.norm import rms_norm
from dsv41_kernels.triton_numerics import NO_FMA, bf16_round, ordered_sumsq, rms_rstd, stat_launch, sumsq_chunks
from sglang_dsv41.reduction import cascade_step


@triton.jit
def rms_norm_rows(x_ptr, x_rs, w_ptr, out_ptr, row, ok, eps, D: tl.constexpr, STEP: tl.constexpr, G: tl.constexpr,
                  CH: tl.constexpr, BF16_OUT: tl.constexpr):
    """Rows `row` [R] int64 (live where ok) of x [*, D] (row stride x_rs, unit column stride) -> the same
    rows of out [*, D] contiguous; CH columns per step of the output loop."""
    ss = ordered_sumsq(x_ptr + row[:, None, None] * x_rs, ok[:, None, None], D, STEP, G)
    rstd = rms_rstd(ss, D * 1.0, eps)[:, None]
    for c in tl.static_range(0, D, CH):
        col = c + tl.arange(0, CH)
        cok = col < D
        m = ok[:, None] & cok[None, :]
        x = tl.load(x_ptr + row[:, None] * x_rs + col[None, :], mask=m, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + col, mask=cok, other=0.0).to(tl.float32)
        y = w[None, :] * (x * rstd)
        if BF16_OUT:
            tl.store(out_ptr + row[:, None] * D + col[None, :], bf16_round(y).to(tl.bfloat16), mask=m)
        else:
            tl.store(out_ptr + row[:, None] * D + col[None, :], y, mask=m)


@triton.jit
def _rms_norm_kernel(x_ptr, x_rs, w_ptr, out_ptr, M, eps, D: tl.constexpr, STEP: tl.constexpr,
                     G: tl.constexpr, ROWS: tl.constexpr, CH: tl.constexpr, BF16_OUT: tl.constexpr):
    """x [M, D] (row stride x_rs, unit column stride) -> out [M, D] contiguous."""
    row = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    rms_norm_rows(x_ptr, x_rs, w_ptr, out_ptr, row, row < M, eps, D, STEP, G, CH, BF16_OUT)


@rms_norm.triton_impl
def rms_norm_triton(x, weight, eps: float, rows: int | None = None, num_warps: int | None = None,
                    chunks: int | None = None):
    """Same contract as the twin; d % 32 == 0 and bf16 / fp32 x (other shapes run the twin). Launch: `rows`
    rows per program, `chunks` cascade chunks per statistic loop iteration (a power of two), `num_warps`
    (rows and warps by default from `triton_numerics.stat_launch`)."""
    d = x.size(-1)
    if d % 32 or x.dtype not in (torch.bfloat16, torch.float32) or weight is None:
        return rms_norm.torch(x, weight, eps)
    x2 = x.reshape(-1, d)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.size(0)
    out = torch.empty(m, d, dtype=x.dtype, device=x.device)
    if m:
        rows, num_warps = stat_launch(m, d, rows, num_warps)
        step = cascade_step(d // 32)
        _rms_norm_kernel[(triton.cdiv(m, rows),)](
            x2, x2.stride(0), weight, out, m, float(eps), D=d, STEP=step, G=sumsq_chunks(d, step, chunks), ROWS=rows,
            CH=min(1024, triton.next_power_of_2(d)), BF16_OUT=x.dtype == torch.bfloat16, num_warps=num_warps, **NO_FMA)
    return out.view(x.shape)


__all__ = ["rms_norm_rows", "rms_norm_triton"]
