"""The dense KV's attention over per-sequence keys: the two formulations a numerics policy selects.

Inputs of both: q bf16 [B, t, h, d] (t query rows per sequence), keys bf16 [B, m, d] (a sequence's
window rows then its compressed rows, K = V), idx int [B, t, K] per-row key lists into the sequence's
keys (-1 = none; window oldest first, then the selected compressed positions ascending), sink fp32
[h], scale -> bf16 [B, t, h, d].

  list_attention    EXACT: `sparse_attention` over each row's list (block-64 online softmax, bf16
                    probabilities; the serving kernels' order)
  masked_attention  FAST: one softmax per sequence over all its keys, masked to the row's list, with
                    the sink, fp32 probabilities (plain batched einsums; last-bit differences only)
"""

from __future__ import annotations

import torch

from sglang_dsv41.layers.sparse_attention import sparse_attention


def list_attention(q: torch.Tensor, keys: torch.Tensor, idx: torch.Tensor, sink: torch.Tensor, scale: float) -> torch.Tensor:
    b, t, m = q.size(0), q.size(1), keys.size(1)
    offset = (torch.arange(b, device=idx.device) * m).view(b, 1, 1)
    flat = torch.where(idx >= 0, idx + offset, -1).flatten(0, 1)
    # one sequence: chunks of 256 rows; a batch: one chunk (rows are independent: same values)
    chunk = 256 if b == 1 else max(1, b * t)
    return sparse_attention(q.flatten(0, 1), keys.flatten(0, 1), sink, flat, scale, chunk=chunk).unflatten(0, (b, t))


def masked_attention(q: torch.Tensor, keys: torch.Tensor, idx: torch.Tensor, sink: torch.Tensor, scale: float) -> torch.Tensor:
    b, t, h, _ = q.shape
    m = keys.size(1)
    slot = torch.where(idx >= 0, idx.long(), m)
    visible = torch.zeros(b, t, m + 1, dtype=torch.bool, device=q.device).scatter(2, slot, True)[..., :m]
    kf = keys.float()
    logits = torch.einsum("bphd,bkd->bhpk", q.float(), kf) * scale
    logits = logits.masked_fill(~visible.unsqueeze(1), float("-inf"))
    p = torch.softmax(torch.cat([logits, sink.float().view(1, h, 1, 1).expand(b, h, t, 1)], dim=-1), dim=-1)[..., :-1]
    return torch.einsum("bhpk,bkd->bphd", p, kf).to(torch.bfloat16)
