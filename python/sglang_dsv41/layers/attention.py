"""V4.1 attention layer parameters and its per-token pieces (spec attention 1).

Query:  qr = q_norm(wq_a(x)); q = rope(wq_b(qr)) [T, h, D]            (no per-head norm in V4.1)
Window: kv = FP8(rope(kv_norm(wkv(x))))  [T, D]  (MXFP8 per 32, RoPE dims included)
Compressed KV (KV sources): FP4(rope(latent, group_pos))  (E2M1 + E4M3 scale per 16)
Output: o [T, h, D] -> inverse rope on the last 64 dims -> wo_a per group (bf16) -> wo_b (FP8).
The cross-layer plumbing (which cache, which selection) is the caller's; see reference/model.py.
"""

from __future__ import annotations

import torch
from torch import nn

from sglang_dsv41.config import LayerRole, ModelConfig
from sglang_dsv41.layers.compressor import Compressor
from sglang_dsv41.layers.indexer import Indexer
from sglang_dsv41.layers.linear import FP8Linear
from sglang_dsv41.layers.norm import RMSNorm
from sglang_dsv41.layers.rope import Rotary
from sglang_dsv41.quant import kv_fp4_qdq, window_kv_qdq


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, role: LayerRole):
        super().__init__()
        a, H, blk, eps = cfg.attention, cfg.hidden_size, cfg.weight_block_size, cfg.rms_norm_eps
        self.role = role
        self.n_heads, self.head_dim, self.o_groups, self.o_lora_rank = a.n_heads, a.head_dim, a.o_groups, a.o_lora_rank
        self.softmax_scale = a.softmax_scale
        self.wq_a = FP8Linear(H, a.q_lora_rank, blk)
        self.q_norm = RMSNorm(a.q_lora_rank, eps)
        self.wq_b = FP8Linear(a.q_lora_rank, a.n_heads * a.head_dim, blk)
        self.wkv = FP8Linear(H, a.head_dim, blk)
        self.kv_norm = RMSNorm(a.head_dim, eps)
        self.wo_a = FP8Linear(a.n_heads * a.head_dim // a.o_groups, a.o_groups * a.o_lora_rank, blk)
        self.wo_b = FP8Linear(a.o_groups * a.o_lora_rank, H, blk)
        self.attn_sink = nn.Parameter(torch.zeros(a.n_heads), requires_grad=False)
        self.rotary = Rotary(cfg, role.rope_kind)
        if role.is_kv_source:
            self.compressor = Compressor(cfg, role.compress_ratio)
        if role.is_index_source:
            self.indexer = Indexer(cfg, owns_keys=role.is_kv_source)

    def query(self, x: torch.Tensor, freqs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, H] bf16 -> (q [T, h, D] bf16 rotated, qr [T, q_lora] bf16 normed)."""
        qr = self.q_norm(self.wq_a(x))
        q = self.wq_b(qr).unflatten(-1, (self.n_heads, self.head_dim))
        return self.rotary.apply(q, freqs), qr

    def window_kv(self, x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        """x [T, H] -> bf16 [T, D] window K(=V), already on the FP8 grid."""
        return window_kv_qdq(self.rotary.apply(self.kv_norm(self.wkv(x)), freqs))

    def compressed_kv(self, latent: torch.Tensor, group_freqs: torch.Tensor) -> torch.Tensor:
        """latent [n, D] bf16 pre-RoPE -> bf16 [n, D] on the FP4 (E4M3/16) grid."""
        return kv_fp4_qdq(self.rotary.apply(latent, group_freqs))

    def output(self, o: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        """o [T, h, D] bf16 -> [T, H] bf16."""
        o = self.rotary.apply(o, freqs, inverse=True)
        wo_a = self.wo_a.dequantized().view(self.o_groups, self.o_lora_rank, -1)
        y = torch.einsum("tgd,grd->tgr", o.flatten(1).unflatten(-1, (self.o_groups, -1)), wo_a)
        return self.wo_b(y.flatten(1))
