"""The grouped MoE's routing tables in one launch (decode-sized calls).

`routing_tiles` (moe_triton.py) builds them from ~30 small torch launches: a per-row sort, a gather,
a stable argsort, a scatter-add, cumsums, a searchsorted and index arithmetic. In a CUDA-graph decode
step each launch costs a few microseconds of mostly idle GPU, 14-40 times per step. Here one program
computes the same integers (bit for bit, `test_moe_cpu.py`) by counting instead of sorting:

  pair o = t*k + j' of ids [T, k] (original slot j'), expert e_o; "o before o'" means (e_o, o) < (e_o', o')
  slot  j_o = #{o' of token t before o}            (the row's ascending-id order; ids distinct per row)
  pair  r_o = t*k + j_o                            (token t's j-th smallest expert id)
  sorted position p_o = #{o' before o}             (stable by expert: same expert -> ascending token,
                                                    i.e. ascending r, as torch.argsort(stable=True))
  perm[p_o] = r_o, wt[r_o] = weights[o]
  per expert (chunks of CH): counts, ends = cumsum(counts), tiles = cdiv(counts, BM), tend = cumsum(tiles)
  tile i: te = #{e : tend_e <= i}; first / end from the expert with tend_e - tiles_e <= i < tend_e
          (idle tiles i >= tend_{E-1}: te = E, first / end from expert E-1, as routing_tiles)

Work is O(R^2 + R*E) compares: program b places pairs [b*OB, (b+1)*OB) against all R pairs and
writes tiles [b*OB, (b+1)*OB) (each program counts every expert's pairs). Used up to ROUTING_ROWS pairs; above
that (prefill in deterministic mode) the torch ops are cheaper than the quadratic count.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

ROUTING_ROWS = 512
"""Pairs (tokens x top-k) up to which `routing_tiles_fused` serves a call (the decode calls)."""
ROUTING_BLOCK = 64
"""Pairs (and tiles) one program places: a batch-64 decode call (384 pairs) runs 6 programs, not one."""


@triton.jit
def _before(e, o, e2, o2):
    """[A, B] bool: pair (e2, o2) sorts strictly before (e, o) (expert, then original pair index)."""
    return (e2[None, :] < e[:, None]) | ((e2[None, :] == e[:, None]) & (o2[None, :] < o[:, None]))


@triton.jit
def _routing_kernel(ids_ptr, w_ptr, perm_ptr, wt_ptr, te_ptr, first_ptr, end_ptr, R, K, E, MT,
                    BM: tl.constexpr, OB: tl.constexpr, CH: tl.constexpr):
    """ids int [R] (= [T, K] flat, contiguous), w float [R] -> perm int32 [R], wt fp32 [R], te / first /
    end int32 [MT] (see the module docstring). Grid cdiv(max(R, MT), OB): program b places pairs
    b*OB .. b*OB + OB - 1 and writes tiles b*OB .. b*OB + OB - 1 (those that exist). OB and CH powers of two."""
    if tl.program_id(0) * OB < MT:
        _tile_tables(ids_ptr, te_ptr, first_ptr, end_ptr, R, E, MT, BM, OB, CH)
    if tl.program_id(0) * OB >= R:
        return
    o = tl.program_id(0) * OB + tl.arange(0, OB)
    ok = o < R
    e = tl.load(ids_ptr + o, mask=ok, other=0).to(tl.int32)
    t = o // K
    slot = tl.zeros([OB], dtype=tl.int32)
    pos = tl.zeros([OB], dtype=tl.int32)
    for c in range(0, R, CH):
        o2 = c + tl.arange(0, CH)
        ok2 = o2 < R
        e2 = tl.load(ids_ptr + o2, mask=ok2, other=0).to(tl.int32)
        b = _before(e, o, e2, o2) & ok2[None, :]
        pos += tl.sum(b.to(tl.int32), 1)
        slot += tl.sum((b & ((o2 // K)[None, :] == t[:, None])).to(tl.int32), 1)
    r = t * K + slot
    tl.store(perm_ptr + pos, r, mask=ok)
    tl.store(wt_ptr + r, tl.load(w_ptr + o, mask=ok, other=0.0).to(tl.float32), mask=ok)


@triton.jit
def _tile_tables(ids_ptr, te_ptr, first_ptr, end_ptr, R, E, MT, BM: tl.constexpr, TB: tl.constexpr,
                 CH: tl.constexpr):
    """Tiles i = program * TB .. + TB - 1 (of MT) of te / first / end int32 [MT]: tiles of BM sorted
    pairs, from the expert counts of ids [R] (every program counts all experts)."""
    i = tl.program_id(0) * TB + tl.arange(0, TB)
    te = tl.zeros([TB], dtype=tl.int32)
    first = tl.zeros([TB], dtype=tl.int32)
    end = tl.zeros([TB], dtype=tl.int32)
    tiles_before = tl.full([], 0, tl.int32)
    rows_before = tl.full([], 0, tl.int32)
    for c in range(0, E, CH):
        ex = c + tl.arange(0, CH)
        eok = ex < E
        cnt = tl.zeros([CH], dtype=tl.int32)
        for c2 in range(0, R, CH):
            o2 = c2 + tl.arange(0, CH)
            e2 = tl.load(ids_ptr + o2, mask=o2 < R, other=-1).to(tl.int32)
            cnt += tl.sum((e2[None, :] == ex[:, None]).to(tl.int32), 1)
        cnt = tl.where(eok, cnt, 0)
        nt = (cnt + BM - 1) // BM
        tend = tiles_before + tl.cumsum(nt, 0)
        ends = rows_before + tl.cumsum(cnt, 0)
        lo = tend - nt
        te += tl.sum(((tend[None, :] <= i[:, None]) & eok[None, :]).to(tl.int32), 1)
        own = (lo[None, :] <= i[:, None]) & (i[:, None] < tend[None, :])
        idle = (ex == E - 1)[None, :] & (i[:, None] >= tend[None, :])
        sel = eok[None, :] & (own | idle)
        first += tl.sum(tl.where(sel, (ends - cnt)[None, :] + (i[:, None] - lo[None, :]) * BM, 0), 1)
        end += tl.sum(tl.where(sel, ends[None, :], 0), 1)
        tiles_before += tl.sum(nt, 0)
        rows_before += tl.sum(cnt, 0)
    tok = i < MT
    tl.store(te_ptr + i, te, mask=tok)
    tl.store(first_ptr + i, first, mask=tok)
    tl.store(end_ptr + i, end, mask=tok)


def routing_tiles_fused(ids: torch.Tensor, weights: torch.Tensor, n_experts: int, bm: int):
    """Same contract and bits as `moe_triton.routing_tiles` for ids.numel() <= ROUTING_ROWS (ids distinct
    per row, in [0, n_experts)): -> (perm int32 [R], wt fp32 [R], tile expert / first p / end p int32
    [max_tiles]). One launch, no host read."""
    t, k = ids.shape
    r = t * k
    assert 0 < r <= ROUTING_ROWS, r
    max_tiles = min(r, triton.cdiv(r, bm) + n_experts)
    dev = ids.device
    perm = torch.empty(r, dtype=torch.int32, device=dev)
    wt = torch.empty(r, dtype=torch.float32, device=dev)
    tiles = torch.empty(3, max_tiles, dtype=torch.int32, device=dev)
    ob = min(ROUTING_BLOCK, max(16, triton.next_power_of_2(r)))
    programs = triton.cdiv(max(r, max_tiles), ob)
    # one program (up to 64 pairs): 8 warps, as the single-program kernel this replaced (H200, 48 pairs over
    # 16 / 384 experts: 4.4 / 13.0 us; with 4 warps this one took 5.1 / 15.4)
    _routing_kernel[(programs,)](
        ids.contiguous(), weights.contiguous(), perm, wt, tiles[0], tiles[1], tiles[2], r, k, n_experts, max_tiles,
        BM=bm, OB=ob, CH=32, num_warps=8 if programs == 1 else 4)
    return perm, wt, tiles[0], tiles[1], tiles[2]


__all__ = ["ROUTING_ROWS", "routing_tiles_fused"]
