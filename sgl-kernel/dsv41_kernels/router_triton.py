"""Triton kernels of the MoE layer's small ops (`dsv41_kernels.moe`): the router after its GEMM and the
shared expert's SwiGLU, one launch each (the twins take eight and seven).

`_route_kernel`, one program per token row of E <= 1024 logits:
    s = sqrt(softplus(z))                             (`transcendentals`: softplus_f32, sqrt_f32)
    top-k of s + bias by k rounds of (row max, lowest index holding it, masked out): ids in descending
      order of s + bias, ties to the lowest expert id (torch.topk's CPU order for distinct values; a NaN
      ranks as +inf); `forced` ids replace the selection
    w_j = s[id_j]; total = `reduction.ordered_sum` of the k weights, which for k < 8 is four columns
      (w_0 .. w_3; w_4 .. w_k-1 added to column 0) folded as ((c0 + c1) + c2) + c3, or for k < 4 the
      weights left to right; w_j / (total + 1e-20) (IEEE division) when norm and k > 1; times scale.
  On the GPU the transcendentals are torch CUDA's, so it equals the twin on the same device bit for bit.
  `moe_gate` runs it on the logits GEMM's chunk partials, added in the fold's order inside the launch.
`_swiglu_kernel`, [rows, BLOCK columns] per program: g, u bf16 -> fp32; u = clamp(u, -L, L), g = min(g, L)
  (L > 0; NaN kept); h = silu(g) * u (`transcendentals.silu_f32`); times the row's weight; bf16 (RNE).
  Every step is the twin's IEEE operation, so it equals the twin on the same device bit for bit.
Both launch with NO_FMA (the twins round each product and sum).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv41_kernels.fp32_gemm_triton import linear_parts, operand
from dsv41_kernels.moe import moe_gate, moe_route, swiglu_op
from dsv41_kernels.transcendentals import silu_f32, softplus_f32, sqrt_f32
from dsv41_kernels.triton_numerics import NO_FMA, bf16_bits, clamp_nan

ROUTE_MAX_EXPERTS = 1024
"""Most experts a router row holds in one program's registers (the release has 384)."""


@triton.jit
def _pick(v, idx, j: tl.constexpr):
    """v[j] of a vector, as a sum of one value and zeros (exact; the weights are >= +0)."""
    return tl.sum(tl.where(idx == j, v, 0.0), 0)


@triton.jit
def _route_kernel(z_ptr, z_rs, b_ptr, b_rs, f_ptr, w_ptr, id_ptr, E, scale, PS,
                  K: tl.constexpr, KP: tl.constexpr, BE: tl.constexpr, NORM: tl.constexpr, FORCED: tl.constexpr,
                  C: tl.constexpr):
    """Row t: z fp32 [E] (row stride z_rs), bias fp32 (row stride b_rs, 0 for one bias row), forced
    int64 [T, K] (FORCED) -> w fp32 [T, K], ids [T, K] (int64, or int32: the store casts). KP = next power
    of two >= K, BE >= E. C > 1: z is the sum of C chunk partials P [C, T, E] (part stride PS) in chunk
    order from +0, the order of `fp32_gemm_triton._fold_chunks_kernel`."""
    t = tl.program_id(0).to(tl.int64)
    e = tl.arange(0, BE)
    ok = e < E
    if C == 1:
        z = tl.load(z_ptr + t * z_rs + e, mask=ok, other=0.0)
    else:
        z = tl.zeros([BE], dtype=tl.float32)
        for c in tl.static_range(C):
            z = z + tl.load(z_ptr + c * PS + t * z_rs + e, mask=ok, other=0.0)
    s = sqrt_f32(softplus_f32(z))
    kk = tl.arange(0, KP)
    ids = tl.zeros([KP], dtype=tl.int64)
    w = tl.zeros([KP], dtype=tl.float32)
    if FORCED:
        for j in tl.static_range(K):
            idx = tl.load(f_ptr + t * K + j)
            wj = tl.sum(tl.where(e == idx, s, 0.0), 0)  # one value and zeros: exact (s >= +0)
            ids = tl.where(kk == j, idx, ids)
            w = tl.where(kk == j, wj, w)
    else:
        sel = s + tl.load(b_ptr + t * b_rs + e, mask=ok, other=0.0)
        sel = tl.where(sel != sel, float("inf"), sel)
        sel = tl.where(ok, sel, float("-inf"))
        for j in tl.static_range(K):
            top = tl.max(sel, 0)
            idx = tl.min(tl.where(sel == top, e, BE), 0)
            wj = tl.sum(tl.where(e == idx, s, 0.0), 0)
            ids = tl.where(kk == j, idx.to(tl.int64), ids)
            w = tl.where(kk == j, wj, w)
            sel = tl.where(e == idx, float("-inf"), sel)
    if NORM:  # reduction.ordered_sum's order for K < 8 (ATen's ilp-4 scalar row sum)
        if K >= 4:
            c0 = _pick(w, kk, 0)
            for j in tl.static_range(4, K):
                c0 = c0 + _pick(w, kk, j)
            total = ((c0 + _pick(w, kk, 1)) + _pick(w, kk, 2)) + _pick(w, kk, 3)
        else:
            total = _pick(w, kk, 0)
            for j in tl.static_range(1, K):
                total = total + _pick(w, kk, j)
        w = tl.math.div_rn(w, (total + 0.0) + 1e-20)
    w = w * scale
    out = kk < K
    tl.store(w_ptr + t * K + kk, w, mask=out)
    tl.store(id_ptr + t * K + kk, ids, mask=out)


@moe_route.triton_impl
def moe_route_triton(logits, bias, k: int, scale: float, norm: bool, forced=None):
    """Same contract as the twin. Calls that need autograd, more than ROUTE_MAX_EXPERTS experts, k >= 8
    (another order of ordered_sum) or other dtypes run the twin."""
    t, n = logits.shape
    grad = torch.is_grad_enabled() and (logits.requires_grad or bias.requires_grad)
    if (grad or n > ROUTE_MAX_EXPERTS or k > n or k >= 8 or logits.dtype != torch.float32 or bias.dtype != torch.float32
            or bias.shape not in ((n,), (t, n))):
        return moe_route.torch(logits, bias, k, scale, norm, forced)
    z = logits if logits.stride(-1) == 1 else logits.contiguous()
    b = bias if bias.stride(-1) == 1 else bias.contiguous()
    w = torch.empty(t, k, dtype=torch.float32, device=logits.device)
    ids = torch.empty(t, k, dtype=torch.int64, device=logits.device)
    f = forced.to(device=logits.device, dtype=torch.int64).contiguous() if forced is not None else ids
    if t:
        _route(z, z.stride(0), 0, 1, b, f, forced is not None, w, ids, k, scale, norm)
    return w, ids


def _route(z, z_rs, ps, c, b, f, forced: bool, w, ids, k: int, scale: float, norm: bool) -> None:
    """One `_route_kernel` launch over the T = w.size(0) rows of logits z (C = c chunk partials, stride ps)."""
    n = b.size(-1)
    _route_kernel[(w.size(0),)](z, z_rs, b, b.stride(0) if b.dim() == 2 else 0, f, w, ids, n, float(scale), ps,
                                K=k, KP=triton.next_power_of_2(k), BE=triton.next_power_of_2(n),
                                NORM=bool(norm and k > 1), FORCED=forced, C=c, num_warps=4, **NO_FMA)


@moe_gate.triton_impl
def moe_gate_triton(x, weight, bias, k: int, scale: float, norm: bool, forced=None, gemm_config=None):
    """Same contract and bits as `fp32_linear`'s kernel followed by `moe_route`'s: the logits GEMM's chunk
    partials (`fp32_gemm_triton.linear_parts`), then one route launch that adds them in chunk order and
    writes int32 ids. Inputs `moe_route_triton` would send to its twin, and calls that need autograd, run
    the twin. `gemm_config`: a `fp32_gemm_triton.pick_config` tuple for the GEMM (tests)."""
    n = weight.shape[0] if weight.dim() == 2 else 0
    t = x.shape[0] if x.dim() == 2 else 0
    grad = torch.is_grad_enabled() and any(a.requires_grad for a in (x, weight, bias))
    if (grad or x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1] or not 0 < n <= ROUTE_MAX_EXPERTS
            or k > n or k >= 8 or bias.dtype != torch.float32 or bias.shape not in ((n,), (t, n))):
        return moe_gate.torch(x, weight, bias, k, scale, norm, forced)
    w = torch.empty(t, k, dtype=torch.float32, device=x.device)
    ids = torch.empty(t, k, dtype=torch.int32, device=x.device)
    if t == 0:
        return w, ids
    parts = linear_parts(operand(x), operand(weight), gemm_config)  # [C, T, E]
    b = bias if bias.stride(-1) == 1 else bias.contiguous()
    f = forced.to(device=x.device, dtype=torch.int64).contiguous() if forced is not None else w
    _route(parts, n, t * n, parts.size(0), b, f, forced is not None, w, ids, k, scale, norm)
    return w, ids


@triton.jit
def _swiglu_kernel(g_ptr, g_rs, u_ptr, u_rs, w_ptr, out_ptr, out_rs, N, limit,
                   HAS_W: tl.constexpr, CLAMP: tl.constexpr, BLOCK: tl.constexpr):
    """Row t, columns [BLOCK] of g, u bf16 [T, N] -> out [T, N] (bf16 bits, an int16 view); w fp32 [T] (HAS_W)."""
    t = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = c < N
    g = tl.load(g_ptr + t * g_rs + c, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + t * u_rs + c, mask=ok, other=0.0).to(tl.float32)
    if CLAMP:
        u = clamp_nan(u, -limit, limit)
        g = tl.where(g > limit, limit, g)
    h = silu_f32(g) * u
    if HAS_W:
        h = tl.load(w_ptr + t) * h
    tl.store(out_ptr + t * out_rs + c, bf16_bits(h), mask=ok)


@swiglu_op.triton_impl
def swiglu_triton(g, u, limit: float, weight=None):
    """Same contract as the twin. Calls that need autograd, and dtypes other than bf16 g / u (fp32
    weight [t, 1]), run the twin."""
    grad = torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in (g, u, weight))
    if (grad or g.dtype != torch.bfloat16 or u.dtype != torch.bfloat16 or g.shape != u.shape or g.dim() != 2
            or (weight is not None and (weight.dtype != torch.float32 or weight.numel() != g.size(0)))):
        return swiglu_op.torch(g, u, limit, weight)
    g = g if g.stride(-1) == 1 else g.contiguous()
    u = u if u.stride(-1) == 1 else u.contiguous()
    t, n = g.shape
    out = torch.empty(t, n, dtype=torch.bfloat16, device=g.device)
    if t and n:
        w = weight.reshape(t).contiguous() if weight is not None else out
        block = 1024
        _swiglu_kernel[(t, triton.cdiv(n, block))](g, g.stride(0), u, u.stride(0), w, out.view(torch.int16), out.stride(0), n, float(limit),
                                                  HAS_W=weight is not None, CLAMP=limit > 0, BLOCK=block, num_warps=4, **NO_FMA)
    return out
