"""Sparse MQA attention with a per-head sink over a dense KV (the block math: `shared_math.attend_gathered`).

o[t, h] = sum_k p_k v_k / (sum_k exp(s_k) + exp(sink_h)),  s_k = scale * q[t,h] . key_k, K = V.
Numerics follow DeepSeek's kernel: online softmax over blocks of 64 keys in list order, running
max starting at -1e30, probabilities rounded to bf16 (relative to the running max) before P.V, fp32
denominator, sink unscaled. Invalid keys contribute nothing; a row with no valid key gives zeros.
"""

from __future__ import annotations

import torch

from sglang_dsv41.shared_math import ATTN_BLOCK as BLOCK  # noqa: F401 - the block size, for callers
from sglang_dsv41.shared_math import attend_gathered


def sparse_attention(
    q: torch.Tensor, kv: torch.Tensor, sink: torch.Tensor, idx: torch.Tensor, scale: float, chunk: int = 256,
    full_tiles: bool = True,
) -> torch.Tensor:
    """q [T, h, d] bf16, kv [N, d] bf16, sink [h] fp32, idx [T, K] int (-1 = none) -> bf16 [T, h, d].
    `full_tiles=False`: a last partial block of K % 64 keys (attend_gathered)."""
    out = []
    for s in range(0, q.size(0), chunk):
        i = idx[s : s + chunk].long()
        valid = i >= 0
        out.append(attend_gathered(q[s : s + chunk], kv[i.clamp_min(0)], valid, sink, scale, full_tiles))
    return torch.cat(out) if out else q.new_zeros(q.shape)
