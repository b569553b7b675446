"""The paged runtime forward: the reference forward's math over a `Batch` and `KVPools`.

Same layer modules and the same rounding points as `reference/model.py`; what changes is where keys
come from. New rows write their window KV (every layer) and, at KV sources, their completed groups'
compressed KV and index keys into the pools *before* attention, so a row sees its own chunk
causally, earlier chunks / cached prefixes through `token_table`, and decode needs nothing else.
Key order per query matches the reference exactly (window: fixed width, oldest first; then the
selected compressed positions ascending), so results agree with the reference row by row.

Cache stores, FP4 index scores, top-k, candidate blocks and attention go through `dsv41_kernels.ops`
(Triton on CUDA when available, torch twins otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from dsv41_kernels import ops
from sglang_dsv41.engram_hash import EngramHasher
from sglang_dsv41.layers.block import Block
from sglang_dsv41.layers.mhc import collapse, expand, identity_pre
from sglang_dsv41.layers.transformer import DeepseekV41
from sglang_dsv41.runtime.batch import Batch
from sglang_dsv41.runtime.pools import KVPools


@dataclass
class RuntimeOutput:
    logits: torch.Tensor
    """fp32 [R, vocab] for `batch.logits_rows`."""
    routed_experts: dict[int, torch.Tensor] = field(default_factory=dict)
    """layer -> int32 [N, top_k]."""
    topk: dict[int, torch.Tensor] = field(default_factory=dict)
    """index-source layer -> int32 [N, K] selected compressed positions (-1 padded)."""
    candidates: dict[int, torch.Tensor] = field(default_factory=dict)
    """candidate-source layer -> bool [N, n_max] kept-block mask."""


@dataclass
class Replay:
    """Decisions to force instead of computing them (compare values with decisions held equal,
    guides/numerics.md step 3). Rows are this batch's rows; any layer may be left out."""

    routed_experts: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> [N, top_k]
    topk: dict[int, torch.Tensor] = field(default_factory=dict)  # index source -> [N, K] positions
    candidates: dict[int, torch.Tensor] = field(default_factory=dict)  # candidate source -> bool [N, n_max]


@dataclass
class _Step:
    """Per-forward derived indices shared by all layers."""

    batch: Batch
    window_slots: torch.Tensor  # int64 [N, W]
    replay: "Replay | None" = None
    candidates: dict[int, torch.Tensor] = field(default_factory=dict)
    comp_slots: dict[int, torch.Tensor] = field(default_factory=dict)  # index source -> int64 [N, K]
    slot_tables: dict[int, torch.Tensor] = field(default_factory=dict)  # ratio -> int64 [N, n_max]


class Runtime:
    def __init__(self, model: DeepseekV41, pools: KVPools):
        self.model, self.cfg, self.pools = model, model.cfg, pools
        e = self.cfg.engram
        self.hasher = EngramHasher(e, model.engram_token_map) if e is not None else None

    # ------------------------------------------------------------------ forward
    @torch.inference_mode()
    def forward(self, batch: Batch, replay: Replay | None = None) -> RuntimeOutput:
        cfg, m = self.cfg, self.model
        n = cfg.hc.hc_mult
        out = RuntimeOutput(logits=torch.empty(0))
        step = _Step(batch=batch, window_slots=self._window_slots(batch), replay=replay)
        hash_ids = None
        if self.hasher is not None:
            hash_ids = self.hasher.hash_packed(
                batch.input_ids, batch.extend_lens, batch.prefix_lens, batch.history[:, -(cfg.engram.max_ngram_size - 1):]
            )
        streams = m.embed(batch.input_ids).unsqueeze(1).repeat(1, n, 1)
        pre = identity_pre(batch.num_rows, n, batch.input_ids.device)
        for layer in m.layers:
            lid = layer.role.layer_id
            if layer.engram is not None:
                streams = layer.engram(streams, hash_ids[:, cfg.engram.layer_ids.index(lid)])
            attn_pre, attn_post, attn_comb = layer.hc_mix("attn", streams)
            x = layer.attn_norm(collapse(streams, pre))
            streams = expand(self._attention(layer, x, step, out), streams, attn_post, attn_comb)
            ffn_pre, ffn_post, ffn_comb = layer.hc_mix("ffn", streams)
            forced = replay.routed_experts.get(lid) if replay is not None else None
            y, out.routed_experts[lid] = layer.ffn(layer.ffn_norm(collapse(streams, attn_pre)), forced)
            streams = expand(y, streams, ffn_post, ffn_comb)
            pre = ffn_pre
        rows = batch.logits_rows
        out.logits = m.head(m.norm(collapse(streams[rows], pre[rows])))
        return out

    # ------------------------------------------------------------------ attention site
    def _attention(self, layer: Block, x: torch.Tensor, step: _Step, out: RuntimeOutput) -> torch.Tensor:
        attn, role, b = layer.attn, layer.role, step.batch
        lid = role.layer_id
        cos, sin = attn.rotary.freqs(b.positions)
        q, qr = attn.query(x, (cos, sin))
        ops.window_kv_store(attn.wkv(x), attn.kv_norm.weight, attn.kv_norm.eps, cos, sin, b.out_slots, self.pools.window[lid])
        comp_pool = comp_slots = None
        if role.compress_ratio:
            if role.is_kv_source:
                self._compress(attn, x, b)
            if role.is_index_source:
                self._select(layer, x, qr, (cos, sin), step, out)
            comp_pool = self.pools.compressed[role.kv_source]
            comp_slots = step.comp_slots[role.index_source]
        o = ops.sparse_attention_paged(
            q, self.pools.window[lid], step.window_slots, comp_pool, comp_slots, attn.attn_sink, attn.softmax_scale
        )
        return attn.output(o, (cos, sin))

    def _window_slots(self, b: Batch) -> torch.Tensor:
        """int64 [N, W]: slots of positions max(0, p-W+1)..p, oldest first, -1 padded to W."""
        W = self.cfg.attention.window_size
        lo = (b.positions - W + 1).clamp_min(0)
        pos = lo.unsqueeze(-1) + torch.arange(W, device=lo.device)
        valid = pos <= b.positions.unsqueeze(-1)
        slots = b.token_table[b.req_index.unsqueeze(-1), pos.clamp(max=b.token_table.size(1) - 1)]
        return torch.where(valid, slots, -1)

    def _compress(self, attn, x: torch.Tensor, b: Batch) -> None:
        """KV source: pool every group completed by this forward's rows and store its compressed KV
        and index keys; park a trailing even token of a ratio-2 source in the pending state."""
        r, lid = attn.role.compress_ratio, attn.role.layer_id
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
            pair_kv = torch.stack([kv_even, kv[rows]], 1).flatten(0, 1)
            pair_sc = torch.stack([sc_even, score[rows]], 1).flatten(0, 1)
            latent = comp.pool(pair_kv, pair_sc)
            last = torch.cumsum(b.extend_lens, 0) - 1
            parks = last[b.positions[last] % 2 == 0]  # requests ending on an even position
            self.pools.pending[lid][b.req_slots[b.req_index[parks]]] = torch.stack([kv[parks], score[parks]], 1)
        if rows.numel() == 0:
            return
        group_pos = b.positions[rows] + 1 - r
        c_slots = b.out_slots[rows] // r
        cos, sin = attn.rotary.freqs(group_pos)
        ops.compressed_kv_store(latent, cos, sin, c_slots, self.pools.compressed[lid])
        if attn.role.is_index_source:
            ix = attn.indexer
            ops.index_key_store(ix.k_norm(ix.wk(latent)), cos, sin, c_slots, self.pools.index_keys[lid])

    def _slot_table(self, step: _Step, ratio: int) -> torch.Tensor:
        """int64 [N, n_max]: c-slot of compressed position j visible to row t, else -1."""
        if ratio not in step.slot_tables:
            b = step.batch
            visible = torch.div(b.positions + 1, ratio, rounding_mode="floor")
            n_max = int(visible.max()) if b.num_rows else 0
            j = torch.arange(n_max, device=visible.device)
            pos = (j * ratio).clamp(max=b.token_table.size(1) - 1)
            slots = b.token_table[b.req_index.unsqueeze(-1), pos.unsqueeze(0)] // ratio
            step.slot_tables[ratio] = torch.where(j.unsqueeze(0) < visible.unsqueeze(-1), slots, -1)
        return step.slot_tables[ratio]

    def _select(self, layer: Block, x, qr, freqs, step: _Step, out: RuntimeOutput) -> None:
        attn, role, c = layer.attn, layer.role, self.cfg.compression
        b, r, lid = step.batch, role.compress_ratio, role.layer_id
        table = self._slot_table(step, r)
        ix = attn.indexer
        q = ops.index_query_quant(ix.wq_b(qr).unflatten(-1, (ix.n_heads, ix.head_dim)), *freqs)
        scores = ops.index_scores(q, ix.head_weights(x), self.pools.index_keys[role.kv_source], table)
        visible = torch.div(b.positions + 1, r, rounding_mode="floor")
        forced = step.replay
        if role.is_candidate_source:
            cand = forced.candidates.get(lid) if forced is not None else None
            if cand is None:
                cand = ops.candidate_blocks(scores, visible, c.candidate_topk_blocks, c.candidate_block_size)
            step.candidates[lid] = out.candidates[lid] = cand.to(scores.device)
        elif role.uses_candidates:
            scores = scores.masked_fill(~step.candidates[role.candidate_source], float("-inf"))
        sel = forced.topk.get(lid) if forced is not None else None
        sel = ops.topk_select(scores, c.index_topk) if sel is None else sel.to(scores.device, torch.int32)
        out.topk[lid] = sel
        step.comp_slots[lid] = torch.where(sel >= 0, table.gather(1, sel.clamp_min(0).long()), -1)
