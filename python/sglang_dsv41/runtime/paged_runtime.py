"""The paged runtime: the one forward (`DeepseekV41.forward`) over a `PagedKV` per batch.

    rt = Runtime(model, pools)            # op table: registry ops (Triton on CUDA, twins elsewhere)
    out = rt.forward(batch, replay=None)  # ForwardOutput: fp32 logits of batch.logits_rows + decisions
The model's own kernel slots (GEMMs, indexer query/top-k, Engram) are applied by whoever owns the
model (`runtime.kernels.use_kernels`); the runtime never changes the model it is given.
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
    def __init__(self, model: DeepseekV41, pools: KVPools, ops: OpTable | None = None):
        self.model, self.cfg, self.pools = model, model.cfg, pools
        self.ops = ops if ops is not None else OpTable.kernels()

    @torch.inference_mode()
    def forward(self, batch: Batch, replay: Decisions | None = None) -> ForwardOutput:
        return self.model(batch.input_ids, PagedKV(self.cfg, self.pools, batch, self.ops), replay)
