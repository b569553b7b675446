"""MoE: sqrtsoftplus router with noaux_tc bias, MXFP4 routed experts (W4A8), FP8 shared expert.

Numerics (DeepSeek reference): router logits fp32 (bf16 weight widened); scores sqrt(softplus(z));
top-k of scores + bias (bias selects, never weighs); weights renormalised (+1e-20) and scaled by
route_scale. An expert computes silu(min(g, L)) * clamp(u, -L, L) in fp32, multiplies by its routing
weight BEFORE the bf16 cast that feeds w2. Expert outputs (bf16) are summed in fp32 in expert-id
order, then the shared expert's bf16 output, then one cast to bf16.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sglang_dsv41.config import ModelConfig
from sglang_dsv41.layers.linear import FP8Linear, MXFP4Linear, fp32_linear


class Gate(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        m = cfg.moe
        self.topk, self.route_scale, self.norm_topk_prob = m.n_activated_experts, m.route_scale, m.norm_topk_prob
        self.weight = nn.Parameter(torch.zeros(m.n_routed_experts, cfg.hidden_size, dtype=torch.bfloat16), requires_grad=False)
        self.bias = nn.Parameter(torch.zeros(m.n_routed_experts, dtype=torch.float32), requires_grad=False)

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, H] bf16 -> fp32 [T, E] sqrtsoftplus scores (softplus is z for z > 20)."""
        return F.softplus(fp32_linear(x, self.weight)).sqrt()

    def forward(self, x: torch.Tensor, forced: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (weights fp32 [T, k], expert ids int64 [T, k]). `forced` [T, k] replays given ids."""
        s = self.scores(x)
        ids = forced.to(x.device).long() if forced is not None else (s + self.bias).topk(self.topk, dim=-1).indices
        w = s.gather(1, ids)
        if self.norm_topk_prob and self.topk > 1:
            w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
        return w * self.route_scale, ids


class Expert(nn.Module):
    """SwiGLU FFN; `linear` is MXFP4Linear (routed) or FP8Linear (shared)."""

    def __init__(self, hidden: int, inter: int, linear: type, swiglu_limit: float):
        super().__init__()
        self.w1, self.w2, self.w3 = linear(hidden, inter), linear(inter, hidden), linear(hidden, inter)
        self.limit = swiglu_limit

    def forward(self, x: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        """x [t, H] bf16, weight [t, 1] fp32 or None -> bf16 [t, H]."""
        g, u = self.w1(x).float(), self.w3(x).float()
        if self.limit > 0:
            u = u.clamp(-self.limit, self.limit)
            g = g.clamp(max=self.limit)
        h = F.silu(g) * u
        if weight is not None:
            h = weight * h
        return self.w2(h.to(x.dtype))


class MoE(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        m = cfg.moe
        self.gate = Gate(cfg)
        self.experts = nn.ModuleList(
            Expert(cfg.hidden_size, m.moe_inter_dim, MXFP4Linear, m.swiglu_limit) for _ in range(m.n_routed_experts)
        )
        self.shared_experts = Expert(cfg.hidden_size, m.moe_inter_dim, FP8Linear, m.swiglu_limit)

    def forward(self, x: torch.Tensor, forced: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, H] bf16 -> (y bf16 [T, H], routed expert ids int32 [T, k])."""
        weights, ids = self.gate(x, forced)
        y = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        for e in torch.unique(ids).tolist():  # ascending expert id: fixed fp32 summation order
            rows, slot = torch.where(ids == e)
            y[rows] += self.experts[e](x[rows], weights[rows, slot, None]).float()
        y += self.shared_experts(x).float()
        return y.to(x.dtype), ids.to(torch.int32)
