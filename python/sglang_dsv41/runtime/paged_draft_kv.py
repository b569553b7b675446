"""The DSpark drafter's KV over the paged pools (layers/dspark.py `DraftKV`).

Stage k's context rows live in `pools.window[num_layers + k]` with the backbone's placement: per
token slot (`token_table[b, position]`, so a prefix hit shares them like the backbone's window KV)
or, with window rings, in the request's ring (`req_slot * C + position % C`). Context rows are
committed positions only (the prompt's, then each verify's accepted rows), so a ring never holds a
rejected row.

A draft step of request b with last context position p lists, per block row, DeepSeek's keys
(reference/dense_draft_kv.py): its ring slots 0 .. min(W, p+1) - 1 in slot order (slot j: the
newest position <= p congruent to j mod W), read from the pool, then the gamma block rows' own keys
(never stored). Lists are exactly that long (`full_tiles=False`), so requests attend in groups of
equal length; the values are the dense KV's bit for bit (the pool holds the FP8 grid exactly).

Fixed shapes (a captured DSpark step, runtime/spec_graph.py): `for_draft(full_window=True)` assumes
every request has at least W context positions, so all lists are W + gamma long and there is one
group (no host read); `for_context(live=)` writes slot -1 (nothing) for the rows marked dead.
"""

from __future__ import annotations

import torch

from sglang_dsv41.layers.sparse_attention import sparse_attention
from sglang_dsv41.quant import window_kv_unpack
from sglang_dsv41.reference.dense_draft_kv import ring_positions
from sglang_dsv41.runtime.pools import KVPools


class PagedDraftKV:
    def __init__(self, pools: KVPools, token_table: torch.Tensor, req_slots: torch.Tensor, ops,
                 positions: torch.Tensor, req_index: torch.Tensor, live: torch.Tensor | None = None,
                 full_window: bool = False):
        self.pools, self.table, self.req_slots, self.ops = pools, token_table, req_slots, ops
        self.cfg = pools.cfg
        self.window, self.gamma = self.cfg.attention.window_size, self.cfg.dspark.block_size
        self.positions, self.req = positions, req_index
        self.live, self.full_window = live, full_window
        self._block: torch.Tensor | None = None
        self.last: torch.Tensor | None = None

    @classmethod
    def for_context(cls, pools, token_table, req_slots, ops, positions, req_index,
                    live: torch.Tensor | None = None) -> "PagedDraftKV":
        """Context rows: int64 positions [n] of requests req_index [n] (rows of `token_table`);
        live bool [n] (None: all) rows that are stored."""
        return cls(pools, token_table, req_slots, ops, positions, req_index, live=live)

    @classmethod
    def for_draft(cls, pools, token_table, req_slots, ops, last: torch.Tensor, full_window: bool = False) -> "PagedDraftKV":
        """One draft step per request: last int64 [B] its last context position. `full_window`: every
        request has last >= W - 1 (fixed shapes; the caller guarantees it)."""
        g = pools.cfg.dspark.block_size
        B = last.numel()
        pos = (last.unsqueeze(-1) + 1 + torch.arange(g, device=last.device)).flatten()
        kv = cls(pools, token_table, req_slots, ops, pos, torch.arange(B, device=last.device).repeat_interleave(g),
                 full_window=full_window)
        kv.last = last
        return kv

    def _slots(self, req: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Pool rows of (request, position) pairs (any shape; position -1 -> -1)."""
        ok = pos >= 0
        p = pos.clamp_min(0)
        if self.pools.window_rings:
            c = self.pools.ring_capacity
            rows = self.req_slots[req] * c + p % c
        else:
            rows = self.table[req, p.clamp(max=self.table.size(1) - 1)]
        return torch.where(ok, rows, -1)

    def freqs(self, rotary) -> tuple[torch.Tensor, torch.Tensor]:
        return rotary.freqs(self.positions)

    def add_context(self, attn, kv: torch.Tensor, freqs) -> None:
        norm = attn.kv_norm
        slots = self._slots(self.req, self.positions)
        if self.live is not None:
            slots = torch.where(self.live, slots, -1)
        self.ops.window_kv_store(kv, norm.weight, norm.eps, *freqs, slots, self.pools.window[attn.role.layer_id])

    def store_window(self, attn, kv: torch.Tensor, freqs) -> None:
        self._block = attn.window_keys(kv, freqs)

    def attend(self, attn, q: torch.Tensor, topk: None) -> torch.Tensor:
        g, last = self.gamma, self.last
        pool = self.pools.window[attn.role.layer_id]
        B = last.numel()
        n_ctx = torch.clamp(last + 1, max=self.window)
        ring = ring_positions(last, self.window)  # [B, W] positions in DeepSeek's slot order
        slots = self._slots(torch.arange(B, device=last.device).unsqueeze(-1).expand_as(ring), ring)
        out = torch.empty_like(q)
        groups = [self.window] if self.full_window else torch.unique(n_ctx).tolist()
        for n in groups:
            reqs = torch.arange(B, device=q.device) if self.full_window else torch.nonzero(n_ctx == n).flatten()
            rows = (reqs.unsqueeze(-1) * g + torch.arange(g, device=q.device)).flatten()
            ctx = window_kv_unpack(pool[slots[reqs, :n].flatten()]).view(reqs.numel(), n, -1)
            block = self._block[rows].view(reqs.numel(), g, -1)
            keys = torch.cat([ctx, block], dim=1).flatten(0, 1)  # [m * (n + g), D]
            idx = (torch.arange(reqs.numel(), device=q.device).view(-1, 1) * (n + g)
                   + torch.arange(n + g, device=q.device)).repeat_interleave(g, dim=0)
            out[rows] = sparse_attention(q[rows], keys, attn.attn_sink, idx, attn.softmax_scale, full_tiles=False)
        return out
