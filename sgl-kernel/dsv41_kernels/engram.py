"""Engram ops: n-gram row ids, row gather (+ dequant) from a device or pinned-host table, fused gate."""

from __future__ import annotations

import torch

from dsv41_kernels.registry import attach_kernels, register
from sglang_dsv41.quant import dequant_engram_rows
from sglang_dsv41.reduction import mean_square


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
    Both mean squares are the shared statistic `sglang_dsv41.reduction.mean_square`."""
    t, n, hid = streams.shape
    keys = kv[:, : n * hid].float().reshape(t, n, hid)
    value = kv[:, n * hid :].float().reshape(t, 1, hid)
    r = streams.float()
    qk = q_weight.float() * k_weight.float()
    inv_r = torch.rsqrt(mean_square(r)[..., 0] + eps)
    inv_k = torch.rsqrt(mean_square(keys)[..., 0] + eps)
    dot = (r * qk * keys).sum(-1)
    d = dot * (inv_r * inv_k) * hid**-0.5
    root = d.abs().clamp_min(1e-6).sqrt()
    gate = torch.sigmoid(torch.copysign(root, d))  # sign of d, -0 included
    if token_mask is not None:
        gate = torch.where(token_mask.reshape(t, 1), gate, torch.zeros((), dtype=gate.dtype, device=gate.device))
    return (r + gate.unsqueeze(-1) * value).to(streams.dtype)


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


attach_kernels("dsv41_kernels.engram_triton", "engram_hash", "engram_gather", "engram_gate")
