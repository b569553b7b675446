"""Paged KV: the KV interface (layers/kv.py) over a packed `Batch` and the `KVPools`, through an
op table (`dsv41_kernels.op_table.OpTable`: Triton kernels on CUDA, their torch twins elsewhere).

New rows write their window KV (every layer) and, at KV sources, their completed groups' compressed
KV and index keys into the pools *before* attention, so a row sees its own chunk causally, earlier
chunks / cached prefixes through `token_table`, and decode needs nothing else. Key order per query
matches the dense KV exactly (window: fixed width, oldest first; then the selected compressed
positions ascending), so results agree with the reference row by row.
"""

from __future__ import annotations

import torch

from sglang_dsv41.config import ModelConfig
from sglang_dsv41.engram_hash import EngramHasher
from sglang_dsv41.runtime.batch import Batch
from sglang_dsv41.runtime.pools import KVPools


class PagedKV:
    """One forward of `batch` over `pools` (per-forward derived indices live here)."""

    def __init__(self, cfg: ModelConfig, pools: KVPools, batch: Batch, ops):
        self.cfg, self.pools, self.batch, self.ops = cfg, pools, batch, ops
        self.positions = batch.positions
        self.out_slots = batch.out_slots  # int64 [N] pool slot each row writes
        self.window_slots = self._window_slots()  # int64 [N, W]
        self.slot_tables: dict[int, torch.Tensor] = {}  # ratio -> int64 [N, n_max]
        self.comp_slots: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # index source -> (topk, slots [N, K])
        self.written: set[int] = set()

    # ------------------------------------------------------------------ rows
    def logits_rows(self) -> torch.Tensor:
        return self.batch.logits_rows

    def engram_ids(self, hasher: EngramHasher, input_ids: torch.Tensor) -> torch.Tensor:
        b, width = self.batch, self.cfg.engram.max_ngram_size - 1
        return hasher.hash_packed(input_ids, b.extend_lens, b.prefix_lens, b.history[:, -width:])

    def tail_rows(self) -> torch.Tensor | None:
        return None  # every row runs every layer (decoder bounded replay is not wired for pools yet)

    def narrow(self, keep: torch.Tensor) -> None:
        raise NotImplementedError("the paged KV does not narrow rows")

    def _window_slots(self) -> torch.Tensor:
        """int64 [N, W]: slots of positions max(0, p-W+1)..p, oldest first, -1 padded to W."""
        b, W = self.batch, self.cfg.attention.window_size
        lo = (b.positions - W + 1).clamp_min(0)
        pos = lo.unsqueeze(-1) + torch.arange(W, device=lo.device)
        valid = pos <= b.positions.unsqueeze(-1)
        slots = b.token_table[b.req_index.unsqueeze(-1), pos.clamp(max=b.token_table.size(1) - 1)]
        return torch.where(valid, slots, -1)

    def _slot_table(self, ratio: int) -> torch.Tensor:
        """int64 [N, n_max]: c-slot of compressed position j visible to row t, else -1."""
        if ratio not in self.slot_tables:
            b = self.batch
            visible = torch.div(b.positions + 1, ratio, rounding_mode="floor")
            n_max = int(visible.max()) if b.num_rows else 0
            j = torch.arange(n_max, device=visible.device)
            pos = (j * ratio).clamp(max=b.token_table.size(1) - 1)
            slots = b.token_table[b.req_index.unsqueeze(-1), pos.unsqueeze(0)] // ratio
            self.slot_tables[ratio] = torch.where(j.unsqueeze(0) < visible.unsqueeze(-1), slots, -1)
        return self.slot_tables[ratio]

    # ------------------------------------------------------------------ keys
    def store_window(self, attn, kv: torch.Tensor, freqs) -> None:
        norm = attn.kv_norm
        self.ops.window_kv_store(kv, norm.weight, norm.eps, *freqs, self.out_slots, self.pools.window[attn.role.layer_id])

    def store_compressed(self, attn, x: torch.Tensor) -> None:
        """Pool every group completed by this forward's rows and store its compressed KV and index
        keys; park a trailing even token of a ratio-2 source in the pending state."""
        r, lid, b = attn.role.compress_ratio, attn.role.layer_id, self.batch
        if lid in self.written:
            return
        self.written.add(lid)
        comp = attn.compressor
        if r == 1:
            rows = torch.arange(b.num_rows, device=x.device)
            latent = comp(x)
        else:
            kv, score = comp.project(x)
            rows = torch.nonzero(b.positions % 2 == 1).flatten()  # odd positions close a pair
            first_row_pos = b.prefix_lens[b.req_index[rows]]
            from_pending = b.positions[rows] - 1 < first_row_pos  # partner parked by an earlier forward
            pend = self.pools.pending[lid][b.req_slots[b.req_index[rows]]]  # [m, 2, D]
            prev = (rows - 1).clamp_min(0)
            kv_even = torch.where(from_pending.unsqueeze(-1), pend[:, 0], kv[prev])
            sc_even = torch.where(from_pending.unsqueeze(-1), pend[:, 1], score[prev])
            latent = comp.pool(torch.stack([kv_even, kv[rows]], 1).flatten(0, 1),
                               torch.stack([sc_even, score[rows]], 1).flatten(0, 1))
            last = torch.cumsum(b.extend_lens, 0) - 1
            parks = last[b.positions[last] % 2 == 0]  # requests ending on an even position
            self.pools.pending[lid][b.req_slots[b.req_index[parks]]] = torch.stack([kv[parks], score[parks]], 1)
        if rows.numel() == 0:
            return
        c_slots = self.out_slots[rows] // r
        cos, sin = attn.rotary.freqs(b.positions[rows] + 1 - r)  # the group's first position
        self.ops.compressed_kv_store(latent, cos, sin, c_slots, self.pools.compressed[lid])
        if attn.role.is_index_source:
            ix = attn.indexer
            self.ops.index_key_store(ix.k_norm(ix.wk(latent)), cos, sin, c_slots, self.pools.index_keys[lid])

    def index_scores(self, attn, q: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        r = attn.role.compress_ratio
        scores = self.ops.index_scores(q, w, self.pools.index_keys[attn.role.kv_source], self._slot_table(r))
        return scores, torch.div(self.positions + 1, r, rounding_mode="floor")

    def attend(self, attn, q: torch.Tensor, topk: torch.Tensor | None) -> torch.Tensor:
        role = attn.role
        comp_pool = comp_slots = None
        if topk is not None:
            cached = self.comp_slots.get(role.index_source)
            if cached is None or cached[0] is not topk:
                table = self._slot_table(role.compress_ratio)
                cached = (topk, torch.where(topk >= 0, table.gather(1, topk.clamp_min(0).long()), -1))
                self.comp_slots[role.index_source] = cached
            comp_pool, comp_slots = self.pools.compressed[role.kv_source], cached[1]
        return self.ops.sparse_attention_paged(
            q, self.pools.window[role.layer_id], self.window_slots, comp_pool, comp_slots, attn.attn_sink, attn.softmax_scale
        )
