"""Dense KV: the keys of one whole sequence (positions 0..T-1) as bf16 tensors on their FP8 / FP4
grids. The KV of the reference forward (the oracle) and of training (autograd flows through it).

Window key order per query (fixed width `window_size`, so block-64 boundaries never depend on the
sequence length): oldest window position first, then -1 padding, then the selected compressed
entries in ascending position order; the paged KV builds exactly the same lists.
With `tail_replay` (spec attention 7.2) the forward narrows to the last `window_size` rows at the
last KV source; their windows are floored at T - window_size (earlier rows' window keys of the
later layers are never computed).
"""

from __future__ import annotations

import torch

from sglang_dsv41.config import ModelConfig
from sglang_dsv41.engram_hash import EngramHasher
from sglang_dsv41.layers.attention import Attention
from sglang_dsv41.layers.indexer import index_scores, mask_invisible
from sglang_dsv41.layers.sparse_attention import sparse_attention


def window_indices(positions: torch.Tensor, window: int, floor: int, first_row: int) -> torch.Tensor:
    """Per query at absolute position p: local row indices of positions max(floor, p-W+1)..p,
    oldest first, padded with -1 to exactly `window` entries. Rows are contiguous from `first_row`."""
    lo = torch.clamp(positions - window + 1, min=floor)
    pos = lo.unsqueeze(-1) + torch.arange(window, device=positions.device)
    return torch.where(pos <= positions.unsqueeze(-1), pos - first_row, -1).to(torch.int32)


class DenseKV:
    """One forward over one sequence of `length` tokens (see layers/kv.py for the interface)."""

    def __init__(self, cfg: ModelConfig, length: int, device: torch.device | str, tail_replay: bool = False):
        if tail_replay:
            cfg.check_decoder_tail_replay()
        self.cfg, self.length, self.tail_replay = cfg, length, tail_replay
        self.positions = torch.arange(length, device=device)
        self.floor = 0  # first position whose window keys exist
        self.compressed: dict[int, torch.Tensor] = {}  # KV source -> bf16 [T // r, D] (FP4 grid)
        self.index_keys: dict[int, torch.Tensor] = {}  # KV source -> bf16 [T // r, di] (FP4 grid)
        self._window: torch.Tensor | None = None  # current layer's window keys bf16 [N, D]

    # ------------------------------------------------------------------ rows
    def logits_rows(self) -> torch.Tensor:
        return torch.arange(self.positions.numel(), device=self.positions.device)

    def engram_ids(self, hasher: EngramHasher, input_ids: torch.Tensor) -> torch.Tensor:
        return hasher.hash_ids(input_ids)

    def tail_rows(self) -> torch.Tensor | None:
        if not self.tail_replay:
            return None
        return torch.nonzero(self.positions >= self.length - self.cfg.attention.window_size).flatten()

    def narrow(self, keep: torch.Tensor) -> None:
        self.positions = self.positions[keep]
        self.floor = int(self.positions[0]) if self.positions.numel() else self.length

    # ------------------------------------------------------------------ keys
    def store_window(self, attn: Attention, kv: torch.Tensor, freqs) -> None:
        self._window = attn.window_keys(kv, freqs)

    def store_compressed(self, attn: Attention, x: torch.Tensor) -> None:
        """Pools the whole sequence (x rows are positions 0..T-1); each entry is rotated at its
        group's first position. Only once per forward (the tail layer calls it before narrowing)."""
        lid, ratio = attn.role.layer_id, attn.role.compress_ratio
        if lid in self.compressed:
            return
        latent = attn.compressor(x)
        gfreqs = attn.rotary.freqs(torch.arange(latent.size(0), device=x.device) * ratio)
        if attn.role.is_index_source:
            self.index_keys[lid] = attn.indexer.keys(latent, lambda t: attn.rotary.apply(t, gfreqs))
        self.compressed[lid] = attn.compressed_kv(latent, gfreqs)

    def index_scores(self, attn: Attention, q: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        visible = torch.div(self.positions + 1, attn.role.compress_ratio, rounding_mode="floor")
        scores = index_scores(q, w, self.index_keys[attn.role.kv_source])
        return mask_invisible(scores, visible).float(), visible

    def attend(self, attn: Attention, q: torch.Tensor, topk: torch.Tensor | None) -> torch.Tensor:
        keys, t = self._window, q.size(0)
        first = int(self.positions[0]) if t else 0
        idx = window_indices(self.positions, self.cfg.attention.window_size, self.floor, first)
        if topk is not None:
            keys = torch.cat([keys, self.compressed[attn.role.kv_source]])
            idx = torch.cat([idx, torch.where(topk >= 0, topk + t, -1)], dim=-1)
        return sparse_attention(q, keys, attn.attn_sink, idx, attn.softmax_scale)
