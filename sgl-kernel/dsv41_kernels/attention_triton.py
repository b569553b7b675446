"""Triton sparse attention straight from the paged pools (one query row per program).

Calls of >= attention_prefill.ROWS query rows (prefill; outside deterministic mode and graph captures)
run attention_prefill's library-GEMM path instead; decode and deterministic mode run the kernel below.

Program = (query row t, block of HB heads, split of the key list). Keys of a row are its W window
slots (FP8 pool, 528 B at D = 512) followed by its K compressed slots (FP4 pool, 288 B), visited
64 at a time (window blocks first, then compressed blocks; -1 slots are masked). Every key is
dequantized in registers to bf16 (exact) in "pair-split" form: even and odd elements separately,
because one FP4 byte holds one (even, odd) pair; q . k = q_even . k_even + q_odd . k_odd and the
output is accumulated as two halves, interleaved at the store. Online softmax as the twin: running
max from -1e30, bf16 probabilities (relative to the running max) into P.V, fp32 denominator, the
per-head sink added once at the end. With SPLITS > 1 each split writes (acc, max, denom) partials
and `_combine_kernel` merges them (flash-decoding); rows with no valid key give zeros.

Float output: compared with the twin under the bf16 attention tolerance (exp and the MMA
accumulation order differ; the block order is the twin's when W is a multiple of 64).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv41_kernels.attention import sparse_attention_paged
from dsv41_kernels.attention_prefill import attention_bf16, prefill_rows
from dsv41_kernels.attention_tiles import fp4_tile, window_tile
from dsv41_kernels.triton_numerics import DOT_DTYPE, INTERPRET, bf16_round
from sglang_dsv41.determinism import deterministic

BLOCK = 64


@triton.jit
def _attn_kernel(
    q_ptr, q_st, q_sh, w16_ptr, w8_ptr, w_rs, ws_ptr, ws_st, c_ptr, c_rs, cs_ptr, cs_st, sink_ptr, scale,
    out_ptr, po_ptr, pm_ptr, W, K, H,
    NP: tl.constexpr, HB: tl.constexpr, SPLITS: tl.constexpr, FAST: tl.constexpr, DOT_T: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    hb = tl.program_id(1)
    sp = tl.program_id(2)
    heads = hb * HB + tl.arange(0, HB)
    hm = heads < H
    pair = tl.arange(0, NP)
    q_row = q_ptr + t * q_st + heads[:, None] * q_sh + 2 * pair[None, :]
    q0 = tl.load(q_row, mask=hm[:, None], other=0.0).to(DOT_T)
    q1 = tl.load(q_row + 1, mask=hm[:, None], other=0.0).to(DOT_T)
    acc0 = tl.zeros([HB, NP], dtype=tl.float32)
    acc1 = tl.zeros([HB, NP], dtype=tl.float32)
    m = tl.full([HB], -1e30, dtype=tl.float32)
    den = tl.zeros([HB], dtype=tl.float32)
    nwb = tl.cdiv(W, 64)
    nblk = nwb + tl.cdiv(K, 64)
    per = tl.cdiv(nblk, SPLITS)
    # this split's share of the block list [window blocks | compressed blocks]
    for vb in range(sp * per, tl.minimum(nblk, sp * per + per)):
        if vb < nwb:
            j = vb * 64 + tl.arange(0, 64)
            slots = tl.load(ws_ptr + t * ws_st + j, mask=j < W, other=-1).to(tl.int64)
            valid = slots >= 0
            k0, k1 = window_tile(w16_ptr, w8_ptr, w_rs, slots, valid, NP, FAST, DOT_T)
        else:
            j = (vb - nwb) * 64 + tl.arange(0, 64)
            slots = tl.load(cs_ptr + t * cs_st + j, mask=j < K, other=-1).to(tl.int64)
            valid = slots >= 0
            k0, k1 = fp4_tile(c_ptr, c_rs, slots, valid, NP, FAST, DOT_T)
        s = tl.dot(q0, tl.trans(k0))
        s = tl.dot(q1, tl.trans(k1), s)  # [HB, 64]
        s = tl.where(valid[None, :], s, float("-inf")) * scale
        m_new = tl.maximum(m, tl.max(s, 1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        den = den * alpha + tl.sum(p, 1)
        pb = bf16_round(p).to(DOT_T)
        acc0 = tl.dot(pb, k0, acc0 * alpha[:, None])
        acc1 = tl.dot(pb, k1, acc1 * alpha[:, None])
        m = m_new
    if SPLITS == 1:
        den = den + tl.exp(tl.load(sink_ptr + heads, mask=hm, other=0.0) - m)
        o_row = out_ptr + t * q_st + heads[:, None] * q_sh + 2 * pair[None, :]
        tl.store(o_row, bf16_round(acc0 / den[:, None]).to(tl.bfloat16), mask=hm[:, None])
        tl.store(o_row + 1, bf16_round(acc1 / den[:, None]).to(tl.bfloat16), mask=hm[:, None])
    else:  # partials: po [T, SPLITS, H, 2, NP] fp32, pm [T, SPLITS, H, 2] (max, denom)
        base = (t * SPLITS + sp) * H + heads
        po = po_ptr + base[:, None] * (2 * NP) + pair[None, :]
        tl.store(po, acc0, mask=hm[:, None])
        tl.store(po + NP, acc1, mask=hm[:, None])
        tl.store(pm_ptr + base * 2, m, mask=hm)
        tl.store(pm_ptr + base * 2 + 1, den, mask=hm)


@triton.jit
def _combine_kernel(po_ptr, pm_ptr, sink_ptr, out_ptr, o_st, o_sh, H, NP: tl.constexpr, SPLITS: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    sp = tl.arange(0, SPLITS)
    base = (t * SPLITS + sp) * H + h
    m = tl.load(pm_ptr + base * 2)
    den = tl.load(pm_ptr + base * 2 + 1)
    mx = tl.max(m, 0)
    f = tl.exp(m - mx)
    total = tl.sum(den * f, 0) + tl.exp(tl.load(sink_ptr + h) - mx)
    pair = tl.arange(0, NP)
    po = po_ptr + base[:, None] * (2 * NP) + pair[None, :]
    o0 = tl.sum(tl.load(po) * f[:, None], 0) / total
    o1 = tl.sum(tl.load(po + NP) * f[:, None], 0) / total
    o = out_ptr + t * o_st + h * o_sh + 2 * pair
    tl.store(o, bf16_round(o0).to(tl.bfloat16))
    tl.store(o + 1, bf16_round(o1).to(tl.bfloat16))


def _config(t: int, h: int) -> tuple[int, int, int]:
    """(heads per program, splits, warps); H200 timings (benchmark/results): 32 heads x 8 warps;
    key splits only while the grid is far smaller than the 132 SMs."""
    hb = 32 if h > 16 else 16
    programs = t * triton.cdiv(h, hb)
    splits = 1 if programs >= 64 or deterministic() else (2 if programs >= 16 else 4)  # splits: batch-variant order
    return hb, splits, 8


@sparse_attention_paged.triton_impl
def sparse_attention_paged_triton(q, window_pool, window_slots, comp_pool, comp_slots, sink, scale, chunk: int = 64,
                                  config: tuple[int, int, int] | None = None):
    t, h, d = q.shape
    np_ = d // 2
    assert np_ & (np_ - 1) == 0 and d % 32 == 0, "head dim must be a power of two >= 32"
    assert window_pool.dtype == torch.uint8 and window_pool.size(1) == d + d // 32 and window_pool.stride(1) == 1
    out = torch.empty(t, h, d, dtype=torch.bfloat16, device=q.device)
    if t == 0:
        return out
    q = q if q.stride(2) == 1 else q.contiguous()
    if q.stride(0) != h * d or q.stride(1) != d:
        q = q.contiguous()
    window_slots = window_slots.contiguous()
    kk = 0 if comp_slots is None else comp_slots.size(1)
    if kk:
        assert comp_pool.dtype == torch.uint8 and comp_pool.size(1) == d // 2 + d // 16 and comp_pool.stride(1) == 1
        comp_slots = comp_slots.contiguous()
    else:
        comp_pool, comp_slots = window_pool, window_slots  # never read
    if config is None and prefill_rows(t, q.device):  # prefill: library bf16 GEMMs (attention_prefill)
        return attention_bf16(q, window_pool, window_slots, comp_pool if kk else None, comp_slots if kk else None,
                              sink, scale)
    hb, splits, warps = config or _config(t, h)
    w16 = window_pool.view(torch.int16)
    sink = sink.float().contiguous()
    if splits > 1:
        po = torch.empty(t, splits, h, 2, np_, dtype=torch.float32, device=q.device)
        pm = torch.empty(t, splits, h, 2, dtype=torch.float32, device=q.device)
    else:
        po = pm = out
    grid = (t, triton.cdiv(h, hb), splits)
    _attn_kernel[grid](
        q, q.stride(0), q.stride(1), w16, window_pool, window_pool.stride(0), window_slots, window_slots.stride(0),
        comp_pool, comp_pool.stride(0), comp_slots, comp_slots.stride(0), sink, float(scale),
        out, po, pm, window_slots.size(1), kk, h,
        NP=np_, HB=hb, SPLITS=splits, FAST=not INTERPRET, DOT_T=DOT_DTYPE, num_warps=warps,
    )
    if splits > 1:
        _combine_kernel[(t, h)](po, pm, sink, out, out.stride(0), out.stride(1), h, NP=np_, SPLITS=splits, num_warps=4)
    return out
