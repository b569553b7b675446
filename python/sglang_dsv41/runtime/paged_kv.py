"""Paged KV: the KV interface (layers/kv.py) over a packed `Batch` and the `KVPools`, through an
op table (`dsv41_kernels.op_table.OpTable`: Triton kernels on CUDA, their torch twins elsewhere).

New rows write their window KV (every layer) and, at KV sources, their completed groups' compressed
KV and index keys into the pools *before* attention, so a row sees its own chunk causally, earlier
chunks / cached prefixes through `token_table`, and decode needs nothing else. Key order per query
matches the dense KV exactly (window: fixed width, oldest first; then the selected compressed
positions ascending), so results agree with the reference row by row.

SWA bounded replay (spec attention 7; the dense KV writes out the same semantics):
  decoder (`decoder_replay`)  at the last KV source the forward narrows to each request's last
      `window` rows (unless the request has logits rows before them: prompt logprobs run the whole
      extend), whose late-layer windows are floored at seq_end - window.
  encoder (pools in ring mode + `batch.replay_lens`)  window KV lives in per-request rings: the
      forward's rows write into a workspace, read older window positions from their request's ring,
      and after each layer's attention the last `window` positions of every request are committed to
      its ring. Replay rows (a hit's recomputed cached tokens) write no compressed KV or index keys.

Padding rows of a static decode batch (`batch.real_rows`) run like the others but store nothing:
their window / compressed KV and index-key slots become -1 and their pending-state writes repeat
row 0's. The layers never see the difference: it is all in the slots handed to the stores.
"""

from __future__ import annotations

import torch

from sglang_dsv41.config import ModelConfig
from sglang_dsv41.engram_hash import EngramHasher
from sglang_dsv41.layers.rope import RopeRows
from sglang_dsv41.runtime.batch import Batch, writer_rows
from sglang_dsv41.runtime.pools import KVPools

TAIL_MISSES_ROWS = "decoder SWA bounded replay tail misses prompt-logprob rows"


class PagedKV:
    """One forward of `batch` over `pools` (per-forward derived indices live here)."""

    def __init__(self, cfg: ModelConfig, pools: KVPools, batch: Batch, ops, decoder_replay: bool = False):
        if decoder_replay:
            cfg.check_decoder_tail_replay()
        if batch.real_rows is not None and not (batch.static and batch.num_rows == batch.req_slots.numel()):
            raise ValueError("Batch.real_rows (padding rows) needs a static decode batch (one row per request)")
        self.cfg, self.pools, self.batch, self.ops = cfg, pools, batch, ops
        self.decoder_replay = decoder_replay
        # current rows (all of the batch; after a decoder-tail narrowing, the kept ones)
        self.positions = batch.positions
        self.rope = RopeRows()
        self.req = batch.req_index  # int64 [N] request of each row
        self.out_slots = batch.out_slots  # int64 [N] pool slot each row writes (compressed KV)
        self.logits = batch.logits_rows
        floor = batch.window_floor
        self.floor = floor[self.req] if floor is not None else torch.zeros_like(self.positions)
        # bool [N] rows that store KV (None: all); False on padding rows (batch.real_rows)
        self.live = None
        if batch.real_rows is not None:
            self.live = torch.arange(batch.num_rows, device=self.positions.device) < batch.real_rows
        self._tail: tuple[torch.Tensor, torch.Tensor] | None = None  # (tail floor, full) per request
        if pools.window_rings:
            pools.reserve_workspace(batch.num_rows)
        self._rows_changed()
        self.written: set[int] = set()
        self.pair_state: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        """Verify batches: ratio-2 source -> (kv, score) fp32 [N, D] of every row (what a commit parks)."""

    def _rows_changed(self) -> None:
        self.window_slots, self.window_out = self._window_slots()
        if self.live is not None:
            self.window_out = torch.where(self.live, self.window_out, -1)
        self.slot_tables: dict[int, torch.Tensor] = {}  # ratio -> int64 [N, n_max]
        self.visible: dict[int, torch.Tensor] = {}  # ratio -> int64 [N] compressed positions each row sees
        self.comp_slots: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # index source -> (topk, slots [N, K])

    # ------------------------------------------------------------------ rows
    def freqs(self, rotary) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rope(rotary, self.positions)

    def logits_rows(self) -> torch.Tensor:
        return self.logits

    def engram_ids(self, hasher: EngramHasher, input_ids: torch.Tensor) -> torch.Tensor:
        b, width = self.batch, self.cfg.engram.max_ngram_size - 1
        if b.static and b.num_rows == b.req_slots.numel():  # a decode step: one row per request
            return hasher.hash_decode(input_ids, b.prefix_lens, b.history[:, -width:])
        return hasher.hash_packed(input_ids, b.extend_lens, b.prefix_lens, b.history[:, -width:])

    def tail_rows(self) -> torch.Tensor | None:
        if not self.decoder_replay:
            return None
        b, W = self.batch, self.cfg.attention.window_size
        tail_floor = (b.seq_ends - W).clamp_min(0)
        needs = self.positions[self.logits] < tail_floor[self.req[self.logits]]  # logits rows before the tail
        full = torch.zeros_like(tail_floor, dtype=torch.bool).index_fill(0, self.req[self.logits][needs], True)
        if b.full_rows is not None:
            if bool((full & ~b.full_rows).any()):
                raise ValueError(TAIL_MISSES_ROWS)
            full = b.full_rows
        self._tail = (tail_floor, full)
        return torch.nonzero(full[self.req] | (self.positions >= tail_floor[self.req])).flatten()

    def narrow(self, keep: torch.Tensor) -> None:
        tail_floor, full = self._tail
        new_index = torch.full_like(self.positions, -1).index_copy(0, keep, torch.arange(keep.numel(), device=keep.device))
        self.logits = new_index[self.logits]
        if bool((self.logits < 0).any()):
            raise ValueError(TAIL_MISSES_ROWS)
        self.positions, self.req, self.out_slots = self.positions[keep], self.req[keep], self.out_slots[keep]
        self.live = self.live[keep] if self.live is not None else None
        self.floor = torch.maximum(self.floor[keep], torch.where(full, 0, tail_floor)[self.req])
        self._rows_changed()

    def _window_slots(self) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (int64 [N, W] window pool rows of positions max(floor, p-W+1)..p, oldest first, -1
        padded to W; int64 [N] the row each current row writes)."""
        b, W, pools = self.batch, self.cfg.attention.window_size, self.pools
        lo = torch.maximum(self.positions - W + 1, self.floor)
        pos = lo.unsqueeze(-1) + torch.arange(W, device=lo.device)
        valid = pos <= self.positions.unsqueeze(-1)
        if not pools.window_rings:
            slots = b.token_table[self.req.unsqueeze(-1), pos.clamp(max=b.token_table.size(1) - 1)]
            return torch.where(valid, slots, -1), self.out_slots
        # ring mode: positions from the request's first current row on are in the workspace
        n, nreq = self.positions.numel(), b.req_slots.numel()
        rows = torch.arange(n, device=lo.device)
        big = torch.iinfo(torch.int64).max
        first = torch.full((nreq,), big, device=lo.device).scatter_reduce(0, self.req, self.positions, "amin")
        row0 = torch.full((nreq,), big, device=lo.device).scatter_reduce(0, self.req, rows, "amin")
        f, r0 = first[self.req].unsqueeze(-1), row0[self.req].unsqueeze(-1)
        ring = b.req_slots[self.req].unsqueeze(-1) * pools.ring_capacity + pos % pools.ring_capacity
        slots = torch.where(pos >= f, pools.workspace_base + r0 + (pos - f), ring)
        return torch.where(valid, slots, -1), pools.workspace_base + rows

    def _commit_ring(self, layer_id: int) -> None:
        """Ring mode, after a layer's attention: each request's last C positions -> its ring."""
        pools, b = self.pools, self.batch
        c = pools.ring_capacity
        last = self.positions >= b.seq_ends[self.req] - c
        dst = b.req_slots[self.req[last]] * c + self.positions[last] % c
        pool = pools.window[layer_id]
        pool[dst] = pool[self.window_out[last]]

    def _visible(self, ratio: int) -> torch.Tensor:
        """int64 [N]: how many compressed positions of `ratio` row t sees, (position + 1) // ratio."""
        if ratio not in self.visible:
            self.visible[ratio] = torch.div(self.positions + 1, ratio, rounding_mode="floor")
        return self.visible[ratio]

    def _slot_table(self, ratio: int) -> torch.Tensor:
        """int64 [N, n_max]: c-slot of compressed position j visible to row t, else -1."""
        if ratio not in self.slot_tables:
            b = self.batch
            visible = self._visible(ratio)
            if b.seq_capacity is not None:  # host-known width: no device read (graph-capturable)
                n_max = b.seq_capacity // ratio
            else:
                n_max = int(visible.max()) if visible.numel() else 0
            j = torch.arange(n_max, device=visible.device)
            pos = (j * ratio).clamp(max=b.token_table.size(1) - 1)
            slots = b.token_table[self.req.unsqueeze(-1), pos.unsqueeze(0)] // ratio
            self.slot_tables[ratio] = torch.where(j.unsqueeze(0) < visible.unsqueeze(-1), slots, -1)
        return self.slot_tables[ratio]

    # ------------------------------------------------------------------ keys
    def store_window(self, attn, kv: torch.Tensor, freqs) -> None:
        norm = attn.kv_norm
        self.ops.window_kv_store(kv, norm.weight, norm.eps, *freqs, self.window_out, self.pools.window[attn.role.layer_id])

    def store_compressed(self, attn, x: torch.Tensor) -> None:
        """Pool every group completed by this forward's new rows (not encoder-replay rows: their
        groups are cached) and store its compressed KV and index keys; park a trailing even token of
        a ratio-2 source in the pending state."""
        r, lid, b = attn.role.compress_ratio, attn.role.layer_id, self.batch
        if lid in self.written:
            return
        self.written.add(lid)
        comp = attn.compressor
        if b.static:
            return self._store_compressed_static(attn, x)
        hit_end = b.prefix_lens + b.replay_lens if b.replay_lens is not None else None
        if r == 1:
            latent = comp(x)
            rows = torch.arange(b.num_rows, device=x.device)
            if hit_end is not None:
                rows = torch.nonzero(b.positions >= hit_end[b.req_index]).flatten()
                latent = latent[rows]
        else:
            kv, score = comp.project(x)
            closes = b.positions % 2 == 1  # odd positions close a pair
            if hit_end is not None:
                closes &= b.positions >= hit_end[b.req_index]
            rows = torch.nonzero(closes).flatten()
            first_row_pos = b.prefix_lens[b.req_index[rows]]
            from_pending = b.positions[rows] - 1 < first_row_pos  # partner parked by an earlier forward
            pend = self.pools.pending[lid][b.req_slots[b.req_index[rows]]]  # [m, 2, D]
            prev = (rows - 1).clamp_min(0)
            kv_even = torch.where(from_pending.unsqueeze(-1), pend[:, 0], kv[prev])
            sc_even = torch.where(from_pending.unsqueeze(-1), pend[:, 1], score[prev])
            latent = comp.pool(torch.stack([kv_even, kv[rows]], 1).flatten(0, 1),
                               torch.stack([sc_even, score[rows]], 1).flatten(0, 1))
            if b.verify:  # rows may be rejected: the commit parks the pending pair
                self.pair_state[lid] = (kv, score)
            else:
                last = torch.cumsum(b.extend_lens, 0) - 1
                parks = last[b.positions[last] % 2 == 0]  # requests ending on an even position
                self.pools.pending[lid][b.req_slots[b.req_index[parks]]] = torch.stack([kv[parks], score[parks]], 1)
        if rows.numel() == 0:
            return
        c_slots = b.out_slots[rows] // r
        cos, sin = attn.rotary.freqs(b.positions[rows] + 1 - r)  # the group's first position
        self.ops.compressed_kv_store(latent, cos, sin, c_slots, self.pools.compressed[lid])
        if attn.role.is_index_source:
            ix = attn.indexer
            self.ops.index_key_store(ix.k_norm(ix.wk(latent)), cos, sin, c_slots, self.pools.index_keys[lid])

    def _store_compressed_static(self, attn, x: torch.Tensor) -> None:
        """`store_compressed` with fixed shapes (batch.static): every row pools its group as if it
        closed one; rows that close none get c-slot -1 (the stores skip them), and the pending pair
        state is rewritten in place through a `where` (no boolean indexing, no host read). The
        stored rows' values are the eager path's: every op here is row-wise. Padding rows
        (`batch.real_rows`) store no group and repeat request 0's pending write."""
        r, lid, b = attn.role.compress_ratio, attn.role.layer_id, self.batch
        comp = attn.compressor
        c_slots = torch.div(b.out_slots, r, rounding_mode="floor")
        if r == 1:
            latent = comp(x)
        else:
            kv, score = comp.project(x)
            rows = torch.arange(b.num_rows, device=x.device)
            closes = b.positions % 2 == 1
            from_pending = b.positions - 1 < b.prefix_lens[b.req_index]
            pend = self.pools.pending[lid][b.req_slots[b.req_index]]  # [N, 2, D]
            prev = (rows - 1).clamp_min(0)
            kv_even = torch.where(from_pending.unsqueeze(-1), pend[:, 0], kv[prev])
            sc_even = torch.where(from_pending.unsqueeze(-1), pend[:, 1], score[prev])
            latent = comp.pool(torch.stack([kv_even, kv], 1).flatten(0, 1), torch.stack([sc_even, score], 1).flatten(0, 1))
            if b.verify:  # rows may be rejected: the commit parks the pending pair
                self.pair_state[lid] = (kv, score)
            else:
                last = torch.cumsum(b.extend_lens, 0) - 1
                parks = (b.positions[last] % 2 == 0).view(-1, 1, 1)
                pending, slots = self.pools.pending[lid], b.req_slots
                state = torch.where(parks, torch.stack([kv[last], score[last]], 1), pending[slots])  # [B, 2, D]
                if b.real_rows is not None:  # a padding request may name a real one's slot: repeat request 0's write
                    src = writer_rows(b.real_rows, slots.numel())
                    slots, state = slots[src], state[src]
                pending[slots] = state
            c_slots = torch.where(closes, c_slots, -1)
        if self.live is not None:
            c_slots = torch.where(self.live, c_slots, -1)
        cos, sin = attn.rotary.freqs((b.positions + 1 - r).clamp_min(0))  # the group's first position
        self.ops.compressed_kv_store(latent, cos, sin, c_slots, self.pools.compressed[lid])
        if attn.role.is_index_source:
            ix = attn.indexer
            self.ops.index_key_store(ix.k_norm(ix.wk(latent)), cos, sin, c_slots, self.pools.index_keys[lid])

    def index_scores(self, attn, q: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        r = attn.role.compress_ratio
        scores = self.ops.index_scores(q, w, self.pools.index_keys[attn.role.kv_source], self._slot_table(r))
        return scores, self._visible(r)

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
        out = self.ops.sparse_attention_paged(
            q, self.pools.window[role.layer_id], self.window_slots, comp_pool, comp_slots, attn.attn_sink, attn.softmax_scale
        )
        if self.pools.window_rings:
            self._commit_ring(role.layer_id)
        return out
