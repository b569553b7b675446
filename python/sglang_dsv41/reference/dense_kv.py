"""Dense KV: the keys of B sequences of one length as bf16 tensors on their FP8 / FP4 grids. The KV
of the reference forward (the oracle, B = 1) and of training (a batch; autograd flows through it).

Rows are sequence-major: row b*T + p is position p of sequence b (B = 1: the positions start..T-1);
compressed entries of sequence b occupy rows b*(T//r) .. (b+1)*(T//r) - 1 of a layer's pool (T % r
== 0 when B > 1, so a ratio-2 pair never straddles two sequences). Every row's keys and lists are
those the sequence alone gives (the per-row math is batch invariant: fp32 GEMM tiles, exact block
partials, the RMSNorm order), and right padding never changes a real row (causal attention).
The attention formulation is the `attention` slot of each Attention (the numerics policy:
layers/dense_attention.py), called on per-sequence keys [B, m, D] and row lists [B, t, K]. For B > 1
and T <= 64 the window lists are cut to ceil(T / 64) * 64 slots: the cut slots are -1 padding forming
whole 64-blocks, which the block-64 online softmax skips exactly.

Window key order per query (fixed width `window_size`, so block-64 boundaries never depend on the
sequence length): oldest window position first, then -1 padding, then the selected compressed
entries in ascending position order; the paged KV builds exactly the same lists.

The two SWA bounded-replay modes (spec attention 7, B = 1 only) are written here as plainly as
possible, so the paged runtime can be tested against them bit for bit:
  decoder tail replay (`tail_replay`, 7.2)   the forward narrows to each prefill chunk's last
      `window` rows at the last KV source; a kept row's late-layer window is floored at its chunk's
      end - window (earlier rows' late-layer window keys are never computed). `chunk=None` is one
      shot; with a chunk size the kept rows are the union of every chunk's tail.
  encoder replay (`resume`, 7.1)             a prefix-cache hit of P tokens: compressed KV and index
      keys of positions < P come from an earlier forward over the prefix (`cached`), the rows start
      at P - min(P, window), every row's window is floored there, and only groups from P on are
      pooled again.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sglang_dsv41.config import ModelConfig
from sglang_dsv41.engram_hash import EngramHasher
from sglang_dsv41.layers.attention import Attention
from sglang_dsv41.layers.indexer import index_scores, mask_invisible
from sglang_dsv41.layers.rope import RopeRows
from sglang_dsv41.layers.sparse_attention import BLOCK


def window_indices(positions: torch.Tensor, window: int, floor: int | torch.Tensor, first_row: int) -> torch.Tensor:
    """Per query at absolute position p: local row indices of positions max(floor, p-W+1)..p,
    oldest first, padded with -1 to exactly `window` entries. Key rows are contiguous positions from
    `first_row`; `floor` is one position or one per query."""
    lo = torch.maximum(positions - window + 1, torch.as_tensor(floor, device=positions.device))
    pos = lo.unsqueeze(-1) + torch.arange(window, device=positions.device)
    return torch.where(pos <= positions.unsqueeze(-1), pos - first_row, -1).to(torch.int32)


class DenseKV:
    """One forward over `batch` sequences of `length` tokens (see layers/kv.py for the interface).

    The forward's rows are positions `start`..length-1 of each sequence (`start` > 0 only for an
    encoder-replay hit, built with `resume`). `engram_ids` (int64 [B*T, layers, cols],
    `EngramHasher.hash_packed` of the rows) may be computed by the caller ahead of time (e.g. outside
    a captured CUDA graph: the hash syncs with the host)."""

    def __init__(self, cfg: ModelConfig, length: int, device: torch.device | str, tail_replay: bool = False,
                 chunk: int | None = None, batch: int = 1, engram_ids: torch.Tensor | None = None):
        if tail_replay:
            cfg.check_decoder_tail_replay()
        if batch > 1:
            if tail_replay or chunk is not None:
                raise ValueError("decoder tail replay and prefill chunks need batch 1")
            ratios = {r for r in cfg.compression.compress_ratios if r > 1}
            if any(length % r for r in ratios):
                raise ValueError(f"length {length} must be a multiple of every compress ratio {sorted(ratios)}")
        self.cfg, self.length, self.tail_replay, self.chunk, self.batch = cfg, length, tail_replay, chunk, batch
        self._engram_ids = engram_ids
        self.start = 0
        self.prefix_ids: torch.Tensor | None = None  # int64 ids before `start` (Engram history)
        self.positions = torch.arange(length, device=device).repeat(batch)
        self.rope = RopeRows()
        self.floor = torch.zeros_like(self.positions)  # per row: first position its window may read
        self.hit = 0  # encoder replay: positions < hit keep the cached compressed KV
        self.compressed: dict[int, torch.Tensor] = {}  # KV source -> bf16 [B * T // r, D] (FP4 grid)
        self.index_keys: dict[int, torch.Tensor] = {}  # KV source -> bf16 [B * T // r, di] (FP4 grid)
        self.written: set[int] = set()
        self._window: torch.Tensor | None = None  # current layer's window keys, bf16 [B * (length - start), D]

    @classmethod
    def resume(cls, cached: "DenseKV", token_ids: torch.Tensor, hit: int, tail_replay: bool = False) -> "DenseKV":
        """Encoder replay: `cached` ran over token_ids[:hit] (or more); this KV's rows are positions
        hit - min(hit, window) .. len(token_ids)-1, all floored at that start."""
        if hit % 2:
            raise ValueError("encoder SWA replay requires an even cached-prefix boundary")
        cfg = cached.cfg
        kv = cls(cfg, token_ids.numel(), token_ids.device, tail_replay=tail_replay)
        kv.start = hit - min(hit, cfg.attention.window_size)
        kv.prefix_ids = token_ids[: kv.start].long()
        kv.positions = kv.positions[kv.start:]
        kv.floor = torch.full_like(kv.positions, kv.start)
        kv.hit = hit
        for lid, c in cached.compressed.items():
            r = cfg.layer_roles[lid].compress_ratio
            kv.compressed[lid] = c[: hit // r]
            if lid in cached.index_keys:
                kv.index_keys[lid] = cached.index_keys[lid][: hit // r]
        return kv

    # ------------------------------------------------------------------ rows
    def freqs(self, rotary) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rope(rotary, self.positions)

    def logits_rows(self) -> torch.Tensor:
        """Every row from the hit on (replay rows have no logits)."""
        return torch.nonzero(self.positions >= self.hit).flatten()

    def engram_ids(self, hasher: EngramHasher, input_ids: torch.Tensor) -> torch.Tensor:
        if self._engram_ids is not None:
            return self._engram_ids
        if self.batch > 1:
            return hasher.hash_packed(input_ids, [self.length] * self.batch)  # every sequence from position 0
        if self.start == 0:
            return hasher.hash_ids(input_ids)
        width = hasher.max_ngram_size - 1
        return hasher.hash_ids(input_ids, self.start, self.prefix_ids[-width:])

    def _chunk_ends(self) -> torch.Tensor:
        """int64 [N]: end position (exclusive) of each row's prefill chunk."""
        if self.chunk is None:
            return torch.full_like(self.positions, self.length)
        ends = (torch.div(self.positions - self.start, self.chunk, rounding_mode="floor") + 1) * self.chunk + self.start
        return ends.clamp(max=self.length)

    def tail_rows(self) -> torch.Tensor | None:
        if not self.tail_replay:
            return None
        ends = self._chunk_ends()
        self._tail_floor = (ends - self.cfg.attention.window_size).clamp_min(0)
        return torch.nonzero(self.positions >= self._tail_floor).flatten()

    def narrow(self, keep: torch.Tensor) -> None:
        if self.batch > 1:
            raise NotImplementedError("a batch runs every row through every layer")
        self.positions = self.positions[keep]
        self.floor = torch.maximum(self.floor[keep], self._tail_floor[keep])

    # ------------------------------------------------------------------ keys
    def store_window(self, attn: Attention, kv: torch.Tensor, freqs) -> None:
        keys = attn.window_keys(kv, freqs)
        if keys.size(0) == self.batch * (self.length - self.start):
            self._window = keys
        else:  # narrowed: place the kept rows by position; other rows are never read (floors)
            self._window = keys.new_zeros(self.length - self.start, keys.size(1))
            self._window = self._window.index_copy(0, self.positions - self.start, keys)

    def store_compressed(self, attn: Attention, x: torch.Tensor) -> None:
        """Pools the rows (positions start..T-1, start even) into groups; each entry is rotated at its
        group's first position. Groups before `hit` keep the cached entries. Once per forward (the tail
        layer calls it before narrowing)."""
        lid, ratio = attn.role.layer_id, attn.role.compress_ratio
        if lid in self.written:
            return
        self.written.add(lid)
        latent = attn.compressor(x)  # [B * (T - start) // r, D]
        first = self.hit // ratio - self.start // ratio  # first group of this forward not cached
        latent = latent[first:]
        groups = latent.size(0) // self.batch
        group_pos = ((torch.arange(groups, device=x.device) + self.hit // ratio) * ratio).repeat(self.batch)
        gfreqs = attn.rotary.freqs(group_pos)
        comp = attn.compressed_kv(latent, gfreqs)
        if attn.role.is_index_source:
            keys = attn.indexer.keys(latent, lambda t: attn.rotary.apply(t, gfreqs))
            self.index_keys[lid] = torch.cat([self.index_keys[lid], keys]) if self.hit else keys
        self.compressed[lid] = torch.cat([self.compressed[lid], comp]) if self.hit else comp

    def index_scores(self, attn: Attention, q: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        visible = torch.div(self.positions + 1, attn.role.compress_ratio, rounding_mode="floor")
        keys = self.index_keys[attn.role.kv_source]
        if self.batch == 1:
            scores = index_scores(q, w, keys)
        else:  # each sequence's rows against its own keys, one batched GEMM (the same per-row values)
            b, t = self.batch, q.size(0) // self.batch
            logits = torch.einsum("bthd,bnd->bthn", q.view(b, t, *q.shape[1:]), keys.view(b, -1, keys.size(-1)))
            scores = (F.relu(logits) * w.view(b, t, -1, 1)).sum(dim=2).flatten(0, 1)
        return mask_invisible(scores, visible).float(), visible

    def attend(self, attn: Attention, q: torch.Tensor, topk: torch.Tensor | None) -> torch.Tensor:
        b, w = self.batch, self.cfg.attention.window_size
        t = q.size(0) // b
        keys = self._window.view(b, -1, self._window.size(-1))  # [B, length - start, D]
        idx = window_indices(self.positions, w, self.floor, self.start).view(b, t, w)
        if b > 1 and w % BLOCK == 0:  # trailing whole blocks of -1 slots are exact no-ops of the online softmax
            idx = idx[..., : min(w, -(-keys.size(1) // BLOCK) * BLOCK)]
        if topk is not None:
            n = keys.size(1)
            keys = torch.cat([keys, self.compressed[attn.role.kv_source].view(b, -1, keys.size(-1))], dim=1)
            idx = torch.cat([idx, torch.where(topk >= 0, topk + n, -1).view(b, t, -1)], dim=-1)
        o = attn.attention(q.view(b, t, *q.shape[1:]), keys, idx, attn.attn_sink, attn.softmax_scale)
        return o.flatten(0, 1)
