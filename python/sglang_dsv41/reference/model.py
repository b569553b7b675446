"""Full-sequence reference forward of DeepSeek-V4.1: the oracle every other path is tested against.

Paper order, one sequence starting at position 0:
  embed -> n identical mHC streams -> for each layer: [Engram] -> attention site -> MoE site
  -> collapse with the last `pre` -> final RMSNorm -> fp32 logits for every position.

Rounding points are DeepSeek's reference forward (shared/spec/reference-numerics.md): MXFP8
activations before every FP8 GEMM, W4A8 routed experts, FP8 window KV (per 32, RoPE dims included),
FP4 compressed KV (E4M3 per 16), two-stage FP4 indexer, bf16 index scores, block-64 online softmax
with bf16 probabilities, fp32 mHC/Sinkhorn/Engram gate.

Window key order per query (fixed width `window_size`, so block-64 boundaries never depend on the
sequence length): oldest window position first, then -1 padding, then the selected compressed
entries in ascending position order. Decoder tail replay (spec attention 7.2): from the last KV
source on, only the last `window_size` rows run; that layer's compressor still sees every row.

Decisions (routed experts per layer, top-k per index source, candidate blocks) are returned and can
be replayed (forced) to compare values across implementations with decisions held equal.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from sglang_dsv41.engram_hash import EngramHasher
from sglang_dsv41.layers.attention import Attention
from sglang_dsv41.layers.block import Block
from sglang_dsv41.layers.indexer import index_scores, mask_invisible, select_candidate_blocks, select_topk
from sglang_dsv41.layers.mhc import collapse, expand, identity_pre
from sglang_dsv41.layers.sparse_attention import sparse_attention
from sglang_dsv41.layers.transformer import DeepseekV41


@dataclass
class Decisions:
    """Discrete choices of one forward; each tensor covers the rows that layer ran on."""

    routed_experts: dict[int, torch.Tensor] = field(default_factory=dict)
    """layer -> int32 [rows, top_k] expert ids (ordered by biased score)."""
    topk: dict[int, torch.Tensor] = field(default_factory=dict)
    """index-source layer -> int32 [rows, K] compressed positions, ascending, -1 padded."""
    candidates: dict[int, torch.Tensor] = field(default_factory=dict)
    """candidate-source layer -> bool [rows, n_compressed] positions inside the kept blocks."""


@dataclass
class ReferenceOutput:
    logits: torch.Tensor
    """fp32 [rows, vocab]."""
    positions: torch.Tensor
    """int64 [rows]: the absolute position of each logits row (all of them, or the replay tail)."""
    decisions: Decisions


@dataclass
class _Shared:
    """What attention layers hand down the stack within one forward (keyed by the owning layer)."""

    compressed_kv: dict[int, torch.Tensor] = field(default_factory=dict)  # bf16 [n, D], FP4 grid
    index_keys: dict[int, torch.Tensor] = field(default_factory=dict)  # bf16 [n, di], FP4 grid


def window_indices(positions: torch.Tensor, window: int, floor: int, first_row: int) -> torch.Tensor:
    """Per query at absolute position p: local row indices of positions max(floor, p-W+1)..p,
    oldest first, padded with -1 to exactly `window` entries. Rows are contiguous from `first_row`."""
    lo = torch.clamp(positions - window + 1, min=floor)
    pos = lo.unsqueeze(-1) + torch.arange(window, device=positions.device)
    return torch.where(pos <= positions.unsqueeze(-1), pos - first_row, -1).to(torch.int32)


class ReferenceModel:
    """Runs `DeepseekV41` parameters over whole sequences. Stateless between calls."""

    def __init__(self, model: DeepseekV41):
        self.model = model
        self.cfg = model.cfg
        e = self.cfg.engram
        self.hasher = EngramHasher(e, model.engram_token_map) if e is not None else None

    @torch.inference_mode()
    def forward(
        self,
        token_ids: torch.Tensor,
        *,
        decoder_tail_replay: bool = False,
        replay: Decisions | None = None,
    ) -> ReferenceOutput:
        """token_ids int [T] (one sequence from position 0) -> fp32 logits for every position, or
        for the last min(T, window) positions with `decoder_tail_replay`."""
        cfg, m = self.cfg, self.model
        ids = token_ids.to(m.embed.weight.device).long()
        T = ids.numel()
        if decoder_tail_replay:
            cfg.check_decoder_tail_replay()
        tail_start = cfg.late_layer_start if decoder_tail_replay else None
        hash_ids = self.hasher.hash_ids(ids) if self.hasher is not None else None  # [T, nE, cols]
        decisions, shared = Decisions(), _Shared()

        rows = torch.arange(T, device=ids.device)
        streams = m.embed(ids).unsqueeze(1).repeat(1, cfg.hc.hc_mult, 1)  # [T, n, H]
        pre = identity_pre(T, cfg.hc.hc_mult, ids.device)
        floor = 0
        for layer in m.layers:
            lid = layer.role.layer_id
            if layer.engram is not None:
                col = cfg.engram.layer_ids.index(lid)
                streams = layer.engram(streams, hash_ids[rows, col])
            attn_pre, attn_post, attn_comb = layer.hc_mix("attn", streams)
            x = layer.attn_norm(collapse(streams, pre))
            if lid == tail_start:
                # the last KV source writes compressed KV + index keys for every row, then the
                # forward narrows to the tail rows (and floors their window at T - window).
                self._write_compressed(layer.attn, x, shared)
                keep = rows >= T - cfg.attention.window_size
                rows, streams, x, pre = rows[keep], streams[keep], x[keep], pre[keep]
                attn_pre, attn_post, attn_comb = attn_pre[keep], attn_post[keep], attn_comb[keep]
                floor = int(rows[0])
            y = self._attention(layer, x, rows, floor, shared, decisions, replay, T)
            streams = expand(y, streams, attn_post, attn_comb)

            ffn_pre, ffn_post, ffn_comb = layer.hc_mix("ffn", streams)
            x = layer.ffn_norm(collapse(streams, attn_pre))
            forced = replay.routed_experts.get(lid) if replay is not None else None
            y, experts = layer.ffn(x, forced)
            decisions.routed_experts[lid] = experts
            streams = expand(y, streams, ffn_post, ffn_comb)
            pre = ffn_pre

        h = m.norm(collapse(streams, pre))
        return ReferenceOutput(logits=m.head(h), positions=rows, decisions=decisions)

    # ------------------------------------------------------------------ attention site
    def _attention(
        self,
        layer: Block,
        x: torch.Tensor,
        rows: torch.Tensor,
        floor: int,
        shared: _Shared,
        decisions: Decisions,
        replay: Decisions | None,
        total_len: int,
    ) -> torch.Tensor:
        """x [t, H] bf16 for absolute positions `rows` (contiguous) -> attention output [t, H]."""
        attn, role = layer.attn, layer.role
        freqs = attn.rotary.freqs(rows)
        q, qr = attn.query(x, freqs)
        keys = attn.window_kv(x, freqs)
        idx = window_indices(rows, self.cfg.attention.window_size, floor, int(rows[0]))
        if role.compress_ratio:
            if role.is_kv_source and role.kv_source not in shared.compressed_kv:
                self._write_compressed(attn, x, shared)
            if role.is_index_source:
                self._select(layer, x, qr, freqs, rows, shared, decisions, replay)
            sel = decisions.topk[role.index_source]
            keys = torch.cat([keys, shared.compressed_kv[role.kv_source]])
            idx = torch.cat([idx, torch.where(sel >= 0, sel + x.size(0), -1)], dim=-1)
        o = sparse_attention(q, keys, attn.attn_sink, idx, attn.softmax_scale)
        return attn.output(o, freqs)

    def _write_compressed(self, attn: Attention, x: torch.Tensor, shared: _Shared) -> None:
        """KV source: pool the whole sequence (x rows are positions 0..T-1) into compressed KV and,
        for index sources, index keys. Each entry is rotated at its group's first position."""
        ratio, lid = attn.role.compress_ratio, attn.role.layer_id
        latent = attn.compressor(x)
        gfreqs = attn.rotary.freqs(torch.arange(latent.size(0), device=x.device) * ratio)
        if attn.role.is_index_source:
            shared.index_keys[lid] = attn.indexer.keys(latent, lambda t: attn.rotary.apply(t, gfreqs))
        shared.compressed_kv[lid] = attn.compressed_kv(latent, gfreqs)

    def _select(
        self,
        layer: Block,
        x: torch.Tensor,
        qr: torch.Tensor,
        freqs: torch.Tensor,
        rows: torch.Tensor,
        shared: _Shared,
        decisions: Decisions,
        replay: Decisions | None,
    ) -> None:
        """Index source: score visible compressed positions, apply candidates, publish top-k."""
        attn, role, c = layer.attn, layer.role, self.cfg.compression
        lid, ratio = role.layer_id, role.compress_ratio
        keys = shared.index_keys[role.kv_source]
        q = attn.indexer.queries(qr, lambda t: attn.rotary.apply(t, freqs))
        scores = index_scores(q, attn.indexer.head_weights(x), keys)
        visible = torch.div(rows + 1, ratio, rounding_mode="floor")
        scores = mask_invisible(scores, visible)
        if role.is_candidate_source:
            forced = replay.candidates.get(lid) if replay is not None else None
            cand = forced.to(x.device) if forced is not None else select_candidate_blocks(
                scores, visible, c.candidate_topk_blocks, c.candidate_block_size
            )
            decisions.candidates[lid] = cand
        elif role.uses_candidates:
            scores = scores.masked_fill(~decisions.candidates[role.candidate_source], float("-inf"))
        forced = replay.topk.get(lid) if replay is not None else None
        decisions.topk[lid] = forced.to(x.device, torch.int32) if forced is not None else select_topk(scores, c.index_topk)
