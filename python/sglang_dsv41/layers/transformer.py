"""The DeepSeek-V4.1 parameter tree: embed -> layers -> norm -> head, named as the checkpoint.

This module only holds parameters (plus the Engram token map); forwards live in
`sglang_dsv41.reference.model` (full sequence, the oracle) and, later, the paged runtime.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sglang_dsv41.config import ModelConfig
from sglang_dsv41.layers.block import Block
from sglang_dsv41.layers.linear import fp32_linear
from sglang_dsv41.layers.norm import RMSNorm


class Embedding(nn.Module):
    def __init__(self, vocab: int, hidden: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(vocab, hidden, dtype=torch.bfloat16), requires_grad=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)


class Head(nn.Module):
    """lm head; logits are computed in fp32 from the bf16 weight (the reference keeps it fp32)."""

    def __init__(self, vocab: int, hidden: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(vocab, hidden, dtype=torch.bfloat16), requires_grad=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return fp32_linear(h, self.weight)


class DeepseekV41(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg, role) for role in cfg.layer_roles)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.head = Head(cfg.vocab_size, cfg.hidden_size)
        # Engram compressed-token map (token id -> class), from the tokenizer; not a checkpoint tensor.
        self.register_buffer("engram_token_map", torch.zeros(0, dtype=torch.int64), persistent=False)

    def set_token_map(self, token_map: torch.Tensor) -> None:
        e = self.cfg.engram
        n_classes = int(token_map.max()) + 1 if token_map.numel() else 0
        if e is not None and n_classes != e.compressed_vocab_size:
            raise ValueError(
                f"tokenizer gives {n_classes} Engram token classes but config engram_compressed_vocab_size "
                f"is {e.compressed_vocab_size}"
            )
        self.engram_token_map = token_map.to(torch.int64).to(self.embed.weight.device)
