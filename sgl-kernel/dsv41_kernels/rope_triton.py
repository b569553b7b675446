"""Triton `rope_rotate` (dsv41_kernels.rope): ROWS rows of x per program, one read and one write per
element. The copied head of a row moves as contiguous [ROWS, HEAD] tiles; the rotated tail as its even /
odd elements, rotated with `triton_numerics.rope_pairs` (each product and sum rounded: launched without
FMA contraction) and cast with round-to-nearest-even. Bitwise equal to the twin (NaN as NaN)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv41_kernels.rope import rope_rotate
from dsv41_kernels.triton_numerics import NO_FMA, bf16_round, rope_pairs


@triton.jit
def _rope_rows_kernel(x_ptr, cos_ptr, sin_ptr, cs_rs, out_ptr, N, HEADS, D: tl.constexpr, R: tl.constexpr,
                      HEAD_P: tl.constexpr, R_P: tl.constexpr, ROWS: tl.constexpr, INVERSE: tl.constexpr,
                      BF16: tl.constexpr):
    """x, out [N, D] contiguous (N = T * HEADS rows; row n belongs to token n // HEADS); cos / sin fp32
    [T, R] (row stride cs_rs). HEAD_P / R_P: D - 2R and R rounded up to powers of two."""
    row = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    ok = row < N
    src = x_ptr + row[:, None] * D
    dst = out_ptr + row[:, None] * D
    if D > 2 * R:  # the copied head
        col = tl.arange(0, HEAD_P)[None, :]
        m = ok[:, None] & (col < D - 2 * R)
        tl.store(dst + col, tl.load(src + col, mask=m, other=0.0), mask=m)
    j = tl.arange(0, R_P)[None, :]
    m = ok[:, None] & (j < R)
    tok = (row // HEADS)[:, None]
    c = tl.load(cos_ptr + tok * cs_rs + j, mask=m, other=1.0)
    s = tl.load(sin_ptr + tok * cs_rs + j, mask=m, other=0.0)
    if INVERSE:
        s = -s
    e = D - 2 * R + 2 * j
    y0, y1 = rope_pairs(tl.load(src + e, mask=m, other=0.0).to(tl.float32),
                        tl.load(src + e + 1, mask=m, other=0.0).to(tl.float32), c, s)
    if BF16:
        y0, y1 = bf16_round(y0), bf16_round(y1)
    tl.store(dst + e, y0.to(out_ptr.dtype.element_ty), mask=m)
    tl.store(dst + e + 1, y1.to(out_ptr.dtype.element_ty), mask=m)


@rope_rotate.triton_impl
def rope_rotate_triton(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """Same contract as the twin. Calls that need autograd, and other dtypes, run the twin."""
    grad = torch.is_grad_enabled() and x.requires_grad
    if grad or x.dim() not in (2, 3) or x.dtype not in (torch.bfloat16, torch.float32) or cos.dtype != torch.float32:
        return rope_rotate.torch(x, cos, sin, inverse)
    t, d = x.size(0), x.size(-1)
    heads = 1 if x.dim() == 2 else x.size(1)
    r = cos.size(-1)
    assert 2 * r <= d and cos.shape == sin.shape == (t, r), (x.shape, cos.shape, sin.shape)
    x = x.contiguous()
    cos, sin = cos.contiguous(), sin.contiguous()
    out = torch.empty_like(x)
    n = t * heads
    if n and d:
        rows = 4
        _rope_rows_kernel[(triton.cdiv(n, rows),)](
            x, cos, sin, max(r, 1), out, n, heads, D=d, R=r, HEAD_P=triton.next_power_of_2(max(d - 2 * r, 1)),
            R_P=triton.next_power_of_2(max(r, 1)), ROWS=rows, INVERSE=bool(inverse), BF16=x.dtype == torch.bfloat16,
            num_warps=4, **NO_FMA)
    return out


__all__ = ["rope_rotate_triton"]
