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
from sglang_dsv41.layers.transformer import DeepseekV41, ForwardOutput
from sglang_dsv41.reference.dense_kv import DenseKV, window_indices

ReferenceOutput = ForwardOutput

__all__ = ["Decisions", "DenseKV", "ReferenceModel", "ReferenceOutput", "window_indices"]


class ReferenceModel:
    """Runs a `DeepseekV41` over whole sequences. Stateless between calls."""

    def __init__(self, model: DeepseekV41):
        self.model, self.cfg = model, model.cfg

    @torch.inference_mode()
    def forward(self, token_ids: torch.Tensor, *, decoder_tail_replay: bool = False, chunk: int | None = None,
                prefix_hit: int = 0, replay: Decisions | None = None) -> ForwardOutput:
        """token_ids int [T] (one sequence from position 0) -> fp32 logits for every position.

        SWA bounded replay (spec attention 7; the semantics are written out in dense_kv.py):
        `decoder_tail_replay` returns only the rows that run the late layers (each prefill chunk's last
        `window` rows, chunks of `chunk` tokens, default one shot); `prefix_hit=P` first runs the
        prefix token_ids[:P] as an earlier request would have, then the rest as an encoder-replay hit
        (the last min(P, window) cached tokens recomputed for their window KV), returning positions
        >= P. `replay` forces decisions (of the hit forward when `prefix_hit`)."""
        ids = token_ids.to(self.model.embed.weight.device).long()
        if prefix_hit:
            cached = DenseKV(self.cfg, prefix_hit, ids.device)
            self.model(ids[:prefix_hit], cached)
            kv = DenseKV.resume(cached, ids, prefix_hit, tail_replay=decoder_tail_replay)
            return self.model(ids[kv.start:], kv, replay)
        kv = DenseKV(self.cfg, ids.numel(), ids.device, tail_replay=decoder_tail_replay, chunk=chunk)
        return self.model(ids, kv, replay)
