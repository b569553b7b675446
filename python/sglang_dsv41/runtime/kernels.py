"""Kernels as a transformation of a built model (layers never import kernels).

A layer module that can delegate a piece of math declares `kernel_slots = {attribute: op name}`
(FP8Linear / MXFP4Linear `gemm`, RMSNorm `norm`, Attention `rope` (op `rope_rotate`), MoE `routed`
(grouped experts) / `combine` (slot sum plus shared expert), Block `mhc_gates` (the mHC gates after the
mix GEMM) / `mhc_collapse` / `mhc_expand` (the stream sums; DeepseekV41's final `mhc_collapse` too),
`fp32_gemm` (op `fp32_linear`, the batch-invariant fp32 GEMM: Block's mHC mix, Head (lm head, also
VocabParallelHead), MoE Gate (router), BF16Linear.forward_fp32 (compressor)), Indexer `query_quant` /
`select_topk` / `select_candidates`, EngramTable `gather`, Engram `gate`, EngramHasher `window_hash`);
its class attribute is the pure torch default. `use_kernels(model, table)` sets each slot on the instance to the table's op;
`use_torch(model)` removes them again. The paged KV takes the same table for its pool ops.

`use_kernels` also applies the per-call waste removals that are transformations of a built model
(`prepare_layers`; same bits): MoE expert weights stacked [E, ...] for the grouped op (the expert
parameters become views), `wo_a` dequantized once, and on CUDA one RoPE position table per kind and
device, so RoPE rows are gathered on the device (no host round trip or sync per layer).
"""

from __future__ import annotations

import torch

from dsv41_kernels.op_table import OpTable
from dsv41_kernels.registry import all_ops, torch_forced
from sglang_dsv41.layers.attention import Attention
from sglang_dsv41.layers.moe import MoE
from sglang_dsv41.layers.transformer import DeepseekV41


def _slotted(model: DeepseekV41):
    yield from (m for m in model.modules() if getattr(type(m), "kernel_slots", None))
    if model.hasher is not None:
        yield model.hasher


def use_kernels(model: DeepseekV41, table: OpTable) -> DeepseekV41:
    """Point every kernel slot of `model` at `table`'s op of that name. Returns the model.
    Apply after loading (the Engram hasher exists once the token map is set)."""
    for m in _slotted(model):
        for attr, op in type(m).kernel_slots.items():
            setattr(m, attr, getattr(table, op))
    prepare_layers(model, True)
    return model


def prepare_layers(model: DeepseekV41, on: bool) -> None:
    """Stack MoE expert weights, keep `wo_a` dequantized and (CUDA) share one RoPE position table per
    kind over positions 0 .. max_position_embeddings-1; `on=False` drops the kept copies."""
    tables: dict = {}
    for m in model.modules():
        if isinstance(m, MoE) and on:
            m.expert_weights()
        if isinstance(m, Attention):
            m.wo_a.keep_dequantized(on)
            dev = m.wo_a.weight.device
            if not on or dev.type != "cuda":
                m.rotary.use_table(None)
                continue
            key = m.rotary.table_key
            if key not in tables:
                tables[key] = m.rotary.position_table(model.cfg.rope.max_position_embeddings, dev)
            m.rotary.use_table(tables[key])


def use_torch(model: DeepseekV41) -> DeepseekV41:
    """Undo `use_kernels`: every slot back to its pure-torch class default."""
    for m in _slotted(model):
        for attr in type(m).kernel_slots:
            m.__dict__.pop(attr, None)
    prepare_layers(model, False)
    return model


def kernel_table(device: torch.device | str) -> OpTable:
    """The registry op table for `device`. On CUDA, an op whose Triton kernel could not be imported
    raises here, naming the op and the import error, unless SGLANG_DSV41_TORCH_OPS forces it onto
    its twin (then that choice is explicit)."""
    if torch.device(device).type == "cuda":
        missing = [
            f"{name}: {getattr(op, 'kernel_error', None) or 'no Triton kernel registered'}"
            for name, op in all_ops().items()
            if op.triton is None and not torch_forced(name)
        ]
        if missing:
            raise RuntimeError("Triton kernels unavailable on CUDA (set SGLANG_DSV41_TORCH_OPS to run twins):\n  "
                               + "\n  ".join(missing))
    return OpTable.kernels()
