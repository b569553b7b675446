"""The KV interface of the one forward (`DeepseekV41.forward`): where keys come from.

The forward and its layers own the math and the order of sublayers; a KV object owns storage and
the rows of one forward:
  `reference.DenseKV`   B sequences of one length from position 0, keys kept as bf16 tensors (B = 1:
                        the oracle; a batch: training with autograd); its attention formulation is the
                        layers' `attention` slot, chosen by the numerics policy
  `runtime.PagedKV`     a packed `Batch` over paged FP8/FP4 pools through an op table (serving)
They give the same rows the same keys in the same order, so a row's result depends only on its own
request (runtime == reference bit for bit on CPU).

Shapes: N current rows (after a decoder-tail narrowing, only the kept rows), H hidden, D head dim,
h heads, Hi / di indexer heads / dim, n compressed positions scored.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from sglang_dsv41.engram_hash import EngramHasher
    from sglang_dsv41.layers.attention import Attention
    from sglang_dsv41.layers.rope import Rotary


class KV(Protocol):
    positions: torch.Tensor
    """int64 [N] absolute position of each current row."""

    def freqs(self, rotary: "Rotary") -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) fp32 [N, rd/2] of the current rows' positions for `rotary` (`rope.RopeRows`: one
        lookup per RoPE kind and forward)."""

    def logits_rows(self) -> torch.Tensor:
        """int64 [R] current rows whose logits the forward returns."""

    def engram_ids(self, hasher: "EngramHasher", input_ids: torch.Tensor) -> torch.Tensor:
        """int64 [N, n_engram_layers, cols] Engram row ids of the rows (n-gram history included)."""

    def tail_rows(self) -> torch.Tensor | None:
        """Decoder tail replay: int64 indices of the rows that go on past the last KV source
        (the KV then narrows itself to them), or None to keep every row."""

    def narrow(self, keep: torch.Tensor) -> None:
        """Keep only rows `keep` (from `tail_rows`) from here on; positions etc. follow."""

    def store_window(self, attn: "Attention", kv: torch.Tensor, freqs: tuple[torch.Tensor, torch.Tensor]) -> None:
        """kv bf16 [N, D] = attn.wkv(x): store the rows' window keys (kv_norm, RoPE, FP8)."""

    def store_compressed(self, attn: "Attention", x: torch.Tensor) -> None:
        """KV source layer: pool the groups these rows complete into compressed KV (+ index keys).
        x bf16 [N, H] is the layer's attention input. A second call in one forward is a no-op."""

    def index_scores(self, attn: "Attention", q: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q bf16 [N, Hi, di] (FP4 grid), w bf16 [N, Hi] -> (fp32 [N, n] scores, -inf where not
        visible; int64 [N] visible compressed positions per row)."""

    def attend(self, attn: "Attention", q: torch.Tensor, topk: torch.Tensor | None) -> torch.Tensor:
        """q bf16 [N, h, D]; topk int32 [N, K] selected compressed positions (-1 padded) or None
        (window-only layer) -> bf16 [N, h, D] over [window (oldest first) | selected (ascending)]."""
