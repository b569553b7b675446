"""Triton exact top-k (radix select) and candidate blocks; bitwise equal to the twins.

Every score maps to an order-preserving 32-bit key (-0 folded into +0; larger key = larger value).
topk_select has two implementations, picked by shape (`variant` overrides):

"split" (default): rows are cut into C chunks of up to 4K values (more past 512K), one program per
  (row, chunk), three launches; no atomics, no scratch that needs zeroing (4 B of list per score).
  1. histogram: per chunk, the count, the largest 11-bit key prefix `pmax` (sign, exponent, 2
     mantissa bits: quarter binades) and a 64-bin histogram of `pmax - prefix` (bin 63: all lower).
  2. digit: each program sums the chunk histograms shifted to the row maximum (exact counts of the
     63 prefixes below it) and finds the prefix P11 holding the k-th largest key; rows of at most k
     values take them all. Each chunk writes its values of prefix >= P11 (16-bit key prefix and
     offset, in position order) to a scratch list, counts those above P11, and histograms the next
     5 key bits of the listed P11 values.
  3. write: the chunks' 32-bin histograms give the 16-bit key prefix P16 of the k-th largest and how
     many values of that prefix are still needed (bf16-valued rows: a 16-bit prefix is one key, ties
     go to lower positions). Its predecessors' counts give each chunk its output offset and its
     share of the ties; it writes its list entries in order. Rows the two digits leave open (the
     k-th largest more than ~16 binades below the maximum; fp32 scores with distinct keys in the
     16-bit bin) are done by the row's first program alone: byte-wide radix passes over the row,
     then an in-order compaction.
"cta": one program per row: rows of up to 65536 values sit in registers (32 warps) for a 32-step
  bitwise search of the k-th largest key; longer rows run a radix select over 3 digits (11, 11, 10
  bits) re-read from L2. candidate_blocks uses this form (mask output, NaN ranked on top).

Positions come out ascending, the rest is -1. Ranking of non-finite values (as the twins):
topk_select never selects NaN or -inf. Candidate blocks rank NaN block maxima above +inf (torch.sort
puts NaN first in descending order) but never keep them, and never keep -inf blocks.
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


# ------------------------------------------------------------------ split rows: 3 launches, exact
_c = tl.constexpr
# per (row, chunk) scratch record, int32 words
WS, W_H0, W_H1, W_CNT, W_PMAX, W_GT1, W_LOW, W_M = _c(128), _c(0), _c(64), _c(96), _c(97), _c(98), _c(99), _c(100)
# per row state, written by the digit launch's first chunk
RS, R_MODE, R_P11, R_NEED1, R_CNT, R_NEED_OV, R_HI_OV = _c(8), _c(0), _c(1), _c(2), _c(3), _c(4), _c(5)
TAKE_ALL, DIGITS, OVERFLOW = _c(0), _c(1), _c(2)  # row modes
NONE = _c(-2147483647 - 1)  # key of NaN / -inf; every rankable key is above it
ALL_P11 = _c(-1023)  # a prefix below every rankable key's (take-all rows: every value is a candidate)


@triton.jit
def _ikey(x):
    """fp32 -> (key, raw bits): the order-preserving int32 key (sign-magnitude to two's complement,
    so -0 and +0 meet at 0), NONE for NaN and -inf."""
    b = x.to(tl.int32, bitcast=True)
    s = b >> 31
    key = ((b & 0x7FFFFFFF) ^ s) - s
    # rankable: -0x7F800000 (-inf) < key <= 0x7F800000 (+inf), one unsigned compare
    ok = (key.to(tl.uint32, bitcast=True) + 0x7F7FFFFF) <= 0xFEFFFFFF
    return tl.where(ok, key, NONE), b


@triton.jit
def _row_chunk(C):
    pid = tl.program_id(0)
    row = pid // C
    return row, pid - row * C, pid.to(tl.int64)


@triton.jit
def _chunk_keys(x_ptr, x_st, row, offs, n, EVEN: tl.constexpr):
    ptr = x_ptr + row.to(tl.int64) * x_st + offs
    if EVEN:
        x = tl.load(ptr)
    else:
        x = tl.load(ptr, mask=offs < n, other=float("-inf"))
    return _ikey(x.to(tl.float32))


@triton.jit
def _split_hist_kernel(x_ptr, x_st, ws_ptr, n, C, CHUNK: tl.constexpr, EVEN: tl.constexpr):
    row, c, pid = _row_chunk(C)
    key, b = _chunk_keys(x_ptr, x_st, row, c * CHUNK + tl.arange(0, CHUNK), n, EVEN)
    p = key >> 21  # 11-bit prefix (sign, exponent, 2 mantissa bits); NONE -> -1024, below all others
    pmax = tl.max(p, 0)
    # bin j < 63: prefix pmax - j; bin 63: everything lower
    h = tl.histogram(tl.minimum(pmax - p, 63), 64, mask=key != NONE)
    w = ws_ptr + pid * WS
    tl.store(w + W_H0 + tl.arange(0, 64), h)
    tl.store(w + W_CNT, tl.sum(h, 0))
    tl.store(w + W_PMAX, pmax)


@triton.jit
def _split_digit_kernel(x_ptr, x_st, ws_ptr, rs_ptr, lst_ptr, n, C, k, CHUNK: tl.constexpr, SUB: tl.constexpr,
                        CP: tl.constexpr, LB: tl.constexpr, EVEN: tl.constexpr):
    row, c, pid = _row_chunk(C)
    wrow = ws_ptr + row.to(tl.int64) * C * WS
    ci = tl.arange(0, CP)
    cnt_c = tl.load(wrow + ci * WS + W_CNT, mask=ci < C, other=0)
    pmax_c = tl.load(wrow + ci * WS + W_PMAX, mask=ci < C, other=-1024)
    cnt = tl.sum(cnt_c, 0)
    pm = tl.max(pmax_c, 0)
    # exact row counts of the 63 prefixes below the row maximum: chunk bin j is row bin j + shift
    jj = tl.arange(0, 64)
    src = jj[None, :] - (pm - pmax_c)[:, None]
    ld = (cnt_c > 0)[:, None] & (src >= 0) & (src < 63) & (jj < 63)[None, :]
    hist = tl.sum(tl.load(wrow + ci[:, None] * WS + W_H0 + src, mask=ld, other=0), 0)
    need = tl.minimum(cnt, k)
    cum = tl.cumsum(hist, 0)
    jstar = tl.sum((cum < need).to(tl.int32), 0)  # first bin reaching need; 63: below the window
    mode = tl.where(cnt <= k, TAKE_ALL, tl.where(jstar < 63, DIGITS, OVERFLOW))
    p11 = tl.where(mode == TAKE_ALL, ALL_P11, pm - jstar)
    if c == 0:
        r = rs_ptr + row.to(tl.int64) * RS
        tl.store(r + R_MODE, mode)
        tl.store(r + R_P11, p11)
        tl.store(r + R_NEED1, need - tl.sum(tl.where(jj == jstar, cum - hist, 0), 0))
        tl.store(r + R_CNT, cnt)
        tl.store(r + R_NEED_OV, need - tl.sum(hist, 0))
        tl.store(r + R_HI_OV, (tl.maximum(pm - 62, -1023) << 21) - 1)  # keys with prefix < pm - 62
    w = ws_ptr + pid * WS
    lst = lst_ptr + pid * CHUNK
    if mode != OVERFLOW:
        # compact the candidates (prefix >= p11) in position order: (key >> 16) << 16 | offset in
        # the chunk; SUB values at a time as [SUB / 4, 4] (runs of 4 per thread, one scan over runs)
        m = tl.zeros([], dtype=tl.int32)
        n_gt = tl.zeros([], dtype=tl.int32)
        low = tl.zeros([], dtype=tl.int32)
        for s0 in range(0, CHUNK, SUB):
            off = s0 + tl.arange(0, SUB // 4)[:, None] * 4 + tl.arange(0, 4)[None, :]
            key, b = _chunk_keys(x_ptr, x_st, row, c * CHUNK + off, n, EVEN)
            p = key >> 21
            cand = p >= p11
            ci_ = cand.to(tl.int32)
            run = tl.sum(ci_, 1)
            ex = m + tl.cumsum(ci_, 1) - ci_ + (tl.cumsum(run, 0) - run)[:, None]
            tl.store(lst + ex, (key & -65536) | off, mask=cand)
            m += tl.sum(run, 0)
            # one reduction: values above p11 (bits 0-15) and values of bin p11 with low 16 key bits
            # set, i.e. not bf16 values (bits 16 up; SUB <= 16384 keeps it below 2**31)
            both = tl.sum(tl.sum((p > p11).to(tl.int32) + ((p == p11) & ((b & 0xFFFF) != 0)).to(tl.int32) * 65536,
                                 1), 0)
            n_gt += both & 0xFFFF
            low = tl.maximum(low, both >> 16)
        tl.store(w + W_M, m)
        tl.store(w + W_GT1, n_gt)
        tl.store(w + W_LOW, low)
        if mode == DIGITS:  # histogram the next 5 key bits of bin p11, from the list just written
            tl.debug_barrier()
            h1 = tl.zeros([32], dtype=tl.int32)
            for i0 in range(0, m, LB):
                i = i0 + tl.arange(0, LB)
                q = tl.load(lst + i, mask=i < m, other=0) >> 16
                h1 += tl.histogram(q & 31, 32, mask=(i < m) & ((q >> 5) == p11))
            tl.store(w + W_H1 + tl.arange(0, 32), h1)


@triton.jit
def _row_fallback(row_ptr, out_row, n, lo, hi, need, CHUNK: tl.constexpr):
    """One program, whole row: the keys in [lo, hi] hold the `need` values still to take (all keys
    above hi are taken). Byte-wide radix passes narrow [lo, hi] until it is one key or its values
    are all needed, then one pass writes positions in order (ties: first `need` in position order)."""
    done = lo == hi
    bins = tl.arange(0, 256)
    ar = tl.arange(0, CHUNK)
    for _step in tl.static_range(4):
        if not done:
            d = lo ^ hi  # the highest differing byte is the digit
            s = tl.where((d >> 24) != 0, 24, tl.where((d >> 16) != 0, 16, tl.where((d >> 8) != 0, 8, 0)))
            base = lo >> s
            hist = tl.zeros([256], dtype=tl.int32)
            x_next = tl.load(row_ptr + ar, mask=ar < n, other=float("-inf"))
            for c0 in range(0, n, CHUNK):  # the next chunk's load is in flight while one is ranked
                x = x_next
                x_next = tl.load(row_ptr + c0 + CHUNK + ar, mask=c0 + CHUNK + ar < n, other=float("-inf"))
                key, b = _ikey(x.to(tl.float32))
                inr = (key >= lo) & (key <= hi)
                if tl.sum(inr.to(tl.int32), 0) != 0:
                    hist += tl.histogram(tl.minimum(tl.maximum((key >> s) - base, 0), 255), 256, mask=inr)
            suf = tl.sum(hist, 0) - tl.cumsum(hist, 0) + hist  # count in bins >= b
            dig = tl.sum((suf >= need).to(tl.int32), 0) - 1
            need -= tl.sum(tl.where(bins == dig, suf - hist, 0), 0)
            in_bin = tl.sum(tl.where(bins == dig, hist, 0), 0)
            lo = tl.maximum(lo, (base + dig) << s)
            hi = tl.minimum(hi, ((base + dig) << s) + ((tl.full([], 1, tl.int32) << s) - 1))
            done = (lo == hi) | (in_bin == need)
    n_gt = tl.zeros([], dtype=tl.int32)
    n_eq = tl.zeros([], dtype=tl.int32)
    ar2 = tl.arange(0, CHUNK // 4)[:, None] * 4 + tl.arange(0, 4)[None, :]  # runs of 4 per thread
    x_next = tl.load(row_ptr + ar2, mask=ar2 < n, other=float("-inf"))
    for c0 in range(0, n, CHUNK):
        offs = c0 + ar2
        x = x_next
        x_next = tl.load(row_ptr + CHUNK + offs, mask=CHUNK + offs < n, other=float("-inf"))
        key, b = _ikey(x.to(tl.float32))
        eq = (key >= lo) & (key <= hi)
        both = (key > hi).to(tl.int32) * 65536 + eq.to(tl.int32)  # above (bit 16 up), equal
        run = tl.sum(both, 1)
        ex = tl.cumsum(both, 1) - both + (tl.cumsum(run, 0) - run)[:, None]
        e = n_eq + (ex & 0xFFFF)
        sel = (key > hi) | (eq & (e < need))
        tl.store(out_row + n_gt + (ex >> 16) + tl.minimum(e, need), offs, mask=sel)
        tot = tl.sum(run, 0)
        n_gt += tot >> 16
        n_eq += tot & 0xFFFF
    return n_gt + tl.minimum(n_eq, need)


@triton.jit
def _split_write_kernel(x_ptr, x_st, ws_ptr, rs_ptr, lst_ptr, out_ptr, out_st, n, C, k,
                        CHUNK: tl.constexpr, CP: tl.constexpr, LB: tl.constexpr, KB: tl.constexpr,
                        FB_CHUNK: tl.constexpr):
    row, c, pid = _row_chunk(C)
    r = rs_ptr + row.to(tl.int64) * RS
    mode = tl.load(r + R_MODE)
    need1 = tl.load(r + R_NEED1)
    cnt = tl.load(r + R_CNT)
    wrow = ws_ptr + row.to(tl.int64) * C * WS
    ci = tl.arange(0, CP)
    pred = ci < c
    # each list entry is taken if its 16-bit key prefix is above p16, or equal and among the first
    # `need_eq` equal ones of the row; take-all rows: every entry (p16 below every prefix)
    p16 = tl.full([], -32767, tl.int32)
    need_eq = tl.zeros([], dtype=tl.int32)
    eq_before = tl.zeros([], dtype=tl.int32)
    gt_before = tl.zeros([], dtype=tl.int32)
    direct = mode == TAKE_ALL
    if direct:
        gt_before = tl.sum(tl.load(wrow + ci * WS + W_M, mask=pred, other=0), 0)
    if mode == DIGITS:
        bb = tl.arange(0, 32)
        h1 = tl.load(wrow + ci[:, None] * WS + W_H1 + bb[None, :], mask=(ci < C)[:, None], other=0)
        hist = tl.sum(h1, 0)
        suf = tl.sum(hist, 0) - tl.cumsum(hist, 0) + hist  # count in bins >= b
        bstar = tl.sum((suf >= need1).to(tl.int32), 0) - 1
        need_eq = need1 - tl.sum(tl.where(bb == bstar, suf - hist, 0), 0)
        p16 = (tl.load(r + R_P11) << 5) | bstar
        # a 16-bit prefix is one key when no value of bin p11 has low bits (bf16-valued scores);
        # otherwise it decides only if the whole bin is taken
        low = tl.sum(tl.load(wrow + ci * WS + W_LOW, mask=ci < C, other=0), 0)
        direct = (low == 0) | (tl.sum(tl.where(bb == bstar, hist, 0), 0) == need_eq)
        hp = tl.where(pred[:, None], h1, 0)
        gt_before = tl.sum(tl.load(wrow + ci * WS + W_GT1, mask=pred, other=0), 0) + \
            tl.sum(tl.sum(tl.where(bb[None, :] > bstar, hp, 0), 1), 0)
        eq_before = tl.sum(tl.sum(tl.where(bb[None, :] == bstar, hp, 0), 1), 0)
    out_row = out_ptr + row.to(tl.int64) * out_st
    n_sel = tl.minimum(k, cnt)
    if direct:
        m = tl.load(ws_ptr + pid * WS + W_M)
        lst = lst_ptr + pid * CHUNK
        n_gt = gt_before
        n_eq = eq_before
        for i0 in range(0, m, LB):
            i = i0 + tl.arange(0, LB)
            v = tl.load(lst + i, mask=i < m, other=0)
            q = v >> 16
            gt = (i < m) & (q > p16)
            eq = (i < m) & (q == p16)
            both = gt.to(tl.int32) * 65536 + eq.to(tl.int32)  # one scan: above (bit 16 up), equal
            ex = tl.cumsum(both, 0) - both
            e = n_eq + (ex & 0xFFFF)
            sel = gt | (eq & (e < need_eq))
            pos = n_gt + (ex >> 16) + tl.minimum(e, need_eq)
            tl.store(out_row + pos, c * CHUNK + (v & 0xFFFF), mask=sel)
            tot = tl.sum(both, 0)
            n_gt += tot >> 16
            n_eq += tot & 0xFFFF
    elif c == 0:  # rows the two digits leave open: this program does the whole row
        lo = p16 << 16
        hi = lo | 0xFFFF
        if mode == OVERFLOW:
            lo = tl.full([], NONE + 1, tl.int32)
            hi = tl.load(r + R_HI_OV)
            need_eq = tl.load(r + R_NEED_OV)
        n_sel = _row_fallback(x_ptr + row.to(tl.int64) * x_st, out_row, n, lo, hi, need_eq, FB_CHUNK)
    if c == 0:
        kk = tl.minimum(k, n)
        for p0 in range(0, kk, KB):
            p = p0 + tl.arange(0, KB)
            tl.store(out_row + p, tl.full([KB], -1, tl.int32), mask=(p >= n_sel) & (p < kk))


SPLIT_MAX_CHUNK = 16384  # offsets and counts packed in 16 bits; rows up to 128 chunks (2M values)


def _split_plan(t: int, n: int) -> tuple[int, int, int]:
    """(chunk, sub, num_warps): about 1024 programs in all, chunks of 1K-4K values (more for rows of
    over 512K), at most 128 per row, 32 values per thread (the digit launch: 16, `sub` at a time)."""
    chunk = min(4096, max(1024, triton.next_power_of_2(triton.cdiv(t * n, 1024))))
    while triton.cdiv(n, chunk) > 128:
        chunk *= 2
    chunk = min(chunk, max(128, triton.next_power_of_2(n)))
    nw = max(4, chunk // 1024)
    return chunk, min(chunk, 512 * nw), nw


def _launch_split(x: torch.Tensor, k: int, out: torch.Tensor) -> None:
    t, n = x.shape
    chunk, sub, nw = _split_plan(t, n)
    assert chunk <= SPLIT_MAX_CHUNK, f"split top-k takes rows of up to {128 * SPLIT_MAX_CHUNK} values"
    C = triton.cdiv(n, chunk)
    cp = max(2, triton.next_power_of_2(C))
    kb = min(1024, max(128, triton.next_power_of_2(min(k, n))))
    ws = torch.empty(t * C * WS.value, dtype=torch.int32, device=x.device)
    rs = torch.empty(t * RS.value, dtype=torch.int32, device=x.device)
    lst = torch.empty(t * C * chunk, dtype=torch.int32, device=x.device)
    grid, even, lb = (t * C,), n % chunk == 0, min(chunk, 512)
    _split_hist_kernel[grid](x, x.stride(0), ws, n, C, CHUNK=chunk, EVEN=even, num_warps=nw)
    _split_digit_kernel[grid](x, x.stride(0), ws, rs, lst, n, C, k, CHUNK=chunk, SUB=sub, CP=cp,
                              LB=lb, EVEN=even, num_warps=nw)
    _split_write_kernel[grid](x, x.stride(0), ws, rs, lst, out, out.stride(0), n, C, k, CHUNK=chunk, CP=cp,
                              LB=lb, KB=kb, FB_CHUNK=256 * nw, num_warps=nw)


def _topk_variant(t: int, n: int) -> str:
    """Default implementation by shape (estimates until the H200 variant rows are in: "split" is
    ahead at 64 x 64K, 1 x 64K, 64 x 16K and 8192 x 4K)."""
    return "split" if n <= 128 * SPLIT_MAX_CHUNK else "cta"


@topk_select.triton_impl
def topk_select_triton(scores, k, variant=None):
    """`variant`: None (by shape), "split" or "cta" (see the module docstring)."""
    t, n = scores.shape
    out = torch.empty(t, min(k, n), dtype=torch.int32, device=scores.device)
    if t == 0 or n == 0 or k <= 0:
        return out
    variant = variant or _topk_variant(t, n)
    if variant == "split":
        _launch_split(scores if scores.stride(1) == 1 else scores.contiguous(), k, out)
    elif variant == "cta":
        _launch_topk(scores, k, out, nan_top=False, mask_out=False)
    else:
        raise ValueError(f"unknown topk_select variant {variant!r}")
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
