"""Triton exact top-k (radix select) and candidate blocks; bitwise equal to the twins.

One program per row. Scores map to order-preserving unsigned 32-bit keys (-0 folded into +0). Rows
of up to 65536 values sit in registers (32 warps): a 32-step bitwise search finds the k-th largest
key, then one compaction. Longer rows use a radix select over 3 digits (11, 11, 10 bits; `tl.histogram` per chunk of the row, re-read from
L2) finds the k-th largest key and how many keys equal to it are still needed; it stops early when a
digit's bin holds exactly the elements still needed. A last pass compacts the row in position
order: keys above the threshold, plus the first `need` keys equal to it (ties -> lower position).
Positions come out ascending because the compaction walks the row in order; the rest is -1.

Ranking of non-finite values (as the twins): topk_select never selects NaN or -inf. Candidate
blocks rank NaN block maxima above +inf (torch.sort puts NaN first in descending order) but never
keep them, and never keep -inf blocks.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv41_kernels.indexer import candidate_blocks, topk_select
from dsv41_kernels.triton_numerics import max_nan

@triton.jit
def _keys(x, NAN_TOP: tl.constexpr):
    """fp32 -> (uint32 key, rank-valid mask, emit mask). Larger key = larger value."""
    x = tl.where(x == 0.0, 0.0, x)  # -0 == +0 for ranking
    b = x.to(tl.int32, bitcast=True)
    k = tl.where(b >= 0, b ^ -2147483648, ~b).to(tl.uint32, bitcast=True)
    nan = x != x
    if NAN_TOP:
        k = tl.where(nan, 0xFFFFFFFF, k)
        ok = x != float("-inf")
        emit = ok & ~nan
    else:
        ok = (x != float("-inf")) & ~nan
        emit = ok
    return k, ok, emit


@triton.jit
def _digit_pass(row_ptr, n, prefix, sh_hi: tl.constexpr, need,
                SHIFT: tl.constexpr, BINS: tl.constexpr, CHUNK: tl.constexpr, NAN_TOP: tl.constexpr):
    """One radix digit: histogram of candidates (key >> sh_hi == prefix), pick the bin holding the
    `need`-th largest. Returns (new prefix, new need, done)."""
    hist = tl.zeros([BINS], dtype=tl.int32)
    for c0 in range(0, n, CHUNK):
        offs = c0 + tl.arange(0, CHUNK)
        x = tl.load(row_ptr + offs, mask=offs < n, other=float("-inf")).to(tl.float32)
        k, ok, _ = _keys(x, NAN_TOP)
        if sh_hi < 32:
            ok = ok & ((k >> sh_hi) == prefix)
        d = ((k >> SHIFT) & (BINS - 1)).to(tl.int32)
        hist += tl.histogram(d, BINS, mask=ok)
    cum_incl = tl.cumsum(hist, 0)
    total = tl.sum(hist, 0)
    bins = tl.arange(0, BINS)
    # bins whose (count at or above) >= need form a prefix [0, b]
    b = tl.sum((total - cum_incl + hist >= need).to(tl.int32), 0) - 1
    above = total - tl.sum(tl.where(bins == b, cum_incl, 0), 0)
    in_bin = tl.sum(tl.where(bins == b, hist, 0), 0)
    new_prefix = (prefix << (sh_hi - SHIFT)) | b.to(tl.uint32)
    return new_prefix, need - above, in_bin == need - above


@triton.jit
def _topk_kernel(x_ptr, x_st, out_ptr, out_st, n, k, NAN_TOP: tl.constexpr, MASK_OUT: tl.constexpr,
                 CHUNK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    row_ptr = x_ptr + row * x_st
    # count rankable values; if at most k, take them all
    cnt = tl.zeros([], dtype=tl.int32)
    for c0 in range(0, n, CHUNK):
        offs = c0 + tl.arange(0, CHUNK)
        x = tl.load(row_ptr + offs, mask=offs < n, other=float("-inf")).to(tl.float32)
        _, ok, _ = _keys(x, NAN_TOP)
        cnt += tl.sum(ok.to(tl.int32), 0)
    take_all = cnt <= k
    need = tl.minimum(k, cnt)
    prefix = tl.zeros([], dtype=tl.uint32)
    sh = tl.full([], 31, tl.uint32)  # candidates: key >> sh == prefix (unused with take_all)
    done = take_all
    if not done:  # digits of 11, 11 and 10 bits
        prefix, need, done = _digit_pass(row_ptr, n, prefix, 32, need, 21, 2048, CHUNK, NAN_TOP)
        sh = tl.full([], 21, tl.uint32)
    if not done:
        prefix, need, done = _digit_pass(row_ptr, n, prefix, 21, need, 10, 2048, CHUNK, NAN_TOP)
        sh = tl.full([], 10, tl.uint32)
    if not done:
        prefix, need, done = _digit_pass(row_ptr, n, prefix, 10, need, 0, 1024, CHUNK, NAN_TOP)
        sh = tl.full([], 0, tl.uint32)
    # compaction in position order
    n_eq = tl.zeros([], dtype=tl.int32)
    n_out = tl.zeros([], dtype=tl.int32)
    out_row = out_ptr + row * out_st
    for c0 in range(0, n, CHUNK):
        offs = c0 + tl.arange(0, CHUNK)
        x = tl.load(row_ptr + offs, mask=offs < n, other=float("-inf")).to(tl.float32)
        kx, ok, emit = _keys(x, NAN_TOP)
        hi = kx >> sh
        eq = ok & (hi == prefix) & ~take_all
        eq_i = eq.to(tl.int32)
        rank = n_eq + tl.cumsum(eq_i, 0) - eq_i
        sel = ok & (take_all | (hi > prefix) | (eq & (rank < need)))
        n_eq += tl.sum(eq_i, 0)
        if MASK_OUT:
            tl.store(out_row + offs, (sel & emit).to(tl.int8), mask=offs < n)
        else:
            s_i = sel.to(tl.int32)
            pos = n_out + tl.cumsum(s_i, 0) - s_i
            tl.store(out_row + pos, offs.to(tl.int32), mask=sel)
            n_out += tl.sum(s_i, 0)
    if not MASK_OUT:
        kk = tl.minimum(k, n)
        for p0 in range(0, kk, CHUNK):
            p = p0 + tl.arange(0, CHUNK)
            tl.store(out_row + p, tl.full([CHUNK], -1, tl.int32), mask=(p >= n_out) & (p < kk))


@triton.jit
def _topk_reg_kernel(x_ptr, x_st, out_ptr, out_st, n, k, NAN_TOP: tl.constexpr, MASK_OUT: tl.constexpr,
                     BLOCK: tl.constexpr):
    """Rows of n <= BLOCK values held in registers: a 32-step bitwise search for the k-th largest
    key (count(key >= candidate) >= need), then one position-ordered compaction."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * x_st + offs, mask=offs < n, other=float("-inf")).to(tl.float32)
    key, ok, _ = _keys(x, NAN_TOP)
    key = tl.where(ok, key, 0)  # rankable keys are >= 2**23; 0 = never selected
    cnt = tl.sum(ok.to(tl.int32), 0)
    take_all = cnt <= k
    need = tl.minimum(k, cnt)
    thr = tl.zeros([], dtype=tl.uint32)
    # bf16-valued scores (the indexer's) have no low 16 key bits: 16 steps settle them
    low = tl.max(key & 0xFFFF, 0) != 0
    for i in tl.static_range(32):
        if (i < 16) | low:
            cand = thr | (tl.full([], 1, tl.uint32) << (31 - i))
            c = tl.sum((key >= cand).to(tl.int32), 0)
            thr = tl.where(c >= need, cand, thr)
    gt = key > thr
    eq = (key == thr) & (key != 0)
    rem = need - tl.sum(gt.to(tl.int32), 0)
    eq_i = eq.to(tl.int32)
    sel = (key != 0) & (take_all | gt | (eq & (tl.cumsum(eq_i, 0) - eq_i < rem)))
    out_row = out_ptr + row * out_st
    if MASK_OUT:
        if NAN_TOP:
            sel = sel & (key != 0xFFFFFFFF)
        tl.store(out_row + offs, sel.to(tl.int8), mask=offs < n)
    else:
        s_i = sel.to(tl.int32)
        tl.store(out_row + tl.cumsum(s_i, 0) - s_i, offs.to(tl.int32), mask=sel)
        n_out = tl.sum(s_i, 0)
        kk = tl.minimum(k, n)
        tl.store(out_row + offs, tl.full([BLOCK], -1, tl.int32), mask=(offs >= n_out) & (offs < kk))


REG_MAX = 65536  # rows up to this length are ranked in registers (32 warps x 64 values)


def _launch_topk(x: torch.Tensor, k: int, out: torch.Tensor, nan_top: bool, mask_out: bool) -> None:
    t, n = x.shape
    if t == 0 or n == 0:
        return
    x = x if x.stride(1) == 1 else x.contiguous()
    if n <= REG_MAX:
        block = max(128, triton.next_power_of_2(n))
        _topk_reg_kernel[(t,)](x, x.stride(0), out, out.stride(0), n, k, NAN_TOP=nan_top, MASK_OUT=mask_out,
                               BLOCK=block, num_warps=max(4, min(32, block // 2048)))
        return
    _topk_kernel[(t,)](x, x.stride(0), out, out.stride(0), n, k, NAN_TOP=nan_top, MASK_OUT=mask_out,
                       CHUNK=4096, num_warps=8)


@topk_select.triton_impl
def topk_select_triton(scores, k):
    t, n = scores.shape
    out = torch.empty(t, min(k, n), dtype=torch.int32, device=scores.device)
    _launch_topk(scores, k, out, nan_top=False, mask_out=False)
    return out


@triton.jit
def _block_max_kernel(x_ptr, x_st, vis_ptr, out_ptr, out_st, n, nb, BS: tl.constexpr, BSP: tl.constexpr,
                      BLOCK: tl.constexpr):
    row = tl.program_id(1).to(tl.int64)
    blk = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    j = tl.arange(0, BSP)
    pos = blk[:, None] * BS + j[None, :]
    x = tl.load(x_ptr + row * x_st + pos, mask=(pos < n) & (j[None, :] < BS), other=float("-inf")).to(tl.float32)
    m = tl.reduce(x, 1, max_nan)
    vis = tl.load(vis_ptr + row).to(tl.int64)
    newest = tl.where(vis > 0, (vis - 1) // BS, -1)
    m = tl.where(blk == newest, float("inf"), m)
    tl.store(out_ptr + row * out_st + blk, m, mask=blk < nb)


@candidate_blocks.triton_impl
def candidate_blocks_triton(scores, visible, topk_blocks, block_size):
    t, n = scores.shape
    nb = triton.cdiv(n, block_size)
    keep = torch.zeros(t, nb, dtype=torch.int8, device=scores.device)
    if t and n:
        scores = scores if scores.stride(1) == 1 else scores.contiguous()
        bmax = torch.empty(t, nb, dtype=torch.float32, device=scores.device)
        block = 256
        _block_max_kernel[(triton.cdiv(nb, block), t)](
            scores, scores.stride(0), visible.contiguous(), bmax, bmax.stride(0), n, nb,
            BS=block_size, BSP=triton.next_power_of_2(block_size), BLOCK=block, num_warps=4)
        _launch_topk(bmax, topk_blocks, keep, nan_top=True, mask_out=True)
    return keep.bool().repeat_interleave(block_size, dim=-1)[:, :n]
