"""Sparse MQA attention with a per-head sink: the torch twin of the attention kernels.

o[t, h] = sum_k p_k v_k / (sum_k exp(s_k) + exp(sink_h)),  s_k = scale * q[t,h] . kv[idx[t,k]], K = V.
Numerics follow DeepSeek's kernel: online softmax over blocks of 64 indices in index order, running
max starting at -1e30, probabilities rounded to bf16 (relative to the running max) before P.V, fp32
denominator, sink unscaled. Index -1 contributes nothing; a row with no valid index gives zeros.
"""

from __future__ import annotations

import torch

BLOCK = 64


def sparse_attention(
    q: torch.Tensor, kv: torch.Tensor, sink: torch.Tensor, idx: torch.Tensor, scale: float, chunk: int = 256
) -> torch.Tensor:
    """q [T, h, d] bf16, kv [N, d] bf16, sink [h] fp32, idx [T, K] int (-1 = none) -> bf16 [T, h, d]."""
    out = [_attend(q[s : s + chunk], kv, sink, idx[s : s + chunk], scale) for s in range(0, q.size(0), chunk)]
    return torch.cat(out) if out else q.new_zeros(q.shape)


def _attend(q: torch.Tensor, kv: torch.Tensor, sink: torch.Tensor, idx: torch.Tensor, scale: float) -> torch.Tensor:
    t, h, d = q.shape
    qf, kvf = q.float(), kv.float()
    sc = torch.tensor(scale, dtype=torch.float32, device=q.device)
    acc = torch.zeros(t, h, d, dtype=torch.float32, device=q.device)
    denom = torch.zeros(t, h, dtype=torch.float32, device=q.device)
    run_max = torch.full((t, h), -1e30, dtype=torch.float32, device=q.device)
    for s in range(0, idx.size(1), BLOCK):
        blk = idx[:, s : s + BLOCK].long()
        valid = blk >= 0
        keys = kvf[blk.clamp_min(0)] * valid.unsqueeze(-1)  # [t, b, d]
        logits = torch.einsum("thd,tbd->thb", qf, keys)
        logits = torch.where(valid.unsqueeze(1), logits, float("-inf")) * sc
        prev = run_max
        run_max = torch.maximum(prev, logits.amax(dim=-1))
        rescale = torch.exp(prev - run_max)
        p = torch.exp(logits - run_max.unsqueeze(-1))
        denom = denom * rescale + p.sum(dim=-1)
        acc = acc * rescale.unsqueeze(-1) + torch.einsum("thb,tbd->thd", p.to(torch.bfloat16).float(), keys)
    denom = denom + torch.exp(sink.float() - run_max)
    return (acc / denom.unsqueeze(-1)).to(torch.bfloat16)
