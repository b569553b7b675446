"""V4.1 low-ratio compressor (KV-source layers only; spec attention 2.3).

ratio 1: latent_t = RMSNorm(wkv(x_t)) with a bf16 GEMM; one latent per token.
ratio 2: [kv_t | s_t] = (wkv; wgate)(x_t) in fp32 (bf16 weights widened); pair (2m, 2m+1) pools as
         sum_i softmax_i(s)[c] * kv_i[c] over the pair, in fp32; then cast to bf16 and RMSNorm.
The returned latent is pre-RoPE: the index keys are derived from it, and the caller rotates it at
the group's first position (m * ratio) and rounds it to FP4 for the compressed KV.
"""

from __future__ import annotations

import torch
from torch import nn

from sglang_dsv41.config import ModelConfig
from sglang_dsv41.layers.linear import BF16Linear
from sglang_dsv41.layers.norm import RMSNorm


class Compressor(nn.Module):
    def __init__(self, cfg: ModelConfig, ratio: int):
        super().__init__()
        D = cfg.attention.head_dim
        self.ratio = ratio
        self.wkv = BF16Linear(cfg.hidden_size, D)
        if ratio > 1:
            self.wgate = BF16Linear(cfg.hidden_size, D)
        self.norm = RMSNorm(D, cfg.rms_norm_eps)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """ratio 2 only: x [T, H] bf16 -> (kv fp32 [T, D], score fp32 [T, D])."""
        return self.wkv.forward_fp32(x), self.wgate.forward_fp32(x)

    def pool(self, kv: torch.Tensor, score: torch.Tensor) -> torch.Tensor:
        """Complete groups: kv/score fp32 [m*ratio, D] -> bf16 latents [m, D] (pre-RoPE)."""
        kv = kv.unflatten(0, (-1, self.ratio))
        score = score.unflatten(0, (-1, self.ratio))
        pooled = (kv * score.softmax(dim=1)).sum(dim=1)
        return self.norm(pooled.to(torch.bfloat16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, H] bf16 whose first row starts a group -> latents [T // ratio, D] bf16 (pre-RoPE).
        A trailing incomplete group is dropped (the runtime keeps it as pending state)."""
        if self.ratio == 1:
            return self.norm(self.wkv(x))
        n = x.size(0) - x.size(0) % self.ratio
        kv, score = self.project(x[:n])
        return self.pool(kv, score)
