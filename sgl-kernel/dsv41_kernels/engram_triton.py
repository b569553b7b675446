"""Triton Engram kernels: n-gram row ids, table row gather (device or pinned host), fused gate.

engram_hash (bitwise): one program per BLOCK_T tokens; int64 multiply-XOR and a per-head prime
modulus, exactly the twin's integer arithmetic.
engram_gather (bitwise): one program per BLOCK_R rows; a row is 256 e4m3 bytes + 8 UE8M0 bytes,
dequantized in fp32 and rounded once to bf16. A pinned host table is read in place over PCIe
(zero copy: with unified addressing a pinned host pointer is valid on the device); its ids are
sorted first so that reads walk the table in address order, and rows are written back in place.
Measured on one H200 (benchmark/results/2026-12-01-h200-engram-host.md, 6.3 GB per table): these
SM reads of host memory reach ~25 GB/s of row bytes for 8192 x 24 sorted random rows whatever the
load width (16-byte or byte-wide) and also for SGLang 0.5.23's gather, ~27 GB/s for consecutive
rows, while the copy engine moves 54.8 GB/s: the limit is the SM read path over PCIe, not the
kernel's instruction mix.
engram_gate (tolerance, fp32): one program per (token, stream), two passes over H.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv41_kernels.engram import engram_gate, engram_gather, engram_hash
from dsv41_kernels.triton_numerics import INTERPRET, bf16_round, e4m3_value, e8m0_value, next_pow2


# ------------------------------------------------------------------------------------- hash
@triton.jit
def _xor(a, b):
    return a ^ b


@triton.jit
def _engram_hash_kernel(win_ptr, pos_ptr, mult_ptr, prime_ptr, off_ptr, out_ptr, T, pad_class,
                        N: tl.constexpr, NP: tl.constexpr, L: tl.constexpr, C: tl.constexpr, CP: tl.constexpr,
                        HH: tl.constexpr, BLOCK_T: tl.constexpr):
    tok = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    tm = tok < T
    s = tl.arange(0, NP)[None, :]
    w = tl.load(win_ptr + tok[:, None].to(tl.int64) * N + s, mask=tm[:, None] & (s < N), other=0).to(tl.int64)
    pos = tl.load(pos_ptr + tok, mask=tm, other=0).to(tl.int64)
    dead = ((w < 0) | (pos[:, None] < s)) & (s < N)
    blocked = tl.cumsum(dead.to(tl.int32), 1) > 0
    cls = tl.where(blocked, pad_class, w)
    c = tl.arange(0, CP)
    cm = c < C
    gram = c // HH + 1  # n-gram column i (size i + 1) of output column c
    for layer in tl.static_range(L):
        mult = tl.load(mult_ptr + layer * N + s, mask=s < N, other=0)
        r = tl.associative_scan(cls * mult, 1, _xor)  # r[:, i] = XOR_{s<=i} prod_s
        ri = tl.zeros([BLOCK_T, CP], dtype=tl.int64)
        for i in tl.static_range(1, N):
            col = tl.sum(tl.where(s == i, r, 0), 1)
            ri = tl.where(gram[None, :] == i, col[:, None], ri)
        prime = tl.load(prime_ptr + layer * C + c, mask=cm, other=1)
        off = tl.load(off_ptr + layer * C + c, mask=cm, other=0)
        rows = ri % prime[None, :] + off[None, :]
        dst = out_ptr + (tok[:, None].to(tl.int64) * L + layer) * C + c[None, :]
        tl.store(dst, rows, mask=tm[:, None] & cm[None, :])


@engram_hash.triton_impl
def engram_hash_triton(windows, positions, multipliers, primes, offsets, pad_class):
    t, n = windows.shape
    nl, _, hh = primes.shape
    c = (n - 1) * hh
    out = torch.empty(t, nl, c, dtype=torch.long, device=windows.device)
    if t == 0:
        return out
    dev = windows.device
    block = 64
    _engram_hash_kernel[(triton.cdiv(t, block),)](
        windows.to(torch.long).contiguous(), positions.to(device=dev, dtype=torch.long).contiguous(),
        multipliers.to(dev).contiguous(), primes.to(dev).contiguous(), offsets.to(dev).contiguous(), out, t, int(pad_class),
        N=n, NP=next_pow2(n), L=nl, C=c, CP=next_pow2(c), HH=hh, BLOCK_T=block, num_warps=4)
    return out


# ------------------------------------------------------------------------------------- gather
@triton.jit
def _engram_gather_kernel(w_ptr, s_ptr, ids_ptr, dst_ptr, out_ptr, n, HD: tl.constexpr, G: tl.constexpr,
                          BLOCK_R: tl.constexpr, INDIRECT: tl.constexpr, FAST: tl.constexpr, RAW: tl.constexpr,
                          WIDE: tl.constexpr):
    """Rows ids[i] of (w [R, HD] e4m3 bytes, s [R, HD/32] UE8M0 bytes) -> out[dst[i]] (dst = i
    unless INDIRECT) as bf16 [HD]. RAW: w_ptr / s_ptr are int64 addresses (pinned host memory).
    WIDE (w 16-byte aligned, s 8-byte aligned): the alignment is stated to the compiler, so each
    thread reads 16 consecutive row bytes in one vector load and a warp reads 2 whole rows, i.e.
    four complete 128-byte lines (full-size PCIe reads from a host table, instead of one 32-byte
    sector per byte-wide warp load), and a row's 8 scale bytes in one 8-byte load."""
    if RAW:
        w_ptr = w_ptr.to(tl.pointer_type(tl.uint8))
        s_ptr = s_ptr.to(tl.pointer_type(tl.uint8))
    i = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    im = i < n
    rid = tl.load(ids_ptr + i, mask=im, other=0).to(tl.int64)
    if INDIRECT:
        orow = tl.load(dst_ptr + i, mask=im, other=0).to(tl.int64)
    else:
        orow = i.to(tl.int64)
    g = tl.arange(0, G)[None, :, None]
    j = tl.arange(0, 32)[None, None, :]
    m3 = im[:, None, None]
    col = g * 32 + j
    wp = w_ptr + rid[:, None, None] * HD + col  # [BLOCK_R, G, 32]
    sp = s_ptr + rid[:, None, None] * G + g  # [BLOCK_R, G, 1]
    if WIDE:
        wp = tl.max_contiguous(tl.multiple_of(wp, [16, 16, 16]), [1, 1, 16])
        sp = tl.max_contiguous(tl.multiple_of(sp, [8, 8, 1]), [1, 8, 1])
    b = tl.load(wp, mask=m3, other=0)
    e = tl.load(sp, mask=m3, other=127)
    if FAST:
        v = (b.to(tl.float8e4nv, bitcast=True).to(tl.float32) * e8m0_value(e)).to(tl.bfloat16)
    else:
        v = bf16_round(e4m3_value(b) * e8m0_value(e)).to(tl.bfloat16)
    tl.store(out_ptr + orow[:, None, None] * HD + col, v, mask=m3)


HOST_GATHER_CONFIG = (4, 2)
"""(rows per program, warps) of the pinned-host gather: 4 rows x 256 B over 64 threads, one 16-byte
load per thread. Measured on the H200 (benchmark/engram_host.py sweep): (4, 2) and (8, 4) 24.8 GB/s,
(16, 4) 21.7, (16, 8) 23.8, (32, 8) / (64, 8) ~20 (`shared`); `per_rank` alike."""
DEVICE_GATHER_CONFIG = (8, 4)


def _gather_launch(w8, s8, ids, dst, out, n, block_r, num_warps, wide=None):
    hd = w8.size(1)
    raw = w8.device.type == "cpu" and ids.is_cuda  # pinned host table: pass addresses (UVA)
    aligned = hd % 16 == 0 and (hd // 32) % 8 == 0 and w8.data_ptr() % 16 == 0 and s8.data_ptr() % 8 == 0
    wide = aligned if wide is None else (wide and aligned)
    grid = (triton.cdiv(n, block_r),)
    _engram_gather_kernel[grid](w8.data_ptr() if raw else w8, s8.data_ptr() if raw else s8, ids,
                                dst if dst is not None else ids, out, n, HD=hd, G=hd // 32, BLOCK_R=block_r,
                                INDIRECT=dst is not None, FAST=not INTERPRET, RAW=raw, WIDE=wide, num_warps=num_warps)


def gather_sorted(w8: torch.Tensor, s8: torch.Tensor, ids: torch.Tensor, out: torch.Tensor,
                  block_r: int = 0, num_warps: int = 0, wide: bool | None = None) -> None:
    """The host-table path on any device: w8 uint8 [R, hd], s8 uint8 [R, hd/32], ids int64 [n]
    sorted first (no host sync, capturable), rows read in address order and written back to their
    own rows of out bf16 [n, hd]. `wide=False` keeps byte-wide loads (the earlier kernel, for
    benchmarks); None: 16-byte loads whenever the table is aligned."""
    n = ids.numel()
    srt, order = torch.sort(ids)
    _gather_launch(w8, s8, srt, order, out, n, block_r or HOST_GATHER_CONFIG[0], num_warps or HOST_GATHER_CONFIG[1], wide)


@engram_gather.triton_impl
def engram_gather_triton(weight, scale, row_ids, block_r: int = 0, num_warps: int = 0):
    hd = weight.size(-1)
    assert hd % 32 == 0 and hd & (hd - 1) == 0 and scale.shape == (weight.size(0), hd // 32)
    assert weight.is_contiguous() and scale.is_contiguous()
    dev = row_ids.device
    out = torch.empty(*row_ids.shape, hd, dtype=torch.bfloat16, device=dev)
    ids = row_ids.reshape(-1)
    n = ids.numel()
    if n == 0:
        return out
    w8, s8 = weight.view(torch.uint8), scale.view(torch.uint8)
    if weight.device.type == "cpu" and dev.type == "cuda":  # pinned host table: reads in address order
        assert weight.is_pinned() and scale.is_pinned(), "a host Engram table must be pinned"
        gather_sorted(w8, s8, ids, out.view(n, hd), block_r, num_warps)
        return out
    _gather_launch(w8, s8, ids.contiguous(), None, out.view(n, hd), n, block_r or DEVICE_GATHER_CONFIG[0],
                   num_warps or DEVICE_GATHER_CONFIG[1])
    return out


# ------------------------------------------------------------------------------------- gate
@triton.jit
def _engram_gate_kernel(h_ptr, kv_ptr, qw_ptr, kw_ptr, mask_ptr, out_ptr, eps, HID, NS: tl.constexpr,
                        HAS_MASK: tl.constexpr, CHUNK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1)
    h_row = h_ptr + (t * NS + j) * HID
    k_row = kv_ptr + t * (NS + 1) * HID + j * HID
    v_row = kv_ptr + t * (NS + 1) * HID + NS * HID
    sh = tl.zeros([CHUNK], dtype=tl.float32)
    sk = tl.zeros([CHUNK], dtype=tl.float32)
    sd = tl.zeros([CHUNK], dtype=tl.float32)
    for c0 in range(0, HID, CHUNK):
        c = c0 + tl.arange(0, CHUNK)
        cm = c < HID
        h = tl.load(h_row + c, mask=cm, other=0.0).to(tl.float32)
        k = tl.load(k_row + c, mask=cm, other=0.0).to(tl.float32)
        w = tl.load(qw_ptr + j * HID + c, mask=cm, other=0.0).to(tl.float32) * tl.load(kw_ptr + j * HID + c, mask=cm, other=0.0).to(tl.float32)
        sh += h * h
        sk += k * k
        sd += h * w * k
    hf = HID * 1.0
    rstd = tl.math.rsqrt(tl.sum(sh, 0) / hf + eps) * tl.math.rsqrt(tl.sum(sk, 0) / hf + eps)
    d = tl.sum(sd, 0) * rstd * (1.0 / tl.sqrt_rn(hf))
    a = tl.sqrt_rn(tl.maximum(tl.abs(d), 1e-6))
    gate = tl.sigmoid(tl.where(d < 0, -a, a))
    if HAS_MASK:
        gate = tl.where(tl.load(mask_ptr + t) != 0, gate, 0.0)
    o_row = out_ptr + (t * NS + j) * HID
    for c0 in range(0, HID, CHUNK):
        c = c0 + tl.arange(0, CHUNK)
        cm = c < HID
        h = tl.load(h_row + c, mask=cm, other=0.0).to(tl.float32)
        v = tl.load(v_row + c, mask=cm, other=0.0).to(tl.float32)
        tl.store(o_row + c, bf16_round(h + gate * v).to(tl.bfloat16), mask=cm)


@engram_gate.triton_impl
def engram_gate_triton(streams, kv, q_weight, k_weight, eps, token_mask=None):
    t, ns, hid = streams.shape
    assert kv.shape == (t, (ns + 1) * hid) and q_weight.shape == k_weight.shape == (ns, hid)
    out = torch.empty_like(streams)
    if t == 0:
        return out
    mask = token_mask.to(torch.int8).contiguous() if token_mask is not None else streams
    _engram_gate_kernel[(t, ns)](
        streams.contiguous(), kv.contiguous(), q_weight.contiguous(), k_weight.contiguous(), mask, out, float(eps), hid,
        NS=ns, HAS_MASK=token_mask is not None, CHUNK=min(1024, next_pow2(hid)), num_warps=4)
    return out
