"""Triton `fp8_group_linear` (dsv41_kernels.group_gemm): the attention's wo_a reading its FP8 weight as stored.

Program (group g, tile of BN weight rows, tile of BT activation rows): for each 32-wide K block, the
BN x 32 E4M3 weights are decoded in registers and multiplied by their tile's power of two (the twin's
bf16 weight, exactly), then one bf16 MMA against the BT rows of x[:, g] with the weight rows as the
MMA's M side (SWAP: a decode call of a few rows fills the narrow N side), accumulated in fp32 in K order.
SUB blocks per loop iteration keep SUB x BN x 32 weight bytes per pipeline stage in flight. The output is
rounded to bf16 once (RNE). Against the twin only the fp32 addition order differs (the bf16 GEMM
tolerance). A row's arithmetic is the same whatever the other rows and BT, so the kernel is batch invariant.

Calls of more than DECODE_ROWS rows run the twin (the library's bf16 GEMM on the dequantized weight)
outside deterministic mode; in deterministic mode every call runs the kernel, on BT = 64 tiles.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv41_kernels.group_gemm import fp8_group_linear
from dsv41_kernels.triton_numerics import DOT_DTYPE, INTERPRET, bf16_bits, e4m3_value, e8m0_value
from sglang_dsv41.determinism import deterministic

DECODE_ROWS = 64
"""Up to this many rows (decode) a call runs the kernel in fast mode; more rows (prefill) run the twin."""

_HW_E4M3 = tl.constexpr(not INTERPRET)  # the interpreter decodes E4M3 NaN as 480: software decode there


@triton.jit
def _weights(w_ptr, s_ptr, kb, n_ok):
    """fp32 [BN, 32] of K block kb: E4M3 bytes at w_ptr [BN, 32] + 32 kb times the UE8M0 scales at s_ptr
    [BN] + kb (exact products)."""
    q = tl.load(w_ptr + kb * 32, mask=n_ok[:, None], other=0)
    if _HW_E4M3:
        v = q.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    else:
        v = e4m3_value(q)
    return v * e8m0_value(tl.load(s_ptr + kb, mask=n_ok, other=127))[:, None]


@triton.jit
def _group_gemm_kernel(x_ptr, x_ts, x_gs, w_ptr, s_ptr, s_rs, out_ptr, o_ts, o_gs, T, N, K,
                       BT: tl.constexpr, BN: tl.constexpr, SUB: tl.constexpr):
    """x bf16 [T, G, K] (strides x_ts, x_gs, 1), w uint8 [G*N, K] (E4M3 bytes, row stride K), s uint8
    [ceil(G*N/32), s_rs] (UE8M0), out int16 [T, G, N] (bf16 bits; strides o_ts, o_gs, 1); K % (32 SUB) == 0."""
    g = tl.program_id(0)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rt = tl.program_id(2) * BT + tl.arange(0, BT)
    n_ok, t_ok = rn < N, rt < T
    row = g.to(tl.int64) * N + rn
    c = tl.arange(0, 32)
    w_row = w_ptr + row[:, None] * K + c[None, :]
    s_row = s_ptr + (row // 32) * s_rs
    x_row = x_ptr + rt.to(tl.int64)[:, None] * x_ts + g * x_gs + c[None, :]
    acc = tl.zeros([BN, BT], dtype=tl.float32)
    for kb0 in range(0, K // 32, SUB):
        for i in tl.static_range(SUB):
            kb = kb0 + i
            w = _weights(w_row, s_row, kb, n_ok).to(DOT_DTYPE)
            x = tl.load(x_row + kb * 32, mask=t_ok[:, None], other=0.0).to(DOT_DTYPE)
            acc = tl.dot(w, tl.trans(x), acc)
    out = tl.trans(acc)  # [BT, BN]
    dst = out_ptr + rt.to(tl.int64)[:, None] * o_ts + g * o_gs + rn[None, :]
    tl.store(dst, bf16_bits(out), mask=t_ok[:, None] & n_ok[None, :])


def pick_config(t: int) -> tuple[int, int, int, int, int]:
    """(BT, BN, SUB, num_warps, num_stages): activation rows per program (the MMA's N side: 16 / 32 / 64 by
    the call's rows; 64 in deterministic mode, any T), weight rows per program, K blocks per iteration."""
    bt = 64 if deterministic() else max(16, min(64, triton.next_power_of_2(max(t, 1))))
    return bt, 64, 4, 4, 4


@fp8_group_linear.triton_impl
def fp8_group_linear_triton(x, w, w_scale, block: int = 32, config: tuple | None = None):
    """Same contract as the twin for bf16 x [T, G, K] with K % 32 == 0 and 32 x 32 weight tiles; other
    inputs, calls that need autograd and (outside deterministic mode) calls of more than DECODE_ROWS rows
    run the twin. `config`: a `pick_config` tuple (tests, benchmarks; K % (32 SUB) == 0)."""
    grad = torch.is_grad_enabled() and x.requires_grad
    t, g, k = x.shape if x.dim() == 3 else (0, 0, 0)
    if (grad or x.dim() != 3 or x.dtype != torch.bfloat16 or block != 32 or k % 32 or w.shape[1] != k
            or w.shape[0] % max(g, 1) or (t > DECODE_ROWS and config is None and not deterministic())):
        return fp8_group_linear.torch(x, w, w_scale, block)
    n = w.shape[0] // g
    out = torch.empty(t, g, n, dtype=torch.bfloat16, device=x.device)
    if t == 0 or n == 0:
        return out
    bt, bn, sub, warps, stages = config or pick_config(t)
    while (k // 32) % sub:
        sub //= 2
    x = x if x.stride(-1) == 1 else x.contiguous()
    w8 = w.view(torch.uint8)
    s8 = w_scale.view(torch.uint8)
    assert w8.stride() == (k, 1) and s8.stride(-1) == 1, (w8.stride(), s8.stride())
    _group_gemm_kernel[(g, triton.cdiv(n, bn), triton.cdiv(t, bt))](
        x, x.stride(0), x.stride(1), w8, s8, s8.stride(0), out.view(torch.int16), out.stride(0), out.stride(1),
        t, n, k, BT=bt, BN=bn, SUB=sub, num_warps=warps, num_stages=stages)
    return out


__all__ = ["DECODE_ROWS", "fp8_group_linear_triton", "pick_config"]
