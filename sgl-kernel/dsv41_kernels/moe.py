"""Grouped routed experts (W4A8 MoE): every (token, slot) pair of a layer in one op.

    moe_experts(x, ids, weights, w1, s1, w3, s3, w2, s2, limit) -> bf16 [T, k, H]

x bf16 [T, H]; ids int [T, k] (distinct expert ids per row); weights fp32 [T, k] routing weights;
w1 / w3 uint8|int8 [E, I, H/2] (MXFP4, low nibble = even element) with e8m0|uint8 scales [E, I, H/32];
w2 [E, H, I/2] with [E, H, I/32]; limit = swiglu_limit (0: no clamp). Output [t, j] is token t's
j-th smallest expert id's output (the fp32 summation order of the layer), per pair:
    g, u = fp4_linear(x_t, w1_e), fp4_linear(x_t, w3_e)          bf16 (MXFP8 activations per row)
    h    = bf16(weight * (silu(min(g, L)) * clamp(u, -L, L)))     fp32 math, one cast
    y    = fp4_linear(h, w2_e)                                     bf16
    moe_combine(routed, shared) -> [T, H]    (dtype of shared)
    swiglu(g, u, limit, weight=None) -> bf16 [t, I]     the shared expert's h (`shared_math.swiglu_cast`)
    moe_route(logits, bias, k, scale, norm, forced=None) -> (weights fp32 [T, k], ids int64 [T, k])
                                                         the router after its GEMM (`shared_math.route`)
    moe_gate(x, weight, bias, k, scale, norm, forced=None) -> (weights fp32 [T, k], ids int32 [T, k])
                                                         the whole router: its fp32 logits GEMM, then moe_route

routed [T, k, H] bf16 (moe_experts' output, the layer's slot order), shared [T, H] bf16 (the shared
expert): acc = +0; acc = acc + fp32(routed[:, j]) for j = 0 .. k-1; then acc + fp32(shared); one cast.
One kernel launch instead of the twin's ~2k + 4 elementwise launches (a zero fill, a widening copy and
an add per slot, the shared expert's, the cast) per layer.

The twin here runs that per expert with this package's GEMM twins (exact block partials, so a row's
bits do not depend on which rows share its expert) and the layers' `shared_math.swiglu`; the Triton kernels (moe_triton.py) sort the pairs
by expert once and run one grouped launch for w1 + w3 (SwiGLU, routing weight and the MXFP8 quant of
h in the epilogue) and one for w2, with no host synchronisation.
"""

from __future__ import annotations

import torch

from dsv41_kernels.fp32_gemm import fp32_linear
from dsv41_kernels.gemm import fp4_linear
from dsv41_kernels.registry import attach_kernels, register
from sglang_dsv41 import shared_math
from sglang_dsv41.shared_math import swiglu


def sorted_slots(ids: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [T, k], weights [T, k] -> (expert ids ascending per row int64, their weights fp32)."""
    sid, rank = ids.long().sort(dim=1)
    return sid, weights.float().gather(1, rank)


@register("moe_experts")
def moe_experts(x, ids, weights, w1, s1, w3, s3, w2, s2, limit: float) -> torch.Tensor:
    """See the module docstring. -> bf16 [T, k, H]."""
    t, k = ids.shape
    sid, wt = sorted_slots(ids, weights)
    out = x.new_zeros(t, k, w2.size(1))
    for e in torch.unique(sid).tolist():
        rows, slot = torch.where(sid == e)
        xe = x[rows]
        h = wt[rows, slot].unsqueeze(-1) * swiglu(fp4_linear.torch(xe, w1[e], s1[e]), fp4_linear.torch(xe, w3[e], s3[e]), limit)
        out[rows, slot] = fp4_linear.torch(h.to(x.dtype), w2[e], s2[e])
    return out


@register("moe_combine")
def moe_combine(routed: torch.Tensor, shared: torch.Tensor) -> torch.Tensor:
    """routed [T, k, H], shared [T, H] -> [T, H] in shared's dtype (module docstring; twin
    `shared_math.moe_combine`, the layers' function)."""
    return shared_math.moe_combine(routed, shared)


@register("swiglu")
def swiglu_op(g, u, limit: float, weight=None) -> torch.Tensor:
    """g, u bf16 [t, I] (w1 / w3 outputs), weight fp32 [t, 1] or None -> bf16 [t, I]: one elementwise
    launch instead of the twin's seven (`shared_math.swiglu_cast`)."""
    return shared_math.swiglu_cast(g, u, limit, weight)


@register("moe_route")
def moe_route(logits, bias, k: int, scale: float, norm: bool, forced=None):
    """logits fp32 [T, E], bias fp32 [E] or [T, E], forced int [T, k] or None -> (weights fp32 [T, k],
    expert ids int64 [T, k]): one launch instead of the twin's eight (`shared_math.route`)."""
    return shared_math.route(logits, bias, k, scale, norm, forced)


@register("moe_gate")
def moe_gate(x, weight, bias, k: int, scale: float, norm: bool, forced=None):
    """x bf16 [T, H], weight bf16 [E, H], bias / forced as `moe_route` -> (weights fp32 [T, k], expert ids int32
    [T, k], the dtype the layer records): `fp32_linear` then `moe_route`. The kernel folds the logits GEMM's
    chunk partials inside the route launch (two launches instead of three, and no int32 copy)."""
    w, ids = moe_route.torch(fp32_linear.torch(x, weight), bias, k, scale, norm, forced)
    return w, ids.to(torch.int32)


attach_kernels("dsv41_kernels.moe_triton", "moe_experts", "moe_combine")
attach_kernels("dsv41_kernels.router_triton", "swiglu", "moe_route", "moe_gate")
