"""Triton indexer kernels: FP4 query quantization and paged scores from the FP4 index-key pool.

index_query_quant: one program per (token, head) row: RoPE on the last rd dims, stage 1 (UE8M0 fake
quant per 32), stage 2 (the 68-byte packer's codes and scale), dequantized back to bf16. Bitwise.

index_scores: one program per (row t, block of BLOCK_N positions). Keys are gathered straight from
the pool (68 B = 64 B of E2M1 nibbles + 4 UE8M0 bytes at di = 128) and dequantized in registers to
bf16 (exact: E2M1 x 2^k), split into even / odd elements so that one packed byte feeds one element
of each; logits = k_even . q_even + k_odd . q_odd on the tensor cores (fp32 accumulation; exact for
FP4-grid operands unless the group scales of one dot span more than ~2^9). Then the twin's roundings:
bf16(logit), relu, bf16(relu * w_h), fp32 sum over heads, bf16. Equal to the twin bit for bit
whenever the dot products are exact in fp32 (always in practice; tests compare bitwise).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv41_kernels.indexer import index_query_quant, index_scores
from dsv41_kernels.triton_numerics import (
    DOT_DTYPE,
    NO_FMA,
    bf16_round,
    e2m1_value,
    e8m0_value,
    exponent_byte,
    fp4_stage1,
    fp4_stage2,
    load_pairs,
    next_pow2,
    rope_tail,
)


@triton.jit
def _index_query_quant_kernel(
    q_ptr, q_st, q_sh, cos_ptr, sin_ptr, cs_rs, out_ptr, HI: tl.constexpr,
    D: tl.constexpr, RP: tl.constexpr, G: tl.constexpr,
):
    row = tl.program_id(0)
    t = row // HI
    h = row % HI
    NP: tl.constexpr = D // 2
    pair, x0, x1 = load_pairs(q_ptr + t.to(tl.int64) * q_st + h * q_sh, G, 16, NP)
    x0, x1 = rope_tail(x0, x1, pair, cos_ptr + t * cs_rs, sin_ptr + t * cs_rs, NP, RP)
    x0, x1 = fp4_stage1(x0, x1)
    c0, c1, scale = fp4_stage2(x0, x1)
    s = e8m0_value(exponent_byte(scale))
    y0 = bf16_round(e2m1_value(c0) * s)
    y1 = bf16_round(e2m1_value(c1) * s)
    dst = out_ptr + row.to(tl.int64) * D
    ok = pair < NP
    tl.store(dst + 2 * pair, y0.to(tl.bfloat16), mask=ok)
    tl.store(dst + 2 * pair + 1, y1.to(tl.bfloat16), mask=ok)


@index_query_quant.triton_impl
def index_query_quant_triton(q, cos, sin):
    t, hi, d = q.shape
    assert d % 32 == 0 and cos.shape == sin.shape and cos.size(0) == t and 2 * cos.size(1) <= d
    out = torch.empty(t, hi, d, dtype=torch.bfloat16, device=q.device)
    if t * hi == 0:
        return out
    if q.stride(2) != 1:
        q = q.contiguous()
    cos, sin = cos.contiguous(), sin.contiguous()
    _index_query_quant_kernel[(t * hi,)](
        q, q.stride(0), q.stride(1), cos, sin, cos.stride(0), out, HI=hi,
        D=d, RP=cos.size(1), G=next_pow2(d // 32), num_warps=1, **NO_FMA,
    )
    return out


@triton.jit
def _index_scores_kernel(
    q_ptr, q_st, q_sh, w_ptr, w_st, pool_ptr, pool_rs, slot_ptr, slot_st, out_ptr, out_st, n,
    H: tl.constexpr, HP: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, DOT_T: tl.constexpr,
):
    t = tl.program_id(1).to(tl.int64)
    offs = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    slots = tl.load(slot_ptr + t * slot_st + offs, mask=offs < n, other=-1).to(tl.int64)
    valid = slots >= 0
    NB: tl.constexpr = D // 2  # packed bytes per key
    col = tl.arange(0, NB)[None, :]
    row_ptr = pool_ptr + slots[:, None] * pool_rs
    kb = tl.load(row_ptr + col, mask=valid[:, None], other=0).to(tl.int32)  # [BLOCK_N, D/2]
    se = tl.load(row_ptr + NB + col // 16, mask=valid[:, None], other=127)  # 32-group exponent
    s = e8m0_value(se)
    k0 = (e2m1_value(kb & 15) * s).to(DOT_T)  # exact
    k1 = (e2m1_value(kb >> 4) * s).to(DOT_T)
    h = tl.arange(0, HP)
    hm = h < H
    q_row = q_ptr + t * q_st + h[None, :] * q_sh
    q0 = tl.load(q_row + 2 * tl.arange(0, NB)[:, None], mask=hm[None, :], other=0.0).to(DOT_T)  # [D/2, HP]
    q1 = tl.load(q_row + 2 * tl.arange(0, NB)[:, None] + 1, mask=hm[None, :], other=0.0).to(DOT_T)
    logits = tl.dot(k0, q0)
    logits = tl.dot(k1, q1, logits)  # [BLOCK_N, HP] fp32
    lg = bf16_round(logits)
    lg = tl.where(lg < 0.0, 0.0, lg)
    w = tl.load(w_ptr + t * w_st + h, mask=hm, other=0.0).to(tl.float32)
    sc = bf16_round(tl.sum(bf16_round(lg * w[None, :]), 1))
    sc = tl.where(valid, sc, float("-inf"))
    tl.store(out_ptr + t * out_st + offs, sc, mask=offs < n)


@index_scores.triton_impl
def index_scores_triton(q, w, pool, slot_table, chunk: int = 64, block_n: int = 128, num_warps: int = 4):
    t, hi, d = q.shape
    n = slot_table.size(1)
    assert pool.dtype == torch.uint8 and pool.size(1) == d // 2 + d // 32 and d % 32 == 0 and d >= 32
    assert q.dtype == torch.bfloat16 and w.shape == (t, hi) and slot_table.size(0) == t
    out = torch.empty(t, n, dtype=torch.float32, device=q.device)
    if t == 0 or n == 0:
        return out
    if q.stride(2) != 1:
        q = q.contiguous()
    slot_table = slot_table if slot_table.stride(1) == 1 else slot_table.contiguous()
    w = w if w.stride(1) == 1 else w.contiguous()
    grid = (triton.cdiv(n, block_n), t)
    _index_scores_kernel[grid](
        q, q.stride(0), q.stride(1), w, w.stride(0), pool, pool.stride(0), slot_table, slot_table.stride(0),
        out, out.stride(0), n, H=hi, HP=max(16, next_pow2(hi)), D=d, BLOCK_N=block_n, DOT_T=DOT_DTYPE, num_warps=num_warps, **NO_FMA,
    )
    return out
