"""The paged runtime: the one forward (`DeepseekV41.forward`) over a `PagedKV` per batch.

    rt = Runtime(model, pools)            # op table: registry ops (Triton on CUDA, twins elsewhere)
    out = rt.forward(batch, replay=None)  # ForwardOutput: fp32 logits of batch.logits_rows + decisions
SWA bounded replay (spec attention 7): `decoder_replay=True` narrows every prefill forward to each
request's tail at the last KV source (decode-only forwards are unaffected and run as usual); encoder
replay is a property of the pools (`KVPools(window_rings=True)`) and of the batch (`replay_lens`).
The model's own numerics slots (GEMMs, indexer query/top-k, Engram) are applied by whoever owns the
model (the kernels numerics policy (`numerics.apply_numerics`)); the runtime never changes the model it is given.
"""

from __future__ import annotations

import torch

from dsv41_kernels.op_table import OpTable
from sglang_dsv41.layers.decisions import Decisions
from sglang_dsv41.layers.transformer import DeepseekV41, ForwardOutput
from sglang_dsv41.runtime.batch import Batch
from sglang_dsv41.runtime.paged_kv import PagedKV
from sglang_dsv41.runtime.pools import KVPools


class Runtime:
    def __init__(self, model: DeepseekV41, pools: KVPools, ops: OpTable | None = None, decoder_replay: bool = False):
        if decoder_replay:
            model.cfg.check_decoder_tail_replay()
        self.model, self.cfg, self.pools = model, model.cfg, pools
        self.ops = ops if ops is not None else OpTable.kernels()
        self.decoder_replay = decoder_replay

    @torch.inference_mode()
    def forward(self, batch: Batch, replay: Decisions | None = None, image_rows=None) -> ForwardOutput:
        return self.run(batch, replay, image_rows=image_rows)[0]

    @torch.inference_mode()
    def run(self, batch: Batch, replay: Decisions | None = None, capture_draft: bool = False,
            image_rows=None) -> tuple[ForwardOutput, PagedKV]:
        """`forward`, also returning the PagedKV (its `pair_state` after a verify) and, with
        `capture_draft`, the DSpark drafter's input of the remaining rows (`ForwardOutput.draft_hidden`).
        `image_rows` (rows of this batch, bf16 embeddings): image spans (`DeepseekV41.image_rows`)."""
        extends = batch.num_rows > batch.req_slots.numel() and not batch.verify  # a prefill-like forward
        kv = PagedKV(self.cfg, self.pools, batch, self.ops, decoder_replay=self.decoder_replay and extends)
        return self.model(batch.input_ids, kv, replay, capture_draft=capture_draft, image_rows=image_rows), kv
