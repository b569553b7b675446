"""Triton sparse attention from the paged pools: keys gathered once per row as exact bf16, then a
flash-decoding kernel over them (decode, and every call in deterministic mode or inside a graph capture).

Calls of >= attention_prefill.ROWS query rows (prefill; outside deterministic mode and graph captures)
run attention_prefill's library-GEMM path instead. Here, per chunk of rows (CHUNK_BYTES of keys):
  keys = gather_keys(pools, slots)        bf16 [C, W + K, D]: the W window keys then the K compressed keys
                                          of each row (attention_prefill, the tile decoders of attention_tiles;
                                          -1 slots give zero keys)
  out  = _attn_kernel(q, keys, slots)     bf16 [C, H, D]
Program = (query row t, block of HB heads, split sp of the key blocks). The row's keys are visited KB at
a time in the order of the twin (`sglang_dsv41.shared_math.attend_gathered`, which visits them 64 at a time): running
max from RUN_MAX_START, bf16 probabilities relative to the running max into P.V, fp32 denominator, the
per-head sink added once at the end; keys of -1 slots are masked. With SPLITS > 1 each split writes
(acc, max, denom) partials that `_combine_kernel` merges (flash-decoding); rows with no valid key give
zeros. The loop only moves bf16 tiles from memory into shared memory (asynchronous copies, pipelined)
and into the tensor cores.

Why two passes (H200, benchmark/results/2026-12-02-h200-attention-decode.md): a one-pass kernel that
dequantized each key tile in registers next to its [heads, D] fp32 accumulator either spilled (64 heads
x D = 512) or dequantized every key once per head block, and ran 1.4-2.4x slower than gather + kernel.

Float output: compared with the twin under the bf16 attention tolerance (the exp and the MMA accumulation
order differ; KB = 64 without splits visits the twin's blocks).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv41_kernels.attention import sparse_attention_paged
from dsv41_kernels.attention_prefill import CHUNK_BYTES, attention_bf16, gather_keys, prefill_rows
from dsv41_kernels.triton_numerics import DOT_DTYPE, bf16_round
from sglang_dsv41.shared_math import RUN_MAX_START
from sglang_dsv41.determinism import deterministic

@triton.jit
def _attn_kernel(
    q_ptr, q_st, q_sh, k_ptr, ws_ptr, ws_st, cs_ptr, cs_st, sink_ptr, scale, out_ptr, po_ptr, pm_ptr, W, K, H,
    run_max_start, D: tl.constexpr, HB: tl.constexpr, SPLITS: tl.constexpr, KB: tl.constexpr,
    STAGES: tl.constexpr, DOT_T: tl.constexpr,
):
    """q bf16 [T, H, D] (rows q_st, heads q_sh, elements contiguous); keys bf16 [T, W + K, D] contiguous;
    slots int64 [T, W] / [T, K] (only their sign is read: -1 masks the key)."""
    t = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * HB + tl.arange(0, HB)
    sp = tl.program_id(2)
    hm = heads < H
    d = tl.arange(0, D)
    q = tl.load(q_ptr + t * q_st + heads[:, None] * q_sh + d[None, :], mask=hm[:, None], other=0.0).to(DOT_T)
    acc = tl.zeros([HB, D], dtype=tl.float32)
    m = tl.full([HB], run_max_start, dtype=tl.float32)
    den = tl.zeros([HB], dtype=tl.float32)
    n = W + K
    per = tl.cdiv(tl.cdiv(n, KB), SPLITS)
    lo = sp * per
    hi = tl.minimum(tl.cdiv(n, KB), lo + per)
    row = k_ptr + t * n * D
    for b in tl.range(lo, hi, num_stages=STAGES):
        j = b * KB + tl.arange(0, KB)
        k = tl.load(row + j[:, None].to(tl.int64) * D + d[None, :], mask=(j < n)[:, None], other=0.0).to(DOT_T)
        sw = tl.load(ws_ptr + t * ws_st + j, mask=j < W, other=-1)
        sc = tl.load(cs_ptr + t * cs_st + (j - W), mask=(j >= W) & (j < n), other=-1)
        valid = tl.where(j < W, sw, sc) >= 0
        s = tl.dot(q, tl.trans(k))  # [HB, KB]
        s = tl.where(valid[None, :], s, float("-inf")) * scale
        m_new = tl.maximum(m, tl.max(s, 1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        den = den * alpha + tl.sum(p, 1)
        acc = tl.dot(bf16_round(p).to(DOT_T), k, acc * alpha[:, None])
        m = m_new
    if SPLITS == 1:
        den = den + tl.exp(tl.load(sink_ptr + heads, mask=hm, other=0.0) - m)
        o = out_ptr + t * q_st + heads[:, None] * q_sh + d[None, :]
        tl.store(o, bf16_round(acc / den[:, None]).to(tl.bfloat16), mask=hm[:, None])
    else:  # partials: po [T, SPLITS, H, D] fp32 (element order), pm [T, SPLITS, H, 2] (max, denom)
        base = (t * SPLITS + sp) * H + heads
        tl.store(po_ptr + base[:, None] * D + d[None, :], acc, mask=hm[:, None])
        tl.store(pm_ptr + base * 2, m, mask=hm)
        tl.store(pm_ptr + base * 2 + 1, den, mask=hm)


@triton.jit
def _combine_kernel(po_ptr, pm_ptr, sink_ptr, out_ptr, o_st, o_sh, H, D: tl.constexpr, SPLITS: tl.constexpr):
    """Program (row t, head h): merges the SPLITS partials po fp32 [T, SPLITS, H, D], pm fp32 [T, SPLITS, H, 2]
    -> out[t, h, :] bf16."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    sp = tl.arange(0, SPLITS)
    base = (t * SPLITS + sp) * H + h
    m = tl.load(pm_ptr + base * 2)
    den = tl.load(pm_ptr + base * 2 + 1)
    mx = tl.max(m, 0)
    f = tl.exp(m - mx)
    total = tl.sum(den * f, 0) + tl.exp(tl.load(sink_ptr + h) - mx)
    d = tl.arange(0, D)
    acc = tl.sum(tl.load(po_ptr + base[:, None] * D + d[None, :]) * f[:, None], 0)
    tl.store(out_ptr + t * o_st + h * o_sh + d, bf16_round(acc / total).to(tl.bfloat16))


def _config(t: int, h: int) -> tuple[int, int, int, int, int]:
    """(heads per program, key splits, warps, pipeline stages, keys per block). H200 sweep at 64 heads
    (benchmark/results/2026-12-02-h200-attention-decode.md): 32 heads x 8 warps, 2 stages, key splits until
    the grid has about one program per SM (16 splits of 32-key blocks at 1 row, 8 at 8 rows); from one
    program per SM without splits (64 rows), 64 heads per program, 2 splits, 3 stages of 32 keys (timed at 64
    rows only). Deterministic mode never splits (a split's order would depend on the batch)."""
    hb = 32 if h > 16 else 16
    programs = t * triton.cdiv(h, hb)
    if deterministic():
        return hb, 1, 8, 2, 64
    if programs >= 128 and h >= 64:
        return 64, 2, 8, 3, 32
    splits = 1
    while splits < 16 and programs * splits < 128:
        splits *= 2
    return hb, splits, 8, 2, 32 if splits >= 16 else 64


def _attend(q, keys, window_slots, comp_slots, sink, scale, out, config) -> None:
    """One chunk: q bf16 [C, H, D] contiguous, keys bf16 [C, W + K, D] -> out bf16 [C, H, D] (written)."""
    t, h, d = q.shape
    hb, splits, warps, stages, kb = config
    kk = keys.size(1) - window_slots.size(1)
    cs = comp_slots if kk else window_slots  # never read without compressed keys
    if splits > 1:
        po = torch.empty(t, splits, h, d, dtype=torch.float32, device=q.device)
        pm = torch.empty(t, splits, h, 2, dtype=torch.float32, device=q.device)
    else:
        po = pm = out
    _attn_kernel[(t, triton.cdiv(h, hb), splits)](
        q, q.stride(0), q.stride(1), keys, window_slots, window_slots.stride(0), cs, cs.stride(0), sink, float(scale),
        out, po, pm, window_slots.size(1), kk, h, RUN_MAX_START,
        D=d, HB=hb, SPLITS=splits, KB=kb, STAGES=stages, DOT_T=DOT_DTYPE, num_warps=warps)
    if splits > 1:
        _combine_kernel[(t, h)](po, pm, sink, out, out.stride(0), out.stride(1), h, D=d, SPLITS=splits, num_warps=4)


@sparse_attention_paged.triton_impl
def sparse_attention_paged_triton(q, window_pool, window_slots, comp_pool, comp_slots, sink, scale, chunk: int = 64,
                                  config: tuple[int, ...] | None = None):
    """config: (heads per program, splits (a power of two), warps[, stages = 2[, keys per block = 64]]);
    given, the kernel runs at any size (no library prefill path)."""
    t, h, d = q.shape
    assert d & (d - 1) == 0 and d >= 32, "head dim must be a power of two >= 32"
    assert window_pool.dtype == torch.uint8 and window_pool.size(1) == d + d // 32 and window_pool.stride(1) == 1
    out = torch.empty(t, h, d, dtype=torch.bfloat16, device=q.device)
    if t == 0:
        return out
    q = q.contiguous()
    window_slots = window_slots.contiguous()
    kk = 0 if comp_slots is None else comp_slots.size(1)
    if kk:
        assert comp_pool.dtype == torch.uint8 and comp_pool.size(1) == d // 2 + d // 16 and comp_pool.stride(1) == 1
        comp_slots = comp_slots.contiguous()
    else:
        comp_pool = comp_slots = None
    if config is None and prefill_rows(t, q.device):  # prefill: library bf16 GEMMs (attention_prefill)
        return attention_bf16(q, window_pool, window_slots, comp_pool, comp_slots, sink, scale)
    cfg = (tuple(config) + (2, 64)[len(config) - 3:]) if config else _config(t, h)
    sink = sink.float().contiguous()
    n_keys = window_slots.size(1) + kk
    step = max(1, CHUNK_BYTES // max(1, n_keys * d * 2))
    for lo in range(0, t, step):
        hi = min(t, lo + step)
        cs = comp_slots[lo:hi] if kk else None
        keys = gather_keys(window_pool, window_slots[lo:hi], comp_pool, cs)
        _attend(q[lo:hi], keys, window_slots[lo:hi], cs, sink, scale, out[lo:hi], cfg)
    return out
