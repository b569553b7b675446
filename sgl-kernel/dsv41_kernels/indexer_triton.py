"""Triton indexer kernels: FP4 query quantization and paged scores from the FP4 index-key pool.

index_query_quant: RoPE on the last rd dims, stage 1 (UE8M0 fake quant per 32), stage 2 (the 68-byte
packer's codes and scale), dequantized back to bf16, bitwise: the index-key store's multi-row kernel
(`cache_store_triton.index_query_quant_triton`), registered here.

index_scores (default, `variant="fp8"`): program (s, t) scores positions [s * span, (s + 1) * span) of
row t, BLOCK_N keys a step (`index_scores_span` picks span). A key's 68-byte pool row is read as 17
int32 words: 16 of E2M1 nibbles and one holding the four UE8M0 group exponents (byte g = group g).
Each code word becomes two words of e4m3 bytes by bit operations (`_e4m3_bytes`: E2M1 x 2^-6 exactly;
all 256 bytes checked), and each 32-group is one fp8 MMA [BLOCK_N, 32] x [32, heads] -> P_g. The
query is brought into e4m3 once per program with one power of two 2^k per head; the partials are
combined in fp32 as acc = sum_g P_g * 2^(e_g - 126), and logit = acc * 2^(5 - k) is folded into the
head weight (wq = w * 2^(5 - k), checked exact in bf16). Then the twin's roundings: bf16(relu(logit))
(relu before the rounding gives the same value), bf16(. * w_h) as one bf16 multiply (inline PTX
`_relu_mul_bf16`: cvt.rn.relu.bf16x2.f32 + mul.rn.bf16x2), an fp32 tree sum over heads, bf16.
Why it is bitwise equal to the twin: the fast path runs only for rows whose query groups are on an
FP4-like grid (per (head, group) integer multiples z u of u = 2^(floor(log2 amax) - 3) with |z| <= 12,
which E2M1 x 2^s satisfies) and whose groups' amaxes lie within 2^14 (one e4m3 scale per head). Then
every product of one group is an integer multiple of one unit U = u 2^k 2^-7 (query z u 2^k, key
c 2^-7 with c = 2 x E2M1 in {0, 1, 2, 3, 4, 6, 8, 12}), |product| <= 12 x 12 U = 144 U < 2^8 U, and
every partial sum of the group, in any order, is at most 32 x 144 U = 4608 U < 2^13 U.
Accumulator model assumed for the fp8 MMA (conservative; DeepSeek-V3 reports ~14 bits kept on
Hopper, others measure e8m13 sums): (a) each addend is aligned to the largest addend's leading bit L
and truncated to a multiple of 2^(L - 13); (b) the running sum keeps 13 significant bits, truncating.
(a) is exact here: L <= 7 + log2 U, so 2^(L - 13) <= 2^-6 U divides U. (b) is exact: every running
sum is an integer multiple of U below 2^13 U, i.e. 13 significant bits. So P_g is exact (checked on
CPU by emulating both models over the test grid's fast-path rows: no partial changes). The four
scaled partials add exactly in fp32 unless the groups' scale pairs span more than ~2^10, where the
twin's own fp32 dot rounds too (in some order). The head sum is NOT order-free: its terms are bf16
values of any span, the twin's fp32 sum rounds when they span more than ~2^11 (common), and bf16 of
that sum then depends on the summation order when it lies within a few fp32 ulps of a bf16 rounding
midpoint (1 of ~770k scores in six t=64 random test cases; e.g. terms whose exact sum is
5423.998 = midpoint 5424 - 3.5 fp32 ulp: the twin on the GPU gave 5440 (sequential or 4-accumulator
fp32 orders reach 5424.0, a tie, to even: 5440), this kernel's halving tree 5423.998 -> 5408, as the
CPU twin and the correctly rounded value). No query guard can remove that: the twin itself has no
fixed order (the previous kernel shares the caveat). Other rows (NaN / inf, off-grid queries, wider
spans) run the bf16 kernel's math, 32 keys a step. A key with an exponent byte >= 254 scores NaN (255 is the packer's NaN scale; it never writes 254).
Pools whose rows are not 4-byte aligned, and d != 128, use `variant="bf16"`.

index_scores, `variant="bf16"` (the previous kernel, kept for comparison and as the fallback): one
program per (row t, block of BLOCK_N positions); keys gathered byte by byte and dequantized in registers
to bf16 (exact: E2M1 x 2^k), split into even / odd elements so that one packed byte feeds one element
of each; logits = k_even . q_even + k_odd . q_odd on the tensor cores (fp32 accumulation; exact for
FP4-grid operands unless the group scales of one dot span more than ~2^9). Same roundings after.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from dsv41_kernels.cache_store_triton import index_query_quant_triton
from dsv41_kernels.indexer import index_query_quant, index_scores
from dsv41_kernels.triton_numerics import (
    DOT_DTYPE,
    INTERPRET,
    NO_FMA,
    bf16_round,
    e2m1_value,
    e8m0_value,
    next_pow2,
)


# index_query_quant is the key store's kernel in its dequantizing mode (cache_store_triton.py).
index_query_quant.triton_impl(index_query_quant_triton)


# ---------------------------------------------------------------------------------- index_scores, bf16
@triton.jit
def _bf16_tile(q0, q1, w, pool_ptr, pool_rs, slot_row, out_row, offs, n, D: tl.constexpr, DOT_T: tl.constexpr):
    """Scores of positions `offs` from bf16-dequantized keys (the previous kernel's math). q0 / q1: the
    row's even / odd query elements [D/2, HP] (DOT_T), w fp32 [HP]."""
    slots = tl.load(slot_row + offs, mask=offs < n, other=-1).to(tl.int64)
    valid = slots >= 0
    NB: tl.constexpr = D // 2  # packed bytes per key
    col = tl.arange(0, NB)[None, :]
    row_ptr = pool_ptr + slots[:, None] * pool_rs
    kb = tl.load(row_ptr + col, mask=valid[:, None], other=0).to(tl.int32)  # [BLOCK_N, D/2]
    se = tl.load(row_ptr + NB + col // 16, mask=valid[:, None], other=127)  # 32-group exponent
    s = e8m0_value(se)
    k0 = (e2m1_value(kb & 15) * s).to(DOT_T)  # exact
    k1 = (e2m1_value(kb >> 4) * s).to(DOT_T)
    logits = tl.dot(k0, q0)
    logits = tl.dot(k1, q1, logits)  # [BLOCK_N, HP] fp32
    lg = bf16_round(logits)
    lg = tl.where(lg < 0.0, 0.0, lg)
    sc = bf16_round(tl.sum(bf16_round(lg * w[None, :]), 1))
    sc = tl.where(valid, sc, float("-inf"))
    tl.store(out_row + offs, sc, mask=offs < n)


@triton.jit
def _bf16_query(q_row, hm, D: tl.constexpr, DOT_T: tl.constexpr):
    """The row's queries [1, HP] pointers -> even / odd elements [D/2, HP] as DOT_T."""
    e = 2 * tl.arange(0, D // 2)[:, None]
    q0 = tl.load(q_row + e, mask=hm[None, :], other=0.0).to(DOT_T)
    q1 = tl.load(q_row + e + 1, mask=hm[None, :], other=0.0).to(DOT_T)
    return q0, q1


@triton.jit
def _index_scores_kernel(
    q_ptr, q_st, q_sh, w_ptr, w_st, pool_ptr, pool_rs, slot_ptr, slot_st, out_ptr, out_st, n,
    H: tl.constexpr, HP: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, DOT_T: tl.constexpr,
):
    t = tl.program_id(1).to(tl.int64)
    offs = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    h = tl.arange(0, HP)
    hm = h < H
    q0, q1 = _bf16_query(q_ptr + t * q_st + h[None, :] * q_sh, hm, D, DOT_T)
    w = tl.load(w_ptr + t * w_st + h, mask=hm, other=0.0).to(tl.float32)
    _bf16_tile(q0, q1, w, pool_ptr, pool_rs, slot_ptr + t * slot_st, out_ptr + t * out_st, offs, n, D, DOT_T)


def _index_scores_bf16(q, w, pool, slot_table, block_n: int = 128, num_warps: int = 4):
    t, hi, d = q.shape
    n = slot_table.size(1)
    out = torch.empty(t, n, dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(n, block_n), t)
    _index_scores_kernel[grid](
        q, q.stride(0), q.stride(1), w, w.stride(0), pool, pool.stride(0), slot_table, slot_table.stride(0),
        out, out.stride(0), n, H=hi, HP=max(16, next_pow2(hi)), D=d, BLOCK_N=block_n, DOT_T=DOT_DTYPE, num_warps=num_warps, **NO_FMA,
    )
    return out


# ---------------------------------------------------------------------------------- index_scores, fp8
@triton.jit
def _e4m3_bytes(W):
    """int32 [BN, 4] = the 16 code bytes of one 32-group (byte = even element | odd element << 4)
    -> fp8 e4m3 [BN, 32] holding E2M1 x 2^-6 exactly, in the K order
    kappa = 8 j + 4 half + b  <->  element 8 j + 2 b + half  (word j, byte b, half 0 = low nibble).
    Written so that the compiler keeps each 32-bit word whole (no byte moves)."""
    lo = ((W & 0x08080808) << 4) | ((W & 0x07070707) << 2)  # sign 3 -> 7, magnitude 2..0 -> 4..2
    hi = (W & -0x7F7F7F80) | ((W >> 2) & 0x1C1C1C1C)  # sign 7 stays, magnitude 6..4 -> 4..2
    X = tl.join(lo, hi)  # [BN, 4, 2]
    b0 = (X & 0xFF).to(tl.int8)
    b1 = ((X >> 8) & 0xFF).to(tl.int8)
    b2 = ((X >> 16) & 0xFF).to(tl.int8)
    b3 = ((X >> 24) & 0xFF).to(tl.int8)
    B = tl.join(tl.join(b0, b2), tl.join(b1, b3))  # last two dims (d3, d4) hold byte 2 d3 + d4
    return tl.reshape(B, (X.shape[0], 32)).to(tl.float8e4nv, bitcast=True)


@triton.jit
def _query_group(q_row, g: tl.constexpr, el, hm):
    """Group g of the row's queries in the K order of `_e4m3_bytes` -> fp32 [32, HP] (NaN kept)."""
    return tl.load(q_row + 32 * g + el[:, None], mask=hm[None, :], other=0.0).to(tl.float32)


@triton.jit
def _query_exponent(x):
    """Biased exponent E of each head's amax [HP] (0: all zero; 255: NaN or inf) and whether every value
    is an integer multiple of u = 2^(E - 130) of magnitude <= 12 u (int32 scalar). FP4-grid groups
    (E2M1 x 2^s: amax 1 or 1.5 x 2^(E - 127)) pass; that bound is what keeps the group's fp8 MMA exact."""
    e = tl.max(tl.where(x != x, float("inf"), tl.abs(x)), 0).to(tl.int32, bitcast=True) >> 23
    z = x * ((257 - tl.maximum(e, 3)) << 23).to(tl.float32, bitcast=True)[None, :]  # x / u
    return e, tl.min(((tl.floor(z) == z) & (tl.abs(z) <= 12.0)).to(tl.int32))


@triton.jit
def _query_e4m3(x, f):
    """fp32 [32, HP] * f [HP] -> (e4m3 [32, HP], 1 if every value converted exactly else 0)."""
    y = x * f[None, :]
    y8 = y.to(tl.float8e4nv)
    return y8, tl.min((y8.to(tl.float32) == y).to(tl.int32))


@triton.jit
def _key_group(prow, valid, g: tl.constexpr, Qg, ex1, acc, FIRST: tl.constexpr):
    """acc + P_g * 2^(e_g - 126): P_g = the keys' group g (fp8 MMA with Qg), e_g + 1 = byte g of ex1."""
    W = tl.load(prow[:, None] + 4 * g + tl.arange(0, 4)[None, :], mask=valid[:, None], other=0)
    P = tl.dot(_e4m3_bytes(W), Qg)  # [BN, HP] fp32, exact
    if g == 3:
        ks = ((ex1 >> 1) & 0x7F800000).to(tl.float32, bitcast=True)
    else:
        ks = ((ex1 << (23 - 8 * g)) & 0x7F800000).to(tl.float32, bitcast=True)
    if FIRST:
        return P * ks[:, None]
    return tl.fma(P, ks[:, None], acc)  # the product is exact: = P * ks + acc


@triton.jit
def _relu_mul_bf16(x, w):
    """fp32 x, bf16 w (same shape) -> fp32 holding bf16(bf16(relu(x)) * w), RNE; NaN x -> NaN (GPU only)."""
    return tl.inline_asm_elementwise(
        """{
        .reg .b32 t;
        cvt.rn.relu.bf16x2.f32 t, $3, $2;
        mul.rn.bf16x2 t, t, $4;
        shl.b32 $0, t, 16;
        and.b32 $1, t, 0xffff0000;
        }""",
        "=r,=r,r,r,r", [x, w], dtype=tl.float32, is_pure=True, pack=2)


@triton.jit
def _fp8_loop(Q0, Q1, Q2, Q3, wq, pool_ptr, pool_rw, slot_row, out_row, lo, hi, n,
              BLOCK_N: tl.constexpr, NUM_STAGES: tl.constexpr, NATIVE: tl.constexpr, ASM: tl.constexpr):
    for i in tl.range(lo, hi, BLOCK_N, num_stages=NUM_STAGES):
        offs = i + tl.arange(0, BLOCK_N)
        slots = tl.load(slot_row + offs, mask=offs < n, other=-1).to(tl.int64)
        valid = slots >= 0
        prow = pool_ptr + slots * pool_rw
        ex = tl.load(prow + 16, mask=valid, other=0)  # the four group exponent bytes
        ex1 = ex + 0x01010101  # e + 1 per byte: 2^(e - 126) is a normal fp32 for e = 0..253
        acc = _key_group(prow, valid, 0, Q0, ex1, 0.0, True)
        acc = _key_group(prow, valid, 1, Q1, ex1, acc, False)
        acc = _key_group(prow, valid, 2, Q2, ex1, acc, False)
        acc = _key_group(prow, valid, 3, Q3, ex1, acc, False)
        if ASM:  # per pair: cvt.rn.relu.bf16x2.f32, mul.rn.bf16x2, then both halves back to fp32
            sc = tl.sum(_relu_mul_bf16(acc, tl.broadcast_to(wq[None, :], acc.shape)), 1).to(tl.bfloat16).to(tl.float32)
        elif NATIVE:  # cvt.rn.bf16x2.f32 and a bf16 multiply: RNE, as the twin
            lg = tl.maximum(acc, 0.0).to(tl.bfloat16)
            sc = tl.sum((lg * wq[None, :]).to(tl.float32), 1).to(tl.bfloat16).to(tl.float32)
        else:  # the interpreter truncates fp32 -> bf16: round by bits
            lg = bf16_round(tl.where(acc < 0.0, 0.0, acc))
            sc = bf16_round(tl.sum(bf16_round(lg * wq[None, :]), 1))
        # NaN for a key with an exponent byte >= 254 (NaN scale; its partials above are garbage)
        x = ex | 0x01010101
        sc = tl.where(((~x - 0x01010101) & x & -0x7F7F7F80) != 0, float("nan"), sc)
        sc = tl.where(valid, sc, float("-inf"))
        tl.store(out_row + offs, sc, mask=offs < n)


@triton.jit
def _index_scores_fp8_kernel(
    q_ptr, q_st, q_sh, w_ptr, w_st, pool_ptr, pool_rw, slot_ptr, slot_st, out_ptr, out_st, n, span,
    H: tl.constexpr, HP: tl.constexpr, BLOCK_N: tl.constexpr, NUM_STAGES: tl.constexpr, NATIVE: tl.constexpr,
    ASM: tl.constexpr, DOT_T: tl.constexpr,
):
    t = tl.program_id(1).to(tl.int64)
    lo = tl.program_id(0) * span
    hi = tl.minimum(lo + span, n)
    h = tl.arange(0, HP)
    hm = h < H
    kap = tl.arange(0, 32)
    el = 8 * (kap // 8) + 2 * (kap % 4) + (kap // 4) % 2  # element of K index kappa (see _e4m3_bytes)
    q_row = q_ptr + t * q_st + h[None, :] * q_sh
    e0, g0 = _query_exponent(_query_group(q_row, 0, el, hm))
    e1, g1 = _query_exponent(_query_group(q_row, 1, el, hm))
    e2, g2 = _query_exponent(_query_group(q_row, 2, el, hm))
    e3, g3 = _query_exponent(_query_group(q_row, 3, el, hm))
    # one power of two 2^k per head maps its amax into [256, 512): grid values stay e4m3-exact while
    # the head's groups' amaxes are within 2^14 of each other (e4m3 subnormals reach 2^-9)
    emax = tl.maximum(tl.maximum(e0, e1), tl.maximum(e2, e3))
    k = tl.where(emax > 0, tl.minimum(tl.maximum(135 - emax, -100), 100), 0)
    f = ((k + 127) << 23).to(tl.float32, bitcast=True)
    Q0, ok0 = _query_e4m3(_query_group(q_row, 0, el, hm), f)  # reloaded (L1): fewer live registers
    Q1, ok1 = _query_e4m3(_query_group(q_row, 1, el, hm), f)
    Q2, ok2 = _query_e4m3(_query_group(q_row, 2, el, hm), f)
    Q3, ok3 = _query_e4m3(_query_group(q_row, 3, el, hm), f)
    w = tl.load(w_ptr + t * w_st + h, mask=hm, other=0.0).to(tl.float32)
    # logit = acc * 2^(5 - k): 2^-k undoes the query scale, 2^5 = 2^6 (key bytes) / 2 (ex1's +1)
    wq = w * ((132 - k) << 23).to(tl.float32, bitcast=True)
    w_ok = tl.min(((bf16_round(wq) == wq) & (wq * ((122 + k) << 23).to(tl.float32, bitcast=True) == w)).to(tl.int32))
    ok = g0 & g1 & g2 & g3 & ok0 & ok1 & ok2 & ok3 & w_ok
    slot_row = slot_ptr + t * slot_st
    out_row = out_ptr + t * out_st
    if ok != 0:
        if NATIVE:
            _fp8_loop(Q0, Q1, Q2, Q3, wq.to(tl.bfloat16), pool_ptr, pool_rw, slot_row, out_row, lo, hi, n, BLOCK_N,
                      NUM_STAGES, NATIVE, ASM)
        else:
            _fp8_loop(Q0, Q1, Q2, Q3, wq, pool_ptr, pool_rw, slot_row, out_row, lo, hi, n, BLOCK_N, NUM_STAGES, NATIVE, False)
    else:  # queries off the FP4 grid, NaN / inf, groups spanning > 2^14: the bf16 kernel's math (rare)
        q0, q1 = _bf16_query(q_row, hm, 128, DOT_T)
        pool8 = pool_ptr.to(tl.pointer_type(tl.uint8))
        for i in range(lo, hi, 32):
            _bf16_tile(q0, q1, w, pool8, 4 * pool_rw, slot_row, out_row, i + tl.arange(0, 32), n, 128, DOT_T)


@functools.lru_cache(maxsize=None)
def _num_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1


def index_scores_span(t: int, n: int, device: torch.device, block_n: int = 128, num_warps: int = 4,
                      tiles: int | None = None) -> int:
    """Positions per program of the fp8 kernel: `tiles` block_n-steps. By default the count that
    minimises waves x (steps + 2.5), the query preparation costing about 2.5 steps, with 16 resident
    warps per SM (127 registers a thread at block_n = 128, 4 warps)."""
    n_tiles = triton.cdiv(n, block_n)
    if tiles is None:
        slots = _num_sms(device) * max(1, 16 // num_warps)
        cost = {c: triton.cdiv(t * triton.cdiv(n_tiles, c), slots) * (min(c, n_tiles) + 2.5) for c in (1, 2, 4, 8, 16, 32, 64)}
        tiles = min(cost, key=lambda c: (cost[c], c))
    return max(1, min(n_tiles, tiles)) * block_n


def _pool_words(pool: torch.Tensor) -> torch.Tensor | None:
    """int32 view [S, 17] of a 68-byte-row pool, or None when its rows are not 4-byte aligned."""
    if pool.size(1) != 68 or pool.stride(1) != 1 or pool.stride(0) % 4 or pool.data_ptr() % 4:
        return None
    return pool.view(torch.int32)


@index_scores.triton_impl
def index_scores_triton(q, w, pool, slot_table, chunk: int = 64, variant: str = "fp8", block_n: int | None = None,
                        num_warps: int = 4, num_stages: int = 2, tiles: int | None = None, maxnreg: int | None = 128,
                        asm_epilogue: bool = True):
    """`variant` "fp8" (default; "bf16" is used instead when d != 128 or the pool rows are not 4-byte
    aligned) or "bf16" (the previous kernel). block_n / num_warps / num_stages / tiles (block_n steps per
    program) / maxnreg (register cap; the default block_n = 128, 4 warps needs 127, 4 programs an SM)
    are launch knobs for the benchmark (defaults: the fastest of the H200 sweep at t=64 / 64K, 310 us vs
    442 us for stages 3 without a register cap, benchmark/results/2026-11-29-h200-kernels.md); asm_epilogue=False replaces the inline-PTX relu / bf16 multiply
    (`_relu_mul_bf16`) by Triton ops (same values, ~9% more instructions). slot_table may also be int32
    (half the table bytes)."""
    t, hi, d = q.shape
    n = slot_table.size(1)
    assert pool.dtype == torch.uint8 and pool.size(1) == d // 2 + d // 32 and d % 32 == 0 and d >= 32
    assert q.dtype == torch.bfloat16 and w.shape == (t, hi) and slot_table.size(0) == t
    assert slot_table.dtype in (torch.int64, torch.int32) and variant in ("fp8", "bf16")
    if t == 0 or n == 0:
        return torch.empty(t, n, dtype=torch.float32, device=q.device)
    if q.stride(2) != 1:
        q = q.contiguous()
    slot_table = slot_table if slot_table.stride(1) == 1 else slot_table.contiguous()
    w = w if w.stride(1) == 1 else w.contiguous()
    words = _pool_words(pool) if variant == "fp8" and d == 128 else None
    if words is None:
        return _index_scores_bf16(q, w, pool, slot_table, block_n or 128, num_warps)
    block_n = block_n or 128
    span = index_scores_span(t, n, q.device, block_n, num_warps, tiles)
    out = torch.empty(t, n, dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(n, span), t)
    extra = {} if INTERPRET or not maxnreg else {"maxnreg": maxnreg}
    _index_scores_fp8_kernel[grid](
        q, q.stride(0), q.stride(1), w, w.stride(0), words, words.stride(0), slot_table, slot_table.stride(0),
        out, out.stride(0), n, span, H=hi, HP=max(16, next_pow2(hi)), BLOCK_N=block_n, NUM_STAGES=num_stages,
        NATIVE=not INTERPRET, ASM=asm_epilogue and not INTERPRET, DOT_T=DOT_DTYPE, num_warps=num_warps, **NO_FMA, **extra,
    )
    return out
