"""Engram ops: n-gram row ids, row gather (+ dequant) from a device or pinned-host table, fused gate."""

from __future__ import annotations

import torch

from dsv41_kernels.registry import register
from sglang_dsv41.layers.engram import engram_gate as _gate
from sglang_dsv41.quant import dequant_engram_rows


@register("engram_gather")
def engram_gather(weight: torch.Tensor, scale: torch.Tensor, row_ids: torch.Tensor) -> torch.Tensor:
    """weight e4m3 [R, hd], scale e8m0 [R, hd/32] (GPU or pinned host), row_ids int64 [...] on the
    compute device -> bf16 [..., hd] on row_ids' device (fp32 dequant, one bf16 rounding)."""
    ids = row_ids.to(weight.device)
    return dequant_engram_rows(weight[ids], scale[ids]).to(row_ids.device)


@register("engram_gate")
def engram_gate(streams, kv, q_weight, k_weight, eps: float, token_mask=None):
    """streams bf16 [T, n, H], kv bf16 [T, (n+1)H] -> bf16 [T, n, H] (see layers.engram)."""
    return _gate(streams, kv, q_weight, k_weight, eps, token_mask)


@register("engram_hash")
def engram_hash(
    windows: torch.Tensor, positions: torch.Tensor, multipliers: torch.Tensor, primes: torch.Tensor,
    offsets: torch.Tensor, pad_class: int,
) -> torch.Tensor:
    """N-gram row ids (sglang_dsv41.engram_hash.EngramHasher.hash_windows, as a pure function).

    windows int64 [T, N]: column s = compressed class of the s-th predecessor (s = 0 the token),
    -1 = dead; positions int64 [T] absolute positions; multipliers int64 [L, N] (odd);
    primes, offsets int64 [L, N-1, Hh]; pad_class: class used for blocked columns (blocked: dead,
    or p < s, cumulative from newer to older). -> int64 [T, L, (N-1)*Hh]:
    row(l, i, h) = (XOR_{s<=i} class_s * mult[l, s]) mod primes[l, i-1, h] + offsets[l, i-1, h].
    Tables: `EngramHasher._tables(device)[1:]` and `EngramHasher.pad_class`.
    """
    t, n = windows.shape
    w = windows.to(torch.long)
    cols = torch.arange(n, device=w.device).unsqueeze(0)
    blocked = ((w < 0) | (positions.to(device=w.device, dtype=torch.long).unsqueeze(1) < cols)).long().cumsum(1) > 0
    classes = torch.where(blocked, torch.full_like(w, pad_class), w)
    prod = classes.unsqueeze(1) * multipliers.unsqueeze(0)  # [T, L, N]
    rolling = [prod[:, :, 0]]
    for s in range(1, n):
        rolling.append(torch.bitwise_xor(rolling[-1], prod[:, :, s]))
    r = torch.stack(rolling[1:], dim=2)  # [T, L, N-1]
    rows = torch.remainder(r.unsqueeze(-1), primes.unsqueeze(0)) + offsets.unsqueeze(0)
    return rows.reshape(t, multipliers.size(0), -1)


try:  # attach the Triton kernels (importing them compiles nothing); twins only without Triton
    from dsv41_kernels import engram_triton as _triton  # noqa: E402,F401
except ImportError:  # pragma: no cover
    pass
