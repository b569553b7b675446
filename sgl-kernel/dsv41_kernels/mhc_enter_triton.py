"""Triton `mhc_enter` (`dsv41_kernels.mhc`): a sublayer site's entry in two launches.

Launch 1 is the fp32 GEMM of the mix (`fp32_gemm_triton.linear_parts`): its chunk partials P [C, T, M]
(M = (2+n)n), or with C = 1 the mix itself. Launch 2, grid (row blocks, 2), is a dependent launch
(`dependent_launch.py`: it starts while the GEMM runs) that gives each block of ROWS rows two programs:
  role 0 (the site's gates): the statistic of the streams (`mhc_triton.gates_rstd`), then it waits for
         the GEMM; with C > 1 the fold mix = ((+0 + P[0]) + P[1]) + ... in chunk order (the order of
         `fp32_gemm_triton._fold_chunks_kernel`, all C loads issued together), stored to a scratch
         [T, M] and read back after a block barrier; then `mhc_triton.gates_rows`;
  role 1 (the sublayer input; reads nothing of the GEMM, so no wait): the collapse with the previous
         site's pre (`mhc_triton.collapse_tile`, CH columns a step) stored to a scratch [T, H] in the
         streams' dtype, a block barrier, then `norm_triton.rms_norm_rows` over the scratch.
Every value is the one the fp32_linear, mhc_gates, mhc_collapse and rms_norm kernels compute in sequence
(same helpers, same orders, NO_FMA), so the op equals them bit for bit (test/kernels/test_mhc_gpu.py) and
its twin within the fp32 GEMM's tolerance. The barrier makes a program's global stores visible to its own
threads (bar.sync orders global memory within a block); no program reads another's stores.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv41_kernels.dependent_launch import DEPENDENT, wait
from dsv41_kernels.fp32_gemm_triton import linear_parts, operand
from dsv41_kernels.mhc import hc_mult, mhc_enter
from dsv41_kernels.mhc_triton import collapse_tile, gates_rows, gates_rstd
from dsv41_kernels.norm_triton import rms_norm_rows
from dsv41_kernels.triton_numerics import NO_FMA, stat_launch, sumsq_chunks
from sglang_dsv41.reduction import cascade_step


@triton.jit
def _fold_rows(part_ptr, PS, mix_ptr, row, ok, MIX: tl.constexpr, MIXP: tl.constexpr, C: tl.constexpr):
    """mix[row] = ((+0 + P[0, row]) + P[1, row]) + ... for P [C, *, MIX] (parts PS elements apart),
    mix [*, MIX] contiguous fp32; C unrolled so that the loads issue together."""
    col = tl.arange(0, MIXP)[None, :]
    m = ok[:, None] & (col < MIX)
    src = part_ptr + row[:, None] * MIX + col
    acc = tl.zeros([row.shape[0], MIXP], tl.float32)
    for c in tl.static_range(C):
        acc = acc + tl.load(src + c * PS, mask=m, other=0.0)
    tl.store(mix_ptr + row[:, None] * MIX + col, acc, mask=m)


@triton.jit
def _mhc_enter_kernel(r_ptr, r_ts, r_ns, part_ptr, PS, mix_ptr, base_ptr, scale_ptr, pre_ptr, post_ptr, comb_ptr,
                      prev_ptr, w_ptr, col_ptr, out_ptr, T, iters, hc_eps, norm_eps,
                      N: tl.constexpr, NP: tl.constexpr, H: tl.constexpr, MIXP: tl.constexpr, C: tl.constexpr,
                      STEP: tl.constexpr, G: tl.constexpr, HSTEP: tl.constexpr, HG: tl.constexpr,
                      ROWS: tl.constexpr, CH: tl.constexpr, BF16: tl.constexpr):
    """streams R [T, N, H] (strides r_ts, r_ns = H, 1: each row's N*H values contiguous), P [C, T, (2+N)N],
    prev pre [T, N], weight [H] -> pre, post [T, N], comb [T, N, N] fp32, out [T, H]; scratch mix [T, (2+N)N]
    fp32 (C > 1) and col [T, H] (the collapse)."""
    MIX: tl.constexpr = (2 + N) * N
    row = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    ok = row < T
    if tl.program_id(1) == 0:
        rstd = gates_rstd(r_ptr, r_ts, row, ok, norm_eps, N * H, STEP, G)
        wait()  # the mix GEMM's partials from here on
        if C > 1:
            _fold_rows(part_ptr, PS, mix_ptr, row, ok, MIX, MIXP, C)
            tl.debug_barrier()
            src = mix_ptr
        else:
            src = part_ptr
        gates_rows(rstd, src, MIX, base_ptr, scale_ptr, pre_ptr, post_ptr, comb_ptr, row, ok, iters, hc_eps, N, NP)
    else:
        for c in tl.static_range(0, H, CH):
            collapse_tile(r_ptr, r_ts, r_ns, prev_ptr, col_ptr, row[:, None], (c + tl.arange(0, CH))[None, :],
                          ok[:, None], H, N, BF16)
        tl.debug_barrier()
        rms_norm_rows(col_ptr, H, w_ptr, out_ptr, row, ok, norm_eps, H, HSTEP, HG, CH, BF16)


_FLOATS = (torch.bfloat16, torch.float32)


@mhc_enter.triton_impl
def mhc_enter_triton(streams, fn, base, scale, iters: int, hc_eps: float, norm_eps: float, prev_pre, weight,
                     rows: int | None = None, num_warps: int | None = None, gemm_config: tuple | None = None):
    """Same contract as the twin for 3-D bf16 / fp32 streams [T, n, H] with 1 <= n <= 4 and H % 32 == 0,
    fp32 base / scale / prev_pre [T, n], a bf16 / fp32 fn and weight; other inputs, and calls that need
    autograd, run the twin. Launch: `rows` rows per program and `num_warps` (default
    `triton_numerics.stat_launch` of the n*H statistic), `gemm_config` for the mix GEMM (a
    `fp32_gemm_triton.pick_config` tuple)."""
    args = (streams, fn, base, scale, iters, hc_eps, norm_eps, prev_pre, weight)
    grad = torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)
    t, n, h = streams.shape if streams.dim() == 3 else (0, 0, 0)
    mix_dim = base.numel()
    if (grad or streams.dim() != 3 or streams.dtype not in _FLOATS or not 1 <= n <= 4 or h % 32
            or hc_mult(mix_dim) != n or fn.shape != (mix_dim, n * h) or fn.dtype not in _FLOATS
            or weight is None or weight.shape != (h,) or weight.dtype not in _FLOATS
            or any(a.dtype != torch.float32 for a in (base, scale, prev_pre)) or prev_pre.shape != (t, n)):
        return mhc_enter.torch(*args)
    dev = streams.device
    pre = torch.empty(t, n, dtype=torch.float32, device=dev)
    post = torch.empty(t, n, dtype=torch.float32, device=dev)
    comb = torch.empty(t, n, n, dtype=torch.float32, device=dev)
    out = torch.empty(t, h, dtype=streams.dtype, device=dev)
    if t == 0:
        return pre, post, comb, out
    streams = streams.contiguous()
    parts = linear_parts(streams.view(t, n * h), operand(fn), gemm_config)
    c = parts.size(0)
    mix = torch.empty(t, mix_dim, dtype=torch.float32, device=dev) if c > 1 else parts
    col = torch.empty(t, h, dtype=streams.dtype, device=dev)
    rows, num_warps = stat_launch(t, n * h, rows, num_warps)
    step, hstep = cascade_step(n * h // 32), cascade_step(h // 32)
    _mhc_enter_kernel[(triton.cdiv(t, rows), 2)](
        streams, streams.stride(0), streams.stride(1), parts, t * mix_dim, mix, base.contiguous(),
        scale.contiguous(), pre, post, comb, prev_pre.contiguous(), weight.contiguous(), col, out, t,
        max(int(iters), 1), float(hc_eps), float(norm_eps), N=n, NP=triton.next_power_of_2(n), H=h,
        MIXP=triton.next_power_of_2(mix_dim), C=c, STEP=step, G=sumsq_chunks(n * h, step), HSTEP=hstep,
        HG=sumsq_chunks(h, hstep), ROWS=rows, CH=min(1024, triton.next_power_of_2(h)),
        BF16=streams.dtype == torch.bfloat16, num_warps=num_warps, **NO_FMA, **DEPENDENT)
    return pre, post, comb, out


__all__ = ["mhc_enter_triton"]
