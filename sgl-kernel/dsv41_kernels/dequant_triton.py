"""Exact bf16 operands for the prefill GEMMs: MXFP8 / FP8 / FP4 values as bf16 tensors.

Every MX value is a short code times a power of two, so it is a bf16 number: E4M3 (3 mantissa bits)
or E2M1 (1 bit) times 2**e for any scale the formats hold. A product of two such bf16 values is
exact in fp32, so a bf16 tensor-core GEMM over these operands computes the same exact products as
the per-32-block fp8 MMA (`gemm_triton`) and differs from the twins only in the order and width of
the fp32 additions (docs/numerics.md, "Prefill GEMMs"). That lets prefill GEMMs run at bf16
library speed (cuBLAS / CUTLASS grouped) on operands built here in one pass each:

  mxfp8_qdq(x, rows=None, div=1)   bf16 [M, K] -> bf16 [P, K]: row p = the MXFP8 round trip
                                   (`quant.fp8.mxfp8_quant`, then value * scale) of x[rows[p] // div]
                                   (rows None: P = M, row p of x); bitwise the twin's dequantized operand
  fp4_weight_bf16(w, s, out)       E2M1 uint8 [E, N, K/2] + UE8M0 [E, N, K/32] -> out bf16 [E, N, K]
  fp8_weight_bf16(w, s)            E4M3 [N, K] + UE8M0 [ceil(N/32), K/32] (32 x 32 tiles) -> bf16 [N, K]
  swiglu_qdq(gu, wt, limit)        bf16 [R, 2I] (g | u) + fp32 [R] -> bf16 [R, I]: the MXFP8 round
                                   trip of bf16(wt * (silu(min(g, L)) * clamp(u, -L, L))), the
                                   grouped MoE's stage-1 epilogue (moe_triton) on a tensor
Values leave the normal bf16 range only where the fp32 scale products of the fp8 path would too
(scales below 2**-126); there both round the same subnormals.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv41_kernels.triton_numerics import (INTERPRET, NO_FMA, bf16_round, e2m1_decode, e4m3_decode, e4m3_rne, e8m0_value,
                                            max_nan, ue8m0_ceil)
from sglang_dsv41.determinism import deterministic


def bf16_path_allowed(device: torch.device) -> bool:
    """Whether a prefill GEMM may run on these bf16 operands: a CUDA device, not deterministic mode (a
    row's bits would depend on its call's size), not inside a graph capture (decode keeps its kernels)."""
    return device.type == "cuda" and not torch.cuda.is_current_stream_capturing() and not deterministic()


@triton.jit
def _qdq_group(x, FAST: tl.constexpr):
    """fp32 [BM, G, 32] -> fp32 [BM, G, 32]: each 32-group's MXFP8 value (`mxfp8_quant`: amax clamped at
    1e-4, NaN kept, UE8M0 ceiling of amax / 448, E4M3 RNE with saturation) times its scale. FAST: the
    hardware E4M3 conversions (triton_numerics "fast paths"; the software encoder made this SM bound)."""
    amax = tl.reduce(tl.abs(x), 2, max_nan, keep_dims=True)
    amax = tl.where(amax < 1e-4, 1e-4, amax)
    s = ue8m0_ceil(amax * (1.0 / 448.0))
    return e4m3_decode(e4m3_rne(x * tl.math.div_rn(1.0, s), FAST), FAST) * s


@triton.jit
def _qdq_rows_kernel(x_ptr, x_rs, rows_ptr, out_ptr, P, K, DIV, GATHER: tl.constexpr, BM: tl.constexpr,
                     G: tl.constexpr, FAST: tl.constexpr):
    """Program (row block, column block of G groups of 32): out[p] = qdq(x[rows[p] // DIV]) (GATHER) or
    qdq(x[p]); out contiguous [P, K]."""
    p = tl.program_id(0) * BM + tl.arange(0, BM)
    ok = p < P
    src = (tl.load(rows_ptr + p, mask=ok, other=0) // DIV) if GATHER else p
    col = tl.program_id(1) * (G * 32) + tl.arange(0, G * 32)
    m = ok[:, None] & (col < K)[None, :]
    x = tl.load(x_ptr + src.to(tl.int64)[:, None] * x_rs + col[None, :], mask=m, other=0.0).to(tl.float32)
    v = tl.reshape(_qdq_group(tl.reshape(x, [BM, G, 32]), FAST), [BM, G * 32])
    tl.store(out_ptr + p.to(tl.int64)[:, None] * K + col[None, :], v.to(tl.bfloat16), mask=m)


@triton.jit
def _fp4_weight_kernel(w_ptr, w_es, w_rs, s_ptr, s_es, s_rs, out_ptr, o_es, o_rs, N, KH,
                       BR: tl.constexpr, BC: tl.constexpr, FAST: tl.constexpr):
    """Program (expert, row block, byte block): bytes w[e, n, c] (element 2c low nibble, 2c+1 high) times
    2**(s[e, n, c // 16] - 127) -> out[e, n, 2c], out[e, n, 2c + 1] bf16."""
    e = tl.program_id(2).to(tl.int64)
    n = tl.program_id(0) * BR + tl.arange(0, BR)
    c = tl.program_id(1) * BC + tl.arange(0, BC)
    m = (n < N)[:, None] & (c < KH)[None, :]
    b = tl.load(w_ptr + e * w_es + n.to(tl.int64)[:, None] * w_rs + c[None, :], mask=m, other=0).to(tl.int32)
    sc = e8m0_value(tl.load(s_ptr + e * s_es + n.to(tl.int64)[:, None] * s_rs + (c // 16)[None, :], mask=m, other=127))
    v = tl.reshape(tl.join(e2m1_decode(b & 15, FAST) * sc, e2m1_decode(b >> 4, FAST) * sc), [BR, 2 * BC])
    c2 = tl.program_id(1) * (2 * BC) + tl.arange(0, 2 * BC)
    m2 = (n < N)[:, None] & (c2 < 2 * KH)[None, :]
    tl.store(out_ptr + e * o_es + n.to(tl.int64)[:, None] * o_rs + c2[None, :], v.to(tl.bfloat16), mask=m2)


@triton.jit
def _fp8_weight_kernel(w_ptr, w_rs, s_ptr, s_rs, out_ptr, N, K, BR: tl.constexpr, BC: tl.constexpr, FAST: tl.constexpr):
    """Program (row block, column block): e4m3 w[n, k] times 2**(s[n // 32, k // 32] - 127) -> bf16 [N, K]."""
    n = tl.program_id(0) * BR + tl.arange(0, BR)
    k = tl.program_id(1) * BC + tl.arange(0, BC)
    m = (n < N)[:, None] & (k < K)[None, :]
    w = tl.load(w_ptr + n.to(tl.int64)[:, None] * w_rs + k[None, :], mask=m, other=0)
    sc = e8m0_value(tl.load(s_ptr + (n // 32)[:, None] * s_rs + (k // 32)[None, :], mask=m, other=127))
    tl.store(out_ptr + n.to(tl.int64)[:, None] * K + k[None, :], (e4m3_decode(w, FAST) * sc).to(tl.bfloat16), mask=m)


@triton.jit
def _swiglu_qdq_kernel(gu_ptr, gu_rs, wt_ptr, out_ptr, R, I, limit, BM: tl.constexpr, G: tl.constexpr,
                       FAST: tl.constexpr):
    """Program (row block, G groups of 32 columns of h): the grouped MoE's stage-1 epilogue
    (`moe_triton._moe_gemm_kernel`, STAGE1) on g = gu[:, :I], u = gu[:, I:] (both already bf16)."""
    r = tl.program_id(0) * BM + tl.arange(0, BM)
    col = tl.program_id(1) * (G * 32) + tl.arange(0, G * 32)
    m = (r < R)[:, None] & (col < I)[None, :]
    base = gu_ptr + r.to(tl.int64)[:, None] * gu_rs + col[None, :]
    g = tl.load(base, mask=m, other=0.0).to(tl.float32)
    u = tl.load(base + I, mask=m, other=0.0).to(tl.float32)
    if limit > 0:
        u = tl.where(u < -limit, -limit, tl.where(u > limit, limit, u))
        g = tl.where(g > limit, limit, g)
    h = g / (1.0 + tl.exp(-g)) * u
    wt = tl.load(wt_ptr + r, mask=r < R, other=0.0)
    h = bf16_round(wt[:, None] * h)
    v = tl.reshape(_qdq_group(tl.reshape(h, [BM, G, 32]), FAST), [BM, G * 32])
    tl.store(out_ptr + r.to(tl.int64)[:, None] * I + col[None, :], v.to(tl.bfloat16), mask=m)


def mxfp8_qdq(x: torch.Tensor, rows: torch.Tensor | None = None, div: int = 1) -> torch.Tensor:
    """bf16 [M, K] (unit column stride, K % 32 == 0) -> bf16 [P, K] (module docstring); rows int [P]."""
    m, k = x.shape
    assert k % 32 == 0 and x.stride(1) == 1, (x.shape, x.stride())
    p = m if rows is None else rows.numel()
    out = torch.empty(p, k, dtype=torch.bfloat16, device=x.device)
    if p and k:
        bm, g = 16, 4
        _qdq_rows_kernel[(triton.cdiv(p, bm), triton.cdiv(k, 32 * g))](
            x, x.stride(0), x if rows is None else rows, out, p, k, div, GATHER=rows is not None, BM=bm, G=g,
            FAST=not INTERPRET, num_warps=4, **NO_FMA)
    return out


def fp4_weight_bf16(w: torch.Tensor, s: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """w uint8 [E, N, K/2], s uint8 [E, N, >= K/32] (unit last strides) -> out bf16 [E, N, K] (any expert
    and row strides, unit column stride; e.g. a slice of a w1 | w3 buffer). Returns out."""
    n_exp, n, kh = w.shape
    assert out.shape == (n_exp, n, 2 * kh) and out.stride(-1) == 1 and w.stride(-1) == 1 and s.stride(-1) == 1
    if out.numel():
        br, bc = 32, 64
        _fp4_weight_kernel[(triton.cdiv(n, br), triton.cdiv(kh, bc), n_exp)](
            w, w.stride(0), w.stride(1), s, s.stride(0), s.stride(1), out, out.stride(0), out.stride(1), n, kh,
            BR=br, BC=bc, FAST=not INTERPRET, num_warps=4)
    return out


def fp8_weight_bf16(w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """w float8_e4m3fn [N, K] (unit column stride), s uint8 [ceil(N/32), >= K/32] -> bf16 [N, K]."""
    n, k = w.shape
    out = torch.empty(n, k, dtype=torch.bfloat16, device=w.device)
    if out.numel():
        br, bc = 32, 128
        _fp8_weight_kernel[(triton.cdiv(n, br), triton.cdiv(k, bc))](
            w.view(torch.uint8), w.stride(0), s, s.stride(0), out, n, k, BR=br, BC=bc, FAST=not INTERPRET, num_warps=4)
    return out


def swiglu_qdq(gu: torch.Tensor, wt: torch.Tensor, limit: float) -> torch.Tensor:
    """gu bf16 [R, 2I] (unit column stride), wt fp32 [R] -> bf16 [R, I] (module docstring)."""
    r, i2 = gu.shape
    i = i2 // 2
    assert i % 32 == 0 and gu.stride(1) == 1 and wt.shape == (r,), (gu.shape, wt.shape)
    out = torch.empty(r, i, dtype=torch.bfloat16, device=gu.device)
    if r and i:
        bm, g = 16, 4
        _swiglu_qdq_kernel[(triton.cdiv(r, bm), triton.cdiv(i, 32 * g))](
            gu, gu.stride(0), wt, out, r, i, float(limit), BM=bm, G=g, FAST=not INTERPRET, num_warps=4, **NO_FMA)
    return out


__all__ = ["bf16_path_allowed", "fp4_weight_bf16", "fp8_weight_bf16", "mxfp8_qdq", "swiglu_qdq"]
