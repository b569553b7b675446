"""Paged KV storage of one model replica (byte layouts: sglang_dsv41.quant.layouts).

All pools are indexed by the full-token slot `s` handed out by the allocator (SGLang's, or the
driver's), so prefix caching shares every pool at once:
  window[l]      uint8 [S, D + D/32]          FP8 window KV of layer l (every layer)
  compressed[k]  uint8 [S//r + 1, D/2 + D/16]  FP4 latent of KV source k (ratio r), c-slot = s // r
  index_keys[k]  uint8 [S//r + 1, di/2 + di/32] FP4 index keys of KV source k
  pending[k]     fp32 [R, 2, D]               ratio 2 only: (kv, score) of a request's waiting even token
Window KV is kept for every cached token (not only the last 128), which makes prefix-cache hits exact
at the price of 528 B x layers per token; `bytes_per_token` reports it separately from the 890 B
(release config) of compressed KV + index keys that prefix caching fundamentally needs.
"""

from __future__ import annotations

import torch

from sglang_dsv41.config import ModelConfig


class KVPools:
    def __init__(self, cfg: ModelConfig, num_slots: int, num_req_slots: int, device: str | torch.device = "cpu", poison: bool = False):
        """`poison` fills never-written bytes with 0xFF (NaN in FP8/E8M0) so a wrong read shows up."""
        self.cfg, self.num_slots, self.num_req_slots = cfg, num_slots, num_req_slots
        fill = 0xFF if poison else 0
        D, di = cfg.attention.head_dim, cfg.compression.index_head_dim

        def pool(rows: int, width: int) -> torch.Tensor:
            return torch.full((rows, width), fill, dtype=torch.uint8, device=device)

        self.window = [pool(num_slots, cfg.window_kv_bytes_per_token) for _ in range(cfg.num_layers)]
        self.compressed: dict[int, torch.Tensor] = {}
        self.index_keys: dict[int, torch.Tensor] = {}
        self.pending: dict[int, torch.Tensor] = {}
        for role in cfg.layer_roles:
            if not role.is_kv_source:
                continue
            r, k = role.compress_ratio, role.layer_id
            self.compressed[k] = pool(num_slots // r + 1, cfg.compressed_kv_bytes_per_entry)
            if role.is_index_source:
                self.index_keys[k] = pool(num_slots // r + 1, di // 2 + di // 32)
            if r > 1:
                self.pending[k] = torch.zeros(num_req_slots, 2, D, dtype=torch.float32, device=device)

    @staticmethod
    def bytes_per_token(cfg: ModelConfig) -> dict[str, float]:
        """Pool bytes per cached token: 'window' (all layers), 'compressed' (+ index keys), 'total'."""
        window = cfg.window_kv_bytes_per_token * cfg.num_layers
        compressed = cfg.compressed_bytes_per_token
        return {"window": window, "compressed": compressed, "total": window + compressed}

    @staticmethod
    def bytes_per_request_slot(cfg: ModelConfig) -> int:
        """Fixed bytes per request slot: the ratio-2 pending pair state (fp32 kv + score)."""
        n2 = sum(1 for r in cfg.layer_roles if r.is_kv_source and r.compress_ratio == 2)
        return n2 * 2 * cfg.attention.head_dim * 4

    def clear_request(self, req_slot: int) -> None:
        """Drop a request slot's pending state (the slot is being reused)."""
        for p in self.pending.values():
            p[req_slot].zero_()
