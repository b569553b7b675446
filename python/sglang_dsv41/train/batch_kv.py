"""A dense KV over B sequences of one length T (right-padded), each from position 0: one forward for a
training batch instead of B. Implements the KV interface (layers/kv.py) like `reference.DenseKV`.

Rows are sequence-major: row b*T + p is position p of sequence b. Window keys of a row are its own
sequence's positions max(0, p-W+1)..p (oldest first, -1 padded to W, the dense layout); compressed
entries of sequence b occupy rows b*(T//r) .. (b+1)*(T//r) - 1 of a layer's pool (T % r == 0, so a
ratio-2 pair never straddles two sequences); selected positions index into the row's own sequence. For T <= 64 the window lists are cut to
ceil(T / 64) * 64 slots: the cut slots are -1 padding forming whole 64-blocks, which the block-64 online
softmax skips exactly (no valid key: the running max, denominator and accumulator are unchanged).
Every row's keys and lists are those DenseKV gives the sequence alone: the per-row math is the same
(fp32 GEMM tiles, exact block partials and the RMSNorm order are batch invariant), and the tests
compare the logits with one DenseKV forward per sequence. Right padding never changes a real row
(causal attention); the caller masks the loss of padded rows.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sglang_dsv41.config import ModelConfig
from sglang_dsv41.engram_hash import EngramHasher
from sglang_dsv41.layers.attention import Attention
from sglang_dsv41.layers.indexer import mask_invisible
from sglang_dsv41.layers.sparse_attention import BLOCK, sparse_attention
from sglang_dsv41.reference.dense_kv import window_indices


class BatchDenseKV:
    def __init__(self, cfg: ModelConfig, batch: int, length: int, device: torch.device | str):
        ratios = {r for r in cfg.compression.compress_ratios if r > 1}
        if any(length % r for r in ratios):
            raise ValueError(f"length {length} must be a multiple of every compress ratio {sorted(ratios)}")
        self.cfg, self.batch, self.length = cfg, batch, length
        self.positions = torch.arange(length, device=device).repeat(batch)
        self.compressed: dict[int, torch.Tensor] = {}
        self.index_keys: dict[int, torch.Tensor] = {}
        self._window: torch.Tensor | None = None

    def logits_rows(self) -> torch.Tensor:
        return torch.arange(self.positions.numel(), device=self.positions.device)

    def engram_ids(self, hasher: EngramHasher, input_ids: torch.Tensor) -> torch.Tensor:
        return hasher.hash_packed(input_ids, [self.length] * self.batch)  # every sequence from position 0

    def tail_rows(self) -> None:
        return None

    def narrow(self, keep: torch.Tensor) -> None:
        raise NotImplementedError("BatchDenseKV runs every row through every layer")

    def store_window(self, attn: Attention, kv: torch.Tensor, freqs) -> None:
        self._window = attn.window_keys(kv, freqs)

    def store_compressed(self, attn: Attention, x: torch.Tensor) -> None:
        lid, ratio = attn.role.layer_id, attn.role.compress_ratio
        if lid in self.compressed:
            return
        latent = attn.compressor(x)  # [B * T // r, D]
        group_pos = (torch.arange(self.length // ratio, device=x.device) * ratio).repeat(self.batch)
        gfreqs = attn.rotary.freqs(group_pos)
        if attn.role.is_index_source:
            self.index_keys[lid] = attn.indexer.keys(latent, lambda t: attn.rotary.apply(t, gfreqs))
        self.compressed[lid] = attn.compressed_kv(latent, gfreqs)

    def index_scores(self, attn: Attention, q: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ratio, (b, t) = attn.role.compress_ratio, (self.batch, self.length)
        visible = torch.div(self.positions + 1, ratio, rounding_mode="floor")
        keys = self.index_keys[attn.role.kv_source].view(b, t // ratio, -1)
        logits = torch.einsum("bthd,bnd->bthn", q.view(b, t, *q.shape[1:]), keys)
        scores = (F.relu(logits) * w.view(b, t, -1, 1)).sum(dim=2).flatten(0, 1)
        return mask_invisible(scores, visible).float(), visible

    def attend(self, attn: Attention, q: torch.Tensor, topk: torch.Tensor | None) -> torch.Tensor:
        b, t, dev, w = self.batch, self.length, q.device, self.cfg.attention.window_size
        local = window_indices(torch.arange(t, device=dev), w, 0, 0)
        if w % BLOCK == 0:  # trailing whole blocks of -1 slots are exact no-ops of the online softmax
            local = local[:, : min(w, -(-t // BLOCK) * BLOCK)]
        local = local.repeat(b, 1)
        seq = torch.arange(b, device=dev).repeat_interleave(t).unsqueeze(-1)
        idx = torch.where(local >= 0, local + seq * t, -1)
        keys = self._window
        if topk is not None:
            n = t // attn.role.compress_ratio
            keys = torch.cat([keys, self.compressed[attn.role.kv_source]])
            idx = torch.cat([idx, torch.where(topk >= 0, topk + b * t + seq * n, -1)], dim=-1)
        # one row chunk: rows are independent, so chunking never changes a value, only the op count
        return sparse_attention(q, keys, attn.attn_sink, idx, attn.softmax_scale, chunk=max(1, q.size(0)))
