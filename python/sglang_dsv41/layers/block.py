"""One decoder layer's parameters: Engram (optional), attention, MoE, their norms and mHC sites.

Parameter names follow the checkpoint: `attn_norm`, `ffn_norm`, `hc_{attn,ffn}_{fn,base,scale}`,
`attn.*`, `ffn.*`, `engram.*`. The forward order (lagged mHC) lives with the caller.
"""

from __future__ import annotations

import torch
from torch import nn

from sglang_dsv41.config import LayerRole, ModelConfig
from sglang_dsv41.layers.attention import Attention
from sglang_dsv41.layers.engram import Engram
from sglang_dsv41.layers.mhc import mix_stats
from sglang_dsv41.layers.moe import MoE
from sglang_dsv41.layers.norm import RMSNorm


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, role: LayerRole):
        super().__init__()
        hc, H = cfg.hc, cfg.hidden_size
        self.role = role
        self.hc_iters, self.hc_eps, self.norm_eps = hc.sinkhorn_iters, hc.hc_eps, cfg.rms_norm_eps
        self.engram = Engram(cfg, role.layer_id) if role.has_engram else None
        self.attn_norm = RMSNorm(H, cfg.rms_norm_eps)
        self.attn = Attention(cfg, role)
        self.ffn_norm = RMSNorm(H, cfg.rms_norm_eps)
        self.ffn = MoE(cfg)
        for site in ("attn", "ffn"):
            self.register_parameter(f"hc_{site}_fn", nn.Parameter(torch.zeros(hc.mix_dim, hc.hc_mult * H), requires_grad=False))
            self.register_parameter(f"hc_{site}_base", nn.Parameter(torch.zeros(hc.mix_dim), requires_grad=False))
            self.register_parameter(f"hc_{site}_scale", nn.Parameter(torch.zeros(3), requires_grad=False))

    def hc_mix(self, site: str, streams: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(pre, post, comb) of site 'attn' or 'ffn' computed from that site's input streams."""
        return mix_stats(
            streams,
            getattr(self, f"hc_{site}_fn"),
            getattr(self, f"hc_{site}_base"),
            getattr(self, f"hc_{site}_scale"),
            self.hc_iters,
            self.hc_eps,
            self.norm_eps,
        )
