"""Triton block-scaled GEMMs for Hopper (sm_90): MXFP8 activations x FP8 / MXFP4 weights.

The structure of the twins (`dsv41_kernels.gemm`, docs/numerics.md):
1. `_mxfp8_quant_kernel`: x [M, K] -> q e4m3 [M, K] + scales fp32 [K/32, M] (transposed, so that the
   GEMM reads a tile's row scales contiguously). Bytes and scales equal `mxfp8_quant` bitwise.
2. `_scaled_mm_kernel`: per [BM, BN] output tile, for each 32-wide K block kb in K order:
       p = fp8 dot(q[:, kb], w[:, kb]^T)             fresh fp32 partial (one K=32 tensor-core MMA)
       acc = fma(p, a_s[m, kb] * w_s[n, kb], acc)     power-of-two scales: p * s is exact, so this
                                                      equals the twin's (p * a_s) * w_s then add
                                                      (unless a scale product leaves fp32's normal range)
   and one bf16 rounding at the end. SUB blocks (<= 4, i.e. BK = 128) are unrolled per iteration, and
   their scales are loaded one iteration ahead: Triton pipelines only the dot operands, and a scale load
   waited on in its own iteration stalled every iteration for a memory latency (H200 decode GEMMs ran at
   5-20% of HBM bandwidth).
   W4A8: packed E2M1 nibbles (low = even element) become E4M3 bytes of the value times 2**-6 in
   registers (four bit operations per 4 bytes, `e2m1_block_e4m3`), then the same fp8 dot; the 2**6
   goes into the activation scale (exact, so the bits are those of an unshifted conversion).
The same per-element arithmetic in every tile config and in the ordered split-K (`_block_partials_kernel`
writes each block's scaled partial, `_ordered_sum_kernel` adds them in K order): an output element depends
only on its own row of x and column of w (batch invariant). Outside deterministic mode, decode calls (up
to FOLD_ROWS rows) run the folded split-K instead: K-order sums over chunks of blocks, then the chunk sums
in order, so a row's bits depend on its call's chunk count (docs/numerics.md, "Decode GEMMs").
The only difference from the twin is the 32-term partial: the twin takes the exact sum of the 32 products
rounded once to fp32 (docs/numerics.md choice 4b), the tensor core its own internal order and width,
like DeepSeek's GPU kernel (test/kernels/test_gemm_gpu.py states the bound). Reproducing the sequential
order here would take the partials off the tensor cores.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv41_kernels.dequant_triton import bf16_path_allowed, fp4_weight_bf16, fp8_weight_bf16, mxfp8_qdq
from dsv41_kernels.gemm import fp4_linear, fp8_linear
from dsv41_kernels.triton_numerics import INTERPRET, NO_FMA, bf16_round, e4m3_byte, e8m0_value, max_nan, ue8m0_ceil
from sglang_dsv41.determinism import deterministic

BLOCK = 32  # MX group along K (activations and weights)
K_EVENS_FIRST = tuple(range(0, BLOCK, 2)) + tuple(range(1, BLOCK, 2))
"""An order of a 32-block's elements: position p holds element K_EVENS_FIRST[p]. A dot product over one
block is the same sum of the same 32 products in any order; the grouped MoE multiplies both operands in
this order (`e2m1_block_e4m3_evens_first`), which its weights' nibble packing gives for free."""


# ---------------------------------------------------------------------------------- kernels
@triton.jit
def _mxfp8_quant_kernel(x_ptr, x_rs, q_ptr, s_ptr, M, KB, G, z_ptr, NZ, BLOCK_G: tl.constexpr,
                        EVENS_FIRST: tl.constexpr = False):
    """Groups g = kb * M + m (m fastest, so scale stores are contiguous): x [M, K] (row stride x_rs,
    unit column stride) -> q uint8 [M, K] (e4m3 bytes), s fp32 [KB, M]; G = M * KB groups.
    Same bytes as quant.fp8.mxfp8_quant; EVENS_FIRST: each 32-block's bytes stored in `K_EVENS_FIRST` order.
    Also sets z int32 [NZ] to 0 (the arrival counters of the GEMM launched next, `_block_partials_kernel`
    FOLD, or the MoE's split / stream-K launches; NZ = 0: none)."""
    for i in range(tl.program_id(0) * BLOCK_G, NZ, tl.num_programs(0) * BLOCK_G):
        z = i + tl.arange(0, BLOCK_G)
        tl.store(z_ptr + z, tl.zeros([BLOCK_G], dtype=tl.int32), mask=z < NZ)
    g = tl.program_id(0).to(tl.int64) * BLOCK_G + tl.arange(0, BLOCK_G)
    ok = g < G
    m, kb = g % M, g // M
    col = kb[:, None] * 32 + tl.arange(0, 32)[None, :]
    x = tl.load(x_ptr + m[:, None] * x_rs + col, mask=ok[:, None], other=0.0).to(tl.float32)
    q, s = _mx_quant(x)
    if EVENS_FIRST:
        col = kb[:, None] * 32 + evens_first_position(tl.arange(0, 32))[None, :]
    tl.store(q_ptr + m[:, None] * (KB * 32) + col, q.to(tl.uint8), mask=ok[:, None])
    tl.store(s_ptr + g, tl.reshape(s, [BLOCK_G]), mask=ok)


@triton.jit
def _mx_quant(x):
    """One MXFP8 group per row: x fp32 [R, 32] -> (e4m3 bytes int32 [R, 32], scale fp32 [R, 1]), the bytes and
    scale of quant.fp8.mxfp8_quant (launch with NO_FMA)."""
    amax = tl.reduce(tl.abs(x), 1, max_nan, keep_dims=True)
    amax = tl.where(amax < 1e-4, 1e-4, amax)  # clamp(min=1e-4), NaN kept
    s = ue8m0_ceil(amax * (1.0 / 448.0))
    inv = tl.math.div_rn(1.0, s)  # x / s == x * (1/s) exactly for a power-of-two s
    return e4m3_byte(x * inv), s


@triton.jit
def evens_first_position(k):
    """Position of element k (0..31) of a 32-block in `K_EVENS_FIRST` order."""
    return (k % 2) * 16 + k // 2


# E2M1 -> E4M3 in four bit operations per byte: the code s e1 e0 m, placed as E4M3 bits s 000 e1 e0 m 00,
# is the E2M1 value times 2**-6 for every code (e1 e0 != 0: 2**(e-7) (1 + m/2); code 1: the E4M3
# subnormal 4/8 * 2**-6; code 0: 0; code 8: -0). The power-of-two factor is exact in every tensor-core
# partial (products of E4M3 values stay far above fp32's subnormals), and the kernels put the 2**6 back
# into the activation scale (`E2M1_UNSHIFT`), which cannot overflow (an MXFP8 scale is <= 2**120).
E2M1_UNSHIFT = tl.constexpr(64.0)
_INTERPRET = tl.constexpr(INTERPRET)
# one 32-bit register holds 4 packed bytes (pack=4): low nibbles -> lo bytes, high nibbles -> hi bytes
_E2M1_LO_ASM = tl.constexpr("{ .reg .b32 t, u; shl.b32 t, $1, 4; and.b32 t, t, 0x80808080; "
                            "shl.b32 u, $1, 2; and.b32 u, u, 0x1C1C1C1C; or.b32 $0, t, u; }")
_E2M1_HI_ASM = tl.constexpr("{ .reg .b32 t, u; and.b32 t, $1, 0x80808080; "
                            "shr.b32 u, $1, 2; and.b32 u, u, 0x1C1C1C1C; or.b32 $0, t, u; }")


@triton.jit
def _e2m1_halves(packed):
    """Packed E2M1 bytes uint8 [R, 16] -> (E4M3 bytes of the low nibbles, of the high nibbles), each
    [R, 16] uint8: the even and the odd elements, values x 2**-6."""
    if _INTERPRET:
        p = packed.to(tl.int32)
        lo = (((p << 4) & 0x80) | ((p << 2) & 0x1C)).to(tl.uint8)
        hi = ((p & 0x80) | ((p >> 2) & 0x1C)).to(tl.uint8)
    else:
        lo = tl.inline_asm_elementwise(_E2M1_LO_ASM, "=r,r", [packed], dtype=tl.uint8, is_pure=True, pack=4)
        hi = tl.inline_asm_elementwise(_E2M1_HI_ASM, "=r,r", [packed], dtype=tl.uint8, is_pure=True, pack=4)
    return lo, hi


@triton.jit
def e2m1_block_e4m3(packed):
    """Packed E2M1 bytes uint8 [R, 16] (low nibble = even element) -> float8e4nv [R, 32] in K order,
    each value the E2M1 value times 2**-6 (see above)."""
    lo, hi = _e2m1_halves(packed)
    return tl.reshape(tl.join(lo, hi), [packed.shape[0], 32]).to(tl.float8e4nv, bitcast=True)


@triton.jit
def e2m1_block_e4m3_evens_first(packed):
    """As `e2m1_block_e4m3`, but the block's 32 elements in the order k = 0, 2, .., 30, 1, 3, .., 31
    (`K_EVENS_FIRST`): the 16 even elements, then the 16 odd ones. A thread's 4 consecutive elements
    of this order are the low (or high) nibbles of 4 consecutive bytes, so the tile reaches the MMA's
    register layout with one 32-bit shared load and no byte permutes (sm_90a: 618 instead of 778
    instructions per iteration of the MoE's stage-1 decode loop, `benchmark/kernel_aot.py`)."""
    lo, hi = _e2m1_halves(packed)
    return tl.reshape(tl.permute(tl.join(lo, hi), (0, 2, 1)), [packed.shape[0], 32]).to(tl.float8e4nv, bitcast=True)


@triton.jit
def _block_operands(q_ptr, w_ptr, w_rs, sw_ptr, sw_rs, rm, rn, K, FP4: tl.constexpr):
    """Pointers of K block 0 for activation rows rm and weight rows rn: a [BM, 32] (q e4m3 [M, K]),
    w [BN, 32] e4m3 or [BN, 16] packed E2M1, and the weight scales [BN] (FP8: one per 32 x 32 tile)."""
    rk = tl.arange(0, 32)
    a_row = q_ptr + rm.to(tl.int64)[:, None] * K + rk[None, :]
    if FP4:
        w_row = w_ptr + rn.to(tl.int64)[:, None] * w_rs + tl.arange(0, 16)[None, :]
        sw_row = sw_ptr + rn.to(tl.int64) * sw_rs
    else:
        w_row = w_ptr + rn.to(tl.int64)[:, None] * w_rs + rk[None, :]
        sw_row = sw_ptr + (rn // 32).to(tl.int64) * sw_rs
    return a_row, w_row, sw_row


@triton.jit
def _block_scales(sa_ptr, sa_rs, arow, m_ok, sw_row, n_ok, kb, KB):
    """Scales of K block kb: sa fp32 [BM] (rows arow of sa [K/32, sa_rs]), sw fp32 [BN] (UE8M0 at
    sw_row + kb, decoded). A block past the last (kb >= KB, a prefetch) reads nothing: sa 0, sw 1."""
    ok = kb < KB
    sa = tl.load(sa_ptr + kb * sa_rs + arow, mask=m_ok & ok, other=0.0)
    sw = e8m0_value(tl.load(sw_row + kb, mask=n_ok & ok, other=127))
    return sa, sw


@triton.jit
def _block_partial(a_row, w_row, kb, m_ok, n_ok, sa, sw, FP4: tl.constexpr, SWAP: tl.constexpr):
    """The scaled fp32 partial of K block kb: fp8 dot of a [BM, 32] and w [BN, 32] (one K = 32 tensor-core
    MMA) times sa[m] * sw[n]; [BM, BN], or [BN, BM] with SWAP (the weight rows are the MMA's M side).
    Returns (dot, scale product) unmultiplied, so the caller can fma them into its accumulator."""
    a = tl.load(a_row + kb * 32, mask=m_ok[:, None], other=0.0)  # e4m3 [BM, 32]
    if FP4:
        b = e2m1_block_e4m3(tl.load(w_row + kb * 16, mask=n_ok[:, None], other=0))  # [BN, 32], x 2**-6
        sa = sa * E2M1_UNSHIFT
    else:
        b = tl.load(w_row + kb * 32, mask=n_ok[:, None], other=0.0)  # e4m3 [BN, 32]
    if SWAP:
        p = tl.dot(b, tl.trans(a))
        s = sw[:, None] * sa[None, :]
    else:
        p = tl.dot(a, tl.trans(b))
        s = sa[:, None] * sw[None, :]
    return p, s


@triton.jit
def _scaled_mm_kernel(
    q_ptr, sa_ptr, w_ptr, w_rs, sw_ptr, sw_rs, out_ptr, out_rs, M, N, K,
    FP4: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, SUB: tl.constexpr, GROUP_M: tl.constexpr,
    SWAP: tl.constexpr, PREFETCH: tl.constexpr,
):
    """q e4m3 [M, K] (contiguous), sa fp32 [K/32, M]; FP8: w e4m3 [N, K] (row stride w_rs), sw uint8
    [ceil(N/32), >= K/32] (row stride sw_rs); FP4: w uint8 [N, K/2], sw uint8 [N, >= K/32].
    out bf16 [M, N] (row stride out_rs). K % (32 * SUB) == 0, SUB in (1, 2, 4).
    The operand tiles are software-pipelined by Triton; with PREFETCH the scales (plain loads, which it
    does not pipeline) of the next SUB blocks are loaded one iteration ahead, so their latency hides
    behind this iteration's MMAs instead of stalling every iteration (decode tiles; in a wide tile the
    broadcast scale vectors take too many registers per thread). SWAP: the BN weight rows are the MMA's M
    side and the BM (few, decode) activation rows its N side; same products, same K-order adds."""
    pid = tl.program_id(0)
    num_m, num_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
    group = pid // (GROUP_M * num_n)  # grouped launch order: GROUP_M row tiles share weight tiles in L2
    first_m = group * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * num_n)) % size_m
    pid_n = (pid % (GROUP_M * num_n)) // size_m

    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    m_ok, n_ok = rm < M, rn < N
    a_row, w_row, sw_row = _block_operands(q_ptr, w_ptr, w_rs, sw_ptr, sw_rs, rm, rn, K, FP4)
    KB = K // 32
    if PREFETCH:  # the scales of iteration 0
        sa0, sw0 = _block_scales(sa_ptr, M, rm, m_ok, sw_row, n_ok, 0, KB)
        if SUB > 1:
            sa1, sw1 = _block_scales(sa_ptr, M, rm, m_ok, sw_row, n_ok, 1, KB)
        if SUB > 2:
            sa2, sw2 = _block_scales(sa_ptr, M, rm, m_ok, sw_row, n_ok, 2, KB)
            sa3, sw3 = _block_scales(sa_ptr, M, rm, m_ok, sw_row, n_ok, 3, KB)
    if SWAP:
        acc = tl.zeros([BN, BM], dtype=tl.float32)
    else:
        acc = tl.zeros([BM, BN], dtype=tl.float32)
    for kb0 in range(0, KB, SUB):
        # this iteration's scales: loaded the iteration before (PREFETCH) or now
        if PREFETCH:
            nsa0, nsw0 = _block_scales(sa_ptr, M, rm, m_ok, sw_row, n_ok, kb0 + SUB, KB)
            if SUB > 1:
                nsa1, nsw1 = _block_scales(sa_ptr, M, rm, m_ok, sw_row, n_ok, kb0 + SUB + 1, KB)
            if SUB > 2:
                nsa2, nsw2 = _block_scales(sa_ptr, M, rm, m_ok, sw_row, n_ok, kb0 + SUB + 2, KB)
                nsa3, nsw3 = _block_scales(sa_ptr, M, rm, m_ok, sw_row, n_ok, kb0 + SUB + 3, KB)
        # K order: acc = fma(partial, sa * sw, acc), block by block (exact scale products); one partial
        # live at a time (Triton waits for each MMA anyway, and four live [64, 128] partials spill);
        # without PREFETCH each block loads its scales just before its MMA (fewer live registers)
        if not PREFETCH:
            sa0, sw0 = _block_scales(sa_ptr, M, rm, m_ok, sw_row, n_ok, kb0, KB)
        p, s = _block_partial(a_row, w_row, kb0, m_ok, n_ok, sa0, sw0, FP4, SWAP)
        acc = tl.fma(p, s, acc)
        if SUB > 1:
            if not PREFETCH:
                sa1, sw1 = _block_scales(sa_ptr, M, rm, m_ok, sw_row, n_ok, kb0 + 1, KB)
            p, s = _block_partial(a_row, w_row, kb0 + 1, m_ok, n_ok, sa1, sw1, FP4, SWAP)
            acc = tl.fma(p, s, acc)
        if SUB > 2:
            if not PREFETCH:
                sa2, sw2 = _block_scales(sa_ptr, M, rm, m_ok, sw_row, n_ok, kb0 + 2, KB)
            p, s = _block_partial(a_row, w_row, kb0 + 2, m_ok, n_ok, sa2, sw2, FP4, SWAP)
            acc = tl.fma(p, s, acc)
            if not PREFETCH:
                sa3, sw3 = _block_scales(sa_ptr, M, rm, m_ok, sw_row, n_ok, kb0 + 3, KB)
            p, s = _block_partial(a_row, w_row, kb0 + 3, m_ok, n_ok, sa3, sw3, FP4, SWAP)
            acc = tl.fma(p, s, acc)
        if PREFETCH:
            sa0, sw0 = nsa0, nsw0
            if SUB > 1:
                sa1, sw1 = nsa1, nsw1
            if SUB > 2:
                sa2, sw2 = nsa2, nsw2
                sa3, sw3 = nsa3, nsw3
    out = bf16_round(acc).to(tl.bfloat16)  # RNE on the GPU and in the interpreter alike
    if SWAP:  # [BN, BM]
        tl.store(out_ptr + rm.to(tl.int64)[None, :] * out_rs + rn[:, None], out, mask=n_ok[:, None] & m_ok[None, :])
    else:
        tl.store(out_ptr + rm.to(tl.int64)[:, None] * out_rs + rn[None, :], out, mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _block_partials_kernel(
    x_ptr, x_rs, sa_ptr, w_ptr, w_rs, sw_ptr, sw_rs, p_ptr, M, N, K, KS, cnt_ptr, out_ptr, out_rs,
    FP4: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, SWAP: tl.constexpr, FOLD: tl.constexpr,
):
    """Split-K, pass 1 (decode, M <= BM): program (weight rows pid_n * BN.., K blocks pid_k * KS..).
    x: MXFP8 bytes e4m3 [M, K] (row stride x_rs = K), sa_ptr their scales fp32 [K/32, M] (`mxfp8_quant_t`).
    The next block's activation and weight scales are loaded one block ahead.
    Ordered (FOLD False): writes P [K/32, M, N] fp32, P[kb, m, n] = fp8 partial of block kb * (sa[m, kb] *
    sw[n, kb]) - the exact scaled partial `_scaled_mm_kernel` adds (power-of-two scales).
    FOLD (fast mode): adds its KS scaled partials in K order from +0 (acc = fma(p, s, acc), the one-pass
    kernel's step) and writes that chunk sum once: P [cdiv(K/32, KS), M, N]; the program of a weight-row
    tile that arrives last (counter cnt int32 [cdiv(N, BN)], zeroed before the launch) adds the tile's
    chunk sums in chunk order (`_fold_tile`) and writes out bf16 [M, N] (row stride out_rs).
    Weights as in `_scaled_mm_kernel`. SWAP: the weight rows are the MMA's M side (BN >= 64), the few
    activation rows its N side. Launch with NO_FMA (the accumulation is an explicit fma)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    KB = K // 32
    rm = tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    m_ok, n_ok = rm < M, rn < N
    x_row = x_ptr + rm.to(tl.int64)[:, None] * x_rs + tl.arange(0, 32)[None, :]
    _, w_row, sw_row = _block_operands(x_ptr, w_ptr, w_rs, sw_ptr, sw_rs, rm, rn, K, FP4)
    sa, sw = _block_scales(sa_ptr, M, rm, m_ok, sw_row, n_ok, pid_k * KS, KB)
    if SWAP:
        acc = tl.zeros([BN, BM], dtype=tl.float32)
    else:
        acc = tl.zeros([BM, BN], dtype=tl.float32)
    for i in range(KS):
        kb = pid_k * KS + i
        k_ok = kb < KB
        nsa, nsw = _block_scales(sa_ptr, M, rm, m_ok, sw_row, n_ok, kb + 1, KB)
        p, s = _block_partial(x_row, w_row, kb, m_ok & k_ok, n_ok & k_ok, sa, sw, FP4, SWAP)
        if FOLD:
            acc = tl.fma(p, s, acc)  # a block past the last adds fma(+0, +0, acc)
        else:
            _store_partial(p_ptr + kb.to(tl.int64) * M * N, p * s, rm, rn, m_ok, n_ok & k_ok, N, SWAP)
        sa, sw = nsa, nsw
    if FOLD:
        _store_partial(p_ptr + pid_k.to(tl.int64) * M * N, acc, rm, rn, m_ok, n_ok, N, SWAP)
        _fold_tile(p_ptr, cnt_ptr + pid_n, out_ptr, out_rs, rm, rn, m_ok, n_ok, M, N, tl.num_programs(1), BM, BN)


@triton.jit
def _fold_tile(p_ptr, cnt, out_ptr, out_rs, rm, rn, m_ok, n_ok, M, N, C, BM: tl.constexpr, BN: tl.constexpr):
    """Arrival at a tile's counter (after this program's chunk sum is stored); the C-th arrival adds the
    tile's C chunk sums of P [C, M, N] in chunk order from +0 (the sum of `_ordered_sum_kernel`) and
    writes bf16 out[rm, rn]. Ordering: the barrier puts every thread's stores before thread 0's
    acq_rel atomic (a release, cumulative over the block), whose acquire orders the last program's
    loads after every other program's release; the loads bypass L1 (.cg)."""
    tl.debug_barrier()
    if tl.atomic_add(cnt, 1, sem="acq_rel") == C - 1:
        ok = m_ok[:, None] & n_ok[None, :]
        src = p_ptr + rm.to(tl.int64)[:, None] * N + rn[None, :]
        acc = tl.zeros([BM, BN], dtype=tl.float32)
        for c in range(C):
            acc = acc + tl.load(src + c * M * N, mask=ok, other=0.0, cache_modifier=".cg")
        tl.store(out_ptr + rm.to(tl.int64)[:, None] * out_rs + rn[None, :], bf16_round(acc).to(tl.bfloat16), mask=ok)


@triton.jit
def _store_partial(base, part, rm, rn, m_ok, n_ok, N, SWAP: tl.constexpr):
    """fp32 partial [BN, BM] (SWAP) or [BM, BN] -> base[m * N + n] (one [M, N] slice of P)."""
    if SWAP:
        tl.store(base + rm[None, :] * N + rn[:, None], part, mask=n_ok[:, None] & m_ok[None, :])
    else:
        tl.store(base + rm[:, None] * N + rn[None, :], part, mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _ordered_sum_kernel(p_ptr, out_ptr, out_rs, M, N, KB, BLOCK: tl.constexpr):
    """Ordered split-K, pass 2: out[m, n] = bf16(((0 + P[0, m, n]) + P[1, m, n]) + ...), K order, fp32.
    (Loading 8 blocks as one [8, BLOCK] tile and picking rows out was 5x slower on the H200.)"""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = i < M * N
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for kb in range(KB):
        acc = acc + tl.load(p_ptr + kb * M * N + i, mask=ok, other=0.0)
    tl.store(out_ptr + (i // N) * out_rs + i % N, bf16_round(acc).to(tl.bfloat16), mask=ok)


# ---------------------------------------------------------------------------------- host side
def mxfp8_quant_t(x: torch.Tensor, evens_first: bool = False, zero: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """bf16 (any float) [M, K], K % 32 == 0, unit column stride -> (q float8_e4m3fn [M, K],
    s fp32 [K/32, M]) with q and s.T bitwise equal to `quant.fp8.mxfp8_quant(x)`; evens_first: q's
    32-blocks in `K_EVENS_FIRST` order (q[:, K_EVENS_FIRST] of the plain call, for the grouped MoE).
    zero: an int32 tensor the same launch sets to 0 (the next GEMM's arrival counters); M * K > 0."""
    m, k = x.shape
    assert k % BLOCK == 0 and x.stride(1) == 1, (x.shape, x.stride())
    q = torch.empty(m, k, dtype=torch.uint8, device=x.device)
    s = torch.empty(k // BLOCK, m, dtype=torch.float32, device=x.device)
    groups = m * (k // BLOCK)
    if groups:
        bg = 64  # groups per program: a [64, 32] tile
        z = zero if zero is not None else s.view(torch.int32)  # z unused without counters (NZ = 0)
        _mxfp8_quant_kernel[(triton.cdiv(groups, bg),)](
            x, x.stride(0), q, s, m, k // BLOCK, groups, z, 0 if zero is None else zero.numel(), BLOCK_G=bg,
            EVENS_FIRST=evens_first, num_warps=4, **NO_FMA)
    return q.view(torch.float8_e4m3fn), s


def _sm_count(device) -> int:
    """Streaming multiprocessors of `device` (132 on the H200 the configs were tuned on)."""
    dev = torch.device(device)
    return torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 132


SPLIT_ROWS = 16
SPLIT_MAX_N = 2304
"""Deterministic mode: up to SPLIT_ROWS rows and SPLIT_MAX_N outputs a GEMM runs the ordered split-K (two
passes); else `_scaled_mm_kernel`. H200, benchmark/results/2026-12-02-h200-decode-step-sweep.md: 1.1-1.2x for
wq_a / wkv, 1.5x for W4A8 w1 at M <= 16; 0.6-0.9x for N = 5120 (wo_b, shared w2), where the partials cost
more HBM traffic than they save (benchmark/results/2026-12-02-h200-decode-gemm.md: the one-pass SWAP tiles
win there)."""
SWAP_TILES_PER_SM = 2
"""Up to SPLIT_ROWS rows, a GEMM with K > 4096 and at least this many 64-row weight tiles per SM runs SWAP
tiles (16 activation rows, 64 weight rows): the Engram wkv (N = 25600, K = 6144, 400 tiles) at 8 rows on
an H100, 80.7 vs 113.9 us for the plain 64 x 64 tiles, same bits
(benchmark/results/2026-12-06-h100-pdl-wkv.md); wo_b (N = 5120, K = 8192, 80 tiles) keeps the plain tiles."""
FOLD_ROWS = 64
FOLD_PROGRAMS_PER_SM = 4
FOLD_TRAFFIC = 0.5
"""Fast mode (not deterministic): up to FOLD_ROWS rows a GEMM runs the folded split-K where it makes more
than 2 chunks: each program sums its chunk of K blocks in K order, the chunk sums are added in chunk order
(`_block_partials_kernel` FOLD, `_ordered_sum_kernel`). The chunk count aims at FOLD_PROGRAMS_PER_SM
programs per SM, capped so that the fp32 chunk sums (written and read once) stay under FOLD_TRAFFIC of the
weight bytes. A row's bits then depend on the chunk count, i.e. on its call's row count (docs/numerics.md,
"Decode GEMMs"). H200 (benchmark/results/2026-12-02-h200-decode-split.md, sweeps A and C): 1.3-2.0x the
deterministic config at 1 and 8 rows for wq_a, wkv, wo_b and the shared expert; at 64 rows 1.36-1.50x
with chunk sums up to half the weight bytes (5 chunks at K = 5120), 0.4-0.9x with the 1/8 cap of sweep A;
wq_b (512 weight tiles) gains nothing (at most 2 chunks: not folded)."""


FOLD_WIDE = (2, 1.0)
"""(programs per SM, traffic cap) of the folded split-K on 64-row tiles (33-64 rows), in place of
FOLD_PROGRAMS_PER_SM / FOLD_TRAFFIC. H100, 64 rows (benchmark/results/2026-12-06-h100-dense64.md): wo_b 46.4 vs
53.9 us (4 chunks instead of 7), wq_a | wkv 18.4 vs 22.2 (10 instead of 5), shared w2 18.0 vs 19.9 (4 chunks
instead of one pass); shared w1 | w3 29.8 vs 27.3 (4 instead of 5)."""


def fold_config(m: int, n: int, k: int, device, fp4: bool = False) -> tuple | None:
    """The folded split-K config (BM, 64, 4 warps, 4 stages, KS, SWAP, FOLD) for m <= FOLD_ROWS rows, or None
    where it would not split K into more than 2 chunks."""
    kb, bn = k // BLOCK, 64
    bm = 16 if m <= 16 else 32 if m <= 32 else 64
    per_sm, traffic = FOLD_WIDE if bm == 64 else (FOLD_PROGRAMS_PER_SM, FOLD_TRAFFIC)
    want = triton.cdiv(per_sm * _sm_count(device), triton.cdiv(n, bn))
    cap = int(traffic * k * (0.5 if fp4 else 1.0) / (8 * max(m, 1)))  # chunks * m * n * 4 B * 2 vs n * k B
    chunks = max(1, min(want, cap, kb))
    return (bm, bn, 4, 4, triton.cdiv(kb, chunks), True, True) if chunks > 2 else None


def pick_config(m: int, n: int, k: int, device: torch.device, fp4: bool = False, fast: bool | None = None) -> tuple:
    """(BM, BN, num_warps, num_stages) for `_scaled_mm_kernel`, (BM, BN, num_warps, num_stages, 0, SWAP)
    for it with SWAP tiles, (BM, BN, num_warps, num_stages, KS, SWAP) with KS > 0 for the ordered
    split-K of decode rows (KS K blocks per program, about 8 programs per SM), or the same plus FOLD = True
    for the folded split-K (`fold_config`). fast (default: not deterministic mode) allows the folded
    split-K up to FOLD_ROWS rows. From the H200 sweeps (benchmark/results/2026-12-02-h200-decode-gemm.md;
    prefill sizes: the gemm variant rows). Outside FOLD the per-block partial is one warpgroup MMA in every
    config, and the K-order adds are the same, so those configs give the same bits (test_gemm_gpu.py
    checks configs and batch invariance bitwise)."""
    if fast is None:
        fast = not deterministic()
    fold = fold_config(m, n, k, device, fp4) if fast and m <= FOLD_ROWS else None
    if fold:
        return fold
    if m <= SPLIT_ROWS and n <= SPLIT_MAX_N:  # too few one-pass tiles for the SMs: split K, ~8 programs / SM
        bn = 64
        ks = max(1, triton.cdiv(triton.cdiv(n, bn) * (k // BLOCK), 8 * _sm_count(device)))
        return 16, bn, 4, 4, ks, True
    if m <= SPLIT_ROWS and not fp4:  # wide decode GEMMs: 64 weight rows per program as the MMA's M side;
        # at K > 4096 with few weight tiles (wo_b: 80) 8 rows ran 35% slower than 1 or 16 rows with SWAP, so
        # plain 64-wide tiles there; from SWAP_TILES_PER_SM tiles per SM (the Engram wkv) SWAP again
        swap = k <= 4096 or triton.cdiv(n, 64) >= SWAP_TILES_PER_SM * _sm_count(device)
        return (16, 64, 4, 4, 0, True) if swap else (64, 64, 4, 4)
    if m <= 64:  # decode: weight streaming (FP4 decodes 2x the bytes per weight row)
        if fp4:
            return 64, 32, 4, 4
        if n >= 16384 and k <= 2048:  # wq_b: short K, many tiles; 128-wide tiles halve the activation re-reads
            return 64, 128, 4, 4  # (H100, 64 rows: 34.7 vs 41.8 us, same bits; 2026-12-06-h100-dense64.md)
        return (64, 64, 4, 4) if n >= 4096 else (64, 32, 4, 6)
    if fp4 and m <= 1024:
        return 64, 32, 4, 4
    return 64, 128, 4, 4


def _split_mm(x2, w, w_rs, sw, out, m, n, k, fp4, bm, bn, warps, stages, ks, swap, fold=False):
    """Split-K of x2 [M, K] (unit column stride). Ordered: three launches, its MXFP8 quant
    (`mxfp8_quant_t`), P [K/32, M, N] fp32 of exact scaled block partials, then their sum in K order
    (`_ordered_sum_kernel`). Folded: two, the quant (which also zeroes one arrival counter per weight-row
    tile) and P [cdiv(K/32, ks), M, N] of chunk sums, whose last program per tile adds them in chunk order
    (the same sum). (Quantizing inside the partials kernel saved the first launch, but each of
    the N / BN weight-tile programs then quantized the same rows again: `bench` decode step at batch 8 on
    an H100, 8.24 ms vs 8.02 ms this way; benchmark/results/2026-12-05-h100-decode-stats.md.)"""
    kb = k // BLOCK
    parts = triton.cdiv(kb, ks) if fold else kb
    part = torch.empty(parts, m, n, dtype=torch.float32, device=x2.device)
    tiles = triton.cdiv(n, bn)
    count = torch.empty(tiles if fold else 0, dtype=torch.int32, device=x2.device)
    xq, sa = mxfp8_quant_t(x2, zero=count if fold else None)
    _block_partials_kernel[(tiles, triton.cdiv(kb, ks))](
        xq, xq.stride(0), sa, w, w_rs, sw, sw.stride(0), part, m, n, k, ks, count, out, out.stride(0),
        FP4=fp4, BM=bm, BN=bn, SWAP=swap, FOLD=bool(fold), num_warps=warps, num_stages=stages, **NO_FMA)
    if not fold:
        block = 128  # one output per thread: 4x the programs of 512, each walking its K blocks serially
        _ordered_sum_kernel[(triton.cdiv(m * n, block),)](part, out, out.stride(0), m, n, parts, BLOCK=block,
                                                          num_warps=4)


def _prefetch(bm: int, bn: int, swap: bool, fp4: bool) -> bool:
    """Whether `_scaled_mm_kernel` loads scales one iteration ahead: FP8 tiles whose MMA N side (where a
    broadcast scale vector costs registers in every thread) is at most 64 wide. H200: 1.1-1.5x on decode
    tiles; prefill tiles (N side 128) and W4A8 tiles lost 5-20% to register pressure."""
    return not fp4 and (bm if swap else bn) <= 64


PREFILL_ROWS = 512
"""From this many rows (and outside deterministic mode and graph captures) a GEMM runs as a bf16 library
GEMM over exact bf16 operands (`_bf16_mm`): same products, the tensor core's fp32 addition order.
H200 (benchmark/results/2026-12-02-h200-prefill-bf16.md): 1.2-2.4x the fp8 kernel at M = 512 .. 8192 for
wq_a, wq_b, wo_b and the shared expert's w1 (0.63-0.91x a bf16 F.linear at M = 8192)."""


def _bf16_mm(x2, w, sw, n, k, fp4):
    """x2 [M, K] -> bf16 [M, N] = MXFP8 round trip of x2 (bf16) @ dequantized w (bf16)^T (dequant_triton)."""
    sw = sw.view(torch.uint8)
    if fp4:
        wb = fp4_weight_bf16(w[None], sw[None], torch.empty(1, n, k, dtype=torch.bfloat16, device=w.device))[0]
    else:
        wb = fp8_weight_bf16(w, sw)
    return torch.nn.functional.linear(mxfp8_qdq(x2), wb)


def _scaled_mm(x, w, w_rs, sw, n, k, fp4, config):
    """x [..., K] -> bf16 [..., N]; w / sw as `_scaled_mm_kernel` takes them (w_rs = w's row stride)."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.size(0)
    if n and config is None and m >= PREFILL_ROWS and bf16_path_allowed(x.device):
        return _bf16_mm(x2, w, sw, n, k, fp4).reshape(*lead, n)
    out = torch.empty(m, n, dtype=torch.bfloat16, device=x.device)
    if m and n:
        config = config or pick_config(m, n, k, x.device, fp4)
        if sw.dtype != torch.uint8:
            sw = sw.view(torch.uint8)
        if len(config) >= 6 and config[4] > 0:
            assert m <= config[0], f"split-K config {config} takes at most {config[0]} rows (got {m})"
            _split_mm(x2, w, w_rs, sw, out, m, n, k, fp4, *config)
            return out.reshape(*lead, n)
        q, sa = mxfp8_quant_t(x2)
        bm, bn, warps, stages = config[:4]
        swap = bool(config[5]) if len(config) >= 6 else False
        kb = k // BLOCK
        sub = 4 if kb % 4 == 0 else 2 if kb % 2 == 0 else 1
        grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
        _scaled_mm_kernel[grid](
            q, sa, w, w_rs, sw, sw.stride(0), out, out.stride(0), m, n, k,
            FP4=fp4, BM=bm, BN=bn, SUB=sub, GROUP_M=8, SWAP=swap, PREFETCH=_prefetch(bm, bn, swap, fp4),
            num_warps=warps, num_stages=stages,
        )
    return out.reshape(*lead, n)


@fp8_linear.triton_impl
def fp8_linear_triton(x, w, w_scale, block: int = BLOCK, config: tuple | None = None):
    """Same contract as `quant.fp8.fp8_linear` (block must be 32). `config` (a `pick_config` tuple)
    overrides `pick_config` (tests and benchmarks)."""
    n, k = w.shape
    assert block == BLOCK, f"Triton fp8_linear: 32x32 weight blocks only (got {block}); SGLANG_DSV41_TORCH_OPS=fp8_linear"
    assert k % BLOCK == 0 and x.shape[-1] == k, (x.shape, w.shape)
    assert w.dtype == torch.float8_e4m3fn and w.stride(1) == 1
    assert w_scale.dim() == 2 and w_scale.size(0) == triton.cdiv(n, BLOCK) and w_scale.size(1) >= k // BLOCK
    assert w_scale.stride(1) == 1 and w_scale.element_size() == 1, (w_scale.shape, w_scale.dtype)
    return _scaled_mm(x, w, w.stride(0), w_scale, n, k, False, config)


@fp4_linear.triton_impl
def fp4_linear_triton(x, w_packed, w_scale, config: tuple | None = None):
    """Same contract as `quant.fp4.fp4_linear`; `config` as in `fp8_linear_triton`."""
    n, k = w_packed.size(0), 2 * w_packed.size(1)
    assert k % BLOCK == 0 and x.shape[-1] == k, (x.shape, w_packed.shape)
    assert w_packed.element_size() == 1 and w_packed.stride(1) == 1
    assert w_scale.dim() == 2 and w_scale.size(0) == n and w_scale.size(1) >= k // BLOCK
    assert w_scale.stride(1) == 1 and w_scale.element_size() == 1, (w_scale.shape, w_scale.dtype)
    if w_packed.dtype != torch.uint8:
        w_packed = w_packed.view(torch.uint8)
    return _scaled_mm(x, w_packed, w_packed.stride(0), w_scale, n, k, True, config)


__all__ = ["FOLD_ROWS", "PREFILL_ROWS", "SPLIT_ROWS", "fold_config", "fp4_linear_triton", "fp8_linear_triton",
           "mxfp8_quant_t", "pick_config"]
