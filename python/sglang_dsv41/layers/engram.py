"""Engram: hashed n-gram memory added into every mHC stream with a per-stream scalar gate.

Per token: gather the Engram layer's (N-1)*heads table rows (FP8 E4M3 + E8M0 per 32, dequantised in
fp32, one bf16 rounding), flatten, project with the FP8 `wkv` to n keys + one shared value, then for
each stream j, in fp32 with one final cast:
  d = sum(R_j * q_w[j] * k_w[j] * key_j) * rsqrt(mean R_j^2 + eps) * rsqrt(mean key_j^2 + eps) / sqrt(H)
  R_j <- R_j + sigmoid(sign(d) * sqrt(max(|d|, 1e-6))) * value
Row ids come from `sglang_dsv41.engram_hash` (computed once per forward for all Engram layers).
"""

from __future__ import annotations

import torch
from torch import nn

from sglang_dsv41.config import ModelConfig
from sglang_dsv41.layers.linear import FP8Linear
from sglang_dsv41.quant import dequant_engram_rows
from sglang_dsv41.numerics import Slot
from sglang_dsv41.reduction import mean_square, plain_mean_square
from sglang_dsv41.shared_math import gate_streams


def gather_rows(weight: torch.Tensor, scale: torch.Tensor, row_ids: torch.Tensor) -> torch.Tensor:
    """weight e4m3 [R, hd], scale e8m0 [R, hd/32], row_ids int64 [...] -> bf16 [..., hd]."""
    return dequant_engram_rows(weight[row_ids], scale[row_ids])


class EngramTable(nn.Module):
    """weight F8_E4M3 [rows, head_dim], scale F8_E8M0 [rows, head_dim/32] (264 B/row at 256)."""

    numerics_slots = {"gather": Slot("engram", kernel="engram_gather")}  # sglang_dsv41/numerics.py
    gather = staticmethod(gather_rows)

    def __init__(self, rows: int, head_dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(rows, head_dim, dtype=torch.float8_e4m3fn), requires_grad=False)
        self.scale = nn.Parameter(torch.zeros(rows, head_dim // 32, dtype=torch.float8_e8m0fnu), requires_grad=False)

    def forward(self, row_ids: torch.Tensor) -> torch.Tensor:
        """row_ids int64 [...] -> bf16 [..., head_dim]."""
        return self.gather(self.weight, self.scale, row_ids)


def engram_gate(
    streams: torch.Tensor,
    kv: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
    token_mask: torch.Tensor | None = None,
    mean_sq=mean_square,
) -> torch.Tensor:
    """streams [T, n, H] bf16, kv [T, (n+1)H] bf16 (n keys then the value), q/k_weight [n, H]
    -> bf16 [T, n, H]. All fp32 with one final cast; token_mask [T] False = unchanged row.
    `mean_sq`: the fixed-order statistic, or the plain one (`engram_gate_plain`, FAST)."""
    return gate_streams(streams, kv, q_weight, k_weight, eps, token_mask, mean_sq)


def engram_gate_plain(streams, kv, q_weight, k_weight, eps, token_mask=None) -> torch.Tensor:
    """`engram_gate` with the plain mean square (the FAST form of the `gate` slot)."""
    return engram_gate(streams, kv, q_weight, k_weight, eps, token_mask, plain_mean_square)


class Engram(nn.Module):
    numerics_slots = {"gate": Slot("norm", kernel="engram_gate", fast=engram_gate_plain)}
    gate = staticmethod(engram_gate)

    def __init__(self, cfg: ModelConfig, layer_id: int):
        super().__init__()
        e = cfg.engram
        self.n, self.hidden, self.eps = cfg.hc.hc_mult, cfg.hidden_size, cfg.rms_norm_eps
        self.embed = EngramTable(e.num_embeddings[e.layer_ids.index(layer_id)], e.head_dim)
        self.wkv = FP8Linear(e.n_hash_cols * e.head_dim, (self.n + 1) * cfg.hidden_size, cfg.weight_block_size)
        self.q_weight = nn.Parameter(torch.ones(self.n, cfg.hidden_size, dtype=torch.bfloat16), requires_grad=False)
        self.k_weight = nn.Parameter(torch.ones(self.n, cfg.hidden_size, dtype=torch.bfloat16), requires_grad=False)

    def forward(self, streams: torch.Tensor, row_ids: torch.Tensor, token_mask: torch.Tensor | None = None) -> torch.Tensor:
        """streams [T, n, H] bf16, row_ids int64 [T, cols]; token_mask [T] False = leave unchanged."""
        kv = self.wkv(self.embed(row_ids).flatten(-2))
        return self.gate(streams, kv, self.q_weight, self.k_weight, self.eps, token_mask)
