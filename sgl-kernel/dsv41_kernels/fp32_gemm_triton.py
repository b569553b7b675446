"""Triton fp32 GEMM for Hopper (sm_90): `fp32_linear(x, w)` = fp32(x) @ fp32(w)^T, batch invariant.

x [M, K] bf16|fp32 (any row stride, unit column stride), w [N, K] bf16|fp32 -> out fp32 [M, N]. Nothing
is converted or padded outside the kernel: tiles are loaded in their storage dtype, masked at the
edges (zeros), widened in registers (the wrapper copies only an x with a non-unit column stride or
another float dtype). One launch, two with SPLIT (below).

The order of every output element (independent of M, of the tile that computes it and of the config):
    K is cut into chunks of CHUNK = 1024 elements (the last one shorter);
    P[c]  = +0, then for each k of chunk c in K order: P[c] += x[m, k] * w[n, k]
    out   = +0, then P[0] + P[1] + ... in chunk order, one fp32 rounding per add.
The chunk partial P[c] is one chain per element through the whole chunk, BK columns per `tl.dot`
with the running partial as its accumulator (never a fresh dot added afterwards):
  * both operands bf16 (head, router, compressor): bf16 tensor-core MMAs (wgmma, K = 16 per step),
    products exact in fp32, fp32 accumulation in the tensor core's own order inside a 16-wide step.
    Every bf16 config keeps the MMA's M side a multiple of 64 with 4 or 8 warps, so Triton emits the
    same warpgroup MMA in all of them (the GPU test checks the PTX and the bits).
  * an fp32 operand (mHC mixes: fp32 weight; fp32 activations): `input_precision="ieee"`, which
    Triton lowers to one fp32 FMA per product in K order (no TF32: that would round the weights).
Chunks exist so that decode GEMMs (a few rows, few weight rows: router, mHC, a small vocabulary) can
split K without changing the order (SPLIT, an ordered two-pass): program (tile, c) writes P[c] to a
workspace [C, M, N] and `_fold_chunks_kernel` adds the partials in chunk order. Without SPLIT one
program folds its chunks in registers (one launch). Both give the same bits.
Outside deterministic mode the decode mHC mix (fp32 weight, <= DECODE_MIX_ROWS rows, <= 32 outputs)
uses chunks of FAST_CHUNK = 256 (config entry 8): 4x the programs, each a quarter of the serial FMA
chain; a row's bits then differ from the same row in a prefill-size call (docs/numerics.md).

SWAP (bf16, decode rows): the tile computes out^T = w x^T, so the BN weight rows are the MMA's 64-wide
M side and the few activation rows its N side (the products and K order are the same).

Under TRITON_INTERPRET=1 (`triton_numerics.INTERPRET`) the step `_mac` runs on the host as the
sequential chain acc = acc + x[:, k] * w[:, k] for k in order (fp32, product rounded once, then the
add): the interpreter's own dot is a NumPy matmul added to the accumulator, whose order depends on the
tile shape. So the interpreter checks the kernel's indexing, masks, chunk split and fold bit for bit
against an explicit chained sum (test/kernels/fp32_gemm_interp.py), and the GPU test the tensor cores.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv41_kernels.dependent_launch import release
from dsv41_kernels.fp32_gemm import fp32_linear
from dsv41_kernels.gemm_triton import _sm_count
from dsv41_kernels.triton_numerics import DOT_DTYPE, INTERPRET
from sglang_dsv41.determinism import deterministic

CHUNK = 1024
"""K elements per chunk partial: part of the summation order (module docstring), not a tuning knob."""
FAST_CHUNK = 256
DECODE_MIX_ROWS = 64
"""Outside deterministic mode, fp32-operand GEMMs of <= DECODE_MIX_ROWS rows and <= 32 outputs (the decode
mHC mix) use FAST_CHUNK-element chunks (module docstring)."""

if INTERPRET:
    import numpy as np
    from triton.runtime.interpreter import TensorHandle

    def _mac(a, b, acc, IEEE):
        """Interpreter only: acc + a @ b as a sequential fp32 chain over k (module docstring)."""
        av = torch.from_numpy(np.ascontiguousarray(a.handle.data, dtype=np.float32))
        bv = torch.from_numpy(np.ascontiguousarray(b.handle.data, dtype=np.float32))
        out = torch.from_numpy(np.array(acc.handle.data, dtype=np.float32))
        for k in range(av.shape[1]):
            out = out + av[:, k : k + 1] * bv[k : k + 1, :]
        return tl.tensor(TensorHandle(out.numpy(), acc.dtype.scalar), acc.type)

else:

    @triton.jit
    def _mac(a, b, acc, IEEE: tl.constexpr):
        """acc + a @ b, a [P, BK], b [BK, Q], acc fp32 [P, Q] carried through the MMA (module docstring)."""
        if IEEE:
            return tl.dot(a, b, acc, input_precision="ieee")
        return tl.dot(a, b, acc)


@triton.jit
def _fp32_gemm_kernel(
    x_ptr, x_rs, w_ptr, w_rs, out_ptr, M, N, K,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, OPER: tl.constexpr, IEEE: tl.constexpr,
    SWAP: tl.constexpr, SPLIT: tl.constexpr, GROUP_M: tl.constexpr, CHUNK: tl.constexpr,
):
    """x [M, K] (row stride x_rs), w [N, K] (row stride w_rs), unit column strides. Operands are
    widened to OPER: bf16 (both stored bf16: tensor cores) or fp32 with IEEE (FMAs).
    Without SPLIT: grid (tiles,), out fp32 [M, N] contiguous. With SPLIT: grid (tiles, C), program
    (tile, c) writes P[c] to out = workspace fp32 [C, M, N]. CHUNK % BK == 0."""
    tl.static_assert(CHUNK % BK == 0)
    release()  # a dependent launch after this one (`mhc_enter`) may start now
    pid = tl.program_id(0)
    num_m, num_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
    band = GROUP_M * num_n  # launch order: GROUP_M row tiles share each weight tile while it is in L2
    first_m = (pid // band) * GROUP_M
    rows = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % band) % rows
    pid_n = (pid % band) // rows

    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    m_ok, n_ok = rm < M, rn < N
    x_row = x_ptr + rm.to(tl.int64)[:, None] * x_rs + rk[None, :]
    w_row = w_ptr + rn.to(tl.int64)[:, None] * w_rs + rk[None, :]

    if SPLIT:
        k_lo = tl.program_id(1) * CHUNK
        k_hi = tl.minimum(k_lo + CHUNK, K)
    else:
        k_lo = 0
        k_hi = K
    if SWAP:
        total = tl.zeros([BN, BM], dtype=tl.float32)
    else:
        total = tl.zeros([BM, BN], dtype=tl.float32)
    part = tl.zeros_like(total)
    for k0 in range(k_lo, k_hi, BK):
        k_ok = (k0 + rk < K)[None, :]
        a = tl.load(x_row + k0, mask=m_ok[:, None] & k_ok, other=0.0).to(OPER)  # [BM, BK]
        b = tl.load(w_row + k0, mask=n_ok[:, None] & k_ok, other=0.0).to(OPER)  # [BN, BK]
        if SWAP:
            part = _mac(b, tl.trans(a), part, IEEE)
        else:
            part = _mac(a, tl.trans(b), part, IEEE)
        if ((k0 + BK) % CHUNK == 0) | (k0 + BK >= k_hi):  # end of a chunk
            total = total + part
            part = tl.zeros_like(total)

    if SPLIT:
        out_ptr += tl.program_id(1).to(tl.int64) * M * N
    if SWAP:  # [BN, BM]
        tl.store(out_ptr + rm.to(tl.int64)[None, :] * N + rn[:, None], total, mask=n_ok[:, None] & m_ok[None, :])
    else:
        tl.store(out_ptr + rm.to(tl.int64)[:, None] * N + rn[None, :], total, mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _fold_chunks_kernel(part_ptr, out_ptr, MN, C: tl.constexpr, BLOCK: tl.constexpr):
    """Ordered two-pass, pass 2: out[i] = ((+0 + P[0, i]) + P[1, i]) + ... (chunk order), P fp32 [C, MN].
    C is unrolled, so the C loads of a thread issue together instead of one memory latency per chunk."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = i < MN
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for c in tl.static_range(C):
        acc = acc + tl.load(part_ptr + c * MN + i, mask=ok, other=0.0)
    tl.store(out_ptr + i, acc, mask=ok)


# ---------------------------------------------------------------------------------- host side
def _pow2(n: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, triton.next_power_of_2(max(n, 1))))


def pick_config(m: int, n: int, k: int, tc: bool, device, fast: bool | None = None) -> tuple:
    """(BM, BN, BK, SWAP, SPLIT, num_warps, num_stages[, chunk]) for `_fp32_gemm_kernel`; every config
    without a chunk entry gives the same bits (module docstring); fast (default: not deterministic mode)
    allows the decode mHC mix's FAST_CHUNK. First choices for the H200 from sm_90 compiles (registers,
    shared memory); the decode ones checked by the H200 sweep with weights rotated past L2
    (benchmark/results/2026-12-02-h200-fp32-mix.md: each within 3% of the shape's fastest config):
      bf16, m <= 64  decode: SWAP tiles of 64 weight rows, BK 128 (weight streaming, many programs
                     along N; 60-130 registers, two programs per SM);
      bf16, m > 64   64 x BN or 128 x BN tiles, BN up to 128 (at least 16), BK 64;
      fp32 operand   FMA tiles of 16 / 32 / 64 rows by 32 or 64 columns (mHC: N = 24, one column
                     tile, every row of x read once; 64 x 32 issues 2.5 FMAs per shared load, 32 x 32 1.7);
                     up to 64 rows and 32 columns (the mHC mix at decode) 16 x 32 tiles with BK 64: more
                     programs than 32-row tiles (42.9 vs 50.2 us at 64 rows); from 1024 rows (the
                     prefill mHC mix) 64 x 32 tiles on 2 warps, split over the K chunks: 1.72x / 1.62x the
                     unsplit 4-warp tiles at 8192 / 2048 rows, K = 20480 (2026-12-02-h200-prefill-bf16.md).
    SPLIT (ordered two-pass over the K chunks) when the tiles would leave more than half the SMs idle."""
    if tc and m <= 64:
        bm = _pow2(m, 16, 64)
        bn, bk, swap, warps, stages = 64, 128, True, 4, 4 if bm <= 32 else 3
    elif tc:
        bm, bn, bk, swap = (128 if m >= 1024 else 64), _pow2(n, 16, 128), 64, False
        warps, stages = (8 if bm * bn >= 64 * 128 else 4), 4
    elif n <= 32 and m >= 1024 and k > CHUNK:  # the prefill mHC mix: split K, 2 warps (module docstring)
        return 64, 32, (64 if m >= 4096 else 16), False, True, 2, 3
    else:
        narrow = m <= 64 and n <= 32  # the decode mHC mix
        bm = 16 if m <= 16 or narrow else 32 if m <= 2048 else 64
        bn = 32 if n <= 32 else 64
        bk, swap, warps, stages = (64 if narrow else 32 if bn == 32 else 16), False, 4, 3
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    split = 2 * tiles <= _sm_count(device) and k > CHUNK
    if fast is None:
        fast = not deterministic()
    if fast and not tc and m <= DECODE_MIX_ROWS and n <= 32 and k > FAST_CHUNK:  # 2 warps: 14.4 / 23.2 us vs
        # 15.8 / 35.3 on 4 at 8 / 64 rows (benchmark/results/2026-12-02-h200-decode-split.md, sweep C)
        return bm, bn, bk, swap, True, 2, stages, FAST_CHUNK
    return bm, bn, bk, swap, split, warps, stages


def operand(t: torch.Tensor) -> torch.Tensor:
    """bf16 / fp32 as stored (unit column stride); other float dtypes widened like the twin's .float()."""
    if t.dtype not in (torch.bfloat16, torch.float32):
        t = t.float()
    return t if t.stride(-1) == 1 or t.size(-1) <= 1 else t.contiguous()


def linear_parts(x2: torch.Tensor, w: torch.Tensor, config: tuple | None = None) -> torch.Tensor:
    """x2 [M, K] bf16|fp32 (unit column stride), w [N, K] bf16|fp32 (`operand`s), M and N > 0 -> fp32
    [C, M, N]: with C > 1 the chunk partials of a SPLIT launch (`_fold_chunks_kernel`'s fold, or a
    consumer's that adds them in the same order, gives the result), with C = 1 the result itself. One
    launch; `config` as `fp32_linear_triton`."""
    m, k = x2.shape
    n = w.size(0)
    tc = x2.dtype == torch.bfloat16 and w.dtype == torch.bfloat16
    bm, bn, bk, swap, split, warps, stages, *chunk = config or pick_config(m, n, k, tc, x2.device)
    chunk = chunk[0] if chunk else CHUNK
    assert chunk % bk == 0, f"config {config}: the chunk must be a multiple of BK"
    # bf16: the MMA's M side a multiple of 64 on whole warpgroups, so every config is one warpgroup MMA
    assert not tc or ((bn if swap else bm) % 64 == 0 and warps % 4 == 0), f"bf16 config {config} is not wgmma"
    assert not swap or tc, "SWAP tiles are for bf16 x bf16 only"
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    chunks = triton.cdiv(k, chunk)
    split = bool(split) and chunks > 1
    dst = torch.empty(chunks if split else 1, m, n, dtype=torch.float32, device=x2.device)
    _fp32_gemm_kernel[(tiles, chunks) if split else (tiles,)](
        x2, x2.stride(0), w, w.stride(0), dst, m, n, k, BM=bm, BN=bn, BK=bk, OPER=DOT_DTYPE if tc else tl.float32,
        IEEE=not tc, SWAP=bool(swap), SPLIT=split, GROUP_M=8, CHUNK=chunk, num_warps=warps, num_stages=stages)
    return dst


@fp32_linear.triton_impl
def fp32_linear_triton(x: torch.Tensor, w: torch.Tensor, config: tuple | None = None) -> torch.Tensor:
    """Same contract as the twin; `config` (a `pick_config` tuple) overrides the picker (tests, benchmarks).
    A call that needs autograd runs the twin (the kernel has no backward)."""
    if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad):
        return fp32_linear.torch(x, w)
    n, k = w.shape
    assert x.shape[-1] == k, (x.shape, w.shape)
    lead = x.shape[:-1]
    x2, w = operand(x.reshape(-1, k)), operand(w)
    m = x2.size(0)
    if m == 0 or n == 0:
        return torch.empty(*lead, n, dtype=torch.float32, device=x.device)
    parts = linear_parts(x2, w, config)
    if parts.size(0) == 1:
        return parts[0].reshape(*lead, n)
    out = torch.empty(m, n, dtype=torch.float32, device=x.device)
    block = 256
    _fold_chunks_kernel[(triton.cdiv(m * n, block),)](parts, out, m * n, C=parts.size(0), BLOCK=block, num_warps=4)
    return out.reshape(*lead, n)


__all__ = ["CHUNK", "DECODE_MIX_ROWS", "FAST_CHUNK", "fp32_linear_triton", "linear_parts", "operand", "pick_config"]
