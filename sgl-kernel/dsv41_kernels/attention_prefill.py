"""Prefill sparse attention on library bf16 GEMMs: each row's keys gathered as exact bf16, two batched GEMMs.

`sparse_attention_paged` at prefill sizes (>= ROWS query rows; outside deterministic mode and graph
captures, `dequant_triton.bf16_path_allowed`), per chunk of C rows:
  keys  = the row's W window keys then its K compressed keys, dequantized from the pools   bf16 [C, L, D]
          (`_gather_keys_kernel`, the tile decoders of attention_tiles; invalid slots give zero keys)
  s     = q @ keys^T                      torch.bmm, fp32 out (exact bf16 products, fp32 sums)  [C, h, L]
  p     = exp(s' - m), s' = s * scale (-inf where invalid), m = max(RUN_MAX_START, max s')
  den   = sum p + exp(sink - m);  P = bf16(p)                              (`_softmax_kernel`, one pass)
  out   = bf16((P @ keys) / den)          torch.bmm, fp32 out; the division and cast in one pass
The twin (`sglang_dsv41.shared_math.attend_gathered`) visits the keys 64 at a time with a running max and rounds each
block's probabilities to bf16 against the running max of that moment; here every probability is rounded
against the row's final max. Both approximate exp(s' - m_final) with one bf16 rounding per key: checked
against the fp64 oracle, no worse than the twin (kernel_compare "attention", as for split key lists), not
bitwise; and a row's bits depend on whether its call takes this path (docs/numerics.md, "Prefill GEMMs").
On the H200 a one-pass Triton kernel ran 8K prefill rows at 42 TFLOP/s: it dequantized every key once per
program and could not keep its tensor cores busy; here the keys are dequantized once per row and the
GEMMs run at library speed. The Triton path (attention_triton: decode, deterministic mode, graph captures)
uses the same gather followed by a flash-decoding kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv41_kernels.attention_tiles import fp4_tile, window_tile
from dsv41_kernels.dequant_triton import bf16_path_allowed
from dsv41_kernels.triton_numerics import INTERPRET, bf16_round
from sglang_dsv41.shared_math import RUN_MAX_START

ROWS = 512
"""Query rows from which a call runs here."""
CHUNK_BYTES = 1 << 30
"""Gathered bf16 keys per pass (about 1600 rows of 640 keys at D = 512)."""


@triton.jit
def _gather_keys_kernel(w16_ptr, w8_ptr, w_rs, ws_ptr, ws_st, c_ptr, c_rs, cs_ptr, cs_st, out_ptr, W, K,
                        NP: tl.constexpr, BK: tl.constexpr, FAST: tl.constexpr):
    """Program (row t, block b of BK keys): keys j = b*BK .. of row t (window slots j < W, then compressed
    slots j - W; a block never mixes the two) dequantized to bf16 -> out[t, j, :] (out [T, W + K, 2 * NP]
    contiguous). Slot -1: zeros."""
    t = tl.program_id(0).to(tl.int64)
    b = tl.program_id(1)
    nwb = tl.cdiv(W, BK)
    if b < nwb:
        j = b * BK + tl.arange(0, BK)
        in_row = j < W
        slots = tl.load(ws_ptr + t * ws_st + j, mask=in_row, other=-1).to(tl.int64)
        k0, k1 = window_tile(w16_ptr, w8_ptr, w_rs, slots, slots >= 0, NP, FAST, tl.float32)
        dst = j
    else:
        jc = (b - nwb) * BK + tl.arange(0, BK)
        in_row = jc < K
        slots = tl.load(cs_ptr + t * cs_st + jc, mask=in_row, other=-1).to(tl.int64)
        k0, k1 = fp4_tile(c_ptr, c_rs, slots, slots >= 0, NP, FAST, tl.float32)
        dst = W + jc
    keys = tl.reshape(tl.join(k0, k1), [BK, 2 * NP])  # element 2p = even half p, 2p + 1 = odd half p
    col = tl.arange(0, 2 * NP)
    ptr = out_ptr + (t * (W + K) + dst.to(tl.int64))[:, None] * (2 * NP) + col[None, :]
    tl.store(ptr, keys.to(tl.bfloat16), mask=in_row[:, None])


@triton.jit
def _softmax_kernel(s_ptr, valid_ptr, sink_ptr, p_ptr, den_ptr, H, L, scale, run_max_start,
                    HB: tl.constexpr, LP: tl.constexpr):
    """Program (row t, HB heads): s fp32 [T, H, L], valid bool [T, L], sink fp32 [H] -> P bf16 [T, H, L]
    (module docstring), den fp32 [T, H]."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * HB + tl.arange(0, HB)
    j = tl.arange(0, LP)
    hm = h < H
    ok = tl.load(valid_ptr + t * L + j, mask=j < L, other=0) != 0
    rows = (t * H + h.to(tl.int64))[:, None] * L + j[None, :]
    s = tl.load(s_ptr + rows, mask=hm[:, None] & ok[None, :], other=0.0)
    s = tl.where(ok[None, :], s, float("-inf")) * scale
    m = tl.maximum(tl.max(s, 1), run_max_start)
    p = tl.exp(s - m[:, None])
    den = tl.sum(p, 1) + tl.exp(tl.load(sink_ptr + h, mask=hm, other=0.0) - m)
    tl.store(p_ptr + rows, bf16_round(p).to(tl.bfloat16), mask=hm[:, None] & (j < L)[None, :])
    tl.store(den_ptr + t * H + h, den, mask=hm)


@triton.jit
def _normalize_kernel(num_ptr, den_ptr, out_ptr, D: tl.constexpr):
    """Program (row t, head h): out[t, h, :] = bf16(num[t, h, :] / den[t, h]) (IEEE division, RNE cast);
    num fp32 [T, H, D], den fp32 [T, H], out bf16 [T, H, D], all contiguous."""
    r = tl.program_id(0).to(tl.int64)
    col = tl.arange(0, D)
    num = tl.load(num_ptr + r * D + col)
    tl.store(out_ptr + r * D + col, bf16_round(tl.math.div_rn(num, tl.load(den_ptr + r))).to(tl.bfloat16))


def prefill_rows(t: int, device: torch.device) -> bool:
    """Whether a call of t query rows runs here."""
    return t >= ROWS and bf16_path_allowed(device)


def _bmm32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """bf16 [C, M, K] @ bf16 [C, K, N] -> fp32 [C, M, N] with fp32 accumulation (CPU: on widened copies,
    which the bf16 products are exactly)."""
    if a.is_cuda:
        return torch.bmm(a, b, out_dtype=torch.float32)
    return torch.bmm(a.float(), b.float())


def gather_keys(window_pool, window_slots, comp_pool, comp_slots) -> torch.Tensor:
    """-> bf16 [T, W + K, D] (module docstring); comp_slots may be None or have no columns."""
    t, w = window_slots.shape
    d = window_pool.size(1) * 32 // 33
    kk = 0 if comp_slots is None else comp_slots.size(1)
    out = torch.empty(t, w + kk, d, dtype=torch.bfloat16, device=window_pool.device)
    if t and w + kk:
        if not kk:
            comp_pool, comp_slots = window_pool, window_slots  # never read
        bk = 16  # keys per program: [16, D] fp32 in registers (64 keys spilled at D = 512)
        _gather_keys_kernel[(t, triton.cdiv(w, bk) + triton.cdiv(kk, bk))](
            window_pool.view(torch.int16), window_pool, window_pool.stride(0), window_slots, window_slots.stride(0),
            comp_pool, comp_pool.stride(0), comp_slots, comp_slots.stride(0), out, w, kk,
            NP=d // 2, BK=bk, FAST=not INTERPRET, num_warps=4)
    return out


def attention_bf16(q, window_pool, window_slots, comp_pool, comp_slots, sink, scale) -> torch.Tensor:
    """`sparse_attention_paged`'s contract (slots contiguous int64) -> bf16 [T, h, D]."""
    t, h, d = q.shape
    kk = 0 if comp_slots is None else comp_slots.size(1)
    n_keys = window_slots.size(1) + kk
    out = torch.empty(t, h, d, dtype=torch.bfloat16, device=q.device)
    sink = sink.float().contiguous()
    if n_keys == 0:  # no key at all: the twin's 0 / exp(sink - RUN_MAX_START)
        return out.zero_()
    step = max(1, CHUNK_BYTES // max(1, n_keys * d * 2))
    for lo in range(0, t, step):
        hi = min(t, lo + step)
        cs = comp_slots[lo:hi] if kk else None
        keys = gather_keys(window_pool, window_slots[lo:hi], comp_pool, cs)
        valid = window_slots[lo:hi] >= 0
        if kk:
            valid = torch.cat([valid, cs >= 0], dim=1)
        s = _bmm32(q[lo:hi], keys.transpose(1, 2))
        p = torch.empty(hi - lo, h, n_keys, dtype=torch.bfloat16, device=q.device)
        den = torch.empty(hi - lo, h, dtype=torch.float32, device=q.device)
        hb = 8
        _softmax_kernel[(hi - lo, triton.cdiv(h, hb))](s, valid.contiguous(), sink, p, den, h, n_keys, float(scale),
                                                      RUN_MAX_START, HB=hb, LP=triton.next_power_of_2(n_keys), num_warps=4)
        del s
        _normalize_kernel[((hi - lo) * h,)](_bmm32(p, keys), den, out[lo:hi], D=d, num_warps=4)
    return out


__all__ = ["CHUNK_BYTES", "ROWS", "attention_bf16", "gather_keys", "prefill_rows"]
