"""Prefill routed experts on bf16 tensor cores: exact bf16 operands and the library's grouped GEMM.

For many (token, expert) pairs per expert the grouped W4A8 kernel (moe_triton) is bound by its
per-32-block fp8 MMAs, each waited on before its scale multiply (0.13x a bf16 GEMM of equal FLOPs on
the H200). Here the same exact values run as bf16 (dequant_triton):
  pairs sorted by expert (`sorted_pairs`, stable, as the grouped kernel's);
  xs  = MXFP8 round trip of each pair's token row, gathered in sorted order     bf16 [R, H]
  W13 = w1 | w3 of a chunk of experts as bf16                                    [e, 2I, H]
  gu  = torch._grouped_mm(xs, W13^T, offs)   (g | u, fp32 accumulation, one bf16 rounding)
  h   = MXFP8 round trip of bf16(wt * silu(min(g, L)) * clamp(u, -L, L))        (swiglu_qdq)
  y   = torch._grouped_mm(h, W2^T, offs) -> out[t, j] at pair r = perm[p]
The products are the twin's exact products; only the fp32 addition order and width differ (the
tensor core's, as for the fp8 path's 32-term partials; docs/numerics.md "Prefill GEMMs"). Rows are
then not batch invariant (a token's bits depend on whether its call takes this path), so
deterministic mode never takes it, nor does a CUDA-graph capture (decode).
Experts are dequantized CHUNK_BYTES at a time; more than one chunk reads the chunk row bounds back
(one host sync per call; prefill only).
"""

from __future__ import annotations

import torch

from dsv41_kernels.dequant_triton import bf16_path_allowed, fp4_weight_bf16, mxfp8_qdq, swiglu_qdq

CHUNK_BYTES = 2 << 30
"""bf16 expert weights dequantized at once (w1 | w3, then w2, of a chunk of experts)."""
ROWS_PER_EXPERT = 64
"""The bf16 path runs when a call has at least this many pairs per expert on average (below, the
dequantization of every expert's weights costs more than the grouped fp8 kernel)."""


def sorted_pairs(ids: torch.Tensor, weights: torch.Tensor, n_experts: int):
    """-> (perm int64 [R] sorted position -> pair r, routing weight fp32 [R] by pair, per-expert pair
    counts and their cumulative ends, int64 [E]); pairs r = t*k + j (token t's j-th smallest expert id)
    sorted by expert, stable. Device ops only."""
    sid, rank = ids.long().sort(dim=1)
    wt = weights.float().gather(1, rank).flatten()
    flat = sid.flatten()
    perm = torch.argsort(flat, stable=True)
    counts = torch.zeros(n_experts, dtype=torch.int64, device=ids.device).scatter_add_(0, flat, torch.ones_like(flat))
    return perm, wt, counts, torch.cumsum(counts, 0)


def bf16_prefill(rows: int, n_experts: int, device: torch.device) -> bool:
    """Whether `moe_experts_bf16` serves a call of `rows` pairs: enough rows per expert, a CUDA device of
    compute capability 9.0+ (the grouped GEMM), not deterministic mode, not inside a graph capture."""
    return (rows >= ROWS_PER_EXPERT * n_experts and bf16_path_allowed(device) and hasattr(torch, "_grouped_mm")
            and torch.cuda.get_device_capability(device) >= (9, 0))


def _chunks(n_exp: int, per_expert: int, ends: torch.Tensor, rows: int) -> list[tuple[int, int, int, int]]:
    """[(first expert, end expert, first sorted row, end sorted row)] of CHUNK_BYTES each."""
    step = max(1, CHUNK_BYTES // per_expert)
    if step >= n_exp:
        return [(0, n_exp, 0, rows)]
    bounds = [0] + ends.tolist()  # host read: the only one, and only for more than one chunk
    return [(e, min(e + step, n_exp), bounds[e], bounds[min(e + step, n_exp)]) for e in range(0, n_exp, step)]


def moe_experts_bf16(x, ids, weights, w1, s1, w3, s3, w2, s2, limit: float) -> torch.Tensor:
    """`moe_experts`' contract (uint8 weights and scales as moe_triton passes them) -> bf16 [T, k, H]."""
    t, k = ids.shape
    n_exp, inter, hk = w1.shape
    hid, rows = 2 * hk, t * k
    perm, wt, _, ends = sorted_pairs(ids, weights, n_exp)
    xs = mxfp8_qdq(x, perm, k)
    wts = wt[perm]
    chunks = _chunks(n_exp, 3 * inter * hid * 2, ends, rows)
    y = torch.empty(rows, hid, dtype=torch.bfloat16, device=x.device) if len(chunks) > 1 else None
    for e0, e1, lo, hi in chunks:
        offs = (ends[e0:e1] - lo).int()
        w13 = torch.empty(e1 - e0, 2 * inter, hid, dtype=torch.bfloat16, device=x.device)
        fp4_weight_bf16(w1[e0:e1], s1[e0:e1], w13[:, :inter])
        fp4_weight_bf16(w3[e0:e1], s3[e0:e1], w13[:, inter:])
        gu = torch._grouped_mm(xs[lo:hi], w13.transpose(1, 2), offs=offs)
        del w13
        h = swiglu_qdq(gu, wts[lo:hi], limit)
        del gu
        wb2 = fp4_weight_bf16(w2[e0:e1], s2[e0:e1], torch.empty(e1 - e0, hid, inter, dtype=torch.bfloat16, device=x.device))
        part = torch._grouped_mm(h, wb2.transpose(1, 2), offs=offs)
        if y is None:
            y = part
        else:
            y[lo:hi] = part
    # pair r's row is sorted row inv[r]: a row gather (H200, E=16 T=8192: 278 us; index_copy_ by perm: 728 us)
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(rows, device=x.device)
    return y.index_select(0, inv).view(t, k, hid)


__all__ = ["CHUNK_BYTES", "ROWS_PER_EXPERT", "bf16_prefill", "moe_experts_bf16", "sorted_pairs"]
