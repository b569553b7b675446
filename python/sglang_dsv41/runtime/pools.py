"""Paged KV storage of one model replica (byte layouts: sglang_dsv41.quant.layouts).

Compressed KV and index keys are indexed by the full-token slot `s` handed out by the allocator
(SGLang's, or the driver's), so prefix caching shares them:
  compressed[k]  uint8 [S//r + 1, D/2 + D/16]  FP4 latent of KV source k (ratio r), c-slot = s // r
  index_keys[k]  uint8 [S//r + 1, di/2 + di/32] FP4 index keys of KV source k
  pending[k]     fp32 [R, 2, D]               ratio 2 only: (kv, score) of a request's waiting even token
The FP8 window KV (528 B x layers per token for the release config) has two placements:
  per token slot (default)   window[l] uint8 [S, D + D/32], kept for every cached token, so a prefix
      hit reads exactly the bytes a cold prefill wrote (exact, but 24x the compressed bytes).
  request rings (encoder SWA bounded replay, spec attention 7.1)   window[l] uint8
      [R * C + M, D + D/32]: row `req_slot * C + position % C` holds the window KV of one of the last
      C = window positions of the request in that slot; rows R*C .. R*C+M-1 are the forward's
      workspace (row R*C + i = the i-th row of the current forward). Nothing is kept per cached
      token: a hit rebuilds its window by recomputing the last min(P, window) cached tokens.
"""

from __future__ import annotations

import torch

from sglang_dsv41.config import ModelConfig


class KVPools:
    def __init__(self, cfg: ModelConfig, num_slots: int, num_req_slots: int, device: str | torch.device = "cpu",
                 poison: bool = False, window_rings: bool = False, workspace_rows: int = 0, speculative: bool = False):
        """`poison` fills never-written bytes with 0xFF (NaN in FP8/E8M0) so a wrong read shows up.
        `window_rings`: window KV in per-request rings plus a workspace of `workspace_rows` rows (grown
        on demand by `reserve_workspace`). `speculative` (DSpark): one more window pool per draft stage
        (`window[num_layers + k]`, the stage's context rows, same placement as the backbone's) and
        rings of window + gamma + 1 positions, so a verify's gamma + 1 optimistic rows never overwrite
        a position still inside the window of the committed ones."""
        self.cfg, self.num_slots, self.num_req_slots = cfg, num_slots, num_req_slots
        self.device, self.fill = device, 0xFF if poison else 0
        self.window_rings = window_rings
        if speculative and cfg.dspark is None:
            raise ValueError("speculative pools need a checkpoint with a DSpark drafter")
        self.draft_stages = cfg.dspark.n_stages if speculative else 0
        extra = cfg.dspark.verify_rows if speculative else 0
        self.ring_capacity = cfg.attention.window_size + extra if window_rings else 0
        D, di = cfg.attention.head_dim, cfg.compression.index_head_dim
        window_rows = num_req_slots * self.ring_capacity + workspace_rows if window_rings else num_slots
        self.window = [self._pool(window_rows, cfg.window_kv_bytes_per_token)
                       for _ in range(cfg.num_layers + self.draft_stages)]
        self.compressed: dict[int, torch.Tensor] = {}
        self.index_keys: dict[int, torch.Tensor] = {}
        self.pending: dict[int, torch.Tensor] = {}
        for role in cfg.layer_roles:
            if not role.is_kv_source:
                continue
            r, k = role.compress_ratio, role.layer_id
            self.compressed[k] = self._pool(num_slots // r + 1, cfg.compressed_kv_bytes_per_entry)
            if role.is_index_source:
                self.index_keys[k] = self._pool(num_slots // r + 1, di // 2 + di // 32)
            if r > 1:
                self.pending[k] = torch.zeros(num_req_slots, 2, D, dtype=torch.float32, device=device)

    def _pool(self, rows: int, width: int) -> torch.Tensor:
        return torch.full((rows, width), self.fill, dtype=torch.uint8, device=self.device)

    @property
    def workspace_base(self) -> int:
        """Ring mode: first workspace row of the window pools."""
        return self.num_req_slots * self.ring_capacity

    @torch.inference_mode()
    def reserve_workspace(self, rows: int) -> None:
        """Ring mode: make room for a forward of `rows` rows (keeps the rings)."""
        have = self.window[0].size(0) - self.workspace_base
        if rows <= have:
            return
        grown = max(rows, 2 * have)
        for i, w in enumerate(self.window):
            bigger = self._pool(self.workspace_base + grown, w.size(1))
            bigger[: self.workspace_base] = w[: self.workspace_base]
            self.window[i] = bigger

    @staticmethod
    def bytes_per_token(cfg: ModelConfig, window_rings: bool = False, speculative: bool = False) -> dict[str, float]:
        """Pool bytes per cached token: 'window' (all layers, and the DSpark stages when `speculative`;
        0 with rings), 'compressed' (+ index keys), 'total'."""
        layers = cfg.num_layers + (cfg.dspark.n_stages if speculative else 0)
        window = 0 if window_rings else cfg.window_kv_bytes_per_token * layers
        compressed = cfg.compressed_bytes_per_token
        return {"window": window, "compressed": compressed, "total": window + compressed}

    @staticmethod
    def bytes_per_request_slot(cfg: ModelConfig, window_rings: bool = False) -> int:
        """Fixed bytes per request slot: the ratio-2 pending pair state (fp32 kv + score), plus the
        window rings (window x layers x 528 B for the release config) in ring mode."""
        n2 = sum(1 for r in cfg.layer_roles if r.is_kv_source and r.compress_ratio == 2)
        ring = cfg.attention.window_size * cfg.window_kv_bytes_per_token * cfg.num_layers if window_rings else 0
        return n2 * 2 * cfg.attention.head_dim * 4 + ring

    @staticmethod
    def slots_for_budget(cfg: ModelConfig, budget_bytes: int, num_req_slots: int, page_size: int,
                         window_rings: bool = False) -> int:
        """Token slots (a multiple of `page_size`) whose pools fit in `budget_bytes` after the fixed
        per-request state: size the pools once, at load, from a memory budget (a driver's
        `max_tokens`). ValueError when not even one page fits."""
        per_token = KVPools.bytes_per_token(cfg, window_rings)["total"]
        fixed = num_req_slots * KVPools.bytes_per_request_slot(cfg, window_rings)
        pages = int((budget_bytes - fixed) // (per_token * page_size)) if budget_bytes > fixed else 0
        if pages < 2:  # page 0 is the driver's scratch page
            need = fixed + 2 * page_size * per_token
            raise ValueError(f"KV memory budget of {budget_bytes} bytes holds no page of {page_size} tokens for "
                             f"{num_req_slots} request slots (at least {int(need)} bytes)")
        return pages * page_size

    @torch.inference_mode()
    def clear_request(self, req_slot: int) -> None:
        """Drop a request slot's pending state and (ring mode) its window ring: the slot starts a
        new window (a new request, or a retracted one). Inference mode: the pools may have been
        (re)allocated inside a forward."""
        for p in self.pending.values():
            p[req_slot].zero_()
        if self.window_rings:
            c = self.ring_capacity
            for w in self.window:
                w[req_slot * c : (req_slot + 1) * c] = self.fill
