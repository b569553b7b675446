"""The reference forward of DeepSeek-V4.1: the one forward (`DeepseekV41.forward`) over a dense,
whole-sequence KV, pure torch, in inference mode. The oracle every other path is tested against.

Rounding points are DeepSeek's reference forward (shared/spec/reference-numerics.md): MXFP8
activations before every FP8 GEMM, W4A8 routed experts, FP8 window KV (per 32, RoPE dims included),
FP4 compressed KV (E4M3 per 16), two-stage FP4 indexer, bf16 index scores, block-64 online softmax
with bf16 probabilities, fp32 mHC/Sinkhorn/Engram gate. Decisions (routed experts per layer, top-k
per index source, candidate blocks) are returned and can be replayed (forced).
"""

from __future__ import annotations

import torch

from sglang_dsv41.layers.decisions import Decisions
from sglang_dsv41.layers.dspark import DraftOutput, add_context, draft, greedy
from sglang_dsv41.layers.transformer import DeepseekV41, ForwardOutput
from sglang_dsv41.reference.dense_draft_kv import DenseDraftKV
from sglang_dsv41.reference.dense_kv import DenseKV, window_indices

ReferenceOutput = ForwardOutput

__all__ = ["Decisions", "DenseDraftKV", "DenseKV", "ReferenceDrafter", "ReferenceModel", "ReferenceOutput",
           "window_indices"]


class ReferenceModel:
    """Runs a `DeepseekV41` over whole sequences. Stateless between calls."""

    def __init__(self, model: DeepseekV41):
        self.model, self.cfg = model, model.cfg

    @torch.inference_mode()
    def forward(self, token_ids: torch.Tensor, *, decoder_tail_replay: bool = False, chunk: int | None = None,
                prefix_hit: int = 0, replay: Decisions | None = None, images: list | None = None) -> ForwardOutput:
        """token_ids int [T] (one sequence from position 0) -> fp32 logits for every position.

        SWA bounded replay (spec attention 7; the semantics are written out in dense_kv.py):
        `decoder_tail_replay` returns only the rows that run the late layers (each prefill chunk's last
        `window` rows, chunks of `chunk` tokens, default one shot); `prefix_hit=P` first runs the
        prefix token_ids[:P] as an earlier request would have, then the rest as an encoder-replay hit
        (the last min(P, window) cached tokens recomputed for their window KV), returning positions
        >= P. `replay` forces decisions (of the hit forward when `prefix_hit`). `images`: the prompt's
        `image_input.ImageSpan`s (their spans hold image_token_id in token_ids), one prefill only."""
        ids = token_ids.to(self.model.embed.weight.device).long()
        if images and (prefix_hit or chunk):
            raise ValueError("images take a single one-chunk prefill (no prefix hit, no chunks)")
        if prefix_hit:
            cached = DenseKV(self.cfg, prefix_hit, ids.device)
            self.model(ids[:prefix_hit], cached)
            kv = DenseKV.resume(cached, ids, prefix_hit, tail_replay=decoder_tail_replay)
            return self.model(ids[kv.start:], kv, replay)
        kv = DenseKV(self.cfg, ids.numel(), ids.device, tail_replay=decoder_tail_replay, chunk=chunk)
        return self.model(ids, kv, replay, image_rows=self.model.image_rows(images) if images else None)


class ReferenceDrafter:
    """DSpark's draft steps over one whole sequence (the oracle of layers/dspark.py): one dense
    forward gives every row's drafter input, all rows become context, then the steps ending at
    `last` positions draft at once (each sees only its own context, DenseDraftKV)."""

    def __init__(self, model: DeepseekV41):
        if model.cfg.dspark is None:
            raise ValueError("the checkpoint has no DSpark drafter (dspark_block_size 0)")
        self.model, self.cfg = model, model.cfg

    @torch.inference_mode()
    def forward(self, token_ids: torch.Tensor, last: torch.Tensor, anchors: torch.Tensor | None = None,
                choose=greedy) -> tuple[DraftOutput, ForwardOutput]:
        """token_ids int [T] from position 0; last int [S] positions < T -> (the draft of each step,
        the target forward). Anchors default to the target's greedy token after each `last`."""
        ids = token_ids.to(self.model.embed.weight.device).long()
        out = self.model(ids, DenseKV(self.cfg, ids.numel(), ids.device), capture_draft=True)
        kv = DenseDraftKV(self.cfg, ids.device)
        add_context(self.model.mtp, out.draft_hidden, out.positions, kv)
        last = last.to(ids.device).long()
        if anchors is None:
            anchors = out.logits[last].argmax(dim=-1)
        return draft(self.model, anchors.to(ids.device).long(), kv.steps(last), choose), out
