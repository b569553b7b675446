"""Shared math of the torch twins (pure torch; imports nothing from `sglang_dsv41.layers`).

The twins are an independent implementation of the reference math: their own code, checked against
the layer functions by test/kernels/test_twins_vs_reference.py. They must round exactly where the
reference rounds (docs/numerics.md), because the paged runtime calls them on CPU and must equal the
reference forward bit for bit; so every fp32 step below is one IEEE operation in a fixed order:

  rope_last_dims   interleaved pairs (x[2i], x[2i+1]) of the last 2*cos.size(-1) dims rotate in fp32:
                   y0 = x0*c - x1*s, y1 = x0*s + x1*c (each product and sum rounded separately),
                   one cast back to x.dtype; the other dims are copied.
  rms_normalize    x * rsqrt(mean_square(x) + eps) in fp32, times the fp32 weight, one cast back. The
                   statistic is `sglang_dsv41.reduction.mean_square` (one definition for every path).
  attend_blocks    sparse MQA over per-row key lists: online softmax over blocks of 64 keys in list
                   order, running max from -1e30, bf16 probabilities, fp32 denominator, sink in the
                   denominator only (scale not applied to it); no valid key -> zeros.
"""

from __future__ import annotations

import torch

from sglang_dsv41.reduction import mean_square

ATTN_BLOCK = 64
RUN_MAX_START = -1e30


def rope_last_dims(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, ..., d] (bf16 or fp32); cos, sin fp32 [T, rd/2] -> x.dtype [T, ..., d] (out of place)."""
    half = cos.size(-1)
    rd = 2 * half
    lead = (x.size(0),) + (1,) * (x.dim() - 2) + (half,)
    c, s = cos.reshape(lead), sin.reshape(lead)
    tail = x[..., x.size(-1) - rd :]
    even, odd = tail[..., 0::2].float(), tail[..., 1::2].float()
    out = x.clone()
    out_tail = out[..., x.size(-1) - rd :]
    out_tail[..., 0::2] = (even * c - odd * s).to(x.dtype)
    out_tail[..., 1::2] = (even * s + odd * c).to(x.dtype)
    return out


def rms_normalize(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """x [..., d] -> x.dtype: fp32 x / rms(x) (times the fp32 weight), one cast back."""
    inv_rms = torch.rsqrt(mean_square(x) + eps)
    y = x.float() * inv_rms
    return (y if weight is None else weight.float() * y).to(x.dtype)


def attend_blocks(q: torch.Tensor, keys: torch.Tensor, valid: torch.Tensor, sink: torch.Tensor, scale: float) -> torch.Tensor:
    """q bf16 [t, h, d]; keys [t, K, d] (bf16 values; K = V); valid bool [t, K]; sink fp32 [h]
    -> bf16 [t, h, d] = sum_k p_k key_k / (sum_k p_k + exp(sink - max)), keys visited 64 at a time."""
    t, h, d = q.shape
    dev = q.device
    qf = q.float()
    scale_t = torch.tensor(scale, dtype=torch.float32, device=dev)
    m = torch.full((t, h), RUN_MAX_START, dtype=torch.float32, device=dev)
    num = torch.zeros(t, h, d, dtype=torch.float32, device=dev)
    den = torch.zeros(t, h, dtype=torch.float32, device=dev)
    for lo in range(0, keys.size(1), ATTN_BLOCK):
        ok = valid[:, lo : lo + ATTN_BLOCK]
        # invalid keys are zeroed before the product, so a garbage (NaN) row never reaches the sums
        kb = torch.where(ok.unsqueeze(-1), keys[:, lo : lo + ATTN_BLOCK].float(), 0.0)
        s = torch.einsum("thd,tbd->thb", qf, kb)
        s = torch.where(ok.unsqueeze(1), s, float("-inf")) * scale_t
        m_new = torch.maximum(m, s.amax(dim=-1))
        alpha = torch.exp(m - m_new)
        p = torch.exp(s - m_new.unsqueeze(-1))
        den = den * alpha + p.sum(dim=-1)
        num = num * alpha.unsqueeze(-1) + torch.einsum("thb,tbd->thd", p.to(torch.bfloat16).float(), kb)
        m = m_new
    den = den + torch.exp(sink.float() - m)
    return (num / den.unsqueeze(-1)).to(torch.bfloat16)
