"""Engram ops: n-gram row ids, row gather (+ dequant) from a device or pinned-host table, fused gate."""

from __future__ import annotations

import torch

from dsv41_kernels.registry import attach_kernels, register
from sglang_dsv41 import shared_math
from sglang_dsv41.quant import dequant_engram_rows


@register("engram_gather")
def engram_gather(weight: torch.Tensor, scale: torch.Tensor, row_ids: torch.Tensor) -> torch.Tensor:
    """weight e4m3 [R, hd], scale e8m0 [R, hd/32] (GPU or pinned host), row_ids int64 [...] on the
    compute device -> bf16 [..., hd] on row_ids' device (fp32 dequant, one bf16 rounding)."""
    ids = row_ids.to(weight.device)
    return dequant_engram_rows(weight[ids], scale[ids]).to(row_ids.device)


@register("engram_gate")
def engram_gate(streams, kv, q_weight, k_weight, eps: float, token_mask=None):
    """streams bf16 [T, n, H], kv bf16 [T, (n+1)H] (n keys, then the shared value), q/k_weight [n, H],
    token_mask bool [T] or None (False = row unchanged) -> bf16 [T, n, H]. Per stream j, in fp32 with
    one final cast:
      d_j = sum(R_j * (q_w[j] * k_w[j]) * key_j) * rsqrt(mean R_j^2 + eps) * rsqrt(mean key_j^2 + eps) * H^-0.5
      R_j + sigmoid(sign(d_j) sqrt(max(|d_j|, 1e-6))) * value
    Both mean squares are `sglang_dsv41.reduction.mean_square`. Twin: `sglang_dsv41.shared_math.engram_gate`."""
    return shared_math.engram_gate(streams, kv, q_weight, k_weight, eps, token_mask)


@register("engram_hash")
def engram_hash(
    windows: torch.Tensor, positions: torch.Tensor, multipliers: torch.Tensor, primes: torch.Tensor,
    offsets: torch.Tensor, pad_class: int,
) -> torch.Tensor:
    """N-gram row ids (`sglang_dsv41.engram_hash.EngramHasher.hash_windows`, as a pure function).

    windows int64 [T, N]: column s = compressed class of the s-th predecessor (s = 0 the token),
    -1 = dead; positions int64 [T] absolute positions; multipliers int64 [L, N] (odd);
    primes, offsets int64 [L, N-1, Hh]; pad_class: class used for blocked columns (blocked: dead,
    or p < s, cumulative from newer to older). -> int64 [T, L, (N-1)*Hh]:
    row(l, i, h) = (XOR_{s<=i} class_s * mult[l, s]) mod primes[l, i-1, h] + offsets[l, i-1, h].
    Tables: `EngramHasher._tables(device)[1:]` and `EngramHasher.pad_class`. Twin:
    `sglang_dsv41.shared_math.hash_rows`.
    """
    return shared_math.hash_rows(windows.to(torch.long), positions, multipliers, primes, offsets, pad_class)


attach_kernels("dsv41_kernels.engram_triton", "engram_hash", "engram_gather", "engram_gate")
