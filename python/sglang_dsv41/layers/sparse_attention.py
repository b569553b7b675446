"""Sparse MQA attention with a per-head sink: the torch twin of the attention kernels.

o[t, h] = sum_k p_k v_k / (sum_k exp(s_k) + exp(sink_h)),  s_k = scale * q[t,h] . key_k, K = V.
Numerics follow DeepSeek's kernel: online softmax over blocks of 64 keys in list order, running
max starting at -1e30, probabilities rounded to bf16 (relative to the running max) before P.V, fp32
denominator, sink unscaled. Invalid keys contribute nothing; a row with no valid key gives zeros.
"""

from __future__ import annotations

import torch

BLOCK = 64


def sparse_attention(
    q: torch.Tensor, kv: torch.Tensor, sink: torch.Tensor, idx: torch.Tensor, scale: float, chunk: int = 256
) -> torch.Tensor:
    """q [T, h, d] bf16, kv [N, d] bf16, sink [h] fp32, idx [T, K] int (-1 = none) -> bf16 [T, h, d]."""
    out = []
    for s in range(0, q.size(0), chunk):
        i = idx[s : s + chunk].long()
        valid = i >= 0
        out.append(attend_gathered(q[s : s + chunk], kv[i.clamp_min(0)], valid, sink, scale))
    return torch.cat(out) if out else q.new_zeros(q.shape)


def attend_gathered(q: torch.Tensor, keys: torch.Tensor, valid: torch.Tensor, sink: torch.Tensor, scale: float) -> torch.Tensor:
    """Per-row key lists. q [t, h, d] bf16, keys [t, K, d] (bf16 values), valid bool [t, K],
    sink [h] fp32 -> bf16 [t, h, d]. Keys are visited in list order, 64 at a time."""
    t, h, d = q.shape
    qf = q.float()
    sc = torch.tensor(scale, dtype=torch.float32, device=q.device)
    acc = torch.zeros(t, h, d, dtype=torch.float32, device=q.device)
    denom = torch.zeros(t, h, dtype=torch.float32, device=q.device)
    run_max = torch.full((t, h), -1e30, dtype=torch.float32, device=q.device)
    for s in range(0, keys.size(1), BLOCK):
        ok = valid[:, s : s + BLOCK]
        blk = torch.where(ok.unsqueeze(-1), keys[:, s : s + BLOCK].float(), 0.0)  # [t, b, d]; never read invalid keys
        logits = torch.einsum("thd,tbd->thb", qf, blk)
        logits = torch.where(ok.unsqueeze(1), logits, float("-inf")) * sc
        prev = run_max
        run_max = torch.maximum(prev, logits.amax(dim=-1))
        rescale = torch.exp(prev - run_max)
        p = torch.exp(logits - run_max.unsqueeze(-1))
        denom = denom * rescale + p.sum(dim=-1)
        acc = acc * rescale.unsqueeze(-1) + torch.einsum("thb,tbd->thd", p.to(torch.bfloat16).float(), blk)
    denom = denom + torch.exp(sink.float() - run_max)
    return (acc / denom.unsqueeze(-1)).to(torch.bfloat16)
