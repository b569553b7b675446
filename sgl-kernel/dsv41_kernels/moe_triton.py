"""Triton grouped W4A8 MoE for Hopper: one launch for w1 + w3, one for w2, over every expert.

Host side (device ops only, no synchronisation, fixed shapes for a given T, k, E; up to ROUTING_ROWS
pairs the routing tables below come from one launch, `moe_routing_triton`):
  pairs r = t*k + j (token t's j-th smallest expert id) are sorted by expert (stable), p = sorted
  position; tiles of BM sorted rows never straddle two experts; tile i -> (expert, first p, end p),
  at most min(R, cdiv(R, BM) + E) tiles (idle tiles exit at once).
  x is MXFP8-quantized once per token (`mxfp8_quant_t`, bitwise `mxfp8_quant`): every pair of a token
  reads the same bytes the per-expert path would compute, each 32-block stored in K_EVENS_FIRST order
  (gemm_triton): both operands of every K = 32 MMA come in that order, so a weight tile reaches the MMA
  with one 32-bit shared load per row and no byte permutes (the same 32 products per block).
Kernel 1 (`_moe_gemm_kernel`, STAGE1): rows p gather their token's MXFP8 row; one fp8 MMA per 32-wide
  K block over a weight tile of BN rows of w1 stacked on the same BN rows of w3 (E2M1 nibbles -> E4M3
  bytes of value * 2**-6 in registers, the 2**6 put back in the activation scale,
  `gemm_triton.e2m1_block_e4m3_evens_first`; 4 K blocks' weights per load in the decode configs, `_fp4_tiles4`),
  block partial * (scale_x * scale_w) accumulated in K order as in gemm_triton; epilogue: bf16 rounding
  of g and u, SwiGLU with the clamp, routing weight, bf16 rounding of h, then h's MXFP8 quant (per 32
  columns, bitwise `mxfp8_quant` of that h, blocks in K_EVENS_FIRST order) stored at row p with transposed
  scales.
Kernel 2 (STAGE1 = False): rows p read h's bytes directly; one fp8 MMA per block against w2; the bf16
  result goes to output row r = perm[p].
Tiles: [BM pairs x BN weight rows]. SWAP (decode, `pick_config`) makes the weight rows the MMA's M
  side and the BM = 16 pairs its N side, so that a tile of a few pairs does not pay for 64 padded rows
  in the MMA, the scale multiply and the address math; the products and the K-order adds are the same.
K split (fast mode only, decode; `split_counts`): grid axis 2 cuts K into runs of whole SUB blocks, each
program writes its fp32 K-order sum, and the last of a tile's runs to finish adds them in order before
the same epilogue (arrival counters zeroed by the x quant launch). Deterministic mode never splits, so there a row's bits do not depend on its call.
Numerics against the twin: the fp8 tensor-core partials (tolerance of gemm_triton), and silu from
Triton's exp; nothing depends on which other rows share a tile (batch invariant for a fixed config).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv41_kernels.gemm_triton import (E2M1_UNSHIFT, _sm_count, e2m1_block_e4m3_evens_first, evens_first_position,
                                       mxfp8_quant_t)
from dsv41_kernels.moe import moe_combine, moe_experts
from dsv41_kernels.moe_prefill import bf16_prefill, moe_experts_bf16, sorted_pairs
from dsv41_kernels.moe_routing_triton import ROUTING_ROWS, routing_tiles_fused
from dsv41_kernels.triton_numerics import bf16_round, e4m3_byte, e8m0_value, max_nan, ue8m0_ceil
from sglang_dsv41.determinism import deterministic


@triton.jit
def _fp4_tile(w_row, kb, n_ok):
    """Packed E2M1 [BN, 16] of K block kb (w_row: [BN] row pointers) -> float8e4nv [BN, 32] in K_EVENS_FIRST
    order, values x 2**-6 (`e2m1_block_e4m3_evens_first`)."""
    return e2m1_block_e4m3_evens_first(tl.load(w_row[:, None] + kb * 16 + tl.arange(0, 16)[None, :],
                                               mask=n_ok[:, None], other=0))


@triton.jit
def _fp4_tiles4(w_row, kb0, n_ok, WR: tl.constexpr):
    """The packed E2M1 of K blocks kb0 .. kb0+3 as one [WR, 64] load (64 contiguous bytes per row: whole
    sectors, where four [WR, 16] loads each use half of every sector they touch), split in registers into
    the four blocks' [WR, 16] tiles."""
    w4 = tl.load(w_row[:, None] + kb0 * 16 + tl.arange(0, 64)[None, :], mask=n_ok[:, None], other=0)
    t = tl.permute(tl.reshape(w4, [WR, 2, 2, 16]), (0, 3, 1, 2))  # [row, byte, kb0 + 2h + l] as [.., h, l]
    lo, hi = tl.split(t)  # l = 0: blocks 0, 2; l = 1: blocks 1, 3 ([WR, 16, 2] over h)
    b0, b2 = tl.split(lo)
    b1, b3 = tl.split(hi)
    return b0, b1, b2, b3


@triton.jit
def _block_fma(a, b, sa, sw, acc, SWAP: tl.constexpr):
    """acc + (fp8 partial of one K block) * (sa * sw): a [BM, 32] rows, b [BN, 32] weight rows, sa [BM],
    sw [BN]. SWAP: the weight rows are the MMA's M side (acc [BN, BM]; a decode tile of a few rows
    then fills the narrow N side instead of 64 mostly empty M rows)."""
    if SWAP:
        out = tl.fma(tl.dot(b, tl.trans(a)), sw[:, None] * sa[None, :], acc)
    else:
        out = tl.fma(tl.dot(a, tl.trans(b)), sa[:, None] * sw[None, :], acc)
    return out


@triton.jit
def _scale_word(s_row, kb, ok, KB):
    """The UE8M0 scale bytes of K blocks kb .. kb+3 of rows s_row as one int32 per row (little endian:
    block kb + i in bits 8i..8i+7); kb % 4 == 0 and 4-byte aligned rows. Past the last block, or where
    not ok, 0x7F7F7F7F (scale 1)."""
    word = (s_row + kb).to(tl.pointer_type(tl.int32))
    return tl.load(word, mask=ok & (kb < KB), other=0x7F7F7F7F)


@triton.jit
def _tile(a_ptr, perm_ptr, tile_p_ptr, tile_end_ptr, e, t, pid_n, w_ptr, v_ptr, w_es, w_rs, sw_ptr, sv_ptr, sw_es,
          sw_rs, N, K, TOPK, STAGE1: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """Rows and operand pointers of tile t (expert e) x weight-row tile pid_n: (rp, m_ok, r, arow, j, rn, n_ok,
    a_row, w_row, sw_row); w_row / sw_row: [WR] row pointers, rows j >= BN are v's (STAGE1), see `_moe_gemm_kernel`."""
    p0 = tl.load(tile_p_ptr + t)
    p_end = tl.load(tile_end_ptr + t)
    rp = p0 + tl.arange(0, BM)
    m_ok = rp < p_end
    r = tl.load(perm_ptr + rp, mask=m_ok, other=0)
    if STAGE1:
        arow = r // TOPK
    else:
        arow = rp
    WR: tl.constexpr = 2 * BN if STAGE1 else BN
    j = tl.arange(0, WR)
    rn = pid_n * BN + j % BN
    n_ok = rn < N
    w_base = tl.where(j < BN, w_ptr, v_ptr)  # STAGE1 rows j >= BN: the same weight rows of v (w3)
    s_base = tl.where(j < BN, sw_ptr, sv_ptr)
    a_row = a_ptr + arow.to(tl.int64)[:, None] * K + tl.arange(0, 32)[None, :]
    w_row = w_base + e.to(tl.int64) * w_es + rn.to(tl.int64) * w_rs  # [WR] row pointers
    sw_row = s_base + e.to(tl.int64) * sw_es + rn.to(tl.int64) * sw_rs
    return rp, m_ok, r, arow, j, rn, n_ok, a_row, w_row, sw_row


@triton.jit
def _k_sum(a_row, sa_ptr, sa_rs, arow, m_ok, w_row, sw_row, n_ok, k_lo, k_hi, KB, WR: tl.constexpr,
           BM: tl.constexpr, SUB: tl.constexpr, SWAP: tl.constexpr, PACKED: tl.constexpr):
    """fp32 [BM, WR]: the scaled block partials of K blocks [k_lo, k_hi) (whole SUB groups) added in K order
    from +0, one MMA of [WR, 32] weight rows per block (`_block_fma`). PACKED (SUB == 4): an iteration's four
    weight tiles come from one load (`_fp4_tiles4`) and its weight scales from one word per row."""
    if SWAP:
        acc = tl.zeros([WR, BM], dtype=tl.float32)
    else:
        acc = tl.zeros([BM, WR], dtype=tl.float32)
    if PACKED:  # the 4 weight-scale bytes of an iteration as one word per row, loaded an iteration ahead
        wsc = _scale_word(sw_row, k_lo, n_ok, KB)
    for kb0 in range(k_lo, k_hi, SUB):
        if PACKED:
            nwsc = _scale_word(sw_row, kb0 + 4, n_ok, KB)
            b0, b1, b2, b3 = _fp4_tiles4(w_row, kb0, n_ok, WR)
        for i in tl.static_range(SUB):
            kb = kb0 + i
            a = tl.load(a_row + kb * 32, mask=m_ok[:, None], other=0.0)
            sa = tl.load(sa_ptr + kb * sa_rs + arow, mask=m_ok, other=0.0) * E2M1_UNSHIFT  # weights come x 2**-6
            if PACKED:
                sw = e8m0_value(wsc >> (8 * i))  # little endian: byte i is block kb0 + i
                if i == 0:
                    b = b0
                elif i == 1:
                    b = b1
                elif i == 2:
                    b = b2
                else:
                    b = b3
                wt = e2m1_block_e4m3_evens_first(b)
            else:
                sw = e8m0_value(tl.load(sw_row + kb, mask=n_ok, other=127))
                wt = _fp4_tile(w_row, kb, n_ok)
            acc = _block_fma(a, wt, sa, sw, acc, SWAP)
        if PACKED:
            wsc = nwsc
    if SWAP:
        acc = tl.trans(acc)  # [BM, WR]
    return acc


@triton.jit
def _epilogue(acc, r, rp, m_ok, rn, n_ok, pid_n, rw_ptr, out_ptr, os_ptr, os_rs, N, limit,
              STAGE1: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """A tile's K sums acc fp32 [BM, WR] (STAGE1: columns j < BN g, then u) -> STAGE1: `_swiglu_store`;
    else bf16 out rows r."""
    if STAGE1:
        g, u = tl.split(tl.permute(tl.reshape(acc, [BM, 2, BN]), (0, 2, 1)))  # columns j < BN: g, then u
        cn = pid_n * BN + tl.arange(0, BN)
        _swiglu_store(g, u, r, rp, m_ok, cn, cn < N, pid_n, rw_ptr, out_ptr, os_ptr, os_rs, N, limit, BM, BN)
    else:
        tl.store(out_ptr + r.to(tl.int64)[:, None] * N + rn[None, :], bf16_round(acc).to(tl.bfloat16),
                 mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _moe_gemm_kernel(
    a_ptr, sa_ptr, sa_rs, perm_ptr, tile_e_ptr, tile_p_ptr, tile_end_ptr, E,
    w_ptr, v_ptr, w_es, w_rs, sw_ptr, sv_ptr, sw_es, sw_rs, rw_ptr,
    out_ptr, os_ptr, os_rs, N, K, TOPK, limit, part_ptr, R, KSB, cnt_ptr,
    STAGE1: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, SUB: tl.constexpr, SWAP: tl.constexpr,
    PACKED: tl.constexpr, KSPLIT: tl.constexpr,
):
    """a e4m3 [rows, K] (STAGE1: tokens, row = perm[p] // TOPK; else sorted rows p), sa fp32 [K/32, sa_rs];
    w and v (w1 and w3 in STAGE1, w2 twice else) uint8 [E, N, K/2] (expert stride w_es, row stride w_rs), scales uint8
    [E, N, K/32] (sw_es, sw_rs); rw fp32 [R] routing weight of pair r. STAGE1: out uint8 [R, N] at row p,
    os fp32 [N/32, os_rs] at column p. Else: out bf16 [R, N] at row perm[p].
    Weight tile: WR = BN rows of w, and in STAGE1 below them the same BN rows of v (w1 and w3 share
    strides), so each K block is one MMA of [WR, 32] weight rows, and one accumulator holds g | u.
    SWAP changes only which operand is the MMA's M side (same products, same K-order accumulation).
    PACKED (SUB == 4, scale rows 4-byte aligned): each weight row's 4 scale bytes of an iteration are one
    32-bit load issued an iteration ahead (the loads Triton does not pipeline otherwise stall every block
    for a memory latency).
    KSPLIT (fast-mode decode, grid axis 2 = K split c): only K blocks [c * KSB, (c + 1) * KSB) (KSB % SUB == 0),
    and the fp32 sums go to part [S, R, N] (STAGE1: [S, R, 2N], g then u) at row p; the program of a tile
    that arrives last (counter cnt int32 [tiles, cdiv(N, BN)], zeroed before the launch) adds the splits
    in order and runs the epilogue (`_fold_splits`)."""
    pid_t = tl.program_id(0)
    pid_n = tl.program_id(1)
    e = tl.load(tile_e_ptr + pid_t)
    if e >= E:
        return
    rp, m_ok, r, arow, j, rn, n_ok, a_row, w_row, sw_row = _tile(
        a_ptr, perm_ptr, tile_p_ptr, tile_end_ptr, e, pid_t, pid_n, w_ptr, v_ptr, w_es, w_rs, sw_ptr, sv_ptr, sw_es,
        sw_rs, N, K, TOPK, STAGE1, BM, BN)
    WR: tl.constexpr = 2 * BN if STAGE1 else BN
    KB = K // 32
    if KSPLIT:
        k_lo = tl.program_id(2) * KSB
        k_hi = tl.minimum(k_lo + KSB, KB)
    else:
        k_lo = 0
        k_hi = KB
    acc = _k_sum(a_row, sa_ptr, sa_rs, arow, m_ok, w_row, sw_row, n_ok, k_lo, k_hi, KB, WR, BM, SUB, SWAP, PACKED)
    if KSPLIT:
        NT = 2 * N if STAGE1 else N
        col = rn + tl.where(j < BN, 0, N)  # STAGE1: u after g
        dst = part_ptr + (tl.program_id(2).to(tl.int64) * R + rp.to(tl.int64)[:, None]) * NT + col[None, :]
        tl.store(dst, acc, mask=m_ok[:, None] & n_ok[None, :])
        _fold_splits(part_ptr, cnt_ptr + pid_t * tl.num_programs(1) + pid_n, tl.num_programs(2), R, N, r, rp,
                     m_ok, pid_n, rw_ptr, out_ptr, os_ptr, os_rs, limit, STAGE1, BM, BN)
    else:
        _epilogue(acc, r, rp, m_ok, rn, n_ok, pid_n, rw_ptr, out_ptr, os_ptr, os_rs, N, limit, STAGE1, BM, BN)


@triton.jit
def _moe_stream_kernel(
    a_ptr, sa_ptr, sa_rs, perm_ptr, tile_e_ptr, tile_p_ptr, tile_end_ptr, E,
    w_ptr, v_ptr, w_es, w_rs, sw_ptr, sv_ptr, sw_es, sw_rs, rw_ptr,
    out_ptr, os_ptr, os_rs, N, K, TOPK, limit, part_ptr, MAXT, cnt_ptr,
    STAGE1: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, SUB: tl.constexpr, SWAP: tl.constexpr,
    PACKED: tl.constexpr, TP: tl.constexpr,
):
    """Stream-K schedule of `_moe_gemm_kernel`'s work (same operands, same per-item math): the busy tiles
    (tile_e < E among the MAXT entries; TP = next power of two >= MAXT) x weight-row tiles are items of
    G = K / (32 SUB) units (SUB K blocks each); item i's unit g is u = i * G + g, and program p of P takes
    units [p U / P, (p + 1) U / P) (U = items * G, integer division; P = min(programs, U)), so every program gets the same
    work whatever the number of busy tiles (no tail wave). An item whole in one program runs the epilogue
    there; else each program's run of it (a segment, in K order) is written to part, segment id p + i
    (unique), fp32 [P + items, BM, WR], and the last to arrive at the item's counter (cnt int32 [MAXT *
    cdiv(N, BN)], zeroed before the launch) adds the item's segments in K order from +0, then the epilogue.
    A row's bits depend on the segment boundaries, i.e. on the call's busy tiles (fast mode only)."""
    pid = tl.program_id(0)
    NT = tl.cdiv(N, BN)
    KB = K // 32
    G = tl.cdiv(KB, SUB)
    WR: tl.constexpr = 2 * BN if STAGE1 else BN
    tt = tl.arange(0, TP)
    busy = tl.sum((tl.load(tile_e_ptr + tt, mask=tt < MAXT, other=E) < E).to(tl.int32))
    U = busy * NT * G
    P = tl.minimum(tl.num_programs(0), U)  # every working program gets >= 1 unit; pid >= U: none
    u = pid * U // P
    hi = tl.where(pid < P, (pid + 1) * U // P, 0)
    while u < hi:
        i = u // G
        g0 = u - i * G
        g1 = tl.minimum(G, g0 + hi - u)
        t = i // NT
        pid_n = i - t * NT
        e = tl.load(tile_e_ptr + t)
        rp, m_ok, r, arow, j, rn, n_ok, a_row, w_row, sw_row = _tile(
            a_ptr, perm_ptr, tile_p_ptr, tile_end_ptr, e, t, pid_n, w_ptr, v_ptr, w_es, w_rs, sw_ptr, sv_ptr, sw_es,
            sw_rs, N, K, TOPK, STAGE1, BM, BN)
        acc = _k_sum(a_row, sa_ptr, sa_rs, arow, m_ok, w_row, sw_row, n_ok, g0 * SUB, tl.minimum(g1 * SUB, KB), KB,
                     WR, BM, SUB, SWAP, PACKED)
        done = (g0 == 0) & (g1 == G)  # the whole item here: its epilogue, no segment
        if not done:
            # programs holding item i's first and last unit: p(u) = ceil((u + 1) P / U) - 1
            p_first = ((i * G + 1) * P + U - 1) // U - 1
            p_last = ((i + 1) * G * P + U - 1) // U - 1
            tile = tl.arange(0, BM)[:, None] * WR + j[None, :]
            tl.store(part_ptr + (pid + i).to(tl.int64) * (BM * WR) + tile, acc)
            tl.debug_barrier()  # every thread's segment stored before the arrival (see gemm_triton._fold_tile)
            done = tl.atomic_add(cnt_ptr + i, 1, sem="acq_rel") == p_last - p_first
            if done:  # the last segment to arrive: the item's segments in K order from +0
                acc = tl.zeros([BM, WR], dtype=tl.float32)
                for q in range(p_first, p_last + 1):
                    acc = acc + tl.load(part_ptr + (q + i).to(tl.int64) * (BM * WR) + tile, cache_modifier=".cg")
        if done:
            _epilogue(acc, r, rp, m_ok, rn, n_ok, pid_n, rw_ptr, out_ptr, os_ptr, os_rs, N, limit, STAGE1, BM, BN)
        u += g1 - g0


@triton.jit
def _swiglu_store(acc, acc2, r, rp, m_ok, rn, n_ok, pid_n, rw_ptr, out_ptr, os_ptr, os_rs, N, limit,
                  BM: tl.constexpr, BN: tl.constexpr):
    """Stage-1 epilogue of fp32 g = acc, u = acc2 [BM, BN] (rows p = rp, pairs r, columns rn = pid_n * BN..):
    bf16 g and u, SwiGLU with the clamp, routing weight, bf16 h, h's MXFP8 quant per 32 columns -> out
    uint8 [R, N] at row p, scales fp32 [N/32, os_rs] at column p."""
    g = bf16_round(acc)
    u = bf16_round(acc2)
    if limit > 0:
        u = tl.where(u < -limit, -limit, tl.where(u > limit, limit, u))
        g = tl.where(g > limit, limit, g)
    h = g / (1.0 + tl.exp(-g)) * u
    wt = tl.load(rw_ptr + r, mask=m_ok, other=0.0)
    h = bf16_round(wt[:, None] * h)
    hg = tl.reshape(h, [BM, BN // 32, 32])
    amax = tl.reduce(tl.abs(hg), 2, max_nan, keep_dims=True)
    amax = tl.where(amax < 1e-4, 1e-4, amax)  # clamp(min=1e-4), NaN kept
    s = ue8m0_ceil(amax * (1.0 / 448.0))
    q = e4m3_byte(hg * tl.math.div_rn(1.0, s))
    q = tl.reshape(q, [BM, BN]).to(tl.uint8)
    pos = (rn // 32) * 32 + evens_first_position(rn % 32)  # h is stage 2's K: stored evens first
    tl.store(out_ptr + rp.to(tl.int64)[:, None] * N + pos[None, :], q, mask=m_ok[:, None] & n_ok[None, :])
    gcol = pid_n * (BN // 32) + tl.arange(0, BN // 32)
    s2 = tl.reshape(s, [BM, BN // 32])
    tl.store(os_ptr + gcol.to(tl.int64)[None, :] * os_rs + rp[:, None], s2,
             mask=m_ok[:, None] & (gcol < N // 32)[None, :])


@triton.jit
def _fold_splits(part_ptr, cnt, S, R, N, r, rp, m_ok, pid_n, rw_ptr, out_ptr, os_ptr, os_rs, limit,
                 STAGE1: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """Arrival of a K split at its tile's counter (after its sums are stored); the S-th arrival adds the
    tile's splits of part [S, R, N] (STAGE1: [S, R, 2N], g | u) in split order from +0, rows p = rp, columns
    pid_n * BN.., then runs the epilogue. Ordering as `gemm_triton._fold_tile`: the barrier puts every
    thread's stores before thread 0's acq_rel atomic; the loads bypass L1 (.cg)."""
    tl.debug_barrier()
    if tl.atomic_add(cnt, 1, sem="acq_rel") == S - 1:
        rn = pid_n * BN + tl.arange(0, BN)
        n_ok = rn < N
        NT = 2 * N if STAGE1 else N
        src = part_ptr + rp.to(tl.int64)[:, None] * NT + rn[None, :]
        ok = m_ok[:, None] & n_ok[None, :]
        acc = tl.zeros([BM, BN], dtype=tl.float32)
        acc2 = tl.zeros([BM, BN], dtype=tl.float32)
        for c in range(S):
            acc = acc + tl.load(src + c * R * NT, mask=ok, other=0.0, cache_modifier=".cg")
            if STAGE1:
                acc2 = acc2 + tl.load(src + c * R * NT + N, mask=ok, other=0.0, cache_modifier=".cg")
        if STAGE1:
            _swiglu_store(acc, acc2, r, rp, m_ok, rn, n_ok, pid_n, rw_ptr, out_ptr, os_ptr, os_rs, N, limit, BM, BN)
        else:
            tl.store(out_ptr + r.to(tl.int64)[:, None] * N + rn[None, :], bf16_round(acc).to(tl.bfloat16), mask=ok)


def routing_tiles(ids: torch.Tensor, weights: torch.Tensor, n_experts: int, bm: int):
    """-> (perm int32 [R] sorted position -> pair r, routing weight fp32 [R] by pair, tile expert /
    first p / end p int32 [max_tiles]); device ops only (no host read)."""
    r = ids.numel()
    perm, wt, counts, ends = sorted_pairs(ids, weights, n_experts)
    ntile = (counts + bm - 1) // bm
    tend = torch.cumsum(ntile, 0)
    max_tiles = min(r, triton.cdiv(r, bm) + n_experts)
    tid = torch.arange(max_tiles, device=ids.device)
    te = torch.searchsorted(tend, tid, right=True)
    tec = te.clamp(max=n_experts - 1)
    first = ends[tec] - counts[tec] + (tid - (tend[tec] - ntile[tec])) * bm
    return perm.int(), wt, te.int(), first.int(), ends[tec].int()


DECODE_ROWS = 512
"""Up to this many (token, expert) pairs a call runs SWAP tiles: on the H200 2.0-2.9x faster than the
one-pass [64 pairs x 32 weight rows] tiles at 1 / 8 / 64 tokens, same bits
(benchmark/results/2026-12-02-h200-decode-step-sweep.md)."""
SPLIT_PROGRAMS_PER_SM = 4
"""Fast mode (not deterministic), decode: each GEMM's K is split so that its busy programs (tiles of
experts that have pairs x weight-row tiles) reach about this many per SM (`split_counts`). With stacked
w1 | w3 tiles (H100, hidden 5120, inter 2304, 16 experts; benchmark/results/2026-12-05-h100-moe-stacked.md):
at 8 tokens the unsplit call is 1.08x the (2, 2) split that 8 per SM picked, at 64 tokens 1.01x; at 1
token splitting still pays (1.09x); those splits were folded by a separate launch, which the last
arriving split now does. At 4 per SM, 8 and 64 tokens do not split at these widths while 1 token splits
3 ways."""


WIDE_PAIRS_PER_EXPERT = 16
"""Decode calls with at least this many pairs per expert on average run SWAP tiles of 32 pairs: an
expert's weights are then dequantized once per 32 pairs, not per 16. H200, E = 16 at 64 tokens (24 per
expert): 375 vs 425 us; E = 384 at 64 tokens (1 per expert): 4097 vs 2747 us, the wide tile's MMA and
scale work spent on empty pairs (benchmark/results/2026-12-03-h200-moe-evens-first.md)."""


def pick_config(rows: int, n_experts: int = 0) -> tuple[int, int, int, int, int, bool]:
    """(BM, BN1, BN2, num_warps, num_stages, SWAP). Prefill: narrow N tiles were fastest at every size
    in the H200 sweep (benchmark/results/2026-12-01-h200-kernels-moe.md). Decode (rows <= DECODE_ROWS):
    SWAP tiles of 16 pairs (32 from WIDE_PAIRS_PER_EXPERT pairs per expert of `n_experts`) against 64
    (w1 / w3) or 128 (w2) weight rows. Every config gives the same bits (test_moe_gpu.py), so the
    switch keeps rows batch invariant."""
    if rows <= DECODE_ROWS:
        wide = n_experts and rows >= WIDE_PAIRS_PER_EXPERT * n_experts
        return (32, 64, 128, 4, 4, True) if wide else (16, 64, 128, 4, 3, True)
    return 64, 32, 32, 4, 4, False


NARROW_MAXNREG = 96
NARROW_FIT = (4, 5)
"""Register cap of the 16-pair decode tiles (`decode_tail`) and the programs per SM without / with it. Loading an
iteration's four weight tiles at once (`_fp4_tiles4`) takes them from 96 to 112 registers, 4 instead of 5
programs per SM; where the cap makes stage 1's grid one wave instead of two it pays, elsewhere its spills cost.
H100, hidden 5120, inter 2304 (benchmark/results/2026-12-06-h100-moe-wide.md): 16 experts at 8 tokens (576
programs) 205.9 us capped at 3 stages vs 218.3 for the previous kernel (four [WR, 16] loads, 4 stages) and
251.5 uncapped; 384 experts at 8 tokens (1728 programs) 497.3 uncapped at 3 stages vs 560.0 capped."""


STREAM_PER_SM = 2
"""Fast mode, decode calls on 32-pair tiles (WIDE_PAIRS_PER_EXPERT): both GEMMs on the stream-K schedule
(`_moe_stream_kernel`) with this many programs per SM. H100, hidden 5120, inter 2304, 16 experts, 64 tokens
(benchmark/results/2026-12-06-h100-moe-stream.md): 338.3 us vs 384.0 for the unsplit pick and 363.5 for a
(2, 2) K split; 4 programs per SM under a 128-register cap 393.7. On 16-pair tiles (1 and 8 tokens) it lost
(112.4 vs 101.6 us, 229.0 vs 215.4), so those keep `split_counts`."""


def decode_tail(rows: int, n_exp: int, inter: int, hid: int, config: tuple, device, fast: bool) -> tuple:
    """What a SWAP decode pick gets appended, (S1, S2, MAXNREG[, STREAM]): fast mode on 32-pair tiles
    (1, 1, None, STREAM_PER_SM); 16-pair tiles in fast mode the K splits of `split_counts`, and NARROW_MAXNREG
    where it brings stage 1's programs into one wave (NARROW_FIT); deterministic mode never splits."""
    if config[0] >= 32:
        return (1, 1, None, STREAM_PER_SM) if fast else (1, 1)
    splits = split_counts(rows, n_exp, inter, hid, *config[:3], device) if fast else (1, 1)
    programs, sms = _busy_tiles(rows, n_exp, config[0]) * triton.cdiv(inter, config[1]) * splits[0], _sm_count(device)
    return splits + (NARROW_MAXNREG if NARROW_FIT[0] * sms < programs <= NARROW_FIT[1] * sms else None,)


def _busy_tiles(rows: int, n_exp: int, bm: int) -> int:
    """The most tiles of a decode call that hold pairs: min(rows, experts), + one per expert boundary inside a tile."""
    return min(rows, n_exp, triton.cdiv(rows, bm) + n_exp)


def split_counts(rows: int, n_exp: int, inter: int, hid: int, bm: int, bn1: int, bn2: int, device) -> tuple[int, int]:
    """K splits (stage 1, stage 2) of a fast-mode decode call: busy tiles are at most min(rows, experts)
    (+ one per expert boundary inside a tile); splits of whole SUB = 4 blocks, at least 8 blocks each."""
    busy = _busy_tiles(rows, n_exp, bm)
    target = SPLIT_PROGRAMS_PER_SM * _sm_count(device)
    s1 = triton.cdiv(target, busy * triton.cdiv(inter, bn1))
    s2 = triton.cdiv(target, busy * triton.cdiv(hid, bn2))
    return max(1, min(s1, hid // 32 // 8)), max(1, min(s2, inter // 32 // 8))


def _word_rows(scales: torch.Tensor) -> bool:
    """Whether every row of an expert scale tensor [E, N, K/32] starts 4-byte aligned (`_scale_word`)."""
    return scales.data_ptr() % 4 == 0 and scales.stride(0) % 4 == 0 and scales.stride(1) % 4 == 0


def _sub(kb: int) -> int:
    return 4 if kb % 4 == 0 else 2 if kb % 2 == 0 else 1


def _splits(k: int, splits: int) -> tuple[int, int]:
    """(K blocks per split, split count) for `splits` requested runs of whole SUB blocks over K."""
    kb, sub = k // 32, _sub(k // 32)
    ksb = triton.cdiv(triton.cdiv(kb, splits), sub) * sub
    return ksb, triton.cdiv(kb, ksb)


def _gemm(args, tiles, n, k, bm, bn, launch, swap, packed, splits, stage1, part_rows, counters, stream=0):
    """One `_moe_gemm_kernel` launch, K split in `splits` runs of whole SUB blocks when > 1 (the last split
    of a tile to finish adds them and runs the epilogue), or with `stream` > 0 one `_moe_stream_kernel` launch
    of that many programs. args: the kernel's arguments up to `limit`; launch: Triton launch options
    (num_warps, num_stages[, maxnreg]); counters: int32 [tiles * cdiv(n, bn)], zero (used with a split or
    stream)."""
    sub = _sub(k // 32)
    if stream:
        wr = 2 * bn if stage1 else bn
        part = torch.empty((stream + tiles * triton.cdiv(n, bn)) * bm * wr, dtype=torch.float32, device=args[0].device)
        _moe_stream_kernel[(stream,)](*args, part, tiles, counters, STAGE1=stage1, BM=bm, BN=bn, SUB=sub, SWAP=swap,
                                      PACKED=packed and sub == 4, TP=triton.next_power_of_2(tiles), **launch)
        return
    ksb, splits = _splits(k, splits)
    part = args[0]  # unused without a split
    if splits > 1:
        part = torch.empty(splits, part_rows, (2 if stage1 else 1) * n, dtype=torch.float32, device=args[0].device)
    grid = (tiles, triton.cdiv(n, bn)) + ((splits,) if splits > 1 else ())
    _moe_gemm_kernel[grid](*args, part, part_rows, ksb, counters, STAGE1=stage1, BM=bm, BN=bn, SUB=sub, SWAP=swap,
                           PACKED=packed and sub == 4, KSPLIT=splits > 1, **launch)


@moe_experts.triton_impl
def moe_experts_triton(x, ids, weights, w1, s1, w3, s3, w2, s2, limit: float, config=None):
    """Same contract as the twin; `config` = (BM, BN1, BN2, num_warps, num_stages[, SWAP[, S1, S2[, MAXNREG[,
    STREAM]]]]) overrides pick_config (SWAP defaults to False; S1 / S2: K splits of the two GEMMs, default 1;
    MAXNREG: a register cap per thread for both GEMMs, which can fit more programs per SM, the same bits;
    STREAM: both GEMMs as `_moe_stream_kernel` launches of STREAM programs per SM (a fraction allowed),
    S1 / S2 unused). Without a config,
    calls with many pairs per expert run the bf16 prefill path (`moe_prefill.bf16_prefill`), and decode
    calls get `decode_tail` (outside deterministic mode a K split or stream-K: a row's bits then depend on
    the split)."""
    t, k = ids.shape
    n_exp, inter, hk = w1.shape
    hid = 2 * hk
    assert x.shape == (t, hid) and w2.shape == (n_exp, hid, inter // 2), (x.shape, w1.shape, w2.shape)
    assert inter % 32 == 0 and hid % 32 == 0
    rows = t * k
    w1, w3, w2 = (w.view(torch.uint8) for w in (w1, w3, w2))
    s1, s3, s2 = (s.view(torch.uint8) for s in (s1, s3, s2))
    assert w1.stride() == w3.stride() and s1.stride() == s3.stride() and w1.stride(-1) == 1 and s1.stride(-1) == 1
    if rows and config is None and bf16_prefill(rows, n_exp, x.device):  # many pairs per expert: bf16 tensor cores
        return moe_experts_bf16(x, ids, weights, w1, s1, w3, s3, w2, s2, limit)
    out = torch.empty(t, k, hid, dtype=torch.bfloat16, device=x.device)
    if rows == 0:
        return out
    if config is None:
        config = pick_config(rows, n_exp)
        if config[5]:
            config = config + decode_tail(rows, n_exp, inter, hid, config, x.device, fast=not deterministic())
    bm, bn1, bn2, warps, stages, *rest = config
    swap = bool(rest and rest[0])
    sp1, sp2 = (rest[1], rest[2]) if len(rest) >= 3 else (1, 1)
    launch = dict(num_warps=warps, num_stages=stages) | ({"maxnreg": rest[3]} if len(rest) >= 4 and rest[3] else {})
    stream = max(1, round(rest[4] * _sm_count(x.device))) if len(rest) >= 5 and rest[4] else 0
    route = routing_tiles_fused if rows <= ROUTING_ROWS else routing_tiles  # same integers
    perm, wt, te, first, end = route(ids, weights, n_exp, bm)
    tiles = te.numel()
    # arrival counters of the split GEMMs (stage 1's, then stage 2's), zeroed by the quant launch
    c1 = tiles * triton.cdiv(inter, bn1) if stream or _splits(hid, sp1)[1] > 1 else 0
    c2 = tiles * triton.cdiv(hid, bn2) if stream or _splits(inter, sp2)[1] > 1 else 0
    cnt = torch.empty(max(c1 + c2, 1), dtype=torch.int32, device=x.device)
    qx, sx = mxfp8_quant_t(x.contiguous(), evens_first=True, zero=cnt[: c1 + c2])
    qh = torch.empty(rows, inter, dtype=torch.uint8, device=x.device)
    sh = torch.empty(inter // 32, rows, dtype=torch.float32, device=x.device)
    packed = swap and all(_word_rows(sc) for sc in (s1, s3, s2))
    _gemm((qx, sx, t, perm, te, first, end, n_exp, w1, w3, w1.stride(0), w1.stride(1), s1, s3, s1.stride(0),
           s1.stride(1), wt, qh, sh, rows, inter, hid, k, float(limit)),
          tiles, inter, hid, bm, bn1, launch, swap, packed, sp1, True, rows, cnt, stream)
    _gemm((qh.view(torch.float8_e4m3fn), sh, rows, perm, te, first, end, n_exp, w2, w2, w2.stride(0), w2.stride(1),
           s2, s2, s2.stride(0), s2.stride(1), wt, out, sh, rows, hid, inter, k, float(limit)),
          tiles, hid, inter, bm, bn2, launch, swap, packed, sp2, False, rows, cnt[c1:] if c2 else cnt, stream)
    return out


@triton.jit
def _combine_kernel(r_ptr, r_st, r_sk, s_ptr, s_st, out_ptr, H, K, BLOCK: tl.constexpr):
    """Row t, columns [BLOCK]: out = cast(((+0 + r[t, 0]) + r[t, 1]) + ... + r[t, K-1] + s[t]) in fp32.
    r [T, K, H] (strides r_st, r_sk, unit column stride), s [T, H] (row stride s_st), out [T, H] contiguous."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = h < H
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for j in range(K):
        acc = acc + tl.load(r_ptr + t * r_st + j * r_sk + h, mask=ok, other=0.0).to(tl.float32)
    acc = acc + tl.load(s_ptr + t * s_st + h, mask=ok, other=0.0).to(tl.float32)
    if out_ptr.dtype.element_ty == tl.bfloat16:
        tl.store(out_ptr + t * H + h, bf16_round(acc).to(tl.bfloat16), mask=ok)  # RNE, as torch's cast
    else:
        tl.store(out_ptr + t * H + h, acc.to(out_ptr.dtype.element_ty), mask=ok)


@moe_combine.triton_impl
def moe_combine_triton(routed: torch.Tensor, shared: torch.Tensor) -> torch.Tensor:
    """Same contract as the twin: one launch, grid (T, H / 1024). Calls that need autograd, and dtypes other
    than bf16 / fp16 / fp32, run the twin."""
    grad = torch.is_grad_enabled() and (routed.requires_grad or shared.requires_grad)
    floats = (torch.bfloat16, torch.float16, torch.float32)
    if grad or routed.dim() != 3 or routed.dtype not in floats or shared.dtype not in floats:
        return moe_combine.torch(routed, shared)
    t, k, h = routed.shape
    assert shared.shape == (t, h), (routed.shape, shared.shape)
    routed = routed if routed.stride(-1) == 1 else routed.contiguous()
    shared = shared if shared.stride(-1) == 1 else shared.contiguous()
    out = torch.empty(t, h, dtype=shared.dtype, device=shared.device)
    if t and h:
        block = min(1024, triton.next_power_of_2(h))
        _combine_kernel[(t, triton.cdiv(h, block))](routed, routed.stride(0), routed.stride(1), shared,
                                                    shared.stride(0), out, h, k, BLOCK=block, num_warps=4)
    return out


__all__ = ["DECODE_ROWS", "decode_tail", "moe_combine_triton", "moe_experts_triton", "pick_config",
           "routing_tiles", "split_counts"]
